//! Register-blocked f32 kernels for passes that score many queries: a
//! tile of R rows x Q queries per inner loop, so each loaded row chunk
//! feeds Q FMAs and each loaded query chunk R FMAs (AVX-512: 2 x 3, five
//! loads per six FMAs; the one-row kernels of `x86` load one query chunk
//! per FMA, so with many queries they wait on loads, not on the FMA units).
//!
//! Each (row, query) pair keeps the single-query kernel's four
//! accumulators, filled chunk by chunk in the same order and reduced the
//! same way, so a score is bit for bit what `x86::score_f32_*` gives: a
//! query's answer does not depend on the batch it was scored in.
//!
//! The rows come from memory (a pass streams the column) and the queries
//! from cache. While the first query group scores a tile, it prefetches
//! the next tile's rows, line for line as it loads its own, so the other
//! groups, and the next tile, find their rows in cache.
//!
//! Tried and measured slower (issue 13, examples/batch_kernel.rs, Zen 4,
//! dim 768, 32 queries): a larger tile with the accumulator index as the
//! outer loop (4 rows x 6 queries, one accumulator per pair per sweep over
//! chunks j, j + 4, ..., three parked between sweeps: 10 loads per 24
//! FMAs) took 6% (rows in L2) to 9% (rows from memory) more CPU per pass,
//! 27-30% more when its sweeps returned the parked sums by value. Twelve
//! chunks a sweep leave too little to pay for parking 72 vectors a tile (a
//! scratch copy won only at dim 3072 and up). Prefetching two tiles ahead
//! changed nothing. The quiet-machine pass, 42 ms (117 GFLOP/s),
//! is the core's FMA peak (116-117 GFLOP/s for FMAs on registers alone,
//! which the example prints), so fewer loads cannot make it faster.

use std::arch::x86_64::*;

use super::Rows;
use super::x86::{hsum256, qtail_256, qtail_512, tail_f32_256, tail_f32_512};

/// Generates the tile kernel and its row loop for one level.
macro_rules! tiled {
    ($tile:ident, $rows:ident, $feat:literal, $lanes:expr, $r:expr, $q:expr, $zero:ident, $fma:ident,
     $load:ident, $qtail:ident, $tail:ident, $add:ident, $reduce:ident) => {
        /// # Safety
        /// CPU features as enabled; `dim` f32 components readable behind
        /// every `q[b]` and every `v[r]`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn $tile<const R: usize, const Q: usize, const P: bool>(
            q: [*const f32; Q],
            v: [*const f32; R],
            ahead: [*const f32; R],
            dim: usize,
        ) -> [[f32; Q]; R] {
            const L: usize = $lanes;
            let mut acc = [[[$zero(); 4]; Q]; R];
            let mut x = [$zero(); R];
            let mut o = 0;
            while o + 4 * L <= dim {
                for j in 0..4 {
                    for r in 0..R {
                        // SAFETY: o + (j+1)L <= dim: inside every row.
                        x[r] = unsafe { $load(v[r].add(o + j * L)) };
                        if P {
                            prefetch_l2(ahead[r].wrapping_add(o + j * L));
                        }
                    }
                    for b in 0..Q {
                        // SAFETY: as above, inside every query.
                        let qb = unsafe { $load(q[b].add(o + j * L)) };
                        for r in 0..R {
                            acc[r][b][j] = $fma(qb, x[r], acc[r][b][j]);
                        }
                    }
                }
                o += 4 * L;
            }
            // At most three whole chunks remain (accumulators 0, 1, 2 as
            // in the single-query kernel), then a partial one (into 3).
            for j in 0..3 {
                if o + L <= dim {
                    for r in 0..R {
                        // SAFETY: o + L <= dim: inside every row.
                        x[r] = unsafe { $load(v[r].add(o)) };
                    }
                    for b in 0..Q {
                        // SAFETY: as above, inside every query.
                        let qb = unsafe { $load(q[b].add(o)) };
                        for r in 0..R {
                            acc[r][b][j] = $fma(qb, x[r], acc[r][b][j]);
                        }
                    }
                    o += L;
                }
            }
            if o < dim {
                for r in 0..R {
                    // SAFETY: the tail loader reads only the dim - o
                    // remaining components of the row.
                    x[r] = unsafe { $tail(v[r].cast(), o, dim - o) };
                }
                for b in 0..Q {
                    // SAFETY: as above, of the query.
                    let qb = unsafe { $qtail(q[b].add(o), dim - o) };
                    for r in 0..R {
                        acc[r][b][3] = $fma(qb, x[r], acc[r][b][3]);
                    }
                }
            }
            let mut out = [[0.0f32; Q]; R];
            for r in 0..R {
                for b in 0..Q {
                    let a = &acc[r][b];
                    out[r][b] = $reduce($add($add(a[0], a[1]), $add(a[2], a[3])));
                }
            }
            out
        }

        /// Scores rows `R` at a time against every query, `Q` at a time.
        ///
        /// # Safety
        /// CPU features as enabled; `rows.check` and the query lengths
        /// verified by the caller (`super::score_f32_batch`).
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn $rows(queries: &[&[f32]], dim: usize, rows: Rows<'_>, out: &mut [f32]) {
            let at = |i: usize| {
                let slot = rows.slots[i] as usize;
                rows.bytes
                    .as_ptr()
                    .wrapping_add(slot * rows.stride_bytes + rows.offset_bytes)
                    .cast::<f32>()
            };
            const TILE_ROWS: usize = $r;
            let n = rows.slots.len();
            let mut i = 0;
            while i + TILE_ROWS <= n {
                let v = std::array::from_fn(|r| at(i + r));
                // The next tile's rows, or past the end this tile's again
                // (a prefetch of cached lines costs a load slot, no more).
                let ahead = std::array::from_fn(|r| {
                    if i + TILE_ROWS + r < n {
                        at(i + TILE_ROWS + r)
                    } else {
                        v[r]
                    }
                });
                // SAFETY: rows i..i+R are inside `bytes` (checked by the caller).
                unsafe { row_tile::<$r>(queries, dim, v, ahead, &mut out[i * queries.len()..]) };
                i += $r;
            }
            while i < n {
                // SAFETY: as above.
                unsafe { row_tile::<1>(queries, dim, [at(i)], [at(i)], &mut out[i * queries.len()..]) };
                i += 1;
            }

            /// R rows against every query, Q at a time, then the rest.
            ///
            /// # Safety
            /// As the enclosing function, for the rows `v`.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn row_tile<const R: usize>(
                queries: &[&[f32]],
                dim: usize,
                v: [*const f32; R],
                ahead: [*const f32; R],
                out: &mut [f32],
            ) {
                let nq = queries.len();
                let mut b = 0;
                while nq - b >= $q {
                    let q = std::array::from_fn(|k| queries[b + k].as_ptr());
                    // SAFETY: every query holds dim components (caller).
                    let s = unsafe {
                        if b == 0 {
                            // The first group, which brings the rows from
                            // memory, prefetches the next tile's.
                            $tile::<R, $q, true>(q, v, ahead, dim)
                        } else {
                            $tile::<R, $q, false>(q, v, ahead, dim)
                        }
                    };
                    put(out, nq, b, &s, $q);
                    b += $q;
                }
                // Two left (32 queries: 10 x 3 + 2) share a tile: a load
                // per FMA, against three loads per two FMAs one at a time.
                // (Tiles of one or two queries leave at most one.)
                if $q > 2 && nq - b == 2 {
                    let q = [queries[b].as_ptr(), queries[b + 1].as_ptr()];
                    // SAFETY: as above. With only two queries this is the
                    // first group, and it prefetches (without, a pass of
                    // two waited on memory: 25 ms against 11 ms for one).
                    let s = unsafe {
                        if b == 0 {
                            $tile::<R, 2, true>(q, v, ahead, dim)
                        } else {
                            $tile::<R, 2, false>(q, v, ahead, dim)
                        }
                    };
                    put(out, nq, b, &s, 2);
                    b += 2;
                }
                while b < nq {
                    // SAFETY: as above (a lone query prefetches, as above).
                    let s = unsafe {
                        if b == 0 {
                            $tile::<R, 1, true>([queries[b].as_ptr()], v, ahead, dim)
                        } else {
                            $tile::<R, 1, false>([queries[b].as_ptr()], v, ahead, dim)
                        }
                    };
                    put(out, nq, b, &s, 1);
                    b += 1;
                }
            }
        }
    };
}

/// Copies the first `width` query columns of a tile's scores into `out`
/// (row-major, `nq` queries a row) at query `b`.
#[inline]
fn put<const R: usize, const W: usize>(out: &mut [f32], nq: usize, b: usize, s: &[[f32; W]; R], width: usize) {
    for (r, row) in s.iter().enumerate() {
        out[r * nq + b..r * nq + b + width].copy_from_slice(&row[..width]);
    }
}

/// Asks for the cache line holding `p` in L2 (into L1 it would evict the
/// rows and queries the tile works on; a trial into L1 measured a few
/// percent slower, within the noise of a loaded machine). A prefetch never
/// faults: any address will do.
#[inline]
#[target_feature(enable = "sse")]
fn prefetch_l2(p: *const f32) {
    _mm_prefetch::<_MM_HINT_T1>(p.cast());
}

/// 16 f32 lanes at `p`.
///
/// # Safety
/// AVX-512F; 16 f32 readable at `p`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn ld512(p: *const f32) -> __m512 {
    // SAFETY: the caller guarantees 16 readable f32.
    unsafe { _mm512_loadu_ps(p) }
}

/// 8 f32 lanes at `p`.
///
/// # Safety
/// AVX; 8 f32 readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ld256(p: *const f32) -> __m256 {
    // SAFETY: the caller guarantees 8 readable f32.
    unsafe { _mm256_loadu_ps(p) }
}

// AVX-512: 2 rows x 3 queries x 4 accumulators = 24 of the 32 registers.
tiled!(
    tile_512,
    score_f32_tiled_avx512,
    "avx512f,avx512bw",
    16,
    2,
    3,
    _mm512_setzero_ps,
    _mm512_fmadd_ps,
    ld512,
    qtail_512,
    tail_f32_512,
    _mm512_add_ps,
    _mm512_reduce_add_ps
);
// AVX2: 3 rows x 1 query x 4 accumulators = 12 registers, with the three
// row chunks and a query chunk all 16.
// Three rows, not three queries: a tile loads a query chunk per FMA either
// way, but with 32 queries (96 KB at dim 768, over Zen 3's 32 KB L1) a
// 1 x 3 tile pulled every query from L2 again for each row and waited on
// L2; 3 x 1 pulls them once per three rows while its rows stay in L1.
// examples/batch_kernel.rs, one Zen 3 thread, 100k x 768, 32 queries:
// 122-126 -> 97-103 ms a pass (rows from memory), 112-113 -> 82-90 ms
// (in L2), interleaved. Tried there and no faster from memory: 2 x 1;
// sweeping the dimension four times with one accumulator per pair (3 x 4:
// 100.6 / 78.9 ms at best; 2 x 4, 2 x 6, 4 x 3 and 6 x 2 slower).
tiled!(
    tile_256,
    score_f32_tiled_avx2,
    "avx2,fma,f16c",
    8,
    3,
    1,
    _mm256_setzero_ps,
    _mm256_fmadd_ps,
    ld256,
    qtail_256,
    tail_f32_256,
    _mm256_add_ps,
    hsum256
);

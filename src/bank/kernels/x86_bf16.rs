//! AVX-512 BF16 kernels of the approximate pass (`bf16.rs`): rounding
//! f32 rows to bfloat16 lines, and a register-blocked tile of R rows x Q
//! queries per inner loop over the lines (2 x 8: 16 accumulators, and 10
//! loads per 16 dot products), one accumulator per pair. A 3 x 8 tile
//! (24 accumulators) was measured: the compiler kept its accumulators on
//! the stack, and the pass ran ~1.4x slower.

use std::arch::x86_64::*;

use super::Rows;
use super::bf16::{LANES, Line};
use super::x86_ahead::Ahead;

const TILE_ROWS: usize = 2;
const TILE_QUERIES: usize = 8;

/// 16 f32 components of the row at `p` from component `at`, zero past
/// `dim` (a masked load reads nothing, and never faults, where masked off).
///
/// # Safety
/// AVX-512F; components `at..min(at + 16, dim)` readable at `p`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn sixteen(p: *const f32, at: usize, dim: usize) -> __m512 {
    if at + 16 <= dim {
        // SAFETY: 16 components inside the row.
        unsafe { _mm512_loadu_ps(p.add(at)) }
    } else if at >= dim {
        _mm512_setzero_ps()
    } else {
        let mask = ((1u32 << (dim - at)) - 1) as __mmask16;
        // SAFETY: the mask enables only the dim - at components left.
        unsafe { _mm512_maskz_loadu_ps(mask, p.wrapping_add(at)) }
    }
}

/// Rounds each row of `rows` to bfloat16 lines (row i into lines
/// `i * lines_per_row..`) and writes its norm.
///
/// # Safety
/// CPU features as enabled; `rows.check(dim * 4)` passed; `out` holds
/// `dim.div_ceil(LANES)` lines and `norms` one entry per row.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn round_rows(rows: Rows<'_>, dim: usize, out: &mut [Line], norms: &mut [f32]) {
    let lines = dim.div_ceil(LANES);
    assert!(out.len() >= rows.slots.len() * lines && norms.len() >= rows.slots.len());
    for (i, &slot) in rows.slots.iter().enumerate() {
        let p = rows
            .bytes
            .as_ptr()
            .wrapping_add(slot as usize * rows.stride_bytes + rows.offset_bytes)
            .cast::<f32>();
        // Two sums, so the FMAs of a row are two chains, not one.
        let mut squares = [_mm512_setzero_ps(); 2];
        for (l, line) in out[i * lines..(i + 1) * lines].iter_mut().enumerate() {
            // SAFETY: the row holds `dim` components (the caller's check).
            let (low, high) = unsafe { (sixteen(p, l * LANES, dim), sixteen(p, l * LANES + 16, dim)) };
            squares[0] = _mm512_fmadd_ps(low, low, squares[0]);
            squares[1] = _mm512_fmadd_ps(high, high, squares[1]);
            // Lanes 0..16 from `low`, 16..32 from `high`: the same layout
            // for rows and queries, so lane pairs multiply the same index.
            let rounded = _mm512_cvtne2ps_pbh(high, low);
            // SAFETY: both types are 64 bytes of plain lanes (any bits are
            // valid); a `Line` is 64 writable bytes on a 64-byte boundary.
            unsafe {
                let bits = std::mem::transmute::<__m512bh, __m512i>(rounded);
                _mm512_store_si512(line.0.as_mut_ptr().cast(), bits)
            };
        }
        // Squares that underflow lose less than 2^-126 each: adding that
        // for every component keeps this an upper bound (`bf16.rs`).
        let sum = _mm512_reduce_add_ps(_mm512_add_ps(squares[0], squares[1]));
        norms[i] = (sum + dim as f32 * f32::MIN_POSITIVE).sqrt();
    }
}

/// One line of bfloat16 pairs.
///
/// # Safety
/// AVX-512F; `p` points at a `Line`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn line(p: *const Line) -> __m512bh {
    // SAFETY: a `Line` is 64 readable bytes on a 64-byte boundary; both
    // types are 64 bytes of plain lanes (any bits are valid).
    unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_load_si512(p.cast())) }
}

/// R rows x Q queries over `lines` lines.
///
/// # Safety
/// CPU features as enabled; `lines` lines readable behind every pointer.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn tile<const R: usize, const Q: usize>(
    q: [*const Line; Q],
    v: [*const Line; R],
    lines: usize,
    ahead: Ahead,
) -> [[f32; Q]; R] {
    let mut acc = [[_mm512_setzero_ps(); Q]; R];
    for l in 0..lines {
        ahead.fetch(l);
        // SAFETY: l < lines: inside every row and query.
        let x: [__m512bh; R] = std::array::from_fn(|r| unsafe { line(v[r].add(l)) });
        for b in 0..Q {
            // SAFETY: as above.
            let qb = unsafe { line(q[b].add(l)) };
            for r in 0..R {
                acc[r][b] = _mm512_dpbf16_ps(acc[r][b], x[r], qb);
            }
        }
    }
    let mut out = [[0.0f32; Q]; R];
    for r in 0..R {
        for b in 0..Q {
            out[r][b] = _mm512_reduce_add_ps(acc[r][b]);
        }
    }
    out
}

/// Scores the first `count` rounded rows against the `nq` rounded
/// queries. Meanwhile it asks for the cache lines of `ahead` (the rows the
/// next call will round), spread over the first query group of each row
/// tile: rounding then finds them in cache instead of waiting on memory,
/// as the f32 batch kernel's loads do (`x86_tiled`).
///
/// # Safety
/// CPU features as enabled; `queries` holds `nq * lines` lines, `rows`
/// `count * lines`, `out` `count * nq` scores.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn score(
    queries: &[Line],
    nq: usize,
    rows: &[Line],
    count: usize,
    lines: usize,
    out: &mut [f32],
    ahead: &[u8],
) {
    assert!(queries.len() >= nq * lines && rows.len() >= count * lines && out.len() >= count * nq);
    let row = |i: usize| rows[i * lines..].as_ptr();
    let tiles = count.div_ceil(TILE_ROWS).max(1);
    let mut i = 0;
    while i < count {
        let share = Ahead::whole(ahead).share(i / TILE_ROWS, tiles, lines);
        if i + TILE_ROWS <= count {
            let v = std::array::from_fn(|r| row(i + r));
            // SAFETY: rows i..i+R and every query hold `lines` lines.
            unsafe { row_tile::<TILE_ROWS>(queries, nq, v, lines, &mut out[i * nq..], share) };
            i += TILE_ROWS;
        } else {
            // SAFETY: as above, for row i.
            unsafe { row_tile::<1>(queries, nq, [row(i)], lines, &mut out[i * nq..], share) };
            i += 1;
        }
    }
}

/// R rows against every query, 8, 4, 2 or 1 at a time.
///
/// # Safety
/// As `score`, for the rows `v`; `out` holds R * nq scores.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn row_tile<const R: usize>(
    queries: &[Line],
    nq: usize,
    v: [*const Line; R],
    lines: usize,
    out: &mut [f32],
    ahead: Ahead,
) {
    let query = |b: usize| queries[b * lines..].as_ptr();
    let mut b = 0;
    while b < nq {
        let left = nq - b;
        let ahead = if b == 0 { ahead } else { Ahead::NONE };
        // SAFETY (each arm): queries b.. hold `lines` lines (the caller).
        b += unsafe {
            if left >= TILE_QUERIES {
                put(
                    out,
                    nq,
                    b,
                    tile::<R, TILE_QUERIES>(std::array::from_fn(|k| query(b + k)), v, lines, ahead),
                )
            } else if left >= 4 {
                put(
                    out,
                    nq,
                    b,
                    tile::<R, 4>(std::array::from_fn(|k| query(b + k)), v, lines, ahead),
                )
            } else if left >= 2 {
                put(
                    out,
                    nq,
                    b,
                    tile::<R, 2>(std::array::from_fn(|k| query(b + k)), v, lines, ahead),
                )
            } else {
                put(out, nq, b, tile::<R, 1>([query(b)], v, lines, ahead))
            }
        };
    }
}

/// Writes a tile's scores for queries `b..b + W`; returns W.
#[inline]
fn put<const R: usize, const W: usize>(out: &mut [f32], nq: usize, b: usize, s: [[f32; W]; R]) -> usize {
    for (r, scores) in s.iter().enumerate() {
        for (w, &score) in scores.iter().enumerate() {
            out[r * nq + b + w] = score;
        }
    }
    W
}

//! x86-64 kernels: AVX-512 (F+BW, 16 lanes) and AVX2 (+FMA+F16C, 8 lanes).
//!
//! Each dot product keeps four vector accumulators per query, so one row
//! is four independent FMA chains. The batched form (`B` queries) runs the
//! single-query arithmetic for each query on the same loaded row, so a
//! query's score does not depend on its batch. f16 rows are converted to
//! f32 lanes and then go through the same FMAs as f32 rows, tails included
//! (zero lanes added), so both give the same bits for the same values.
//!
//! Callers (`super::score_*`) check the CPU features and that every row
//! and query lies inside its slice before calling; these functions then
//! read through raw pointers.

use std::arch::x86_64::*;

use super::{Codes, Rows};

// ------------------------------------------------------------ loaders

// Each row format has a raw loader (the stored bytes as integer lanes, which
// the lane sum adds up) and a conversion to f32 lanes (which the dot product
// multiplies): both read the same load, so summing costs no extra read.

/// The bytes of f32 components `o..o + 16` of row `v`.
///
/// # Safety
/// The CPU must support the function's target features, and `v` must be
/// valid for reads of f32 components `o..o + 16` of the row.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn raw_f32_512(v: *const u8, o: usize) -> __m512i {
    // SAFETY: the caller guarantees components o..o+16 are inside the row.
    unsafe { _mm512_loadu_si512(v.add(4 * o).cast()) }
}

/// The bytes of the last `n` < 16 f32 components, zero in the other lanes.
///
/// # Safety
/// The CPU must support the function's target features, and `v` must be
/// valid for reads of f32 components `o..o + n` of the row, `n` < 16.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn raw_tail_f32_512(v: *const u8, o: usize, n: usize) -> __m512i {
    // SAFETY: a masked load reads (and may fault on) only the n enabled
    // lanes, which the caller guarantees are inside the row.
    unsafe { _mm512_maskz_loadu_epi32(lane_mask16(n), v.add(4 * o).cast()) }
}

/// The last `n` < 16 f32 components as floats, zero in the other lanes
/// (the tiled batch kernel's tail: the same bits the summing kernels see).
///
/// # Safety
/// As `raw_tail_f32_512`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn tail_f32_512(v: *const u8, o: usize, n: usize) -> __m512 {
    // SAFETY: the caller's guarantee is raw_tail_f32_512's.
    _mm512_castsi512_ps(unsafe { raw_tail_f32_512(v, o, n) })
}

/// The bytes of f16 components `o..o + 16` of row `v`.
///
/// # Safety
/// The CPU must support the function's target features, and `v` must be
/// valid for reads of f16 components `o..o + 16` of the row.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn raw_f16_512(v: *const u8, o: usize) -> __m256i {
    // SAFETY: the caller guarantees components o..o+16 are inside the row.
    unsafe { _mm256_loadu_si256(v.add(2 * o).cast()) }
}

/// The bytes of the last `n` <= 16 f16 components, zero after them.
///
/// # Safety
/// The CPU must support the function's target features, and `v` must be
/// valid for reads of f16 components `o..o + n` of the row, `n` <= 16.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn raw_tail_f16_512(v: *const u8, o: usize, n: usize) -> __m256i {
    let mut lanes = [0u16; 16];
    // SAFETY: the caller guarantees n components from o are inside the row;
    // `lanes` holds 16 >= n.
    unsafe { std::ptr::copy_nonoverlapping(v.add(2 * o), lanes.as_mut_ptr().cast::<u8>(), 2 * n) };
    // SAFETY: `lanes` is 32 readable bytes.
    unsafe { _mm256_loadu_si256(lanes.as_ptr().cast()) }
}

fn lane_mask16(n: usize) -> __mmask16 {
    ((1u32 << n) - 1) as __mmask16
}

/// # Safety
/// The CPU must support the function's target features, and `v` must be
/// valid for reads of f32 components `o..o + 8` of the row.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn raw_f32_256(v: *const u8, o: usize) -> __m256i {
    // SAFETY: the caller guarantees components o..o+8 are inside the row.
    unsafe { _mm256_loadu_si256(v.add(4 * o).cast()) }
}

/// # Safety
/// The CPU must support the function's target features, and `v` must be
/// valid for reads of f16 components `o..o + 8` of the row.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn raw_f16_256(v: *const u8, o: usize) -> __m128i {
    // SAFETY: the caller guarantees components o..o+8 are inside the row.
    unsafe { _mm_loadu_si128(v.add(2 * o).cast()) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lane_mask8(n: usize) -> __m256i {
    _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
}

/// # Safety
/// The CPU must support the function's target features, and `v` must be
/// valid for reads of f32 components `o..o + n` of the row, `n` < 8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn raw_tail_f32_256(v: *const u8, o: usize, n: usize) -> __m256i {
    // SAFETY: maskload reads only the n enabled lanes (no fault on the
    // others), which the caller guarantees are inside the row.
    unsafe { _mm256_maskload_epi32(v.add(4 * o).cast(), lane_mask8(n)) }
}

/// The last `n` < 8 f32 components as floats, zero in the other lanes.
///
/// # Safety
/// As `raw_tail_f32_256`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tail_f32_256(v: *const u8, o: usize, n: usize) -> __m256 {
    // SAFETY: the caller's guarantee is raw_tail_f32_256's.
    _mm256_castsi256_ps(unsafe { raw_tail_f32_256(v, o, n) })
}

/// # Safety
/// The CPU must support the function's target features, and `v` must be
/// valid for reads of f16 components `o..o + n` of the row, `n` <= 8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn raw_tail_f16_256(v: *const u8, o: usize, n: usize) -> __m128i {
    let mut lanes = [0u16; 8];
    // SAFETY: the caller guarantees n components from o are inside the row;
    // `lanes` holds 8 >= n.
    unsafe { std::ptr::copy_nonoverlapping(v.add(2 * o), lanes.as_mut_ptr().cast::<u8>(), 2 * n) };
    // SAFETY: `lanes` is 16 readable bytes.
    unsafe { _mm_loadu_si128(lanes.as_ptr().cast()) }
}

// ------------------------------------------------------------ lane sums
//
// `format::lane_sum32` adds word i of a row into lane i % 16. A kernel
// whose loads hold 16 / K words keeps K accumulators: the load at word
// offset w goes to accumulator (w / (16 / K)) % K, so accumulator k holds
// lanes k * 16 / K .. (k + 1) * 16 / K. Every main loop starts its round
// at a word offset that is a multiple of 16, so the accumulator of each
// load is a constant.

/// Folds one 16-lane accumulator (`format::fold_lanes`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn fold_sums_512(acc: [__m512i; 1]) -> u32 {
    // SAFETY: LANE_SUM_WEIGHTS is 16 readable u32.
    let w = unsafe { _mm512_loadu_si512(crate::format::LANE_SUM_WEIGHTS.as_ptr().cast()) };
    _mm512_reduce_add_epi32(_mm512_mullo_epi32(acc[0], w)) as u32
}

/// Folds two 8-lane accumulators (lanes 0..8 and 8..16).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fold_sums_256(acc: [__m256i; 2]) -> u32 {
    let w = crate::format::LANE_SUM_WEIGHTS.as_ptr();
    // SAFETY: LANE_SUM_WEIGHTS is 16 readable u32.
    let (w0, w1) = unsafe { (_mm256_loadu_si256(w.cast()), _mm256_loadu_si256(w.add(8).cast())) };
    hsum256_epi32(_mm256_add_epi32(
        _mm256_mullo_epi32(acc[0], w0),
        _mm256_mullo_epi32(acc[1], w1),
    )) as u32
}

/// Folds four 4-lane accumulators (lanes 0..4, 4..8, 8..12, 12..16).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fold_sums_128(acc: [__m128i; 4]) -> u32 {
    let w = crate::format::LANE_SUM_WEIGHTS.as_ptr();
    let mut total = _mm_setzero_si128();
    for (k, a) in acc.iter().enumerate() {
        // SAFETY: LANE_SUM_WEIGHTS is 16 readable u32; k < 4.
        let wk = unsafe { _mm_loadu_si128(w.add(4 * k).cast()) };
        total = _mm_add_epi32(total, _mm_mullo_epi32(*a, wk));
    }
    let pair = _mm_add_epi32(total, _mm_shuffle_epi32::<0b01_00_11_10>(total));
    _mm_cvtsi128_si32(_mm_add_epi32(pair, _mm_shuffle_epi32::<0b00_00_00_01>(pair))) as u32
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum256(s: __m256) -> f32 {
    let quad = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
    let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
    _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps::<1>(pair, pair)))
}

// ------------------------------------------------------- float kernels

/// f32 query lanes for a tail of `n` < 16 components, zero elsewhere.
///
/// # Safety
/// The CPU must support the function's target features, and `p` must be
/// valid for reads of `n` f32 values, `n` < 16.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn qtail_512(p: *const f32, n: usize) -> __m512 {
    // SAFETY: only the n enabled lanes are read; the caller guarantees them.
    unsafe { _mm512_maskz_loadu_ps(lane_mask16(n), p) }
}

/// # Safety
/// The CPU must support the function's target features, and `p` must be
/// valid for reads of `n` f32 values, `n` < 8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn qtail_256(p: *const f32, n: usize) -> __m256 {
    // SAFETY: only the n enabled lanes are read; the caller guarantees them.
    unsafe { _mm256_maskload_ps(p, lane_mask8(n)) }
}

/// Generates a B-query float dot product for one level and row format,
/// and with `C` the row's lane sum (`format::lane_sum32`; 0 without `C`).
/// Accumulator indices are constants throughout, so the accumulators stay
/// in registers.
macro_rules! float_dot {
    ($name:ident, $feat:literal, $lanes:expr, $zero:ident, $fma:ident, $qload:ident, $qtail:ident,
     $raw:ident, $rawtail:ident, $conv:ident, $add:ident, $reduce:ident,
     $izero:ident, $iadd:ident, $k:expr, $fold:ident) => {
        /// # Safety
        /// CPU features as enabled; `dim` components readable behind every
        /// `q[b]` (f32) and behind `v` (the row format).
        // K (lane-sum accumulators) is 1 for some levels: `j % K` is then 0
        // by design, not a mistake.
        #[allow(clippy::modulo_one)]
        #[target_feature(enable = $feat)]
        unsafe fn $name<const B: usize, const C: bool>(
            q: [*const f32; B],
            v: *const u8,
            dim: usize,
        ) -> ([f32; B], u32) {
            const L: usize = $lanes;
            const K: usize = $k;
            let mut acc = [[$zero(); 4]; B];
            let mut sum = [$izero(); K];
            let mut o = 0;
            while o + 4 * L <= dim {
                // SAFETY: o + 4L <= dim, inside the row (caller contract).
                let raw = unsafe { [$raw(v, o), $raw(v, o + L), $raw(v, o + 2 * L), $raw(v, o + 3 * L)] };
                let x = [$conv(raw[0]), $conv(raw[1]), $conv(raw[2]), $conv(raw[3])];
                if C {
                    for j in 0..4 {
                        sum[j % K] = $iadd(sum[j % K], raw[j]);
                    }
                }
                for b in 0..B {
                    for (j, xj) in x.iter().enumerate() {
                        // SAFETY: o + (j+1)L <= dim, inside the query.
                        let qj = unsafe { $qload(q[b].add(o + j * L)) };
                        acc[b][j] = $fma(qj, *xj, acc[b][j]);
                    }
                }
                o += 4 * L;
            }
            // At most three whole chunks remain, then a partial one.
            let mut whole = 0;
            for j in 0..3 {
                if o + L <= dim {
                    // SAFETY: o + L <= dim, inside the row and the queries.
                    let raw = unsafe { $raw(v, o) };
                    if C {
                        sum[j % K] = $iadd(sum[j % K], raw);
                    }
                    let x = $conv(raw);
                    for b in 0..B {
                        // SAFETY: as above.
                        acc[b][j] = $fma(unsafe { $qload(q[b].add(o)) }, x, acc[b][j]);
                    }
                    o += L;
                    whole = j + 1;
                }
            }
            if o < dim {
                // SAFETY: the tail loaders read only the dim - o remaining
                // components of the row and of each query.
                let raw = unsafe { $rawtail(v, o, dim - o) };
                if C {
                    for k in 0..K {
                        if k == whole % K {
                            sum[k] = $iadd(sum[k], raw);
                        }
                    }
                }
                let x = $conv(raw);
                for b in 0..B {
                    // SAFETY: as above.
                    acc[b][3] = $fma(unsafe { $qtail(q[b].add(o), dim - o) }, x, acc[b][3]);
                }
            }
            let mut out = [0.0f32; B];
            for b in 0..B {
                out[b] = $reduce($add($add(acc[b][0], acc[b][1]), $add(acc[b][2], acc[b][3])));
            }
            (out, if C { $fold(sum) } else { 0 })
        }
    };
}

float_dot!(
    dot_f32_512,
    "avx512f,avx512bw",
    16,
    _mm512_setzero_ps,
    _mm512_fmadd_ps,
    _mm512_loadu_ps,
    qtail_512,
    raw_f32_512,
    raw_tail_f32_512,
    _mm512_castsi512_ps,
    _mm512_add_ps,
    _mm512_reduce_add_ps,
    _mm512_setzero_si512,
    _mm512_add_epi32,
    1,
    fold_sums_512
);
float_dot!(
    dot_f16_512,
    "avx512f,avx512bw",
    16,
    _mm512_setzero_ps,
    _mm512_fmadd_ps,
    _mm512_loadu_ps,
    qtail_512,
    raw_f16_512,
    raw_tail_f16_512,
    _mm512_cvtph_ps,
    _mm512_add_ps,
    _mm512_reduce_add_ps,
    _mm256_setzero_si256,
    _mm256_add_epi32,
    2,
    fold_sums_256
);
float_dot!(
    dot_f32_256,
    "avx2,fma,f16c",
    8,
    _mm256_setzero_ps,
    _mm256_fmadd_ps,
    _mm256_loadu_ps,
    qtail_256,
    raw_f32_256,
    raw_tail_f32_256,
    _mm256_castsi256_ps,
    _mm256_add_ps,
    hsum256,
    _mm256_setzero_si256,
    _mm256_add_epi32,
    2,
    fold_sums_256
);
float_dot!(
    dot_f16_256,
    "avx2,fma,f16c",
    8,
    _mm256_setzero_ps,
    _mm256_fmadd_ps,
    _mm256_loadu_ps,
    qtail_256,
    raw_f16_256,
    raw_tail_f16_256,
    _mm256_cvtph_ps,
    _mm256_add_ps,
    hsum256,
    _mm_setzero_si128,
    _mm_add_epi32,
    4,
    fold_sums_128
);

/// Generates the row loop of one kernel: each row is loaded once and
/// scored against the queries four at a time, then one at a time. With
/// `C`, the first group of queries also computes the row's lane sum into
/// `sums[i]`.
macro_rules! row_loop {
    ($name:ident, $feat:literal, $dot:ident, $q:ty, $out:ty) => {
        /// # Safety
        /// CPU features as enabled; `rows.check` and the query lengths
        /// verified by the caller (`super::score_*`); with `C`, `sums`
        /// holds a value per row.
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn $name<const C: bool>(
            queries: &[&[$q]],
            dim: usize,
            rows: Rows<'_>,
            out: &mut [$out],
            sums: &mut [u32],
        ) {
            let nq = queries.len();
            for (i, &slot) in rows.slots.iter().enumerate() {
                let v = rows
                    .bytes
                    .as_ptr()
                    .wrapping_add(slot as usize * rows.stride_bytes + rows.offset_bytes);
                let scores = &mut out[i * nq..(i + 1) * nq];
                let mut b = 0;
                while b + 4 <= nq {
                    let q = [
                        queries[b].as_ptr(),
                        queries[b + 1].as_ptr(),
                        queries[b + 2].as_ptr(),
                        queries[b + 3].as_ptr(),
                    ];
                    // SAFETY: the row and the queries hold dim components
                    // (checked by the caller).
                    let (s, sum) = unsafe {
                        if C && b == 0 {
                            $dot::<4, true>(q, v, dim)
                        } else {
                            $dot::<4, false>(q, v, dim)
                        }
                    };
                    scores[b..b + 4].copy_from_slice(&s);
                    if C && b == 0 {
                        sums[i] = sum;
                    }
                    b += 4;
                }
                while b < nq {
                    let q = [queries[b].as_ptr()];
                    // SAFETY: as above.
                    let (s, sum) = unsafe {
                        if C && b == 0 {
                            $dot::<1, true>(q, v, dim)
                        } else {
                            $dot::<1, false>(q, v, dim)
                        }
                    };
                    scores[b] = s[0];
                    if C && b == 0 {
                        sums[i] = sum;
                    }
                    b += 1;
                }
            }
        }
    };
}

row_loop!(score_f32_avx512, "avx512f,avx512bw", dot_f32_512, f32, f32);
row_loop!(score_f16_avx512, "avx512f,avx512bw", dot_f16_512, f32, f32);
row_loop!(score_f32_avx2, "avx2,fma,f16c", dot_f32_256, f32, f32);
row_loop!(score_f16_avx2, "avx2,fma,f16c", dot_f16_256, f32, f32);
row_loop!(score_i8_avx512, "avx512f,avx512bw", dot_i8_512, i16, i32);
row_loop!(score_i8_avx2, "avx2,fma,f16c", dot_i8_256, i16, i32);

// --------------------------------------------------------- int8 kernels
//
// Rows are whole side-column rows of `len` bytes, a multiple of 64 (see
// `Codes`): no tails.

/// # Safety
/// AVX-512 F+BW; `len` (a multiple of 64) codes behind every `q[b]` (i16)
/// and `len` bytes behind `r`.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn dot_i8_512<const B: usize, const C: bool>(q: [*const i16; B], r: *const u8, len: usize) -> ([i32; B], u32) {
    let mut acc = [[_mm512_setzero_si512(); 2]; B];
    let mut sum = [_mm256_setzero_si256(); 2];
    let mut o = 0;
    while o + 64 <= len {
        for j in 0..2 {
            // SAFETY: o + 32(j+1) <= len: 32 row bytes and 32 query codes.
            let raw = unsafe { _mm256_loadu_si256(r.add(o + 32 * j).cast()) };
            if C {
                sum[j] = _mm256_add_epi32(sum[j], raw);
            }
            let x = _mm512_cvtepi8_epi16(raw);
            for (acc, q) in acc.iter_mut().zip(q) {
                // SAFETY: as above.
                let p = unsafe { _mm512_loadu_si512(q.add(o + 32 * j).cast()) };
                acc[j] = _mm512_add_epi32(acc[j], _mm512_madd_epi16(p, x));
            }
        }
        o += 64;
    }
    let mut out = [0i32; B];
    for b in 0..B {
        out[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(acc[b][0], acc[b][1]));
    }
    (out, if C { fold_sums_256(sum) } else { 0 })
}

/// # Safety
/// AVX2; `len` (a multiple of 64) codes behind every `q[b]` (i16) and
/// `len` bytes behind `r`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_i8_256<const B: usize, const C: bool>(q: [*const i16; B], r: *const u8, len: usize) -> ([i32; B], u32) {
    let mut acc = [[_mm256_setzero_si256(); 2]; B];
    let mut sum = [_mm_setzero_si128(); 4];
    let mut o = 0;
    while o + 64 <= len {
        for j in 0..4 {
            // SAFETY: o + 16(j+1) <= len: 16 row bytes and 16 query codes.
            let raw = unsafe { _mm_loadu_si128(r.add(o + 16 * j).cast()) };
            if C {
                sum[j] = _mm_add_epi32(sum[j], raw);
            }
            let x = _mm256_cvtepi8_epi16(raw);
            for (acc, q) in acc.iter_mut().zip(q) {
                // SAFETY: as above.
                let p = unsafe { _mm256_loadu_si256(q.add(o + 16 * j).cast()) };
                acc[j % 2] = _mm256_add_epi32(acc[j % 2], _mm256_madd_epi16(p, x));
            }
        }
        o += 64;
    }
    let mut out = [0i32; B];
    for b in 0..B {
        out[b] = hsum256_epi32(_mm256_add_epi32(acc[b][0], acc[b][1]));
    }
    (out, if C { fold_sums_128(sum) } else { 0 })
}

// ------------------------------------------------------- VNNI kernels

/// Generates a B-query VNNI dot product: `sum (r_i + 128) * q_i` over
/// unsigned row bytes (the stored code with its sign bit flipped) and
/// signed query codes; the caller subtracts `128 * sum q_i`. `len` is a
/// multiple of 64 (see `Codes`).
macro_rules! vnni_dot {
    ($name:ident, $feat:literal, $vec:ty, $lanes:expr, $zero:ident, $set1:ident, $xor:ident, $dp:ident, $add:ident,
     $loadu:ident, $reduce:ident, $k:expr, $fold:ident) => {
        /// # Safety
        /// CPU features as enabled; `dim` codes behind every `q[b]` and `r`,
        /// `dim` a multiple of 64.
        // K is 1 for some paths: `j % K` is then 0 by design.
        #[allow(clippy::modulo_one)]
        #[target_feature(enable = $feat)]
        unsafe fn $name<const B: usize, const C: bool>(q: [*const i8; B], r: *const u8, dim: usize) -> ([i32; B], u32) {
            const L: usize = $lanes;
            const K: usize = $k;
            let flip = $set1(i8::MIN);
            let mut acc = [[$zero(); 2]; B];
            let mut sum = [$zero(); K];
            let mut o = 0;
            while o + L <= dim {
                for j in 0..2 {
                    if o + L <= dim {
                        // SAFETY: o + L <= dim: L row bytes and L codes.
                        let raw = unsafe { $loadu(r.add(o).cast()) };
                        if C {
                            // Loads alternate halves of a 64-byte round.
                            sum[j % K] = $add(sum[j % K], raw);
                        }
                        let x = $xor(raw, flip);
                        for b in 0..B {
                            // SAFETY: as above.
                            acc[b][j] = $dp(acc[b][j], x, unsafe { $loadu(q[b].add(o).cast()) });
                        }
                        o += L;
                    }
                }
            }
            let mut out = [0i32; B];
            for b in 0..B {
                out[b] = $reduce($add(acc[b][0], acc[b][1]));
            }
            (out, if C { $fold(sum) } else { 0 })
        }
    };
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum256_epi32(s: __m256i) -> i32 {
    let quad = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
    let pair = _mm_add_epi32(quad, _mm_shuffle_epi32::<0b01_00_11_10>(quad));
    _mm_cvtsi128_si32(_mm_add_epi32(pair, _mm_shuffle_epi32::<0b00_00_00_01>(pair)))
}

vnni_dot!(
    dot_vnni512,
    "avx512f,avx512bw,avx512vnni",
    __m512i,
    64,
    _mm512_setzero_si512,
    _mm512_set1_epi8,
    _mm512_xor_si512,
    _mm512_dpbusd_epi32,
    _mm512_add_epi32,
    _mm512_loadu_si512,
    _mm512_reduce_add_epi32,
    1,
    fold_sums_512
);
vnni_dot!(
    dot_vnni256,
    "avx2,fma,f16c,avxvnni",
    __m256i,
    32,
    _mm256_setzero_si256,
    _mm256_set1_epi8,
    _mm256_xor_si256,
    _mm256_dpbusd_avx_epi32,
    _mm256_add_epi32,
    _mm256_loadu_si256,
    hsum256_epi32,
    2,
    fold_sums_256
);

/// Generates the row loop of a VNNI kernel (as `row_loop!`, plus the
/// `128 * sum q` correction).
macro_rules! vnni_rows {
    ($name:ident, $feat:literal, $dot:ident) => {
        /// # Safety
        /// CPU features as enabled; `rows.check` and the query lengths
        /// verified by the caller (`super::score_i8_path`).
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn $name<const C: bool>(
            queries: &[&Codes],
            dim: usize,
            rows: Rows<'_>,
            out: &mut [i32],
            sums: &mut [u32],
        ) {
            let nq = queries.len();
            for (i, &slot) in rows.slots.iter().enumerate() {
                let r = rows
                    .bytes
                    .as_ptr()
                    .wrapping_add(slot as usize * rows.stride_bytes + rows.offset_bytes);
                let scores = &mut out[i * nq..(i + 1) * nq];
                let mut b = 0;
                while b + 4 <= nq {
                    let q = [0, 1, 2, 3].map(|j| queries[b + j].narrow.as_ptr());
                    // SAFETY: the row and the queries hold dim codes
                    // (checked by the caller).
                    let (raw, sum) = unsafe {
                        if C && b == 0 {
                            $dot::<4, true>(q, r, dim)
                        } else {
                            $dot::<4, false>(q, r, dim)
                        }
                    };
                    if C && b == 0 {
                        sums[i] = sum;
                    }
                    for j in 0..4 {
                        scores[b + j] = raw[j] - 128 * queries[b + j].sum;
                    }
                    b += 4;
                }
                while b < nq {
                    // SAFETY: as above.
                    let q = [queries[b].narrow.as_ptr()];
                    let (raw, sum) = unsafe {
                        if C && b == 0 {
                            $dot::<1, true>(q, r, dim)
                        } else {
                            $dot::<1, false>(q, r, dim)
                        }
                    };
                    if C && b == 0 {
                        sums[i] = sum;
                    }
                    scores[b] = raw[0] - 128 * queries[b].sum;
                    b += 1;
                }
            }
        }
    };
}

vnni_rows!(score_i8_vnni512, "avx512f,avx512bw,avx512vnni", dot_vnni512);
vnni_rows!(score_i8_vnni256, "avx2,fma,f16c,avxvnni", dot_vnni256);

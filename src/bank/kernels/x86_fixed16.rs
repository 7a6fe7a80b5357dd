//! AVX2 kernels of the 16-bit first pass (`fixed16.rs`): scaling f32
//! rows to lines of 16-bit integers, and a register-blocked tile of R rows
//! x Q queries per inner loop over the lines, one 32-bit accumulator
//! vector per pair (`vpmaddwd` then `vpaddd`). Integer sums are exact, so
//! neither the tile's shape nor the order of its additions changes a score.

use std::arch::x86_64::*;

use super::Rows;
use super::fixed16::{LANES, Line};
use super::x86_ahead::Ahead;

const TILE_ROWS: usize = 4;
const TILE_QUERIES: usize = 2;

/// 8 f32 components of the row at `p` from component `at`, zero past
/// `dim` (a masked load reads nothing, and never faults, where masked off).
///
/// # Safety
/// AVX2; components `at..min(at + 8, dim)` readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn eight(p: *const f32, at: usize, dim: usize) -> __m256 {
    if at + 8 <= dim {
        // SAFETY: 8 components inside the row.
        unsafe { _mm256_loadu_ps(p.add(at)) }
    } else if at >= dim {
        _mm256_setzero_ps()
    } else {
        let left = (dim - at) as i32;
        let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        // SAFETY: the mask enables only the dim - at components left.
        unsafe { _mm256_maskload_ps(p.wrapping_add(at), mask) }
    }
}

/// Sum of the 8 lanes (f32).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn sum8(v: __m256) -> f32 {
    let four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps::<1>(two, two)))
}

/// Largest lane (f32; NaN lanes are caught by the 1-norm instead).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn max8(v: __m256) -> f32 {
    let four = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let two = _mm_max_ps(four, _mm_movehl_ps(four, four));
    _mm_cvtss_f32(_mm_max_ss(two, _mm_shuffle_ps::<1>(two, two)))
}

/// Scales each row of `rows` to `dim.div_ceil(LANES)` lines of integers
/// with at most `k` in magnitude (row i into lines `i * lines..`), and
/// writes its largest magnitude, 1-norm and scale (0 where the row is not
/// finite or K / max does not fit an f32; its lines are then zeros).
///
/// # Safety
/// CPU features as enabled; `rows.check(dim * 4)` passed; `out` holds
/// `dim.div_ceil(LANES)` lines per row and the others one entry per row.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn scale_rows(
    rows: Rows<'_>,
    dim: usize,
    k: f32,
    out: &mut [Line],
    max_abs: &mut [f32],
    l1: &mut [f32],
    scales: &mut [f32],
) {
    let lines = dim.div_ceil(LANES);
    let count = rows.slots.len();
    assert!(out.len() >= count * lines && max_abs.len() >= count && l1.len() >= count && scales.len() >= count);
    let magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    for (i, &slot) in rows.slots.iter().enumerate() {
        let p = rows
            .bytes
            .as_ptr()
            .wrapping_add(slot as usize * rows.stride_bytes + rows.offset_bytes)
            .cast::<f32>();
        // Four chains of each, one per quarter of a line: a single chain
        // would wait on the adder's latency at every step.
        let (mut largest, mut sum) = ([_mm256_setzero_ps(); 4], [_mm256_setzero_ps(); 4]);
        for l in 0..lines {
            for c in 0..4 {
                // SAFETY: the row holds `dim` components (the caller's check).
                let a = _mm256_and_ps(unsafe { eight(p, l * LANES + 8 * c, dim) }, magnitude);
                largest[c] = _mm256_max_ps(largest[c], a);
                sum[c] = _mm256_add_ps(sum[c], a);
            }
        }
        let largest = _mm256_max_ps(
            _mm256_max_ps(largest[0], largest[1]),
            _mm256_max_ps(largest[2], largest[3]),
        );
        let sum = _mm256_add_ps(_mm256_add_ps(sum[0], sum[1]), _mm256_add_ps(sum[2], sum[3]));
        let (m, norm) = (max8(largest), sum8(sum));
        let s = k / m;
        let usable = norm.is_finite() && s.is_finite() && m > 0.0;
        (max_abs[i], l1[i], scales[i]) = (m, norm, if usable { s } else { 0.0 });
        let row_lines = &mut out[i * lines..(i + 1) * lines];
        if !usable {
            row_lines.fill(Line::default());
            continue;
        }
        let scale = _mm256_set1_ps(s);
        for (l, line) in row_lines.iter_mut().enumerate() {
            // SAFETY: as above.
            let x: [__m256i; 4] = std::array::from_fn(|c| {
                _mm256_cvtps_epi32(_mm256_mul_ps(unsafe { eight(p, l * LANES + 8 * c, dim) }, scale))
            });
            // `packs` interleaves 128-bit halves; rows and queries share
            // the order, so a line pair still multiplies equal indices.
            let low = _mm256_packs_epi32(x[0], x[1]);
            let high = _mm256_packs_epi32(x[2], x[3]);
            // SAFETY: a `Line` is 64 writable bytes on a 64-byte boundary.
            unsafe {
                _mm256_store_si256(line.0.as_mut_ptr().cast(), low);
                _mm256_store_si256(line.0.as_mut_ptr().add(16).cast(), high);
            }
        }
    }
}

/// The two halves of a line.
///
/// # Safety
/// AVX2; `p` points at a `Line`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn half(p: *const Line, h: usize) -> __m256i {
    // SAFETY: a `Line` is 64 readable bytes on a 64-byte boundary.
    unsafe { _mm256_load_si256(p.cast::<i16>().add(16 * h).cast()) }
}

/// Sum of the 8 lanes (i32; exact: the scale bounds every sum).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn sum8_i32(v: __m256i) -> i32 {
    let four = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let two = _mm_add_epi32(four, _mm_unpackhi_epi64(four, four));
    _mm_cvtsi128_si32(_mm_add_epi32(two, _mm_shuffle_epi32::<1>(two)))
}

/// R rows x Q queries over `lines` lines: the integer sums.
///
/// # Safety
/// CPU features as enabled; `lines` lines readable behind every pointer.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile<const R: usize, const Q: usize>(
    q: [*const Line; Q],
    v: [*const Line; R],
    lines: usize,
    ahead: Ahead,
) -> [[i32; Q]; R] {
    let mut acc = [[_mm256_setzero_si256(); Q]; R];
    for l in 0..lines {
        ahead.fetch(l);
        for h in 0..2 {
            // SAFETY: l < lines: inside every row and query.
            let x: [__m256i; R] = std::array::from_fn(|r| unsafe { half(v[r].add(l), h) });
            for b in 0..Q {
                // SAFETY: as above.
                let qb = unsafe { half(q[b].add(l), h) };
                for r in 0..R {
                    acc[r][b] = _mm256_add_epi32(acc[r][b], _mm256_madd_epi16(x[r], qb));
                }
            }
        }
    }
    let mut out = [[0i32; Q]; R];
    for r in 0..R {
        for b in 0..Q {
            out[r][b] = sum8_i32(acc[r][b]);
        }
    }
    out
}

/// Scores the first `count` scaled rows against the `nq` scaled queries,
/// handing each integer sum to `put(row, query, sum)`. Meanwhile it asks
/// for the cache lines of `ahead` (the rows the next call will scale),
/// spread over the row tiles and their query groups.
///
/// # Safety
/// CPU features as enabled; `queries` holds `nq * lines` lines, `rows`
/// `count * lines`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn score(
    queries: &[Line],
    nq: usize,
    rows: &[Line],
    count: usize,
    lines: usize,
    ahead: &[u8],
    mut put: impl FnMut(usize, usize, i32),
) {
    assert!(queries.len() >= nq * lines && rows.len() >= count * lines);
    let row = |i: usize| rows[i * lines..].as_ptr();
    let tiles = count.div_ceil(TILE_ROWS).max(1);
    let mut i = 0;
    while i < count {
        let share = Ahead::whole(ahead).share(i / TILE_ROWS, tiles, lines);
        let mut put_at = |r: usize, b: usize, sum: i32| put(i + r, b, sum);
        if i + TILE_ROWS <= count {
            let v = std::array::from_fn(|r| row(i + r));
            // SAFETY: rows i..i+R and every query hold `lines` lines.
            unsafe { row_tile::<TILE_ROWS>(queries, nq, v, lines, share, &mut put_at) };
            i += TILE_ROWS;
        } else {
            // SAFETY: as above, for row i.
            unsafe { row_tile::<1>(queries, nq, [row(i)], lines, share, &mut put_at) };
            i += 1;
        }
    }
}

/// R rows against every query, TILE_QUERIES or 1 at a time.
///
/// # Safety
/// As `score`, for the rows `v`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn row_tile<const R: usize>(
    queries: &[Line],
    nq: usize,
    v: [*const Line; R],
    lines: usize,
    ahead: Ahead,
    put: &mut impl FnMut(usize, usize, i32),
) {
    let query = |b: usize| queries[b * lines..].as_ptr();
    // The tile's share of `ahead`, spread again over its query groups: all
    // of it in the first group would ask for more lines at once than the
    // memory system keeps in flight, and most requests would be dropped.
    let groups = nq.div_ceil(TILE_QUERIES);
    let mut b = 0;
    while b < nq {
        let ahead = ahead.share(b / TILE_QUERIES, groups, lines);
        if nq - b >= TILE_QUERIES {
            // SAFETY: queries b.. hold `lines` lines (the caller).
            let sums = unsafe { tile::<R, TILE_QUERIES>(std::array::from_fn(|k| query(b + k)), v, lines, ahead) };
            emit(put, b, sums);
            b += TILE_QUERIES;
        } else {
            // SAFETY: as above.
            let sums = unsafe { tile::<R, 1>([query(b)], v, lines, ahead) };
            emit(put, b, sums);
            b += 1;
        }
    }
}

/// Hands a tile's sums for queries `b..b + W` to `put`.
#[inline]
fn emit<const R: usize, const W: usize>(put: &mut impl FnMut(usize, usize, i32), b: usize, sums: [[i32; W]; R]) {
    for (r, row) in sums.iter().enumerate() {
        for (w, &sum) in row.iter().enumerate() {
            put(r, b + w, sum);
        }
    }
}

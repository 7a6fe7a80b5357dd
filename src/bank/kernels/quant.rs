//! Reduced-precision encodings of the vector column (FORMAT.md §1,
//! "Precision") and the error bounds that make them safe to use.
//!
//! * f16: each normalised f32 component rounded to the nearest binary16.
//! * int8 side column: per row, `scale = max_i |v_i| / 127` (f32) and
//!   `q_i = round(v_i / scale)` (f32 division, ties away from zero),
//!   clamped to -127..=127. The row is stored as the scale (LE f32), the
//!   codes, then zeros up to the stride. Deterministic, so `verify`
//!   recomputes it and requires byte equality.

use super::Codes;
use half::slice::HalfFloatSliceExt;

/// binary16 unit roundoff: rounding a normal value to f16 changes it by at
/// most this fraction of its magnitude.
pub const F16_UNIT_ROUNDOFF: f64 = 1.0 / 2048.0;
/// Largest absolute rounding error in the f16 subnormal range (half the
/// spacing 2^-24).
pub const F16_SUBNORMAL_ERROR: f64 = 1.0 / 33_554_432.0;
/// f32 unit roundoff, 2^-24.
pub const F32_UNIT_ROUNDOFF: f64 = 1.0 / 16_777_216.0;

/// The int8 code of one component given the row's (non-zero) scale:
/// `x / scale` rounded half away from zero (as `f32::round`), clamped to
/// +-127. Written out rather than `round()`, a libm call on baseline
/// x86-64, so that the loops over a row vectorise: checking a 1M-row side
/// column on first map is then a fraction of a second, not seconds.
#[inline(always)]
fn code_nonzero(x: f32, scale: f32) -> i8 {
    let y = (x / scale).clamp(-127.0, 127.0);
    let whole = y as i32; // truncates toward zero; |y| <= 127 fits
    let fraction = y - whole as f32; // exact: y and its integer part are close
    let rounded = whole + i32::from(fraction >= 0.5) - i32::from(fraction <= -0.5);
    rounded as i8
}

fn code(x: f32, scale: f32) -> i8 {
    if scale == 0.0 { 0 } else { code_nonzero(x, scale) }
}

/// The row's scale: max |v_i| / 127. The maximum is exact in any order,
/// so it is taken over eight independent lanes (which vectorise).
#[inline(always)]
pub fn int8_scale(v: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    for chunk in v.chunks(8) {
        for (lane, x) in lanes.iter_mut().zip(chunk) {
            *lane = if x.abs() > *lane { x.abs() } else { *lane };
        }
    }
    lanes.iter().fold(0.0f32, |m, &x| if x > m { x } else { m }) / 127.0
}

/// Encodes one int8 side-column row into `out` (exactly one stride: the
/// scale, `v.len()` codes, zero padding).
pub fn encode_int8_row(v: &[f32], out: &mut [u8]) {
    assert!(out.len() >= 4 + v.len(), "int8 row buffer too short");
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        unsafe { encode_int8_row_avx2(v, out) };
        return;
    }
    encode_int8_row_any(v, out);
}

/// The same code compiled for AVX2, so the loops vectorise 8 wide (first
/// map of an int8 segment recomputes every row). IEEE arithmetic, no
/// contraction: identical bytes to `encode_int8_row_any`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn encode_int8_row_avx2(v: &[f32], out: &mut [u8]) {
    encode_int8_row_any(v, out);
}

#[inline(always)]
fn encode_int8_row_any(v: &[f32], out: &mut [u8]) {
    let scale = int8_scale(v);
    out[..4].copy_from_slice(&scale.to_le_bytes());
    let codes = &mut out[4..4 + v.len()];
    if scale == 0.0 {
        codes.fill(0);
    } else {
        for (o, &x) in codes.iter_mut().zip(v) {
            *o = code_nonzero(x, scale) as u8;
        }
    }
    out[4 + v.len()..].fill(0);
}

/// Components converted per step by the f16 helpers: half's slice
/// conversions use the CPU's F16C instructions (chosen at run time), eight
/// lanes at a time, where one-by-one conversion is scalar; a stack buffer
/// of this size holds a step.
const F16_CHUNK: usize = 64;

/// The f16 bytes (LE binary16, round to nearest even) of an f32 vector.
pub fn encode_f16(v: &[f32], out: &mut [u8]) {
    assert!(out.len() >= 2 * v.len(), "f16 row buffer too short");
    let mut halves = [half::f16::ZERO; F16_CHUNK];
    for (src, dst) in v.chunks(F16_CHUNK).zip(out.chunks_mut(2 * F16_CHUNK)) {
        let halves = &mut halves[..src.len()];
        halves.convert_from_f32_slice(src);
        for (o, h) in dst.chunks_exact_mut(2).zip(halves.iter()) {
            o.copy_from_slice(&h.to_bits().to_le_bytes());
        }
    }
}

/// f32 values of stored f16 bytes (exact: every binary16 is an f32).
pub fn decode_f16(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(2)
        .map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
        .collect()
}

/// Rounds each component to the nearest f16, kept as f32: what an f16
/// bank stores, so the overlay (WAL) and the column score alike.
pub fn round_to_f16(v: &mut [f32]) {
    let mut halves = [half::f16::ZERO; F16_CHUNK];
    for chunk in v.chunks_mut(F16_CHUNK) {
        let halves = &mut halves[..chunk.len()];
        halves.convert_from_f32_slice(chunk);
        halves.convert_to_f32_slice(chunk);
    }
}

/// Whether every component is exactly representable in binary16.
pub fn is_f16_exact(v: &[f32]) -> bool {
    let (mut halves, mut back) = ([half::f16::ZERO; F16_CHUNK], [0.0f32; F16_CHUNK]);
    v.chunks(F16_CHUNK).all(|chunk| {
        let (halves, back) = (&mut halves[..chunk.len()], &mut back[..chunk.len()]);
        halves.convert_from_f32_slice(chunk);
        halves.convert_to_f32_slice(back);
        back.iter().zip(chunk).all(|(b, x)| b.to_bits() == x.to_bits())
    })
}

/// `gamma_n = n u / (1 - n u)`: the relative error bound of any order of
/// summing n products in f32 (Higham, Accuracy and Stability, §3.1).
pub fn gamma(n: usize) -> f64 {
    let nu = n as f64 * F32_UNIT_ROUNDOFF;
    nu / (1.0 - nu)
}

/// Bound on |score in an f16 bank - score in an f32 bank| for the same
/// unit query and vector at dimension `dim` (see FORMAT.md §1):
/// `2^-11 * 1.0001 + 2^-25 * sqrt(dim) * 1.0001 + 2 * gamma_dim * 1.0001`.
/// The 1.0001 covers norms of f32-rounded unit vectors above 1.
pub fn f16_score_bound(dim: usize) -> f64 {
    let norm = 1.0001;
    F16_UNIT_ROUNDOFF * norm + F16_SUBNORMAL_ERROR * (dim as f64).sqrt() * norm + 2.0 * gamma(dim) * norm
}

/// A query prepared for the int8 first pass: its codes and the constants
/// of the per-row error bound.
#[derive(Debug, Clone)]
pub struct QueryInt8 {
    pub codes: Codes,
    pub scale: f32,
    /// bound(row scale s) = `bound_base + bound_per_scale * s`.
    pub bound_base: f32,
    pub bound_per_scale: f32,
}

/// Per-component rounding bound of the codes, as a fraction of the scale:
/// 1/2 for the rounding, plus 128 u for the f32 division before it.
const CODE_ERROR: f64 = 0.5 + 128.0 * F32_UNIT_ROUNDOFF;

impl QueryInt8 {
    /// Quantises unit query `q` like a row and derives the bound for a
    /// penalty of at most `eps_abs` (see `bound`).
    pub fn new(q: &[f32], eps_abs: f32) -> QueryInt8 {
        let n = q.len();
        let scale = int8_scale(q);
        let codes: Vec<i8> = q.iter().map(|&x| code(x, scale)).collect();
        let l1: f64 = q.iter().map(|&x| f64::from(x).abs()).sum();
        let err2: f64 = q
            .iter()
            .zip(&codes)
            .map(|(&x, &c)| (f64::from(x) - f64::from(scale) * f64::from(c)).powi(2))
            .sum::<f64>()
            .sqrt();
        let root_n = (n as f64).sqrt();
        let norm = 1.0001; // unit vectors rounded to f32
        // |approx| <= |q^| |v^| <= (1 + err2)(1 + sqrt(n) * CODE_ERROR / 127 * norm).
        let approx_max = (norm + err2) * (norm + root_n * CODE_ERROR * norm / 127.0);
        let rounding = 32.0 * F32_UNIT_ROUNDOFF * (2.0 + approx_max + 2.0 * f64::from(eps_abs));
        let base = err2 * norm + gamma(n) * norm + rounding;
        let per_scale = CODE_ERROR * (l1 + root_n * err2);
        // 1e-5 relative slack absorbs the f32 rounding of these constants
        // and of `base + per_scale * s` at scan time.
        let up = |x: f64| (x * (1.0 + 1e-5)) as f32;
        QueryInt8 {
            codes: Codes::new(&codes),
            scale,
            bound_base: up(base),
            bound_per_scale: up(per_scale),
        }
    }

    /// The approximate score of a row from its integer dot product.
    #[inline]
    pub fn approx(&self, row_scale: f32, dot: i32) -> f32 {
        (self.scale * row_scale) * dot as f32
    }

    /// Upper bound on |approx - exact| for a row of scale `row_scale`,
    /// penalties included, where exact is the f32 kernel's score of the
    /// row's f32 vector. Derivation (q, v: the f32 query and row, q^ =
    /// s_q p, v^ = s_v r the dequantised codes, E = sum q_i v_i exactly):
    ///
    /// * |E - q^.v^| <= |sum q_i (v_i - v^_i)| + |sum (q_i - q^_i) v^_i|
    ///   <= s_v c |q|_1 + |q - q^|_2 |v^|_2, with c = CODE_ERROR and
    ///   |v^|_2 <= |v|_2 + sqrt(n) s_v c (Cauchy-Schwarz, triangle);
    /// * |f32 kernel - E| <= gamma_n sum |q_i v_i| <= gamma_n |q| |v|;
    /// * the approximate score is q^.v^ up to three f32 roundings, and
    ///   subtracting a penalty rounds both scores once more; `rounding`
    ///   covers all of them with a wide margin.
    #[inline]
    pub fn bound(&self, row_scale: f32) -> f32 {
        self.bound_base + self.bound_per_scale * row_scale
    }
}

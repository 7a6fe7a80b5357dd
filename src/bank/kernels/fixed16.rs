//! An approximate first pass for wide f32 batches on AVX2: rows and
//! queries scaled to 16-bit integers and multiplied with `vpmaddwd` (16
//! products per instruction, summed in pairs into eight 32-bit lanes, so
//! about twice the multiply-adds per cycle of the f32 FMA on the AVX2
//! machines measured), with a proven bound on how far each approximate
//! score can be from the exact f32 kernel's score. It is the AVX2
//! counterpart of `bf16`, which needs AVX-512 BF16; the scan uses it the
//! same way and its answers are the f32 scan's, bit for bit.
//!
//! Scaling. A vector x with largest magnitude m is held as the integers
//! n_i = round(fl(x_i s)), s = fl(K / m), K from the dimension so no sum
//! can overflow (`levels`). The exact value of fl(x_i s) is within
//! 2^-24 K (1 + 2^-23) of x_i s (plus 2^-149 where it is subnormal), so
//! x_i = (n_i + d_i) / s with |d_i| <= D = 0.5 + 2^-23 K + 2^-140, and
//! each component is within e_x = D / s of n_i / s. Every |n_i| <= K.
//!
//! The bound. With q_i = (m_i + c_i) / t the same way (e_q = D / t), the
//! integer sum I = sum n_i m_i is exact in 32 bits (|I| <= dim K^2 <
//! 2^31), and
//!
//!   sum x_i q_i - I / (s t) = sum (d_i q_i / s + x_i c_i / t - d_i c_i / (s t)),
//!
//! so |exact real - I / (s t)| <= e_x |q|_1 + e_q |x|_1 + dim e_x e_q = E.
//! The approximate score is I (1/s) (1/t) in f64, rounded to f32: within
//! 2^-23 of its magnitude, which is at most m |q|_1 + E. The exact f32
//! kernel's own rounding adds at most gamma(dim + 8) sum |x_i q_i| <=
//! gamma(dim + 8) m |q|_1, plus `bf16::tiny` for products and partial
//! sums that underflow. A row's bound takes the largest |q|_1 and e_q of
//! the batch, the 1-norms (summed in f32) are raised by gamma(dim), and
//! the whole is computed in f64, raised by 1% and rounded to f32.
//!
//! A row or query that is not finite, or so small that K / m overflows,
//! gets an infinite bound: the scan then scores it exactly; so does a row
//! whose m |q|_1 + E reaches half of f32's largest value, where the
//! approximate score or the exact kernel's partial sums could overflow.
//! The conversion to integers rounds to nearest, the mode Rust never
//! changes (MXCSR's default). `tests.rs`
//! checks the bound on adversarial vectors, unit and scaled from 1e-37 to
//! 1e18.

use super::{Level, Rows};

/// 16-bit lanes per 64-byte line.
pub const LANES: usize = 32;

/// One 64-byte line of scaled components: rows and queries are held
/// line-aligned, so the kernel's loads never straddle a cache line.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(64))]
pub struct Line(pub [i16; LANES]);

/// Whether the approximate pass can run at `level` on this CPU: AVX2,
/// unless `DELTAMEM_FIXED16=off` asks for the exact batch kernel alone.
/// Not at the AVX-512 level: there `bf16` runs where the CPU has BF16,
/// and without it the 512-bit f32 FMA already does as many multiply-adds
/// an instruction as this 256-bit kernel.
pub fn runs_at(level: Level) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let on = *ON.get_or_init(|| std::env::var("DELTAMEM_FIXED16").map_or(true, |v| v.trim() != "off"));
    on && level == Level::Avx2 && Level::Avx2.is_supported()
}

/// K for a dimension: the largest magnitude a scaled component takes. A
/// row of `lines` lines holds `lines * LANES` components, and dim K^2
/// must stay below 2^31 for the 32-bit sum. K is at most 8,191 (one
/// line), so it fits an i16 and each `vpmaddwd` pair sum fits 32 bits.
pub fn levels(lines: usize) -> f32 {
    let components = (lines.max(1) * LANES) as f64;
    (f64::from(i32::MAX) / components).sqrt().floor() as f32
}

/// How far a scaled component can be from its exact value, in units of
/// 1 / s (the module comment's D).
fn unit_error(k: f32) -> f64 {
    0.5 + f64::from(k) * 2f64.powi(-23) + 2f64.powi(-140)
}

/// Rows (or queries) scaled to 16-bit lines, `lines_per_row` lines each,
/// zero padded, with what the bound needs of each: the scale s (0 where
/// the row is not finite or too small to scale) and its reciprocal (0
/// there; taken once per row, not once per scored pair), the largest
/// magnitude and the 1-norm (summed in f32).
#[derive(Debug, Clone, Default)]
pub struct Scaled {
    pub lines: Vec<Line>,
    pub scales: Vec<f32>,
    pub inverses: Vec<f64>,
    pub max_abs: Vec<f32>,
    pub l1: Vec<f32>,
    pub lines_per_row: usize,
}

impl Scaled {
    /// Room for `rows` rows of dimension `dim`.
    pub fn with_capacity(rows: usize, dim: usize) -> Scaled {
        let lines_per_row = dim.div_ceil(LANES);
        Scaled {
            lines: vec![Line::default(); rows * lines_per_row],
            scales: vec![0.0; rows],
            inverses: vec![0.0; rows],
            max_abs: vec![0.0; rows],
            l1: vec![0.0; rows],
            lines_per_row,
        }
    }

    /// Scales `queries` (each `dim` long).
    pub fn queries(level: Level, queries: &[&[f32]], dim: usize) -> Scaled {
        let mut out = Scaled::with_capacity(queries.len(), dim);
        for (b, q) in queries.iter().enumerate() {
            let rows = Rows {
                bytes: bytemuck::cast_slice(q),
                stride_bytes: 0,
                offset_bytes: 0,
                slots: &[0],
            };
            scale_into(level, rows, dim, &mut out, b);
        }
        out
    }

    /// e_x of row i (module comment): infinite where it could not be scaled.
    fn error(&self, i: usize, k: f32) -> f64 {
        let s = self.scales[i];
        // A 1-norm of exactly 0 is a row of zeros (held exactly); not the
        // largest magnitude, which can miss a NaN (`x86_fixed16::max8`).
        if self.l1[i] == 0.0 {
            0.0
        } else if s > 0.0 && s.is_finite() {
            unit_error(k) / f64::from(s)
        } else {
            f64::INFINITY
        }
    }
}

/// Scales the f32 rows `rows` (`dim` LE f32 each) into `out`, row i into
/// its lines i. `out` must have room for every row.
pub fn scale_rows(level: Level, rows: Rows<'_>, dim: usize, out: &mut Scaled) {
    assert_eq!(out.lines_per_row, dim.div_ceil(LANES), "scaled rows of dimension {dim}");
    scale_into(level, rows, dim, out, 0);
}

/// `scale_rows` into `out` from its row `first`.
fn scale_into(level: Level, rows: Rows<'_>, dim: usize, out: &mut Scaled, first: usize) {
    assert!(runs_at(level), "the 16-bit pass runs only where runs_at says");
    rows.check(dim * 4);
    let count = rows.slots.len();
    let lines = out.lines_per_row;
    assert!(out.scales.len() >= first + count, "room for every row");
    let k = levels(lines);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `runs_at` checked the CPU features and `rows.check` the
    // rows; the x86 function asserts the room in every output.
    unsafe {
        super::x86_fixed16::scale_rows(
            rows,
            dim,
            k,
            &mut out.lines[first * lines..],
            &mut out.max_abs[first..],
            &mut out.l1[first..],
            &mut out.scales[first..],
        )
    }
    for (inverse, &s) in out.inverses[first..first + count].iter_mut().zip(&out.scales[first..]) {
        *inverse = if s > 0.0 { 1.0 / f64::from(s) } else { 0.0 };
    }
}

/// Approximate scores of the first `count` scaled rows against every
/// scaled query: `out[i * nq + b]` for row i and query b, and
/// `bounds[i]`, which |approx - exact f32 score| never exceeds for any of
/// the queries. Meanwhile the cache lines of `ahead` (the rows the next
/// `scale_rows` will read, or nothing) are asked for.
pub fn score(
    level: Level,
    queries: &Scaled,
    rows: &Scaled,
    count: usize,
    out: &mut [f32],
    bounds: &mut [f32],
    ahead: &[u8],
) {
    assert!(runs_at(level), "the 16-bit pass runs only where runs_at says");
    let nq = queries.scales.len();
    assert!(nq > 0, "at least one query");
    assert_eq!(
        queries.lines_per_row, rows.lines_per_row,
        "queries and rows of one dimension"
    );
    assert!(rows.scales.len() >= count && bounds.len() >= count, "a bound per row");
    assert!(out.len() >= count * nq, "a score per row and query");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `runs_at` checked the CPU features; the x86 function
    // asserts that the queries and rows hold what it reads (the closure's
    // indexing checks `out`).
    unsafe {
        super::x86_fixed16::score(
            &queries.lines,
            nq,
            &rows.lines,
            count,
            rows.lines_per_row,
            ahead,
            |i, b, sum| {
                out[i * nq + b] = (f64::from(sum) * rows.inverses[i] * queries.inverses[b]) as f32;
            },
        )
    }
    let batch = BatchTerms::of(queries);
    for (i, bound) in bounds[..count].iter_mut().enumerate() {
        *bound = batch.bound(rows, i);
    }
}

/// What a row's bound takes of the whole batch of queries.
struct BatchTerms {
    /// The largest query 1-norm, raised by gamma(dim).
    l1: f64,
    /// The largest e_q.
    error: f64,
    dim: usize,
    k: f32,
}

impl BatchTerms {
    fn of(queries: &Scaled) -> BatchTerms {
        let lines = queries.lines_per_row;
        let dim = lines * LANES;
        let k = levels(lines);
        let raise = 1.0 + super::quant::gamma(dim);
        let mut terms = BatchTerms {
            l1: 0.0,
            error: 0.0,
            dim,
            k,
        };
        for b in 0..queries.scales.len() {
            // NaN compares false: `max` would drop it, so it is made infinite.
            let l1 = f64::from(queries.l1[b]) * raise;
            terms.l1 = if l1.is_nan() { f64::INFINITY } else { terms.l1.max(l1) };
            terms.error = terms.error.max(queries.error(b, k));
        }
        terms
    }

    /// Row i's bound (module comment), as an f32 no smaller than it.
    fn bound(&self, rows: &Scaled, i: usize) -> f32 {
        let e_x = rows.error(i, self.k);
        let row_l1 = f64::from(rows.l1[i]) * (1.0 + super::quant::gamma(self.dim));
        let max_abs = f64::from(rows.max_abs[i]);
        let scaling = e_x * self.l1 + self.error * row_l1 + self.dim as f64 * e_x * self.error;
        let magnitude = max_abs * self.l1 + scaling;
        // Past this, the approximate score or the exact kernel's partial
        // sums may overflow f32 to an infinity no finite bound covers.
        if magnitude.is_nan() || magnitude >= f64::from(f32::MAX) / 2.0 {
            return f32::INFINITY;
        }
        let rounding = (2f64.powi(-23) + super::quant::gamma(self.dim + 8)) * magnitude;
        let bound = (scaling + rounding + f64::from(super::bf16::tiny(self.dim))) * 1.01;
        if bound.is_nan() { f32::INFINITY } else { bound as f32 }
    }
}

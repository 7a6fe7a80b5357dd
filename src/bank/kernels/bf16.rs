//! An approximate first pass for wide f32 batches: rows and queries
//! rounded to bfloat16 and multiplied with the AVX-512 BF16 dot product
//! (`vdpbf16ps`: two products per f32 lane per instruction, so twice the
//! multiply-adds per cycle of the f32 FMA), with a proven bound on how far
//! each approximate score can be from the exact f32 kernel's score.
//!
//! A pass of many queries over an f32 column is bound by its FMAs, not by
//! memory (`x86_tiled`); this pass does half the instructions per (row,
//! query) pair, after rounding each row once for the whole batch. The scan
//! (`scan::exact`) then scores exactly, with `score_f32`, only the pairs
//! whose approximate score plus the bound could still reach the top-k, so
//! the answers are the f32 scan's, bit for bit.
//!
//! The bound. With u = 2^-8 (bfloat16 keeps 8 significant bits, rounding
//! to nearest), a rounded component is x(1 + d), |d| <= u, so each rounded
//! product is within (2u + u^2)|q_i x_i| of the exact one. The products of
//! two bfloat16 values are exact in f32, and their f32 sum (at most
//! `dim / 16 + 8` additions deep) adds at most gamma(dim + 8) times the sum
//! of their magnitudes; the exact f32 kernel's own rounding adds as much
//! again. By Cauchy-Schwarz the sum of |q_i x_i| is at most |q| |x|. So
//!
//!   |approx - exact f32| <= (2u + u^2 + 3 gamma(dim + 8)) |q| |x| + tiny.
//!
//! Values below 2^-126 (f32's least normal) need care, as the
//! instructions treat them as zero:
//! - A component flushed to zero loses |q_i x_i| <= 2^-126 |q_i| (or
//!   |x_i|), at most 2^-126 sqrt(dim) |q| over a row. The norms are taken
//!   as sqrt(sum of squares + dim 2^-126): a square that underflows loses
//!   less than 2^-126, so this is still at least the norm, and it is at
//!   least sqrt(dim) 2^-63, which makes the first term cover every
//!   flushed component many times over, for rows and queries of any
//!   scale (without it, a row of components near 1e-22 has squares that
//!   underflow to a norm of 0).
//! - A product or partial sum flushed to zero loses less than 2^-126 each:
//!   `tiny` is (2 dim + 16) 2^-125, twice that many.
//!
//! `factor` rounds the constant up by a quarter, which also covers the f32
//! rounding of the norms (relative ~1e-6) and of the bound. The rounding
//! of `approx + bound - penalty` needs no margin: rounding is monotone and
//! the exact score is itself an f32. `tests.rs` checks the bound on
//! adversarial vectors, unit and scaled from 1e-37 to 1e18.

use super::{Level, Rows};

/// bfloat16 lanes per 64-byte line.
pub const LANES: usize = 32;

/// One 64-byte line of bfloat16 bits: rounded rows and queries are held
/// line-aligned, so the kernel's loads never straddle a cache line.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(64))]
pub struct Line(pub [u16; LANES]);

/// Whether the approximate pass can run at `level` on this CPU: AVX-512
/// with the BF16 extension (AMD Zen 4 and later, Intel Cooper Lake and
/// Sapphire Rapids and later), unless `DELTAMEM_BF16=off` asks for the
/// exact batch kernel alone (for comparisons).
pub fn runs_at(level: Level) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let on = *ON.get_or_init(|| {
        let wanted = std::env::var("DELTAMEM_BF16").map_or(true, |v| v.trim() != "off");
        wanted && hardware()
    });
    on && level == Level::Avx512
}

#[cfg(target_arch = "x86_64")]
fn hardware() -> bool {
    Level::Avx512.is_supported() && is_x86_feature_detected!("avx512bf16")
}

#[cfg(not(target_arch = "x86_64"))]
fn hardware() -> bool {
    false
}

/// The bound's constant for dimension `dim` (see the module comment).
pub fn factor(dim: usize) -> f32 {
    let u = 2f64.powi(-8);
    let exact = 2.0 * u + u * u + 3.0 * super::quant::gamma(dim + 8);
    (exact * 1.25) as f32
}

/// The bound's absolute term: every product and partial sum flushed to
/// zero (see the module comment).
pub fn tiny(dim: usize) -> f32 {
    (2.0 * dim as f32 + 16.0) * 2f32.powi(-125)
}

/// Rows (or queries) rounded to bfloat16, `lines_per_row` lines each,
/// zero padded to whole lines, with an upper bound of each row's
/// Euclidean norm (of the f32 values, computed in f32: sqrt(sum of squares
/// + dim 2^-126), see the module comment).
#[derive(Debug, Clone, Default)]
pub struct Rounded {
    pub lines: Vec<Line>,
    pub norms: Vec<f32>,
    pub lines_per_row: usize,
}

impl Rounded {
    /// Room for `rows` rows of dimension `dim`.
    pub fn with_capacity(rows: usize, dim: usize) -> Rounded {
        let lines_per_row = dim.div_ceil(LANES);
        Rounded {
            lines: vec![Line::default(); rows * lines_per_row],
            norms: vec![0.0; rows],
            lines_per_row,
        }
    }

    /// Rounds `queries` (each `dim` long).
    pub fn queries(level: Level, queries: &[&[f32]], dim: usize) -> Rounded {
        let mut out = Rounded::with_capacity(queries.len(), dim);
        for (b, q) in queries.iter().enumerate() {
            let rows = Rows {
                bytes: bytemuck::cast_slice(q),
                stride_bytes: 0,
                offset_bytes: 0,
                slots: &[0],
            };
            let lines = &mut out.lines[b * out.lines_per_row..(b + 1) * out.lines_per_row];
            round_into(level, rows, dim, lines, &mut out.norms[b..b + 1]);
        }
        out
    }

    /// The largest norm (of a set of queries).
    pub fn max_norm(&self) -> f32 {
        self.norms
            .iter()
            .fold(0.0f32, |m, &n| if n > m || n.is_nan() { n } else { m })
    }
}

/// Rounds the f32 rows `rows` (`dim` LE f32 each) into `out`, row i into
/// its lines i, with norms. `out` must have room for every row.
pub fn round_rows(level: Level, rows: Rows<'_>, dim: usize, out: &mut Rounded) {
    assert_eq!(
        out.lines_per_row,
        dim.div_ceil(LANES),
        "rounded rows of dimension {dim}"
    );
    round_into(level, rows, dim, &mut out.lines, &mut out.norms);
}

/// `round_rows` into any room: `dim.div_ceil(LANES)` lines and a norm
/// per row.
fn round_into(level: Level, rows: Rows<'_>, dim: usize, lines: &mut [Line], norms: &mut [f32]) {
    assert!(runs_at(level), "the bfloat16 pass runs only where runs_at says");
    rows.check(dim * 4);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `runs_at` checked the CPU features and `rows.check` the
    // rows; the x86 function asserts the room in `lines` and `norms`.
    unsafe {
        super::x86_bf16::round_rows(rows, dim, lines, norms)
    }
}

/// Approximate scores of the first `count` rounded rows against every
/// rounded query: `out[i * nq + b]` for row i and query b, and
/// `bounds[i]`, which |approx - exact f32 score| never exceeds for any of
/// the queries. Meanwhile the cache lines of `ahead` (the rows the next
/// `round_rows` will read, or nothing) are asked for.
pub fn score(
    level: Level,
    queries: &Rounded,
    rows: &Rounded,
    count: usize,
    out: &mut [f32],
    bounds: &mut [f32],
    ahead: &[u8],
) {
    assert!(runs_at(level), "the bfloat16 pass runs only where runs_at says");
    let nq = queries.norms.len();
    assert!(nq > 0, "at least one query");
    assert_eq!(
        queries.lines_per_row, rows.lines_per_row,
        "queries and rows of one dimension"
    );
    assert!(rows.norms.len() >= count && bounds.len() >= count, "a bound per row");
    assert!(out.len() >= count * nq, "a score per row and query");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `runs_at` checked the CPU features; the x86 function
    // asserts that the queries, rows and output hold what it reads.
    unsafe {
        super::x86_bf16::score(&queries.lines, nq, &rows.lines, count, rows.lines_per_row, out, ahead)
    }
    let dim = rows.lines_per_row * LANES;
    let (c, t) = (factor(dim), tiny(dim));
    let q_norm = queries.max_norm();
    for (bound, &norm) in bounds[..count].iter_mut().zip(&rows.norms) {
        // Near f32's largest value the approximate score or the exact
        // kernel's partial sums (at most |q| |x|) may overflow to an
        // infinity no finite bound covers: the scan scores such rows exactly.
        let product = f64::from(q_norm) * f64::from(norm);
        let overflows = product.is_nan() || product >= f64::from(f32::MAX) / 2.0;
        *bound = if overflows {
            f32::INFINITY
        } else {
            c * q_norm * norm + t
        };
    }
}

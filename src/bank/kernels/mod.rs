//! Scoring kernels for the scan: dot products of one to `MAX_BLOCK`
//! queries against rows of the mapped column, in three storage forms
//! (f32, f16, int8), with explicit SIMD chosen at run time.
//!
//! Levels: AVX-512 (F+BW), AVX2 (+FMA+F16C), and a portable fallback (the
//! only one on other architectures). Every level keeps several independent
//! accumulators so a row is a few dozen independent FMAs, not one serial
//! chain. Within a level, a query's score does not depend on how many
//! queries share the pass (the batched kernels run the single-query
//! arithmetic per query), and an f16 row scores exactly like the same
//! values held as f32 (the f16 kernel converts, then runs the f32
//! arithmetic). Levels differ from each other only by float rounding; the
//! int8 kernels are exact integer arithmetic, identical everywhere.
//!
//! `bf16` and `fixed16` are not storage forms: they round f32 rows and
//! queries to bfloat16 (AVX-512 BF16) or scale them to 16-bit integers
//! (AVX2) for an approximate first pass of wide f32 batches, with a bound
//! on its error, so the scan scores exactly only what could matter.

pub mod bf16;
pub mod fixed16;
mod portable;
pub mod quant;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_ahead;
#[cfg(target_arch = "x86_64")]
mod x86_bf16;
#[cfg(target_arch = "x86_64")]
mod x86_fixed16;
#[cfg(target_arch = "x86_64")]
mod x86_tiled;

use std::sync::OnceLock;

/// The approximate first pass a wide f32 pass at `level` uses on this
/// CPU, if any: "bfloat16" (`bf16`) or "16-bit integer" (`fixed16`).
pub fn first_pass_name(level: Level) -> Option<&'static str> {
    if bf16::runs_at(level) {
        Some("bfloat16")
    } else if fixed16::runs_at(level) {
        Some("16-bit integer")
    } else {
        None
    }
}

/// The most queries one pass over the column scores together. Eight f32
/// queries of dim 768 take 24 KB, inside L1, and their FMAs still cost
/// less than streaming the row from memory.
pub const MAX_BLOCK: usize = 8;

/// The most f32 queries one pass scores together (`score_f32_batch`).
/// With more than a few queries a pass is bound by the FMAs, not by
/// memory, and the register-blocked kernel keeps the FMA units busy, so a
/// pass may take everything a server has waiting: 64 queries of dim 768
/// take 192 KB (in L2) and their score buffer of a chunk 64 KB.
pub const MAX_BATCH: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Portable,
    /// AVX2 with FMA and F16C (Haswell and later, every AMD Zen).
    Avx2,
    /// AVX-512 F and BW (Skylake-SP and later, AMD Zen 4 and later).
    Avx512,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Portable => "portable",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
        }
    }

    pub fn parse(text: &str) -> Option<Level> {
        [Level::Portable, Level::Avx2, Level::Avx512]
            .into_iter()
            .find(|l| l.name() == text)
    }

    /// Whether this CPU can run the level.
    pub fn is_supported(self) -> bool {
        match self {
            Level::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => {
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Every level this CPU runs, slowest first (tests compare them all).
    pub fn all_supported() -> Vec<Level> {
        [Level::Portable, Level::Avx2, Level::Avx512]
            .into_iter()
            .filter(|l| l.is_supported())
            .collect()
    }

    /// The level scans use: the best supported one, or a lower one named
    /// by `DELTAMEM_KERNEL` (portable, avx2, avx512) for comparisons.
    /// Decided once per process, so every scan of a process (and every
    /// thread of a scan) computes identical scores.
    pub fn active() -> Level {
        static ACTIVE: OnceLock<Level> = OnceLock::new();
        *ACTIVE.get_or_init(|| {
            let best = *Level::all_supported().last().expect("portable is always supported");
            std::env::var("DELTAMEM_KERNEL")
                .ok()
                .and_then(|name| Level::parse(name.trim()))
                .filter(|l| l.is_supported())
                .unwrap_or(best)
        })
    }
}

/// The rows one kernel call scores: row `slots[i]` starts at byte
/// `slots[i] * stride_bytes + offset_bytes` of `bytes`.
#[derive(Debug, Clone, Copy)]
pub struct Rows<'a> {
    pub bytes: &'a [u8],
    pub stride_bytes: usize,
    pub offset_bytes: usize,
    pub slots: &'a [u32],
}

impl Rows<'_> {
    /// Panics unless every row of `row_bytes` lies inside `bytes`: the
    /// SIMD kernels read through raw pointers after this one check.
    fn check(&self, row_bytes: usize) {
        if let Some(&last) = self.slots.iter().max() {
            let end = last as usize * self.stride_bytes + self.offset_bytes + row_bytes;
            assert!(
                end <= self.bytes.len(),
                "row {last} ends at {end}, past {}",
                self.bytes.len()
            );
        }
    }

    fn row(&self, i: usize, row_bytes: usize) -> &[u8] {
        let start = self.slots[i] as usize * self.stride_bytes + self.offset_bytes;
        &self.bytes[start..start + row_bytes]
    }
}

fn check_queries<T>(queries: &[&[T]], dim: usize, out_len: usize, rows: usize) {
    check_up_to(MAX_BLOCK, queries, dim, out_len, rows)
}

fn check_up_to<T>(max: usize, queries: &[&[T]], dim: usize, out_len: usize, rows: usize) {
    assert!(!queries.is_empty() && queries.len() <= max, "1..={max} queries");
    assert!(
        queries.iter().all(|q| q.len() == dim),
        "every query has {dim} components"
    );
    assert!(
        out_len >= rows * queries.len(),
        "output holds a score per row and query"
    );
}

/// Scores f32 rows (`dim` LE f32 each): `out[i * queries.len() + b]` =
/// query b . row i.
pub fn score_f32(level: Level, queries: &[&[f32]], dim: usize, rows: Rows<'_>, out: &mut [f32]) {
    score_float::<false>(Format::F32, level, queries, dim, rows, out, &mut []);
}

/// `score_f32`, and `sums[i]` = the lane sum (`format::lane_sum32`) of row
/// i's `dim * 4` bytes, computed from the same loads: the scan's check of
/// a vector on first read, at the cost of an integer add per load.
pub fn score_f32_summed(
    level: Level,
    queries: &[&[f32]],
    dim: usize,
    rows: Rows<'_>,
    out: &mut [f32],
    sums: &mut [u32],
) {
    score_float::<true>(Format::F32, level, queries, dim, rows, out, sums);
}

/// `score_f32` for up to `MAX_BATCH` queries, register-blocked (several
/// rows by several queries per inner loop): the same bits as `score_f32`
/// at the same level, scored one query at a time.
pub fn score_f32_batch(level: Level, queries: &[&[f32]], dim: usize, rows: Rows<'_>, out: &mut [f32]) {
    check_up_to(MAX_BATCH, queries, dim, out.len(), rows.slots.len());
    rows.check(dim * 4);
    match level {
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 if Level::Avx512.is_supported() => {
            // SAFETY: the CPU has the features (checked above); rows and
            // queries were bounds-checked above.
            unsafe { x86_tiled::score_f32_tiled_avx512(queries, dim, rows, out) }
        }
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 if Level::Avx2.is_supported() => {
            // SAFETY: as above.
            unsafe { x86_tiled::score_f32_tiled_avx2(queries, dim, rows, out) }
        }
        _ => portable::score_f32(queries, dim, rows, out),
    }
}

/// Queries copied so that each starts on a 64-byte boundary. A 64-byte
/// load of a query chunk then reads one cache line, not two; the batch
/// kernel loads a query chunk for every other FMA, and with the queries
/// where the allocator put them (16 bytes past a boundary) its pass took
/// 13% (rows from memory) to 22% (rows in L2) more CPU time
/// (examples/batch_kernel.rs). The values are copied unchanged, so every
/// score is the same.
#[derive(Debug, Clone)]
pub struct AlignedQueries {
    buf: Vec<f32>,
    start: usize,
    stride: usize,
    dim: usize,
    count: usize,
}

impl AlignedQueries {
    /// Copies `queries`, each `dim` long.
    pub fn new<Q: AsRef<[f32]>>(queries: &[Q], dim: usize) -> AlignedQueries {
        // 16 f32 = 64 bytes; 15 spare components to reach a boundary.
        let stride = dim.div_ceil(16) * 16;
        let mut buf = vec![0.0f32; queries.len() * stride + 15];
        let start = buf.as_ptr().align_offset(64);
        for (i, q) in queries.iter().enumerate() {
            let q = q.as_ref();
            assert_eq!(q.len(), dim, "every query has {dim} components");
            buf[start + i * stride..start + i * stride + dim].copy_from_slice(q);
        }
        AlignedQueries {
            buf,
            start,
            stride,
            dim,
            count: queries.len(),
        }
    }

    /// The copies, in order.
    pub fn refs(&self) -> Vec<&[f32]> {
        (0..self.count)
            .map(|i| &self.buf[self.start + i * self.stride..][..self.dim])
            .collect()
    }
}

/// Scores f16 rows (`dim` LE binary16 each), accumulated in f32: the same
/// score `score_f32` gives for the rows converted to f32.
pub fn score_f16(level: Level, queries: &[&[f32]], dim: usize, rows: Rows<'_>, out: &mut [f32]) {
    score_float::<false>(Format::F16, level, queries, dim, rows, out, &mut []);
}

/// `score_f16`, and `sums[i]` = the lane sum of row i's `dim * 2` stored
/// bytes (as `score_f32_summed`).
pub fn score_f16_summed(
    level: Level,
    queries: &[&[f32]],
    dim: usize,
    rows: Rows<'_>,
    out: &mut [f32],
    sums: &mut [u32],
) {
    score_float::<true>(Format::F16, level, queries, dim, rows, out, sums);
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    F32,
    F16,
}

fn score_float<const C: bool>(
    format: Format,
    level: Level,
    queries: &[&[f32]],
    dim: usize,
    rows: Rows<'_>,
    out: &mut [f32],
    sums: &mut [u32],
) {
    check_queries(queries, dim, out.len(), rows.slots.len());
    assert!(!C || sums.len() >= rows.slots.len(), "a lane sum per row");
    let row_bytes = if format == Format::F32 { dim * 4 } else { dim * 2 };
    rows.check(row_bytes);
    match (level, format) {
        #[cfg(target_arch = "x86_64")]
        (Level::Avx512, Format::F32) if Level::Avx512.is_supported() => {
            // SAFETY: the CPU has the features (checked above); rows and
            // queries were bounds-checked above, sums sized.
            unsafe { x86::score_f32_avx512::<C>(queries, dim, rows, out, sums) }
        }
        #[cfg(target_arch = "x86_64")]
        (Level::Avx512, Format::F16) if Level::Avx512.is_supported() => {
            // SAFETY: as above.
            unsafe { x86::score_f16_avx512::<C>(queries, dim, rows, out, sums) }
        }
        #[cfg(target_arch = "x86_64")]
        (Level::Avx2, Format::F32) if Level::Avx2.is_supported() => {
            // SAFETY: as above.
            unsafe { x86::score_f32_avx2::<C>(queries, dim, rows, out, sums) }
        }
        #[cfg(target_arch = "x86_64")]
        (Level::Avx2, Format::F16) if Level::Avx2.is_supported() => {
            // SAFETY: as above.
            unsafe { x86::score_f16_avx2::<C>(queries, dim, rows, out, sums) }
        }
        _ => {
            match format {
                Format::F32 => portable::score_f32(queries, dim, rows, out),
                Format::F16 => portable::score_f16(queries, dim, rows, out),
            }
            if C {
                portable::lane_sums(rows, row_bytes, sums);
            }
        }
    }
}

/// An int8-quantised query in the forms the int8 kernels use, laid out
/// like a side-column row (FORMAT.md §1): four zero lanes where the row
/// holds its f32 scale, the codes, then zeros up to a multiple of 64
/// lanes. The kernels then run over whole rows from their (64-byte
/// aligned) start with no tail: the scale and padding bytes meet zero
/// codes and add nothing, and no load straddles a cache line.
#[derive(Debug, Clone, PartialEq)]
pub struct Codes {
    /// Codes in -127..=127, one byte each (the VNNI kernels).
    pub narrow: Vec<i8>,
    /// The same codes widened (the multiply-add kernels).
    pub wide: Vec<i16>,
    /// Their sum: the VNNI kernels multiply unsigned row bytes (code + 128)
    /// and subtract 128 times this.
    pub sum: i32,
}

/// Bytes before the codes in a side-column row (the f32 scale).
pub const INT8_LEAD_BYTES: usize = 4;

impl Codes {
    pub fn new(codes: &[i8]) -> Codes {
        assert!(codes.iter().all(|&c| c != i8::MIN), "codes are in -127..=127");
        let len = (INT8_LEAD_BYTES + codes.len()).div_ceil(64) * 64;
        let mut narrow = vec![0i8; len];
        narrow[INT8_LEAD_BYTES..INT8_LEAD_BYTES + codes.len()].copy_from_slice(codes);
        Codes {
            wide: narrow.iter().map(|&c| i16::from(c)).collect(),
            sum: codes.iter().map(|&c| i32::from(c)).sum(),
            narrow,
        }
    }

    /// Bytes of the side-column rows these codes score: the row stride.
    pub fn row_bytes(&self) -> usize {
        self.narrow.len()
    }
}

/// Which int8 instructions a kernel uses: VNNI dot products (four byte
/// pairs per lane per instruction), 256 or 512 bits wide, or 16-bit
/// multiply-adds. Integer arithmetic throughout, so every path gives the
/// same results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int8Path {
    MultiplyAdd,
    Vnni256,
    Vnni512,
}

impl Int8Path {
    /// The path scans use at `level`. The 256-bit VNNI kernel comes first
    /// even at the AVX-512 level: the scan is memory-bound, and on the
    /// AMD Zen 5 it was measured on the 512-bit one streamed ~20% slower
    /// (benches/engine.rs, `bench_scan rawq`).
    pub fn best(level: Level) -> Int8Path {
        [Int8Path::Vnni256, Int8Path::Vnni512, Int8Path::MultiplyAdd]
            .into_iter()
            .find(|p| p.runs_at(level))
            .expect("multiply-add runs everywhere")
    }

    /// Whether this path can run at `level` on this CPU.
    pub fn runs_at(self, level: Level) -> bool {
        match self {
            Int8Path::MultiplyAdd => true,
            #[cfg(target_arch = "x86_64")]
            Int8Path::Vnni256 => {
                level >= Level::Avx2 && Level::Avx2.is_supported() && is_x86_feature_detected!("avxvnni")
            }
            #[cfg(target_arch = "x86_64")]
            Int8Path::Vnni512 => {
                level == Level::Avx512 && Level::Avx512.is_supported() && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

/// Integer dot products of int8 side-column rows (whole rows, from their
/// start: `Codes` explains the layout) with int8 query codes. Exact:
/// |sum| <= 255 * 127 * 16384 < 2^31.
pub fn score_i8(level: Level, queries: &[&Codes], rows: Rows<'_>, out: &mut [i32]) {
    score_i8_any::<false>(level, best_int8_path(level), queries, rows, out, &mut [])
}

/// `score_i8`, and `sums[i]` = the lane sum of side-column row i (all of
/// its `row_bytes`), from the same loads.
pub fn score_i8_summed(level: Level, queries: &[&Codes], rows: Rows<'_>, out: &mut [i32], sums: &mut [u32]) {
    score_i8_any::<true>(level, best_int8_path(level), queries, rows, out, sums)
}

fn best_int8_path(level: Level) -> Int8Path {
    static BEST: OnceLock<[Int8Path; 3]> = OnceLock::new();
    let best = BEST.get_or_init(|| [Level::Portable, Level::Avx2, Level::Avx512].map(Int8Path::best));
    best[level as usize]
}

/// `score_i8` with the instruction choice made by the caller (tests and
/// benchmarks run them all); a path that cannot run at `level` falls back
/// to multiply-add.
pub fn score_i8_path(level: Level, path: Int8Path, queries: &[&Codes], rows: Rows<'_>, out: &mut [i32]) {
    score_i8_any::<false>(level, path, queries, rows, out, &mut [])
}

/// `score_i8_path` with lane sums (as `score_i8_summed`).
pub fn score_i8_path_summed(
    level: Level,
    path: Int8Path,
    queries: &[&Codes],
    rows: Rows<'_>,
    out: &mut [i32],
    sums: &mut [u32],
) {
    score_i8_any::<true>(level, path, queries, rows, out, sums)
}

fn score_i8_any<const C: bool>(
    level: Level,
    path: Int8Path,
    queries: &[&Codes],
    rows: Rows<'_>,
    out: &mut [i32],
    sums: &mut [u32],
) {
    let len = queries.first().map_or(0, |q| q.row_bytes());
    let mut wide: [&[i16]; MAX_BLOCK] = [&[]; MAX_BLOCK];
    for (w, q) in wide.iter_mut().zip(queries) {
        *w = &q.wide;
    }
    let wide = &wide[..queries.len().min(MAX_BLOCK)];
    check_queries(wide, len, out.len(), rows.slots.len());
    assert!(len.is_multiple_of(64), "codes are padded to 64 lanes");
    assert!(!C || sums.len() >= rows.slots.len(), "a lane sum per row");
    rows.check(len);
    let path = if path.runs_at(level) {
        path
    } else {
        Int8Path::MultiplyAdd
    };
    match (level, path) {
        #[cfg(target_arch = "x86_64")]
        (_, Int8Path::Vnni512) => {
            // SAFETY: `runs_at` checked the CPU features; rows and queries
            // were bounds-checked above, sums sized.
            unsafe { x86::score_i8_vnni512::<C>(queries, len, rows, out, sums) }
        }
        #[cfg(target_arch = "x86_64")]
        (_, Int8Path::Vnni256) => {
            // SAFETY: as above.
            unsafe { x86::score_i8_vnni256::<C>(queries, len, rows, out, sums) }
        }
        #[cfg(target_arch = "x86_64")]
        (Level::Avx512, _) if Level::Avx512.is_supported() => {
            // SAFETY: the CPU has the level's features; bounds as above.
            unsafe { x86::score_i8_avx512::<C>(wide, len, rows, out, sums) }
        }
        #[cfg(target_arch = "x86_64")]
        (Level::Avx2, _) if Level::Avx2.is_supported() => {
            // SAFETY: as above.
            unsafe { x86::score_i8_avx2::<C>(wide, len, rows, out, sums) }
        }
        _ => {
            portable::score_i8(wide, len, rows, out);
            if C {
                portable::lane_sums(rows, len, sums);
            }
        }
    }
}

/// Asks the CPU to start loading the cache line holding `bytes[at]` into
/// L1 (nothing if `at` is out of range; never faults).
#[inline]
pub fn prefetch(bytes: &[u8], at: usize) {
    #[cfg(target_arch = "x86_64")]
    if at < bytes.len() {
        // SAFETY: `at` is inside the slice; a prefetch reads nothing
        // architecturally and never faults.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(bytes.as_ptr().add(at).cast()) }
    }
}

/// One dot product of two f32 vectors at the active level.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot of vectors of different lengths");
    let rows = Rows {
        bytes: bytemuck::cast_slice(b),
        stride_bytes: 0,
        offset_bytes: 0,
        slots: &[0],
    };
    let mut out = [0.0f32];
    score_f32(Level::active(), &[a], a.len(), rows, &mut out);
    out[0]
}

#[cfg(test)]
mod tests;

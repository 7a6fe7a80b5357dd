//! The exact scan of the checkpointed column (f32 and f16 banks). A wide
//! f32 pass may score first approximately (bfloat16 on AVX-512 BF16,
//! 16-bit integers on AVX2) and then exactly only the pairs that could
//! make the top-k (`scan_rows_rounded`): the same answers, bit for bit,
//! for about half the arithmetic.

use std::ops::Range;

use super::{
    CHUNK_ROWS, PREFETCH_STEP_ROWS, ScanParams, Selected, admit_at, for_each_chunk, in_steps, merge_tops, run_split,
};
use crate::bank::BankError;
use crate::bank::base::{Base, Column, SegmentMaps};
use crate::bank::kernels::{self, Level, Rows, bf16, fixed16};
use crate::format::manifest::Precision;
use crate::tree::TopK;

/// The top `p.fetch` checkpointed rows for each query, the row ranges
/// scanned on their own threads and merged.
pub(super) fn scan_base(
    base: &Base,
    p: &ScanParams,
    queries: &[&[f32]],
    ranges: &[Range<u32>],
) -> Result<Vec<TopK>, BankError> {
    let parts = run_split(ranges, |rows| scan_rows(base, p, queries, rows))?;
    Ok(merge_tops(parts, queries.len(), p.fetch))
}

fn scan_rows(base: &Base, p: &ScanParams, queries: &[&[f32]], rows: Range<u32>) -> Result<Vec<TopK>, BankError> {
    if base.precision == Precision::F32
        && queries.len() >= ROUNDED_MIN_QUERIES
        && let Some(first_pass) = FirstPass::new(p.level, queries, base.dim_count as usize)
    {
        return scan_rows_rounded(base, p, queries, rows, first_pass);
    }
    let nq = queries.len();
    let mut tops: Vec<TopK> = (0..nq).map(|_| TopK::new(p.fetch)).collect();
    let mut selected = Selected::new();
    let mut scores = vec![0.0f32; CHUNK_ROWS * nq];
    let mut first_scores = [0.0f32; PREFETCH_STEP_ROWS];
    for_each_chunk(base, rows, |maps, first, range| {
        let (table, vectors): (&[u8], &[u8]) = (&maps.table, &maps.vectors);
        selected.choose(maps, range.clone(), p);
        in_steps(base, maps, Column::Vectors, first, &selected, range.end, |at, sums| {
            let rows = column_rows(base, vectors, &selected.slots[at.clone()]);
            score_exact(
                base,
                p,
                queries,
                rows,
                &mut scores[at.start * nq..],
                sums,
                &mut first_scores,
            );
        })?;
        for i in 0..selected.len {
            for (b, top) in tops.iter_mut().enumerate() {
                admit_at(top, p, &selected, i, scores[i * nq + b], first, table);
            }
        }
        Ok(())
    })?;
    Ok(tops)
}

/// The f32 (or f16) rows of `slots` in a segment's column.
fn column_rows<'a>(base: &Base, vectors: &'a [u8], slots: &'a [u32]) -> Rows<'a> {
    Rows {
        bytes: vectors,
        stride_bytes: base.stride_bytes as usize,
        offset_bytes: 0,
        slots,
    }
}

/// Exact scores of `rows` for every query into `out` (row-major), with
/// the rows' lane sums when `sums` asks for them.
fn score_exact(
    base: &Base,
    p: &ScanParams,
    queries: &[&[f32]],
    rows: Rows<'_>,
    out: &mut [f32],
    sums: Option<&mut [u32]>,
    first_scores: &mut [f32; PREFETCH_STEP_ROWS],
) {
    let (nq, dim) = (queries.len(), base.dim_count as usize);
    match (base.precision, sums) {
        (Precision::F16, None) => kernels::score_f16(p.level, queries, dim, rows, out),
        (Precision::F16, Some(sums)) => kernels::score_f16_summed(p.level, queries, dim, rows, out, sums),
        (_, None) if nq == 1 => kernels::score_f32(p.level, queries, dim, rows, out),
        (_, None) => kernels::score_f32_batch(p.level, queries, dim, rows, out),
        (_, Some(sums)) if nq <= kernels::MAX_BLOCK => {
            kernels::score_f32_summed(p.level, queries, dim, rows, out, sums)
        }
        (_, Some(sums)) => {
            // A pass wider than the summing kernels, on a segment's first
            // read only: the sums come from a one-query pass over these few
            // dozen rows, which leaves them in cache for the batch kernel.
            let first_scores = &mut first_scores[..rows.slots.len()];
            kernels::score_f32_summed(p.level, &queries[..1], dim, rows, first_scores, sums);
            kernels::score_f32_batch(p.level, queries, dim, rows, out)
        }
    }
}

/// Queries in one pass from which an f32 bank (on a CPU with a first
/// pass) scores them first approximately: below it, rounding or scaling
/// each row costs more than the halved dot products save (on AVX2 the two
/// were about even at 8 queries, and the first pass 1.3-1.8x faster at 32
/// on one thread, 1.2-1.3x on two, which share the memory's bandwidth).
const ROUNDED_MIN_QUERIES: usize = 8;

/// Of the rounded chunk's (row, query) pairs, the share above which the
/// scan goes back to the exact kernel for a while: re-scoring a pair alone
/// costs several times what the batch kernel spends on it, so a pass that
/// re-scores most pairs (a low tau with a large k) is faster without the
/// rounded pass.
const RESCORED_MAX_SHARE: usize = 4;
/// Chunks scored exactly before the rounded pass is tried again.
const EXACT_CHUNKS_BEFORE_RETRY: u32 = 16;

/// `scan_rows` for a wide f32 pass: each step's rows are rounded to
/// bfloat16 or scaled to 16-bit integers and scored against every query
/// with the approximate kernel (`kernels::bf16`, `kernels::fixed16`),
/// which gives each row a bound on its error. A pair
/// is then scored exactly, with `score_f32` as a one-query scan would,
/// only where its approximate score plus the bound could pass the same
/// test `admit_at` applies; pairs are tested in the order the exact scan
/// admits them. Every skipped pair's exact score is at most that
/// optimistic value, so the exact scan's `admit_at` (monotone in the
/// score, against the same top-k, which holds only exact scores) would
/// have refused it too, and the top-k is bit for bit the exact scan's.
fn scan_rows_rounded(
    base: &Base,
    p: &ScanParams,
    queries: &[&[f32]],
    rows: Range<u32>,
    mut first_pass: FirstPass,
) -> Result<Vec<TopK>, BankError> {
    let (nq, dim) = (queries.len(), base.dim_count as usize);
    let mut tops: Vec<TopK> = (0..nq).map(|_| TopK::new(p.fetch)).collect();
    let mut floors: Vec<f32> = tops.iter().map(|t| p.tau.max(t.floor())).collect();
    let mut selected = Selected::new();
    let mut scores = vec![0.0f32; CHUNK_ROWS * nq];
    // Per list position: the error bound of its scores, 0 where exact.
    let mut bounds = [0.0f32; CHUNK_ROWS];
    let mut first_scores = [0.0f32; PREFETCH_STEP_ROWS];
    let mut exact_chunks_left = 0u32;
    for_each_chunk(base, rows, |maps, first, range| {
        let vectors: &[u8] = &maps.vectors;
        let rounded = exact_chunks_left == 0;
        exact_chunks_left = exact_chunks_left.saturating_sub(1);
        selected.choose(maps, range.clone(), p);
        in_steps(base, maps, Column::Vectors, first, &selected, range.end, |at, sums| {
            let rows = column_rows(base, vectors, &selected.slots[at.clone()]);
            let out = &mut scores[at.start * nq..];
            if rounded && sums.is_none() {
                let ahead = next_rows(base, vectors, &selected.slots[at.clone()]);
                first_pass.score(p.level, rows, dim, out, &mut bounds[at], ahead);
            } else {
                score_exact(base, p, queries, rows, out, sums, &mut first_scores);
                bounds[at].fill(0.0);
            }
        })?;
        let rescored = admit_rounded(
            &mut tops,
            &mut floors,
            p,
            queries,
            base,
            maps,
            first,
            &selected,
            &scores,
            &bounds,
        );
        if rescored * RESCORED_MAX_SHARE > selected.len * nq {
            exact_chunks_left = EXACT_CHUNKS_BEFORE_RETRY;
        }
        Ok(())
    })?;
    Ok(tops)
}

/// The approximate first pass of a wide f32 pass, where the CPU has one:
/// bfloat16 on AVX-512 BF16, 16-bit integers on AVX2. Each holds the
/// batch's queries in its form and room for one step's rows.
enum FirstPass {
    Bf16 {
        queries: bf16::Rounded,
        rows: bf16::Rounded,
    },
    Fixed16 {
        queries: fixed16::Scaled,
        rows: fixed16::Scaled,
    },
}

impl FirstPass {
    fn new(level: Level, queries: &[&[f32]], dim: usize) -> Option<FirstPass> {
        if bf16::runs_at(level) {
            Some(FirstPass::Bf16 {
                queries: bf16::Rounded::queries(level, queries, dim),
                rows: bf16::Rounded::with_capacity(PREFETCH_STEP_ROWS, dim),
            })
        } else if fixed16::runs_at(level) {
            Some(FirstPass::Fixed16 {
                queries: fixed16::Scaled::queries(level, queries, dim),
                rows: fixed16::Scaled::with_capacity(PREFETCH_STEP_ROWS, dim),
            })
        } else {
            None
        }
    }

    /// Approximate scores of a step's `rows` into `out` (row-major), and a
    /// bound on each row's error into `bounds`; `ahead` as the kernels'.
    fn score(&mut self, level: Level, rows: Rows<'_>, dim: usize, out: &mut [f32], bounds: &mut [f32], ahead: &[u8]) {
        let count = rows.slots.len();
        match self {
            FirstPass::Bf16 { queries, rows: step } => {
                bf16::round_rows(level, rows, dim, step);
                bf16::score(level, queries, step, count, out, bounds, ahead);
            }
            FirstPass::Fixed16 { queries, rows: step } => {
                fixed16::scale_rows(level, rows, dim, step);
                fixed16::score(level, queries, step, count, out, bounds, ahead);
            }
        }
    }
}

/// The bytes of the `PREFETCH_STEP_ROWS` rows after the last of `slots`
/// in the segment's column: the next step's rows when every row passes the
/// filters (most chunks), else a guess; cut at the segment's end.
fn next_rows<'a>(base: &Base, vectors: &'a [u8], slots: &[u32]) -> &'a [u8] {
    let stride = base.stride_bytes as usize;
    let start = slots
        .last()
        .map_or(0, |&s| (s as usize + 1) * stride)
        .min(vectors.len());
    let end = (start + PREFETCH_STEP_ROWS * stride).min(vectors.len());
    &vectors[start..end]
}

/// Admits a chunk's pairs (see `scan_rows_rounded`); returns how many
/// were scored again exactly. `floors[b]` is the least score query b's
/// top-k would take (tau, or its current worst once full), kept up to date.
#[allow(clippy::too_many_arguments)]
fn admit_rounded(
    tops: &mut [TopK],
    floors: &mut [f32],
    p: &ScanParams,
    queries: &[&[f32]],
    base: &Base,
    maps: &SegmentMaps,
    first: u32,
    selected: &Selected,
    scores: &[f32],
    bounds: &[f32],
) -> usize {
    let (nq, dim) = (queries.len(), base.dim_count as usize);
    let table: &[u8] = &maps.table;
    let mut rescored = 0;
    let mut exact = [0.0f32];
    for i in 0..selected.len {
        let (row_scores, bound) = (&scores[i * nq..(i + 1) * nq], bounds[i]);
        for b in 0..nq {
            // The least penalty the row can have, as `admit_at` tests
            // first; NaN (a non-finite component) goes on to be scored.
            let optimistic = row_scores[b] + bound - selected.penalty[i];
            if optimistic < floors[b] {
                continue;
            }
            let mut dot = row_scores[b];
            if bound != 0.0 {
                let row = column_rows(base, &maps.vectors, &selected.slots[i..i + 1]);
                kernels::score_f32(p.level, &queries[b..b + 1], dim, row, &mut exact);
                dot = exact[0];
                rescored += 1;
            }
            admit_at(&mut tops[b], p, selected, i, dot, first, table);
            floors[b] = p.tau.max(tops[b].floor());
        }
    }
    rescored
}

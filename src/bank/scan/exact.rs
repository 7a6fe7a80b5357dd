//! The exact scan of the checkpointed column (f32 and f16 banks).

use std::ops::Range;

use super::{
    CHUNK_ROWS, PREFETCH_STEP_ROWS, ScanParams, Selected, admit_at, for_each_chunk, in_steps, merge_tops, run_split,
};
use crate::bank::BankError;
use crate::bank::base::{Base, Column};
use crate::bank::kernels::{self, Rows};
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
    let nq = queries.len();
    let dim = base.dim_count as usize;
    let mut tops: Vec<TopK> = (0..nq).map(|_| TopK::new(p.fetch)).collect();
    let mut selected = Selected::new();
    let mut scores = vec![0.0f32; CHUNK_ROWS * nq];
    let mut first_scores = [0.0f32; PREFETCH_STEP_ROWS];
    for_each_chunk(base, rows, |maps, first, range| {
        let (table, vectors): (&[u8], &[u8]) = (&maps.table, &maps.vectors);
        selected.choose(maps, range.clone(), p);
        in_steps(base, maps, Column::Vectors, first, &selected, range.end, |at, sums| {
            let rows = Rows {
                bytes: vectors,
                stride_bytes: base.stride_bytes as usize,
                offset_bytes: 0,
                slots: &selected.slots[at.clone()],
            };
            let out = &mut scores[at.start * nq..];
            match (base.precision, sums) {
                (Precision::F16, None) => kernels::score_f16(p.level, queries, dim, rows, out),
                (Precision::F16, Some(sums)) => kernels::score_f16_summed(p.level, queries, dim, rows, out, sums),
                (_, None) if nq == 1 => kernels::score_f32(p.level, queries, dim, rows, out),
                (_, None) => kernels::score_f32_batch(p.level, queries, dim, rows, out),
                (_, Some(sums)) if nq <= kernels::MAX_BLOCK => {
                    kernels::score_f32_summed(p.level, queries, dim, rows, out, sums)
                }
                (_, Some(sums)) => {
                    // A pass wider than the summing kernels, on a segment's
                    // first read only: the sums come from a one-query pass
                    // over these few dozen rows, which leaves them in cache
                    // for the batch kernel.
                    let first_scores = &mut first_scores[..rows.slots.len()];
                    kernels::score_f32_summed(p.level, &queries[..1], dim, rows, first_scores, sums);
                    kernels::score_f32_batch(p.level, queries, dim, rows, out)
                }
            }
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

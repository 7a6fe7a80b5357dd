//! A client's batch query (`/v1/trees/{tree}/query_batch`), scanned a
//! slice of rows per hold of the bank's shared lock.
//!
//! Why not `Bank::query_batch` under one read guard: 1,024 queries over
//! 200k rows held the lock for 1.9 s, and every write waited that long
//! (and, std's lock preferring writers, every read after that write too).
//! A batch answered 503 for its time limit also went on scanning. Here a
//! hold scores about `HOLD_MULTIPLY_ADDS` of work, and the scan stops at
//! the request's deadline.
//!
//! The answers equal `Bank::query_batch` on the bank as it was when the
//! batch began, when no write comes in between (`Bank::scan_rows`: ranges
//! covering `0..visible` once each, merged). A write that does come in
//! between is seen by the slices scanned after it, as in the circular
//! scan; nodes added after the batch began are not scanned.

use std::ops::Range;
use std::time::Instant;

use super::core::{Core, answer};
use super::error::{ApiError, ApiResult};
use super::http::time_limit;
use crate::api::QueryReply;
use crate::bank::{Bank, BankError, PreparedQuery, QueryOptions};
use crate::tree::{Candidate, TopK};

/// Multiply-adds one thread may score in a hold of the lock: rows x
/// queries x dimensions. About 2.5 ms of one core with the AVX2 kernels.
const HOLD_MULTIPLY_ADDS: u64 = 16 << 20;

/// Fewest rows per hold, so a large batch still moves through the bank.
const MIN_HOLD_ROWS: u32 = 64;

/// Rows one hold scans for `query_count` queries of `dim_count`.
fn hold_rows(query_count: usize, dim_count: u32) -> u32 {
    let per_row = (query_count.max(1) as u64) * u64::from(dim_count.max(1));
    (HOLD_MULTIPLY_ADDS / per_row).clamp(u64::from(MIN_HOLD_ROWS), u64::from(u32::MAX)) as u32
}

/// One hold's rows, split between `threads` threads (each about a
/// step's work, so the hold lasts about as long on any count of threads):
/// each part's candidate lists, one per query.
fn scan_hold(
    bank: &Bank,
    queries: &[&PreparedQuery],
    rows: Range<u32>,
    visible: u32,
    threads: usize,
) -> Vec<Result<Vec<Vec<Candidate>>, BankError>> {
    let part_rows = (rows.end - rows.start).div_ceil(threads.max(1) as u32).max(1);
    let parts: Vec<Range<u32>> = (rows.start..rows.end)
        .step_by(part_rows as usize)
        .map(|from| from..from.saturating_add(part_rows).min(rows.end))
        .collect();
    if parts.len() <= 1 {
        return vec![bank.scan_rows(queries, rows, visible)];
    }
    std::thread::scope(|scope| {
        let running: Vec<_> = parts
            .into_iter()
            .map(|part| scope.spawn(move || bank.scan_rows(queries, part, visible)))
            .collect();
        running
            .into_iter()
            .map(|t| t.join().expect("a scan thread panicked"))
            .collect()
    })
}

impl Core {
    /// Answers `embeddings` (checked by `check_embedding`) on `tree`, one
    /// answer per embedding in order, or 503 once `deadline` passes.
    pub fn query_batch_until(
        &self,
        tree: &str,
        embeddings: &[Vec<f32>],
        options: &QueryOptions,
        deadline: Instant,
        request_ms: u64,
    ) -> ApiResult<Vec<QueryReply>> {
        let step = hold_rows(embeddings.len(), self.dim_count());
        self.query_batch_in_holds(tree, embeddings, options, step, deadline)?
            .ok_or_else(|| time_limit(request_ms))
    }

    /// `query_batch_until` with `step` rows per hold: None once `deadline`
    /// has passed.
    pub(super) fn query_batch_in_holds(
        &self,
        tree: &str,
        embeddings: &[Vec<f32>],
        options: &QueryOptions,
        step: u32,
        deadline: Instant,
    ) -> ApiResult<Option<Vec<QueryReply>>> {
        assert!(step > 0, "a hold scans at least one row");
        let bank_error = |e| ApiError::from_bank(e, "embeddings");
        let (prepared, visible) = {
            let bank = self.read()?;
            let prepared = embeddings
                .iter()
                .map(|e| bank.prepare_query(tree, e, options))
                .collect::<Result<Vec<PreparedQuery>, _>>()
                .map_err(bank_error)?;
            (prepared, bank.node_count())
        };
        let queries: Vec<&PreparedQuery> = prepared.iter().collect();
        let mut tops: Vec<TopK> = queries.iter().map(|_| TopK::new(options.k)).collect();
        let mut start = 0u32;
        while start < visible {
            if Instant::now() > deadline {
                return Ok(None);
            }
            let end = start
                .saturating_add(step.saturating_mul(self.threads() as u32))
                .min(visible);
            let parts = scan_hold(&*self.read_hold()?, &queries, start..end, visible, self.threads());
            for lists in parts {
                let lists = lists.map_err(bank_error)?;
                assert_eq!(lists.len(), tops.len(), "one candidate list per query");
                for (top, list) in tops.iter_mut().zip(lists) {
                    list.into_iter().for_each(|c| top.push(c));
                }
            }
            start = end;
        }
        let bank = self.read()?;
        let answers = tops
            .into_iter()
            .map(|top| {
                bank.matches(&top.into_sorted())
                    .map_err(bank_error)
                    .and_then(|m| answer(&bank, m))
            })
            .collect::<ApiResult<Vec<QueryReply>>>()?;
        Ok(Some(answers))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_is_bounded_by_work_and_never_empty() {
        for (queries, dim) in [(1usize, 768u32), (16, 768), (16, 64), (7, 3)] {
            let rows = u64::from(hold_rows(queries, dim));
            let per_row = queries as u64 * u64::from(dim);
            assert!(rows * per_row <= HOLD_MULTIPLY_ADDS, "{queries} x {dim}");
            assert!(
                (rows + 1) * per_row > HOLD_MULTIPLY_ADDS,
                "{queries} x {dim}: as many as fit"
            );
        }
        // Too much work for even a few rows: the fewest, never none.
        assert_eq!(hold_rows(1024, 768), MIN_HOLD_ROWS);
        assert_eq!(hold_rows(1 << 20, 4096), MIN_HOLD_ROWS);
        assert_eq!(hold_rows(0, 0), HOLD_MULTIPLY_ADDS as u32);
    }
}

//! Int8 banks: an approximate first pass over the int8 side column, then
//! an exact f32 re-rank of every row that could still be in the top-k.
//!
//! For each row the first pass knows its approximate penalised score `a`
//! and a proven bound `B` with |a - exact| <= B (`QueryInt8::bound`), so
//! `lo = a - B <= exact <= a + B = hi`. Let T be the `fetch`-th largest
//! `lo` among rows with `lo >= tau`: at least `fetch` rows have exact
//! score >= T, all matching. A row with `hi < max(T, tau)` has an exact
//! score below all of them (or below tau), so it cannot be in the exact
//! top-k; every other row is re-scored with the f32 kernel, exactly as an
//! f32 bank would score it. The running T only grows, so pruning with it
//! during the pass never drops a row the final T keeps. Hence the answers
//! equal the f32 scan's, ties and ranking rules included.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::Range;

use super::{CHUNK_ROWS, PREFETCH_STEP_ROWS as STEP, ScanParams, Selected, admit, for_each_chunk, in_steps, run_split};
use crate::bank::BankError;
use crate::bank::base::{Base, Column};
use crate::bank::kernels::quant::QueryInt8;
use crate::bank::kernels::{self, Rows};
use crate::tree::TopK;

/// Candidates kept before the list is pruned with the running threshold.
const PRUNE_AT: usize = 4096;

/// An f32 ordered by `total_cmp`, for the heap of lower bounds.
#[derive(Clone, Copy, PartialEq)]
struct Ordered(f32);

impl Eq for Ordered {}

impl PartialOrd for Ordered {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ordered {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// The `k` largest lower bounds seen; their minimum is the threshold T.
struct Lows {
    k: usize,
    heap: BinaryHeap<Reverse<Ordered>>,
}

impl Lows {
    fn new(k: usize) -> Lows {
        Lows {
            k,
            heap: BinaryHeap::with_capacity(k.min(1 << 16) + 1),
        }
    }

    fn push(&mut self, lo: f32) {
        if self.heap.len() < self.k {
            self.heap.push(Reverse(Ordered(lo)));
        } else if self.heap.peek().is_some_and(|m| lo > m.0.0) {
            self.heap.pop();
            self.heap.push(Reverse(Ordered(lo)));
        }
    }

    /// T, or minus infinity while fewer than k rows are known to match.
    fn threshold(&self) -> f32 {
        match self.heap.peek() {
            Some(m) if self.heap.len() >= self.k => m.0.0,
            _ => f32::NEG_INFINITY,
        }
    }
}

/// One query's first-pass state over one row range.
struct FirstPass {
    lows: Lows,
    /// (node index, upper bound) of every row not yet ruled out.
    candidates: Vec<(u32, f32)>,
    /// max(tau, T so far): rows whose upper bound is below it are out.
    floor: f32,
    prune_at: usize,
}

impl FirstPass {
    fn new(p: &ScanParams) -> FirstPass {
        FirstPass {
            lows: Lows::new(p.fetch),
            candidates: Vec::new(),
            floor: p.tau,
            prune_at: PRUNE_AT.max(4 * p.fetch),
        }
    }

    #[inline]
    fn offer(&mut self, p: &ScanParams, index: u32, approx: f32, bound: f32) {
        let hi = approx + bound;
        if hi < self.floor {
            return;
        }
        self.candidates.push((index, hi));
        let lo = approx - bound;
        if lo >= p.tau {
            self.lows.push(lo);
            self.floor = p.tau.max(self.lows.threshold());
        }
        if self.candidates.len() >= self.prune_at {
            let floor = self.floor;
            self.candidates.retain(|c| c.1 >= floor);
            self.prune_at = PRUNE_AT.max(2 * self.candidates.len());
        }
    }
}

/// The exact top `p.fetch` checkpointed rows for each query.
pub(super) fn scan_base(
    base: &Base,
    p: &ScanParams,
    queries: &[&[f32]],
    ranges: &[Range<u32>],
) -> Result<Vec<TopK>, BankError> {
    if p.fetch == 0 {
        return Ok(queries.iter().map(|_| TopK::new(0)).collect());
    }
    let quantised: Vec<QueryInt8> = queries.iter().map(|q| QueryInt8::new(q, p.eps.abs())).collect();
    let mut parts = run_split(ranges, |rows| first_pass(base, p, &quantised, rows))?;
    let mut out = Vec::with_capacity(queries.len());
    for (b, query) in queries.iter().enumerate() {
        let mut lows = Lows::new(p.fetch);
        for part in &parts {
            part[b].lows.heap.iter().for_each(|lo| lows.push(lo.0.0));
        }
        let floor = p.tau.max(lows.threshold());
        let mut candidates: Vec<u32> = Vec::new();
        for part in &mut parts {
            let list = std::mem::take(&mut part[b].candidates);
            candidates.extend(list.into_iter().filter(|c| c.1 >= floor).map(|c| c.0));
        }
        candidates.sort_unstable();
        out.push(rerank(base, p, query, &candidates)?);
    }
    Ok(out)
}

fn first_pass(
    base: &Base,
    p: &ScanParams,
    queries: &[QueryInt8],
    rows: Range<u32>,
) -> Result<Vec<FirstPass>, BankError> {
    let nq = queries.len();
    let qstride = base.qstride_bytes.expect("an int8 bank has a side column") as usize;
    debug_assert!(queries.iter().all(|q| q.codes.row_bytes() == qstride));
    let codes: Vec<&kernels::Codes> = queries.iter().map(|q| &q.codes).collect();
    let mut state: Vec<FirstPass> = (0..nq).map(|_| FirstPass::new(p)).collect();
    let mut selected = Selected::new();
    let mut dots = vec![0i32; STEP * nq];
    let (mut approx, mut bound, mut scales) = ([0.0f32; STEP], [0.0f32; STEP], [0.0f32; STEP]);
    for_each_chunk(base, rows, |maps, first, range| {
        let quant: &[u8] = maps.quant.as_ref().expect("an int8 bank maps its side column");
        let table: &[u8] = &maps.table;
        selected.choose(maps, range.clone(), p);
        in_steps(base, maps, Column::Quant, first, &selected, range.end, |at, sums| {
            let rows = Rows {
                bytes: quant,
                stride_bytes: qstride,
                offset_bytes: 0,
                slots: &selected.slots[at.clone()],
            };
            match sums {
                None => kernels::score_i8(p.level, &codes, rows, &mut dots),
                Some(sums) => kernels::score_i8_summed(p.level, &codes, rows, &mut dots, sums),
            }
            // The rows were just read, so their scales are in L1. Bounds
            // first, in a loop without branches; the rare rows that reach
            // a floor then go through `offer`.
            for (scale, &slot) in scales.iter_mut().zip(&selected.slots[at.clone()]) {
                let row = slot as usize * qstride;
                *scale = f32::from_le_bytes(quant[row..row + 4].try_into().expect("4 bytes"));
            }
            for (b, (q, s)) in queries.iter().zip(state.iter_mut()).enumerate() {
                for k in 0..at.len() {
                    approx[k] = q.approx(scales[k], dots[k * nq + b]);
                    bound[k] = q.bound(scales[k]);
                }
                for (k, i) in at.clone().enumerate() {
                    // First with the least penalty the row can have; the
                    // exact one (perhaps a table read) only if that passes.
                    if approx[k] - selected.penalty[i] + bound[k] >= s.floor {
                        let penalised = approx[k] - selected.exact_penalty(i, table, p);
                        s.offer(p, first + selected.slots[i], penalised, bound[k]);
                    }
                }
            }
        })?;
        Ok(())
    })?;
    Ok(state)
}

/// Scores the candidates (sorted by index) exactly, as an f32 bank would.
fn rerank(base: &Base, p: &ScanParams, query: &[f32], candidates: &[u32]) -> Result<TopK, BankError> {
    let dim = base.dim_count as usize;
    let rps = base.rows_per_segment;
    let mut top = TopK::new(p.fetch);
    let mut slots: Vec<u32> = Vec::with_capacity(CHUNK_ROWS);
    let mut scores = [0.0f32; CHUNK_ROWS];
    let mut at = 0;
    while at < candidates.len() {
        let segment = candidates[at] / rps;
        let first = segment * rps;
        let maps = base.segment(segment)?;
        slots.clear();
        while at < candidates.len() && candidates[at] / rps == segment && slots.len() < CHUNK_ROWS {
            slots.push(candidates[at] - first);
            at += 1;
        }
        let rows = Rows {
            bytes: &maps.vectors,
            stride_bytes: base.stride_bytes as usize,
            offset_bytes: 0,
            slots: &slots,
        };
        // The first pass read the int8 rows; the f32 vectors are first read
        // here, so their lane sums are checked here.
        if base.needs_sums(&maps, Column::Vectors) {
            let mut sums = [0u32; CHUNK_ROWS];
            kernels::score_f32_summed(p.level, &[query], dim, rows, &mut scores, &mut sums);
            base.check_sums(&maps, Column::Vectors, first, &slots, &sums[..slots.len()])?;
        } else {
            kernels::score_f32(p.level, &[query], dim, rows, &mut scores);
        }
        for (i, &slot) in slots.iter().enumerate() {
            let score = scores[i] - super::penalty_of(&maps.table, slot as usize, p);
            admit(&mut top, p, first + slot, score, &maps.table, slot as usize);
        }
    }
    Ok(top)
}

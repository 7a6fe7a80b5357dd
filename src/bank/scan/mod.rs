//! The failure-penalised similarity scan, run in place over the mapped
//! vector column and the overlay.
//!
//! One pass scores a block of queries (`Bank::pass_queries`: up to
//! `kernels::MAX_BATCH` in an f32 bank, with the register-blocked kernel,
//! else `kernels::MAX_BLOCK`), so each row is loaded from memory once per
//! block. Rows are taken a chunk at a
//! time: the tree and consolidation filters read the chunk's node-table
//! rows into a list of passing slots and their penalties (no branch per
//! row), a kernel scores the list, and a top-k pass admits the few scores
//! that reach the current threshold. In a segment whose rows all pass the
//! filters (its `Summary`) the node table is not read at all, except for
//! the label of the few rows whose score could make the top-k: one cache
//! line per row cost int8 scans ~18% (f32 ~0-10%) when read for every row.
//! The checkpointed rows may be split across threads, each with its own
//! top-k, merged at the end (the ranking is a total order, so the merge
//! equals the single-thread scan). Int8 banks run an approximate first
//! pass and an exact re-rank (`int8.rs`); f32 and f16 banks score exactly
//! (`exact.rs`).

mod exact;
mod int8;

use std::ops::Range;

use super::base::{Base, Column, SegmentMaps};
use super::kernels::{self, Level, MAX_BLOCK, Rows};
use super::mutate::normalise;
use super::{Bank, BankError};
use crate::format::manifest::Precision;
use crate::format::manifest::{check_eps, check_tau};
use crate::format::row::{
    FLAG_CONSOLIDATED, Label, NodeType, ROW_DEPTH_OFFSET, ROW_FLAGS_OFFSET, ROW_LABEL_OFFSET, ROW_LINK_OFFSET,
    ROW_SIZE_BYTES, ROW_TREE_OFFSET,
};
use crate::format::{get_u16, get_u32};
use crate::tree::{Candidate, TopK};

pub use super::kernels::dot;

#[derive(Debug, Clone, PartialEq)]
pub struct QueryOptions {
    /// How many matches to return.
    pub k: usize,
    /// Overrides the tree's threshold.
    pub tau: Option<f32>,
    /// Overrides the bank's failure penalty.
    pub eps: Option<f32>,
    /// Also match nodes already distilled into a consolidated root.
    pub include_consolidated: bool,
}

/// What of a query's options decides whether it can be scored in one pass
/// with another (`Bank::query_batch` takes one options for all): equal
/// keys, equal options (floats by their bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OptionsKey(usize, Option<u32>, Option<u32>, bool);

impl Default for QueryOptions {
    fn default() -> QueryOptions {
        QueryOptions {
            k: 1,
            tau: None,
            eps: None,
            include_consolidated: false,
        }
    }
}

impl QueryOptions {
    /// Queries with equal keys can share a pass (`OptionsKey`).
    pub fn batch_key(&self) -> OptionsKey {
        OptionsKey(
            self.k,
            self.tau.map(f32::to_bits),
            self.eps.map(f32::to_bits),
            self.include_consolidated,
        )
    }

    /// Checks k (at least 1) and tau and eps against the ranges `init`
    /// enforces (one home: `check_tau`, `check_eps`), so a query cannot
    /// score outside them.
    pub fn validate(&self) -> Result<(), BankError> {
        let bad = BankError::BadQueryOption;
        // A query for no matches is a caller's mistake (an unset count),
        // refused here for every face rather than answered with nothing.
        if self.k == 0 {
            return Err(bad("k must be at least 1".into()));
        }
        self.tau.map_or(Ok(()), check_tau).map_err(bad)?;
        self.eps.map_or(Ok(()), check_eps).map_err(bad)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Match {
    pub id: u32,
    pub score: f32,
    pub depth: u8,
    pub node_type: NodeType,
    pub label: Label,
    /// Root first, ending with `id`.
    pub chain: Vec<u32>,
}

/// A query checked and normalised for `Bank::scan_rows`.
#[derive(Debug, Clone)]
pub struct PreparedQuery {
    tree: u16,
    options: QueryOptions,
    /// The normalised embedding, on a 64-byte boundary.
    aligned: kernels::AlignedQueries,
}

impl PreparedQuery {
    pub fn options(&self) -> &QueryOptions {
        &self.options
    }
}

/// The rows one scan reads: checkpointed ranges (one thread each), a
/// range of overlay indices, and the node count the scan sees.
struct Span {
    base: Vec<Range<u32>>,
    overlay: Range<u32>,
    visible: u32,
}

/// Rows the filters and a kernel call take at a time: small enough that
/// the slot list, penalties and scores stay in L1, large enough that the
/// per-chunk overhead vanishes.
const CHUNK_ROWS: usize = 256;

/// Below this many checkpointed rows per thread, starting a thread costs
/// more than it saves (a thread start is ~20-50 us, 16k rows of dim 768
/// stream in ~2 ms).
const MIN_ROWS_PER_THREAD: u32 = 16_384;

/// Rows scored per kernel call between prefetches of node-table lines
/// (measured: prefetching cut the filter's share of a 100k-row f32 query
/// from ~13% to ~7%).
const PREFETCH_STEP_ROWS: usize = 32;

/// Runs `step` over the selected rows of a chunk, `PREFETCH_STEP_ROWS`
/// positions at a time, and between steps asks for the node-table lines
/// of the next chunk (slots from `next_slot`): its filters then find them
/// in cache instead of waiting on memory, and the requests are spread out
/// instead of a burst. After a chunk that needed no filtering (see
/// `Selected::choose`) nothing is prefetched.
///
/// Rows this process has not checked yet are checked as the step reads
/// them (FORMAT.md "When data-file bytes are checked"): in a format-2 bank
/// the step's kernel also computes each row's lane sum from the loads it
/// scores with (`step` gets a buffer for them), and `Base::check_sums`
/// compares them with the rows' before any score of the step is admitted
/// (an int8 first pass may have offered a candidate, but the error ends
/// the scan); in a format-1 bank the rows' vectors are checked against
/// their CRCs just before the step (`Base::check_vectors`), a few dozen
/// rows, so the kernel then reads them from cache. Once every row of the
/// segment is checked, steps compute no sums.
fn in_steps(
    base: &Base,
    maps: &SegmentMaps,
    column: Column,
    first: u32,
    selected: &Selected,
    next_slot: usize,
    mut step: impl FnMut(Range<usize>, Option<&mut [u32]>),
) -> Result<(), BankError> {
    let table: &[u8] = &maps.table;
    let n = selected.len;
    let parts = n.div_ceil(PREFETCH_STEP_ROWS).max(1);
    let mut sums = [0u32; PREFETCH_STEP_ROWS];
    for j in 0..parts {
        let at = j * PREFETCH_STEP_ROWS..((j + 1) * PREFETCH_STEP_ROWS).min(n);
        let slots = &selected.slots[at.clone()];
        if base.needs_sums(maps, column) {
            step(at.clone(), Some(&mut sums[..slots.len()]));
            base.check_sums(maps, column, first, slots, &sums[..slots.len()])?;
        } else {
            base.check_vectors(maps, first, slots)?;
            step(at, None);
        }
        if selected.lazy {
            continue; // a chunk without filters: so is the next, in the same segment
        }
        for slot in next_slot + j * CHUNK_ROWS / parts..next_slot + (j + 1) * CHUNK_ROWS / parts {
            kernels::prefetch(table, slot * ROW_SIZE_BYTES);
        }
    }
    Ok(())
}

/// What every row of one scan is judged by.
pub(super) struct ScanParams {
    tree: u16,
    tau: f32,
    eps: f32,
    include_consolidated: bool,
    visible_count: u32,
    /// Matches to collect: k plus the rows consolidated since the
    /// checkpoint, which the mapping still shows unconsolidated.
    fetch: usize,
    level: Level,
}

/// The rows of one chunk that pass the filters, with their penalties.
pub(super) struct Selected {
    slots: [u32; CHUNK_ROWS],
    /// Each row's penalty or, when `lazy`, a lower bound of it.
    penalty: [f32; CHUNK_ROWS],
    len: usize,
    /// The node table was not read (every row passes the filters); a row's
    /// penalty is looked up by `exact_penalty` when it could make the top-k.
    lazy: bool,
}

impl Selected {
    fn new() -> Selected {
        Selected {
            slots: [0; CHUNK_ROWS],
            penalty: [0.0; CHUNK_ROWS],
            len: 0,
            lazy: false,
        }
    }

    /// Selects the rows of `range` (slots of one segment) that the scan
    /// scores. A segment whose rows all belong to the tree and none of
    /// them consolidated (its `Summary`) passes whole without reading the
    /// node table; otherwise each row is filtered.
    fn choose(&mut self, maps: &SegmentMaps, range: Range<usize>, p: &ScanParams) {
        let summary = maps.summary;
        let all_pass = if p.include_consolidated {
            summary.single_tree
        } else {
            summary.plain_tree
        };
        if all_pass == Some(p.tree) {
            for (n, slot) in range.clone().enumerate() {
                self.slots[n] = slot as u32;
            }
            self.penalty[..range.len()].fill(p.eps.min(0.0));
            self.len = range.len();
            self.lazy = true;
        } else {
            self.select(&maps.table, range, p);
        }
    }

    /// Fills the list with the slots of `range` (within one segment's
    /// node table) that belong to the tree and are not consolidated.
    /// Every slot is written and the length advanced by the verdict, so
    /// there is no branch on the (unpredictable) filter outcome.
    fn select(&mut self, table: &[u8], range: Range<usize>, p: &ScanParams) {
        debug_assert!(range.len() <= CHUNK_ROWS);
        self.lazy = false;
        let mut n = 0;
        for slot in range {
            let row = &table[slot * ROW_SIZE_BYTES..slot * ROW_SIZE_BYTES + 32];
            let hidden = !p.include_consolidated
                & (row[ROW_FLAGS_OFFSET] & FLAG_CONSOLIDATED != 0)
                & super::consolidation_in_force(get_u32(row, ROW_LINK_OFFSET), p.visible_count);
            let keep = (get_u16(row, ROW_TREE_OFFSET) == p.tree) & !hidden;
            self.slots[n] = slot as u32;
            self.penalty[n] = penalty_of(table, slot, p);
            n += usize::from(keep);
        }
        self.len = n;
    }

    /// The penalty of list position `i`: known, or read from the table now.
    #[inline]
    fn exact_penalty(&self, i: usize, table: &[u8], p: &ScanParams) -> f32 {
        if self.lazy {
            penalty_of(table, self.slots[i] as usize, p)
        } else {
            self.penalty[i]
        }
    }
}

/// The failure penalty of the row in `slot`: eps for a FAILURE, else 0.
#[inline]
fn penalty_of(table: &[u8], slot: usize, p: &ScanParams) -> f32 {
    crate::tree::failure_penalty(
        table[slot * ROW_SIZE_BYTES + ROW_LABEL_OFFSET] == Label::Failure as u8,
        p.eps,
    )
}

/// Calls `f(maps, first_index_of_segment, slot_range)` for every chunk of
/// the checkpointed rows `rows`, in order.
fn for_each_chunk(
    base: &Base,
    rows: Range<u32>,
    mut f: impl FnMut(&SegmentMaps, u32, Range<usize>) -> Result<(), BankError>,
) -> Result<(), BankError> {
    let rps = base.rows_per_segment;
    let mut at = rows.start;
    while at < rows.end {
        let segment = at / rps;
        let first = segment * rps;
        let end = rows.end.min(first + rps);
        let maps = base.segment(segment)?;
        let mut slot = (at - first) as usize;
        while slot < (end - first) as usize {
            let stop = (slot + CHUNK_ROWS).min((end - first) as usize);
            f(&maps, first, slot..stop)?;
            slot = stop;
        }
        at = end;
    }
    Ok(())
}

/// Splits `0..count` into up to `threads` contiguous ranges.
fn split_rows(count: u32, threads: usize) -> Vec<Range<u32>> {
    let by_size = (count / MIN_ROWS_PER_THREAD).max(1) as usize;
    let parts = threads.clamp(1, by_size) as u32;
    let per = count.div_ceil(parts).next_multiple_of(CHUNK_ROWS as u32).max(1);
    (0..parts)
        .map(|i| (i * per).min(count)..((i + 1) * per).min(count))
        .filter(|r| !r.is_empty())
        .collect()
}

/// Runs `work` on each range, the first on the calling thread and the
/// others on scoped threads; results in range order.
fn run_split<T: Send>(
    ranges: &[Range<u32>],
    work: impl Fn(Range<u32>) -> Result<T, BankError> + Sync,
) -> Result<Vec<T>, BankError> {
    let Some((first, rest)) = ranges.split_first() else {
        return Ok(Vec::new());
    };
    let work = &work;
    std::thread::scope(|s| {
        let handles: Vec<_> = rest.iter().map(|r| s.spawn(move || work(r.clone()))).collect();
        let mut out = vec![work(first.clone())];
        for h in handles {
            out.push(h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)));
        }
        out.into_iter().collect()
    })
}

/// Runs `scan` over the checkpointed rows `ranges` while, if a CPU is
/// free for it, one more thread checks ahead of the scan the node tables
/// it has not checked yet and maps in the cached pages of the column it
/// reads (`Base::prepare_ahead`). A process's first scan otherwise stops
/// at every segment to check its table (a CRC per row), ~15% of a first
/// query over a large bank, and takes a page fault per 64 KiB of the
/// column (a fresh-process query over 1M x 768 f32 in the page cache:
/// 0.22-0.24 s without the mapping ahead, 0.14-0.16 s with it); in
/// parallel, the scanning threads find both done when they reach them.
/// Nothing is skipped: each table is still checked once before the scan
/// reads it, and a failing one is reported by the scan, in the order it
/// meets it.
fn with_tables_ahead<T>(base: &Base, ranges: &[Range<u32>], scan: impl FnOnce() -> T) -> T {
    // No CPU left for a checking thread: every one already scans.
    if base.all_prepared() || ranges.len() >= std::thread::available_parallelism().map_or(1, |n| n.get()) {
        return scan();
    }
    let order = segments_ahead(base, ranges);
    // Fewer rows than a scan thread's minimum: checking them takes less
    // than starting the thread.
    if (order.len() as u64) * u64::from(base.rows_per_segment) < u64::from(MIN_ROWS_PER_THREAD) {
        return scan();
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| base.prepare_ahead(&order, &stop));
        let out = scan();
        // On an early error the helper must not keep the caller waiting.
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        out
    })
}

/// The segments of `ranges` not yet prepared, in the order the scanning
/// threads reach them (each range's segments interleaved), without the
/// first segment of each range: its thread takes that one at once.
fn segments_ahead(base: &Base, ranges: &[Range<u32>]) -> Vec<u32> {
    let rps = base.rows_per_segment;
    let lists: Vec<Range<u32>> = ranges.iter().map(|r| r.start / rps + 1..r.end.div_ceil(rps)).collect();
    let longest = lists.iter().map(|l| l.len()).max().unwrap_or(0) as u32;
    let mut order = Vec::new();
    for step in 0..longest {
        for list in &lists {
            let segment = list.start + step;
            if list.contains(&segment) && !base.is_prepared(segment) {
                order.push(segment);
            }
        }
    }
    order
}

impl Bank {
    /// Top-k failure-penalised matches at or above tau, each with its chain.
    pub fn query(&self, tree_name: &str, embedding: &[f32], options: &QueryOptions) -> Result<Vec<Match>, BankError> {
        let mut all = self.query_block(tree_name, &[embedding], options)?;
        Ok(all.pop().expect("one answer per query"))
    }

    /// `query` for many embeddings with the same options: each pass over
    /// the column scores a block of them (`pass_queries`), so a batch
    /// reads the column once per block instead of once per query. The
    /// answers equal one `query` per embedding.
    pub fn query_batch<E: AsRef<[f32]>>(
        &self,
        tree_name: &str,
        embeddings: &[E],
        options: &QueryOptions,
    ) -> Result<Vec<Vec<Match>>, BankError> {
        let mut out = Vec::with_capacity(embeddings.len());
        for block in embeddings.chunks(self.pass_queries()) {
            let refs: Vec<&[f32]> = block.iter().map(|e| e.as_ref()).collect();
            out.extend(self.query_block(tree_name, &refs, options)?);
        }
        Ok(out)
    }

    /// The most queries one pass scores: an f32 bank's exact scan runs the
    /// register-blocked kernel (`kernels::MAX_BATCH`); the f16 and int8
    /// kernels score `MAX_BLOCK` at a time.
    pub fn pass_queries(&self) -> usize {
        match self.base.precision {
            Precision::F32 => kernels::MAX_BATCH,
            Precision::F16 | Precision::Int8 => MAX_BLOCK,
        }
    }

    fn query_block(
        &self,
        tree_name: &str,
        embeddings: &[&[f32]],
        options: &QueryOptions,
    ) -> Result<Vec<Vec<Match>>, BankError> {
        let tree = self.tree_index(tree_name)?;
        let mut queries = Vec::with_capacity(embeddings.len());
        for e in embeddings {
            queries.push(normalise(e, self.manifest.dim_count)?);
        }
        options.validate()?;
        // One copy per pass, on 64-byte boundaries: the kernels' query
        // loads then never straddle a cache line (`AlignedQueries`).
        let aligned = kernels::AlignedQueries::new(&queries, self.manifest.dim_count as usize);
        let refs = aligned.refs();
        let mut out = Vec::with_capacity(queries.len());
        for ranked in self.scan_block(tree, &refs, options)? {
            out.push(self.matches(&ranked)?);
        }
        Ok(out)
    }

    /// The matches, with their chains, of ranked candidates (from
    /// `scan_rows`, merged).
    pub fn matches(&self, ranked: &[Candidate]) -> Result<Vec<Match>, BankError> {
        let mut matches = Vec::with_capacity(ranked.len());
        for c in ranked {
            let row = self.row(c.index)?;
            matches.push(Match {
                id: c.index,
                score: c.score,
                depth: c.depth,
                node_type: row.node_type,
                label: row.label,
                chain: self.chain(c.index)?,
            });
        }
        Ok(matches)
    }

    /// Checks and normalises a query for `scan_rows`.
    pub fn prepare_query(
        &self,
        tree_name: &str,
        embedding: &[f32],
        options: &QueryOptions,
    ) -> Result<PreparedQuery, BankError> {
        let tree = self.tree_index(tree_name)?;
        let query = normalise(embedding, self.manifest.dim_count)?;
        options.validate()?;
        Ok(PreparedQuery {
            tree,
            options: options.clone(),
            aligned: kernels::AlignedQueries::new(&[query], self.manifest.dim_count as usize),
        })
    }

    /// A scan taken a row range at a time (the server's circular scan):
    /// for each query, its best `k` candidates among the rows `rows`, on
    /// the calling thread, as `query` would rank them with the bank as it
    /// is now, seen by a handle that holds only the first `visible` nodes
    /// (rows at or past it are not scanned, and a consolidation into a
    /// root at or past it is not in force). Merging (`TopK`) the lists of
    /// ranges that cover `0..visible` once each, made with no write in
    /// between, and keeping the best `k`, gives the answer of `query`
    /// (the ranking is a total order); with writes in between, each range
    /// shows the bank as it was when scanned. Row indices never change
    /// (a checkpoint moves rows from the overlay into the column under
    /// the same index; compact rewrites every row at its index), so a
    /// candidate stays the same node. Every query must have the same tree
    /// and options.
    pub fn scan_rows(
        &self,
        queries: &[&PreparedQuery],
        rows: Range<u32>,
        visible: u32,
    ) -> Result<Vec<Vec<Candidate>>, BankError> {
        let Some(first) = queries.first() else {
            return Ok(Vec::new());
        };
        assert!(
            queries
                .iter()
                .all(|q| q.tree == first.tree && q.options == first.options),
            "one scan_rows call scores queries of one tree and options"
        );
        let visible = visible.min(self.node_count());
        let start = rows.start.min(visible);
        let rows = start..rows.end.clamp(start, visible);
        let split = self.base.node_count.clamp(rows.start, rows.end);
        let mut out = Vec::with_capacity(queries.len());
        for block in queries.chunks(self.pass_queries()) {
            let refs: Vec<&[f32]> = block.iter().map(|q| q.aligned.refs()[0]).collect();
            let span = Span {
                base: std::iter::once(rows.start..split).collect(),
                overlay: split..rows.end,
                visible,
            };
            out.extend(self.scan_span(first.tree, &refs, &first.options, &span)?);
        }
        Ok(out)
    }

    /// The ranked candidates of one tree for a normalised query.
    pub(crate) fn scan_tree(
        &self,
        tree: u16,
        query: &[f32],
        options: &QueryOptions,
    ) -> Result<Vec<Candidate>, BankError> {
        Ok(self
            .scan_block(tree, &[query], options)?
            .pop()
            .expect("one answer per query"))
    }

    /// The ranked candidates of one tree for each of up to `pass_queries`
    /// normalised queries, in one pass over the column, the checkpointed
    /// rows split across the query threads.
    fn scan_block(
        &self,
        tree: u16,
        queries: &[&[f32]],
        options: &QueryOptions,
    ) -> Result<Vec<Vec<Candidate>>, BankError> {
        let span = Span {
            base: split_rows(self.base.node_count, self.query_threads),
            overlay: self.base.node_count..self.node_count(),
            visible: self.node_count(),
        };
        let ranges = span.base.clone();
        with_tables_ahead(&self.base, &ranges, || self.scan_span(tree, queries, options, &span))
    }

    /// The ranked candidates of `span` for up to `pass_queries` normalised
    /// queries.
    fn scan_span(
        &self,
        tree: u16,
        queries: &[&[f32]],
        options: &QueryOptions,
        span: &Span,
    ) -> Result<Vec<Vec<Candidate>>, BankError> {
        // Checkpointed rows consolidated since the checkpoint still carry
        // the old flag in the mapping. Flags only ever get set, so asking
        // for that many extra candidates and dropping them afterwards gives
        // exactly the top-k of the current state.
        let hidden: Vec<u32> = if options.include_consolidated {
            Vec::new()
        } else {
            self.overlay
                .patched
                .values()
                .filter(|r| r.is_consolidated() && super::consolidation_in_force(r.link, span.visible))
                .map(|r| r.index)
                .collect()
        };
        let params = ScanParams {
            tree,
            tau: options.tau.unwrap_or(self.manifest.trees[usize::from(tree)].tau),
            eps: options.eps.unwrap_or(self.manifest.eps),
            include_consolidated: options.include_consolidated,
            visible_count: span.visible,
            fetch: options.k.saturating_add(hidden.len()),
            level: Level::active(),
        };
        let ranges: Vec<Range<u32>> = span.base.iter().filter(|r| !r.is_empty()).cloned().collect();
        let mut tops = match self.base.precision {
            Precision::Int8 => int8::scan_base(&self.base, &params, queries, &ranges)?,
            Precision::F32 | Precision::F16 => exact::scan_base(&self.base, &params, queries, &ranges)?,
        };
        self.scan_overlay(queries, &params, span.overlay.clone(), &mut tops);
        let mut out = Vec::with_capacity(tops.len());
        for top in tops {
            let mut ranked: Vec<Candidate> = top
                .into_sorted()
                .into_iter()
                .filter(|c| !hidden.contains(&c.index))
                .collect();
            ranked.truncate(options.k);
            out.push(ranked);
        }
        Ok(out)
    }

    /// The overlay's new nodes with indices in `indices`, scored exactly
    /// in f32 (in an f16 bank their vectors already hold f16 values, so
    /// they score as after a checkpoint).
    fn scan_overlay(&self, queries: &[&[f32]], p: &ScanParams, indices: Range<u32>, tops: &mut [TopK]) {
        let dim = self.manifest.dim_count as usize;
        let from = indices.start.saturating_sub(self.overlay.base_count) as usize;
        let to = (indices.end.saturating_sub(self.overlay.base_count) as usize).min(self.overlay.rows.len());
        assert!(
            self.overlay.handoff.is_none(),
            "no scan while a load hands its vectors off"
        );
        let mut slots = Vec::with_capacity(CHUNK_ROWS);
        let mut scores = vec![0.0f32; CHUNK_ROWS * queries.len()];
        for chunk_at in (from..to).step_by(CHUNK_ROWS) {
            slots.clear();
            for (i, row) in self.overlay.rows[chunk_at..to.min(chunk_at + CHUNK_ROWS)]
                .iter()
                .enumerate()
            {
                let hidden = row.is_consolidated() && super::consolidation_in_force(row.link, p.visible_count);
                if row.tree == p.tree && (p.include_consolidated || !hidden) {
                    slots.push((chunk_at + i) as u32);
                }
            }
            let rows = Rows {
                bytes: bytemuck::cast_slice(&self.overlay.vectors),
                stride_bytes: dim * 4,
                offset_bytes: 0,
                slots: &slots,
            };
            kernels::score_f32_batch(p.level, queries, dim, rows, &mut scores);
            for (i, &slot) in slots.iter().enumerate() {
                let row = &self.overlay.rows[slot as usize];
                for (b, top) in tops.iter_mut().enumerate() {
                    let score = crate::tree::penalised_score(scores[i * queries.len() + b], row.label, p.eps);
                    if score >= p.tau && top.admits(score) {
                        top.push(Candidate {
                            index: row.index,
                            score,
                            depth: row.depth,
                        });
                    }
                }
            }
        }
    }
}

/// Admits one exact, penalised score into a query's top-k.
#[inline]
fn admit(top: &mut TopK, p: &ScanParams, index: u32, score: f32, table: &[u8], slot: usize) {
    if score >= p.tau && top.admits(score) {
        top.push(Candidate {
            index,
            score,
            depth: table[slot * ROW_SIZE_BYTES + ROW_DEPTH_OFFSET],
        });
    }
}

/// Admits list position `i` of a chunk with dot product `dot`. The check
/// against the threshold runs first with the least penalty the row can
/// have: the exact penalty (perhaps a table read) is needed only if that
/// passes, and a row that fails it would fail with its exact penalty too
/// (the threshold test is monotone), so the top-k is the same.
#[inline]
fn admit_at(top: &mut TopK, p: &ScanParams, selected: &Selected, i: usize, dot: f32, first: u32, table: &[u8]) {
    let optimistic = dot - selected.penalty[i];
    if optimistic >= p.tau && top.admits(optimistic) {
        let slot = selected.slots[i];
        let score = dot - selected.exact_penalty(i, table, p);
        admit(top, p, first + slot, score, table, slot as usize);
    }
}

/// Merges per-thread top-k lists of each query (exact: the ranking is a
/// total order, so the best `fetch` of the union are the best overall).
fn merge_tops(parts: Vec<Vec<TopK>>, queries: usize, fetch: usize) -> Vec<TopK> {
    let mut out: Vec<TopK> = (0..queries).map(|_| TopK::new(fetch)).collect();
    for part in parts {
        for (top, part) in out.iter_mut().zip(part) {
            part.into_sorted().into_iter().for_each(|c| top.push(c));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_rows_covers_every_row_once_in_chunk_aligned_ranges() {
        for count in [0u32, 1, 255, 16_384, 32_768, 40_000, 67_500, 1_000_000] {
            for threads in [0, 1, 2, 3, 4, 16] {
                let ranges = split_rows(count, threads);
                assert!(ranges.len() <= threads.max(1), "{count} {threads}: {ranges:?}");
                assert!(ranges.len() <= (count / MIN_ROWS_PER_THREAD).max(1) as usize);
                let mut at = 0;
                for r in &ranges {
                    assert_eq!(r.start, at);
                    assert_eq!(r.start % CHUNK_ROWS as u32, 0);
                    at = r.end;
                }
                assert_eq!(at, count, "{count} {threads}: {ranges:?}");
            }
        }
        assert_eq!(split_rows(67_500, 4).len(), 4);
    }

    #[test]
    fn tables_ahead_are_taken_in_the_order_the_scan_threads_reach_them() {
        let mut manifest = crate::format::manifest::tests::sample();
        manifest.rows_per_segment = 1_024;
        manifest.node_count = 10 * 1_024 - 5;
        let base = Base::new(std::sync::Arc::new(crate::storage::MemStorage::new()), &manifest);
        assert_eq!(
            segments_ahead(&base, std::slice::from_ref(&(0..10 * 1_024 - 5))),
            [1, 2, 3, 4, 5, 6, 7, 8, 9]
        );
        // Two threads: each starts on its own first segment (0 and 5).
        assert_eq!(
            segments_ahead(&base, &[0..5 * 1_024, 5 * 1_024..10 * 1_024 - 5]),
            [1, 6, 2, 7, 3, 8, 4, 9]
        );
        assert_eq!(
            segments_ahead(&base, &[0..3 * 1_024, 3 * 1_024..10 * 1_024 - 5]),
            [1, 4, 2, 5, 6, 7, 8, 9]
        );
        assert!(segments_ahead(&base, std::slice::from_ref(&(0..1_000))).is_empty());
    }
}

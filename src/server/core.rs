//! The one bank a server process owns, shared by every request.
//!
//! Writes go to one writer thread through a queue; it applies them in
//! rounds under the exclusive lock without an fsync, then makes them
//! durable with one fsync outside the lock and answers them (`commit`):
//! concurrent durable writes share an fsync (group commit) and queries
//! never wait for the disk. Queries on a
//! tree go through a per-tree queue (`batcher`): while one pass is being
//! scored the next one gathers, and each is scored in one pass over the
//! column (`Bank::query_batch`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, LockResult, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use tokio::sync::{oneshot, watch};

use super::batcher::{Answer, Batcher, QueryJob, Role, Step};
use super::body::{ConsolidateReply, HitReply, InsertReply, QueryReply};
use super::commit::{Unsynced, checkpoint_beside_queries, writer_loop};
use super::error::{ApiError, ApiResult};
use super::metrics::Metrics;
use super::rotation::Claim;
use super::tree_index::TreeIndex;
use crate::bank::{
    Bank, BankError, ErrorKind, NewNode, NodeRef, OpenOptions, OptionsKey, PreparedQuery, QueryOptions, SyncPolicy,
    VerifyReport,
};
use crate::tree::{Candidate, TopK};

/// Writes waiting for the writer thread; a full queue answers 503.
const WRITE_QUEUE_LEN: usize = 4096;

pub enum WriteOp {
    Insert(NewNode),
    /// All or nothing, one WAL record.
    Batch(Vec<NewNode>),
    Hit(NodeRef),
    Retrievals(Vec<NodeRef>),
    Consolidate(NodeRef, BTreeMap<String, String>),
    /// A recorded episode's changes, all or nothing (`/v1/record`).
    #[cfg(feature = "agent")]
    Transact(Vec<crate::bank::Change>),
}

pub enum WriteDone {
    Inserted(Vec<InsertReply>),
    Hit(HitReply),
    Retrievals(u32),
    Consolidated(ConsolidateReply),
    #[cfg(feature = "agent")]
    Transacted(Vec<crate::bank::ChangeAck>),
}

pub(super) struct WriteJob {
    pub op: WriteOp,
    pub reply: oneshot::Sender<ApiResult<WriteDone>>,
}

/// What `/v1/events` announces after each commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChangeEvent {
    pub node_count: u32,
    pub last_lsn: u64,
}

/// State the writer thread shares with the request handlers.
pub(super) struct Shared {
    pub bank: RwLock<Bank>,
    pub metrics: Arc<Metrics>,
    pub changes: watch::Sender<ChangeEvent>,
    /// The policy acknowledgements honour (`None`: ack before any fsync).
    pub policy: SyncPolicy,
    pub unsynced: Unsynced,
    /// A read-only server: its writer thread refreshes the bank's view
    /// instead of applying writes (`commit::refresh_reader`).
    pub read_only: bool,
    /// Takers of the exclusive lock waiting for it (`write_bank`).
    writers_waiting: AtomicU32,
    /// Held by a checkpoint, and by a verify while it reads its own view
    /// of the bank with no lock (`Core::verify_until`): a checkpoint
    /// rewrites rows in place in the files the view reads, and the view
    /// would see rows newer than itself (a consolidation link to a node it
    /// does not hold, reported as damage). The writer thread skips a due
    /// checkpoint while a verify holds it and tries again after its next
    /// round; at shutdown it waits.
    pub checkpoints: Mutex<()>,
}

impl Shared {
    /// The bank's exclusive lock, announced to scans that read in holds
    /// (`Core::read_hold`). std's lock goes to whoever asks first once it
    /// is released, and a scan that releases and asks again at once wins
    /// that race against the writer it just woke nearly every time: a
    /// 64-query batch read in 10 ms holds kept every insert waiting for
    /// the whole batch (~100 ms).
    pub fn write_bank(&self) -> LockResult<RwLockWriteGuard<'_, Bank>> {
        self.writers_waiting.fetch_add(1, Ordering::SeqCst);
        let guard = self.bank.write();
        self.writers_waiting.fetch_sub(1, Ordering::SeqCst);
        guard
    }
}

/// The longest a scan's next hold defers to waiting writers: a writer can
/// itself be waiting behind a long read (`/v1/stats`), and the scan must
/// go on meanwhile.
const HANDOFF_WAIT: Duration = Duration::from_millis(50);

pub struct Core {
    shared: Arc<Shared>,
    writes: Mutex<Option<SyncSender<WriteJob>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    queries: Batcher,
    /// Threads a query may use: the bank's scan split, and the workers of
    /// a circular scan.
    threads: usize,
    read_only: bool,
    /// Each tree's nodes and each node's children, for listings.
    tree_index: Mutex<TreeIndex>,
    /// The bank's dimension, fixed at its creation: request checks read it
    /// here rather than wait for the bank's lock while a round is applied.
    dim: u32,
}

impl Core {
    /// Opens the bank as its writer (or read-only) and starts the writer
    /// thread.
    /// `options` says whether to open read-only and when to checkpoint.
    /// `lock_wait` bounds the wait for another process's writer lock;
    /// `waiting` is called if that wait begins.
    pub fn open(
        path: &Path,
        policy: SyncPolicy,
        options: OpenOptions,
        threads: usize,
        lock_wait: std::time::Duration,
        waiting: impl FnOnce(),
    ) -> Result<Arc<Core>, BankError> {
        let options = OpenOptions {
            // The writer thread syncs itself, once per round.
            sync: SyncPolicy::None,
            ..options
        };
        let bank = Bank::open_dir_noting_wait(path, options, lock_wait, waiting)?;
        Core::serve(bank, policy, threads)
    }

    /// Serves an open bank (a writer opened with `SyncPolicy::None`, or a
    /// reader): starts the writer thread, which from then on also runs the
    /// bank's checkpoints (`commit::checkpoint_beside_queries`).
    pub fn serve(bank: Bank, policy: SyncPolicy, threads: usize) -> Result<Arc<Core>, BankError> {
        Core::serve_with(bank, policy, threads, Batcher::default())
    }

    fn serve_with(
        mut bank: Bank,
        policy: SyncPolicy,
        threads: usize,
        queries: Batcher,
    ) -> Result<Arc<Core>, BankError> {
        let read_only = bank.sync_policy().is_none();
        let dim = bank.dim_count();
        bank.set_query_threads(threads);
        bank.defer_checkpoints();
        // The writer thread applies no write while it checkpoints: most of
        // a checkpoint's work is done beforehand by the bank's own thread.
        bank.write_vectors_ahead();
        // Each checkpoint's new WAL reuses the old one's durable blocks:
        // no commit's fdatasync then writes zeros ahead of its records.
        bank.recycle_wals(true);
        let (changes, _) = watch::channel(ChangeEvent {
            node_count: bank.node_count(),
            last_lsn: bank.durable_below_lsn().saturating_sub(1),
        });
        let shared = Arc::new(Shared {
            bank: RwLock::new(bank),
            metrics: Arc::new(Metrics::default()),
            changes,
            policy,
            unsynced: Unsynced::default(),
            read_only,
            writers_waiting: AtomicU32::new(0),
            checkpoints: Mutex::new(()),
        });
        let (tx, rx) = sync_channel(WRITE_QUEUE_LEN);
        let for_thread = shared.clone();
        let writer = std::thread::Builder::new()
            .name("deltamem-writer".into())
            .spawn(move || writer_loop(&for_thread, &rx))
            .map_err(|e| BankError::BadConfig(format!("cannot start the writer thread: {e}")))?;
        Ok(Arc::new(Core {
            shared,
            writes: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
            queries,
            threads: threads.max(1),
            read_only,
            tree_index: Mutex::new(TreeIndex::default()),
            dim,
        }))
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    /// The bank's dimension (without its lock).
    pub fn dim_count(&self) -> u32 {
        self.dim
    }

    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// Refuses with 405 when the server was started read-only: writers
    /// ask before doing costly work (an LLM call) as well as at submit.
    pub fn writable(&self) -> ApiResult<()> {
        if self.read_only {
            return Err(ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "the server was started read-only",
            ));
        }
        Ok(())
    }

    pub fn changes(&self) -> watch::Receiver<ChangeEvent> {
        self.shared.changes.subscribe()
    }

    /// Threads a scan may use.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The bank for reading; waits only for a write being applied (never
    /// for an fsync).
    pub fn read(&self) -> ApiResult<RwLockReadGuard<'_, Bank>> {
        self.shared.bank.read().map_err(|_| poisoned_lock())
    }

    /// Each tree's nodes and each node's children, caught up with `bank`
    /// (this core's bank, read-locked by the caller). Errors name `field`.
    pub fn tree_index(&self, bank: &Bank, field: &str) -> ApiResult<std::sync::MutexGuard<'_, TreeIndex>> {
        let mut index = self.tree_index.lock().unwrap_or_else(|poisoned| {
            // A panic part-way through a catch-up may have left a row half
            // added: start over.
            let mut index = poisoned.into_inner();
            *index = TreeIndex::default();
            self.tree_index.clear_poison();
            index
        });
        index.catch_up(bank).map_err(|e| ApiError::from_bank(e, field))?;
        Ok(index)
    }

    /// The shared lock for the next hold of a scan read in holds (a batch
    /// query, the circular scan, a search, a dump): a write waiting for the
    /// exclusive lock goes first (`Shared::write_bank`), for at most
    /// `HANDOFF_WAIT`.
    pub fn read_hold(&self) -> ApiResult<RwLockReadGuard<'_, Bank>> {
        let started = Instant::now();
        while self.shared.writers_waiting.load(Ordering::SeqCst) > 0 && started.elapsed() < HANDOFF_WAIT {
            std::thread::sleep(Duration::from_micros(20));
        }
        self.read()
    }

    /// Queues a write; the answer comes once it is durable (per policy).
    pub fn submit(&self, op: WriteOp) -> ApiResult<oneshot::Receiver<ApiResult<WriteDone>>> {
        self.writable()?;
        let (reply, rx) = oneshot::channel();
        let guard = self.writes.lock().map_err(|_| poisoned_lock())?;
        let Some(tx) = guard.as_ref() else {
            return Err(ApiError::unavailable("the server is shutting down"));
        };
        match tx.try_send(WriteJob { op, reply }) {
            Ok(()) => Ok(rx),
            Err(TrySendError::Full(_)) => Err(ApiError::unavailable("too many writes queued; retry later")),
            Err(TrySendError::Disconnected(_)) => Err(ApiError::unavailable("the writer has stopped")),
        }
    }

    pub async fn write(&self, op: WriteOp) -> ApiResult<WriteDone> {
        let rx = self.submit(op)?;
        rx.await
            .map_err(|_| ApiError::unavailable("the writer stopped before answering"))?
    }

    /// `write` for callers outside the async runtime (MCP over stdio).
    pub fn write_blocking(&self, op: WriteOp) -> ApiResult<WriteDone> {
        let rx = self.submit(op)?;
        rx.blocking_recv()
            .map_err(|_| ApiError::unavailable("the writer stopped before answering"))?
    }

    /// One query, scored together with whatever other queries on the same
    /// tree are waiting or being scored (`batcher`). The embedding must
    /// have been checked (`check_embedding`).
    pub async fn query(
        self: &Arc<Self>,
        tree: &str,
        embedding: Vec<f32>,
        options: QueryOptions,
    ) -> ApiResult<QueryReply> {
        self.read()?
            .tree_index(tree)
            .map_err(|e| ApiError::from_bank(e, "tree"))?;
        let (reply, rx) = oneshot::channel();
        let job = QueryJob {
            embedding,
            options,
            reply,
        };
        match self.queries.enqueue(tree, job, self.threads) {
            Role::Lead => blocking_here(|| self.lead(tree)),
            Role::Spawn => self.spawn_workers(tree, 1),
            Role::Wait => {}
        }
        rx.await
            .map_err(|_| ApiError::unavailable("the query runner stopped"))?
    }

    /// Runs one pass on the calling thread with every query waiting (its
    /// own among them), then starts the circular scan for those that
    /// arrived meanwhile.
    fn lead(self: &Arc<Self>, tree: &str) {
        let jobs = self.queries.take_waiting(tree);
        self.pass(tree, jobs);
        let workers = self.queries.end_lead(tree, self.threads);
        self.spawn_workers(tree, workers);
    }

    fn spawn_workers(self: &Arc<Self>, tree: &str, count: usize) {
        for _ in 0..count {
            let core = self.clone();
            let tree = tree.to_string();
            tokio::task::spawn_blocking(move || core.run_rotation(&tree));
        }
    }

    /// Scores `jobs` (grouped by options, one pass per group) and answers
    /// them.
    fn pass(&self, tree: &str, jobs: Vec<QueryJob>) {
        self.shared.metrics.query_batch(jobs.len());
        let mut groups: BTreeMap<OptionsKey, Vec<QueryJob>> = BTreeMap::new();
        for job in jobs {
            groups.entry(job.options.batch_key()).or_default().push(job);
        }
        for (_, group) in groups {
            self.answer_group(tree, group);
        }
    }

    fn answer_group(&self, tree: &str, group: Vec<QueryJob>) {
        if group.is_empty() {
            return;
        }
        let bank = match self.read() {
            Ok(bank) => bank,
            Err(e) => return group.into_iter().for_each(|j| drop(j.reply.send(Err(e.clone())))),
        };
        let options = group[0].options.clone();
        let embeddings: Vec<&[f32]> = group.iter().map(|j| j.embedding.as_slice()).collect();
        match bank.query_batch(tree, &embeddings, &options) {
            Ok(answers) => {
                for (job, matches) in group.into_iter().zip(answers) {
                    let _ = job.reply.send(answer(&bank, matches));
                }
            }
            // One bad query must not fail the others: answer each alone.
            Err(_) => {
                for job in group {
                    let result = bank
                        .query(tree, &job.embedding, &job.options)
                        .map_err(|e| ApiError::from_bank(e, "embedding"))
                        .and_then(|m| answer(&bank, m));
                    let _ = job.reply.send(result);
                }
            }
        }
    }

    /// A circular-scan worker (`batcher`, `rotation`): until nothing is
    /// left to claim, takes the queries that arrived, claims the next
    /// chunk, scores it and answers the queries it completes. The bank's
    /// read lock is held for one chunk at a time, so writes go in between.
    fn run_rotation(&self, tree: &str) {
        while self.rotation_step(tree) {}
    }

    /// One chunk of a circular-scan worker; false once the worker ends.
    fn rotation_step(&self, tree: &str) -> bool {
        let bank = match self.read_hold() {
            Ok(bank) => bank,
            Err(e) => {
                self.fail_rotation(tree, &e);
                return false;
            }
        };
        let joining = self.prepare(&bank, tree, self.queries.take_waiting(tree));
        let claim = match self.queries.join_and_claim(tree, joining, bank.node_count()) {
            Step::Scan(claim) => claim,
            Step::Again => return true,
            Step::Stop => return false,
        };
        if claim.chunk == 0 {
            self.shared.metrics.query_pass();
        }
        let scored = score_claim(&bank, &claim);
        let finished = self.queries.complete(tree, &claim, |i, answer| match &scored[i] {
            Ok(ranked) => ranked.iter().for_each(|c| answer.top.push(*c)),
            Err(e) => answer.error = Some(e.clone()),
        });
        self.shared.metrics.queries_scored(finished.len());
        for done in finished {
            let result = match done.error {
                Some(e) => Err(e),
                None => bank
                    .matches(&done.top.into_sorted())
                    .map_err(|e| ApiError::from_bank(e, "embedding"))
                    .and_then(|m| answer(&bank, m)),
            };
            let _ = done.reply.send(result);
        }
        true
    }

    /// Checks and normalises arriving queries for the rotation; a query
    /// that fails is answered at once.
    fn prepare(&self, bank: &Bank, tree: &str, jobs: Vec<QueryJob>) -> Vec<(PreparedQuery, Answer)> {
        let mut out = Vec::with_capacity(jobs.len());
        for job in jobs {
            match bank.prepare_query(tree, &job.embedding, &job.options) {
                Ok(prepared) => out.push((
                    prepared,
                    Answer {
                        top: TopK::new(job.options.k),
                        error: None,
                        reply: job.reply,
                    },
                )),
                Err(e) => drop(job.reply.send(Err(ApiError::from_bank(e, "embedding")))),
            }
        }
        out
    }

    /// A worker that cannot read the bank (its lock is poisoned) answers
    /// every query of the tree with the error and ends.
    fn fail_rotation(&self, tree: &str, e: &ApiError) {
        let (waiting, active) = self.queries.abandon(tree);
        waiting.into_iter().for_each(|j| drop(j.reply.send(Err(e.clone()))));
        active.into_iter().for_each(|a| drop(a.reply.send(Err(e.clone()))));
    }

    /// Stops taking writes, lets the writer finish what is queued, then
    /// checkpoints (so a restart replays nothing).
    pub fn shutdown(&self) -> Result<(), BankError> {
        if let Ok(mut tx) = self.writes.lock() {
            tx.take();
        }
        if let Some(handle) = self.writer.lock().ok().and_then(|mut w| w.take()) {
            let _ = handle.join();
        }
        if self.read_only {
            return Ok(());
        }
        let _gate = self.shared.checkpoints.lock().unwrap_or_else(|p| p.into_inner());
        // The WAL left behind holds its header alone, as `close` leaves it.
        if let Ok(mut bank) = self.shared.write_bank() {
            bank.recycle_wals(false);
        }
        checkpoint_beside_queries(&self.shared)?;
        match self.shared.write_bank() {
            Ok(mut bank) => bank.trim_wal(),
            Err(_) => Ok(()),
        }
    }

    /// Verifies the bank on a view opened for it (under the shared lock,
    /// so no checkpoint is half-way), read with no lock held: a verify
    /// reads every byte of the bank (9 s at 1M nodes here), and a write
    /// waiting for the lock meanwhile would hold back later reads as well.
    /// The view is what a restart would read: the checkpoint and the WAL's
    /// records. One verify runs at a time, and no checkpoint runs beside
    /// it (`Shared::checkpoints`); None if one is still running at
    /// `deadline`.
    pub fn verify_until(&self, deadline: Instant) -> ApiResult<Option<VerifyReport>> {
        let _gate = loop {
            match self.shared.checkpoints.try_lock() {
                Ok(gate) => break gate,
                Err(TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(TryLockError::WouldBlock) if Instant::now() > deadline => return Ok(None),
                Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_millis(5)),
            }
        };
        let view = self.read()?.reopened();
        let report = match view {
            Ok(view) => view.verify(),
            // A view that cannot open (damage in the middle of the WAL, a
            // record that cannot apply) is what verify exists to report:
            // the bank's own verify does, under the shared lock.
            Err(e) if e.kind() == ErrorKind::Corrupt => self.read()?.verify(),
            Err(e) => Err(e),
        };
        report.map(Some).map_err(|e| ApiError::from_bank(e, "bank"))
    }

    /// Serves `bank` with circular scans of `chunk_rows` rows per chunk.
    #[cfg(test)]
    pub(super) fn serve_chunked(bank: Bank, threads: usize, chunk_rows: u32) -> Arc<Core> {
        Core::serve_with(bank, SyncPolicy::Always, threads, Batcher::new(chunk_rows)).unwrap()
    }

    /// Queues queries on `tree` as if a pass were running (none leads),
    /// and starts the circular scan's state without a worker thread: the
    /// test runs the workers' steps (`step_rotation`).
    #[cfg(test)]
    pub(super) fn queue_for_rotation(
        &self,
        tree: &str,
        queries: Vec<(Vec<f32>, QueryOptions)>,
    ) -> Vec<oneshot::Receiver<ApiResult<QueryReply>>> {
        let mut out = Vec::new();
        for (embedding, options) in queries {
            let (reply, rx) = oneshot::channel();
            let role = self.queries.enqueue(
                tree,
                QueryJob {
                    embedding,
                    options,
                    reply,
                },
                1,
            );
            if role == Role::Lead {
                // The leader's own query rejoins the queue.
                let jobs = self.queries.take_waiting(tree);
                assert_eq!(self.queries.end_lead(tree, 1), 0);
                self.queries.force_worker(tree, jobs);
            }
            out.push(rx);
        }
        out
    }

    /// One step of a circular-scan worker (see `queue_for_rotation`).
    #[cfg(test)]
    pub(super) fn step_rotation(&self, tree: &str) -> bool {
        self.rotation_step(tree)
    }

    /// The bank's lock, for tests that check who holds it.
    #[cfg(test)]
    pub(super) fn lock(&self) -> &RwLock<Bank> {
        &self.shared.bank
    }
}

/// Scores a claimed chunk: its queries grouped by options and rows, one
/// `scan_rows` call per group; one result per query of the claim. Queries
/// of a group may have joined at different node counts; the group is
/// scanned seeing the largest, which shows each of them the same rows
/// unless a consolidation into a root between the smallest and the
/// largest is in force: then each count is scanned apart.
fn score_claim(bank: &Bank, claim: &Claim<PreparedQuery>) -> Vec<ApiResult<Vec<Candidate>>> {
    let limits = claim.queries.iter().map(|q| q.3);
    let (lo, hi) = (limits.clone().min().unwrap_or(0), limits.max().unwrap_or(0));
    let apart = (lo..hi).any(|i| bank.row(i).map_or(true, |r| r.is_consolidated_root()));
    let mut groups: BTreeMap<(OptionsKey, u32, u32, u32), Vec<usize>> = BTreeMap::new();
    for (i, (_, query, rows, limit)) in claim.queries.iter().enumerate() {
        let visible = if apart { *limit } else { hi };
        let key = (query.options().batch_key(), rows.start, rows.end, visible);
        groups.entry(key).or_default().push(i);
    }
    let mut out = vec![Ok(Vec::new()); claim.queries.len()];
    for ((_, start, end, visible), members) in groups {
        let refs: Vec<&PreparedQuery> = members.iter().map(|&i| &*claim.queries[i].1).collect();
        match bank.scan_rows(&refs, start..end, visible) {
            Ok(lists) => members.into_iter().zip(lists).for_each(|(i, l)| out[i] = Ok(l)),
            Err(e) => {
                let e = ApiError::from_bank(e, "embedding");
                members.into_iter().for_each(|i| out[i] = Err(e.clone()));
            }
        }
    }
    out
}

pub(super) fn answer(bank: &Bank, matches: Vec<crate::bank::Match>) -> ApiResult<QueryReply> {
    QueryReply::new(bank, matches).map_err(|e| ApiError::from_bank(e, "embedding"))
}

/// Runs blocking work on the calling thread of an async task: the
/// multi-threaded runtime first moves its other tasks to another thread.
fn blocking_here<R>(work: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        _ => work(),
    }
}

pub(super) fn poisoned_lock() -> ApiError {
    ApiError::unavailable("the bank's lock was poisoned by a panic; restart the server")
}

/// One write against the bank (no fsync: the round does that). Takes the
/// write whole: a node moves into the bank, not a copy of its embedding
/// made under the exclusive lock.
pub(super) fn apply(bank: &mut Bank, op: WriteOp) -> ApiResult<WriteDone> {
    let no_sync = Some(SyncPolicy::None);
    match op {
        WriteOp::Insert(node) => {
            let external_id = node.external_id.clone();
            let ack = bank
                .insert_with(node, no_sync)
                .map_err(|e| ApiError::from_bank(e, "attach"))?;
            Ok(WriteDone::Inserted(vec![InsertReply::new(ack, external_id)]))
        }
        WriteOp::Batch(nodes) => {
            let acks = bank
                .insert_batch(&nodes, no_sync)
                .map_err(|e| ApiError::from_bank(e, "nodes"))?;
            let ids = nodes.iter().map(|n| n.external_id.clone());
            Ok(WriteDone::Inserted(
                acks.into_iter()
                    .zip(ids)
                    .map(|(a, id)| InsertReply::new(a, id))
                    .collect(),
            ))
        }
        WriteOp::Hit(node) => {
            let index = bank.resolve(&node).map_err(|e| ApiError::from_bank(e, "id"))?;
            let ack = bank.success_hit(index).map_err(|e| ApiError::from_bank(e, "id"))?;
            Ok(WriteDone::Hit(ack.into()))
        }
        WriteOp::Retrievals(nodes) => {
            let indexes = nodes
                .iter()
                .map(|n| bank.resolve(n))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ApiError::from_bank(e, "ids"))?;
            bank.record_retrievals(&indexes)
                .map_err(|e| ApiError::from_bank(e, "ids"))?;
            let distinct = indexes.iter().collect::<std::collections::BTreeSet<_>>().len();
            Ok(WriteDone::Retrievals(distinct as u32))
        }
        WriteOp::Consolidate(node, fields) => {
            let index = bank.resolve(&node).map_err(|e| ApiError::from_bank(e, "id"))?;
            // Refusals are about the node named (already consolidated, a
            // root), but an oversized result is the payload's: the request
            // holds no scenario (the node's own is kept), however large.
            let ack = bank.consolidate(index, fields).map_err(|e| match e {
                BankError::PayloadTooLarge { .. } => ApiError::bad_field("payload", e.to_string()),
                e => ApiError::from_bank(e, "id"),
            })?;
            Ok(WriteDone::Consolidated(ack.into()))
        }
        #[cfg(feature = "agent")]
        WriteOp::Transact(changes) => bank
            .transact(&changes, no_sync)
            .map(WriteDone::Transacted)
            .map_err(|e| ApiError::from_bank(e, "episode")),
    }
}

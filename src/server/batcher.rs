//! Query batching across clients: per tree, the queue of arriving
//! queries and who scores them.
//!
//! A query that finds its tree idle (no pass and no circular scan running)
//! runs one pass itself, on its own thread, with the library's call (no
//! hand-off: a lone client pays what the library call pays). Queries
//! arriving meanwhile wait; when that pass ends they start a circular scan
//! (`rotation`): `workers` threads read the column a chunk at a time,
//! round and round, each chunk scored for every query that still needs
//! it, and a query arriving while it runs joins at the next chunk rather
//! than waiting for a pass to end. It is answered once it has covered
//! every chunk (one rotation). The scan stops when no query is left in
//! it; the tree is then idle again.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::oneshot;

use super::body::QueryReply;
use super::error::{ApiError, ApiResult};
use super::rotation::{Claim, Rotation};
use crate::bank::{PreparedQuery, QueryOptions};
use crate::tree::TopK;

/// Rows per chunk of the circular scan: a query joins within a chunk's
/// time (with 32 queries, 2,048 rows of dim 768 take ~1.7 ms on one
/// thread), and the per-chunk work (a lock, the claim, the merge) stays
/// well under 1% of it.
const CHUNK_ROWS: u32 = 2_048;

pub(super) struct QueryJob {
    pub embedding: Vec<f32>,
    pub options: QueryOptions,
    pub reply: oneshot::Sender<ApiResult<QueryReply>>,
}

/// A query in the circular scan: its best candidates so far.
pub(super) struct Answer {
    pub top: TopK,
    /// A chunk's scan failed: the answer is this error.
    pub error: Option<ApiError>,
    pub reply: oneshot::Sender<ApiResult<QueryReply>>,
}

struct TreeQueue {
    /// Arrived, not yet joined (a pass or the rotation).
    waiting: Vec<QueryJob>,
    /// A query runs a pass on its own thread.
    leading: bool,
    /// Threads running the circular scan.
    workers: usize,
    rotation: Rotation<PreparedQuery, Answer>,
}

impl TreeQueue {
    fn new(chunk_rows: u32) -> TreeQueue {
        TreeQueue {
            waiting: Vec::new(),
            leading: false,
            workers: 0,
            rotation: Rotation::new(chunk_rows),
        }
    }
}

/// What the caller of `enqueue` does.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// The tree was idle: run a pass (`take_waiting`, then `end_lead`).
    Lead,
    /// Start one more circular-scan worker.
    Spawn,
    /// A pass or the circular scan will answer it.
    Wait,
}

/// A circular-scan worker's next step.
pub(super) enum Step {
    Scan(Claim<PreparedQuery>),
    /// Queries arrived since `take_waiting`: take them first.
    Again,
    /// Nothing left to claim: the worker ends.
    Stop,
}

pub(super) struct Batcher {
    trees: Mutex<HashMap<String, TreeQueue>>,
    chunk_rows: u32,
}

impl Default for Batcher {
    fn default() -> Batcher {
        Batcher::new(CHUNK_ROWS)
    }
}

impl Batcher {
    /// Circular scans of `chunk_rows` rows per chunk.
    pub fn new(chunk_rows: u32) -> Batcher {
        Batcher {
            trees: Mutex::new(HashMap::new()),
            chunk_rows,
        }
    }

    fn with<R>(&self, tree: &str, f: impl FnOnce(&mut TreeQueue) -> R) -> R {
        let mut trees = self.trees.lock().unwrap_or_else(|p| p.into_inner());
        let chunk_rows = self.chunk_rows;
        f(trees
            .entry(tree.to_string())
            .or_insert_with(|| TreeQueue::new(chunk_rows)))
    }

    /// Queues a query; `workers` is how many threads a circular scan runs.
    pub fn enqueue(&self, tree: &str, job: QueryJob, workers: usize) -> Role {
        self.with(tree, |q| {
            q.waiting.push(job);
            if q.leading {
                Role::Wait
            } else if q.workers == 0 && q.rotation.is_empty() {
                q.leading = true;
                Role::Lead
            } else if q.workers < workers {
                q.workers += 1;
                Role::Spawn
            } else {
                Role::Wait
            }
        })
    }

    /// Every query waiting on the tree.
    pub fn take_waiting(&self, tree: &str) -> Vec<QueryJob> {
        self.with(tree, |q| std::mem::take(&mut q.waiting))
    }

    /// Ends a lead pass. Returns how many workers to start: `workers`
    /// when queries arrived during the pass, else none (the tree is idle).
    pub fn end_lead(&self, tree: &str, workers: usize) -> usize {
        self.with(tree, |q| {
            assert!(q.leading, "only a leader ends a lead pass");
            q.leading = false;
            if q.waiting.is_empty() || q.workers > 0 {
                return 0;
            }
            q.workers = workers;
            workers
        })
    }

    /// Puts prepared queries into the rotation, each seeing `node_count`
    /// rows, and claims the next chunk.
    pub fn join_and_claim(&self, tree: &str, joining: Vec<(PreparedQuery, Answer)>, node_count: u32) -> Step {
        self.with(tree, |q| {
            for (prepared, answer) in joining {
                q.rotation.join(prepared, answer, node_count);
            }
            if let Some(claim) = q.rotation.claim() {
                return Step::Scan(claim);
            }
            if !q.waiting.is_empty() {
                return Step::Again;
            }
            q.workers -= 1;
            Step::Stop
        })
    }

    /// Puts `jobs` back in the queue as waiting with one worker (that the
    /// caller runs), for tests that drive the circular scan.
    #[cfg(test)]
    pub fn force_worker(&self, tree: &str, jobs: Vec<QueryJob>) {
        self.with(tree, |q| {
            q.waiting.extend(jobs);
            q.workers = 1;
        })
    }

    /// Takes every query of the tree, waiting or in the rotation, for a
    /// worker that ends on an error (it answers them).
    pub fn abandon(&self, tree: &str) -> (Vec<QueryJob>, Vec<Answer>) {
        self.with(tree, |q| {
            q.workers = q.workers.saturating_sub(1);
            let active = q.rotation.drain().into_iter().map(|(_, a)| a).collect();
            (std::mem::take(&mut q.waiting), active)
        })
    }

    /// Merges a scored claim (`merge(i, answer)` for its `i`th query) and
    /// returns the queries that have covered every chunk.
    pub fn complete(
        &self,
        tree: &str,
        claim: &Claim<PreparedQuery>,
        merge: impl FnMut(usize, &mut Answer),
    ) -> Vec<Answer> {
        self.with(tree, |q| q.rotation.complete(claim, merge))
            .into_iter()
            .map(|(_, answer)| answer)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> (QueryJob, oneshot::Receiver<ApiResult<QueryReply>>) {
        let (reply, rx) = oneshot::channel();
        let job = QueryJob {
            embedding: vec![1.0],
            options: QueryOptions::default(),
            reply,
        };
        (job, rx)
    }

    /// The first query on an idle tree leads; queries arriving during its
    /// pass wait, and its end starts the circular scan's workers; queries
    /// arriving while the scan runs join it (one more worker up to the
    /// limit); the tree is idle again once the workers stop.
    #[test]
    fn an_idle_tree_is_led_then_scanned_in_rotation() {
        let batcher = Batcher::default();
        let (first, _a) = job();
        assert_eq!(batcher.enqueue("t", first, 2), Role::Lead);
        assert_eq!(batcher.take_waiting("t").len(), 1);
        let (second, _b) = job();
        assert_eq!(batcher.enqueue("t", second, 2), Role::Wait, "a pass is running");
        let (other, _c) = job();
        assert_eq!(
            batcher.enqueue("u", other, 2),
            Role::Lead,
            "another tree has its own passes"
        );
        assert_eq!(batcher.end_lead("t", 2), 2, "a query waits: two workers start");
        assert_eq!(batcher.take_waiting("t").len(), 1);
        let (third, _d) = job();
        assert_eq!(batcher.enqueue("t", third, 2), Role::Wait, "both workers run");
        assert!(matches!(batcher.join_and_claim("t", Vec::new(), 10), Step::Again));
        batcher.take_waiting("t");
        assert!(matches!(batcher.join_and_claim("t", Vec::new(), 10), Step::Stop));
        let (fourth, _e) = job();
        assert_eq!(
            batcher.enqueue("t", fourth, 2),
            Role::Spawn,
            "one worker left: start another"
        );
        batcher.take_waiting("t");
        assert!(matches!(batcher.join_and_claim("t", Vec::new(), 10), Step::Stop));
        assert!(matches!(batcher.join_and_claim("t", Vec::new(), 10), Step::Stop));
        let (fifth, _f) = job();
        assert_eq!(batcher.enqueue("t", fifth, 2), Role::Lead, "the tree is idle again");
    }

    /// A lead pass with nothing arriving leaves the tree idle.
    #[test]
    fn a_lone_pass_leaves_the_tree_idle() {
        let batcher = Batcher::default();
        let (first, _a) = job();
        assert_eq!(batcher.enqueue("t", first, 2), Role::Lead);
        batcher.take_waiting("t");
        assert_eq!(batcher.end_lead("t", 2), 0);
        let (second, _b) = job();
        assert_eq!(batcher.enqueue("t", second, 2), Role::Lead);
    }
}

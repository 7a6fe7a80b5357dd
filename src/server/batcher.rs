//! Query batching across clients: the queue of waiting queries per tree
//! and the policy deciding when a pass over the column starts.
//!
//! A query that finds no pass owning its tree runs one itself, on its own
//! thread (no hand-off: a lone client pays what the library call pays).
//! Queries arriving meanwhile wait in the queue; when that pass ends, one
//! runner thread takes over and scores them, every waiting query in one
//! pass. Closed-loop clients answered by a pass come back together within
//! a moment, so before each pass the runner waits until as many queries
//! are queued as the previous pass answered plus those that waited
//! through it, bounded by a small fraction
//! of the previous pass's time (`CONVOY_WAIT_SHARE`, at most
//! `CONVOY_WAIT_MAX`): without it a pass would start with the first two
//! or three returning clients and the rest would wait a whole pass more.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::body::QueryReply;
use super::error::ApiResult;
use crate::bank::QueryOptions;

/// The longest a runner waits for the convoy before a pass.
const CONVOY_WAIT_MAX: Duration = Duration::from_millis(3);
/// The wait for the convoy as a share of the previous pass's time.
const CONVOY_WAIT_SHARE: u32 = 10;

pub(super) struct QueryJob {
    pub embedding: Vec<f32>,
    pub options: QueryOptions,
    pub reply: oneshot::Sender<ApiResult<QueryReply>>,
}

#[derive(Default)]
struct TreeQueue {
    jobs: Vec<QueryJob>,
    /// A leader or the runner owns the tree's passes.
    running: bool,
    /// Queries expected for the next pass: those the previous pass
    /// answered (their clients come back) plus those that waited through
    /// it; and how long the previous pass took.
    expected: usize,
    last_time: Duration,
}

/// What the owner of a tree's passes does next.
pub(super) enum Next {
    Pass(Vec<QueryJob>),
    /// Nothing is waiting; the tree has no owner any more.
    Stop,
}

#[derive(Default)]
pub(super) struct Batcher {
    trees: Mutex<HashMap<String, TreeQueue>>,
    arrived: Condvar,
}

impl Batcher {
    /// Queues a query. Returns true when the caller must lead: no pass
    /// owns the tree, so it runs `take_now` and the pass itself.
    pub fn enqueue(&self, tree: &str, job: QueryJob) -> bool {
        let mut trees = self.trees.lock().unwrap_or_else(|p| p.into_inner());
        let queue = trees.entry(tree.to_string()).or_default();
        queue.jobs.push(job);
        let lead = !std::mem::replace(&mut queue.running, true);
        drop(trees);
        self.arrived.notify_all();
        lead
    }

    /// Every query waiting on the tree, taken by the leader at once.
    pub fn take_now(&self, tree: &str) -> Vec<QueryJob> {
        let mut trees = self.trees.lock().unwrap_or_else(|p| p.into_inner());
        trees
            .get_mut(tree)
            .map(|q| std::mem::take(&mut q.jobs))
            .unwrap_or_default()
    }

    /// Records a finished pass. Returns true when queries are waiting (the
    /// caller hands them to a runner, which then owns the tree); false
    /// when the tree's passes have no owner any more.
    pub fn finish(&self, tree: &str, count: usize, time: Duration) -> bool {
        let mut trees = self.trees.lock().unwrap_or_else(|p| p.into_inner());
        let queue = trees.get_mut(tree).expect("a tree with a pass has a queue");
        assert!(queue.running, "a pass ends only on an owned tree");
        queue.expected = count + queue.jobs.len();
        queue.last_time = time;
        queue.running = !queue.jobs.is_empty();
        queue.running
    }

    /// The runner's next pass: waits for the convoy (see the module
    /// comment), then takes every waiting query; `Stop` (and the tree
    /// loses its owner) when none came.
    pub fn take_convoy(&self, tree: &str) -> Next {
        let mut trees = self.trees.lock().unwrap_or_else(|p| p.into_inner());
        let queue = trees.get_mut(tree).expect("a running tree has a queue");
        let wait = (queue.last_time / CONVOY_WAIT_SHARE).min(CONVOY_WAIT_MAX);
        let (target, deadline) = (queue.expected, Instant::now() + wait);
        loop {
            let queue = trees.get_mut(tree).expect("a running tree has a queue");
            let now = Instant::now();
            if queue.jobs.len() >= target || now >= deadline {
                break;
            }
            trees = self
                .arrived
                .wait_timeout(trees, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let queue = trees.get_mut(tree).expect("a running tree has a queue");
        if queue.jobs.is_empty() {
            queue.running = false;
            return Next::Stop;
        }
        Next::Pass(std::mem::take(&mut queue.jobs))
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
    /// pass all go into the runner's next pass, not one pass each; the
    /// tree is free again once nothing waits.
    #[test]
    fn a_pass_takes_every_waiting_query() {
        let batcher = Batcher::default();
        let (first, _a) = job();
        assert!(batcher.enqueue("t", first), "an idle tree: the caller leads");
        assert_eq!(batcher.take_now("t").len(), 1);
        let mut waiting = Vec::new();
        for _ in 0..5 {
            let (j, rx) = job();
            assert!(!batcher.enqueue("t", j), "a pass is running: the query waits");
            waiting.push(rx);
        }
        let (other, _b) = job();
        assert!(batcher.enqueue("u", other), "another tree has its own passes");
        assert!(
            batcher.finish("t", 1, Duration::from_millis(10)),
            "queries wait: a runner takes over"
        );
        match batcher.take_convoy("t") {
            Next::Pass(jobs) => assert_eq!(jobs.len(), 5),
            Next::Stop => panic!("five queries were waiting"),
        }
        assert!(!batcher.finish("t", 5, Duration::from_millis(10)));
        let (again, _c) = job();
        assert!(batcher.enqueue("t", again), "the tree is idle again");
    }

    /// A runner with nothing waiting stops after its bounded wait and
    /// leaves the tree idle.
    #[test]
    fn an_idle_runner_stops() {
        let batcher = Batcher::default();
        let (first, _a) = job();
        assert!(batcher.enqueue("t", first));
        batcher.take_now("t");
        let (second, _b) = job();
        batcher.enqueue("t", second);
        assert!(batcher.finish("t", 1, Duration::from_millis(5)));
        assert!(matches!(batcher.take_convoy("t"), Next::Pass(jobs) if jobs.len() == 1));
        assert!(!batcher.finish("t", 1, Duration::from_millis(5)));
        let (third, _c) = job();
        assert!(batcher.enqueue("t", third), "no runner owns the tree");
    }
}

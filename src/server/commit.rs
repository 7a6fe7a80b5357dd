//! Group commit: the writer thread applies a round of writes under the
//! exclusive lock without an fsync, then runs one fsync (no lock held)
//! for everything applied since the previous one and answers those
//! writes. Writes that arrive during the fsync queue up and form the next
//! round, so the writes per fsync grow with the clients. One thread does
//! both: a write arriving while it is busy (applying or in an fsync) is
//! queued without waking anyone, and a lone write costs one hand-off
//! (request thread to writer), not two. (A separate syncer thread, which
//! let the next round be applied during an fsync, cost a wake-up and a
//! context switch per round and per fsync: on 2 cores under 32 clients
//! the CPU, not the disk, is the limit.)

use std::sync::Mutex;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::core::{Shared, WriteDone, WriteJob, apply, poisoned_lock};
use super::error::{ApiError, ApiResult};
use crate::bank::{BankError, SyncPolicy};
use crate::storage::wal::DetachedSync;

/// Most writes applied in one round.
const ROUND_MAX_WRITES: usize = 1024;

/// A write applied and waiting for the fsync that makes it durable.
type Held = (oneshot::Sender<ApiResult<WriteDone>>, ApiResult<WriteDone>);

/// Writes applied but not yet durable (pushed while the writer holds the
/// exclusive lock, so under the shared lock the list is exactly what the
/// WAL holds unsynced).
#[derive(Default)]
pub(super) struct Unsynced {
    held: Mutex<Vec<Held>>,
}

impl Unsynced {
    fn is_empty(&self) -> bool {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }
}

/// The writer thread, until the queue's senders are gone: rounds of
/// apply-all, each write's answer held for the round's fsync (sent at
/// once under `none`, and for a refused write, of which nothing is
/// stored), the fsync once the policy asks for it, and a checkpoint when
/// one is due. Then it makes the rest durable.
pub(super) fn writer_loop(shared: &Shared, rx: &Receiver<WriteJob>) {
    let mut last_sync = Instant::now();
    while let Some(first) = next_job(shared, rx, last_sync) {
        let mut jobs: Vec<WriteJob> = first.into_iter().collect();
        let (mut round_writes, mut applied) = (0, 0);
        // Writes that came while a batch was applied join the round
        // (they share its fsync) until the queue is empty: 10.3 -> 12.8 (medians)
        // inserts per fsync and ~5% more inserts/s at 32 clients.
        while round_writes < ROUND_MAX_WRITES {
            drain_into(rx, &mut jobs, ROUND_MAX_WRITES - round_writes);
            if jobs.is_empty() {
                break;
            }
            round_writes += jobs.len();
            applied += apply_batch(shared, std::mem::take(&mut jobs));
        }
        if round_writes > 0 {
            shared.metrics.write_round(applied);
            if shared.policy == SyncPolicy::None {
                announce(shared);
            }
        }
        // A poisoned lock answers the held writes with the error.
        if !shared.unsynced.is_empty() && shared.bank.read().map_or(true, |b| b.sync_is_due(shared.policy)) {
            answer_held(shared);
            last_sync = Instant::now();
            announce(shared);
        }
        if shared.bank.read().is_ok_and(|b| b.checkpoint_is_due())
            // Not while a verify reads its view (`Shared::checkpoints`).
            && let Some(_gate) = unless_held(&shared.checkpoints)
        {
            // A failure poisons the bank: later writes are refused
            // with the reason, and a restart recovers from the WAL.
            let _ = checkpoint_beside_queries(shared);
        }
    }
    if !shared.unsynced.is_empty() {
        answer_held(shared);
        announce(shared);
    }
}

/// Moves queued writes into `jobs` until it holds `most` or the queue is
/// empty.
fn drain_into(rx: &Receiver<WriteJob>, jobs: &mut Vec<WriteJob>, most: usize) {
    while jobs.len() < most {
        match rx.try_recv() {
            Ok(job) => jobs.push(job),
            Err(_) => break,
        }
    }
}

/// The next write to apply: Some(None) when none came but held writes may
/// now be due for their fsync (`batch`), None once the queue is closed.
fn next_job(shared: &Shared, rx: &Receiver<WriteJob>, last_sync: Instant) -> Option<Option<WriteJob>> {
    if shared.read_only {
        return match rx.recv_timeout(READER_REFRESH) {
            Ok(job) => Some(Some(job)),
            Err(RecvTimeoutError::Timeout) => {
                refresh_reader(shared);
                Some(None)
            }
            Err(RecvTimeoutError::Disconnected) => None,
        };
    }
    if shared.unsynced.is_empty() {
        return rx.recv().ok().map(Some);
    }
    match rx.recv_timeout(until_due(shared.policy, last_sync)) {
        Ok(job) => Some(Some(job)),
        Err(RecvTimeoutError::Timeout) => Some(None),
        Err(RecvTimeoutError::Disconnected) => None,
    }
}

/// How often a read-only server asks whether the bank's writer (another
/// process) has made anything new durable: the longest a read-only server
/// answers from an older view.
const READER_REFRESH: std::time::Duration = std::time::Duration::from_millis(200);

/// A read-only server's view follows the writer: when the bank has news
/// (two small reads), a new view is opened beside the current one, which
/// queries go on using, and only the swap takes the exclusive lock. A
/// failed open (e.g. a checkpoint caught half-way) keeps the current view
/// until the next ask.
fn refresh_reader(shared: &Shared) {
    let fresh = match shared.bank.read() {
        Ok(bank) if bank.has_news().unwrap_or(false) => bank.reopened(),
        _ => return,
    };
    if let (Ok(fresh), Ok(mut bank)) = (fresh, shared.write_bank()) {
        *bank = fresh;
        drop(bank);
        announce(shared);
    }
}

/// Applies a batch of a round under the exclusive lock, without an
/// fsync, its WAL records written in one write (`Bank::commit_gathered`);
/// returns how many were applied. Answers go out only once that write is
/// done: at once under `none`, after the round's fsync otherwise.
fn apply_batch(shared: &Shared, jobs: Vec<WriteJob>) -> usize {
    let Ok(mut bank) = shared.write_bank() else {
        jobs.into_iter().for_each(|j| drop(j.reply.send(Err(poisoned_lock()))));
        return 0;
    };
    let (results, written) = bank.commit_gathered(|bank| {
        jobs.into_iter()
            .map(|job| (job.reply, apply(bank, job.op)))
            .collect::<Vec<_>>()
    });
    let mut applied = 0;
    let mut held = shared.unsynced.held.lock().unwrap_or_else(|p| p.into_inner());
    for (reply, result) in results {
        let result = match (&written, result) {
            (Err(e), Ok(_)) => Err(ApiError::unavailable(format!("write not made durable: {e}"))),
            (_, result) => result,
        };
        applied += usize::from(result.is_ok());
        match (&result, shared.policy) {
            (Ok(_), SyncPolicy::Always | SyncPolicy::Batch { .. }) => held.push((reply, result)),
            _ => drop(reply.send(result)),
        }
    }
    drop(held);
    drop(bank);
    applied
}

/// A checkpoint that queries do not wait for, run by the writer thread
/// between rounds (and at shutdown, once it has stopped). The writes held
/// for an fsync are made durable and answered first (the detached fsync
/// runs with no lock held), so a checkpoint failure cannot turn a durable
/// write's answer into an error. Then the long half, writing the new nodes'
/// data, runs under the shared lock while queries go on, and only the
/// publishing (rows rewritten in place, manifest, new WAL, new base) under
/// the exclusive lock. No write can come between the two: this thread is
/// the only one that applies writes (were one to, `publish_checkpoint`
/// would write the new nodes again itself).
pub(super) fn checkpoint_beside_queries(shared: &Shared) -> Result<(), BankError> {
    let poisoned = || BankError::Poisoned("the bank's lock was poisoned by a panic".into());
    answer_held(shared);
    let started = Instant::now();
    let prepared = shared.bank.read().map_err(|_| poisoned())?.prepare_checkpoint();
    let prepare = started.elapsed();
    let published = {
        let mut bank = shared.write_bank().map_err(|_| poisoned())?;
        // Timed from the lock's grant: what a query may wait behind.
        let held = Instant::now();
        let published = bank.publish_checkpoint(prepared);
        drop(bank);
        shared.metrics.checkpoint(prepare, held.elapsed());
        published
    };
    announce(shared);
    published
}

/// How long the oldest held write may still wait for its fsync.
fn until_due(policy: SyncPolicy, last_sync: Instant) -> Duration {
    match policy {
        SyncPolicy::Batch { interval_ms, .. } => Duration::from_millis(interval_ms)
            .saturating_sub(last_sync.elapsed())
            .max(Duration::from_millis(1)),
        SyncPolicy::Always | SyncPolicy::None => Duration::from_millis(1),
    }
}

/// The gate unless another thread holds it (a poisoned gate is taken: a
/// verify that panicked must not stop checkpoints for good).
fn unless_held(gate: &Mutex<()>) -> Option<std::sync::MutexGuard<'_, ()>> {
    match gate.try_lock() {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Makes every held write durable with one fsync (no lock held during
/// it), then answers them: applied but not durable is an error, and the
/// bank is then poisoned and says so.
fn answer_held(shared: &Shared) {
    let (held, pending) = match shared.bank.read() {
        Ok(bank) => {
            let mut list = shared.unsynced.held.lock().unwrap_or_else(|p| p.into_inner());
            let held = std::mem::take(&mut *list);
            (held, bank.detach_sync().map_err(|e| e.to_string()))
        }
        Err(_) => {
            let mut list = shared.unsynced.held.lock().unwrap_or_else(|p| p.into_inner());
            (
                std::mem::take(&mut *list),
                Err("the bank's lock was poisoned".to_string()),
            )
        }
    };
    let synced = match pending {
        Ok(None) => Ok(()),
        Ok(Some(pending)) => make_durable(shared, &pending),
        Err(e) => Err(e),
    };
    for (reply, result) in held {
        let result = match &synced {
            Ok(()) => result,
            Err(e) => Err(ApiError::unavailable(format!("write not made durable: {e}"))),
        };
        let _ = reply.send(result);
    }
}

/// Tells `/v1/events` subscribers what the bank holds now.
fn announce(shared: &Shared) {
    if let Ok(bank) = shared.bank.read() {
        shared.changes.send_replace(super::core::ChangeEvent {
            node_count: bank.node_count(),
            last_lsn: bank.durable_below_lsn().saturating_sub(1),
        });
    }
}

/// Runs a detached fsync with no lock held, then records it.
fn make_durable(shared: &Shared, pending: &DetachedSync) -> Result<(), String> {
    let outcome = pending.run();
    shared.metrics.wal_sync();
    let mut bank = shared
        .write_bank()
        .map_err(|_| "the bank's lock was poisoned".to_string())?;
    bank.finish_sync(pending, outcome).map_err(|e| e.to_string())
}

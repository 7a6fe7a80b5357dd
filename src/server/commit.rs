//! Group commit: the writer thread applies rounds of writes under the
//! exclusive lock without an fsync and hands them to the syncer thread,
//! which runs one fsync (no lock held) for everything applied since the
//! previous one and then answers those writes. The writer never waits for
//! an fsync: while one runs, the next round is applied, and the next
//! fsync covers all of it, so the writes per fsync grow with the clients.

use std::sync::mpsc::Receiver;
use std::sync::{Condvar, Mutex};
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

/// Writes applied but not yet durable, handed from the writer to the
/// syncer (pushed while the writer holds the exclusive lock, so under the
/// shared lock the list is exactly what the WAL holds unsynced).
#[derive(Default)]
pub(super) struct Unsynced {
    held: Mutex<(Vec<Held>, bool)>,
    changed: Condvar,
}

/// The writer thread, until the queue's senders are gone: rounds of
/// apply-all, each write's answer held for the syncer (sent at once under
/// `none`, and for a refused write, of which nothing is stored). Then it
/// lets the syncer make the rest durable and waits for it.
pub(super) fn writer_loop(shared: &Shared, rx: &Receiver<WriteJob>) {
    std::thread::scope(|scope| {
        scope.spawn(|| syncer_loop(shared));
        while let Ok(first) = rx.recv() {
            let mut jobs = vec![first];
            while jobs.len() < ROUND_MAX_WRITES {
                match rx.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
            apply_round(shared, jobs);
            if shared.bank.read().is_ok_and(|b| b.checkpoint_is_due()) {
                // A failure poisons the bank: later writes are refused
                // with the reason, and a restart recovers from the WAL.
                let _ = checkpoint_beside_queries(shared);
            }
        }
        let mut held = shared.unsynced.held.lock().unwrap_or_else(|p| p.into_inner());
        held.1 = true;
        drop(held);
        shared.unsynced.changed.notify_all();
    });
}

/// Applies a round under the exclusive lock, without an fsync.
fn apply_round(shared: &Shared, jobs: Vec<WriteJob>) {
    let Ok(mut bank) = shared.bank.write() else {
        return jobs.into_iter().for_each(|j| drop(j.reply.send(Err(poisoned_lock()))));
    };
    let mut applied = 0;
    let mut held = shared.unsynced.held.lock().unwrap_or_else(|p| p.into_inner());
    for job in jobs {
        let result = apply(&mut bank, job.op);
        applied += usize::from(result.is_ok());
        match (&result, shared.policy) {
            (Ok(_), SyncPolicy::Always | SyncPolicy::Batch { .. }) => held.0.push((job.reply, result)),
            _ => drop(job.reply.send(result)),
        }
    }
    drop(held);
    drop(bank);
    shared.metrics.write_round(applied);
    shared.unsynced.changed.notify_all();
    if shared.policy == SyncPolicy::None {
        announce(shared);
    }
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
        let mut bank = shared.bank.write().map_err(|_| poisoned())?;
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

/// The syncer thread: whenever writes are held and the policy asks for an
/// fsync (`Bank::sync_is_due`: at once under `always`; under `batch` once
/// its record count is pending or its interval has passed), one fsync for
/// all of them, then their answers. Ends once the writer has stopped and
/// nothing is held.
fn syncer_loop(shared: &Shared) {
    let unsynced = &shared.unsynced;
    let mut last_sync = Instant::now();
    loop {
        let closing = {
            let mut held = unsynced.held.lock().unwrap_or_else(|p| p.into_inner());
            while held.0.is_empty() && !held.1 {
                held = unsynced
                    .changed
                    .wait_timeout(held, Duration::from_secs(1))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            if held.0.is_empty() {
                return; // closing, nothing held
            }
            held.1
        };
        // Lock order everywhere: the bank, then the held list.
        if !closing && !shared.bank.read().is_ok_and(|b| b.sync_is_due(shared.policy)) {
            let held = unsynced.held.lock().unwrap_or_else(|p| p.into_inner());
            let wait = until_due(shared.policy, last_sync);
            drop(unsynced.changed.wait_timeout(held, wait));
            continue;
        }
        answer_held(shared);
        last_sync = Instant::now();
        announce(shared);
    }
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

/// Makes every held write durable with one fsync (no lock held during
/// it), then answers them: applied but not durable is an error, and the
/// bank is then poisoned and says so.
fn answer_held(shared: &Shared) {
    let (held, pending) = match shared.bank.read() {
        Ok(bank) => {
            let mut list = shared.unsynced.held.lock().unwrap_or_else(|p| p.into_inner());
            let held = std::mem::take(&mut list.0);
            (held, bank.detach_sync().map_err(|e| e.to_string()))
        }
        Err(_) => {
            let mut list = shared.unsynced.held.lock().unwrap_or_else(|p| p.into_inner());
            (
                std::mem::take(&mut list.0),
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
        .bank
        .write()
        .map_err(|_| "the bank's lock was poisoned".to_string())?;
    bank.finish_sync(pending, outcome).map_err(|e| e.to_string())
}

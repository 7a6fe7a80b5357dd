//! Applying transactions to the overlay (validated, all or nothing) and
//! committing them through the WAL under the sync policy.

use std::time::Instant;

use super::overlay::Mark;
use super::{Bank, BankError, SyncPolicy};
use crate::format::payload::check_record;
use crate::format::row::Row;
use crate::format::wal::{MAX_RECORD_BODY_BYTES, RECORD_HEADER_SIZE_BYTES, WalOp, encode_ops_into};
use crate::storage::StorageError;
use crate::storage::wal::DetachedSync;
use crate::tree;

/// Whether a new node's vector check fields (CRC, lane sums) are
/// recomputed from its vector when it is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Checks {
    /// Recompute and compare: ops read from the WAL, or whose check fields
    /// were copied from another row (a consolidation's new root).
    Verify,
    /// The fields were derived from this very vector by `vector_checks`
    /// when the node was built (`prepare_insert`): recomputing them would
    /// run the same function over the same bytes.
    Derived,
}

impl Bank {
    /// Validates and applies every op of a transaction, or none of them.
    pub(crate) fn apply_txn(&mut self, ops: Vec<WalOp>) -> Result<(), BankError> {
        self.apply_txn_undoable(ops).map(drop)
    }

    /// As `apply_txn`, returning what undoes it.
    pub(crate) fn apply_txn_undoable(&mut self, ops: Vec<WalOp>) -> Result<Mark, BankError> {
        let mut mark = self.overlay.mark();
        for op in ops {
            let result = match op {
                WalOp::PutNode {
                    row,
                    vector,
                    payload_record,
                } => self
                    .check_new_node(&row, &vector, &payload_record, Checks::Verify)
                    .map(|()| self.overlay.push_node(row, &vector, payload_record)),
                WalOp::PutRow { row } => self
                    .check_row_update(&row)
                    .map(|()| self.overlay.put_row(row, &mut mark)),
            };
            if let Err(e) = result {
                self.overlay.rollback(mark);
                return Err(e);
            }
        }
        Ok(mark)
    }

    /// Applies (undoably) a new node that `prepare_insert` built, with
    /// every rule of a new node but one: its vector's check fields are not
    /// recomputed, as prepare_insert derived them from this very vector
    /// (`Checks::Derived`). WAL replay checks them like every other field.
    pub(crate) fn apply_prepared_node(
        &mut self,
        row: Row,
        vector: &[f32],
        payload_record: Vec<u8>,
    ) -> Result<Mark, BankError> {
        let mark = self.overlay.mark();
        self.check_new_node(&row, vector, &payload_record, Checks::Derived)?;
        self.overlay.push_node(row, vector, payload_record);
        Ok(mark)
    }

    fn check_new_node(
        &self,
        row: &Row,
        vector: &[f32],
        payload_record: &[u8],
        checks: Checks,
    ) -> Result<(), BankError> {
        let bad = |detail: String| {
            Err(BankError::Corrupt {
                file: "WAL op".into(),
                offset_bytes: 0,
                detail,
            })
        };
        let next = self.overlay.total_count();
        let capacity = crate::format::node_capacity(self.manifest.rows_per_segment);
        if u64::from(next) >= capacity {
            return Err(BankError::BadConfig(format!(
                "the bank is full: {capacity} nodes fill its {} segments of {} rows",
                crate::format::MAX_SEGMENT_COUNT,
                self.manifest.rows_per_segment
            )));
        }
        if row.index != next {
            return bad(format!("new node has index {} where {next} was next", row.index));
        }
        if row.payload_offset_bytes != self.overlay.payload_end_bytes
            || row.payload_size_bytes as usize != payload_record.len()
        {
            return bad(format!("node {next}: payload location does not follow the log end"));
        }
        if vector.len() != self.manifest.dim_count as usize
            || (checks == Checks::Verify && self.vector_checks(vector) != Some(super::VectorChecks::of_row(row)))
        {
            return bad(format!("node {next}: vector length, checksum or lane sum mismatch"));
        }
        if checks == Checks::Verify
            && let Some(norm) = super::off_unit_norm(vector)
        {
            return bad(format!("node {next}: vector has norm {norm}, not 1"));
        }
        check_record(payload_record, next).map_err(|e| BankError::Corrupt {
            file: "WAL op".into(),
            offset_bytes: 0,
            detail: e.to_string(),
        })?;
        self.check_shape(row)
    }

    /// Tree, parent, depth and type must agree with the tree rules.
    fn check_shape(&self, row: &Row) -> Result<(), BankError> {
        let rule = tree::shape_violation(row, self.manifest.trees.len(), self.manifest.max_depth, |p| self.row(p))?;
        match rule {
            None => Ok(()),
            Some(detail) => Err(BankError::Corrupt {
                file: "WAL op".into(),
                offset_bytes: 0,
                detail,
            }),
        }
    }

    /// A row update may change counters, flags and the link only, and may
    /// not leave a link without a consolidation flag. A stray link the
    /// update only carries over is the stored row's damage, not the
    /// update's (`verify` reports it there).
    fn check_row_update(&self, row: &Row) -> Result<(), BankError> {
        let current = self.row(row.index)?;
        if (row.link, row.flags) != (current.link, current.flags)
            && let Some(detail) = tree::link_violation(row)
        {
            return Err(BankError::Corrupt {
                file: "WAL op".into(),
                offset_bytes: 0,
                detail,
            });
        }
        let mut comparable = row.clone();
        comparable.success_hits = current.success_hits;
        comparable.retrievals = current.retrievals;
        comparable.flags = current.flags;
        comparable.link = current.link;
        if comparable != current {
            return Err(BankError::Corrupt {
                file: "WAL op".into(),
                offset_bytes: 0,
                detail: format!("update of node {} changes an immutable field", row.index),
            });
        }
        Ok(())
    }

    pub(crate) fn check_writable(&self) -> Result<(), BankError> {
        match &self.writer {
            None => Err(BankError::ReadOnly("opened read-only".into())),
            Some(w) => match w.poison_reason() {
                Some(reason) => Err(BankError::Poisoned(reason.clone())),
                None => Ok(()),
            },
        }
    }

    /// Applies `ops`, logs them as one WAL record and syncs per policy.
    /// Returns the record's LSN. Any I/O failure poisons the bank.
    pub(crate) fn commit(&mut self, ops: Vec<WalOp>, policy: Option<SyncPolicy>) -> Result<u64, BankError> {
        self.check_writable()?;
        let mut record = self.record_buffer();
        encode_ops_into(&ops, &mut record);
        check_record_size(ops.len(), record.len() - RECORD_HEADER_SIZE_BYTES)?;
        let op_count = ops.len() as u16;
        let undo = self.apply_txn_undoable(ops)?;
        let logged = self.log(op_count, &mut record, vec![undo], policy);
        self.keep_record_buffer(record);
        logged
    }

    /// Appends already-applied ops as one record and syncs per policy:
    /// `record` holds room for the record header, then the encoded ops
    /// (`WalWriter::append_framed`). If the append fails the overlay is
    /// rolled back (newest mark first) and the bank is poisoned.
    pub(crate) fn log(
        &mut self,
        op_count: u16,
        record: &mut Vec<u8>,
        undo: Vec<Mark>,
        policy: Option<SyncPolicy>,
    ) -> Result<u64, BankError> {
        let writer = self.writer.as_mut().expect("checked writable");
        let lsn = match writer.wal.append_framed(op_count, record) {
            Ok(lsn) => lsn,
            Err(e) => {
                let e = writer.poisoned_by(e);
                undo.into_iter().rev().for_each(|m| self.overlay.rollback(m));
                return Err(e);
            }
        };
        let policy = policy.unwrap_or(writer.policy);
        self.offer_ahead();
        self.sync_per_policy(policy)?;
        self.maybe_checkpoint()?;
        assert!(self.writer.as_ref().is_some_and(|w| w.wal.next_lsn() > lsn));
        Ok(lsn)
    }

    fn sync_per_policy(&mut self, policy: SyncPolicy) -> Result<(), BankError> {
        if self.sync_is_due(policy) { self.sync() } else { Ok(()) }
    }

    /// Whether `policy` asks for an fsync now, after a commit: always under
    /// `always`; under `batch` once its record count is pending or its
    /// interval has passed since the last sync; never under `none`. A
    /// server that syncs for its writer asks this once per round.
    pub fn sync_is_due(&self, policy: SyncPolicy) -> bool {
        let Some(writer) = self.writer.as_ref() else {
            return false;
        };
        match policy {
            SyncPolicy::Always => true,
            SyncPolicy::Batch { records, interval_ms } => {
                let pending = writer.wal.next_lsn() - writer.wal.synced_below();
                pending >= u64::from(records) || writer.last_sync.elapsed().as_millis() as u64 >= interval_ms
            }
            SyncPolicy::None => false,
        }
    }

    /// Makes every committed record durable. After a failed fsync the bank
    /// is poisoned: fsync is never retried (the kernel may have dropped the
    /// dirty pages and a second fsync could report success falsely). With
    /// nothing left to sync it succeeds on a poisoned bank too: a commit
    /// whose checkpoint failed (`checkpoint_failure`) was durable, and a
    /// caller that syncs after it must not report it lost.
    pub fn sync(&mut self) -> Result<(), BankError> {
        let Some(writer) = self.writer.as_mut() else {
            return self.check_writable();
        };
        if !writer.wal.has_unsynced() {
            return Ok(());
        }
        self.check_writable()?;
        let writer = self.writer.as_mut().expect("writer");
        if let Err(e) = writer.wal.sync() {
            return Err(writer.poisoned_by(e));
        }
        writer.last_sync = Instant::now();
        Ok(())
    }

    /// Starts a sync that runs without the bank (`DetachedSync::run`), so a
    /// server can apply writes under a short exclusive lock and fsync
    /// outside it while queries go on. None if nothing is unsynced. The
    /// writes it covers are durable only after `finish_sync` returns Ok.
    pub fn detach_sync(&self) -> Result<Option<DetachedSync>, BankError> {
        self.check_writable()?;
        Ok(self.writer.as_ref().expect("writer").wal.detach_sync())
    }

    /// Runs `commits` with the WAL records they append gathered and written
    /// in one write when it returns (`WalWriter::gather`; a record of
    /// 256 KiB or more is written at once): a server's round of commits
    /// then makes one write system call, not one per commit. Nothing else
    /// sees them unwritten: `commits` has the bank to itself, and an fsync
    /// in it (a sync policy's, a checkpoint's) writes them first. Also
    /// returns the write's outcome: after a failure the commits are
    /// applied but not in the WAL, so the bank is poisoned and must not
    /// report them made.
    pub fn commit_gathered<R>(&mut self, commits: impl FnOnce(&mut Bank) -> R) -> (R, Result<(), BankError>) {
        if let Some(writer) = self.writer.as_mut() {
            writer.wal.gather();
        }
        let out = commits(self);
        let Some(writer) = self.writer.as_mut() else {
            return (out, Ok(()));
        };
        let written = writer.wal.stop_gathering().map_err(|e| writer.poisoned_by(e));
        // A write that failed inside `commits` (gathered records written
        // ahead of a large one) poisoned the bank there: those commits are
        // in no file either.
        let written = written.and_then(|()| match writer.poison_reason() {
            Some(why) => Err(BankError::Poisoned(why.clone())),
            None => Ok(()),
        });
        (out, written)
    }

    /// After the last checkpoint (`close`, a server's shutdown): a WAL with
    /// no record whose file is longer than its header (a recycled file,
    /// zeros written ahead) is cut to its header, durably. A closed bank's
    /// WAL is then its header alone whether or not the checkpoint had
    /// anything to write.
    pub fn trim_wal(&mut self) -> Result<(), BankError> {
        let Some(writer) = self.writer.as_mut() else {
            return Ok(());
        };
        writer.wal.trim_when_empty().map_err(|e| writer.poisoned_by(e))
    }

    /// Records the outcome of a detached sync. A failure poisons the bank,
    /// as a failed `sync` does (fsync is never retried).
    pub fn finish_sync(&mut self, done: &DetachedSync, outcome: Result<(), StorageError>) -> Result<(), BankError> {
        let writer = self.writer.as_mut().expect("a detached sync comes from a writer");
        if let Err(e) = outcome {
            return Err(writer.poisoned_by(e));
        }
        writer.wal.complete_sync(done);
        writer.last_sync = Instant::now();
        Ok(())
    }

    /// For `Batch` policies driven by a timer: syncs if records have waited
    /// at least the batch interval.
    pub fn sync_if_due(&mut self) -> Result<(), BankError> {
        let Some(w) = self.writer.as_ref() else {
            return Ok(());
        };
        if let SyncPolicy::Batch { interval_ms, .. } = w.policy
            && w.wal.has_unsynced()
            && w.last_sync.elapsed().as_millis() as u64 >= interval_ms
        {
            return self.sync();
        }
        Ok(())
    }

    pub fn set_sync_policy(&mut self, policy: SyncPolicy) {
        if let Some(w) = self.writer.as_mut() {
            w.policy = policy;
        }
    }

    pub fn sync_policy(&self) -> Option<SyncPolicy> {
        self.writer.as_ref().map(|w| w.policy)
    }

    /// Checkpoints once the WAL is big enough, after a commit. The commit
    /// is made before this runs, so only a failure to make its record
    /// durable is the commit's failure: the WAL is synced first (as the
    /// checkpoint would), and a checkpoint failure after that is recorded
    /// (`checkpoint_failure`) and poisons the handle, but the commit is
    /// reported as made. Reporting it as failed made callers retry a
    /// change that was already durable (a hit counted twice).
    fn maybe_checkpoint(&mut self) -> Result<(), BankError> {
        if self.writer.as_ref().is_none_or(|w| w.checkpoints_deferred) || !self.checkpoint_is_due() {
            return Ok(());
        }
        self.sync()?;
        if let Err(e) = self.checkpoint() {
            assert!(self.check_writable().is_err(), "a failed checkpoint poisons the bank");
            let w = self.writer.as_mut().expect("writer");
            assert!(!w.wal.has_unsynced(), "the commit was durable before the checkpoint");
            w.checkpoint_failure = Some(e.to_string());
        }
        Ok(())
    }

    /// Whether the WAL has outgrown the checkpoint threshold
    /// (`OpenOptions::checkpoint_wal_bytes`).
    pub fn checkpoint_is_due(&self) -> bool {
        self.writer
            .as_ref()
            .is_some_and(|w| w.wal.size_bytes() >= w.checkpoint_wal_bytes)
    }

    /// Commits stop checkpointing by themselves once the WAL outgrows its
    /// threshold; the caller checkpoints when `checkpoint_is_due`. A server
    /// does, so that the long half (`prepare_checkpoint`) runs under its
    /// shared lock instead of inside a write.
    pub fn defer_checkpoints(&mut self) {
        if let Some(w) = self.writer.as_mut() {
            w.checkpoints_deferred = true;
        }
    }

    /// Each checkpoint starts its new WAL in the file of the one it
    /// retires (FORMAT.md §8 step 5, recycled: `WalWriter::recycle`) while
    /// `on`, instead of a new file: the file's blocks are written and
    /// durable, so commits need no zeros written ahead of them, nor their
    /// fdatasyncs a step of them. A server's option: at 32 durable clients
    /// here it gave ~13% more inserts/s (docs/SERVER.md). A WAL past twice
    /// the checkpoint threshold is not recycled (its space goes back), nor
    /// the one `close` starts, and `close` cuts the file to its header
    /// (`trim_wal`): a closed bank's WAL is its header alone.
    pub fn recycle_wals(&mut self, on: bool) {
        if let Some(w) = self.writer.as_mut() {
            w.recycle_wals = on;
        }
    }

    /// Why the checkpoint that ran after a commit failed, if one did. The
    /// commit itself was made durable (its call returned `Ok`); the handle
    /// is poisoned and refuses further writes until the bank is reopened,
    /// which recovers everything from the WAL.
    pub fn checkpoint_failure(&self) -> Option<&str> {
        self.writer.as_ref()?.checkpoint_failure.as_deref()
    }
}

/// One WAL record holds at most 65535 ops and 64 MiB of body.
pub(crate) fn check_record_size(op_count: usize, body_bytes: usize) -> Result<(), BankError> {
    if op_count > usize::from(u16::MAX) || body_bytes > MAX_RECORD_BODY_BYTES {
        return Err(BankError::TransactionTooLarge {
            ops: op_count,
            size_bytes: body_bytes,
        });
    }
    Ok(())
}

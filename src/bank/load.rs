//! Bulk load: new nodes made durable by a checkpoint instead of the WAL.
//!
//! A bulk import is dominated by vector traffic. Through the WAL each
//! vector is written twice (log, then segment at the next checkpoint) and
//! copied into a record body on the way; a load stages the nodes in the
//! overlay exactly like a transaction and checkpoints at once, so each
//! vector is written once, in large writes, straight to its segment.

use super::checkpoint::Published;
use super::mutate::{Txn, set_lsn};
use super::{Bank, BankError, Change, ChangeAck};

impl Bank {
    /// Applies `changes` like [`Bank::transact`] and makes them durable by
    /// a checkpoint at once, without writing them to the WAL.
    ///
    /// All or nothing, as a transaction: a crash before the checkpoint's
    /// new manifest is durable leaves the bank as it was, with the load's
    /// bytes as unreferenced leftovers past the checkpoint's ends (the same
    /// as any interrupted checkpoint). Nothing can slip in between staging
    /// and checkpoint (`&mut self`), so no WAL record can refer to a node
    /// the WAL does not hold. Records committed earlier are checkpointed
    /// with it. Acks carry the LSN of the last record in the WAL before
    /// (durable, like everything else, when this returns). Each call costs
    /// a full checkpoint (a few fsyncs): for batches, not single nodes.
    ///
    /// Only inserts and imports: a change to an existing row (a hit, a
    /// retrieval count) would be rewritten in place by the checkpoint with
    /// no WAL record to restore it from if the checkpoint were cut short.
    pub fn load(&mut self, changes: &[Change]) -> Result<Vec<ChangeAck>, BankError> {
        self.load_staged(changes, None)
    }

    /// As [`Bank::load`], with the embeddings given as one row-major
    /// column (`changes.len() * dim_count` floats, row k for change k)
    /// instead of one `Vec` per node, whose `embedding` must then be
    /// empty. Spares a bulk import one allocation and copy per row.
    pub fn load_column(&mut self, changes: &[Change], column: &[f32]) -> Result<Vec<ChangeAck>, BankError> {
        self.check_column(changes, column)?;
        self.load_staged(changes, Some(column))
    }

    /// As [`Bank::load_column`] for several batches made durable by one
    /// checkpoint: each batch is staged all or nothing on its own, so a
    /// batch with a bad node fails alone (its result says why) and the
    /// others are stored. Spares a bulk import the checkpoint's fixed cost
    /// (about five fsyncs, a manifest and a WAL) for all but one batch.
    /// The outer `Err` is a failed checkpoint (or staging that failed for
    /// another reason than a node of its batch): it means for every staged
    /// batch what a failed `load` means for its one.
    pub fn load_columns(&mut self, batches: &[(&[Change], &[f32])]) -> Result<Vec<BatchResult>, BankError> {
        self.check_writable()?;
        let mut results = Vec::with_capacity(batches.len());
        let mut staged = Vec::with_capacity(batches.len());
        for &(changes, column) in batches {
            let txn = self
                .check_column(changes, column)
                .and_then(|()| check_loadable(changes, true))
                .and_then(|()| self.stage_all(changes, Some(column), false));
            match txn {
                Ok(txn) => staged.push(txn),
                Err(e @ (BankError::BatchItem { .. } | BankError::DimensionMismatch { .. })) => {
                    results.push(Err(e));
                    continue;
                }
                Err(e) => {
                    self.unstage_all(staged)?;
                    return Err(e);
                }
            }
            results.push(Ok(Vec::new()));
        }
        let mut acks = self.commit_loaded(staged)?.into_iter();
        for result in results.iter_mut().filter(|r| r.is_ok()) {
            *result = Ok(acks.next().expect("one ack list per staged batch"));
        }
        Ok(results)
    }

    /// A column holds one row of `dim_count` floats per change.
    fn check_column(&self, changes: &[Change], column: &[f32]) -> Result<(), BankError> {
        let dim = self.manifest.dim_count as usize;
        if column.len() != changes.len() * dim {
            return Err(BankError::DimensionMismatch {
                expected: self.manifest.dim_count,
                found: column.len() / changes.len().max(1),
            });
        }
        Ok(())
    }

    fn load_staged(&mut self, changes: &[Change], column: Option<&[f32]>) -> Result<Vec<ChangeAck>, BankError> {
        self.check_writable()?;
        check_loadable(changes, column.is_some())?;
        let txn = self.stage_all(changes, column, false)?;
        let mut acks = self.commit_loaded(vec![txn])?;
        Ok(acks.pop().expect("one staged batch"))
    }

    /// Makes staged load batches durable by a checkpoint; their acks, in
    /// order.
    fn commit_loaded(&mut self, txns: Vec<Txn>) -> Result<Vec<Vec<ChangeAck>>, BankError> {
        if txns.iter().all(|t| t.undo.is_empty()) {
            return Ok(txns.into_iter().map(|t| t.acks).collect());
        }
        let lsn = self.last_lsn();
        // Any failure poisons the bank (the checkpoint's rule); what the
        // handle shows afterwards follows what is on disk.
        match self.checkpoint_reporting() {
            Ok(()) => {}
            Err((e, Published::No)) => {
                // Not on disk, and no WAL record to bring it back: take it
                // out of memory too, so no read (or freeze) of this handle
                // serves nodes that a reopen will not have.
                self.unstage_all(txns)?;
                return Err(e);
            }
            // Like a failed fsync of a WAL record: shown, maybe durable.
            Err((e, Published::Unknown)) => return Err(e),
            // Committed; only the new WAL failed. The load is acked and the
            // poisoned bank refuses the next write.
            Err((_, Published::Yes)) => {}
        }
        Ok(txns
            .into_iter()
            .map(|mut txn| {
                set_lsn(&mut txn.acks, lsn);
                txn.acks
            })
            .collect())
    }

    /// Undoes staged batches, the last first.
    fn unstage_all(&mut self, txns: Vec<Txn>) -> Result<(), BankError> {
        txns.into_iter().rev().try_for_each(|txn| self.unstage(txn))
    }
}

/// One batch's outcome in [`Bank::load_columns`]: its acks, or why it
/// was not stored (`BatchItem` naming the node, or `DimensionMismatch`
/// for a column of the wrong length).
pub type BatchResult = Result<Vec<ChangeAck>, BankError>;

/// Inserts and imports only; with a column, their own embeddings empty.
fn check_loadable(changes: &[Change], column: bool) -> Result<(), BankError> {
    for (position, change) in changes.iter().enumerate() {
        let refused = match change {
            Change::Insert(node) | Change::Import(node, _) if column && !node.embedding.is_empty() => {
                BankError::BadEmbedding("a node of a column load carries its own embedding too".into())
            }
            Change::Insert(_) | Change::Import(..) => continue,
            Change::SuccessHit(_) => BankError::NotLoadable("a success hit"),
            Change::Retrievals(_) => BankError::NotLoadable("a retrieval count"),
        };
        return Err(BankError::BatchItem {
            position,
            error: Box::new(refused),
        });
    }
    Ok(())
}

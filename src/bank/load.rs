//! Bulk load: new nodes made durable by a checkpoint instead of the WAL.
//!
//! A bulk import is dominated by vector traffic. Through the WAL each
//! vector is written twice (log, then segment at the next checkpoint) and
//! copied into a record body on the way; a load stages the nodes in the
//! overlay exactly like a transaction and checkpoints at once, so each
//! vector is written once, in large writes, straight to its segment.

use std::sync::mpsc::{Receiver, Sender, SyncSender};

use super::checkpoint::{Published, VectorWrites};
use super::mutate::{Txn, set_lsn};
use super::overlay::Overlay;
use super::segment_writer::SegmentWriter;
use super::{Bank, BankError, Change, ChangeAck};
use crate::format::manifest::Manifest;
use crate::storage::AlignedFloats;

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
        self.load_one(changes, None)
    }

    /// As [`Bank::load`], with the embeddings given as one row-major
    /// column (`changes.len() * dim_count` floats, row k for change k)
    /// instead of one `Vec` per node, whose `embedding` must then be
    /// empty. Spares a bulk import one allocation and copy per row.
    pub fn load_column(&mut self, changes: &[Change], column: &[f32]) -> Result<Vec<ChangeAck>, BankError> {
        self.check_column(changes, column)?;
        self.load_one(changes, Some(column))
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
        let batches: Vec<_> = batches.iter().map(|&(c, column)| (c, Some(column))).collect();
        self.load_batches(&batches)
    }

    fn load_one(&mut self, changes: &[Change], column: Option<&[f32]>) -> Result<Vec<ChangeAck>, BankError> {
        let mut results = self.load_batches(&[(changes, column)])?;
        results.pop().expect("one result per batch")
    }

    /// Stages each batch (all or nothing on its own) while a writer thread
    /// writes the staged nodes' vectors, then makes them durable by one
    /// checkpoint.
    fn load_batches(&mut self, batches: &[(&[Change], Option<&[f32]>)]) -> Result<Vec<BatchResult>, BankError> {
        self.check_writable()?;
        // Vectors being written ahead (`write_vectors_ahead`) are written
        // before this load's, so the thread's writes through the cache
        // never race its writes around it on a shared page; the load's
        // checkpoint writes those nodes' vectors again itself, and the
        // thread starts a new round after it.
        if let Err(e) = self.finish_ahead() {
            self.poison(format!("writing vectors ahead failed: {e}"));
            return Err(e);
        }
        let from_index = self.overlay.total_count();
        let writer = SegmentWriter::new(self.storage.clone(), &self.manifest, true);
        let mut feed = Feed::new(&self.manifest, from_index);
        let (spare_tx, spare_rx) = std::sync::mpsc::channel();
        let mut kept = self.writer.as_mut().map(|w| std::mem::take(&mut w.load_pieces));
        // Without auto attach nothing scans the staged nodes, so the
        // overlay need not keep their vectors: they move to the writer
        // thread (no copy, no fresh memory for a large load).
        if !batches.iter().any(|(changes, _)| changes.iter().any(scans_overlay)) {
            let pending = kept.as_mut().and_then(Vec::pop).unwrap_or_else(|| feed.new_piece());
            self.overlay.start_handoff(pending);
        }
        kept.into_iter().flatten().for_each(|piece| drop(spare_tx.send(piece)));
        let (staged, written) = std::thread::scope(|scope| {
            let (jobs_tx, jobs_rx) = std::sync::mpsc::sync_channel(FEED_QUEUE_PIECES);
            let thread = scope.spawn(move || write_pieces(writer, jobs_rx, spare_tx));
            let staged = self.stage_batches(batches, &mut |ov| feed.offer(ov, false, &jobs_tx, &spare_rx));
            if staged.is_ok() {
                feed.offer(&mut self.overlay, true, &jobs_tx, &spare_rx);
            }
            drop(jobs_tx);
            (staged, thread.join().expect("the load's writer thread does not panic"))
        });
        if let Some(w) = self.writer.as_mut() {
            let empty = |mut piece: AlignedFloats| {
                piece.clear();
                piece
            };
            w.load_pieces = spare_rx.try_iter().take(KEPT_LOAD_PIECES).map(empty).collect();
        }
        let finished = self.finish_load(staged, written, from_index);
        // The checkpoint emptied the overlay, or undid the load, or (a
        // failure after its manifest) the new nodes are read from the data
        // files; a load that failed earlier left nothing staged. Either way
        // no handed-off vector is asked for after this.
        self.overlay.handoff = None;
        finished
    }

    /// After staging: a failed writer thread undoes the load, else the
    /// checkpoint makes the staged batches durable; each batch's result.
    fn finish_load(
        &mut self,
        staged: Result<(Vec<BatchResult>, Vec<Txn>), BankError>,
        written: Result<SegmentWriter, BankError>,
        from_index: u32,
    ) -> Result<Vec<BatchResult>, BankError> {
        let (mut results, staged) = staged?;
        let writer = match written {
            Ok(writer) => writer,
            Err(e) => {
                // As a failed checkpoint: poisoned, and nothing staged stays.
                if let Some(w) = self.writer.as_mut() {
                    w.poisoned = Some(format!("checkpoint failed: {e}"));
                }
                self.unstage_all(staged)?;
                return Err(e);
            }
        };
        let mut acks = self
            .commit_loaded(staged, VectorWrites::Prewritten { from_index, writer })?
            .into_iter();
        for result in results.iter_mut().filter(|r| r.is_ok()) {
            *result = Ok(acks.next().expect("one ack list per staged batch"));
        }
        Ok(results)
    }

    /// Stages each batch on its own, showing the overlay to `staged` as it
    /// grows; each batch's result (an empty ack list for a staged one) and
    /// the staged transactions. A batch whose node is refused fails alone.
    fn stage_batches(
        &mut self,
        batches: &[(&[Change], Option<&[f32]>)],
        staged: &mut dyn FnMut(&mut Overlay),
    ) -> Result<(Vec<BatchResult>, Vec<Txn>), BankError> {
        let mut results = Vec::with_capacity(batches.len());
        let mut txns = Vec::with_capacity(batches.len());
        for &(changes, column) in batches {
            let txn = column
                .map_or(Ok(()), |c| self.check_column(changes, c))
                .and_then(|()| check_loadable(changes, column.is_some()))
                .and_then(|()| self.stage_all_watched(changes, column, false, staged));
            match txn {
                Ok(txn) => txns.push(txn),
                Err(e @ (BankError::BatchItem { .. } | BankError::DimensionMismatch { .. })) => {
                    // Undone: shown at once, so that the watcher knows the
                    // indexes from here on are free before the next batch
                    // fills them.
                    staged(&mut self.overlay);
                    results.push(Err(e));
                    continue;
                }
                Err(e) => {
                    self.unstage_all(txns)?;
                    return Err(e);
                }
            }
            results.push(Ok(Vec::new()));
        }
        Ok((results, txns))
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

    /// Makes staged load batches durable by a checkpoint; their acks, in
    /// order.
    fn commit_loaded(&mut self, txns: Vec<Txn>, writes: VectorWrites) -> Result<Vec<Vec<ChangeAck>>, BankError> {
        if txns.iter().all(|t| t.undo.is_empty()) {
            return Ok(txns.into_iter().map(|t| t.acks).collect());
        }
        let lsn = self.last_lsn();
        // Any failure poisons the bank (the checkpoint's rule); what the
        // handle shows afterwards follows what is on disk.
        match self.checkpoint_reporting(writes) {
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

/// Pieces of vectors waiting for the load's writer thread: enough that
/// it always has the next one, few enough to bound the memory.
const FEED_QUEUE_PIECES: usize = 2;

/// Piece buffers a writer keeps from one load for the next: the queue's,
/// the one being filled and the one being written.
pub(super) const KEPT_LOAD_PIECES: usize = FEED_QUEUE_PIECES + 2;

/// Hands the vectors of a load's staged nodes to its writer thread, in
/// pieces of `SegmentWriter::piece_rows` that end on multiples of it (so
/// each is whole aligned blocks, written around the page cache), as the
/// overlay grows. With a `Handoff` the pending vectors move over whole;
/// otherwise each piece is copied out of the overlay, since the writer
/// thread cannot read the overlay while this thread extends it.
struct Feed {
    piece_rows: u32,
    dim_count: usize,
    /// Without a handoff: the nodes from the load's first up to here were
    /// sent, their vectors as they are now in the overlay.
    sent_end: u32,
    /// The writer thread has stopped (failed): send nothing more.
    stopped: bool,
}

/// One piece for the writer thread: the index of its first node and the
/// vectors of consecutive nodes from there (aligned: a whole piece is
/// written from it as it is).
type Piece = (u32, AlignedFloats);

impl Feed {
    fn new(manifest: &Manifest, from_index: u32) -> Feed {
        Feed {
            piece_rows: SegmentWriter::piece_rows(manifest) as u32,
            dim_count: manifest.dim_count as usize,
            sent_end: from_index,
            stopped: false,
        }
    }

    /// An empty buffer with room for a whole piece: filled node by node, it
    /// would otherwise grow by doubling, copying itself each time.
    fn new_piece(&self) -> AlignedFloats {
        AlignedFloats::with_capacity(self.new_piece_capacity())
    }

    fn new_piece_capacity(&self) -> usize {
        self.piece_rows as usize * self.dim_count
    }

    /// Sends the staged nodes not sent yet, up to the last piece boundary
    /// (`all`: every one). A batch undone after some of its nodes were sent
    /// brings the overlay below what was sent: those indexes are sent
    /// again, with the nodes staged there next, and the later write wins.
    fn offer(&mut self, overlay: &mut Overlay, all: bool, jobs: &SyncSender<Piece>, spare: &Receiver<AlignedFloats>) {
        let total = overlay.total_count();
        let end = match all {
            true => total,
            false => total - total % self.piece_rows,
        };
        let (dim, base) = (self.dim_count, overlay.base_count);
        // A buffer the writer thread is done with: its pages are in use.
        let fresh = self.new_piece_capacity();
        let buffer = || {
            let mut piece = spare.try_recv().unwrap_or_else(|_| AlignedFloats::with_capacity(fresh));
            piece.clear();
            piece
        };
        let piece = match overlay.handoff.as_mut() {
            Some(h) if end > h.pending_from && !self.stopped => {
                let mut piece = buffer();
                let first = h.pending_from;
                match end == total {
                    true => std::mem::swap(&mut piece, &mut h.pending),
                    false => {
                        let sent = (end - first) as usize * dim;
                        piece.extend_from_slice(&h.pending.as_slice()[..sent]);
                        h.pending.remove_front(sent);
                    }
                }
                h.pending_from = end;
                (first, piece)
            }
            Some(_) => return,
            None => {
                self.sent_end = self.sent_end.min(total);
                if end <= self.sent_end || self.stopped {
                    return;
                }
                let at = (self.sent_end - base) as usize * dim;
                let mut piece = buffer();
                piece.extend_from_slice(&overlay.vectors[at..at + (end - self.sent_end) as usize * dim]);
                let first = std::mem::replace(&mut self.sent_end, end);
                (first, piece)
            }
        };
        self.stopped = jobs.send(piece).is_err();
    }
}

/// Whether staging `change` scans the overlay's vectors (auto attach).
fn scans_overlay(change: &Change) -> bool {
    matches!(change, Change::Insert(node) | Change::Import(node, _) if node.attach == crate::Attach::Auto)
}

/// The load's writer thread: writes each piece of vectors at its place,
/// returns the buffers for reuse, and hands back the writer (whose files
/// the checkpoint fsyncs) or the first error.
fn write_pieces(
    mut writer: SegmentWriter,
    jobs: Receiver<Piece>,
    spare: Sender<AlignedFloats>,
) -> Result<SegmentWriter, BankError> {
    for (first, values) in jobs {
        writer.put_vectors(first, values.as_slice())?;
        let _ = spare.send(values);
    }
    Ok(writer)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use crate::format::row::Label;
    use crate::storage::fs::cache_probe::{cached_pages, direct_writes_bypass_the_cache};
    use crate::storage::{AlignedBuf, vector_segment_file};
    use crate::{Attach, Bank, BankConfig, Change, NewNode, OpenOptions};

    /// A load's vectors go around the page cache (where the file system
    /// keeps direct writes out of it), and read back whole.
    #[test]
    fn a_load_leaves_its_vectors_out_of_the_page_cache() {
        const DIM: usize = 1024; // 4 KiB rows: every piece is whole blocks
        const ROWS: usize = 3000; // two pieces of 1,024 rows and a short one
        let dir = tempfile::tempdir().unwrap();
        let mut bank = Bank::create_dir(dir.path(), BankConfig::new(DIM as u32)).unwrap();
        let column: Vec<f32> = (0..ROWS * DIM).map(|i| ((i * 7919) % 1013) as f32 - 500.0).collect();
        let node = |k: usize| NewNode {
            tree: "task".into(),
            attach: Attach::Root,
            label: Label::Success,
            payload: crate::Payload {
                scenario: format!("row {k}"),
                fields: Default::default(),
            },
            embedding: Vec::new(),
            external_id: None,
        };
        let changes: Vec<Change> = (0..ROWS).map(|k| Change::Insert(node(k))).collect();
        bank.load_column(&changes, &column).unwrap();
        let probe = AlignedBuf::new(4096);
        if direct_writes_bypass_the_cache(dir.path(), probe.get()) {
            let cached = cached_pages(&dir.path().join(vector_segment_file(0, 0)));
            assert_eq!(cached, 0, "vector pages in the page cache after a load");
        } else {
            eprintln!("O_DIRECT writes are cached on this file system: only the read-back is checked");
        }
        drop(bank);
        let reopened = Bank::open_dir(dir.path(), OpenOptions::default()).unwrap();
        assert!(reopened.verify().unwrap().problems.is_empty());
        for k in [0, 1023, 1024, 2999] {
            let stored = reopened.vector(k as u32).unwrap();
            let raw = &column[k * DIM..(k + 1) * DIM];
            let norm = raw.iter().map(|x| x * x).sum::<f32>().sqrt();
            let cosine = stored.iter().zip(raw).map(|(s, r)| s * r).sum::<f32>() / norm;
            assert!((cosine - 1.0).abs() < 1e-4, "row {k}: {cosine}");
        }
    }
}

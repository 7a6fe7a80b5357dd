//! Checkpoint: fold the overlay into the data files, then publish a new
//! manifest and start a new WAL generation. See FORMAT.md "Checkpoint".

use super::base::Base;
use super::segment_writer::{SegmentWriter, WRITE_CHUNK_BYTES};
use super::{Bank, BankError};
use crate::format::manifest::Manifest;
use crate::format::wal::WalHeader;
use crate::storage::wal::{WAL_PREALLOCATE_STEP_BYTES, WalWriter};
use crate::storage::{
    MANIFEST_FILE, MANIFEST_TMP_FILE, OpenMode, StorageError, payload_file, replace_atomically_reporting, write_bulk_at,
};

/// How far a failed checkpoint got, for callers whose changes are not in
/// the WAL (a bulk load): did its manifest replace the old one?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Published {
    /// No: the old checkpoint is the state on disk.
    No,
    /// Renamed into place but the directory fsync failed: in force for
    /// this kernel, unknown after a power loss.
    Unknown,
    /// Durable; only starting the new WAL failed.
    Yes,
}

/// How a checkpoint writes its new nodes' vectors.
pub(crate) enum VectorWrites {
    /// Through the page cache: a few new nodes, which queries soon read.
    Cached,
    /// A bulk load's: the vectors of nodes from `from_index` on are
    /// written already (not yet fsynced) by `writer`, a writer thread's,
    /// which writes around the page cache where the file system allows.
    /// Copying gigabytes into freshly allocated cache pages is most of what
    /// a load costs through the cache, and pushes other pages out of
    /// memory; the bank is read back from the disk by its first scan
    /// instead. Those of earlier nodes (committed through the WAL before
    /// the load) go through the cache.
    Prewritten { from_index: u32, writer: SegmentWriter },
}

/// What `Bank::prepare_checkpoint` wrote: the new nodes' payload records,
/// vectors and rows, past the checkpoint's bounds (no reader looks there:
/// readers take those nodes from the overlay) and fsynced. The state it
/// was taken from, so `publish_checkpoint` can tell whether it still holds.
#[derive(Debug)]
#[must_use = "pass it to Bank::publish_checkpoint: a failed prepare must poison the bank"]
pub struct PreparedCheckpoint {
    sequence: u64,
    last_lsn: u64,
    node_count: u32,
    payload_end_bytes: u64,
    /// New segment files were created: the directory needs an fsync.
    created: bool,
}

impl Bank {
    /// Makes everything committed durable in the data files and empties the
    /// WAL. Any failure poisons the bank (the old checkpoint stays valid).
    pub fn checkpoint(&mut self) -> Result<(), BankError> {
        self.checkpoint_reporting(VectorWrites::Cached).map_err(|(e, _)| e)
    }

    /// As `checkpoint`; a failure also says whether the new manifest was
    /// published.
    pub(crate) fn checkpoint_reporting(&mut self, writes: VectorWrites) -> Result<(), (BankError, Published)> {
        let prepared = self.prepare_writing(writes);
        self.publish_reporting(prepared)
    }

    /// The long half of a checkpoint, on a shared borrow so queries can run
    /// beside it (a server holds only its read lock): writes and fsyncs the
    /// new nodes' payload records, vectors and rows past the checkpoint's
    /// bounds (FORMAT.md §7 steps 1-3 for new nodes). Nothing on disk refers
    /// to these bytes until `publish_checkpoint` writes the manifest, and no
    /// reader of this handle reads them before that either.
    /// A failure poisons the bank at once.
    pub fn prepare_checkpoint(&self) -> Result<PreparedCheckpoint, BankError> {
        self.prepare_writing(VectorWrites::Cached)
    }

    fn prepare_writing(&self, writes: VectorWrites) -> Result<PreparedCheckpoint, BankError> {
        self.check_writable()?;
        self.write_new_nodes(writes).inspect_err(|e| {
            let writer = self.writer.as_ref().expect("checked writable");
            let _ = writer.poisoned_shared.set(format!("checkpoint failed: {e}"));
        })
    }

    /// Writes the new nodes' payload records, vectors and rows at their
    /// final places and fsyncs those files. New nodes have consecutive
    /// indexes, so each file gets a few large writes, not one per node (a
    /// bulk load writes 10^5 nodes per checkpoint).
    fn write_new_nodes(&self, writes: VectorWrites) -> Result<PreparedCheckpoint, BankError> {
        let ov = &self.overlay;
        let mut created = false;
        if !ov.rows.is_empty() {
            // How far the write-ahead thread reached (it wrote the vectors
            // of nodes from the base up to there) and its writer, whose
            // files are fsynced below; None without one.
            let ahead = self.finish_ahead()?;
            self.write_payloads()?;
            // A load's writer thread wrote the vectors from `vectors_end`
            // on; this writer writes the rest through the page cache (its
            // writes leave the bytes after them alone, unlike the padded
            // blocks of writes around it).
            let (prewritten, vectors_end) = match writes {
                VectorWrites::Cached => (None, ov.total_count()),
                VectorWrites::Prewritten { from_index, writer } => (Some(writer), from_index),
            };
            assert!((ov.base_count..=ov.total_count()).contains(&vectors_end));
            let vectors_start = ahead.as_ref().map_or(ov.base_count, |(reached, _)| {
                (*reached).clamp(ov.base_count, vectors_end)
            });
            let dim = self.manifest.dim_count as usize;
            let mut segments = SegmentWriter::new(self.storage.clone(), &self.manifest, false);
            segments.put_rows(ov.base_count, &ov.rows)?;
            let vectors = (vectors_start - ov.base_count) as usize * dim..(vectors_end - ov.base_count) as usize * dim;
            segments.put_vectors(vectors_start, &ov.vectors[vectors])?;
            created = segments.sync_all()?;
            for writer in prewritten.into_iter().chain(ahead.map(|(_, writer)| writer)) {
                created |= writer.sync_all()?;
            }
        }
        Ok(PreparedCheckpoint {
            sequence: self.manifest.sequence,
            last_lsn: self.last_lsn(),
            node_count: ov.total_count(),
            payload_end_bytes: ov.payload_end_bytes,
            created,
        })
    }

    /// The short half of a checkpoint, on the exclusive borrow: syncs the
    /// WAL, rewrites changed checkpointed rows in place (readers read those
    /// through the mapping), publishes the manifest, starts the new WAL and
    /// swaps in the new base. If the bank changed since `prepared` was
    /// taken, the new nodes are written again whole (today's checkpoint).
    /// A failed prepare is passed in so that it poisons the bank.
    pub fn publish_checkpoint(&mut self, prepared: Result<PreparedCheckpoint, BankError>) -> Result<(), BankError> {
        self.publish_reporting(prepared).map_err(|(e, _)| e)
    }

    fn publish_reporting(
        &mut self,
        prepared: Result<PreparedCheckpoint, BankError>,
    ) -> Result<(), (BankError, Published)> {
        if let Err(e) = self.check_writable() {
            // Poisoned before, or by the failed prepare: its own error.
            return Err((prepared.err().unwrap_or(e), Published::No));
        }
        let prepared = prepared.map_err(|e| (e, Published::No))?;
        if self.overlay.is_empty() {
            return self.sync().map_err(|e| (e, Published::No));
        }
        self.write_checkpoint(prepared).inspect_err(|(e, _)| {
            if let Some(w) = self.writer.as_mut() {
                w.poisoned = Some(format!("checkpoint failed: {e}"));
            }
        })
    }

    /// Whether `prepared` describes the bank as it is now (no write, load
    /// or checkpoint came between).
    fn still_holds(&self, prepared: &PreparedCheckpoint) -> bool {
        prepared.sequence == self.manifest.sequence
            && prepared.last_lsn == self.last_lsn()
            && prepared.node_count == self.overlay.total_count()
            && prepared.payload_end_bytes == self.overlay.payload_end_bytes
    }

    fn write_checkpoint(&mut self, prepared: PreparedCheckpoint) -> Result<(), (BankError, Published)> {
        let before = |e: BankError| (e, Published::No);
        // WAL before rewriting rows in place: that destroys their old
        // images, so the record holding the new one must be durable first
        // (under `batch`/`none` it may not be yet).
        self.sync().map_err(before)?;
        let storage = self.storage.clone();
        let mut created = prepared.created;
        if !self.still_holds(&prepared) {
            created |= self.write_new_nodes(VectorWrites::Cached).map_err(before)?.created;
        }
        created |= self.write_patched_rows().map_err(before)?;
        if created {
            storage
                .sync_dir()
                .map_err(StorageError::io("fsync directory", storage.describe("")))
                .map_err(|e| before(e.into()))?;
        }
        let last_lsn = self.last_lsn();
        // No record since the last checkpoint (a bulk load writes none):
        // the WAL holds its header only, nothing to retire, so it stays,
        // with its salt and start LSN (step 5 is skipped). Spares a load
        // three of a checkpoint's nine fsyncs.
        let keep_wal = last_lsn == self.manifest.checkpoint_lsn;
        let manifest = Manifest {
            sequence: self.manifest.sequence + 1,
            checkpoint_lsn: last_lsn,
            node_count: u64::from(self.overlay.total_count()),
            payload_end_bytes: self.overlay.payload_end_bytes,
            wal_salt: match keep_wal {
                true => self.manifest.wal_salt,
                false => super::open::new_salt(self.manifest.wal_salt),
            },
            ..self.manifest.clone()
        };
        let renamed =
            replace_atomically_reporting(storage.as_ref(), MANIFEST_FILE, MANIFEST_TMP_FILE, &manifest.encode());
        let failure = match renamed {
            Ok(()) if keep_wal => None,
            // The new manifest is durable: from here on the old WAL is stale.
            Ok(()) => self.start_wal(&manifest).err().map(|e| (e, Published::Yes)),
            Err((e, false)) => return Err((e.into(), Published::No)),
            // Step 5 must wait for a durable rename: no new WAL.
            Err((e, true)) => Some((e.into(), Published::Unknown)),
        };
        // The manifest is in place (for this kernel at least, and the
        // bytes it counts are durable): the handle shows it, from the
        // data files, even when the checkpoint then failed. A bulk load
        // that handed its vectors off has no other copy of them.
        let count = manifest.node_count as u32;
        let trusted = self.base.trusted_after(count);
        self.base = Base::with_trust(storage.clone(), &manifest, &trusted);
        self.overlay.reset(count, manifest.payload_end_bytes);
        self.manifest = manifest;
        self.restart_ahead();
        if let Some(failure) = failure {
            return Err(failure);
        }
        // Everything committed is now in the data files and the new WAL
        // continues the LSN sequence right after it.
        assert!(self.overlay.is_empty() && self.last_lsn() == self.manifest.checkpoint_lsn);
        assert!(!self.writer.as_ref().expect("writer").wal.has_unsynced());
        Ok(())
    }

    /// Step 5: a new WAL, header only, for the checkpoint `manifest`: in
    /// the retired WAL's own file when recycling (`recycle_wals`) and it
    /// is not oversized, else a new file.
    fn start_wal(&mut self, manifest: &Manifest) -> Result<(), BankError> {
        let header = WalHeader {
            salt: manifest.wal_salt,
            start_lsn: manifest.checkpoint_lsn + 1,
        };
        let writer = self.writer.as_mut().expect("writer");
        let most_bytes = writer
            .checkpoint_wal_bytes
            .saturating_mul(2)
            .saturating_add(WAL_PREALLOCATE_STEP_BYTES);
        writer.wal = match writer.recycle_wals && writer.wal.allocated_bytes() <= most_bytes {
            true => writer.wal.recycle(header)?,
            false => WalWriter::create(self.storage.as_ref(), header)?,
        };
        Ok(())
    }

    /// Rewrites the new images of checkpointed rows in place and fsyncs
    /// their segments; returns whether files were created (never, in
    /// practice: these rows' segments exist).
    fn write_patched_rows(&self) -> Result<bool, BankError> {
        let mut segments = SegmentWriter::new(self.storage.clone(), &self.manifest, false);
        for row in self.overlay.patched.values() {
            segments.put_rows(row.index, std::slice::from_ref(row))?;
        }
        segments.sync_all()
    }

    /// Appends the new payload records to the log, in writes of at most
    /// `WRITE_CHUNK_BYTES`, and fsyncs it.
    fn write_payloads(&self) -> Result<(), BankError> {
        let name = payload_file(self.manifest.generation);
        let desc = self.storage.describe(&name);
        let file = self
            .storage
            .open(&name, OpenMode::ReadWrite)
            .map_err(StorageError::io("open", desc.clone()))?;
        let mut at = self.manifest.payload_end_bytes;
        let mut chunk = Vec::new();
        let records = &self.overlay.payloads;
        for (k, record) in records.iter().enumerate() {
            chunk.extend_from_slice(record);
            if chunk.len() >= WRITE_CHUNK_BYTES || k + 1 == records.len() {
                write_bulk_at(file.as_ref(), &chunk, at).map_err(StorageError::io("write", desc.clone()))?;
                at += chunk.len() as u64;
                chunk.clear();
            }
        }
        debug_assert_eq!(at, self.overlay.payload_end_bytes);
        file.sync_data().map_err(StorageError::io("fsync", desc))?;
        Ok(())
    }
}

impl Bank {
    /// Checkpoints (if this is the writer) and releases the lock. Dropping
    /// a bank without `close` loses nothing committed: the WAL holds it.
    /// A poisoned bank reports its poisoning here too: what it committed
    /// since the failure may not be durable.
    pub fn close(mut self) -> Result<(), BankError> {
        if self.writer.is_some() {
            // A closed bank's WAL is its header alone.
            self.recycle_wals(false);
            self.checkpoint()?;
            self.trim_wal()?;
        }
        Ok(())
    }

    /// `close` for a writer whose commits all returned `Ok`: an error only
    /// if they are not all durable. A checkpoint that fails after they were
    /// made durable (during a commit or here) comes back as `Ok(Some(why))`:
    /// the changes are saved and the next open recovers them from the WAL,
    /// so a caller must not repeat them.
    pub fn close_after_commits(mut self) -> Result<Option<String>, BankError> {
        if self.writer.is_none() {
            return self.close().map(|()| None);
        }
        if let Some(why) = self.checkpoint_failure() {
            return Ok(Some(why.to_string()));
        }
        self.sync()?;
        Ok(self.close().err().map(|e| e.to_string()))
    }
}

//! Checkpoint: fold the overlay into the data files, then publish a new
//! manifest and start a new WAL generation. See FORMAT.md "Checkpoint".

use std::ops::Range;
use std::sync::Arc;

use super::base::Base;
use super::kernels::quant::{encode_f16, encode_int8_row};
use super::{Bank, BankError};
use crate::format::manifest::{Manifest, Precision};
use crate::format::row::{ROW_SIZE_BYTES, Row};
use crate::format::wal::WalHeader;
use crate::storage::wal::WalWriter;
use crate::storage::{
    MANIFEST_FILE, MANIFEST_TMP_FILE, OpenMode, StorageError, StorageFile, payload_file, qvector_segment_file,
    replace_atomically_reporting, table_segment_file, vector_segment_file, write_bulk_at,
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
        self.checkpoint_reporting().map_err(|(e, _)| e)
    }

    /// As `checkpoint`; a failure also says whether the new manifest was
    /// published.
    pub(crate) fn checkpoint_reporting(&mut self) -> Result<(), (BankError, Published)> {
        let prepared = self.prepare_checkpoint();
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
        self.check_writable()?;
        self.write_new_nodes().inspect_err(|e| {
            let writer = self.writer.as_ref().expect("checked writable");
            let _ = writer.poisoned_shared.set(format!("checkpoint failed: {e}"));
        })
    }

    /// Writes the new nodes' payload records, vectors and rows at their
    /// final places and fsyncs those files. New nodes have consecutive
    /// indexes, so each file gets a few large writes, not one per node (a
    /// bulk load writes 10^5 nodes per checkpoint).
    fn write_new_nodes(&self) -> Result<PreparedCheckpoint, BankError> {
        let ov = &self.overlay;
        let mut created = false;
        if !ov.rows.is_empty() {
            self.write_payloads()?;
            let mut segments = SegmentWriter::new(self);
            segments.put_rows(ov.base_count, &ov.rows)?;
            segments.put_vectors(ov.base_count, &ov.vectors)?;
            created = segments.sync_all()?;
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
            created |= self.write_new_nodes().map_err(before)?.created;
        }
        created |= self.write_patched_rows().map_err(before)?;
        if created {
            storage
                .sync_dir()
                .map_err(StorageError::io("fsync directory", storage.describe("")))
                .map_err(|e| before(e.into()))?;
        }
        let last_lsn = self.last_lsn();
        let manifest = Manifest {
            sequence: self.manifest.sequence + 1,
            checkpoint_lsn: last_lsn,
            node_count: u64::from(self.overlay.total_count()),
            payload_end_bytes: self.overlay.payload_end_bytes,
            wal_salt: super::open::new_salt(self.manifest.wal_salt),
            ..self.manifest.clone()
        };
        replace_atomically_reporting(storage.as_ref(), MANIFEST_FILE, MANIFEST_TMP_FILE, &manifest.encode()).map_err(
            |(e, renamed)| {
                let published = if renamed { Published::Unknown } else { Published::No };
                (e.into(), published)
            },
        )?;
        // The new manifest is durable: from here on the old WAL is stale.
        let wal = WalWriter::create(
            storage.as_ref(),
            WalHeader {
                salt: manifest.wal_salt,
                start_lsn: last_lsn + 1,
            },
        )
        .map_err(|e| (e.into(), Published::Yes))?;
        let count = manifest.node_count as u32;
        let trusted = self.base.trusted_after(count);
        self.base = Base::with_trust(storage.clone(), &manifest, &trusted);
        self.overlay.reset(count, manifest.payload_end_bytes);
        self.manifest = manifest;
        self.writer.as_mut().expect("writer").wal = wal;
        // Everything committed is now in the data files and the new WAL
        // continues the LSN sequence right after it.
        assert!(self.overlay.is_empty() && self.last_lsn() == self.manifest.checkpoint_lsn);
        assert!(!self.writer.as_ref().expect("writer").wal.has_unsynced());
        Ok(())
    }

    /// Rewrites the new images of checkpointed rows in place and fsyncs
    /// their segments; returns whether files were created (never, in
    /// practice: these rows' segments exist).
    fn write_patched_rows(&self) -> Result<bool, BankError> {
        let mut segments = SegmentWriter::new(self);
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

/// About the largest single write a checkpoint builds in memory (encoded
/// vector chunks round it up to whole 2 MiB blocks, at most twice this;
/// vectors of an f32 bank whose stride has no padding are written from
/// the overlay as is).
const WRITE_CHUNK_BYTES: usize = 4 << 20;

/// Rows per encoded write of `stride_bytes` rows: about
/// `WRITE_CHUNK_BYTES`, rounded up to a whole number of 2 MiB (the huge
/// page size) when that stays under twice as much, so that consecutive
/// chunks from an aligned start keep every write seam on a 2 MiB boundary
/// (see `write_bulk_at`: such writes leave the page cache in large
/// folios). 768-byte f16 rows: 8,192 rows (6 MiB).
fn chunk_rows(stride_bytes: usize) -> usize {
    const HUGE_PAGE_BYTES: usize = 2 << 20;
    let plain = (WRITE_CHUNK_BYTES / stride_bytes).max(1);
    let mut a = stride_bytes;
    let mut b = HUGE_PAGE_BYTES;
    while b != 0 {
        (a, b) = (b, a % b);
    }
    let aligned = HUGE_PAGE_BYTES / a; // rows whose bytes fill whole 2 MiB blocks
    match aligned <= 2 * plain {
        true => plain.div_ceil(aligned) * aligned,
        false => plain,
    }
}

/// Encodes a vector as the vector segments store it into `out` (one row
/// stride, zero padded); returns the bytes used.
pub(crate) fn encode_vector(precision: Precision, vector: &[f32], out: &mut [u8]) -> usize {
    let used = vector.len() * precision.component_bytes() as usize;
    match precision {
        Precision::F16 => encode_f16(vector, &mut out[..used]),
        Precision::F32 | Precision::Int8 => out[..used].copy_from_slice(bytemuck::cast_slice(vector)),
    }
    used
}

/// Splits `count` consecutive nodes from `first` into runs that stay in
/// one segment and hold at most `max_rows`: (segment, first slot, range
/// of positions in the input).
fn segment_runs(first: u32, count: usize, rows_per_segment: u32, max_rows: usize) -> Vec<(u32, u32, Range<usize>)> {
    assert!(rows_per_segment > 0 && max_rows > 0);
    let mut runs = Vec::new();
    let mut done = 0usize;
    while done < count {
        let index = first + done as u32;
        let slot = index % rows_per_segment;
        let len = ((rows_per_segment - slot) as usize).min(count - done).min(max_rows);
        runs.push((index / rows_per_segment, slot, done..done + len));
        done += len;
    }
    runs
}

/// Opens (creating at full size when new) and writes segment files.
struct SegmentWriter<'a> {
    bank: &'a Bank,
    open: std::collections::BTreeMap<String, Arc<dyn StorageFile>>,
    created: bool,
}

impl<'a> SegmentWriter<'a> {
    fn new(bank: &'a Bank) -> SegmentWriter<'a> {
        SegmentWriter {
            bank,
            open: Default::default(),
            created: false,
        }
    }

    fn file(&mut self, name: String, size_bytes: u64) -> Result<Arc<dyn StorageFile>, BankError> {
        if let Some(f) = self.open.get(&name) {
            return Ok(f.clone());
        }
        let storage = &self.bank.storage;
        let desc = storage.describe(&name);
        let exists = storage.exists(&name).map_err(StorageError::io("stat", desc.clone()))?;
        let file = storage
            .open(&name, OpenMode::Create)
            .map_err(StorageError::io("open", desc.clone()))?;
        // Fixed size from birth, so mappings of it never change. A crash
        // can leave a new segment short; no checkpoint refers to it yet.
        if file.len_bytes().map_err(StorageError::io("stat", desc.clone()))? != size_bytes {
            file.set_len(size_bytes).map_err(StorageError::io("size", desc))?;
        }
        self.created |= !exists;
        self.open.insert(name, file.clone());
        Ok(file)
    }

    fn write(&mut self, name: String, size_bytes: u64, bytes: &[u8], offset_bytes: u64) -> Result<(), BankError> {
        let desc = self.bank.storage.describe(&name);
        let file = self.file(name, size_bytes)?;
        write_bulk_at(file.as_ref(), bytes, offset_bytes).map_err(StorageError::io("write", desc))?;
        Ok(())
    }

    /// Writes rows of consecutive indexes from `first`.
    fn put_rows(&mut self, first: u32, rows: &[Row]) -> Result<(), BankError> {
        let rps = self.bank.manifest.rows_per_segment;
        let size = u64::from(rps) * ROW_SIZE_BYTES as u64;
        let mut bytes = Vec::new();
        for (segment, slot, range) in segment_runs(first, rows.len(), rps, WRITE_CHUNK_BYTES / ROW_SIZE_BYTES) {
            bytes.clear();
            for row in &rows[range] {
                bytes.extend_from_slice(&row.encode());
            }
            let name = table_segment_file(self.bank.manifest.generation, segment);
            self.write(name, size, &bytes, u64::from(slot) * ROW_SIZE_BYTES as u64)?;
        }
        Ok(())
    }

    /// Writes the vectors (`dim_count` floats each) of consecutive new
    /// nodes from `first` in the bank's precision, and their int8
    /// side-column rows when the bank has one.
    fn put_vectors(&mut self, first: u32, vectors: &[f32]) -> Result<(), BankError> {
        let bank = self.bank;
        let m = &bank.manifest;
        let (dim, stride) = (m.dim_count as usize, m.row_stride_bytes as usize);
        let count = vectors.len() / dim.max(1);
        let size = u64::from(m.rows_per_segment) * stride as u64;
        let as_is = m.precision != Precision::F16 && stride == dim * 4;
        let qstride = m.precision.qvector_stride_bytes(m.dim_count);
        let mut bytes = Vec::new();
        // Vectors stored as they are need no buffer: one write per segment
        // run, so the runs' seams fall on the batch's edges only.
        let max_rows = match as_is {
            true => usize::MAX,
            false => chunk_rows(stride.max(qstride.unwrap_or(0) as usize)),
        };
        for (segment, slot, range) in segment_runs(first, count, m.rows_per_segment, max_rows) {
            let values = &vectors[range.start * dim..range.end * dim];
            let name = vector_segment_file(m.generation, segment);
            let offset = u64::from(slot) * stride as u64;
            if as_is {
                self.write(name, size, bytemuck::cast_slice(values), offset)?;
            } else {
                bytes.clear();
                bytes.resize(range.len() * stride, 0);
                for (v, out) in values.chunks_exact(dim).zip(bytes.chunks_exact_mut(stride)) {
                    encode_vector(m.precision, v, out);
                }
                self.write(name, size, &bytes, offset)?;
            }
            if let Some(qstride) = qstride {
                let qstride = qstride as usize;
                bytes.clear();
                bytes.resize(range.len() * qstride, 0);
                for (v, out) in values.chunks_exact(dim).zip(bytes.chunks_exact_mut(qstride)) {
                    encode_int8_row(v, out);
                }
                let qsize = u64::from(m.rows_per_segment) * qstride as u64;
                let name = qvector_segment_file(m.generation, segment);
                self.write(name, qsize, &bytes, u64::from(slot) * qstride as u64)?;
            }
        }
        Ok(())
    }

    fn sync_all(self) -> Result<bool, BankError> {
        for (name, file) in &self.open {
            file.sync_data()
                .map_err(StorageError::io("fsync", self.bank.storage.describe(name)))?;
        }
        Ok(self.created)
    }
}

impl Bank {
    /// Checkpoints (if this is the writer) and releases the lock. Dropping
    /// a bank without `close` loses nothing committed: the WAL holds it.
    /// A poisoned bank reports its poisoning here too: what it committed
    /// since the failure may not be durable.
    pub fn close(mut self) -> Result<(), BankError> {
        if self.writer.is_some() {
            self.checkpoint()?;
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

#[cfg(test)]
mod tests {
    use super::{WRITE_CHUNK_BYTES, chunk_rows};

    /// Encoded chunks fill whole 2 MiB blocks when a modest size allows it,
    /// and stay near `WRITE_CHUNK_BYTES` otherwise.
    #[test]
    fn encoded_chunks_fill_whole_huge_pages() {
        const HUGE: usize = 2 << 20;
        for stride in [64usize, 768, 1536, 3072, 4096] {
            let bytes = chunk_rows(stride) * stride;
            assert_eq!(bytes % HUGE, 0, "stride {stride}");
            assert!(
                (WRITE_CHUNK_BYTES..=2 * WRITE_CHUNK_BYTES).contains(&bytes),
                "stride {stride}"
            );
        }
        assert_eq!(chunk_rows(768), 8192);
        // 64 x 255 bytes: whole 2 MiB blocks would take 255 x 2 MiB.
        assert_eq!(chunk_rows(64 * 255), WRITE_CHUNK_BYTES / (64 * 255));
        assert_eq!(chunk_rows(WRITE_CHUNK_BYTES * 3), 1);
    }
}

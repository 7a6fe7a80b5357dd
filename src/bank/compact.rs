//! Freeze (a compacted read-only copy) and compact (rewrite a live bank's
//! data files as a new generation, switched by one manifest replace).
//!
//! Both stream the bank's current state, every node's newest row, its
//! checked vector and its checked payload record, into a fresh set of data
//! files, a segment at a time. Nothing is read past the manifest's bounds,
//! so whatever a crashed checkpoint left there is dropped.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use super::VectorChecks;
use super::kernels::quant::encode_int8_row;
use super::open::new_salt;
use super::segment_writer::encode_vector;
use super::{Bank, BankError, VerifyScope};
use crate::format::manifest::{MANIFEST_FLAG_FROZEN, Manifest, Precision};
use crate::format::payload::check_record;
use crate::format::row::{ROW_SIZE_BYTES, Row};
use crate::format::wal::WalHeader;
use crate::storage::wal::WalWriter;
use crate::storage::{
    AlignedBuf, DIRECT_ALIGN_BYTES, FileStorage, MANIFEST_FILE, MANIFEST_TMP_FILE, OpenMode, Storage, StorageError,
    StorageFile, WAL_FILE, WAL_TMP_FILE, data_file_generation, payload_file, qvector_segment_file, replace_atomically,
    table_segment_file, vector_segment_file, write_bulk_at,
};

#[derive(Debug, Clone, PartialEq)]
pub struct FreezeReport {
    pub nodes: u64,
    pub bytes_written: u64,
    pub out: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CompactReport {
    pub nodes: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub generation: u32,
}

/// What `write_generation` produced.
struct Written {
    payload_end_bytes: u64,
    bytes_written: u64,
}

/// Segment files written but not yet fsynced (and so held open) at most;
/// bounds open descriptors, not memory (the page cache holds the data).
const MAX_UNSYNCED_FILES: usize = 96;

/// Payload bytes are written in chunks of this size.
const PAYLOAD_CHUNK_BYTES: usize = 8 * 1024 * 1024;

impl Bank {
    /// Writes a compacted, fully checkpointed, read-only copy of this bank
    /// to `out_dir`, which must not exist. It is built in the sibling work
    /// directory `OUT.freezing` (marked as the engine's own by a `FREEZING`
    /// file) and renamed into place, so `out_dir` appears complete or not
    /// at all. Works from a reader or a writer (not a poisoned one).
    pub fn freeze_to(&self, out_dir: &Path) -> Result<FreezeReport, BankError> {
        self.freeze_to_checked(out_dir, VerifyScope::SkipVectorColumns)
    }

    /// `freeze_to`, with the copy read back and verified over `scope`
    /// before it is renamed into place (`SkipVectorColumns`: the vectors
    /// were checked in memory as they were copied). A copy that does not
    /// verify is removed, so `out_dir` never holds one.
    pub fn freeze_to_checked(&self, out_dir: &Path, scope: VerifyScope) -> Result<FreezeReport, BankError> {
        let out = out_dir.display().to_string();
        refuse_existing_target(out_dir)?;
        let name = out_dir
            .file_name()
            .ok_or_else(|| BankError::BadConfig(format!("{out} has no file name")))?;
        let tmp = out_dir.with_file_name(format!("{}.freezing", name.to_string_lossy()));
        let io = |op| StorageError::io(op, tmp.display().to_string());
        remove_own_work_dir(&tmp)?;
        // Created here, not found: a directory that appeared at the name
        // since (a second freeze to the same OUT) is not ours to empty.
        if let Some(parent) = tmp.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(io("create the parent directory"))?;
        }
        std::fs::create_dir(&tmp).map_err(io("create directory"))?;
        let target = FileStorage::new(&tmp);
        let built = self
            .freeze_into(&target)
            .and_then(|report| make_read_only(&tmp).map(|()| report));
        let mut report = settle(&tmp, out_dir, built, scope)?;
        report.out = out;
        Ok(report)
    }

    /// Writes the frozen copy into `target`, an empty store, every file
    /// operation through the `Storage` trait (so the crash simulator runs
    /// it). The `FREEZING` mark is written first and removed last; the
    /// manifest's atomic replace is the commit point. After a crash the
    /// store holds the mark (unfinished work of the engine's, safe to
    /// delete) or a complete frozen bank.
    pub fn freeze_into(&self, target: &dyn Storage) -> Result<FreezeReport, BankError> {
        // A poisoned writer may show changes whose fsync failed; a copy
        // must not make durable what the bank itself may have lost.
        if let Some(reason) = self.writer.as_ref().and_then(|w| w.poison_reason().cloned()) {
            return Err(BankError::Poisoned(reason));
        }
        self.refuse_damaged("freeze")?;
        let present = target.list().map_err(StorageError::io("list", target.describe("")))?;
        if !present.is_empty() {
            return Err(BankError::BadConfig(format!(
                "{} must be empty to freeze into, it holds {}",
                target.describe(""),
                present.join(", ")
            )));
        }
        create_file(target, FREEZING_MARK_FILE, 0, OpenMode::Create)?;
        target
            .sync_dir()
            .map_err(StorageError::io("fsync directory", target.describe("")))?;
        let written = self.write_generation(target, 0, CopyKind::Frozen)?;
        let salt = new_salt(self.manifest.wal_salt);
        WalWriter::create(target, WalHeader { salt, start_lsn: 1 })?;
        let manifest = Manifest {
            version: crate::format::FORMAT_VERSION,
            sequence: 1,
            flags: MANIFEST_FLAG_FROZEN,
            generation: 0,
            checkpoint_lsn: 0,
            node_count: u64::from(self.node_count()),
            payload_end_bytes: written.payload_end_bytes,
            wal_salt: salt,
            ..self.manifest.clone()
        };
        replace_atomically(target, MANIFEST_FILE, MANIFEST_TMP_FILE, &manifest.encode())?;
        target
            .remove(FREEZING_MARK_FILE)
            .and_then(|()| target.sync_dir())
            .map_err(StorageError::io("remove", target.describe(FREEZING_MARK_FILE)))?;
        Ok(FreezeReport {
            nodes: manifest.node_count,
            bytes_written: written.bytes_written,
            out: target.describe(""),
        })
    }

    /// Rewrites the data files as the next generation and switches to it
    /// by replacing the manifest; then deletes the old generation. A crash
    /// before the switch leaves the old bank as it was, after it the new
    /// one; leftover files of other generations are removed at the next
    /// writer open.
    pub fn compact(&mut self) -> Result<CompactReport, BankError> {
        self.check_writable()?;
        // Any I/O failure poisons, as everywhere else: simpler to reason
        // about than telling harmless failures (new files only) apart. So
        // does damage found: a later checkpoint (at close) would write over
        // some of it and leave the bank looking sound.
        self.compact_inner().inspect_err(|e| {
            if matches!(e, BankError::Storage(_) | BankError::Corrupt { .. }) {
                self.poison(format!("compact failed: {e}"));
            }
        })
    }

    fn compact_inner(&mut self) -> Result<CompactReport, BankError> {
        // Before the checkpoint, which would write over some damage (a
        // segment of the wrong size, a gap in the payload log) and so
        // change the bank it then refuses.
        self.refuse_damaged("compact")?;
        self.base.release_vector_maps();
        self.checkpoint()?;
        let storage = self.storage.clone();
        let bytes_before = self.data_file_bytes()?;
        let generation = self.manifest.generation + 1;
        self.remove_data_files(|g| g == generation)?;
        let written = self.write_generation(storage.as_ref(), generation, CopyKind::Live)?;
        let manifest = Manifest {
            // The rewrite gives every row its lane sums: compact upgrades
            // a format-1 bank.
            version: crate::format::FORMAT_VERSION,
            sequence: self.manifest.sequence + 1,
            generation,
            payload_end_bytes: written.payload_end_bytes,
            ..self.manifest.clone()
        };
        replace_atomically(storage.as_ref(), MANIFEST_FILE, MANIFEST_TMP_FILE, &manifest.encode())?;
        let trusted = vec![true; manifest.node_count.div_ceil(u64::from(manifest.rows_per_segment)) as usize];
        self.base = super::base::Base::with_trust(storage.clone(), &manifest, &trusted);
        self.manifest = manifest;
        // Writes ahead now go to the new generation's files.
        self.restart_ahead();
        self.remove_data_files(|g| g != generation)?;
        Ok(CompactReport {
            nodes: self.manifest.node_count,
            bytes_before,
            bytes_after: self.data_file_bytes()?,
            generation,
        })
    }

    /// Refuses, naming the first problem, a bank that `verify` finds
    /// damaged. A copy checks only what it reads (a vector against its
    /// CRC, a payload record's framing), so it carried the rest of the
    /// damage over (a dangling link, a wrong depth, a vector off the unit
    /// sphere, a manifest that lost a node) under fresh checksums, where
    /// no later `verify` could see it. The cost is a full `verify` (every
    /// vector's CRC, norm and int8 row, every payload decoded), after
    /// which the copy reads the bank again from the page cache: on 1M x
    /// 768 f32, compact took 1.14x its time without it (median of four
    /// paired rounds, 2.71 s against 2.23 s).
    ///
    /// An int8 row that differs from its f32 vector is let through: the
    /// row is derived, and the copy derives every one afresh from the f32
    /// vector it has just checked (`SegmentColumns::put_stored`), so the
    /// copy is sound where the bank was not. That is the way out of a
    /// damaged int8 column short of an export and a new import. Only that
    /// problem: an int8 file that is missing or of the wrong size fails
    /// its segment's mapping, which hides the f32 checks of the segment.
    fn refuse_damaged(&self, what: &str) -> Result<(), BankError> {
        let mut report = self.verify()?;
        report
            .problems
            .retain(|p| !p.detail.starts_with(super::base::INT8_ROW_DIFFERS));
        first_problem(
            &report,
            &format!(
                ", `deltamem verify` lists them); {what} refuses a damaged bank: its copy would carry the damage \
                 over under fresh checksums"
            ),
        )
    }

    pub(crate) fn poison(&mut self, reason: String) {
        if let Some(w) = self.writer.as_mut() {
            w.poisoned = Some(reason);
        }
    }

    /// Removes data files whose generation matches `doomed` (writer only:
    /// readers never delete). Used by compact and at writer open.
    pub(crate) fn remove_data_files(&self, doomed: impl Fn(u32) -> bool) -> Result<(), BankError> {
        let storage = self.storage.as_ref();
        let names = storage.list().map_err(StorageError::io("list", storage.describe("")))?;
        let mut removed = false;
        for name in names.iter().filter(|n| data_file_generation(n).is_some_and(&doomed)) {
            storage
                .remove(name)
                .map_err(StorageError::io("remove", storage.describe(name)))?;
            removed = true;
        }
        if removed {
            storage
                .sync_dir()
                .map_err(StorageError::io("fsync directory", storage.describe("")))?;
        }
        Ok(())
    }

    /// Bytes of all data files on disk (every generation present).
    fn data_file_bytes(&self) -> Result<u64, BankError> {
        let storage = self.storage.as_ref();
        let mut total = 0;
        for name in storage.list().map_err(StorageError::io("list", storage.describe("")))? {
            if data_file_generation(&name).is_some() {
                let file = storage
                    .open(&name, OpenMode::Read)
                    .map_err(StorageError::io("open", storage.describe(&name)))?;
                total += file
                    .len_bytes()
                    .map_err(StorageError::io("stat", storage.describe(&name)))?;
            }
        }
        Ok(total)
    }

    /// Streams the current state into generation `generation` of `target`
    /// and fsyncs it (files and directory). Checkpointed nodes are copied
    /// as stored: each segment's vectors in one read, each vector checked
    /// against its row's CRC before it is kept, payload records read back
    /// to back in large reads and checked; only overlay nodes (and int8
    /// side rows) are encoded. Two stages on two threads: this one builds
    /// segment columns and payload chunks (reads and checks), a writer
    /// thread writes them, in the order built, so the file operations form
    /// the same sequence every run (the crash simulator numbers them).
    /// Memory: two segments' columns and 8 MiB payload chunks, whatever
    /// the bank's size.
    fn write_generation(&self, target: &dyn Storage, generation: u32, copy: CopyKind) -> Result<Written, BankError> {
        let payload_name = payload_file(generation);
        let payloads = create_file(target, &payload_name, 0, OpenMode::Create)?;
        std::thread::scope(|scope| {
            let (jobs, job_rx) = std::sync::mpsc::sync_channel(1);
            let (free_tx, free) = std::sync::mpsc::channel();
            let writer = GenerationWriter {
                target,
                generation,
                copy,
                payload_name: &payload_name,
                payloads: payloads.as_ref(),
            };
            let written = scope.spawn(move || writer.run(job_rx, free_tx));
            let built = self.build_generation(copy, &jobs, &free);
            drop(jobs); // the writer then finishes and syncs
            let written = written.join().expect("the generation writer does not panic");
            // A damaged source is the cause to report; a failed write makes
            // the builder stop with nothing to say.
            let payload_end_bytes = built?;
            let written = written?;
            assert_eq!(
                written.payload_end_bytes, payload_end_bytes,
                "every payload chunk written"
            );
            Ok(written)
        })
    }

    /// The building stage of `write_generation`: sends each segment's
    /// columns and each payload chunk to the writer, in order; returns the
    /// payload bytes sent. Stops early (Ok) when the writer has stopped.
    fn build_generation(
        &self,
        copy: CopyKind,
        jobs: &std::sync::mpsc::SyncSender<WriteJob>,
        free: &std::sync::mpsc::Receiver<SegmentColumns>,
    ) -> Result<u64, BankError> {
        let rows_per_segment = self.manifest.rows_per_segment;
        let mut chunks = PayloadChunks::default();
        let mut spare = Some(SegmentColumns::new(&self.manifest));
        for segment in 0..self.node_count().div_ceil(rows_per_segment) {
            // Two sets of columns: one written while the other is built.
            let mut columns = match spare.take() {
                Some(c) => c,
                None if segment == 1 => SegmentColumns::new(&self.manifest),
                None => match free.recv() {
                    Ok(c) => c,
                    Err(_) => return Ok(chunks.sent_bytes), // the writer stopped
                },
            };
            let first = segment * rows_per_segment;
            let last = (first + rows_per_segment).min(self.node_count());
            if !self.build_segment(copy, segment, first..last, &mut columns, &mut chunks, jobs)? {
                return Ok(chunks.sent_bytes);
            }
            if jobs.send(WriteJob::Segment(columns, segment)).is_err() {
                return Ok(chunks.sent_bytes);
            }
        }
        chunks.send_rest(jobs);
        Ok(chunks.sent_bytes)
    }

    /// Builds one segment's columns (rows `rows`), sending full payload
    /// chunks on the way; false when the writer has stopped.
    fn build_segment(
        &self,
        copy: CopyKind,
        segment: u32,
        rows: std::ops::Range<u32>,
        columns: &mut SegmentColumns,
        chunks: &mut PayloadChunks,
        jobs: &std::sync::mpsc::SyncSender<WriteJob>,
    ) -> Result<bool, BankError> {
        let first = rows.start;
        let rows = rows.map(|i| self.row(i)).collect::<Result<Vec<_>, _>>()?;
        let stored_count = (self.base.node_count.clamp(first, first + rows.len() as u32) - first) as usize;
        let (stored, fresh) = rows.split_at(stored_count);
        columns.start(rows.len());
        let source = match stored.is_empty() {
            true => None,
            false => Some(
                self.base
                    .read_vectors(segment, columns.stored_vectors_mut(stored.len()))?,
            ),
        };
        let mut open = true;
        self.base.for_each_payload_record(stored, |row, record| {
            let record = self.checked_record(row, record?)?;
            let slot = (row.index - first) as usize;
            self.base
                .check_vector_crc(row.index, row.vector_crc32, columns.stored_vector(slot))?;
            let mut row = row.clone();
            row.payload_offset_bytes = chunks.offset_bytes();
            columns.put_stored(slot, &row, self.manifest.version);
            open &= chunks.push(record, jobs);
            Ok(())
        })?;
        for row in fresh {
            let mut row = row.clone();
            let record = self.checked_record(&row, self.overlay.payload_record(row.index))?;
            row.payload_offset_bytes = chunks.offset_bytes();
            columns.put((row.index - first) as usize, &row, self.overlay.vector(row.index));
            open &= chunks.push(record, jobs);
        }
        if let (CopyKind::Live, Some(source)) = (copy, source) {
            // The old generation is deleted once the new one is in place:
            // its copied pages can make room for the new ones. A hint.
            source.drop_cache(0, self.base.vector_segment_size_bytes());
        }
        Ok(open)
    }

    /// A node's payload record, framing and CRC checked.
    fn checked_record<'a>(&self, row: &Row, record: &'a [u8]) -> Result<&'a [u8], BankError> {
        check_record(record, row.index).map_err(|e| BankError::Corrupt {
            file: self.storage.describe(&payload_file(self.manifest.generation)),
            offset_bytes: row.payload_offset_bytes + e.offset_bytes(),
            detail: e.to_string(),
        })?;
        Ok(record)
    }
}

/// Refuses a writer's open while a file of the manifest's generation that
/// its nodes need is missing. A writer would recreate it or extend it with
/// zeros (a missing segment became one of zeros, its nodes' vectors
/// "damaged", and putting the file back would then lose the new rows). And
/// when files of another generation are present (what a crashed compact
/// left, which the open then deletes), the manifest is what is damaged,
/// and the other generation may hold the bank's only data (a forged one
/// made every writer open delete it). Checked before the WAL is replayed,
/// whose checks read the data files.
pub(crate) fn refuse_missing_live_files(storage: &dyn Storage, manifest: &Manifest) -> Result<(), BankError> {
    let live = manifest.generation;
    let names = storage.list().map_err(StorageError::io("list", storage.describe("")))?;
    let segments = manifest.node_count.div_ceil(u64::from(manifest.rows_per_segment)) as u32;
    let int8 = manifest.precision == Precision::Int8;
    let mut needed = std::iter::once(payload_file(live)).chain((0..segments).flat_map(|s| {
        let quant = int8.then(|| qvector_segment_file(live, s));
        [table_segment_file(live, s), vector_segment_file(live, s)]
            .into_iter()
            .chain(quant)
    }));
    let Some(missing) = needed.find(|name| !names.contains(name)) else {
        return Ok(());
    };
    let others = names.iter().any(|n| data_file_generation(n).is_some_and(|g| g != live));
    let kept = match others {
        true => "; the files of other generations are kept (nothing was deleted)",
        false => "; nothing was written (restore the file, or export what reads and import it anew)",
    };
    Err(BankError::Corrupt {
        file: storage.describe(MANIFEST_FILE),
        offset_bytes: crate::format::manifest::MAN_GENERATION_OFFSET as u64,
        detail: format!("the manifest names generation {live}, but its file {missing} is missing{kept}"),
    })
}

/// Where a generation's segment files are written.
#[derive(Clone, Copy, PartialEq)]
enum CopyKind {
    /// Compact: through the page cache, since the new files are the live
    /// bank's from the switch on. Each old segment is dropped from the
    /// cache once copied, so the copy reuses its memory instead of
    /// claiming as much again.
    Live,
    /// Freeze: around the page cache where the file system allows. No one
    /// reads a frozen copy soon, and the copy does not push the live
    /// bank's pages out of memory.
    Frozen,
}

/// One segment's node table, vector column and (int8 banks) side column,
/// built in memory and written whole. The buffers hold a full segment
/// and serve every segment in turn.
struct SegmentColumns {
    precision: Precision,
    stride: usize,
    qstride: usize,
    /// Bytes of one stored vector (the stride holds padding after it).
    vector_bytes: usize,
    /// Rows of the segment being built.
    rows: usize,
    table: AlignedBuf,
    vectors: AlignedBuf,
    quant: AlignedBuf,
}

impl SegmentColumns {
    fn new(m: &Manifest) -> SegmentColumns {
        let stride = m.row_stride_bytes as usize;
        let qstride = m.precision.qvector_stride_bytes(m.dim_count).unwrap_or(0) as usize;
        let rows = m.rows_per_segment as usize;
        SegmentColumns {
            precision: m.precision,
            stride,
            qstride,
            vector_bytes: (m.dim_count * m.precision.component_bytes()) as usize,
            rows: 0,
            table: AlignedBuf::new(rows * ROW_SIZE_BYTES),
            vectors: AlignedBuf::new(rows * stride),
            quant: AlignedBuf::new(rows * qstride),
        }
    }

    /// Starts a segment of `rows` rows. Every slot below `rows` is then
    /// written in full (row, vector, padding); the bytes past it are
    /// zeroed, as the file holds zeros there.
    fn start(&mut self, rows: usize) {
        self.rows = rows;
        self.table.get_mut()[rows * ROW_SIZE_BYTES..].fill(0);
        self.vectors.get_mut()[rows * self.stride..].fill(0);
        let qstride = self.qstride;
        self.quant.get_mut()[rows * qstride..].fill(0);
    }

    /// Where the first `rows` stored vectors are read to, whole strides.
    fn stored_vectors_mut(&mut self, rows: usize) -> &mut [u8] {
        &mut self.vectors.get_mut()[..rows * self.stride]
    }

    /// The stored bytes of slot `slot`'s vector (without its padding).
    fn stored_vector(&self, slot: usize) -> &[u8] {
        &self.vectors.get()[slot * self.stride..slot * self.stride + self.vector_bytes]
    }

    fn put(&mut self, slot: usize, row: &Row, vector: &[f32]) {
        let slot_bytes = &mut self.vectors.get_mut()[slot * self.stride..(slot + 1) * self.stride];
        let used = encode_vector(self.precision, vector, slot_bytes);
        slot_bytes[used..].fill(0);
        if self.qstride > 0 {
            encode_int8_row(
                vector,
                &mut self.quant.get_mut()[slot * self.qstride..(slot + 1) * self.qstride],
            );
        }
        self.put_row(slot, row, true);
    }

    /// As `put`, for a vector read as stored into its slot (and checked).
    /// A current-format row already holds the checks of those bytes; a
    /// format-1 row gains its lane sums, an int8 side row is derived.
    fn put_stored(&mut self, slot: usize, row: &Row, version: u32) {
        let slot_bytes = &mut self.vectors.get_mut()[slot * self.stride..(slot + 1) * self.stride];
        slot_bytes[self.vector_bytes..].fill(0);
        if self.qstride > 0 {
            let vector: Vec<f32> = bytemuck::pod_collect_to_vec(self.stored_vector(slot));
            encode_int8_row(
                &vector,
                &mut self.quant.get_mut()[slot * self.qstride..(slot + 1) * self.qstride],
            );
        }
        let recompute = version < crate::format::FORMAT_VERSION || self.qstride > 0;
        self.put_row(slot, row, recompute);
    }

    /// Encodes `row` into its slot, with the check fields of the current
    /// format taken from the column bytes just written when `recompute`.
    fn put_row(&mut self, slot: usize, row: &Row, recompute: bool) {
        let mut row = row.clone();
        if recompute {
            let qrow = (self.qstride > 0).then(|| &self.quant.get()[slot * self.qstride..(slot + 1) * self.qstride]);
            let checks = VectorChecks::of_stored(crate::format::FORMAT_VERSION, self.stored_vector(slot), qrow);
            debug_assert_eq!(checks.crc32, row.vector_crc32, "the vector was checked before the copy");
            checks.set_in(&mut row);
        }
        self.table.get_mut()[slot * ROW_SIZE_BYTES..(slot + 1) * ROW_SIZE_BYTES].copy_from_slice(&row.encode());
    }

    /// Writes the segment's files (fsynced later, see `sync_files`);
    /// returns the bytes written.
    fn write(
        &self,
        target: &dyn Storage,
        generation: u32,
        segment: u32,
        copy: CopyKind,
        written: &mut Vec<(String, Arc<dyn StorageFile>)>,
    ) -> Result<u64, BankError> {
        let mode = match copy {
            CopyKind::Live => OpenMode::Create,
            CopyKind::Frozen => OpenMode::CreateUncached,
        };
        let columns = [
            (table_segment_file(generation, segment), &self.table, ROW_SIZE_BYTES),
            (vector_segment_file(generation, segment), &self.vectors, self.stride),
            (qvector_segment_file(generation, segment), &self.quant, self.qstride),
        ];
        let mut total_bytes = 0;
        for (name, buf, unit_bytes) in columns.iter().filter(|c| c.2 > 0) {
            let used_bytes = self.rows * unit_bytes;
            // Whole aligned blocks (zeros past the rows, as in the file)
            // so a direct write takes the last block too.
            let write_bytes = used_bytes.next_multiple_of(DIRECT_ALIGN_BYTES).min(buf.len());
            write_segment(target, name, buf.len() as u64, &buf.get()[..write_bytes], mode, written)?;
            total_bytes += used_bytes as u64;
        }
        Ok(total_bytes)
    }
}

fn create_file(
    target: &dyn Storage,
    name: &str,
    size_bytes: u64,
    mode: OpenMode,
) -> Result<Arc<dyn StorageFile>, BankError> {
    let file = target
        .open(name, mode)
        .map_err(StorageError::io("create", target.describe(name)))?;
    file.set_len(size_bytes)
        .map_err(StorageError::io("size", target.describe(name)))?;
    Ok(file)
}

/// Creates and writes a segment file; the caller fsyncs it (`sync_files`).
fn write_segment(
    target: &dyn Storage,
    name: &str,
    size_bytes: u64,
    bytes: &[u8],
    mode: OpenMode,
    written: &mut Vec<(String, Arc<dyn StorageFile>)>,
) -> Result<(), BankError> {
    let file = create_file(target, name, size_bytes, mode)?;
    write_bulk_at(file.as_ref(), bytes, 0).map_err(StorageError::io("write", target.describe(name)))?;
    written.push((name.to_string(), file));
    Ok(())
}

/// fdatasyncs every file written. Done once after all segments, not per
/// segment: the writes then stream to the disk back to back while the
/// next segment is built (an fsync per file made freeze and compact wait
/// for each 50 MB write, ~0.15x the disk's sequential speed). Nothing
/// refers to these files before the manifest written after this call.
fn sync_files(target: &dyn Storage, written: &[(String, Arc<dyn StorageFile>)]) -> Result<(), BankError> {
    for (name, file) in written {
        file.sync_data()
            .map_err(StorageError::io("fsync", target.describe(name)))?;
    }
    Ok(())
}

/// What the building stage hands the writer, in file-operation order.
enum WriteJob {
    /// A segment's columns, written whole, then handed back for reuse.
    Segment(SegmentColumns, u32),
    /// The next chunk of the payload log.
    Payload(Vec<u8>),
}

/// Payload records gathered into chunks of `PAYLOAD_CHUNK_BYTES`.
#[derive(Default)]
struct PayloadChunks {
    pending: Vec<u8>,
    /// Bytes already sent to the writer.
    sent_bytes: u64,
}

impl PayloadChunks {
    /// Where the next record lands in the new payload log.
    fn offset_bytes(&self) -> u64 {
        self.sent_bytes + self.pending.len() as u64
    }

    /// Adds a record, sending the chunk once full; false when the writer
    /// has stopped.
    fn push(&mut self, record: &[u8], jobs: &std::sync::mpsc::SyncSender<WriteJob>) -> bool {
        self.pending.extend_from_slice(record);
        self.pending.len() < PAYLOAD_CHUNK_BYTES || self.send_rest(jobs)
    }

    /// Sends what is gathered; false when the writer has stopped.
    fn send_rest(&mut self, jobs: &std::sync::mpsc::SyncSender<WriteJob>) -> bool {
        if self.pending.is_empty() {
            return true;
        }
        let chunk = std::mem::take(&mut self.pending);
        self.sent_bytes += chunk.len() as u64;
        jobs.send(WriteJob::Payload(chunk)).is_ok()
    }
}

/// The writing stage of `write_generation`.
struct GenerationWriter<'a> {
    target: &'a dyn Storage,
    generation: u32,
    copy: CopyKind,
    payload_name: &'a str,
    payloads: &'a dyn StorageFile,
}

impl GenerationWriter<'_> {
    /// Writes every job in order, then fsyncs the files and the directory.
    /// Stops at the first failure (the builder then sees a closed channel).
    fn run(
        self,
        jobs: std::sync::mpsc::Receiver<WriteJob>,
        free: std::sync::mpsc::Sender<SegmentColumns>,
    ) -> Result<Written, BankError> {
        let target = self.target;
        let mut out = Written {
            payload_end_bytes: 0,
            bytes_written: 0,
        };
        let mut written = Vec::new();
        for job in jobs {
            match job {
                WriteJob::Payload(chunk) => {
                    write_bulk_at(self.payloads, &chunk, out.payload_end_bytes)
                        .map_err(StorageError::io("write", target.describe(self.payload_name)))?;
                    out.payload_end_bytes += chunk.len() as u64;
                    out.bytes_written += chunk.len() as u64;
                }
                WriteJob::Segment(columns, segment) => {
                    out.bytes_written += columns.write(target, self.generation, segment, self.copy, &mut written)?;
                    let _ = free.send(columns); // the builder may be done
                    if written.len() >= MAX_UNSYNCED_FILES {
                        sync_files(target, &written)?;
                        written.clear();
                    }
                }
            }
        }
        sync_files(target, &written)?;
        self.payloads
            .sync_data()
            .map_err(StorageError::io("fsync", target.describe(self.payload_name)))?;
        target
            .sync_dir()
            .map_err(StorageError::io("fsync directory", target.describe("")))?;
        Ok(out)
    }
}

/// The file that marks a directory as an unfinished freeze of the engine's.
pub const FREEZING_MARK_FILE: &str = "FREEZING";

/// Says precisely why `out_dir` cannot be frozen into, if it exists.
fn refuse_existing_target(out_dir: &Path) -> Result<(), BankError> {
    let path = out_dir.display().to_string();
    let meta = match std::fs::symlink_metadata(out_dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StorageError::io("stat", path)(e).into()),
        Ok(meta) => meta,
    };
    let why = if !meta.is_dir() {
        "is a file, not a directory; freeze creates OUT itself"
    } else if out_dir.join(MANIFEST_FILE).exists() {
        return Err(BankError::AlreadyExists { path });
    } else if std::fs::read_dir(out_dir).is_ok_and(|mut d| d.next().is_none()) {
        "is an empty directory; freeze creates OUT itself (remove it, or name a new path)"
    } else {
        "is a directory that is not a bank; freeze never writes into existing directories"
    };
    Err(BankError::BadConfig(format!("{path} {why}")))
}

/// Removes an unfinished freeze's work directory, but only one the engine
/// made (it holds the `FREEZING` mark) and only the files a freeze writes;
/// anything else in it stays, and the freeze is refused.
fn remove_own_work_dir(tmp: &Path) -> Result<(), BankError> {
    let desc = tmp.display().to_string();
    if !tmp.exists() || std::fs::remove_dir(tmp).is_ok() {
        return Ok(()); // absent, or empty (a crash before the mark): nothing lost
    }
    if !tmp.join(FREEZING_MARK_FILE).is_file() {
        return Err(BankError::BadConfig(format!(
            "{desc} exists and is not an unfinished freeze (no {FREEZING_MARK_FILE} mark); remove it yourself"
        )));
    }
    let leftover = FileStorage::new(tmp);
    let names = leftover.list().map_err(StorageError::io("list", desc.clone()))?;
    let ours = |n: &str| {
        data_file_generation(n).is_some()
            || [
                MANIFEST_FILE,
                MANIFEST_TMP_FILE,
                WAL_FILE,
                WAL_TMP_FILE,
                FREEZING_MARK_FILE,
            ]
            .contains(&n)
    };
    for name in names.iter().filter(|n| ours(n) && n.as_str() != FREEZING_MARK_FILE) {
        leftover
            .remove(name)
            .map_err(StorageError::io("remove", leftover.describe(name)))?;
    }
    // The mark goes last: until then a retry still knows the directory.
    leftover
        .remove(FREEZING_MARK_FILE)
        .map_err(StorageError::io("remove", leftover.describe(FREEZING_MARK_FILE)))?;
    std::fs::remove_dir(tmp)
        .map_err(|e| BankError::BadConfig(format!("{desc} holds files a freeze does not write, kept: {e}")))
}

/// Reads a built copy in `tmp` back and renames it to `out_dir`; a failed
/// build, or a copy that does not read back, takes its work directory
/// away instead: it held up to a whole bank's worth of space until the
/// next freeze to the same OUT. The mark is put back first (a finished
/// copy has none), so only the engine's own files go. The error is the
/// freeze's.
fn settle(
    tmp: &Path,
    out_dir: &Path,
    built: Result<FreezeReport, BankError>,
    scope: VerifyScope,
) -> Result<FreezeReport, BankError> {
    let io = |op| StorageError::io(op, tmp.display().to_string());
    // The mark is back for the read-back (a finished copy has none): a
    // crash during it leaves work the next freeze may clear, not an
    // unmarked copy it refuses to touch. On failure, only the engine's own
    // files go.
    let marked = |report| {
        std::fs::write(tmp.join(FREEZING_MARK_FILE), b"")
            .map(|()| report)
            .map_err(|e| BankError::from(io("mark")(e)))
    };
    let report = built
        .and_then(marked)
        .and_then(|report| read_back(tmp, scope).map(|()| report))
        .and_then(|report| {
            std::fs::remove_file(tmp.join(FREEZING_MARK_FILE))
                .map(|()| report)
                .map_err(|e| io("remove the mark")(e).into())
        })
        .inspect_err(|_| {
            let _ = std::fs::write(tmp.join(FREEZING_MARK_FILE), b"");
            let _ = remove_own_work_dir(tmp);
        })?;
    std::fs::rename(tmp, out_dir).map_err(io("rename"))?;
    let parent = out_dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::File::open(parent)
        .and_then(|d| d.sync_all())
        .map_err(io("fsync parent directory"))?;
    Ok(report)
}

/// Opens the finished copy in `dir` read-only and verifies it over
/// `scope`: what was written is what reads back. The bytes come from the
/// page cache just written, so this catches a copy written wrong (a bug,
/// a file system that failed silently), not a disk that loses it later.
fn read_back(dir: &Path, scope: VerifyScope) -> Result<(), BankError> {
    let options = super::OpenOptions {
        read_only: true,
        ..super::OpenOptions::default()
    };
    let copy = Bank::open(Arc::new(FileStorage::new(dir)), options)?;
    let report = copy.verify_scope(scope)?;
    first_problem(
        &report,
        "): the frozen copy does not read back as written, and was removed",
    )
}

/// The report's first problem as an error naming its file and offset,
/// with the count and `rest` (which closes the count's parenthesis).
fn first_problem(report: &super::VerifyReport, rest: &str) -> Result<(), BankError> {
    let Some(first) = report.problems.first() else {
        return Ok(());
    };
    Err(BankError::Corrupt {
        file: first.file.clone(),
        offset_bytes: first.offset_bytes,
        detail: format!("{} ({} problem(s) in all{rest}", first.detail, report.problems.len()),
    })
}

/// Frozen files are made read-only (0444): a frozen bank never changes.
fn make_read_only(dir: &Path) -> Result<(), BankError> {
    let entries = std::fs::read_dir(dir).map_err(StorageError::io("list", dir.display().to_string()))?;
    for entry in entries {
        let path = entry
            .map_err(StorageError::io("list", dir.display().to_string()))?
            .path();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444))
            .map_err(StorageError::io("chmod", path.display().to_string()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Attach, BankConfig, Label, NewNode, Payload};

    /// A copy that does not read back as written (a byte of a payload
    /// record changed between the write and the read-back, as a lost
    /// write would) is refused naming the file, and neither OUT nor the
    /// work directory is left; the same copy undamaged is placed at OUT.
    #[test]
    fn a_copy_that_does_not_read_back_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let mut bank = Bank::create_dir(dir.path().join("bank"), BankConfig::new(4)).unwrap();
        for k in 0..3 {
            let node = NewNode {
                tree: "task".into(),
                attach: Attach::Root,
                label: Label::Success,
                payload: Payload {
                    scenario: format!("node {k}"),
                    fields: Default::default(),
                },
                embedding: vec![1.0, k as f32, 0.0, 0.0],
                external_id: None,
            };
            bank.insert(node).unwrap();
        }
        for damaged in [true, false] {
            let (tmp, out) = (dir.path().join("out.freezing"), dir.path().join("out"));
            std::fs::create_dir(&tmp).unwrap();
            let built = bank.freeze_into(&FileStorage::new(&tmp));
            make_read_only(&tmp).unwrap();
            if damaged {
                let log = tmp.join(payload_file(0));
                std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o644)).unwrap();
                let mut bytes = std::fs::read(&log).unwrap();
                let last = bytes.len() - 1;
                bytes[last] ^= 0x20;
                std::fs::write(&log, bytes).unwrap();
                let e = settle(&tmp, &out, built, VerifyScope::SkipVectorColumns)
                    .unwrap_err()
                    .to_string();
                assert!(e.contains("payloads") && e.contains("does not read back"), "{e}");
                assert!(!tmp.exists() && !out.exists());
            } else {
                assert_eq!(settle(&tmp, &out, built, VerifyScope::Everything).unwrap().nodes, 3);
                assert!(!tmp.exists() && out.join(MANIFEST_FILE).is_file());
            }
        }
    }
}

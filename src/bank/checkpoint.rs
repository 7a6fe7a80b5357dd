//! Checkpoint: fold the overlay into the data files, then publish a new
//! manifest and start a new WAL generation. See FORMAT.md "Checkpoint".

use std::sync::Arc;

use super::base::Base;
use super::kernels::quant::{encode_f16, encode_int8_row};
use super::overlay::Overlay;
use super::{Bank, BankError};
use crate::format::manifest::{Manifest, Precision};
use crate::format::row::{ROW_SIZE_BYTES, Row};
use crate::format::wal::WalHeader;
use crate::storage::wal::WalWriter;
use crate::storage::{
    MANIFEST_FILE, MANIFEST_TMP_FILE, OpenMode, StorageError, StorageFile, payload_file, qvector_segment_file,
    replace_atomically, table_segment_file, vector_segment_file,
};

impl Bank {
    /// Makes everything committed durable in the data files and empties the
    /// WAL. Any failure poisons the bank (the old checkpoint stays valid).
    pub fn checkpoint(&mut self) -> Result<(), BankError> {
        self.check_writable()?;
        if self.overlay.is_empty() {
            return self.sync();
        }
        match self.write_checkpoint() {
            Ok(()) => Ok(()),
            Err(e) => {
                if let Some(w) = self.writer.as_mut() {
                    w.poisoned = Some(format!("checkpoint failed: {e}"));
                }
                Err(e)
            }
        }
    }

    fn write_checkpoint(&mut self) -> Result<(), BankError> {
        // WAL before data: rewriting a checkpointed row in place destroys
        // its old image, so the record holding the new one must be durable
        // first (under `batch`/`none` it may not be yet).
        self.sync()?;
        let storage = self.storage.clone();
        let created = self.write_data_files()?;
        if created {
            storage
                .sync_dir()
                .map_err(StorageError::io("fsync directory", storage.describe("")))?;
        }
        let writer = self.writer.as_ref().expect("writer");
        let last_lsn = writer.wal.next_lsn() - 1;
        let manifest = Manifest {
            sequence: self.manifest.sequence + 1,
            checkpoint_lsn: last_lsn,
            node_count: u64::from(self.overlay.total_count()),
            payload_end_bytes: self.overlay.payload_end_bytes,
            wal_salt: super::open::new_salt(self.manifest.wal_salt),
            ..self.manifest.clone()
        };
        replace_atomically(storage.as_ref(), MANIFEST_FILE, MANIFEST_TMP_FILE, &manifest.encode())?;
        // The new manifest is durable: from here on the old WAL is stale.
        let wal = WalWriter::create(
            storage.as_ref(),
            WalHeader {
                salt: manifest.wal_salt,
                start_lsn: last_lsn + 1,
            },
        )?;
        let count = manifest.node_count as u32;
        let trusted = self.base.trusted_after(count);
        self.base = Base::with_trust(storage.clone(), &manifest, &trusted);
        self.overlay = Overlay::new(count, manifest.dim_count, manifest.payload_end_bytes);
        self.manifest = manifest;
        self.writer.as_mut().expect("writer").wal = wal;
        Ok(())
    }

    /// Writes the overlay's payloads, vectors and rows at their final
    /// places and fsyncs every touched file. Returns whether files were
    /// created (the directory then needs an fsync too).
    fn write_data_files(&self) -> Result<bool, BankError> {
        let storage = self.storage.clone();
        let ov = &self.overlay;
        let payload_desc = storage.describe(&payload_file(self.manifest.generation));
        let payload_file = storage
            .open(&payload_file(self.manifest.generation), OpenMode::ReadWrite)
            .map_err(StorageError::io("open", payload_desc.clone()))?;
        let mut at = self.manifest.payload_end_bytes;
        for record in &ov.payloads {
            payload_file
                .write_all_at(record, at)
                .map_err(StorageError::io("write", payload_desc.clone()))?;
            at += record.len() as u64;
        }
        debug_assert_eq!(at, ov.payload_end_bytes);
        payload_file
            .sync_data()
            .map_err(StorageError::io("fsync", payload_desc))?;

        let mut segments = SegmentWriter::new(self);
        for row in ov.rows.iter().chain(ov.patched.values()) {
            segments.put_row(row)?;
        }
        for row in &ov.rows {
            segments.put_vector(row.index, ov.vector(row.index))?;
        }
        segments.sync_all()
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

    fn put_row(&mut self, row: &Row) -> Result<(), BankError> {
        let rps = self.bank.manifest.rows_per_segment;
        let size = u64::from(rps) * ROW_SIZE_BYTES as u64;
        let name = table_segment_file(self.bank.manifest.generation, row.index / rps);
        let file = self.file(name.clone(), size)?;
        let offset = u64::from(row.index % rps) * ROW_SIZE_BYTES as u64;
        file.write_all_at(&row.encode(), offset)
            .map_err(StorageError::io("write", self.bank.storage.describe(&name)))?;
        Ok(())
    }

    /// Writes a new node's vector in the bank's precision, and its int8
    /// side-column row when the bank has one.
    fn put_vector(&mut self, index: u32, vector: &[f32]) -> Result<(), BankError> {
        let m = &self.bank.manifest;
        let (segment, slot) = (index / m.rows_per_segment, u64::from(index % m.rows_per_segment));
        let mut bytes = vec![0u8; m.row_stride_bytes as usize];
        let used = encode_vector(m.precision, vector, &mut bytes);
        let size = u64::from(m.rows_per_segment) * u64::from(m.row_stride_bytes);
        let name = vector_segment_file(m.generation, segment);
        self.file(name.clone(), size)?
            .write_all_at(&bytes[..used], slot * u64::from(m.row_stride_bytes))
            .map_err(StorageError::io("write", self.bank.storage.describe(&name)))?;
        if let Some(qstride) = m.precision.qvector_stride_bytes(m.dim_count) {
            let mut row = vec![0u8; qstride as usize];
            encode_int8_row(vector, &mut row);
            let name = qvector_segment_file(m.generation, segment);
            self.file(name.clone(), u64::from(m.rows_per_segment) * u64::from(qstride))?
                .write_all_at(&row, slot * u64::from(qstride))
                .map_err(StorageError::io("write", self.bank.storage.describe(&name)))?;
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
}

//! The write-ahead log at run time: scanning (recovery, readers) and
//! appending (the writer). The byte layout lives in `format::wal`.

use std::ops::Range;
use std::sync::Arc;

use super::{OpenMode, Storage, StorageError, StorageFile, WAL_FILE, WAL_TMP_FILE, replace_atomically};
use crate::format::wal::{
    MAX_RECORD_BODY_BYTES, RECORD_HEADER_SIZE_BYTES, WAL_HEADER_SIZE_BYTES, WalHeader, decode_record_header,
    encode_record, verify_record,
};

/// One valid record found by a scan; `body` indexes `WalScan::buf`.
#[derive(Debug, Clone)]
pub struct ScannedRecord {
    pub lsn: u64,
    pub op_count: u16,
    pub offset_bytes: u64,
    pub body: Range<usize>,
}

/// The valid prefix of a WAL file.
pub struct WalScan {
    pub header: WalHeader,
    pub buf: Vec<u8>,
    pub records: Vec<ScannedRecord>,
    /// End of the last valid record: where the next record goes.
    pub valid_end_bytes: u64,
    pub file_len_bytes: u64,
    /// CRC of the last valid record (the header's CRC if none).
    pub last_crc: u32,
    /// Why the scan stopped before the end of the file, if it did.
    pub stop_reason: Option<StorageError>,
}

impl WalScan {
    pub fn next_lsn(&self) -> u64 {
        self.records.last().map_or(self.header.start_lsn, |r| r.lsn + 1)
    }

    pub fn body(&self, record: &ScannedRecord) -> &[u8] {
        &self.buf[record.body.clone()]
    }
}

/// Reads the WAL and follows its chain to the first invalid record. A
/// corrupt header is an error; an invalid record just ends the scan.
pub fn scan(storage: &dyn Storage) -> Result<WalScan, StorageError> {
    let desc = storage.describe(WAL_FILE);
    let buf = super::read_all(storage, WAL_FILE)?;
    let header = WalHeader::decode(&buf).map_err(|e| StorageError::corrupt(desc.clone(), 0, e))?;
    let mut prev_crc = header.chain_seed();
    let mut next_lsn = header.start_lsn;
    let mut at = WAL_HEADER_SIZE_BYTES;
    let mut records = Vec::new();
    let mut stop_reason = None;
    // Bounded: every iteration consumes at least one record header.
    while at < buf.len() {
        match check_one(&buf[at..], prev_crc, next_lsn) {
            Ok((h, len)) => {
                let body = at + RECORD_HEADER_SIZE_BYTES..at + len;
                records.push(ScannedRecord {
                    lsn: h.lsn,
                    op_count: h.op_count,
                    offset_bytes: at as u64,
                    body,
                });
                prev_crc = h.crc;
                next_lsn += 1;
                at += len;
            }
            Err(e) => {
                stop_reason = Some(StorageError::corrupt(desc.clone(), at as u64, e));
                break;
            }
        }
    }
    Ok(WalScan {
        header,
        file_len_bytes: buf.len() as u64,
        buf,
        records,
        valid_end_bytes: at as u64,
        last_crc: prev_crc,
        stop_reason,
    })
}

fn check_one(
    rest: &[u8],
    prev_crc: u32,
    lsn: u64,
) -> Result<(crate::format::wal::RecordHeader, usize), crate::format::FormatError> {
    let h = decode_record_header(rest)?;
    let body_bytes = h.body_size_bytes as usize;
    if body_bytes > MAX_RECORD_BODY_BYTES {
        return Err(crate::format::FormatError::Invalid {
            what: "WAL record",
            offset_bytes: 0,
            detail: format!("body size {body_bytes} exceeds the {MAX_RECORD_BODY_BYTES}-byte limit"),
        });
    }
    let len = RECORD_HEADER_SIZE_BYTES + body_bytes;
    let h = verify_record(prev_crc, lsn, rest.get(..len).unwrap_or(rest))?;
    Ok((h, len))
}

/// The writer's handle: appends chained records and syncs them.
pub struct WalWriter {
    file: Arc<dyn StorageFile>,
    desc: String,
    next_lsn: u64,
    end_bytes: u64,
    prev_crc: u32,
    /// Every record with lsn < synced_below is durable.
    synced_below: u64,
}

impl WalWriter {
    /// Replaces the WAL with an empty one of a new generation (atomically).
    pub fn create(storage: &dyn Storage, header: WalHeader) -> Result<WalWriter, StorageError> {
        replace_atomically(storage, WAL_FILE, WAL_TMP_FILE, &header.encode())?;
        let desc = storage.describe(WAL_FILE);
        let file = storage
            .open(WAL_FILE, OpenMode::ReadWrite)
            .map_err(StorageError::io("open", desc.clone()))?;
        Ok(WalWriter {
            file,
            desc,
            next_lsn: header.start_lsn,
            end_bytes: WAL_HEADER_SIZE_BYTES as u64,
            prev_crc: header.chain_seed(),
            synced_below: header.start_lsn,
        })
    }

    /// Continues an existing WAL after a scan, cutting off any torn tail
    /// first so a new record never sits in front of garbage.
    pub fn resume(storage: &dyn Storage, scan: &WalScan) -> Result<WalWriter, StorageError> {
        let desc = storage.describe(WAL_FILE);
        let file = storage
            .open(WAL_FILE, OpenMode::ReadWrite)
            .map_err(StorageError::io("open", desc.clone()))?;
        if scan.file_len_bytes != scan.valid_end_bytes {
            file.set_len(scan.valid_end_bytes)
                .map_err(StorageError::io("truncate", desc.clone()))?;
            file.sync_data().map_err(StorageError::io("fsync", desc.clone()))?;
        }
        Ok(WalWriter {
            file,
            desc,
            next_lsn: scan.next_lsn(),
            end_bytes: scan.valid_end_bytes,
            prev_crc: scan.last_crc,
            synced_below: scan.next_lsn(),
        })
    }

    pub fn next_lsn(&self) -> u64 {
        self.next_lsn
    }

    pub fn size_bytes(&self) -> u64 {
        self.end_bytes
    }

    /// Highest LSN known durable, if any record of this generation is.
    pub fn synced_below(&self) -> u64 {
        self.synced_below
    }

    pub fn has_unsynced(&self) -> bool {
        self.synced_below < self.next_lsn
    }

    /// Appends one record with a single positional write. Returns its LSN.
    pub fn append(&mut self, op_count: u16, body: &[u8]) -> Result<u64, StorageError> {
        let lsn = self.next_lsn;
        let (bytes, crc) = encode_record(self.prev_crc, lsn, op_count, body);
        self.file
            .write_all_at(&bytes, self.end_bytes)
            .map_err(StorageError::io("write", self.desc.clone()))?;
        self.end_bytes += bytes.len() as u64;
        self.prev_crc = crc;
        self.next_lsn += 1;
        Ok(lsn)
    }

    /// An fsync of everything appended so far, to run without `&mut self`
    /// (None if nothing is unsynced). `complete_sync` records its success.
    pub fn detach_sync(&self) -> Option<DetachedSync> {
        self.has_unsynced().then(|| DetachedSync {
            file: self.file.clone(),
            desc: self.desc.clone(),
            below_lsn: self.next_lsn,
        })
    }

    /// Records a detached fsync that succeeded. If this WAL is no longer the
    /// file it synced (a checkpoint started a new generation meanwhile) it
    /// changes nothing: the checkpoint made those records durable itself.
    pub fn complete_sync(&mut self, done: &DetachedSync) {
        if Arc::ptr_eq(&self.file, &done.file) && done.below_lsn > self.synced_below {
            assert!(
                done.below_lsn <= self.next_lsn,
                "a detached sync cannot cover unwritten records"
            );
            self.synced_below = done.below_lsn;
        }
    }

    /// fdatasync. On error the caller must poison the bank: the kernel may
    /// have dropped the dirty pages, so a retry could falsely succeed.
    pub fn sync(&mut self) -> Result<(), StorageError> {
        self.file
            .sync_data()
            .map_err(StorageError::io("fsync", self.desc.clone()))?;
        self.synced_below = self.next_lsn;
        Ok(())
    }
}

/// A WAL fsync taken out of the writer, so a server can fsync while
/// readers use the bank (see `Bank::detach_sync`).
pub struct DetachedSync {
    file: Arc<dyn StorageFile>,
    desc: String,
    below_lsn: u64,
}

impl DetachedSync {
    /// fdatasync of the WAL as it was when detached (and anything later).
    pub fn run(&self) -> Result<(), StorageError> {
        self.file
            .sync_data()
            .map_err(StorageError::io("fsync", self.desc.clone()))
    }

    /// Every record below this LSN is durable once `run` succeeds.
    pub fn below_lsn(&self) -> u64 {
        self.below_lsn
    }
}

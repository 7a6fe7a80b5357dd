//! The write-ahead log at run time: scanning (recovery, readers) and
//! appending (the writer). The byte layout lives in `format::wal`.

use std::ops::Range;
use std::sync::Arc;

use super::{OpenMode, Storage, StorageError, StorageFile, WAL_FILE, WAL_TMP_FILE, replace_atomically};
use crate::format::wal::{
    MAX_RECORD_BODY_BYTES, REC_LSN_OFFSET, RECORD_HEADER_SIZE_BYTES, WAL_HEADER_SIZE_BYTES, WalHeader,
    decode_record_header, frame_record, verify_record,
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
    /// Why the scan stopped before the end of the file, if it did. Zero
    /// bytes after the last record are the writer's preallocation
    /// (FORMAT.md §8 step 4), not a stop: then `valid_end_bytes` is short
    /// of `file_len_bytes` with no reason.
    pub stop_reason: Option<StorageError>,
    /// Set when intact records follow the record the scan stopped at: the
    /// stop is damage in the middle of the log, not a torn tail (FORMAT.md
    /// §8), and truncating there would drop those records.
    pub damage: Option<WalDamage>,
}

/// A record that is not intact followed by records that are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalDamage {
    /// Where the damaged record starts (= `WalScan::valid_end_bytes`).
    pub offset_bytes: u64,
    /// The LSN the damaged record should carry.
    pub lsn: u64,
    /// Where the first intact record after it starts.
    pub intact_offset_bytes: u64,
    /// LSNs of the records after the damage that truncation would drop:
    /// the first intact one through the end of its chain.
    pub dropped_lsns: std::ops::RangeInclusive<u64>,
    /// Why the damaged record failed its checks.
    pub detail: String,
}

impl WalScan {
    pub fn next_lsn(&self) -> u64 {
        self.records.last().map_or(self.header.start_lsn, |r| r.lsn + 1)
    }

    /// Record `index` as damage: intact, but the bank refuses it (its ops
    /// do not decode or contradict the bank, FORMAT.md §8). It and every
    /// record after it, through any damage the scan found further on, are
    /// what a truncation there drops.
    pub fn refused(&self, index: usize, detail: String) -> WalDamage {
        let record = &self.records[index];
        let last = self.records.last().expect("a record was refused").lsn;
        let last = self.damage.as_ref().map_or(last, |d| last.max(*d.dropped_lsns.end()));
        WalDamage {
            offset_bytes: record.offset_bytes,
            lsn: record.lsn,
            intact_offset_bytes: record.offset_bytes,
            dropped_lsns: record.lsn..=last,
            detail,
        }
    }

    /// Ends the scan before record `index` (`refused`): the records kept
    /// are the ones before it, and a writer resumed with `drop_damaged`
    /// truncates the file there.
    pub fn cut_before(&mut self, index: usize, damage: WalDamage, desc: String) {
        assert_eq!(damage.offset_bytes, self.records[index].offset_bytes);
        self.last_crc = match index.checked_sub(1) {
            None => self.header.chain_seed(),
            Some(before) => {
                let at = self.records[before].offset_bytes as usize;
                decode_record_header(&self.buf[at..]).expect("a scanned record").crc
            }
        };
        self.valid_end_bytes = damage.offset_bytes;
        self.records.truncate(index);
        let refused = crate::format::FormatError::Invalid {
            what: "WAL record",
            offset_bytes: 0,
            detail: format!("record {} is refused: {}", damage.lsn, damage.detail),
        };
        self.stop_reason = Some(StorageError::corrupt(desc, damage.offset_bytes, refused));
        self.damage = Some(damage);
    }

    pub fn body(&self, record: &ScannedRecord) -> &[u8] {
        &self.buf[record.body.clone()]
    }
}

/// Reads the WAL and follows its chain to the first invalid record. A
/// corrupt header is an error; an invalid record ends the scan, and the
/// bytes after it are searched for intact records to tell damage in the
/// middle from a torn tail.
pub fn scan(storage: &dyn Storage) -> Result<WalScan, StorageError> {
    let desc = storage.describe(WAL_FILE);
    let buf = super::read_all(storage, WAL_FILE)?;
    let header = WalHeader::decode(&buf).map_err(|e| StorageError::corrupt(desc.clone(), 0, e))?;
    let chain = follow_chain(&buf, WAL_HEADER_SIZE_BYTES, header.chain_seed(), header.start_lsn);
    let at = chain.end_bytes;
    let next_lsn = header.start_lsn + chain.records.len() as u64;
    let mut stop_reason = None;
    let mut damage = None;
    let preallocated = buf[at..].iter().all(|&b| b == 0);
    if let Some(e) = chain.stop.filter(|_| !preallocated) {
        damage = unreadable_at(&buf, at, chain.last_crc, next_lsn).or_else(|| {
            find_intact_after(&buf, at, chain.last_crc, next_lsn).map(|(intact_at, dropped)| WalDamage {
                offset_bytes: at as u64,
                lsn: next_lsn,
                intact_offset_bytes: intact_at as u64,
                dropped_lsns: dropped,
                detail: e.to_string(),
            })
        });
        stop_reason = Some(StorageError::corrupt(desc.clone(), at as u64, e));
    }
    assert!(at <= buf.len() && (stop_reason.is_some() || preallocated));
    Ok(WalScan {
        header,
        file_len_bytes: buf.len() as u64,
        buf,
        records: chain.records,
        valid_end_bytes: at as u64,
        last_crc: chain.last_crc,
        stop_reason,
        damage,
    })
}

/// For a WAL whose header fails its checks: the scan of the stale WAL it
/// is (its header given as `expected` with another salt, no record) when
/// bytes after the header are not all zero (a recycled file holds an
/// earlier generation's records there) and no record after it is intact
/// under `expected`, the header the manifest implies for a live WAL,
/// neither the first nor one found past it (`find_intact_after`). A
/// recycling checkpoint's torn header write leaves such a file: the
/// manifest was durable first, and no record of the new generation is
/// written before the header is (FORMAT.md §8). None otherwise: the header
/// is damage (a header-only or zero-filled WAL was never recycled).
pub fn scan_torn_header(storage: &dyn Storage, expected: WalHeader) -> Result<Option<WalScan>, StorageError> {
    let buf = super::read_all(storage, WAL_FILE)?;
    let at = WAL_HEADER_SIZE_BYTES;
    if buf.len() <= at || !torn_between_headers(&buf[..at]) || buf[at..].iter().all(|&b| b == 0) {
        return Ok(None);
    }
    let seed = expected.chain_seed();
    let live = !follow_chain(&buf, at, seed, expected.start_lsn).records.is_empty()
        || find_intact_after(&buf, at, seed, expected.start_lsn).is_some();
    if live {
        return Ok(None);
    }
    Ok(Some(WalScan {
        header: WalHeader {
            salt: !expected.salt,
            start_lsn: expected.start_lsn,
        },
        file_len_bytes: buf.len() as u64,
        buf,
        records: Vec::new(),
        valid_end_bytes: at as u64,
        last_crc: seed,
        stop_reason: None,
        damage: None,
    }))
}

/// Whether `header` could be a tear between two headers of this format:
/// only the salt, the start LSN and the CRC differ between them, so its
/// magic, version and reserved bytes are right and its CRC is what fails.
/// Another version's header (a newer build's WAL) is never one.
fn torn_between_headers(header: &[u8]) -> bool {
    use crate::format::WAL_FORMAT_VERSION;
    use crate::format::wal::{WAL_HEADER_RESERVED, WAL_MAGIC, WALH_VERSION_OFFSET};
    header[..8] == WAL_MAGIC
        && crate::format::get_u32(header, WALH_VERSION_OFFSET) == WAL_FORMAT_VERSION
        && WAL_HEADER_RESERVED
            .iter()
            .all(|r| header[r.clone()].iter().all(|&b| b == 0))
        && WalHeader::decode(header).is_err()
}

/// The record at `at` as damage when it is intact but unreadable
/// (`unreadable_intact_record`): it and the records chained after it are
/// what a truncation would drop, and a torn tail it is not.
fn unreadable_at(buf: &[u8], at: usize, prev_crc: u32, lsn: u64) -> Option<WalDamage> {
    let detail = crate::format::wal::unreadable_intact_record(prev_crc, lsn, &buf[at..])?;
    let h = decode_record_header(&buf[at..]).ok()?;
    let len = RECORD_HEADER_SIZE_BYTES + h.body_size_bytes as usize;
    // A forged header may put the LSN at the top of its range.
    let after = follow_chain(buf, at + len, h.crc, lsn.checked_add(1)?);
    Some(WalDamage {
        offset_bytes: at as u64,
        lsn,
        intact_offset_bytes: at as u64,
        dropped_lsns: lsn..=lsn.saturating_add(after.records.len() as u64),
        detail,
    })
}

/// Where a reader's scan of the WAL ended: the next record it would read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalPosition {
    pub end_bytes: u64,
    pub next_lsn: u64,
    /// CRC of the last record read (the header's seed if none): the next
    /// record chains from it.
    pub prev_crc: u32,
}

impl WalScan {
    /// Where this scan ended.
    pub fn position(&self) -> WalPosition {
        WalPosition {
            end_bytes: self.valid_end_bytes,
            next_lsn: self.next_lsn(),
            prev_crc: self.last_crc,
        }
    }
}

/// Whether an intact record that chains from `at` starts there: a writer
/// has appended since a reader's scan. Zeros, the end of the file, or a
/// record that is torn (a dead writer's) or not whole yet are not news:
/// a reader that asked only for non-zero bytes there reopened the bank
/// every time it asked, for as long as a torn tail stayed. Reads the
/// record's header, then the record only if the file holds all of it.
pub fn intact_record_at(file: &dyn StorageFile, desc: &str, at: WalPosition) -> Result<bool, StorageError> {
    let len_bytes = file.len_bytes().map_err(StorageError::io("stat", desc.to_string()))?;
    let Some(room) = len_bytes.checked_sub(at.end_bytes) else {
        return Ok(false);
    };
    if room < RECORD_HEADER_SIZE_BYTES as u64 {
        return Ok(false);
    }
    let mut head = [0u8; RECORD_HEADER_SIZE_BYTES];
    file.read_exact_at(&mut head, at.end_bytes)
        .map_err(StorageError::io("read", desc.to_string()))?;
    let Ok(header) = decode_record_header(&head) else {
        return Ok(false);
    };
    let body_bytes = header.body_size_bytes as usize;
    let record_bytes = (RECORD_HEADER_SIZE_BYTES + body_bytes) as u64;
    if header.lsn != at.next_lsn || body_bytes > MAX_RECORD_BODY_BYTES || record_bytes > room {
        return Ok(false);
    }
    let mut record = vec![0u8; record_bytes as usize];
    file.read_exact_at(&mut record, at.end_bytes)
        .map_err(StorageError::io("read", desc.to_string()))?;
    Ok(check_one(&record, at.prev_crc, at.next_lsn).is_ok())
}

/// Records that chain from `seed` starting at `from`, up to the first
/// that does not verify (or the end of `buf`).
struct Chain {
    records: Vec<ScannedRecord>,
    end_bytes: usize,
    last_crc: u32,
    stop: Option<crate::format::FormatError>,
}

fn follow_chain(buf: &[u8], from: usize, seed: u32, first_lsn: u64) -> Chain {
    let mut chain = Chain {
        records: Vec::new(),
        end_bytes: from,
        last_crc: seed,
        stop: None,
    };
    let mut lsn = first_lsn;
    // Bounded: every iteration consumes at least one record header.
    while chain.end_bytes < buf.len() {
        let at = chain.end_bytes;
        match check_one(&buf[at..], chain.last_crc, lsn) {
            Ok((h, len)) => {
                assert!(len >= RECORD_HEADER_SIZE_BYTES && h.lsn == lsn);
                chain.records.push(ScannedRecord {
                    lsn: h.lsn,
                    op_count: h.op_count,
                    offset_bytes: at as u64,
                    body: at + RECORD_HEADER_SIZE_BYTES..at + len,
                });
                chain.last_crc = h.crc;
                chain.end_bytes += len;
                lsn += 1;
            }
            Err(e) => {
                chain.stop = Some(e);
                break;
            }
        }
    }
    chain
}

/// Looks past a record at `at` that failed to verify (expected `lsn`,
/// chained from `prev_crc`) for intact records of the same log. Found:
/// the first one's offset and the LSNs of the chain it starts.
///
/// A record after the damaged one counts as intact if it carries the next
/// LSN and chains from the damaged record's CRC (as stored, or as computed
/// over the damaged bytes, for when the stored CRC is what was hit), or if
/// a record chained from its own stored CRC follows it (damage spanning
/// several records). The search walks every byte offset, so a damaged
/// `body_size` cannot hide what follows; it only runs when a scan stops
/// early and only over the bytes after that point.
fn find_intact_after(buf: &[u8], at: usize, prev_crc: u32, lsn: u64) -> Option<(usize, std::ops::RangeInclusive<u64>)> {
    let seeds = damaged_record_crcs(&buf[at..], prev_crc);
    // Every record takes at least a header: no later LSN can be further.
    let max_gap = ((buf.len() - at) / RECORD_HEADER_SIZE_BYTES) as u64;
    let last_start = buf.len().checked_sub(RECORD_HEADER_SIZE_BYTES)?;
    for p in at + 1..=last_start {
        let found = crate::format::get_u64(buf, p + REC_LSN_OFFSET);
        if found <= lsn || found - lsn > max_gap {
            continue;
        }
        if found == lsn + 1
            && let Some(&seed) = seeds.iter().find(|&&s| check_one(&buf[p..], s, found).is_ok())
        {
            let chain = follow_chain(buf, p, seed, found);
            return Some((p, found..=found + chain.records.len() as u64 - 1));
        }
        // The candidate's own CRC seeds its successor's chain.
        let Ok(h) = decode_record_header(&buf[p..]) else {
            continue;
        };
        let len = RECORD_HEADER_SIZE_BYTES + (h.body_size_bytes as usize).min(MAX_RECORD_BODY_BYTES);
        if p + len < buf.len() && check_one(&buf[p + len..], h.crc, found + 1).is_ok() {
            let chain = follow_chain(buf, p + len, h.crc, found + 1);
            return Some((p, found..=found + chain.records.len() as u64));
        }
    }
    None
}

/// The CRCs the next record may chain from when this record is damaged:
/// its stored CRC, and the CRC of its bytes as they are now.
fn damaged_record_crcs(rest: &[u8], prev_crc: u32) -> Vec<u32> {
    let Ok(h) = decode_record_header(rest) else {
        return Vec::new();
    };
    let mut crcs = vec![h.crc];
    let len = RECORD_HEADER_SIZE_BYTES + h.body_size_bytes as usize;
    if let Some(record) = rest.get(..len) {
        crcs.push(crate::format::wal::chained_crc(prev_crc, record));
    }
    crcs
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
    /// File length: the bytes from `end_bytes` to here are zeros written
    /// ahead of the records (see `append_framed`) or, in a recycled file
    /// (`recycle`), an earlier generation's records.
    allocated_bytes: u64,
    prev_crc: u32,
    /// Every record with lsn < synced_below is durable.
    synced_below: u64,
    /// Records framed while gathering (`gather`) and not written yet: the
    /// bytes from `end_bytes - gathered.len()` to `end_bytes`.
    gathered: Vec<u8>,
    gathering: bool,
    /// Every record with lsn < written_below is written (at most
    /// `next_lsn`; less only while records are gathered).
    written_below: u64,
}

/// The most a small record that reaches the end of the WAL zero-fills
/// ahead of itself: as much as the log already holds (so a small log
/// stays small: it doubles), up to this step, rounded up to 4 KiB. An
/// fdatasync after an append that changes the file size must commit the
/// size (a filesystem journal write: measured 2-5x the cost of the data
/// flush alone on ext4); records written over zeros that are already
/// durable change only data. A step costs one such commit per step
/// instead of one per record.
pub const WAL_PREALLOCATE_STEP_BYTES: u64 = 1 << 20;

/// Where zeros written ahead of a small record ending at `record_end` end.
pub fn preallocated_end(record_end: u64) -> u64 {
    const PAGE: u64 = 4096;
    (record_end + record_end.min(WAL_PREALLOCATE_STEP_BYTES)).div_ceil(PAGE) * PAGE
}

/// Most bytes of records gathered before they are written (`gather`).
const GATHERED_MOST_BYTES: usize = 4 << 20;

/// Records at least this large are appended without zeros after them: the
/// size commit is small beside their own bytes, and zero-filling would add
/// up to a step of writes to each.
const PREALLOCATE_BELOW_BYTES: usize = (WAL_PREALLOCATE_STEP_BYTES / 4) as usize;

impl WalWriter {
    /// Replaces the WAL with an empty one of a new generation (atomically).
    pub fn create(storage: &dyn Storage, header: WalHeader) -> Result<WalWriter, StorageError> {
        replace_atomically(storage, WAL_FILE, WAL_TMP_FILE, &header.encode())?;
        let desc = storage.describe(WAL_FILE);
        let file = storage
            .open(WAL_FILE, OpenMode::ReadWrite)
            .map_err(StorageError::io("open", desc.clone()))?;
        Ok(WalWriter::of_new_generation(
            file,
            desc,
            header,
            WAL_HEADER_SIZE_BYTES as u64,
        ))
    }

    /// The writer of a generation whose header `file` now holds durably,
    /// with no record yet, `allocated_bytes` long.
    fn of_new_generation(
        file: Arc<dyn StorageFile>,
        desc: String,
        header: WalHeader,
        allocated_bytes: u64,
    ) -> WalWriter {
        WalWriter {
            file,
            desc,
            next_lsn: header.start_lsn,
            end_bytes: WAL_HEADER_SIZE_BYTES as u64,
            allocated_bytes,
            prev_crc: header.chain_seed(),
            synced_below: header.start_lsn,
            gathered: Vec::new(),
            gathering: false,
            written_below: header.start_lsn,
        }
    }

    /// Continues an existing WAL after a scan, cutting off any torn tail
    /// first so a new record never sits in front of garbage (zeros after
    /// the last record are kept: they are the preallocation). Cutting off
    /// damage in the middle (intact records after it) drops records, so
    /// the caller must say it was asked to (`drop_damaged`, a repair).
    pub fn resume(storage: &dyn Storage, scan: &WalScan, drop_damaged: bool) -> Result<WalWriter, StorageError> {
        assert!(
            scan.damage.is_none() || drop_damaged,
            "truncating a WAL with intact records after its damage: {:?}",
            scan.damage
        );
        assert!(scan.valid_end_bytes <= scan.file_len_bytes);
        let desc = storage.describe(WAL_FILE);
        let file = storage
            .open(WAL_FILE, OpenMode::ReadWrite)
            .map_err(StorageError::io("open", desc.clone()))?;
        let torn = scan.stop_reason.is_some();
        if torn {
            file.set_len(scan.valid_end_bytes)
                .map_err(StorageError::io("truncate", desc.clone()))?;
        }
        // The records found may be a dead writer's, still unsynced in the
        // page cache (a kill -9 keeps them there): they are counted durable
        // below (`synced_below`), so they must be. On clean pages the
        // fdatasync costs no I/O.
        if torn || !scan.records.is_empty() {
            file.sync_data().map_err(StorageError::io("fsync", desc.clone()))?;
        }
        Ok(WalWriter {
            file,
            desc,
            next_lsn: scan.next_lsn(),
            end_bytes: scan.valid_end_bytes,
            allocated_bytes: if torn {
                scan.valid_end_bytes
            } else {
                scan.file_len_bytes
            },
            prev_crc: scan.last_crc,
            synced_below: scan.next_lsn(),
            gathered: Vec::new(),
            gathering: false,
            written_below: scan.next_lsn(),
        })
    }

    pub fn next_lsn(&self) -> u64 {
        self.next_lsn
    }

    pub fn size_bytes(&self) -> u64 {
        self.end_bytes
    }

    /// The file's length: records, then zeros written ahead of them (or,
    /// in a recycled file, an earlier generation's records).
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated_bytes
    }

    /// Cuts the file at the end of its records when it holds none and is
    /// longer than its header (a recycled file's old records, zeros written
    /// ahead), and makes that durable: what `close` leaves.
    pub fn trim_when_empty(&mut self) -> Result<(), StorageError> {
        // A gathered record counts in `end_bytes` too.
        let empty = self.end_bytes == WAL_HEADER_SIZE_BYTES as u64;
        if !empty || self.allocated_bytes <= self.end_bytes {
            return Ok(());
        }
        self.file
            .set_len(self.end_bytes)
            .map_err(StorageError::io("truncate", self.desc.clone()))?;
        self.file
            .sync_data()
            .map_err(StorageError::io("fsync", self.desc.clone()))?;
        self.allocated_bytes = self.end_bytes;
        Ok(())
    }

    /// Starts the next generation's WAL in this same file (FORMAT.md §8
    /// step 5, recycled): `header` is written over the current one and made
    /// durable, and the next records go over the old ones, which the
    /// checkpoint calling this has made redundant (their LSNs are all below
    /// `header.start_lsn`, so a scan never takes them for the new
    /// generation's). The file's blocks are written and durable: no record
    /// needs zeros ahead of it, nor its fdatasync a step of them, until the
    /// log passes the file's end. The 64-byte header lies in the file's
    /// first 512-byte sector, whose write is atomic on the disks this runs
    /// on; should one tear, the WAL reads as the stale one it replaces
    /// (`scan_torn_header`). Every record must be durable first.
    pub fn recycle(&self, header: WalHeader) -> Result<WalWriter, StorageError> {
        assert!(
            self.synced_below == self.next_lsn && self.gathered.is_empty(),
            "recycling a WAL whose records are not all durable"
        );
        assert!(
            header.start_lsn >= self.next_lsn,
            "a recycled WAL's records must all be older than its new generation"
        );
        self.file
            .write_all_at(&header.encode(), 0)
            .map_err(StorageError::io("write", self.desc.clone()))?;
        self.file
            .sync_data()
            .map_err(StorageError::io("fsync", self.desc.clone()))?;
        Ok(WalWriter::of_new_generation(
            self.file.clone(),
            self.desc.clone(),
            header,
            self.allocated_bytes,
        ))
    }

    /// Highest LSN known durable, if any record of this generation is.
    pub fn synced_below(&self) -> u64 {
        self.synced_below
    }

    pub fn has_unsynced(&self) -> bool {
        self.synced_below < self.next_lsn
    }

    /// Appends one record with a single positional write and returns its
    /// LSN. The body is built in `record` after `RECORD_HEADER_SIZE_BYTES`
    /// bytes of room: the header is filled in there and the buffer written
    /// as it is, so a transaction of a few MB is not copied into a frame
    /// first. A small record that reaches past the zeros written ahead
    /// carries more zeros in the same write (`preallocated_end`). `record` holds the record on
    /// return (zeros written ahead of it are not left in it). While
    /// gathering (`gather`), a small record is copied to the gathered ones
    /// instead, and written with them.
    pub fn append_framed(&mut self, op_count: u16, record: &mut Vec<u8>) -> Result<u64, StorageError> {
        let lsn = self.next_lsn;
        let crc = frame_record(self.prev_crc, lsn, op_count, record);
        let record_bytes = record.len();
        if self.gathering && record_bytes < PREALLOCATE_BELOW_BYTES {
            // Bounded: a round of 1,024 records of up to 256 KiB each is
            // written in pieces of a few MiB.
            if self.gathered.len() + record_bytes > GATHERED_MOST_BYTES {
                self.write_gathered()?;
            }
            self.gathered.extend_from_slice(record);
        } else {
            // A large record is written as it is, after those gathered.
            self.write_gathered()?;
            self.write_at(record, record_bytes, self.end_bytes)?;
            self.written_below = lsn + 1;
        }
        self.end_bytes += record_bytes as u64;
        self.prev_crc = crc;
        self.next_lsn += 1;
        Ok(lsn)
    }

    /// From now on small records are gathered and written together, in
    /// one write, by `write_gathered` (or an fsync): a server applying a
    /// round of commits makes one write system call for the round, not
    /// one per commit. Gathered records are not written, so no fsync
    /// covers them (`detach_sync`) until they are.
    pub fn gather(&mut self) {
        self.gathering = true;
    }

    /// Writes the gathered records in one write and stops gathering. On
    /// an error the caller must poison the bank: those records were
    /// counted (their LSNs are taken) but are not in the file.
    pub fn stop_gathering(&mut self) -> Result<(), StorageError> {
        self.gathering = false;
        let written = self.write_gathered();
        self.gathered.shrink_to(GATHERED_MOST_BYTES);
        written
    }

    fn write_gathered(&mut self) -> Result<(), StorageError> {
        if self.gathered.is_empty() {
            return Ok(());
        }
        let mut gathered = std::mem::take(&mut self.gathered);
        let gathered_bytes = gathered.len();
        let at_bytes = self.end_bytes - gathered_bytes as u64;
        let written = self.write_at(&mut gathered, gathered_bytes, at_bytes);
        gathered.clear();
        self.gathered = gathered;
        written?;
        self.written_below = self.next_lsn;
        Ok(())
    }

    /// Writes `bytes` (the first `record_bytes` of which are records) at
    /// `at_bytes`, the end of what is written, with zeros after them when
    /// they pass the zeros written ahead (`preallocated_end`); `bytes` is
    /// given back without those zeros.
    fn write_at(&mut self, bytes: &mut Vec<u8>, record_bytes: usize, at_bytes: u64) -> Result<(), StorageError> {
        let record_end = at_bytes + record_bytes as u64;
        if record_end > self.allocated_bytes && record_bytes < PREALLOCATE_BELOW_BYTES {
            bytes.resize((preallocated_end(record_end) - at_bytes) as usize, 0);
        }
        let written = self.file.write_all_at(bytes, at_bytes);
        let written_bytes = bytes.len() as u64;
        bytes.truncate(record_bytes);
        written.map_err(StorageError::io("write", self.desc.clone()))?;
        self.allocated_bytes = self.allocated_bytes.max(at_bytes + written_bytes);
        Ok(())
    }

    /// An fsync of everything appended so far, to run without `&mut self`
    /// (None if nothing is unsynced). `complete_sync` records its success.
    pub fn detach_sync(&self) -> Option<DetachedSync> {
        // Gathered records are not in the file: no fsync covers them.
        (self.synced_below < self.written_below).then(|| DetachedSync {
            file: self.file.clone(),
            desc: self.desc.clone(),
            below_lsn: self.written_below,
        })
    }

    /// Records a detached fsync that succeeded. If this WAL is no longer the
    /// file it synced (a checkpoint started a new generation meanwhile) it
    /// changes nothing: the checkpoint made those records durable itself.
    /// A recycled generation shares the file (`recycle`), but its LSNs all
    /// lie past what the older generation's sync covered, so such a sync
    /// is at or below `synced_below` and changes nothing either.
    pub fn complete_sync(&mut self, done: &DetachedSync) {
        if Arc::ptr_eq(&self.file, &done.file) && done.below_lsn > self.synced_below {
            assert!(
                done.below_lsn <= self.written_below,
                "a detached sync cannot cover unwritten records"
            );
            self.synced_below = done.below_lsn;
        }
    }

    /// fdatasync. On error the caller must poison the bank: the kernel may
    /// have dropped the dirty pages, so a retry could falsely succeed.
    pub fn sync(&mut self) -> Result<(), StorageError> {
        self.write_gathered()?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::wal::{REC_CRC_OFFSET, REC_KIND_OFFSET, chained_crc, encode_record};
    use crate::storage::MemStorage;

    /// A tear between two headers of this format (any prefix of the new
    /// over the old) can be one; another version's header, a bad magic or
    /// a good header never are.
    #[test]
    fn only_a_tear_between_headers_of_this_format_is_taken_for_one() {
        let old = WalHeader { salt: 7, start_lsn: 10 }.encode();
        let new = WalHeader { salt: 9, start_lsn: 41 }.encode();
        let torn: Vec<[u8; 64]> = (1..64)
            .map(|k| {
                let mut h = old;
                h[..k].copy_from_slice(&new[..k]);
                h
            })
            .filter(|h| WalHeader::decode(h).is_err())
            .collect();
        assert!(torn.len() > 40);
        assert!(torn.iter().all(|h| torn_between_headers(h)));
        assert!(!torn_between_headers(&new), "a good header is no tear");
        let mut newer = new;
        newer[8] = 2;
        let crc = crate::format::crc32(&newer[..60]);
        newer[60..].copy_from_slice(&crc.to_le_bytes());
        assert!(!torn_between_headers(&newer), "another version's header");
        let mut magic = torn[0];
        magic[0] ^= 1;
        assert!(!torn_between_headers(&magic), "a bad magic");
    }

    /// A WAL of three records whose second is changed by `change` (then
    /// its CRC made right again when `recrc`, and the third chained from
    /// it), scanned.
    fn scan_with_second(change: impl Fn(&mut Vec<u8>), recrc: bool) -> WalScan {
        let header = WalHeader { salt: 5, start_lsn: 1 };
        let (first, c1) = encode_record(header.chain_seed(), 1, 1, b"first body");
        let (mut second, _) = encode_record(c1, 2, 1, b"second body");
        change(&mut second);
        let mut c2 = crate::format::get_u32(&second, REC_CRC_OFFSET);
        if recrc {
            c2 = chained_crc(c1, &second);
            second[REC_CRC_OFFSET..REC_CRC_OFFSET + 4].copy_from_slice(&c2.to_le_bytes());
        }
        let (third, _) = encode_record(c2, 3, 1, b"third body");
        let whole = second.len() == RECORD_HEADER_SIZE_BYTES + b"second body".len();
        let third = if whole { third } else { Vec::new() };
        let storage = MemStorage::new();
        storage.set_file_bytes(WAL_FILE, [header.encode().to_vec(), first, second, third].concat());
        scan(&storage).unwrap()
    }

    /// A record whose CRC and LSN hold but whose kind is unknown, or whose
    /// reserved bytes are not zero, is damage that names it (once dropped
    /// silently as a torn tail, and overwritten by the next writer); a
    /// record whose CRC fails, with nothing intact after it, is still a
    /// torn tail.
    #[test]
    fn an_intact_record_of_unknown_kind_is_damage_not_a_torn_tail() {
        let kind_2 = |r: &mut Vec<u8>| r[REC_KIND_OFFSET] = 2;
        let reserved = |r: &mut Vec<u8>| r[crate::format::wal::RECORD_RESERVED[0].start] = 1;
        for (change, words) in [
            (&kind_2 as &dyn Fn(&mut Vec<u8>), "unknown record kind 2"),
            (&reserved, "reserved"),
        ] {
            let scanned = scan_with_second(change, true);
            assert_eq!(scanned.records.len(), 1);
            let damage = scanned.damage.expect("damage");
            assert_eq!((damage.lsn, damage.dropped_lsns), (2, 2..=3));
            assert!(
                damage.detail.contains(words) && damage.detail.contains("CRC and LSN hold"),
                "{}",
                damage.detail
            );
        }
        // Cut short, the third record lost with it: a torn tail.
        let torn = scan_with_second(|r| r.truncate(r.len() - 3), false);
        assert_eq!(torn.records.len(), 1);
        assert!(torn.damage.is_none() && torn.stop_reason.is_some());
    }
}

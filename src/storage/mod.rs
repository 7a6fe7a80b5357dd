//! Files, mappings, the WAL and the lock, behind a [`Storage`] trait so a
//! simulator can stand in for the file system (fault injection, counting).

mod aligned;
mod counting;
pub(crate) mod fs;
mod gated;
mod mem;
pub mod sim;
mod snapshot;
pub(crate) use snapshot::snapshot;
pub mod wal;

use std::io;
use std::ops::Deref;
use std::sync::Arc;

use thiserror::Error;

use crate::format::FormatError;

pub use aligned::{AlignedBuf, AlignedFloats};
pub use counting::{CountingStorage, IoCounts};
pub use fs::FileStorage;
pub use gated::{GateControl, GatedStorage};
pub use mem::MemStorage;
pub use sim::{FaultKind, FaultPlan, Loss, SimStorage};

pub const MANIFEST_FILE: &str = "MANIFEST";
pub const MANIFEST_TMP_FILE: &str = "MANIFEST.tmp";
pub const WAL_FILE: &str = "wal.log";
pub const WAL_TMP_FILE: &str = "wal.tmp";
pub const LOCK_FILE: &str = "LOCK";

/// Data file names carry the manifest's generation from 1 on; generation 0
/// (every bank until its first `compact`) uses the plain names.
fn generation_suffix(generation: u32) -> String {
    if generation == 0 {
        String::new()
    } else {
        format!(".g{generation}")
    }
}

pub fn payload_file(generation: u32) -> String {
    format!("payloads{}.log", generation_suffix(generation))
}

pub fn table_segment_file(generation: u32, segment: u32) -> String {
    format!("nodes-{segment:06}{}.seg", generation_suffix(generation))
}

pub fn vector_segment_file(generation: u32, segment: u32) -> String {
    format!("vectors-{segment:06}{}.seg", generation_suffix(generation))
}

/// The int8 side column of a precision-2 bank (derived from `vectors-*`).
pub fn qvector_segment_file(generation: u32, segment: u32) -> String {
    format!("qvectors-{segment:06}{}.seg", generation_suffix(generation))
}

/// The generation a data file belongs to, or None if `name` is not one.
pub fn data_file_generation(name: &str) -> Option<u32> {
    let stem = name.strip_suffix(".seg").or_else(|| name.strip_suffix(".log"))?;
    let kinds = ["nodes-", "vectors-", "qvectors-", "payloads"];
    if !kinds.iter().any(|k| stem.starts_with(k)) {
        return None;
    }
    match stem.rsplit_once(".g") {
        Some((_, g)) => g.parse().ok(),
        None => Some(0),
    }
}

/// Each message is complete by itself (it names its cause), so the cause
/// is not also exposed as `source()`: a chain printer (anyhow's `{:#}`)
/// would print it twice ("Is a directory: Is a directory").
#[derive(Debug, Error)]
pub enum StorageError {
    #[error("{op} {file}: {cause}")]
    Io {
        op: &'static str,
        file: String,
        cause: io::Error,
    },
    #[error("corrupt {file} at offset {offset_bytes}: {error}")]
    Corrupt {
        file: String,
        offset_bytes: u64,
        error: FormatError,
    },
    #[error("bank is locked by another process ({file}){}", gave_up_after(*waited_ms))]
    Locked {
        file: String,
        /// How long the opener waited for the lock (`Bank::open_dir_waiting`).
        waited_ms: u64,
    },
}

fn gave_up_after(waited_ms: u64) -> String {
    match waited_ms {
        0 => String::new(),
        _ => format!("; gave up after waiting {waited_ms} ms for it"),
    }
}

impl StorageError {
    pub fn io(op: &'static str, file: impl Into<String>) -> impl FnOnce(io::Error) -> StorageError {
        let file = file.into();
        move |cause| StorageError::Io { op, file, cause }
    }

    /// Wraps a decode error found at `base_offset_bytes` within `file`.
    pub fn corrupt(file: impl Into<String>, base_offset_bytes: u64, error: FormatError) -> StorageError {
        let offset_bytes = base_offset_bytes + error.offset_bytes();
        StorageError::Corrupt {
            file: file.into(),
            offset_bytes,
            error,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Existing file, read only.
    Read,
    /// Existing file, read and write.
    ReadWrite,
    /// Read and write, created empty if missing.
    Create,
    /// As `Create`, for bulk bytes no one reads soon (a frozen copy, a
    /// bulk load's vectors):
    /// writes whose memory, offset and length are multiples of
    /// [`DIRECT_ALIGN_BYTES`] bypass the page cache where the file system
    /// allows (Linux `O_DIRECT`). Durability is unchanged: only
    /// `sync_data` makes anything durable. Simulated storages treat it as
    /// `Create`.
    CreateUncached,
}

/// The alignment of a write that may bypass the page cache
/// (`OpenMode::CreateUncached`): the largest logical block size of
/// common disks, so one constant serves every device.
pub const DIRECT_ALIGN_BYTES: usize = 4096;

/// A read-only view of a whole file. For real files this is a shared
/// memory map, so the bytes are paged in on demand and never copied.
#[derive(Clone)]
pub struct Mapping {
    inner: Arc<dyn MappedBytes>,
}

pub trait MappedBytes: Send + Sync {
    fn bytes(&self) -> &[u8];
    /// Maps into this process now the file's pages the page cache already
    /// holds, as reading them would, so a later first read of them takes
    /// no page fault; never reads the disk. A hint: nothing changes if it
    /// is not done.
    fn populate(&self) {}
}

impl Mapping {
    pub fn new(inner: Arc<dyn MappedBytes>) -> Mapping {
        Mapping { inner }
    }

    /// See [`MappedBytes::populate`].
    pub fn populate(&self) {
        self.inner.populate();
    }
}

impl Deref for Mapping {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.inner.bytes()
    }
}

/// One open file.
pub trait StorageFile: Send + Sync {
    fn read_exact_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()>;
    fn write_all_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()>;
    fn len_bytes(&self) -> io::Result<u64>;
    fn set_len(&self, len_bytes: u64) -> io::Result<()>;
    /// Makes every completed write to this file durable (fdatasync).
    fn sync_data(&self) -> io::Result<()>;
    /// Asks the OS to start writing `len_bytes` written at `offset_bytes`
    /// back to the disk now, without waiting (Linux: `sync_file_range`
    /// with `SYNC_FILE_RANGE_WRITE`). A hint with no durability meaning:
    /// only `sync_data` makes anything durable. Bulk writers call it so
    /// dirty pages never pile up to gigabytes for the final fdatasync (or
    /// a memory-capped cgroup) to flush at once. An error is an I/O
    /// failure like a failed write.
    fn start_writeback(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()>;
    /// Tells the OS that the range will not be read again soon, so it may
    /// drop its clean, unmapped cached pages (Linux `posix_fadvise` with
    /// `POSIX_FADV_DONTNEED`) and reuse their memory. A hint: it never
    /// changes the file's bytes, so it reports nothing.
    fn drop_cache(&self, offset_bytes: u64, len_bytes: u64);
    /// Maps the whole file as it is now, read only. The engine maps only
    /// fixed-size segments, so a mapping is never invalidated by growth.
    fn map(&self) -> io::Result<Mapping>;
}

/// The directory a bank lives in.
pub trait Storage: Send + Sync {
    fn open(&self, name: &str, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>>;
    fn exists(&self, name: &str) -> io::Result<bool>;
    /// Atomically replaces `to` with `from`.
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    fn remove(&self, name: &str) -> io::Result<()>;
    /// Names of the files in the directory, in any order.
    fn list(&self) -> io::Result<Vec<String>>;
    /// Makes creations and renames in the directory durable.
    fn sync_dir(&self) -> io::Result<()>;
    /// Takes the single-writer lock without waiting; the lock is held until
    /// the returned guard is dropped.
    fn try_lock_writer(&self) -> Result<Box<dyn Send + Sync>, StorageError>;
    /// How to name `name` in messages (a path for real files).
    fn describe(&self, name: &str) -> String;
}

/// Bulk writes go out in pieces of this size, each followed by a
/// writeback hint (RocksDB's `bytes_per_sync` idea).
pub const BULK_WRITE_PIECE_BYTES: usize = 4 << 20;

/// Writes `bytes` at `offset_bytes` for a bulk path (checkpoint segments
/// and payloads, compact, freeze): in pieces of at most
/// `BULK_WRITE_PIECE_BYTES` that end on multiples of it in the file, each
/// handed to [`StorageFile::start_writeback`] once written. The caller's
/// later `sync_data` is still what makes the bytes durable.
///
/// Why aligned: a buffered write fills the page cache with folios no
/// larger than the aligned blocks it covers whole, and a 2 MiB folio is
/// what a later process maps with one page-table entry instead of 32
/// faults of 64 KiB. A piece that straddles an aligned 2 MiB block leaves
/// it in small folios.
pub fn write_bulk_at(file: &dyn StorageFile, bytes: &[u8], offset_bytes: u64) -> io::Result<()> {
    let piece_bytes = BULK_WRITE_PIECE_BYTES as u64;
    let mut at = offset_bytes;
    let mut rest = bytes;
    while !rest.is_empty() {
        let to_boundary = piece_bytes - at % piece_bytes;
        let (piece, next) = rest.split_at(rest.len().min(to_boundary as usize));
        file.write_all_at(piece, at)?;
        file.start_writeback(at, piece.len() as u64)?;
        at += piece.len() as u64;
        rest = next;
    }
    Ok(())
}

/// The `Storage` methods a wrapper passes to its `inner` storage unchanged
/// (every one but `open`), for wrappers that act on file operations only.
macro_rules! forward_directory_ops {
    () => {
        fn exists(&self, name: &str) -> std::io::Result<bool> {
            self.inner.exists(name)
        }
        fn rename(&self, from: &str, to: &str) -> std::io::Result<()> {
            self.inner.rename(from, to)
        }
        fn remove(&self, name: &str) -> std::io::Result<()> {
            self.inner.remove(name)
        }
        fn list(&self) -> std::io::Result<Vec<String>> {
            self.inner.list()
        }
        fn sync_dir(&self) -> std::io::Result<()> {
            self.inner.sync_dir()
        }
        fn try_lock_writer(&self) -> Result<Box<dyn Send + Sync>, StorageError> {
            self.inner.try_lock_writer()
        }
        fn describe(&self, name: &str) -> String {
            self.inner.describe(name)
        }
    };
}
pub(crate) use forward_directory_ops;

/// The `StorageFile` methods a wrapper that watches reads, writes or maps
/// passes to its `inner` file unchanged.
macro_rules! forward_size_ops {
    () => {
        fn len_bytes(&self) -> std::io::Result<u64> {
            self.inner.len_bytes()
        }
        fn set_len(&self, len_bytes: u64) -> std::io::Result<()> {
            self.inner.set_len(len_bytes)
        }
        fn sync_data(&self) -> std::io::Result<()> {
            self.inner.sync_data()
        }
        fn drop_cache(&self, offset_bytes: u64, len_bytes: u64) {
            self.inner.drop_cache(offset_bytes, len_bytes)
        }
    };
}
pub(crate) use forward_size_ops;

/// Reads a whole small file (manifest, WAL) through the storage layer.
pub fn read_all(storage: &dyn Storage, name: &str) -> Result<Vec<u8>, StorageError> {
    let file = storage
        .open(name, OpenMode::Read)
        .map_err(StorageError::io("open", storage.describe(name)))?;
    let len = file
        .len_bytes()
        .map_err(StorageError::io("stat", storage.describe(name)))?;
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, 0)
        .map_err(StorageError::io("read", storage.describe(name)))?;
    Ok(buf)
}

/// Writes `bytes` as the new content of `name` atomically: temp file,
/// fsync, rename, directory fsync. A crash leaves the old or the new file.
pub fn replace_atomically(storage: &dyn Storage, name: &str, tmp: &str, bytes: &[u8]) -> Result<(), StorageError> {
    replace_atomically_reporting(storage, name, tmp, bytes).map_err(|(e, _)| e)
}

/// As [`replace_atomically`]; a failure also says whether the rename had
/// happened (then only the directory fsync failed: the new file is in
/// place for this machine's running kernel, and may or may not survive a
/// power loss).
pub fn replace_atomically_reporting(
    storage: &dyn Storage,
    name: &str,
    tmp: &str,
    bytes: &[u8],
) -> Result<(), (StorageError, bool)> {
    let desc = storage.describe(tmp);
    let before = |e| (e, false);
    let file = storage
        .open(tmp, OpenMode::Create)
        .map_err(StorageError::io("create", desc.clone()))
        .map_err(before)?;
    file.set_len(0)
        .map_err(StorageError::io("truncate", desc.clone()))
        .map_err(before)?;
    file.write_all_at(bytes, 0)
        .map_err(StorageError::io("write", desc.clone()))
        .map_err(before)?;
    file.sync_data()
        .map_err(StorageError::io("fsync", desc))
        .map_err(before)?;
    drop(file);
    storage
        .rename(tmp, name)
        .map_err(StorageError::io("rename", storage.describe(name)))
        .map_err(before)?;
    storage
        .sync_dir()
        .map_err(|e| (StorageError::io("fsync directory", storage.describe("."))(e), true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Records the (offset, length) of every write and writeback hint.
    #[derive(Default)]
    struct Pieces {
        writes: Mutex<Vec<(u64, u64)>>,
        hints: Mutex<Vec<(u64, u64)>>,
    }

    impl StorageFile for Pieces {
        fn read_exact_at(&self, _buf: &mut [u8], _offset_bytes: u64) -> io::Result<()> {
            unimplemented!("not read")
        }
        fn write_all_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
            self.writes.lock().unwrap().push((offset_bytes, buf.len() as u64));
            Ok(())
        }
        fn len_bytes(&self) -> io::Result<u64> {
            Ok(0)
        }
        fn set_len(&self, _len_bytes: u64) -> io::Result<()> {
            Ok(())
        }
        fn sync_data(&self) -> io::Result<()> {
            Ok(())
        }
        fn start_writeback(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
            self.hints.lock().unwrap().push((offset_bytes, len_bytes));
            Ok(())
        }
        fn drop_cache(&self, _offset_bytes: u64, _len_bytes: u64) {
            unimplemented!("not dropped")
        }
        fn map(&self) -> io::Result<Mapping> {
            unimplemented!("not mapped")
        }
    }

    /// Bulk pieces cover the bytes in order, each hinted, none longer than
    /// a piece, and none crossing a multiple of the piece size in the file
    /// (so whole aligned blocks are written by one write each).
    #[test]
    fn bulk_pieces_end_on_aligned_boundaries() {
        let piece = BULK_WRITE_PIECE_BYTES as u64;
        for (start, len) in [
            (0u64, 9 * piece as usize + 5),
            (3 * piece / 4 + 7, 2 * piece as usize),
            (piece - 1, 2),
        ] {
            let file = Pieces::default();
            write_bulk_at(&file, &vec![0u8; len], start).unwrap();
            let writes = file.writes.lock().unwrap().clone();
            assert_eq!(writes, *file.hints.lock().unwrap());
            let mut at = start;
            for &(offset, n) in &writes {
                assert_eq!(offset, at, "{writes:?}");
                assert!(n > 0 && n <= piece, "{writes:?}");
                assert_eq!(
                    offset / piece,
                    (offset + n - 1) / piece,
                    "piece crosses a boundary: {writes:?}"
                );
                at += n;
            }
            assert_eq!(at, start + len as u64);
        }
    }
}

//! Real files in a directory.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{LOCK_FILE, MappedBytes, Mapping, OpenMode, Storage, StorageError, StorageFile};

pub struct FileStorage {
    dir: PathBuf,
}

impl FileStorage {
    pub fn new(dir: impl AsRef<Path>) -> FileStorage {
        FileStorage {
            dir: dir.as_ref().to_path_buf(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

struct RealFile {
    file: File,
    /// The same file opened with `O_DIRECT` (`OpenMode::CreateUncached`,
    /// where the file system takes it): aligned writes go through it.
    direct: Option<File>,
}

struct RealMap(memmap2::Mmap);

impl MappedBytes for RealMap {
    fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// Reads one byte per 64 KiB whose first page the page cache holds:
    /// each such read is a minor fault that maps the cached pages around
    /// it (the kernel's default `fault_around_bytes` is 64 KiB), which
    /// measured cheaper than `MADV_POPULATE_READ` (a page-table walk per
    /// page). Pages not cached are left to the scan: populating never
    /// reads the disk, so under memory pressure it evicts nothing.
    #[cfg(target_os = "linux")]
    fn populate(&self) {
        const WINDOW_BYTES: usize = 64 << 10;
        let bytes: &[u8] = &self.0;
        let Some(resident) = resident_pages(&self.0) else {
            return;
        };
        let mut sum = 0u8;
        for at in (0..bytes.len()).step_by(WINDOW_BYTES) {
            if resident.get(at / PAGE_BYTES).is_some_and(|b| b & 1 != 0) {
                sum = sum.wrapping_add(bytes[at]);
            }
        }
        std::hint::black_box(sum);
    }
}

/// The page size `resident_pages` reports in (mincore's unit on the
/// platforms deltamem runs on).
#[cfg(target_os = "linux")]
const PAGE_BYTES: usize = 4096;

/// One byte per 4 KiB page of `map`, bit 0 set where the page cache holds
/// the page (Linux `mincore`); None where the call fails or the system's
/// page is not 4 KiB.
#[cfg(target_os = "linux")]
fn resident_pages(map: &memmap2::Mmap) -> Option<Vec<u8>> {
    if rustix::param::page_size() != PAGE_BYTES {
        return None;
    }
    let mut out = vec![0u8; map.len().div_ceil(PAGE_BYTES)];
    // SAFETY: `map` is a live mapping of `map.len()` bytes starting at a
    // page-aligned address (mmap returns one); mincore writes one byte
    // per page of that range into `out`, which holds exactly that many,
    // and reads no byte of the mapping.
    let status = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, map.len(), out.as_mut_ptr()) };
    (status == 0).then_some(out)
}

struct EmptyMap;

impl MappedBytes for EmptyMap {
    fn bytes(&self) -> &[u8] {
        &[]
    }
}

impl StorageFile for RealFile {
    fn read_exact_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset_bytes)
    }

    fn write_all_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        if let Some(direct) = self.direct.as_ref().filter(|_| direct_aligned(buf, offset_bytes)) {
            match direct.write_all_at(buf, offset_bytes) {
                // A device whose blocks are larger than DIRECT_ALIGN_BYTES
                // refuses the write before writing anything: write it
                // through the page cache instead.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                done => return done,
            }
        }
        self.file.write_all_at(buf, offset_bytes)
    }

    fn len_bytes(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn set_len(&self, len_bytes: u64) -> io::Result<()> {
        self.file.set_len(len_bytes)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn start_writeback(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        start_writeback(&self.file, offset_bytes, len_bytes)
    }

    fn drop_cache(&self, offset_bytes: u64, len_bytes: u64) {
        drop_cache(&self.file, offset_bytes, len_bytes)
    }

    fn map(&self) -> io::Result<Mapping> {
        if self.len_bytes()? == 0 {
            return Ok(Mapping::new(Arc::new(EmptyMap)));
        }
        // SAFETY: the mapping stays valid and every byte read through it
        // is a plain integer for which any value is meaningful:
        // * The engine maps only segment files. They are created at their
        //   final size and never shrunk while a manifest refers to them
        //   (compact writes a new generation and removes the old files,
        //   which leaves existing mappings intact), so no access faults.
        // * Another process (the writer) changes a mapped segment only in
        //   a checkpoint, in two ways. It writes rows and vectors of new
        //   nodes past this handle's `node_count`, which this handle never
        //   reads (a load writes them with `O_DIRECT`; the kernel drops the
        //   cached pages such a write covers, so a later read of them
        //   through the mapping sees the new bytes). And it rewrites rows
        //   of existing nodes in place, whole 128-byte images with a fresh
        //   CRC, where only `success_hits`, `retrievals`, `flags` and
        //   `link` differ from before; vectors are never rewritten.
        // * Rows and vectors are CRC-checked when the segment is first
        //   mapped and `Bank::row` re-checks a row's CRC on every read, so
        //   a row caught mid-rewrite is an error there (readers retry it),
        //   never a wrong value. The scan is the exception: for speed it
        //   reads `tree`, `label`, `depth`, `flags` and `link` straight from
        //   the mapping, without the CRC. `tree`, `label` and `depth` are
        //   immutable, so a rewrite stores the same bytes. `flags` only go
        //   up (FLAG_CONSOLIDATED is set once, never cleared) and `link`
        //   changes only with it, from NODE_NONE to the new root. The scan
        //   uses them only in comparisons (no index or pointer is derived
        //   from them), and masks the flag with `consolidation_in_force`:
        //   a consolidation into a root this handle cannot see (`link` >=
        //   its node count) is ignored. The worst a torn read can do is
        //   show or hide one node for one query, as if the query had run
        //   just before or after the writer's checkpoint.
        let map = unsafe { memmap2::Mmap::map(&self.file)? };
        Ok(Mapping::new(Arc::new(RealMap(map))))
    }
}

/// `sync_file_range(SYNC_FILE_RANGE_WRITE)`: queues the range's dirty
/// pages for writeback and returns. Without a WAIT flag it does not consume
/// the file's writeback-error state, so a later fdatasync still reports
/// any failure of these pages. A file system that lacks the call answers
/// Ok (nothing to hint); any other failure (EIO, ENOSPC) is reported.
#[cfg(target_os = "linux")]
fn start_writeback(file: &File, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let too_far = |_| io::Error::from(io::ErrorKind::InvalidInput);
    let offset = i64::try_from(offset_bytes).map_err(too_far)?;
    let len = i64::try_from(len_bytes).map_err(too_far)?;
    // SAFETY: the call takes integers only and touches no memory of this
    // process; the descriptor stays open for the call (`file` is
    // borrowed), so it cannot name another file.
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE) };
    if rc == 0 {
        return Ok(());
    }
    let error = io::Error::last_os_error();
    match error.raw_os_error() {
        // A file system without the call (some FUSE and network ones): the
        // hint is only a hint, the later fdatasync still makes it durable.
        Some(libc::ENOSYS | libc::EINVAL | libc::EOPNOTSUPP | libc::ESPIPE) => Ok(()),
        _ => Err(error),
    }
}

/// Elsewhere there is no portable equivalent; the hint does nothing.
#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File, _offset_bytes: u64, _len_bytes: u64) -> io::Result<()> {
    Ok(())
}

/// `posix_fadvise(POSIX_FADV_DONTNEED)`: the kernel drops the range's
/// clean cached pages that no process maps, so their memory is free for
/// the next writes at once. Dirty and mapped pages stay. Only a hint: an
/// error says nothing about the file's bytes, so none is reported.
#[cfg(target_os = "linux")]
fn drop_cache(file: &File, offset_bytes: u64, len_bytes: u64) {
    if let Some(len) = std::num::NonZeroU64::new(len_bytes) {
        let _ = rustix::fs::fadvise(file, offset_bytes, Some(len), rustix::fs::Advice::DontNeed);
    }
}

#[cfg(not(target_os = "linux"))]
fn drop_cache(_file: &File, _offset_bytes: u64, _len_bytes: u64) {}

/// Whether a write can go through an `O_DIRECT` descriptor: its memory,
/// file offset and length all on `DIRECT_ALIGN_BYTES` boundaries.
fn direct_aligned(buf: &[u8], offset_bytes: u64) -> bool {
    let align = super::DIRECT_ALIGN_BYTES;
    (buf.as_ptr() as usize).is_multiple_of(align)
        && offset_bytes.is_multiple_of(align as u64)
        && buf.len().is_multiple_of(align)
}

/// Opens `path` with `opts` if it is a regular file. Anything else in a
/// bank's place is refused rather than used: opening a FIFO for reading
/// waits for a writer forever, and a device would be read as data. The
/// open does not wait (`O_NONBLOCK`, which changes nothing for a regular
/// file's reads and writes), so a FIFO is seen and refused.
fn open_regular(opts: &mut OpenOptions, path: &Path) -> io::Result<File> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NONBLOCK);
    }
    let file = opts.open(path)?;
    if !file.metadata()?.file_type().is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
    }
    Ok(file)
}

/// The file at `path` opened a second time for direct writes, or None
/// where the file system has no `O_DIRECT` (tmpfs, some FUSE ones).
#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()
}

#[cfg(not(target_os = "linux"))]
fn open_direct(_path: &Path) -> Option<File> {
    None
}

impl Storage for FileStorage {
    fn open(&self, name: &str, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        let mut opts = OpenOptions::new();
        match mode {
            OpenMode::Read => opts.read(true),
            OpenMode::ReadWrite => opts.read(true).write(true),
            OpenMode::Create | OpenMode::CreateUncached => opts.read(true).write(true).create(true),
        };
        let path = self.dir.join(name);
        let file = open_regular(&mut opts, &path)?;
        let direct = match mode {
            OpenMode::CreateUncached => open_direct(&path),
            _ => None,
        };
        Ok(Arc::new(RealFile { file, direct }))
    }

    fn exists(&self, name: &str) -> io::Result<bool> {
        self.dir.join(name).try_exists()
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        std::fs::rename(self.dir.join(from), self.dir.join(to))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        std::fs::remove_file(self.dir.join(name))
    }

    fn list(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            if let Ok(name) = entry?.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn sync_dir(&self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }

    fn try_lock_writer(&self) -> Result<Box<dyn Send + Sync>, StorageError> {
        let desc = self.describe(LOCK_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.dir.join(LOCK_FILE))
            .map_err(StorageError::io("open", desc.clone()))?;
        match file.try_lock() {
            Ok(()) => Ok(Box::new(file)),
            Err(TryLockError::WouldBlock) => Err(StorageError::Locked {
                file: desc,
                waited_ms: 0,
            }),
            Err(TryLockError::Error(cause)) => Err(StorageError::Io {
                op: "lock",
                file: desc,
                cause,
            }),
        }
    }

    fn describe(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

/// Page-cache probes for tests of the writes that bypass it.
#[cfg(all(test, target_os = "linux"))]
pub(crate) mod cache_probe {
    use std::fs::{File, OpenOptions};
    use std::os::unix::fs::FileExt;
    use std::path::Path;

    /// How many of the file's pages the page cache holds.
    pub fn cached_pages(path: &Path) -> usize {
        let file = File::open(path).unwrap();
        // SAFETY: a read-only map of which no byte is read: mincore
        // (`resident_pages`) looks only at the page cache's state.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let resident = super::resident_pages(&map).expect("mincore of a live mapping");
        resident.iter().filter(|&&b| b & 1 != 0).count()
    }

    /// Whether this file system keeps an `O_DIRECT` write out of the page
    /// cache (some accept the flag and cache anyway, as tmpfs does), asked
    /// of it directly with a file of its own, not through `open_direct`.
    /// `block`: 4 KiB-aligned memory, a whole number of 4 KiB blocks.
    pub fn direct_writes_bypass_the_cache(dir: &Path, block: &[u8]) -> bool {
        use std::os::unix::fs::OpenOptionsExt;
        let probe = dir.join("probe");
        let opened = OpenOptions::new()
            .write(true)
            .create(true)
            .custom_flags(libc::O_DIRECT)
            .open(&probe);
        opened.is_ok_and(|f| f.write_all_at(block, 0).is_ok()) && cached_pages(&probe) == 0
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::cache_probe::{cached_pages, direct_writes_bypass_the_cache};
    use super::*;

    /// Minor page faults taken so far by the calling thread.
    fn thread_minor_faults() -> i64 {
        let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: getrusage fills the rusage it is given, a valid,
        // zeroed one; RUSAGE_THREAD counts only the calling thread, so
        // other tests' faults do not show.
        let status = unsafe { libc::getrusage(libc::RUSAGE_THREAD, usage.as_mut_ptr()) };
        assert_eq!(status, 0);
        // SAFETY: initialised: zeroed above, then filled by getrusage.
        unsafe { usage.assume_init() }.ru_minflt
    }

    /// Faults taken reading one byte of every page of `map`.
    fn faults_reading(map: &Mapping) -> i64 {
        let before = thread_minor_faults();
        let sum = map.iter().step_by(4096).fold(0u8, |a, b| a.wrapping_add(*b));
        std::hint::black_box(sum);
        thread_minor_faults() - before
    }

    /// `populate` maps a cached file's pages, so reading them then takes
    /// no fault; it leaves pages that are not cached alone (no disk read).
    #[test]
    fn populate_maps_cached_pages_and_reads_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let storage = FileStorage::new(dir.path());
        let pages = 2048;
        let file = storage.open("f", OpenMode::Create).unwrap();
        // Page by page: the page cache then holds small folios (a large
        // write gets large ones, mapped a whole folio per fault).
        for page in 0..pages {
            file.write_all_at(&[7u8; 4096], (page * 4096) as u64).unwrap();
        }
        let (plain, populated) = (file.map().unwrap(), file.map().unwrap());
        populated.populate();
        let (plain_faults, populated_faults) = (faults_reading(&plain), faults_reading(&populated));
        assert!(
            plain_faults >= 64,
            "reading {pages} unmapped pages took {plain_faults} faults"
        );
        assert!(
            populated_faults <= 4,
            "reading populated pages took {populated_faults} faults"
        );

        // Mapped pages stay cached: unmap them before dropping the cache.
        drop((plain, populated));
        file.sync_data().unwrap();
        file.drop_cache(0, (pages * 4096) as u64);
        if cached_pages(&dir.path().join("f")) == 0 {
            file.map().unwrap().populate();
            assert_eq!(cached_pages(&dir.path().join("f")), 0, "populate read the disk");
        }
    }

    /// An uncached file takes aligned writes around the page cache and
    /// unaligned ones through it, and reads back both, by read and map.
    #[test]
    fn uncached_files_write_aligned_blocks_around_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let storage = FileStorage::new(dir.path());
        let file = storage.open("f", OpenMode::CreateUncached).unwrap();
        file.set_len(64 * 1024).unwrap();
        let mut aligned = vec![0u8; 32 * 1024 + DIRECT];
        let start = aligned.as_ptr().align_offset(DIRECT);
        let block = &mut aligned[start..start + 32 * 1024];
        block.iter_mut().enumerate().for_each(|(i, b)| *b = (i % 251) as u8);
        file.write_all_at(block, 0).unwrap();
        if direct_writes_bypass_the_cache(dir.path(), block) {
            assert_eq!(
                cached_pages(&dir.path().join("f")),
                0,
                "the aligned write bypassed the cache"
            );
        } else {
            eprintln!("O_DIRECT writes are cached on this file system: only the read-back is checked");
        }
        file.write_all_at(b"unaligned", 40_000).unwrap();
        let mut back = vec![0u8; 32 * 1024];
        file.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(back, block);
        let map = file.map().unwrap();
        assert_eq!(&map[..32 * 1024], block);
        assert_eq!(&map[40_000..40_009], b"unaligned");
        assert!(map[32 * 1024..40_000].iter().all(|&b| b == 0));
    }

    const DIRECT: usize = super::super::DIRECT_ALIGN_BYTES;
}

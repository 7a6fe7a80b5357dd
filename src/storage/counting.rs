//! A wrapper that counts the bytes read and written, the writeback hints
//! and the files mapped per file name,
//! so tests can prove what an operation (such as open) touches.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};

use super::{Mapping, OpenMode, Storage, StorageError, StorageFile};

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IoCounts {
    /// Bytes returned by `read_exact_at`, per file name.
    pub read_bytes: BTreeMap<String, u64>,
    /// Number of `map` calls, per file name.
    pub maps: BTreeMap<String, u64>,
    /// Bytes passed to `write_all_at`, per file name.
    pub written_bytes: BTreeMap<String, u64>,
    /// Bytes covered by `start_writeback` hints, per file name.
    pub writeback_bytes: BTreeMap<String, u64>,
}

pub struct CountingStorage<S> {
    inner: S,
    counts: Arc<Mutex<IoCounts>>,
}

impl<S: Storage> CountingStorage<S> {
    pub fn new(inner: S) -> CountingStorage<S> {
        CountingStorage {
            inner,
            counts: Arc::default(),
        }
    }

    pub fn counts(&self) -> IoCounts {
        self.counts.lock().unwrap().clone()
    }

    pub fn reset(&self) {
        *self.counts.lock().unwrap() = IoCounts::default();
    }
}

struct CountingFile {
    name: String,
    inner: Arc<dyn StorageFile>,
    counts: Arc<Mutex<IoCounts>>,
}

impl CountingFile {
    /// Adds `n` to this file's entry in the map `which` picks.
    fn add(&self, which: impl FnOnce(&mut IoCounts) -> &mut BTreeMap<String, u64>, n: u64) {
        *which(&mut self.counts.lock().unwrap())
            .entry(self.name.clone())
            .or_default() += n;
    }
}

impl StorageFile for CountingFile {
    fn read_exact_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        self.inner.read_exact_at(buf, offset_bytes)?;
        self.add(|c| &mut c.read_bytes, buf.len() as u64);
        Ok(())
    }
    fn write_all_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        self.inner.write_all_at(buf, offset_bytes)?;
        self.add(|c| &mut c.written_bytes, buf.len() as u64);
        Ok(())
    }
    fn start_writeback(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        self.inner.start_writeback(offset_bytes, len_bytes)?;
        self.add(|c| &mut c.writeback_bytes, len_bytes);
        Ok(())
    }
    super::forward_size_ops!();
    fn map(&self) -> io::Result<Mapping> {
        self.add(|c| &mut c.maps, 1);
        self.inner.map()
    }
}

impl<S: Storage> Storage for CountingStorage<S> {
    fn open(&self, name: &str, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        let inner = self.inner.open(name, mode)?;
        Ok(Arc::new(CountingFile {
            name: name.to_string(),
            inner,
            counts: self.counts.clone(),
        }))
    }
    super::forward_directory_ops!();
}

//! An in-memory directory: fast tests, and the base a fault-injecting
//! simulator builds on. Mappings are snapshots (the engine remaps after
//! every checkpoint, the only time mapped files change).

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::{Mapping, OpenMode, Storage, StorageError, StorageFile};

type Bytes = Arc<Mutex<Vec<u8>>>;

#[derive(Default, Clone)]
pub struct MemStorage {
    files: Arc<Mutex<BTreeMap<String, Bytes>>>,
    locked: Arc<AtomicBool>,
}

impl MemStorage {
    pub fn new() -> MemStorage {
        MemStorage::default()
    }

    /// A copy of a file's bytes (for tests that flip bits or inspect).
    pub fn file_bytes(&self, name: &str) -> Option<Vec<u8>> {
        let files = self.files.lock().unwrap();
        files.get(name).map(|b| b.lock().unwrap().clone())
    }

    /// Replaces a file's bytes (for corruption tests).
    pub fn set_file_bytes(&self, name: &str, bytes: Vec<u8>) {
        let mut files = self.files.lock().unwrap();
        files.insert(name.to_string(), Arc::new(Mutex::new(bytes)));
    }

    pub fn file_names(&self) -> Vec<String> {
        self.files.lock().unwrap().keys().cloned().collect()
    }
}

struct MemFile {
    bytes: Bytes,
    writable: bool,
}

fn read_only() -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, "file opened read only")
}

impl StorageFile for MemFile {
    fn read_exact_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        let data = self.bytes.lock().unwrap();
        let start = usize::try_from(offset_bytes).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        let end = start.checked_add(buf.len()).ok_or(io::ErrorKind::UnexpectedEof)?;
        let src = data.get(start..end).ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(src);
        Ok(())
    }

    fn write_all_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        if !self.writable {
            return Err(read_only());
        }
        let mut data = self.bytes.lock().unwrap();
        let start = offset_bytes as usize;
        let end = start + buf.len();
        if data.len() < end {
            data.resize(end, 0);
        }
        data[start..end].copy_from_slice(buf);
        Ok(())
    }

    fn len_bytes(&self) -> io::Result<u64> {
        Ok(self.bytes.lock().unwrap().len() as u64)
    }

    fn set_len(&self, len_bytes: u64) -> io::Result<()> {
        if !self.writable {
            return Err(read_only());
        }
        self.bytes.lock().unwrap().resize(len_bytes as usize, 0);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }

    fn start_writeback(&self, _offset_bytes: u64, _len_bytes: u64) -> io::Result<()> {
        Ok(())
    }

    /// Memory is the only cache here: nothing to drop.
    fn drop_cache(&self, _offset_bytes: u64, _len_bytes: u64) {}

    fn map(&self) -> io::Result<Mapping> {
        Ok(super::snapshot::snapshot(&self.bytes.lock().unwrap()))
    }
}

struct MemLock(Arc<AtomicBool>);

impl Drop for MemLock {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

impl Storage for MemStorage {
    fn open(&self, name: &str, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        let mut files = self.files.lock().unwrap();
        let bytes = match (files.get(name), mode) {
            (Some(b), _) => b.clone(),
            (None, OpenMode::Create | OpenMode::CreateUncached) => files.entry(name.to_string()).or_default().clone(),
            (None, _) => {
                return Err(io::Error::new(io::ErrorKind::NotFound, format!("{name} not found")));
            }
        };
        Ok(Arc::new(MemFile {
            bytes,
            writable: mode != OpenMode::Read,
        }))
    }

    fn exists(&self, name: &str) -> io::Result<bool> {
        Ok(self.files.lock().unwrap().contains_key(name))
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let mut files = self.files.lock().unwrap();
        let bytes = files
            .remove(from)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, from.to_string()))?;
        files.insert(to.to_string(), bytes);
        Ok(())
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        self.files.lock().unwrap().remove(name);
        Ok(())
    }

    fn list(&self) -> io::Result<Vec<String>> {
        Ok(self.file_names())
    }

    fn sync_dir(&self) -> io::Result<()> {
        Ok(())
    }

    fn try_lock_writer(&self) -> Result<Box<dyn Send + Sync>, StorageError> {
        if self.locked.swap(true, Ordering::SeqCst) {
            return Err(StorageError::Locked {
                file: "memory:LOCK".into(),
                waited_ms: 0,
            });
        }
        Ok(Box::new(MemLock(self.locked.clone())))
    }

    fn describe(&self, name: &str) -> String {
        format!("memory:{name}")
    }
}

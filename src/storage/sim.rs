//! A deterministic simulated directory for crash and fault testing.
//!
//! Every file keeps a durable image and the writes made since its last
//! fsync; the directory keeps its durable entries and the entry changes
//! made since its last fsync. Every mutating call is one numbered
//! operation; a [`FaultPlan`] can make operation k crash the "machine" or
//! fail with an I/O error. After a crash, [`SimStorage::crash_image`]
//! builds the directory a reboot could find, under a chosen [`Loss`]:
//! everything unsynced kept, all of it lost, the last write torn, or a
//! random subset of writes (reordering) with torn sectors.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};

use super::{Mapping, OpenMode, Storage, StorageError, StorageFile};

/// What operation `at_op` does instead of succeeding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The machine stops: this and every later mutating call fail.
    Crash,
    /// This call fails with EIO and has no effect. A failed fsync also
    /// forgets the file's unsynced writes without making them durable, as
    /// Linux does (the pages are marked clean), so a later fsync succeeds
    /// without them.
    Fail,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultPlan {
    pub at_op: u64,
    pub kind: FaultKind,
}

/// Which unsynced state a crash image keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// Process crash: the page cache survives, everything is kept.
    KeepAll,
    /// Power loss, nothing unsynced reached the disk.
    LoseUnsynced,
    /// Unsynced writes reached the disk in order, the last one torn at a
    /// seeded length.
    TornLast { seed: u64 },
    /// Each unsynced write reached the disk or not (seeded), some torn at a
    /// 512-byte sector boundary; directory changes: a seeded prefix.
    Subset { seed: u64 },
}

#[derive(Debug, Clone)]
enum Pending {
    Write { offset_bytes: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Clone, Default)]
struct Inode {
    durable: Vec<u8>,
    volatile: Vec<u8>,
    pending: Vec<Pending>,
}

#[derive(Debug, Default)]
struct SimState {
    inodes: Vec<Inode>,
    dir_durable: BTreeMap<String, usize>,
    dir_volatile: BTreeMap<String, usize>,
    /// Directory states after each unsynced entry change, oldest first.
    dir_history: Vec<BTreeMap<String, usize>>,
    op_count: u64,
    plan: Option<FaultPlan>,
    crashed: bool,
    locked: bool,
}

/// A simulated directory; clones share the same state.
#[derive(Clone, Default)]
pub struct SimStorage {
    state: Arc<Mutex<SimState>>,
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("simulated I/O error: {what}"))
}

/// Seeded xorshift64*: crash images here, and reproducible workloads in
/// the crash tests, the torture tool and the benchmarks. Not for secrets.
pub struct Rng(pub u64);

impl Rng {
    // Not an Iterator: the stream never ends, and callers draw one value
    // at a time alongside `next_f32`.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1) with 24 random bits (exact in f32).
    pub fn next_f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

fn apply(bytes: &mut Vec<u8>, p: &Pending) {
    match p {
        Pending::SetLen(len) => bytes.resize(*len as usize, 0),
        Pending::Write { offset_bytes, data } => {
            let start = *offset_bytes as usize;
            if bytes.len() < start + data.len() {
                bytes.resize(start + data.len(), 0);
            }
            bytes[start..start + data.len()].copy_from_slice(data);
        }
    }
}

impl SimState {
    /// Counts one mutating operation and decides its fate.
    fn begin(&mut self, what: &str) -> io::Result<Option<FaultKind>> {
        if self.crashed {
            return Err(eio(&format!("{what} after the crash")));
        }
        let op = self.op_count;
        self.op_count += 1;
        match self.plan {
            Some(FaultPlan {
                at_op,
                kind: FaultKind::Crash,
            }) if at_op == op => {
                self.crashed = true;
                Err(eio(&format!("crash at operation {op} ({what})")))
            }
            Some(FaultPlan {
                at_op,
                kind: FaultKind::Fail,
            }) if at_op == op => Ok(Some(FaultKind::Fail)),
            _ => Ok(None),
        }
    }

    fn dir_changed(&mut self) {
        self.dir_history.push(self.dir_volatile.clone());
    }

    fn image(&self, loss: Loss) -> SimState {
        let mut rng = Rng(match loss {
            Loss::TornLast { seed } | Loss::Subset { seed } => seed | 1,
            _ => 1,
        });
        let inodes = self
            .inodes
            .iter()
            .map(|inode| image_inode(inode, loss, &mut rng))
            .collect::<Vec<_>>();
        let dir = match loss {
            Loss::KeepAll | Loss::TornLast { .. } => self.dir_volatile.clone(),
            Loss::LoseUnsynced => self.dir_durable.clone(),
            Loss::Subset { .. } => {
                let keep = (rng.next() % (self.dir_history.len() as u64 + 1)) as usize;
                if keep == 0 {
                    self.dir_durable.clone()
                } else {
                    self.dir_history[keep - 1].clone()
                }
            }
        };
        let inodes = inodes
            .into_iter()
            .map(|d| Inode {
                durable: d.clone(),
                volatile: d,
                pending: Vec::new(),
            })
            .collect();
        SimState {
            inodes,
            dir_durable: dir.clone(),
            dir_volatile: dir,
            ..SimState::default()
        }
    }
}

fn image_inode(inode: &Inode, loss: Loss, rng: &mut Rng) -> Vec<u8> {
    let mut bytes = inode.durable.clone();
    match loss {
        Loss::KeepAll => return inode.volatile.clone(),
        Loss::LoseUnsynced => {}
        Loss::TornLast { .. } => {
            let n = inode.pending.len();
            for (i, p) in inode.pending.iter().enumerate() {
                match p {
                    Pending::Write { offset_bytes, data } if i + 1 == n && !data.is_empty() => {
                        let keep = (rng.next() % data.len() as u64) as usize;
                        apply(
                            &mut bytes,
                            &Pending::Write {
                                offset_bytes: *offset_bytes,
                                data: data[..keep].to_vec(),
                            },
                        );
                    }
                    _ => apply(&mut bytes, p),
                }
            }
        }
        Loss::Subset { .. } => {
            for p in &inode.pending {
                match (p, rng.next() % 4) {
                    (_, 0) => {}
                    (Pending::Write { offset_bytes, data }, 1) if data.len() > 512 => {
                        let sectors = data.len() / 512;
                        let keep = 512 * (1 + (rng.next() as usize % sectors));
                        apply(
                            &mut bytes,
                            &Pending::Write {
                                offset_bytes: *offset_bytes,
                                data: data[..keep.min(data.len())].to_vec(),
                            },
                        );
                    }
                    _ => apply(&mut bytes, p),
                }
            }
        }
    }
    bytes
}

impl SimStorage {
    pub fn new() -> SimStorage {
        SimStorage::default()
    }

    /// Arms a fault; operations are numbered from 0 since creation.
    pub fn set_plan(&self, plan: Option<FaultPlan>) {
        self.state.lock().unwrap().plan = plan;
    }

    /// Mutating operations performed so far (the crash-point space).
    pub fn op_count(&self) -> u64 {
        self.state.lock().unwrap().op_count
    }

    pub fn crashed(&self) -> bool {
        self.state.lock().unwrap().crashed
    }

    /// The directory a reboot after a crash now could find.
    pub fn crash_image(&self, loss: Loss) -> SimStorage {
        let image = self.state.lock().unwrap().image(loss);
        SimStorage {
            state: Arc::new(Mutex::new(image)),
        }
    }

    /// Current bytes of a file (for corruption tests).
    pub fn file_bytes(&self, name: &str) -> Option<Vec<u8>> {
        let s = self.state.lock().unwrap();
        s.dir_volatile.get(name).map(|&i| s.inodes[i].volatile.clone())
    }

    pub fn file_names(&self) -> Vec<String> {
        self.state.lock().unwrap().dir_volatile.keys().cloned().collect()
    }

    /// Overwrites a file's bytes durably (for corruption tests).
    pub fn set_file_bytes(&self, name: &str, bytes: Vec<u8>) {
        let mut s = self.state.lock().unwrap();
        if let Some(&i) = s.dir_volatile.get(name) {
            s.inodes[i] = Inode {
                durable: bytes.clone(),
                volatile: bytes,
                pending: Vec::new(),
            };
        }
    }
}

struct SimFile {
    state: Arc<Mutex<SimState>>,
    inode: usize,
    writable: bool,
}

impl SimFile {
    fn mutate(&self, what: &str, change: Pending) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "file opened read only"));
        }
        let mut s = self.state.lock().unwrap();
        if s.begin(what)?.is_some() {
            return Err(eio(what));
        }
        let inode = &mut s.inodes[self.inode];
        apply(&mut inode.volatile, &change);
        inode.pending.push(change);
        Ok(())
    }
}

impl StorageFile for SimFile {
    fn read_exact_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        let s = self.state.lock().unwrap();
        let data = &s.inodes[self.inode].volatile;
        let start = usize::try_from(offset_bytes).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        let src = start
            .checked_add(buf.len())
            .and_then(|end| data.get(start..end))
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(src);
        Ok(())
    }

    fn write_all_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        self.mutate(
            "write",
            Pending::Write {
                offset_bytes,
                data: buf.to_vec(),
            },
        )
    }

    fn len_bytes(&self) -> io::Result<u64> {
        Ok(self.state.lock().unwrap().inodes[self.inode].volatile.len() as u64)
    }

    fn set_len(&self, len_bytes: u64) -> io::Result<()> {
        self.mutate("set_len", Pending::SetLen(len_bytes))
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut s = self.state.lock().unwrap();
        let fault = s.begin("fsync")?;
        let inode = &mut s.inodes[self.inode];
        if fault.is_some() {
            inode.pending.clear();
            return Err(eio("fsync"));
        }
        for p in std::mem::take(&mut inode.pending) {
            apply(&mut inode.durable, &p);
        }
        Ok(())
    }

    /// Not an operation: the hint changes nothing about what is durable
    /// (a crash image depends only on writes and syncs), so it neither
    /// counts as a crash point nor fails. After a crash it fails like
    /// every other call that touches the machine.
    fn start_writeback(&self, _offset_bytes: u64, _len_bytes: u64) -> io::Result<()> {
        match self.state.lock().unwrap().crashed {
            true => Err(eio("writeback after the crash")),
            false => Ok(()),
        }
    }

    /// Memory is the only cache here: nothing to drop.
    fn drop_cache(&self, _offset_bytes: u64, _len_bytes: u64) {}

    fn map(&self) -> io::Result<Mapping> {
        Ok(super::snapshot::snapshot(
            &self.state.lock().unwrap().inodes[self.inode].volatile,
        ))
    }
}

struct SimLock(Arc<Mutex<SimState>>);

impl Drop for SimLock {
    fn drop(&mut self) {
        self.0.lock().unwrap().locked = false;
    }
}

impl Storage for SimStorage {
    fn open(&self, name: &str, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        let mut s = self.state.lock().unwrap();
        let inode = match (s.dir_volatile.get(name).copied(), mode) {
            (Some(i), _) => i,
            (None, OpenMode::Create | OpenMode::CreateUncached) => {
                if s.begin("create")?.is_some() {
                    return Err(eio("create"));
                }
                s.inodes.push(Inode::default());
                let i = s.inodes.len() - 1;
                s.dir_volatile.insert(name.to_string(), i);
                s.dir_changed();
                i
            }
            (None, _) => {
                return Err(io::Error::new(io::ErrorKind::NotFound, format!("{name} not found")));
            }
        };
        Ok(Arc::new(SimFile {
            state: self.state.clone(),
            inode,
            writable: mode != OpenMode::Read,
        }))
    }

    fn exists(&self, name: &str) -> io::Result<bool> {
        Ok(self.state.lock().unwrap().dir_volatile.contains_key(name))
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let mut s = self.state.lock().unwrap();
        if s.begin("rename")?.is_some() {
            return Err(eio("rename"));
        }
        let inode = s
            .dir_volatile
            .remove(from)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, from.to_string()))?;
        s.dir_volatile.insert(to.to_string(), inode);
        s.dir_changed();
        Ok(())
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        let mut s = self.state.lock().unwrap();
        if s.begin("remove")?.is_some() {
            return Err(eio("remove"));
        }
        s.dir_volatile.remove(name);
        s.dir_changed();
        Ok(())
    }

    fn list(&self) -> io::Result<Vec<String>> {
        Ok(self.file_names())
    }

    fn sync_dir(&self) -> io::Result<()> {
        let mut s = self.state.lock().unwrap();
        if s.begin("fsync directory")?.is_some() {
            return Err(eio("fsync directory"));
        }
        s.dir_durable = s.dir_volatile.clone();
        s.dir_history.clear();
        Ok(())
    }

    fn try_lock_writer(&self) -> Result<Box<dyn Send + Sync>, StorageError> {
        let mut s = self.state.lock().unwrap();
        if s.locked {
            return Err(StorageError::Locked {
                file: "sim:LOCK".into(),
                waited_ms: 0,
            });
        }
        s.locked = true;
        Ok(Box::new(SimLock(self.state.clone())))
    }

    fn describe(&self, name: &str) -> String {
        format!("sim:{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(s: &SimStorage, name: &str, bytes: &[u8], sync: bool) {
        let f = s.open(name, OpenMode::Create).unwrap();
        f.write_all_at(bytes, 0).unwrap();
        if sync {
            f.sync_data().unwrap();
        }
    }

    #[test]
    fn unsynced_data_and_entries_are_lost_only_when_asked() {
        let s = SimStorage::new();
        write(&s, "a", b"synced", true);
        s.sync_dir().unwrap();
        write(&s, "a", b"SYNCED", false);
        write(&s, "b", b"new", true); // data synced, entry not
        let lost = s.crash_image(Loss::LoseUnsynced);
        assert_eq!(lost.file_bytes("a").unwrap(), b"synced");
        assert!(lost.file_bytes("b").is_none());
        let kept = s.crash_image(Loss::KeepAll);
        assert_eq!(kept.file_bytes("a").unwrap(), b"SYNCED");
        assert_eq!(kept.file_bytes("b").unwrap(), b"new");
    }

    #[test]
    fn crash_plan_stops_everything_after_the_op() {
        let s = SimStorage::new();
        s.set_plan(Some(FaultPlan {
            at_op: 2,
            kind: FaultKind::Crash,
        }));
        let f = s.open("a", OpenMode::Create).unwrap(); // op 0
        f.write_all_at(b"x", 0).unwrap(); // op 1
        assert!(f.write_all_at(b"y", 1).is_err()); // op 2: crash
        assert!(f.sync_data().is_err());
        assert!(s.crashed());
        assert_eq!(s.crash_image(Loss::KeepAll).file_bytes("a").unwrap(), b"x");
    }

    #[test]
    fn failed_fsync_forgets_the_writes_it_covered() {
        let s = SimStorage::new();
        write(&s, "a", b"old", true);
        s.sync_dir().unwrap();
        let f = s.open("a", OpenMode::ReadWrite).unwrap();
        f.write_all_at(b"new", 0).unwrap();
        s.set_plan(Some(FaultPlan {
            at_op: s.op_count(),
            kind: FaultKind::Fail,
        }));
        assert!(f.sync_data().is_err());
        f.sync_data().unwrap(); // "succeeds", but the data never got there
        assert_eq!(s.file_bytes("a").unwrap(), b"new");
        assert_eq!(s.crash_image(Loss::LoseUnsynced).file_bytes("a").unwrap(), b"old");
    }

    #[test]
    fn torn_and_subset_images_mix_old_and_new_bytes() {
        let s = SimStorage::new();
        write(&s, "a", &[0u8; 4096], true);
        s.sync_dir().unwrap();
        let f = s.open("a", OpenMode::ReadWrite).unwrap();
        f.write_all_at(&[1u8; 4096], 0).unwrap();
        let mut saw_partial = false;
        for seed in 0..32 {
            for loss in [Loss::TornLast { seed }, Loss::Subset { seed }] {
                let b = s.crash_image(loss).file_bytes("a").unwrap();
                assert_eq!(b.len(), 4096);
                let ones = b.iter().filter(|&&x| x == 1).count();
                assert!(b[..ones].iter().all(|&x| x == 1), "prefix-shaped tear");
                saw_partial |= ones > 0 && ones < 4096;
            }
        }
        assert!(saw_partial);
    }
}

//! A wrapper that holds a write to chosen files until a test lets it go, so
//! a test can see what other threads can do while an operation (such as a
//! checkpoint's vector write) is stopped part way, without timing anything.

use std::io;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::{Mapping, OpenMode, Storage, StorageError, StorageFile};

#[derive(Default)]
struct Gate {
    /// The next matching write stops (cleared when one does).
    armed: bool,
    /// A write is stopped at the gate.
    held: bool,
    /// Stopped writes may go on.
    open: bool,
}

#[derive(Default)]
struct Shared {
    gate: Mutex<Gate>,
    changed: Condvar,
}

/// Passes everything through to `inner`, except that once `arm`ed, the
/// next `write_all_at` to a file whose name starts with the prefix waits
/// (before writing) until `release`.
pub struct GatedStorage<S> {
    inner: S,
    prefix: String,
    shared: Arc<Shared>,
}

impl<S: Storage> GatedStorage<S> {
    pub fn new(inner: S, prefix: &str) -> GatedStorage<S> {
        GatedStorage {
            inner,
            prefix: prefix.to_string(),
            shared: Arc::default(),
        }
    }

    /// A handle for arming, waiting and releasing (the storage itself is
    /// usually moved into a bank).
    pub fn control(&self) -> GateControl {
        GateControl(self.shared.clone())
    }
}

#[derive(Clone)]
pub struct GateControl(Arc<Shared>);

impl GateControl {
    /// Makes the next matching write stop at the gate.
    pub fn arm(&self) {
        let mut gate = self.0.gate.lock().unwrap();
        *gate = Gate {
            armed: true,
            ..Gate::default()
        };
    }

    /// Waits up to `timeout` for a write to stop at the gate; whether one did.
    pub fn wait_held(&self, timeout: Duration) -> bool {
        let gate = self.0.gate.lock().unwrap();
        let (gate, _) = self.0.changed.wait_timeout_while(gate, timeout, |g| !g.held).unwrap();
        gate.held
    }

    /// Lets the stopped write (and any later one) go on.
    pub fn release(&self) {
        let mut gate = self.0.gate.lock().unwrap();
        gate.open = true;
        gate.armed = false;
        self.0.changed.notify_all();
    }
}

struct GatedFile {
    inner: Arc<dyn StorageFile>,
    gated: bool,
    shared: Arc<Shared>,
}

impl GatedFile {
    /// Stops here if the gate is armed, until it is released. Bounded: a
    /// test that never releases fails its own wait, not this one forever.
    fn pass(&self) {
        const MAX_HOLD: Duration = Duration::from_secs(20);
        let mut gate = self.shared.gate.lock().unwrap();
        if !self.gated || !gate.armed {
            return;
        }
        gate.armed = false;
        gate.held = true;
        self.shared.changed.notify_all();
        let (mut gate, _) = self
            .shared
            .changed
            .wait_timeout_while(gate, MAX_HOLD, |g| !g.open)
            .unwrap();
        gate.held = false;
    }
}

impl StorageFile for GatedFile {
    fn read_exact_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        self.inner.read_exact_at(buf, offset_bytes)
    }
    fn write_all_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        self.pass();
        self.inner.write_all_at(buf, offset_bytes)
    }
    fn start_writeback(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        self.inner.start_writeback(offset_bytes, len_bytes)
    }
    super::forward_size_ops!();
    fn map(&self) -> io::Result<Mapping> {
        self.inner.map()
    }
}

impl<S: Storage> Storage for GatedStorage<S> {
    fn open(&self, name: &str, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        Ok(Arc::new(GatedFile {
            inner: self.inner.open(name, mode)?,
            gated: name.starts_with(&self.prefix),
            shared: self.shared.clone(),
        }))
    }
    super::forward_directory_ops!();
}

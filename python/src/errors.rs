//! BankError, InteropError and AgentError as the exceptions of
//! `deltamem.errors` (a pure Python module, so the classes can have two
//! bases: `NotFoundError` is also a `KeyError`, `InvalidInputError` also a
//! `ValueError`, `IoError` also an `OSError`).

use deltamem::interop::InteropError;
use deltamem::storage::StorageError;
use deltamem::{BankError, ErrorKind};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;

/// The exception classes of `deltamem.errors`, by what a caller can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Io,
    Locked,
    Corrupt,
    Poisoned,
    ReadOnly,
    NotFound,
    Invalid,
    Closed,
    Agent,
}

impl Kind {
    fn class_name(self) -> &'static str {
        match self {
            Kind::Io => "IoError",
            Kind::Locked => "LockedError",
            Kind::Corrupt => "CorruptError",
            Kind::Poisoned => "PoisonedError",
            Kind::ReadOnly => "ReadOnlyError",
            Kind::NotFound => "NotFoundError",
            Kind::Invalid => "InvalidInputError",
            Kind::Closed => "ClosedError",
            Kind::Agent => "AgentError",
        }
    }
}

/// Attributes set on the exception besides its message.
#[derive(Debug, Default)]
pub struct Details {
    pub file: Option<String>,
    pub offset_bytes: Option<u64>,
    pub position: Option<usize>,
    /// The OS error number of a failed I/O call (`OSError.errno`).
    pub errno: Option<i32>,
}

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// An exception of class `kind` with `message` and `details`.
pub fn make(py: Python<'_>, kind: Kind, message: String, details: &Details) -> PyErr {
    match build(py, kind, &message, details) {
        Ok(err) => err,
        // Only if deltamem.errors cannot be imported (a broken install).
        Err(import_failure) => import_failure,
    }
}

fn build(py: Python<'_>, kind: Kind, message: &str, details: &Details) -> PyResult<PyErr> {
    let module = ERRORS.get_or_try_init(py, || py.import("deltamem.errors").map(Bound::unbind))?;
    let class = module.bind(py).getattr(kind.class_name())?;
    let kwargs = PyDict::new(py);
    if let Some(file) = &details.file {
        kwargs.set_item("file", file)?;
    }
    if let Some(offset) = details.offset_bytes {
        kwargs.set_item("offset_bytes", offset)?;
    }
    if let Some(position) = details.position {
        kwargs.set_item("position", position)?;
    }
    if let Some(errno) = details.errno {
        kwargs.set_item("errno", errno)?;
    }
    let instance = class.call((message,), Some(&kwargs))?;
    Ok(PyErr::from_value(instance))
}

thread_local! {
    /// The exception a signal handler raised while a wait for the writer
    /// lock asked `signal_pending`, for the caller to raise once the wait
    /// has returned.
    static SIGNAL: std::cell::Cell<Option<PyErr>> = const { std::cell::Cell::new(None) };
}

/// The hook a wait for the writer lock asks between tries
/// (`Bank::open_dir_waiting_unless`, `AgentConfig::interrupted`): runs
/// Python's signal handlers (Ctrl-C) and keeps what they raised. The wait
/// runs on the calling thread, so `take_signal` finds it in that thread's
/// slot.
pub fn signal_pending() -> bool {
    match Python::attach(|py| py.check_signals()) {
        Ok(()) => false,
        Err(e) => {
            SIGNAL.set(Some(e));
            true
        }
    }
}

/// What `signal_pending` caught on this thread, if anything.
pub fn take_signal() -> Option<PyErr> {
    SIGNAL.take()
}

pub fn invalid(py: Python<'_>, message: impl Into<String>) -> PyErr {
    make(py, Kind::Invalid, message.into(), &Details::default())
}

/// Which class a bank error belongs to (its kind), filling in its details.
fn classify(e: &BankError, details: &mut Details) -> Kind {
    fill_details(e, details);
    match e.kind() {
        ErrorKind::Locked => Kind::Locked,
        ErrorKind::Corrupt => Kind::Corrupt,
        ErrorKind::Io => Kind::Io,
        ErrorKind::NotFound => Kind::NotFound,
        ErrorKind::ReadOnly => Kind::ReadOnly,
        ErrorKind::Poisoned => Kind::Poisoned,
        // Python has no conflict class: an id in use is a ValueError too.
        ErrorKind::Invalid | ErrorKind::Conflict => Kind::Invalid,
    }
}

/// The file, offset, errno and batch position an error carries.
fn fill_details(e: &BankError, details: &mut Details) {
    match e {
        BankError::Storage(StorageError::Corrupt { file, offset_bytes, .. })
        | BankError::Corrupt { file, offset_bytes, .. }
        | BankError::WalDamaged { file, offset_bytes, .. } => {
            details.file = Some(file.clone());
            details.offset_bytes = Some(*offset_bytes);
        }
        BankError::Storage(StorageError::Io { file, cause, .. }) => {
            details.file = Some(file.clone());
            details.errno = cause.raw_os_error();
        }
        BankError::ManifestMissing { path, .. } => {
            details.file = Some(format!("{path}MANIFEST"));
            details.offset_bytes = Some(0);
        }
        BankError::BatchItem { position, error } => {
            details.position = Some(*position);
            fill_details(error, details);
        }
        _ => {}
    }
}

pub fn bank(py: Python<'_>, e: BankError) -> PyErr {
    let mut details = Details::default();
    let kind = classify(&e, &mut details);
    make(py, kind, e.to_string(), &details)
}

pub fn interop(py: Python<'_>, e: InteropError) -> PyErr {
    let message = e.to_string();
    match e {
        InteropError::Bank(inner) => bank(py, *inner),
        InteropError::Io { file, source, .. } => {
            let details = Details {
                file: Some(file),
                errno: source.raw_os_error(),
                ..Details::default()
            };
            make(py, Kind::Io, format!("{message}: {source}"), &details)
        }
        InteropError::Refused { reason, .. } => {
            let mut details = Details::default();
            let kind = classify(&reason, &mut details);
            make(py, kind, message, &details)
        }
        _ => invalid(py, message),
    }
}

pub fn closed(py: Python<'_>) -> PyErr {
    make(
        py,
        Kind::Closed,
        "the bank is closed; open it again".into(),
        &Details::default(),
    )
}

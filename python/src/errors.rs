//! BankError, InteropError and AgentError as the exceptions of
//! `deltamem.errors` (a pure Python module, so the classes can have two
//! bases: `NotFoundError` is also a `KeyError`, `InvalidInputError` also a
//! `ValueError`, `IoError` also an `OSError`).

use deltamem::BankError;
use deltamem::interop::InteropError;
use deltamem::storage::StorageError;
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

pub fn invalid(py: Python<'_>, message: impl Into<String>) -> PyErr {
    make(py, Kind::Invalid, message.into(), &Details::default())
}

/// Which class a bank error belongs to, filling in its details.
fn classify(e: &BankError, details: &mut Details) -> Kind {
    match e {
        BankError::Storage(StorageError::Locked { .. }) => Kind::Locked,
        BankError::Storage(StorageError::Corrupt { file, offset_bytes, .. })
        | BankError::Corrupt { file, offset_bytes, .. } => {
            details.file = Some(file.clone());
            details.offset_bytes = Some(*offset_bytes);
            Kind::Corrupt
        }
        BankError::Storage(StorageError::Io { file, cause, .. }) => {
            details.file = Some(file.clone());
            details.errno = cause.raw_os_error();
            Kind::Io
        }
        BankError::WalDamaged { file, offset_bytes, .. } => {
            details.file = Some(file.clone());
            details.offset_bytes = Some(*offset_bytes);
            Kind::Corrupt
        }
        BankError::ManifestMissing { path, .. } => {
            details.file = Some(format!("{path}MANIFEST"));
            details.offset_bytes = Some(0);
            Kind::Corrupt
        }
        // The stored tree contradicts itself: damage, not the caller's input.
        BankError::Tree(_) => Kind::Corrupt,
        BankError::NotABank { .. } | BankError::UnknownTree { .. } | BankError::UnknownNode(_) => Kind::NotFound,
        BankError::ReadOnly(_) => Kind::ReadOnly,
        BankError::Poisoned(_) => Kind::Poisoned,
        BankError::BatchItem { position, error } => {
            details.position = Some(*position);
            classify(error, details)
        }
        // Listed one by one, so that a new error is classified when it is
        // added rather than taken for bad input by default.
        BankError::AlreadyExists { .. }
        | BankError::BadConfig(_)
        | BankError::BadQueryOption(_)
        | BankError::DimensionMismatch { .. }
        | BankError::BadEmbedding(_)
        | BankError::WrongTree { .. }
        | BankError::EmptyScenario
        | BankError::PayloadTooLarge { .. }
        | BankError::BadExternalId { .. }
        | BankError::DuplicateExternalId { .. }
        | BankError::DuplicateInWrite { .. }
        | BankError::AlreadyConsolidated { .. }
        | BankError::NotConsolidatable { .. }
        | BankError::TransactionTooLarge { .. }
        | BankError::NotLoadable { .. } => Kind::Invalid,
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

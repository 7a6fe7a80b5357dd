//! Moving banks in and out of the Python world: trees saved by the DeltaMem
//! reference implementation ([`mod@reference`]), NumPy `.npy` matrices of
//! embeddings ([`npy`]), and JSON written exactly as Python's `json`
//! module writes it ([`pyjson`]).
//!
//! Nothing here reaches into the bank's internals: everything goes through
//! the public [`Bank`](crate::Bank) API, so these modules also show what a
//! bulk loader built outside the crate can do.

pub mod npy;
pub mod pyjson;
pub mod reference;

use thiserror::Error;

use crate::BankError;

/// What reading, writing or importing an outside file can fail with. Every
/// variant names the file, and the node or row when one is involved.
#[derive(Debug, Error)]
pub enum InteropError {
    // The io::Error is the source, so it is not repeated in the message:
    // `{:#}` (anyhow) prints it after this text.
    #[error("{file}: cannot {op}")]
    Io {
        op: &'static str,
        file: String,
        source: std::io::Error,
    },
    #[error("{file}: line {line}, column {column}: {detail}")]
    Json {
        file: String,
        line: usize,
        column: usize,
        detail: String,
    },
    #[error("{file}: {detail}")]
    Invalid { file: String, detail: String },
    #[error("{file}: node {node_id}: {detail}")]
    Node {
        file: String,
        node_id: String,
        detail: String,
    },
    #[error("{file}: row {row}: {detail}")]
    Row { file: String, row: u64, detail: String },
    #[error("{file}: the bank refused node {node_id}: {reason}")]
    Refused {
        file: String,
        node_id: String,
        reason: Box<BankError>,
    },
    /// Boxed, like `reason` above: a `BankError` is large, and every
    /// `Result` of this module would carry its size.
    #[error(transparent)]
    Bank(Box<BankError>),
}

impl From<BankError> for InteropError {
    fn from(e: BankError) -> InteropError {
        InteropError::Bank(Box::new(e))
    }
}

impl InteropError {
    pub fn io(op: &'static str, file: &std::path::Path) -> impl FnOnce(std::io::Error) -> InteropError {
        let file = file.display().to_string();
        move |source| InteropError::Io { op, file, source }
    }

    /// An error writing to the stream an export was given (which the
    /// export calls `UNNAMED_OUTPUT`), named after what the stream is: the
    /// file the user asked for, or stdout.
    pub fn naming_output(self, name: &str) -> InteropError {
        match self {
            InteropError::Io { op, file, source } if file == UNNAMED_OUTPUT => InteropError::Io {
                op,
                file: name.to_string(),
                source,
            },
            other => other,
        }
    }

    pub fn invalid(file: &std::path::Path, detail: impl Into<String>) -> InteropError {
        InteropError::Invalid {
            file: file.display().to_string(),
            detail: detail.into(),
        }
    }
}

/// The temporary sibling `write_atomically` writes `path` through.
pub fn temp_sibling(path: &std::path::Path) -> std::path::PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

/// What an export's write errors call the stream it writes to, until its
/// caller names it (`InteropError::naming_output`).
pub const UNNAMED_OUTPUT: &str = "export output";

/// Writes a file through a temporary sibling and renames it into place, so
/// an interrupted write never leaves a half file under the final name (the
/// reference truncates and rewrites in place; see SEMANTICS.md).
pub fn write_atomically(
    path: &std::path::Path,
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> Result<(), InteropError>,
) -> Result<(), InteropError> {
    let tmp = temp_sibling(path);
    // Failures name `path`, the file the user asked for: the temporary
    // sibling is ours, and its name says nothing to them.
    let result = (|| {
        let file = std::fs::File::create(&tmp).map_err(InteropError::io("create", path))?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        write(&mut out)?;
        let file = out
            .into_inner()
            .map_err(|e| InteropError::io("write", path)(e.into_error()))?;
        file.sync_all().map_err(InteropError::io("fsync", path))?;
        std::fs::rename(&tmp, path).map_err(InteropError::io("rename into place", path))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

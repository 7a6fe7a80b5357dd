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

/// Where an output path's bytes go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputTarget {
    /// A regular file (or none yet): written through a temporary sibling
    /// and renamed into place. A symlink is followed, so the file it names
    /// is replaced and the link stays.
    Replace(std::path::PathBuf),
    /// A FIFO, a character device (`/dev/null`, `/dev/stdout`'s terminal)
    /// or a socket: written in place. Renaming a file over one would
    /// replace it (as root, a device node) and its reader would get
    /// nothing.
    Stream(std::path::PathBuf),
}

/// Where `path`'s bytes go; a directory, or a symlink that names no file,
/// is refused (neither can be written, and replacing either is wrong).
pub fn output_target(path: &std::path::Path) -> Result<OutputTarget, InteropError> {
    let invalid = |detail: &str| InteropError::Invalid {
        file: path.display().to_string(),
        detail: detail.to_string(),
    };
    let linked = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && linked => Err(invalid(
            "is a symbolic link to a file that does not exist; name the file itself",
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(OutputTarget::Replace(path.to_path_buf())),
        Err(e) => Err(InteropError::io("stat", path)(e)),
        Ok(m) if m.is_dir() => Err(invalid("is a directory, not a file")),
        Ok(m) if !m.is_file() => Ok(OutputTarget::Stream(path.to_path_buf())),
        Ok(_) if linked => std::fs::canonicalize(path)
            .map(OutputTarget::Replace)
            .map_err(InteropError::io("resolve", path)),
        Ok(_) => Ok(OutputTarget::Replace(path.to_path_buf())),
    }
}

/// Writes a file through a temporary sibling and renames it into place, so
/// an interrupted write never leaves a half file under the final name (the
/// reference truncates and rewrites in place; see SEMANTICS.md). A FIFO or
/// a device is written in place instead (`output_target`).
pub fn write_atomically(
    path: &std::path::Path,
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> Result<(), InteropError>,
) -> Result<(), InteropError> {
    let target = match output_target(path)? {
        OutputTarget::Stream(device) => return write_in_place(&device, path, write),
        OutputTarget::Replace(file) => file,
    };
    let tmp = temp_sibling(&target);
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
        std::fs::rename(&tmp, &target).map_err(InteropError::io("rename into place", path))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Writes to a FIFO or a device as it is: no temporary file, no fsync
/// (neither has one to give).
fn write_in_place(
    device: &std::path::Path,
    path: &std::path::Path,
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> Result<(), InteropError>,
) -> Result<(), InteropError> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(device)
        .map_err(InteropError::io("open", path))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    write(&mut out)?;
    out.into_inner()
        .map(drop)
        .map_err(|e| InteropError::io("write", path)(e.into_error()))
}

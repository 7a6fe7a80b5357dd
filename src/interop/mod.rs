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
    /// A FIFO, a character device or socket, or any path under `/dev/` or
    /// `/proc/` (`/dev/fd/3`, `/dev/shm/x`): written in place. Renaming a
    /// file over one would replace it (as root, a device node), and its
    /// reader would get nothing.
    Stream(std::path::PathBuf),
    /// The process's own stdout (1) or stderr (2), named `/dev/stdout`,
    /// `/dev/fd/1` or `/proc/self/fd/1` (or 2): written through a
    /// duplicate of the descriptor, so a `>>` redirection appends (a
    /// rename replaced the file stdout was redirected to, and an open of
    /// the name writes from its start).
    Inherited(i32),
}

/// Where `path`'s bytes go. Refused: a directory, a symlink that names no
/// file, and a file inside a bank directory (one holding `MANIFEST` and
/// `wal.log`), however it is reached: it could be one of the bank's own
/// files, which a command that only reads the bank would then break.
pub fn output_target(path: &std::path::Path) -> Result<OutputTarget, InteropError> {
    let invalid = |detail: &str| InteropError::invalid(path, detail);
    for (fd, names) in [
        (1, ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"]),
        (2, ["/dev/stderr", "/dev/fd/2", "/proc/self/fd/2"]),
    ] {
        if names.iter().any(|n| path == std::path::Path::new(n)) {
            return Ok(OutputTarget::Inherited(fd));
        }
    }
    let linked = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    let resolved = match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && linked => {
            return Err(invalid(
                "is a symbolic link to a file that does not exist; name the file itself",
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => path.to_path_buf(),
        Err(e) => return Err(InteropError::io("stat", path)(e)),
        Ok(m) if m.is_dir() => return Err(invalid("is a directory, not a file")),
        Ok(m) if !m.is_file() => return Ok(OutputTarget::Stream(path.to_path_buf())),
        Ok(_) if linked => std::fs::canonicalize(path).map_err(InteropError::io("resolve", path))?,
        Ok(_) => path.to_path_buf(),
    };
    if path.starts_with("/dev") || path.starts_with("/proc") {
        return Ok(OutputTarget::Stream(path.to_path_buf()));
    }
    let parent = match resolved.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    if parent.join(crate::storage::MANIFEST_FILE).is_file() && parent.join(crate::storage::WAL_FILE).is_file() {
        return Err(invalid(&format!(
            "is inside the bank directory {}: writing it could replace one of the bank's own files",
            parent.display()
        )));
    }
    Ok(OutputTarget::Replace(resolved))
}

/// An output being written: for a replaced file, the temporary sibling
/// and the file it is renamed over (`output_target`).
pub struct Output {
    /// (temporary sibling, final file) when the output replaces a file.
    placing: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// The path the caller named, which errors name.
    named: std::path::PathBuf,
}

impl Output {
    /// Opens what `target` (of `named`) says to write: the file to write
    /// to, and the output to finish with it.
    pub fn open(named: &std::path::Path, target: OutputTarget) -> Result<(std::fs::File, Output), InteropError> {
        use std::os::fd::AsFd;
        let (file, placing) = match target {
            OutputTarget::Replace(file) => {
                let tmp = temp_sibling(&file);
                let created = std::fs::File::create(&tmp).map_err(InteropError::io("create", named))?;
                // The file replaced keeps its permissions (a 0600 export
                // became 0644).
                if let Ok(old) = std::fs::metadata(&file) {
                    let kept = created.set_permissions(old.permissions());
                    if let Err(e) = kept {
                        let _ = std::fs::remove_file(&tmp);
                        return Err(InteropError::io("set the permissions of", named)(e));
                    }
                }
                (created, Some((tmp, file)))
            }
            OutputTarget::Stream(device) => {
                let opened = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(device)
                    .map_err(InteropError::io("open", named))?;
                (opened, None)
            }
            OutputTarget::Inherited(fd) => {
                let owned = match fd {
                    1 => std::io::stdout().as_fd().try_clone_to_owned(),
                    _ => std::io::stderr().as_fd().try_clone_to_owned(),
                };
                (owned.map_err(InteropError::io("duplicate", named))?.into(), None)
            }
        };
        let output = Output {
            placing,
            named: named.to_path_buf(),
        };
        Ok((file, output))
    }

    /// The temporary sibling, if the output is written through one.
    pub fn temp_path(&self) -> Option<&std::path::Path> {
        self.placing.as_ref().map(|(tmp, _)| tmp.as_path())
    }

    /// Makes a replacing output durable and renames it into place (a
    /// stream has nothing to sync or rename); on failure the temporary
    /// sibling is removed. The file must have been flushed: the fsync goes
    /// through a descriptor of its own, which covers what was written
    /// through any.
    pub fn finish(self) -> Result<(), InteropError> {
        let Some((tmp, target)) = &self.placing else {
            return Ok(());
        };
        let placed = std::fs::File::open(tmp)
            .and_then(|f| f.sync_all())
            .map_err(InteropError::io("fsync", &self.named))
            .and_then(|()| std::fs::rename(tmp, target).map_err(InteropError::io("rename into place", &self.named)));
        if placed.is_err() {
            let _ = std::fs::remove_file(tmp);
        }
        placed
    }

    /// Removes a replacing output's temporary sibling (a failed write).
    pub fn abandon(&self) {
        if let Some((tmp, _)) = &self.placing {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

/// Writes a file through a temporary sibling and renames it into place, so
/// an interrupted write never leaves a half file under the final name (the
/// reference truncates and rewrites in place; see SEMANTICS.md). A FIFO, a
/// device or the process's stdout is written in place (`output_target`).
pub fn write_atomically(
    path: &std::path::Path,
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> Result<(), InteropError>,
) -> Result<(), InteropError> {
    write_to(path, output_target(path)?, write)
}

/// `write_atomically` to a target already resolved (`output_target`).
pub fn write_to(
    path: &std::path::Path,
    target: OutputTarget,
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> Result<(), InteropError>,
) -> Result<(), InteropError> {
    let (file, output) = Output::open(path, target)?;
    // Failures name `path`, the file the user asked for: the temporary
    // sibling is ours, and its name says nothing to them.
    let written = (|| {
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        write(&mut out)?;
        out.into_inner()
            .map_err(|e| InteropError::io("write", path)(e.into_error()))
    })();
    match written {
        Ok(file) => {
            drop(file);
            output.finish()
        }
        Err(e) => {
            output.abandon();
            Err(e)
        }
    }
}

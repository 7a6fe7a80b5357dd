//! The commands behind `src/main.rs`, and what they share: opening banks,
//! naming nodes on the command line, writing JSON lines.

pub mod agent;
pub mod demo;
#[cfg(feature = "agent")]
pub mod demo_real;
pub mod draw;
pub mod draw_scope;
pub mod embed;
pub mod episodes;
pub mod export;
pub mod heap;
pub mod import;
pub mod import_npy;
pub mod init;
pub mod input;
pub mod insert;
pub mod inspect;
pub mod maintain;
pub mod picture;
pub mod progress;
pub mod query;
pub mod query_npy;
pub mod report;
pub mod scratch;
#[cfg(feature = "server")]
pub mod serve;
pub mod update;

use std::io::{self, Write};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use deltamem::{Bank, BankError, ErrorKind, NodeRef, OpenOptions, SyncPolicy};
use serde::Serialize;

pub use init::TreeArg;

/// How a command ended when it did not hit a fatal error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// Something was already reported on stderr (a rejected input line, a
    /// failed check): exit 1 without another message.
    Failed,
    /// The change was made durable (it is in the WAL) and its result
    /// printed, but the checkpoint when closing failed: exit 3. Do not
    /// retry the change; the next open recovers it from the WAL.
    SavedCheckpointFailed,
}

/// A node named on the command line: digits are an index, anything else
/// an external id. A JSON string literal (`"42"`, with the quotes) is
/// always an external id, so ids made of digits stay reachable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeArg(pub NodeRef);

impl FromStr for NodeArg {
    type Err = String;

    fn from_str(text: &str) -> Result<NodeArg, String> {
        if text.starts_with('"') {
            return serde_json::from_str::<String>(text)
                .map(|s| NodeArg(NodeRef::External(s)))
                .map_err(|e| format!("not a valid JSON string: {e}"));
        }
        if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            return text
                .parse::<u32>()
                .map(|i| NodeArg(NodeRef::Index(i)))
                .map_err(|_| format!("node index {text} is too large"));
        }
        if text.is_empty() {
            return Err("a node id cannot be empty".into());
        }
        Ok(NodeArg(NodeRef::External(text.to_string())))
    }
}

/// Opens a bank for reading only: takes no lock, so it works beside a
/// running writer, and sees the state as of the moment it opened.
pub fn open_read(path: &Path) -> anyhow::Result<Bank> {
    let options = OpenOptions {
        read_only: true,
        ..Default::default()
    };
    Bank::open_dir(path, options).with_context(|| format!("cannot open {}", path.display()))
}

/// How long a command waits for another process's writer lock
/// (`--lock-wait-ms`), set once by `main`.
static LOCK_WAIT: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();

pub fn set_lock_wait(wait: Duration) {
    LOCK_WAIT.set(wait).expect("the lock wait is set once, by main");
}

pub fn lock_wait() -> Duration {
    LOCK_WAIT.get().copied().unwrap_or_default()
}

/// Opens a bank as its single writer, waiting up to `--lock-wait-ms` for
/// another process's writer lock.
pub fn open_write(path: &Path) -> anyhow::Result<Bank> {
    Bank::open_dir_waiting(path, OpenOptions::default(), lock_wait())
        .with_context(|| format!("cannot open {} for writing", path.display()))
}

/// Looks a node up, naming the bank if it is not there.
pub fn resolve(bank: &Bank, node: &NodeArg, path: &Path) -> anyhow::Result<u32> {
    bank.resolve(&node.0)
        .with_context(|| format!("looking up a node in {}", path.display()))
}

/// Closes a writer, making everything durable (checkpoint), with context.
pub fn close(bank: Bank, path: &Path) -> anyhow::Result<()> {
    bank.close()
        .with_context(|| format!("cannot close {} cleanly", path.display()))
}

/// Runs `work` on the writer and closes the bank whatever happened, so a
/// refused change still releases the lock. When the work succeeded and
/// everything it wrote is durable, a failed close (its checkpoint) does not
/// make the change a failure: it is said on stderr and the value comes back
/// with `Status::SavedCheckpointFailed`, so the caller still prints its
/// result and a retry does not repeat a change already made.
pub fn with_writer<T>(
    path: &Path,
    policy: Option<SyncPolicy>,
    work: impl FnOnce(&mut Bank) -> anyhow::Result<T>,
) -> anyhow::Result<(T, Status)> {
    let mut bank = open_write(path)?;
    if let Some(policy) = policy {
        bank.set_sync_policy(policy);
    }
    let value = match work(&mut bank) {
        Ok(value) => value,
        Err(e) => {
            // The work's error is the one to report; closing only releases
            // the lock (and recovers nothing that was not committed). A
            // close that fails too is said, as what was stored before the
            // error may then not all be durable.
            if let Err(why) = bank.close() {
                eprintln!(
                    "deltamem: closing the bank after the error failed too ({why}): changes not yet durable may be lost"
                );
            }
            return Err(e);
        }
    };
    let closed = bank
        .close_after_commits()
        .with_context(|| format!("cannot close {} cleanly", path.display()))?;
    match closed {
        None => Ok((value, Status::Ok)),
        Some(why) => Ok((value, saved_checkpoint_failed(path, &why))),
    }
}

/// Says on stderr that a change is saved although the checkpoint after it
/// failed, and what to do; the status for the command to exit with.
pub fn saved_checkpoint_failed(path: &Path, why: &str) -> Status {
    eprintln!("deltamem: the change is saved (durable in the WAL), but the checkpoint after it failed: {why}");
    eprintln!(
        "deltamem: do not repeat the change; the next open of {} recovers it",
        path.display()
    );
    Status::SavedCheckpointFailed
}

/// Errors caused by what the caller sent, as opposed to the bank or the
/// disk failing. Only these let a line-oriented command go on.
pub fn is_input_error(e: &BankError) -> bool {
    // Not a missing bank: no line names one (the bank is open by then).
    !matches!(e, BankError::NotABank { .. })
        && matches!(e.kind(), ErrorKind::Invalid | ErrorKind::NotFound | ErrorKind::Conflict)
}

/// Writes `value` as one JSON line.
pub fn write_json_line(out: &mut impl Write, value: &impl Serialize) -> anyhow::Result<()> {
    serde_json::to_writer(&mut *out, value).context("cannot write to stdout")?;
    out.write_all(b"\n").context("cannot write to stdout")
}

/// True if the error is stdout having been closed by the reader (as in
/// `deltamem dump | head`): nothing worth telling the user.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        let kind = cause.downcast_ref::<io::Error>().map(io::Error::kind).or_else(|| {
            cause
                .downcast_ref::<serde_json::Error>()
                .and_then(serde_json::Error::io_error_kind)
        });
        kind == Some(io::ErrorKind::BrokenPipe)
    })
}

/// Tells, on stderr, how much a writing command stored before an error
/// stopped it: its acknowledgements may not have reached stdout (a closed
/// pipe, a full disk, a read that failed part-way), and a change made
/// durable must be reported as made. Nothing is said when nothing was.
pub fn report_stored_before_error(count: u64, what: &str) {
    if count > 0 {
        eprintln!("deltamem: {count} {what} had been stored when the error stopped the command");
    }
}

/// Prints human-readable text plus a newline. Unlike `println!`, a closed
/// stdout (`deltamem demo | head`) becomes an error instead of a panic.
pub fn emit(text: impl std::fmt::Display) -> anyhow::Result<()> {
    writeln!(io::stdout(), "{text}").context("cannot write to stdout")
}

/// Stdout, buffered: commands flush it where a reader is waiting.
pub fn stdout() -> io::BufWriter<io::StdoutLock<'static>> {
    io::BufWriter::new(io::stdout().lock())
}

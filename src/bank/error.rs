use thiserror::Error;

use crate::storage::StorageError;
use crate::tree::TreeError;

/// Everything the bank API can refuse or fail with. Input errors leave the
/// bank unchanged; `Poisoned` means a write or fsync failed and the bank
/// refuses writes until it is reopened.
#[derive(Debug, Error)]
pub enum BankError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("{path} is not a deltamem bank (no MANIFEST file)")]
    NotABank { path: String },
    #[error("{path} already holds a bank")]
    AlreadyExists { path: String },
    /// Data files of a bank without its MANIFEST (lost, or deleted by
    /// hand): not an empty place for a new bank, and not openable.
    #[error(
        "{path} holds a bank's data files ({files}) but its MANIFEST is missing: \
         restore the MANIFEST, or move those files away before creating a bank there"
    )]
    ManifestMissing { path: String, files: String },
    #[error("invalid configuration: {0}")]
    BadConfig(String),
    #[error("bad query option: {0}")]
    BadQueryOption(String),
    #[error("embedding has {found} dimensions, the bank stores {expected}")]
    DimensionMismatch { expected: u32, found: usize },
    #[error("bad embedding: {0}")]
    BadEmbedding(String),
    #[error("unknown tree {name:?} (this bank has: {known})")]
    UnknownTree { name: String, known: String },
    #[error("unknown node {0}")]
    UnknownNode(String),
    #[error("node {node} belongs to tree {node_tree:?}, not {wanted:?}")]
    WrongTree {
        node: u32,
        node_tree: String,
        wanted: String,
    },
    #[error("scenario text is empty")]
    EmptyScenario,
    /// A node's scenario and payload fields together, of which
    /// `scenario_bytes` are the scenario's.
    #[error(
        "scenario and payload are {size_bytes} bytes together ({scenario_bytes} of them the scenario), the limit is {limit_bytes}"
    )]
    PayloadTooLarge {
        size_bytes: usize,
        scenario_bytes: usize,
        limit_bytes: usize,
    },
    /// `id` as `shown_id` shows it.
    #[error("bad external id {id}: {detail}")]
    BadExternalId { id: String, detail: String },
    #[error("external id {id:?} is already used by node {existing}")]
    DuplicateExternalId { id: String, existing: u32 },
    /// Two nodes of one write (a batch, a load, an import) with one id.
    #[error("external id {id:?} is given twice in one write: item {first_item} has it too")]
    DuplicateInWrite { id: String, first_item: u32 },
    #[error("node {node} is already consolidated (into root {root})")]
    AlreadyConsolidated { node: u32, root: u32 },
    #[error("node {node} cannot be consolidated: {reason}")]
    NotConsolidatable { node: u32, reason: String },
    #[error("transaction of {ops} ops and {size_bytes} bytes exceeds one WAL record (65535 ops, 64 MiB)")]
    TransactionTooLarge { ops: usize, size_bytes: usize },
    #[error("a bulk load only adds nodes; {0} must go through a transaction")]
    NotLoadable(&'static str),
    #[error("bank is read-only: {0}")]
    ReadOnly(String),
    #[error("bank refuses writes after an I/O failure ({0}); reopen it to recover")]
    Poisoned(String),
    #[error("corrupt {file} at offset {offset_bytes}: {detail}")]
    Corrupt {
        file: String,
        offset_bytes: u64,
        detail: String,
    },
    /// A WAL record in the middle of the log is damaged and intact records
    /// follow it (FORMAT.md §8): not a torn tail, so nothing opens the bank
    /// for writing until `Bank::repair` is asked to drop them.
    #[error(
        "corrupt {file} at offset {offset_bytes}: record {lsn} is damaged ({detail}); opening for writing \
         would drop records {first_dropped_lsn}..={last_dropped_lsn}, which follow it intact or are it, \
         so it is refused (`deltamem repair BANK --drop-damaged-wal-tail` drops them, losing those changes)"
    )]
    WalDamaged {
        file: String,
        offset_bytes: u64,
        lsn: u64,
        first_dropped_lsn: u64,
        last_dropped_lsn: u64,
        detail: String,
    },
    #[error(transparent)]
    Tree(#[from] TreeError),
    /// The change at `position` was refused; the field is not named
    /// `source` so the cause is printed once, in this message, and not
    /// again as the error's `source()`.
    #[error("batch item {position}: {error}")]
    BatchItem { position: usize, error: Box<BankError> },
}

impl BankError {
    pub(crate) fn wal_damaged(file: String, damage: &crate::storage::wal::WalDamage) -> BankError {
        BankError::WalDamaged {
            file,
            offset_bytes: damage.offset_bytes,
            lsn: damage.lsn,
            first_dropped_lsn: *damage.dropped_lsns.start(),
            last_dropped_lsn: *damage.dropped_lsns.end(),
            detail: damage.detail.clone(),
        }
    }

    /// Another process holds the writer lock (worth waiting for).
    pub fn is_locked(&self) -> bool {
        matches!(self, BankError::Storage(StorageError::Locked { .. }))
    }

    /// Whose fault the error is, for a face to map to its own answer (an
    /// HTTP status, a Python exception class, an error line or the end of
    /// a command). Every variant is listed, so a new one is classified
    /// when it is added rather than falling into a default.
    pub fn kind(&self) -> ErrorKind {
        use ErrorKind as K;
        match self {
            BankError::Storage(StorageError::Locked { .. }) => K::Locked,
            BankError::Storage(StorageError::Corrupt { .. }) => K::Corrupt,
            BankError::Storage(StorageError::Io { .. }) => K::Io,
            BankError::NotABank { .. } | BankError::UnknownTree { .. } | BankError::UnknownNode(_) => K::NotFound,
            BankError::AlreadyExists { .. }
            | BankError::DuplicateExternalId { .. }
            | BankError::AlreadyConsolidated { .. } => K::Conflict,
            BankError::BadConfig(_)
            | BankError::BadQueryOption(_)
            | BankError::DimensionMismatch { .. }
            | BankError::BadEmbedding(_)
            | BankError::WrongTree { .. }
            | BankError::EmptyScenario
            | BankError::PayloadTooLarge { .. }
            | BankError::BadExternalId { .. }
            | BankError::DuplicateInWrite { .. }
            | BankError::NotConsolidatable { .. }
            | BankError::TransactionTooLarge { .. }
            | BankError::NotLoadable(_) => K::Invalid,
            BankError::ReadOnly(_) => K::ReadOnly,
            BankError::Poisoned(_) => K::Poisoned,
            // The stored tree contradicting itself is damage, not input.
            BankError::ManifestMissing { .. }
            | BankError::Corrupt { .. }
            | BankError::WalDamaged { .. }
            | BankError::Tree(_) => K::Corrupt,
            BankError::BatchItem { error, .. } => error.kind(),
        }
    }
}

/// Whose fault a [`BankError`] is ([`BankError::kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The caller's input is wrong: a dimension, an empty scenario, an
    /// option, a write the tree rules refuse.
    Invalid,
    /// The input names a tree or node the bank does not have, or a path
    /// that holds no bank.
    NotFound,
    /// The input contradicts what is stored: an id in use, a node already
    /// consolidated, a bank where a new one was to be made.
    Conflict,
    /// Another process holds the writer lock.
    Locked,
    /// A read-only handle was asked to write.
    ReadOnly,
    /// The handle refuses writes after an I/O failure.
    Poisoned,
    /// Stored bytes or structure are damaged.
    Corrupt,
    /// The operating system refused a file operation.
    Io,
}

/// An id as an error message shows it: quoted, whole up to 40 characters,
/// else its start and its length. An id can be at most 16 bytes or a
/// UUID; one of 100 kB is not worth echoing back whole.
pub(crate) fn shown_id(text: &str) -> String {
    const SHOWN_CHARS: usize = 40;
    match text.char_indices().nth(SHOWN_CHARS) {
        None => format!("{text:?}"),
        Some((cut, _)) => format!("{:?}... ({} bytes)", &text[..cut], text.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::shown_id;

    #[test]
    fn a_long_id_is_shown_by_its_start_and_length() {
        assert_eq!(shown_id("abc"), "\"abc\"");
        assert_eq!(shown_id(&"é".repeat(40)), format!("{:?}", "é".repeat(40)));
        let long = "é".repeat(50_000);
        assert_eq!(shown_id(&long), format!("{:?}... (100000 bytes)", "é".repeat(40)));
    }
}

//! Freeze (a compacted read-only copy) and compact (rewrite a live bank's
//! data files under a new generation, switched by one manifest replace).

use std::path::Path;

use super::{Bank, BankError};

#[derive(Debug, Clone, PartialEq)]
pub struct FreezeReport {
    pub nodes: u64,
    pub bytes_written: u64,
    pub out: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CompactReport {
    pub nodes: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub generation: u32,
}

impl Bank {
    /// Writes a compacted, fully checkpointed, read-only copy of this bank
    /// to `out_dir` (which must not exist). Works from a reader or a writer.
    pub fn freeze_to(&self, out_dir: &Path) -> Result<FreezeReport, BankError> {
        let _ = out_dir;
        Err(BankError::ReadOnly("freeze is not implemented yet".into()))
    }

    /// Rewrites the data files without dead space; crash-safe.
    pub fn compact(&mut self) -> Result<CompactReport, BankError> {
        Err(BankError::ReadOnly("compact is not implemented yet".into()))
    }
}

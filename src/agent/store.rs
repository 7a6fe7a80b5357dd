//! Where the memory loop reads and writes its bank.
//!
//! `record` needs three things from a bank: a current view to plan on, one
//! durable transaction for the episode, and one commit per consolidation.
//! [`BankStore`] names them, so the same loop runs on a bank directory that
//! other processes share ([`DirStore`]: the writer lock is taken per commit,
//! never across an LLM call) and on a bank a server owns (its writes join
//! the server's write queue and group commit; `src/server/agent.rs`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::memory_loop::{AgentConfig, AgentError};
use crate::SyncPolicy;
use crate::bank::{Bank, Change, ChangeAck, OpenOptions};

/// What a commit did: the acks of its changes, what `after` returned, and a
/// checkpoint that failed after the commit was durable (the commit stands).
#[derive(Debug)]
pub struct Committed<T> {
    pub acks: Vec<ChangeAck>,
    pub after: T,
    pub checkpoint_failure: Option<String>,
}

/// The bank operations of the memory loop. No method is called while an
/// LLM call runs.
pub trait BankStore {
    /// Runs `f` on a view holding every write acknowledged so far.
    fn read<T>(&self, f: impl FnOnce(&Bank) -> Result<T, AgentError>) -> Result<T, AgentError>;

    /// Applies `changes` as one transaction (one WAL record), durable when
    /// this returns, then runs `after` on a view that includes it.
    fn commit<T>(
        &self,
        changes: Vec<Change>,
        after: impl FnOnce(&Bank, &[ChangeAck]) -> Result<T, AgentError>,
    ) -> Result<Committed<T>, AgentError>;

    /// Writes the distilled root of `node`'s chain and flags `node`;
    /// returns the new root (in `after`; `acks` is empty). A node
    /// consolidated meanwhile is
    /// `AgentError::Bank(BankError::AlreadyConsolidated)`.
    fn consolidate(&self, node: u32, fields: BTreeMap<String, String>) -> Result<Committed<u32>, AgentError>;
}

/// A bank directory: a read-only open per read, the writer per commit
/// (waiting, bounded, while another process holds it), a checkpoint after
/// each commit.
#[derive(Debug, Clone)]
pub struct DirStore {
    pub bank: PathBuf,
    pub sync: SyncPolicy,
    /// How long to wait for another process's writer lock.
    pub lock_wait: Duration,
    /// `AgentConfig::interrupted`.
    pub interrupted: Option<fn() -> bool>,
}

impl DirStore {
    pub fn new(config: &AgentConfig) -> DirStore {
        DirStore {
            bank: config.bank.clone(),
            sync: config.sync,
            lock_wait: config.lock_wait,
            interrupted: config.interrupted,
        }
    }

    pub fn open_reader(&self) -> Result<Bank, AgentError> {
        let options = OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        };
        Ok(Bank::open_dir(&self.bank, options)?)
    }

    /// Opens the writer, waiting (bounded) while another process holds it.
    fn open_writer(&self) -> Result<Bank, AgentError> {
        let options = OpenOptions {
            read_only: false,
            sync: self.sync,
            ..OpenOptions::default()
        };
        let interrupted = || self.interrupted.is_some_and(|asked| asked());
        Ok(Bank::open_dir_waiting_unless(
            &self.bank,
            options,
            self.lock_wait,
            interrupted,
        )?)
    }
}

impl BankStore for DirStore {
    fn read<T>(&self, f: impl FnOnce(&Bank) -> Result<T, AgentError>) -> Result<T, AgentError> {
        f(&self.open_reader()?)
    }

    fn commit<T>(
        &self,
        changes: Vec<Change>,
        after: impl FnOnce(&Bank, &[ChangeAck]) -> Result<T, AgentError>,
    ) -> Result<Committed<T>, AgentError> {
        let mut bank = self.open_writer()?;
        let acks = bank.transact(&changes, None)?;
        let after = after(&bank, &acks)?;
        // Durable once transact returned; a checkpoint failing now is
        // reported, not an error that would invite a second commit.
        let checkpoint_failure = bank.close_after_commits()?;
        Ok(Committed {
            acks,
            after,
            checkpoint_failure,
        })
    }

    fn consolidate(&self, node: u32, fields: BTreeMap<String, String>) -> Result<Committed<u32>, AgentError> {
        let mut bank = self.open_writer()?;
        let new_root = bank.consolidate(node, fields)?.new_root;
        // Durable once consolidate returned (as in `commit`).
        let checkpoint_failure = bank.close_after_commits()?;
        Ok(Committed {
            acks: Vec::new(),
            after: new_root,
            checkpoint_failure,
        })
    }
}

//! deltamem: a crash-safe embedded storage engine for the experience memory
//! of LLM agents, organised as residual trees (see `ARCHITECTURE.md`).
//!
//! Layers, each depending only on those above it in this list:
//! [`mod@format`] (pure byte layouts), [`storage`] (files, mmap, WAL, lock),
//! [`tree`] (the residual-tree rules, pure), [`bank`] (the API), then
//! [`interop`] (reference JSON, .npy) and `agent` (feature `agent`), which
//! use the bank API only, and [`api`], the JSON requests and replies the
//! faces (CLI, server, Python binding) share.

#[cfg(feature = "agent")]
pub mod agent;
pub mod api;
pub mod bank;
pub mod format;
pub mod interop;
pub mod storage;
pub mod tree;

#[cfg(feature = "server")]
pub mod server;

pub use bank::{
    Attach, Bank, BankConfig, BankError, Change, ChangeAck, CompactReport, ConsolidateAck, ErrorKind, FreezeReport,
    HitAck, ImportedState, InsertAck, Match, NewNode, NodeInfo, NodeRef, OpenOptions, OptionsKey, PendingIds, Problem,
    QueryOptions, Stats, SyncPolicy, TreeStats, VerifyReport, VerifyScope,
};
pub use format::manifest::TreeSpec;
pub use format::payload::Payload;
pub use format::row::{Label, NodeType};

/// Compiles and runs the README's Rust example as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

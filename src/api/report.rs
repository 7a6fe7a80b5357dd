//! Replies of `stats` and `verify`: the same JSON from the command line
//! (`--json`), the HTTP server and the MCP tools.

use serde::{Deserialize, Serialize};

use crate::bank::kernels::Level;
use crate::bank::{Stats, TreeStats, VerifyReport};
use crate::format::manifest::Manifest;

/// Counts of one tree: the bank's own type, which is already the reply
/// (one definition of the fields; its serde form is the wire form).
pub type TreeStatsReply = TreeStats;

/// Bytes on disk per node, by file kind.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct BytesPerNode {
    pub vectors: f64,
    pub table: f64,
    pub payload: f64,
    pub total: f64,
}

/// Payload text bytes against the bytes their records take on disk.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Compression {
    /// Scenario plus every field, uncompressed (`Payload::size_bytes`).
    pub plain_bytes: u64,
    /// Record bytes in the payload log: 16-byte header + zstd frame.
    pub record_bytes: u64,
    /// plain / record; None when there are no payloads.
    pub ratio: Option<f64>,
}

/// Counts and sizes of a bank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct StatsReply {
    pub dim: u32,
    /// How the vector column is stored (fixed at init).
    pub precision: String,
    /// The dot-product kernels the answering process scans with
    /// (CPU-dependent; `DELTAMEM_KERNEL` can force a lower level).
    pub kernel: String,
    /// The approximate first pass a batch of 8 or more f32 queries is
    /// scored with before the exact re-scoring of the pairs its bound
    /// cannot settle ("bfloat16" or "16-bit integer"); None when every
    /// pair is scored exactly (the kernel has none, an f16 column, or
    /// `DELTAMEM_BF16`/`DELTAMEM_FIXED16=off`).
    pub first_pass: Option<String>,
    pub nodes: u64,
    pub checkpointed_nodes: u64,
    pub eps: f32,
    pub max_depth: u8,
    pub consolidate_after: u32,
    pub trees: Vec<TreeStatsReply>,
    pub vector_bytes: u64,
    pub table_bytes: u64,
    pub payload_bytes: u64,
    /// None for an empty bank.
    pub bytes_per_node: Option<BytesPerNode>,
    pub wal_bytes: u64,
    pub checkpoint_lsn: u64,
    pub frozen: bool,
    /// Only when asked for (every payload is decompressed to measure it).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub payload_compression: Option<Compression>,
}

impl StatsReply {
    pub fn new(s: Stats, manifest: &Manifest, payload_compression: Option<Compression>) -> StatsReply {
        let n = s.nodes as f64;
        let bytes_per_node = (s.nodes > 0).then(|| BytesPerNode {
            vectors: s.vector_bytes as f64 / n,
            table: s.table_bytes as f64 / n,
            payload: s.payload_bytes as f64 / n,
            total: (s.vector_bytes + s.table_bytes + s.payload_bytes) as f64 / n,
        });
        StatsReply {
            dim: s.dim_count,
            precision: s.precision.as_str().to_string(),
            kernel: Level::active().name().to_string(),
            first_pass: (s.precision == crate::format::manifest::Precision::F32)
                .then(|| crate::bank::kernels::first_pass_name(Level::active()))
                .flatten()
                .map(str::to_string),
            nodes: s.nodes,
            checkpointed_nodes: s.checkpointed_nodes,
            eps: manifest.eps,
            max_depth: manifest.max_depth,
            consolidate_after: manifest.consolidate_after,
            trees: s.trees,
            vector_bytes: s.vector_bytes,
            table_bytes: s.table_bytes,
            payload_bytes: s.payload_bytes,
            bytes_per_node,
            wal_bytes: s.wal_bytes,
            checkpoint_lsn: s.checkpoint_lsn,
            frozen: s.frozen,
            payload_compression,
        }
    }
}

/// One problem `verify` found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProblemReply {
    /// The damaged file (the bank itself for a problem of the whole bank).
    pub file: String,
    pub offset_bytes: u64,
    pub detail: String,
}

/// What `verify` found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct VerifyReply {
    pub ok: bool,
    pub nodes_checked: u64,
    pub wal_records: u64,
    pub problems: Vec<ProblemReply>,
}

impl VerifyReply {
    /// `bank_name` stands in for the file of a problem of the whole bank.
    pub fn new(report: VerifyReport, bank_name: &str) -> VerifyReply {
        VerifyReply {
            ok: report.is_ok(),
            nodes_checked: report.nodes_checked,
            wal_records: report.wal_records,
            problems: report
                .problems
                .into_iter()
                .map(|p| ProblemReply {
                    file: if p.file.is_empty() {
                        bank_name.to_string()
                    } else {
                        p.file
                    },
                    offset_bytes: p.offset_bytes,
                    detail: p.detail,
                })
                .collect(),
        }
    }
}

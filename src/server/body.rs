//! Request and response bodies of the HTTP and MCP faces.
//!
//! Until the shared `deltamem::api` module (the CLI's JSON Lines types)
//! lands, the request types live here; they follow the CLI's field names
//! exactly so the switch changes no wire format.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::bank::{Bank, BankError, InsertAck, Match, NodeRef, QueryOptions};
use crate::format::row::Row;
use crate::{Attach, Label, NewNode, Payload};

/// A node named by its index (a number) or its external id (a string).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum NodeRefIn {
    Index(u32),
    External(String),
}

impl From<NodeRefIn> for NodeRef {
    fn from(r: NodeRefIn) -> NodeRef {
        match r {
            NodeRefIn::Index(i) => NodeRef::Index(i),
            NodeRefIn::External(s) => NodeRef::External(s),
        }
    }
}

/// One similarity query on a tree.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QueryRequest {
    /// The query vector; it must have the bank's dimension.
    pub embedding: Vec<f32>,
    #[serde(flatten)]
    pub options: QueryOptionsIn,
}

/// Several queries with the same options, scored in one pass.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QueryBatchRequest {
    pub embeddings: Vec<Vec<f32>>,
    #[serde(flatten)]
    pub options: QueryOptionsIn,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub struct QueryOptionsIn {
    /// Matches to return (default 1).
    #[serde(default)]
    pub k: Option<u32>,
    /// Threshold overriding the tree's tau.
    #[serde(default)]
    pub tau: Option<f32>,
    /// Failure penalty overriding the bank's eps.
    #[serde(default)]
    pub eps: Option<f32>,
    /// Also match nodes already distilled into a consolidated root.
    #[serde(default)]
    pub include_consolidated: Option<bool>,
}

impl QueryOptionsIn {
    pub fn to_options(&self) -> QueryOptions {
        QueryOptions {
            k: self.k.map_or(1, |k| k as usize),
            tau: self.tau,
            eps: self.eps,
            include_consolidated: self.include_consolidated.unwrap_or(false),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct MatchOut {
    pub id: u32,
    pub score: f32,
    pub depth: u8,
    #[serde(rename = "type")]
    pub node_type: String,
    pub label: String,
    /// Root first, ending with `id`.
    pub chain: Vec<u32>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub external_id: Option<String>,
}

impl MatchOut {
    pub fn new(bank: &Bank, m: Match) -> Result<MatchOut, BankError> {
        Ok(MatchOut {
            external_id: bank.row(m.id)?.external_id_text(),
            id: m.id,
            score: m.score,
            depth: m.depth,
            node_type: m.node_type.as_str().into(),
            label: m.label.as_str().into(),
            chain: m.chain,
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct QueryAnswer {
    pub matches: Vec<MatchOut>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct QueryBatchAnswer {
    pub answers: Vec<QueryAnswer>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AttachMode {
    Auto,
    Root,
}

/// "auto" (the write rule decides), "root", or {"parent": ID}.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum AttachIn {
    Mode(AttachMode),
    Parent { parent: NodeRefIn },
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema)]
pub enum LabelIn {
    #[serde(rename = "SUCCESS")]
    Success,
    #[serde(rename = "FAILURE")]
    Failure,
}

/// One node to store, as a `deltamem insert` line.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InsertRequest {
    pub tree: String,
    pub attach: AttachIn,
    pub label: LabelIn,
    pub scenario: String,
    /// Payload fields (e.g. execution_procedure), all strings.
    pub payload: BTreeMap<String, String>,
    pub embedding: Vec<f32>,
    /// External id; one made only of digits is refused.
    #[serde(default)]
    pub id: Option<String>,
}

impl InsertRequest {
    pub fn into_node(self) -> NewNode {
        NewNode {
            tree: self.tree,
            attach: match self.attach {
                AttachIn::Mode(AttachMode::Auto) => Attach::Auto,
                AttachIn::Mode(AttachMode::Root) => Attach::Root,
                AttachIn::Parent { parent } => Attach::Parent(parent.into()),
            },
            label: match self.label {
                LabelIn::Success => Label::Success,
                LabelIn::Failure => Label::Failure,
            },
            payload: Payload {
                scenario: self.scenario,
                fields: self.payload,
            },
            embedding: self.embedding,
            external_id: self.id,
        }
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InsertBatchRequest {
    pub nodes: Vec<InsertRequest>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct AckMatch {
    pub id: u32,
    pub score: f32,
}

/// Sent once the node is durable.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct AckOut {
    pub id: u32,
    pub tree: String,
    #[serde(rename = "type")]
    pub node_type: String,
    pub parent: Option<u32>,
    pub depth: u8,
    #[serde(rename = "match")]
    pub matched: Option<AckMatch>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub external_id: Option<String>,
}

impl AckOut {
    pub fn new(ack: InsertAck, external_id: Option<String>) -> AckOut {
        AckOut {
            id: ack.id,
            tree: ack.tree,
            node_type: ack.node_type.as_str().into(),
            parent: ack.parent,
            depth: ack.depth,
            matched: ack.matched.map(|(id, score)| AckMatch { id, score }),
            external_id,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct AcksOut {
    pub acks: Vec<AckOut>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct HitOut {
    pub id: u32,
    pub success_hits: u32,
    /// The node is now due for consolidation.
    pub due: bool,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RetrievalsRequest {
    /// The nodes of a chain that was used (each counted once).
    pub ids: Vec<NodeRefIn>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RetrievalsOut {
    pub ok: bool,
    pub nodes: u32,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsolidateRequest {
    /// The distilled fields of the new root, all strings.
    pub payload: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ConsolidateOut {
    pub source: u32,
    pub new_root: u32,
}

/// A node as `deltamem dump` prints it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct NodeOut {
    pub id: u32,
    pub tree: String,
    #[serde(rename = "type")]
    pub node_type: String,
    pub label: String,
    pub parent: Option<u32>,
    pub depth: u8,
    pub success_hits: u32,
    pub retrievals: u32,
    pub consolidated: bool,
    pub consolidated_root: bool,
    pub scenario: String,
    pub payload: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub external_id: Option<String>,
    /// Consolidated node: its distilled root; consolidated root: its source.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub link: Option<u32>,
    pub created_unix_ms: u64,
}

impl NodeOut {
    pub fn new(bank: &Bank, index: u32) -> Result<NodeOut, BankError> {
        let node = bank.node(index)?;
        let row = node.row;
        Ok(NodeOut {
            id: index,
            tree: node.tree_name,
            node_type: row.node_type.as_str().into(),
            label: row.label.as_str().into(),
            parent: row.parent(),
            depth: row.depth,
            success_hits: row.success_hits,
            retrievals: row.retrievals,
            consolidated: row.is_consolidated(),
            consolidated_root: row.is_consolidated_root(),
            scenario: node.payload.scenario,
            payload: node.payload.fields,
            external_id: row.external_id_text(),
            link: row.link(),
            created_unix_ms: row.created_unix_ms,
        })
    }
}

/// `GET /v1/nodes/{id}`: the dump line plus the node's children.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct NodeDetail {
    #[serde(flatten)]
    pub node: NodeOut,
    pub children: Vec<u32>,
}

/// A node in lists: no payload, a short title instead.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct NodeSummary {
    pub id: u32,
    pub parent: Option<u32>,
    pub depth: u8,
    #[serde(rename = "type")]
    pub node_type: String,
    pub label: String,
    pub consolidated: bool,
    pub consolidated_root: bool,
    pub success_hits: u32,
    pub retrievals: u32,
    pub created_at_ms: u64,
    pub external_id: Option<String>,
    /// Activation condition, or else the scenario, cut to 120 characters.
    pub title: String,
}

/// Longest `title` of a summary, in characters.
const TITLE_MAX_CHARS: usize = 120;

impl NodeSummary {
    pub fn new(bank: &Bank, index: u32) -> Result<NodeSummary, BankError> {
        let row: Row = bank.row(index)?;
        let payload = bank.payload(index)?;
        let text = payload
            .fields
            .get("activation_condition")
            .filter(|t| !t.is_empty())
            .unwrap_or(&payload.scenario);
        Ok(NodeSummary {
            id: index,
            parent: row.parent(),
            depth: row.depth,
            node_type: row.node_type.as_str().into(),
            label: row.label.as_str().into(),
            consolidated: row.is_consolidated(),
            consolidated_root: row.is_consolidated_root(),
            success_hits: row.success_hits,
            retrievals: row.retrievals,
            created_at_ms: row.created_unix_ms,
            external_id: row.external_id_text(),
            title: text.chars().take(TITLE_MAX_CHARS).collect(),
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct NodePage {
    pub total: u32,
    pub nodes: Vec<NodeSummary>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct NodeList {
    pub nodes: Vec<NodeSummary>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ChildrenOut {
    pub children: Vec<NodeSummary>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct DueOut {
    pub due: Vec<NodeSummary>,
}

/// A chain, root first; rendered: ids and the prompt text.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum ChainOut {
    Nodes { chain: Vec<NodeOut> },
    Rendered { chain: Vec<u32>, text: String },
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct TreeInfo {
    pub name: String,
    pub tau: f32,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct BankInfo {
    pub dim: u32,
    pub precision: String,
    pub eps: f32,
    pub max_depth: u8,
    pub consolidate_after: u32,
    pub trees: Vec<TreeInfo>,
    pub node_count: u32,
    pub read_only: bool,
    /// Whether /v1/retrieve and /v1/record are served.
    pub agent: bool,
}

impl BankInfo {
    pub fn new(bank: &Bank, read_only: bool) -> BankInfo {
        let m = bank.manifest();
        BankInfo {
            dim: bank.dim_count(),
            precision: format!("{:?}", bank.precision()).to_lowercase(),
            eps: m.eps,
            max_depth: m.max_depth,
            consolidate_after: m.consolidate_after,
            trees: m
                .trees
                .iter()
                .map(|t| TreeInfo {
                    name: t.name.clone(),
                    tau: t.tau,
                })
                .collect(),
            node_count: bank.node_count(),
            read_only,
            agent: cfg!(feature = "agent"),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct TreeStatsOut {
    pub name: String,
    pub tau: f32,
    pub nodes: u64,
    pub roots: u64,
    pub residuals: u64,
    pub successes: u64,
    pub failures: u64,
    pub consolidated: u64,
    pub consolidated_roots: u64,
    pub due_for_consolidation: u64,
    /// `depth_histogram[d - 1]` = nodes at depth d.
    pub depth_histogram: Vec<u64>,
}

/// Counts and sizes, as `deltamem stats --json` (without the per-process
/// kernel and the --deep compression figures).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct StatsOut {
    pub dim: u32,
    pub precision: String,
    pub nodes: u64,
    pub checkpointed_nodes: u64,
    pub trees: Vec<TreeStatsOut>,
    pub vector_bytes: u64,
    pub table_bytes: u64,
    pub payload_bytes: u64,
    pub wal_bytes: u64,
    pub checkpoint_lsn: u64,
    pub frozen: bool,
}

impl StatsOut {
    pub fn new(s: crate::bank::Stats) -> StatsOut {
        StatsOut {
            dim: s.dim_count,
            precision: format!("{:?}", s.precision).to_lowercase(),
            nodes: s.nodes,
            checkpointed_nodes: s.checkpointed_nodes,
            trees: s
                .trees
                .into_iter()
                .map(|t| TreeStatsOut {
                    name: t.name,
                    tau: t.tau,
                    nodes: t.nodes,
                    roots: t.roots,
                    residuals: t.residuals,
                    successes: t.successes,
                    failures: t.failures,
                    consolidated: t.consolidated,
                    consolidated_roots: t.consolidated_roots,
                    due_for_consolidation: t.due_for_consolidation,
                    depth_histogram: t.depth_histogram,
                })
                .collect(),
            vector_bytes: s.vector_bytes,
            table_bytes: s.table_bytes,
            payload_bytes: s.payload_bytes,
            wal_bytes: s.wal_bytes,
            checkpoint_lsn: s.checkpoint_lsn,
            frozen: s.frozen,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ProblemOut {
    /// File name inside the bank ("" for the bank as a whole).
    pub file: String,
    pub offset_bytes: u64,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct VerifyOut {
    pub ok: bool,
    pub nodes_checked: u64,
    pub wal_records: u64,
    pub problems: Vec<ProblemOut>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ErrorOut {
    /// What is wrong, naming the field when one is to blame.
    pub error: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub field: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct HealthOut {
    pub ok: bool,
}

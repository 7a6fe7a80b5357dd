//! Request and response bodies of the HTTP and MCP faces.
//!
//! The CLI's request and reply types come from `deltamem::api` (one set
//! for every face); what only the server has (batches, pages, summaries,
//! bank info, stats, errors) is defined here.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::api::QueryDefaults;
pub use crate::api::{
    ChainReply, ConsolidateReply, ConsolidateRequest, HitReply, InsertReply, InsertRequest, NodeRefJson, NodeReply,
    QueryReply, StatsReply, TreeQuery, VerifyReply,
};
use crate::bank::{Bank, BankError, QueryOptions};
use crate::format::row::Row;

/// Several queries with the same options, scored in one pass.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QueryBatchRequest {
    /// Each an array of numbers or base64 of little-endian f32 values.
    #[serde(deserialize_with = "crate::api::embedding::embeddings")]
    #[schemars(with = "Vec<crate::api::embedding::EmbeddingSchema>")]
    pub embeddings: Vec<Vec<f32>>,
    /// How many matches per query (default 1).
    #[serde(default)]
    pub k: Option<usize>,
    /// Threshold in -1..=1 (default: the tree's).
    #[serde(default)]
    #[schemars(range(min = -1.0, max = 1.0))]
    pub tau: Option<f32>,
    /// Failure penalty, finite and >= 0 (default: the bank's).
    #[serde(default)]
    #[schemars(range(min = 0.0))]
    pub eps: Option<f32>,
    /// Also match nodes already distilled into a consolidated root.
    #[serde(default)]
    pub include_consolidated: Option<bool>,
}

impl QueryBatchRequest {
    /// The embeddings, and the options checked as for a single query.
    pub fn into_parts(self) -> Result<(Vec<Vec<f32>>, QueryOptions), BankError> {
        let options = TreeQuery {
            embedding: Vec::new(),
            k: self.k,
            tau: self.tau,
            eps: self.eps,
            include_consolidated: self.include_consolidated,
        }
        .options(QUERY_DEFAULTS)?;
        Ok((self.embeddings, options))
    }
}

/// What the server fills in for options a query leaves out.
pub const QUERY_DEFAULTS: QueryDefaults = QueryDefaults {
    k: 1,
    include_consolidated: false,
};

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct QueryBatchAnswer {
    pub answers: Vec<QueryReply>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InsertBatchRequest {
    /// Each an object (an insert line), never a positional array.
    #[serde(deserialize_with = "crate::api::objects_only")]
    pub nodes: Vec<InsertRequest>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct AcksOut {
    pub acks: Vec<InsertReply>,
}

/// The most items a batch may hold, whatever `--max-batch` says. A list of
/// ids is refused as it is parsed once it passes this: 16 MiB of `0,`
/// would otherwise be built into 8M ids (about 256 MB) before the batch
/// limit is checked.
pub const BATCH_ITEMS_CAP: usize = 1 << 16;

fn bounded_ids<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<NodeRefJson>, D::Error> {
    struct Ids;
    impl<'de> serde::de::Visitor<'de> for Ids {
        type Value = Vec<NodeRefJson>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "an array of at most {BATCH_ITEMS_CAP} node ids")
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut ids = Vec::new();
            // Bounded: at most BATCH_ITEMS_CAP + 1 steps.
            while let Some(id) = seq.next_element()? {
                if ids.len() == BATCH_ITEMS_CAP {
                    return Err(serde::de::Error::custom(format!("more than {BATCH_ITEMS_CAP} ids")));
                }
                ids.push(id);
            }
            Ok(ids)
        }
    }
    d.deserialize_seq(Ids)
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RetrievalsRequest {
    /// The nodes of a chain that was used (each counted once).
    #[serde(deserialize_with = "bounded_ids")]
    pub ids: Vec<NodeRefJson>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RetrievalsOut {
    pub ok: bool,
    pub nodes: u32,
}

/// `GET /v1/nodes/{id}`: the dump line (with `?embedding=true` its
/// vector too) plus the node's children.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct NodeDetail {
    #[serde(flatten)]
    pub node: NodeReply,
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

/// A page of a tree's shape, from the node table alone (no payload is
/// read): one entry per node in each array, in the tree's order. The
/// explorer draws a tree from these and asks for the titles
/// (`/v1/summaries`) only of the nodes it labels.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct OutlineOut {
    /// Nodes in the tree.
    pub total: u32,
    /// Position in the tree of the first node of this page.
    pub offset: u32,
    pub ids: Vec<u32>,
    /// Null for a top-level root.
    pub parents: Vec<Option<u32>>,
    pub depths: Vec<u8>,
    pub success_hits: Vec<u32>,
    /// Bits: 1 residual, 2 failure, 4 consolidated, 8 consolidated root.
    pub kinds: Vec<u8>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SummariesRequest {
    /// The nodes wanted, by index or external id.
    #[serde(deserialize_with = "bounded_ids")]
    pub ids: Vec<NodeRefJson>,
}

/// A tree's history in one answer, aggregated on the server so that a
/// client of a 1M-node tree does not fetch every summary to draw it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct HistoryOut {
    /// Nodes in the tree.
    pub nodes: u32,
    /// Nodes with no creation time (0 on disk: imported without one).
    pub undated: u32,
    /// The growth curve, oldest first: at time `t_ms`, `nodes` dated nodes
    /// had been created (all created at or before `t_ms`). At most
    /// `points` samples; the last is the newest node's time and every
    /// dated node.
    pub growth: Vec<GrowthPoint>,
    /// Dated consolidated roots in the tree.
    pub consolidations: u32,
    /// The newest of them, at most `points`, oldest first.
    pub consolidation_marks: Vec<HistoryMark>,
    /// The nodes with the most success hits at the pass (ties: lower id
    /// first), at most `top`, ordered by the counts they show (a hit
    /// counted since may have moved one); nodes without a hit are left out.
    pub top_hits: Vec<NodeSummary>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GrowthPoint {
    pub t_ms: u64,
    pub nodes: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HistoryMark {
    pub id: u32,
    pub created_at_ms: u64,
}

/// A chain, root first; rendered: ids and the prompt text.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum ChainOut {
    Nodes(ChainReply),
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
    /// Most items one batch request may hold (`--max-batch`): nodes,
    /// query embeddings, ids.
    pub max_batch: usize,
}

impl BankInfo {
    pub fn new(bank: &Bank, read_only: bool, max_batch: usize) -> BankInfo {
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
            max_batch,
        }
    }
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

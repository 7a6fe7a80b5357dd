//! Replies about stored nodes: a dumped node, a chain, a success hit, a
//! consolidation, a node due for consolidation.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::fields::{Fields, LabelJson, NodeTypeJson};
use crate::bank::{Bank, BankError, ConsolidateAck, HitAck};

/// Everything stored about one node (a `dump` line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct NodeReply {
    pub id: u32,
    pub tree: String,
    #[serde(rename = "type")]
    pub node_type: NodeTypeJson,
    pub label: LabelJson,
    pub parent: Option<u32>,
    pub depth: u8,
    pub success_hits: u32,
    pub retrievals: u32,
    pub consolidated: bool,
    pub consolidated_root: bool,
    pub scenario: String,
    pub payload: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_id: Option<String>,
    /// Consolidated node: its distilled root; consolidated root: its source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<u32>,
    pub created_unix_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding: Option<Vec<f32>>,
}

impl NodeReply {
    /// Reads node `index`, with its stored (normalised) vector if asked.
    pub fn read(bank: &Bank, index: u32, embedding: bool) -> Result<NodeReply, BankError> {
        let node = bank.node(index)?;
        let row = node.row;
        let embedding = match embedding {
            true => Some(bank.vector(index)?),
            false => None,
        };
        Ok(NodeReply {
            id: index,
            tree: node.tree_name,
            node_type: row.node_type.into(),
            label: row.label.into(),
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
            embedding,
        })
    }
}

/// One node of a chain, as `chain` prints it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ChainNode {
    pub id: u32,
    #[serde(rename = "type")]
    pub node_type: NodeTypeJson,
    pub label: LabelJson,
    pub depth: u8,
    pub scenario: String,
    pub payload: BTreeMap<String, String>,
}

/// A node's chain, root first, with each node's text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ChainReply {
    pub chain: Vec<u32>,
    pub nodes: Vec<ChainNode>,
}

impl ChainReply {
    pub fn read(bank: &Bank, index: u32) -> Result<ChainReply, BankError> {
        let chain = bank.chain(index)?;
        let mut nodes = Vec::with_capacity(chain.len());
        for &id in &chain {
            let node = bank.node(id)?;
            nodes.push(ChainNode {
                id,
                node_type: node.row.node_type.into(),
                label: node.row.label.into(),
                depth: node.row.depth,
                scenario: node.payload.scenario,
                payload: node.payload.fields,
            });
        }
        Ok(ChainReply { chain, nodes })
    }
}

/// The acknowledgement of a success hit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct HitReply {
    pub id: u32,
    pub success_hits: u32,
    /// The node is now due for consolidation.
    pub due: bool,
}

impl From<HitAck> for HitReply {
    fn from(a: HitAck) -> HitReply {
        HitReply {
            id: a.id,
            success_hits: a.success_hits,
            due: a.due,
        }
    }
}

/// A consolidation's distilled fields (`POST .../consolidate`; the CLI
/// takes the bare `Fields` object as `--payload`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ConsolidateRequest {
    pub payload: Fields,
}

/// The acknowledgement of a consolidation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ConsolidateReply {
    pub source: u32,
    pub new_root: u32,
}

impl From<ConsolidateAck> for ConsolidateReply {
    fn from(a: ConsolidateAck) -> ConsolidateReply {
        ConsolidateReply {
            source: a.source,
            new_root: a.new_root,
        }
    }
}

/// A node due for consolidation (a `due` line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct DueReply {
    pub id: u32,
    pub tree: String,
    pub success_hits: u32,
    pub chain: Vec<u32>,
}

impl DueReply {
    pub fn read(bank: &Bank, index: u32) -> Result<DueReply, BankError> {
        let row = bank.row(index)?;
        Ok(DueReply {
            id: index,
            tree: bank.tree_name(row.tree).to_string(),
            success_hits: row.success_hits,
            chain: bank.chain(index)?,
        })
    }
}

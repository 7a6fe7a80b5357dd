//! Inserting a node: the request and its acknowledgement.

use serde::{Deserialize, Serialize};

use super::fields::{AttachJson, Fields, LabelJson, NodeTypeJson};
use crate::bank::{InsertAck, NewNode};
use crate::format::payload::Payload;

/// One node to store (an `insert` line, a `POST .../nodes` body).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct InsertRequest {
    pub tree: String,
    pub attach: AttachJson,
    pub label: LabelJson,
    /// The text the node is about (not empty).
    pub scenario: String,
    /// The node's fields (string values), at most 4 MiB with the scenario.
    pub payload: Fields,
    /// Any length-`dim` vector of finite numbers; stored L2-normalised.
    pub embedding: Vec<f32>,
    /// External id: a lowercase hyphenated UUID or 1..=16 bytes of text,
    /// not all digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

impl From<InsertRequest> for NewNode {
    fn from(r: InsertRequest) -> NewNode {
        NewNode {
            tree: r.tree,
            attach: r.attach.into(),
            label: r.label.into(),
            payload: Payload {
                scenario: r.scenario,
                fields: r.payload.0,
            },
            embedding: r.embedding,
            external_id: r.id,
        }
    }
}

/// The best match an `auto` insert's scan found at or above tau.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct MatchedAt {
    pub id: u32,
    pub score: f32,
}

/// The acknowledgement of a stored node (`insert`, `import`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct InsertReply {
    pub id: u32,
    pub tree: String,
    #[serde(rename = "type")]
    pub node_type: NodeTypeJson,
    pub parent: Option<u32>,
    pub depth: u8,
    #[serde(rename = "match")]
    pub matched: Option<MatchedAt>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_id: Option<String>,
}

impl InsertReply {
    /// The reply for a bank ack; `external_id` is the node's, if any.
    pub fn new(ack: InsertAck, external_id: Option<String>) -> InsertReply {
        InsertReply {
            id: ack.id,
            tree: ack.tree,
            node_type: ack.node_type.into(),
            parent: ack.parent,
            depth: ack.depth,
            matched: ack.matched.map(|(id, score)| MatchedAt { id, score }),
            external_id,
        }
    }
}

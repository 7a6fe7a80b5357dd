//! Inserting a node: the request and its acknowledgement.

use serde::{Deserialize, Serialize};

use super::ApiError;
use super::fields::{AttachJson, Fields, LabelJson, NodeTypeJson};
use crate::bank::{Attach, InsertAck, NewNode};
use crate::format::payload::Payload;
use crate::format::row::Label;

/// One node to store (an `insert` line, a `POST .../nodes` body).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct InsertRequest {
    pub tree: String,
    pub attach: AttachJson,
    pub label: LabelJson,
    /// The text the node is about (not empty).
    #[cfg_attr(feature = "schema", schemars(regex(pattern = r"\S")))]
    pub scenario: String,
    /// The node's fields (string values), at most 4 MiB with the scenario.
    pub payload: Fields,
    /// Any length-`dim` vector of finite numbers; stored L2-normalised.
    /// An array of numbers, or base64 of little-endian f32 values.
    #[serde(deserialize_with = "super::embedding::embedding")]
    #[cfg_attr(feature = "schema", schemars(with = "super::embedding::EmbeddingSchema"))]
    pub embedding: Vec<f32>,
    /// External id: a lowercase hyphenated UUID or 1..=16 bytes of text,
    /// not all digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(regex(pattern = EXTERNAL_ID_PATTERN)))]
    pub id: Option<String>,
}

/// What the schema offers for an external id: a lowercase hyphenated UUID,
/// or 1..=16 printable ASCII characters not all digits (a subset of the
/// 1..=16 bytes of text `Bank` takes, so a client that follows it is not
/// refused for the id's form).
#[cfg(feature = "schema")]
const EXTERNAL_ID_PATTERN: &str =
    "^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|(?=[ -~]*[^0-9])[ -~]{1,16})$";

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

/// One line of an `import --npy` META file: what the node of the matrix
/// row at the same position gets besides its vector. Every key is
/// optional (null is the same as absent).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RowMeta {
    /// If given, must name the tree the import writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<String>,
    /// Default: `row N`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Fields>,
    /// Default: SUCCESS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<LabelJson>,
    /// Default: root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attach: Option<AttachJson>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

impl RowMeta {
    /// The node of matrix row `row` in an import into `tree`; its
    /// embedding is left empty (it travels in the import's column).
    pub fn into_node(self, tree: &str, row: u64) -> Result<NewNode, ApiError> {
        if let Some(t) = self.tree.as_deref().filter(|t| *t != tree) {
            return Err(ApiError::Request(format!(
                "\"tree\" is {t:?}, but this import writes tree {tree:?}"
            )));
        }
        Ok(NewNode {
            tree: tree.to_string(),
            attach: self.attach.map_or(Attach::Root, Attach::from),
            label: self.label.map_or(Label::Success, Label::from),
            payload: Payload {
                scenario: self.scenario.unwrap_or_else(|| format!("row {row}")),
                fields: self.payload.unwrap_or_default().0,
            },
            embedding: Vec::new(),
            external_id: self.id,
        })
    }
}

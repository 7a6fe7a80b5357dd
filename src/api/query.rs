//! Querying a tree: the request, its answer, and the answering itself
//! (one home for the per-face steps: defaults, validation, external ids).

use serde::{Deserialize, Serialize};

use super::ApiError;
use super::fields::{LabelJson, NodeTypeJson};
use crate::bank::{Bank, BankError, Match, QueryOptions};

/// One query line of `deltamem query`: the tree and a [`TreeQuery`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct QueryRequest {
    pub tree: String,
    #[serde(deserialize_with = "super::embedding::embedding")]
    #[cfg_attr(feature = "schema", schemars(with = "super::embedding::EmbeddingSchema"))]
    pub embedding: Vec<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = -1.0, max = 1.0)))]
    pub tau: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0, max = f32::MAX)))]
    pub eps: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_consolidated: Option<bool>,
}

impl QueryRequest {
    /// The tree, and the query to run in it.
    pub fn into_parts(self) -> (String, TreeQuery) {
        let query = TreeQuery {
            embedding: self.embedding,
            k: self.k,
            tau: self.tau,
            eps: self.eps,
            include_consolidated: self.include_consolidated,
        };
        (self.tree, query)
    }
}

/// A query of a tree named elsewhere (a URL path): `QueryRequest`
/// without its `tree`. serde cannot flatten a struct that refuses unknown
/// keys, hence the two field lists.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct TreeQuery {
    #[serde(deserialize_with = "super::embedding::embedding")]
    #[cfg_attr(feature = "schema", schemars(with = "super::embedding::EmbeddingSchema"))]
    pub embedding: Vec<f32>,
    /// How many matches (default: the face's, 1 for the CLI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k: Option<usize>,
    /// Threshold in -1..=1 (default: the tree's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = -1.0, max = 1.0)))]
    pub tau: Option<f32>,
    /// Failure penalty, finite and >= 0 (default: the bank's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0, max = f32::MAX)))]
    pub eps: Option<f32>,
    /// Also match nodes already distilled into a consolidated root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_consolidated: Option<bool>,
}

/// What a face fills in for the options a request leaves out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryDefaults {
    pub k: usize,
    pub include_consolidated: bool,
}

impl TreeQuery {
    /// The bank's options for this query, checked against the same
    /// ranges as `init`.
    pub fn options(&self, defaults: QueryDefaults) -> Result<QueryOptions, BankError> {
        let options = QueryOptions {
            k: self.k.unwrap_or(defaults.k),
            tau: self.tau,
            eps: self.eps,
            include_consolidated: self.include_consolidated.unwrap_or(defaults.include_consolidated),
        };
        options.validate()?;
        Ok(options)
    }

    /// Runs the query against tree `tree` of `bank`.
    pub fn answer(&self, bank: &Bank, tree: &str, defaults: QueryDefaults) -> Result<QueryReply, ApiError> {
        let options = self.options(defaults)?;
        let found = bank.query(tree, &self.embedding, &options)?;
        Ok(QueryReply::new(bank, found)?)
    }
}

/// One match: the node, its score and its chain (root first).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct MatchReply {
    pub id: u32,
    pub score: f32,
    pub depth: u8,
    #[serde(rename = "type")]
    pub node_type: NodeTypeJson,
    pub label: LabelJson,
    pub chain: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_id: Option<String>,
}

impl MatchReply {
    /// A match as replied, with the node's external id when it has one.
    pub fn new(bank: &Bank, m: Match) -> Result<MatchReply, BankError> {
        let external_id = bank.row(m.id)?.external_id_text();
        Ok(MatchReply {
            id: m.id,
            score: m.score,
            depth: m.depth,
            node_type: m.node_type.into(),
            label: m.label.into(),
            chain: m.chain,
            external_id,
        })
    }
}

/// The answer to one query, best match first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct QueryReply {
    pub matches: Vec<MatchReply>,
}

impl QueryReply {
    pub fn new(bank: &Bank, found: Vec<Match>) -> Result<QueryReply, BankError> {
        let matches = found
            .into_iter()
            .map(|m| MatchReply::new(bank, m))
            .collect::<Result<_, _>>()?;
        Ok(QueryReply { matches })
    }
}

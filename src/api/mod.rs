//! The JSON protocol of the faces: the requests and replies the CLI, the
//! HTTP/MCP server and the Python binding exchange with their callers, one
//! set of types for all of them, with the conversions to and from the bank
//! API's types. A face parses with [`parse_object`], converts, calls the
//! bank and serialises the reply; it never re-implements a rule.
//!
//! Requests are strict: an unknown key, a key given twice, a value of the
//! wrong type or a non-object document is refused with a message naming
//! the key (`deny_unknown_fields`, serde's duplicate-field check, and
//! [`Fields`] for string maps). Range rules live in the bank
//! ([`crate::QueryOptions::validate`]), so every face gets the same ones.
//!
//! With the `schema` feature every type here derives
//! `schemars::JsonSchema` (schemars 1.x, as rmcp uses), for OpenAPI
//! documents and MCP tool schemas.

pub mod embedding;
mod fields;
mod insert;
mod node;
mod query;
mod report;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::bank::BankError;

pub use fields::{AttachJson, Fields, LabelJson, NodeRefJson, NodeTypeJson, ObjectOnly, objects_only};
pub use insert::{InsertReply, InsertRequest, MatchedAt, RowMeta};
pub use node::{ChainNode, ChainReply, ConsolidateReply, ConsolidateRequest, DueReply, HitReply, NodeReply};
pub use query::{MatchReply, QueryDefaults, QueryReply, QueryRequest, TreeQuery};
pub use report::{BytesPerNode, Compression, ProblemReply, StatsReply, TreeStatsReply, VerifyReply};

/// Why a request was not carried out.
#[derive(Debug, Error)]
pub enum ApiError {
    /// The request itself is malformed (names the key, and the column
    /// for a JSON line).
    #[error("{0}")]
    Request(String),
    /// The bank refused or failed.
    #[error(transparent)]
    Bank(#[from] BankError),
}

/// The reply to an input line that could not be carried out, in place of
/// its answer: line-oriented faces print one line per input line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LineError {
    /// 1-based input line number.
    pub line: u64,
    pub error: String,
}

/// Parses one JSON document that must be an object into a request type.
/// Messages name the key at fault (`payload.a`, `embedding[2]`) and, for
/// broken JSON, the column (a line's only meaningful position).
pub fn parse_object<T: DeserializeOwned>(text: &str) -> Result<T, ApiError> {
    if text.trim().is_empty() {
        return Err(ApiError::Request("empty line: expected a JSON object".into()));
    }
    if let Some(kind) = non_object_kind(text) {
        return Err(ApiError::Request(format!("expected a JSON object, got {kind}")));
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        ApiError::Request(describe(text, &path, &e.into_inner()))
    })?;
    de.end().map_err(|e| ApiError::Request(describe(text, ".", &e)))?;
    Ok(value)
}

/// What a document that is not an object starts as, by its first byte (a
/// struct would otherwise also accept a positional array).
fn non_object_kind(text: &str) -> Option<&'static str> {
    match text.trim_start().bytes().next()? {
        b'{' => None,
        b'[' => Some("an array"),
        b'"' => Some("a string"),
        b'n' if text.trim() == "null" => Some("null"),
        b't' | b'f' if ["true", "false"].contains(&text.trim()) => Some("a boolean"),
        b'-' | b'0'..=b'9' if serde_json::from_str::<f64>(text).is_ok() => Some("a number"),
        _ => None,
    }
}

/// serde_json's message ends with "at line 1 column N"; within a line only
/// the column means anything, so the message is rebuilt around it, led by
/// the path of the value at fault.
fn describe(text: &str, path: &str, inner: &serde_json::Error) -> String {
    let reason = json_reason(inner);
    if inner.is_syntax() || inner.is_eof() {
        let hint = nan_hint(text.as_bytes());
        return format!("malformed JSON at column {}: {reason}{hint}", inner.column());
    }
    match path {
        "." | "" => format!("{reason} (column {})", inner.column()),
        _ => format!("\"{path}\": {reason} (column {})", inner.column()),
    }
}

/// serde_json's message without its trailing "at line L column C" (each
/// face places the error its own way).
pub fn json_reason(inner: &serde_json::Error) -> String {
    let full = inner.to_string();
    full.split(" at line ").next().unwrap_or(&full).to_string()
}

/// A hint for malformed JSON that spells a float JSON cannot hold.
pub fn nan_hint(text: &[u8]) -> &'static str {
    let spelled = |w: &[u8]| text.windows(w.len()).any(|b| b == w);
    match spelled(b"NaN") || spelled(b"Infinity") {
        true => " (JSON has no NaN or Infinity)",
        false => "",
    }
}

#[cfg(test)]
mod tests;

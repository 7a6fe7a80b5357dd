//! Pulling one JSON object out of an LLM reply.
//!
//! Models wrap JSON in code fences, put prose before or after it, emit raw
//! newlines inside strings, leave trailing commas, or prefix a reasoning
//! block. This module tolerates all of that and never panics: anything it
//! cannot turn into an object is a typed [`ReplyError`] that quotes the
//! start of the reply.

use serde_json::{Map, Value};
use thiserror::Error;

/// How much of a bad reply an error quotes.
const EXCERPT_CHARS: usize = 240;

#[derive(Debug, Clone, Error, PartialEq)]
pub enum ReplyError {
    #[error("the model returned an empty reply")]
    Empty,
    #[error("no JSON object found in the reply: {excerpt:?}")]
    NoObject { excerpt: String },
    #[error("the reply is JSON but not an object (found {found}): {excerpt:?}")]
    NotAnObject { found: &'static str, excerpt: String },
    #[error("the reply looks like a JSON object but does not parse ({detail}): {excerpt:?}")]
    Malformed { detail: String, excerpt: String },
    #[error("the reply lacks the required field {field:?}: {excerpt:?}")]
    MissingField { field: String, excerpt: String },
    #[error("the reply says skip, but this prompt has no retrieved chain to defer to")]
    SkipNotAllowed,
    #[error(
        "the node built from the reply has a payload of {size_bytes} bytes, over the bank's limit of {limit_bytes}"
    )]
    TooLarge { size_bytes: usize, limit_bytes: usize },
}

/// A parsed reply: the model declined to write a node, or gave fields.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Skip,
    Object(Map<String, Value>),
}

/// Finds the JSON object in `text`. `{"skip": true}` (also `"true"`, `1`)
/// becomes [`Reply::Skip`]; any other object is returned whole.
pub fn parse_reply(text: &str) -> Result<Reply, ReplyError> {
    let object = extract_object(text)?;
    if object.get("skip").is_some_and(is_truthy) {
        return Ok(Reply::Skip);
    }
    Ok(Reply::Object(object))
}

fn is_truthy(v: &Value) -> bool {
    match v {
        Value::Bool(b) => *b,
        Value::String(s) => matches!(s.trim().to_ascii_lowercase().as_str(), "true" | "yes"),
        Value::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
        _ => false,
    }
}

/// The first JSON object in `text`, trying in turn: the whole reply, each
/// fenced code block, then every balanced `{...}` span; each candidate
/// first as is, then repaired (raw control characters escaped, trailing
/// commas dropped).
pub fn extract_object(text: &str) -> Result<Map<String, Value>, ReplyError> {
    let text = strip_reasoning(text);
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(ReplyError::Empty);
    }
    let mut candidates: Vec<&str> = vec![trimmed];
    candidates.extend(fenced_blocks(trimmed));
    candidates.extend(brace_spans(trimmed));

    let mut first_non_object: Option<&'static str> = None;
    let mut first_error: Option<String> = None;
    for candidate in candidates {
        let candidate = candidate.trim();
        if candidate.is_empty() {
            continue;
        }
        for attempt in [None, Some(repair(candidate))] {
            let source = attempt.as_deref().unwrap_or(candidate);
            match serde_json::from_str::<Value>(source) {
                Ok(Value::Object(map)) => return Ok(map),
                Ok(other) => {
                    first_non_object.get_or_insert(kind_of(&other));
                }
                Err(e) => {
                    if candidate.starts_with('{') {
                        first_error.get_or_insert(e.to_string());
                    }
                }
            }
        }
    }
    let excerpt = excerpt(trimmed);
    if let Some(detail) = first_error {
        return Err(ReplyError::Malformed { detail, excerpt });
    }
    if let Some(found) = first_non_object {
        return Err(ReplyError::NotAnObject { found, excerpt });
    }
    Err(ReplyError::NoObject { excerpt })
}

/// The start of a reply, for error messages.
pub fn excerpt(text: &str) -> String {
    let mut out: String = text.chars().take(EXCERPT_CHARS).collect();
    if text.chars().count() > EXCERPT_CHARS {
        out.push_str("...");
    }
    out
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Drops `<think>...</think>` blocks that reasoning models put first. An
/// unclosed block swallows nothing (the object may be inside it).
fn strip_reasoning(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("<think>") {
        let Some(len) = rest[start..].find("</think>") else {
            break;
        };
        out.push_str(&rest[..start]);
        rest = &rest[start + len + "</think>".len()..];
    }
    out.push_str(rest);
    out
}

/// Contents of ``` fenced blocks (any info string), in order. An unclosed
/// fence runs to the end of the text.
fn fenced_blocks(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("```") {
        let after = &rest[open + 3..];
        // Skip the info string ("json", "JSON", ...) up to the line end.
        let body_start = after.find('\n').map_or(after.len(), |i| i + 1);
        let info = &after[..body_start];
        let body_start = if info.trim_start().starts_with('{') {
            0
        } else {
            body_start
        };
        let body = &after[body_start..];
        match body.find("```") {
            Some(close) => {
                out.push(&body[..close]);
                rest = &body[close + 3..];
            }
            None => {
                out.push(body);
                break;
            }
        }
    }
    out
}

/// Every top-level balanced `{...}` span, scanning with awareness of JSON
/// strings so braces inside them do not count. Bounded: one pass per
/// opening brace that starts a span, at most 64 spans.
fn brace_spans(text: &str) -> Vec<&str> {
    const MAX_SPANS: usize = 64;
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() && out.len() < MAX_SPANS {
        if bytes[i] != b'{' {
            i += 1;
            continue;
        }
        match matching_brace(bytes, i) {
            Some(end) => {
                out.push(&text[i..=end]);
                i = end + 1;
            }
            None => {
                // Unbalanced to the end: offer the tail, the repair may
                // still not save it, but the error will then be precise.
                out.push(&text[i..]);
                i += 1;
            }
        }
    }
    out
}

fn matching_brace(bytes: &[u8], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (offset, &b) in bytes[open..].iter().enumerate() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + offset);
                }
            }
            _ => {}
        }
    }
    None
}

/// Repairs the two most common defects: raw control characters inside
/// strings (escaped) and trailing commas before `}` or `]` (dropped).
fn repair(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut in_string = false;
    let mut escaped = false;
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if in_string {
            if escaped {
                escaped = false;
                out.push(c);
            } else if c == '\\' {
                escaped = true;
                out.push(c);
            } else if c == '"' {
                in_string = false;
                out.push(c);
            } else if c == '\n' {
                out.push_str("\\n");
            } else if c == '\r' {
                out.push_str("\\r");
            } else if c == '\t' {
                out.push_str("\\t");
            } else if (c as u32) < 0x20 {
                out.push_str(&format!("\\u{:04x}", c as u32));
            } else {
                out.push(c);
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if c == ',' {
            let next = chars[i + 1..].iter().find(|c| !c.is_whitespace());
            if !matches!(next, Some('}') | Some(']')) {
                out.push(c);
            }
        } else {
            out.push(c);
        }
        i += 1;
    }
    out
}

/// A field's value as text: strings as they are, lists one item a line,
/// numbers and booleans printed, objects as compact JSON; null and empty
/// strings count as absent.
pub fn field_text(value: &Value) -> Option<String> {
    let text = match value {
        Value::Null => return None,
        Value::String(s) => s.clone(),
        Value::Array(items) => items.iter().filter_map(field_text).collect::<Vec<_>>().join("\n"),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Object(_) => value.to_string(),
    };
    let text = text.trim().to_string();
    (!text.is_empty()).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(text: &str) -> Map<String, Value> {
        match parse_reply(text) {
            Ok(Reply::Object(m)) => m,
            other => panic!("{text:?} gave {other:?}"),
        }
    }

    #[test]
    fn plain_fenced_and_prose() {
        assert_eq!(obj(r#"{"a": "b"}"#)["a"], "b");
        assert_eq!(obj("```json\n{\"a\": \"b\"}\n```")["a"], "b");
        assert_eq!(obj("Sure! Here it is:\n{\"a\": \"b\"}\nHope it helps.")["a"], "b");
        assert_eq!(obj("```{\"a\": 1}```")["a"], 1);
        assert_eq!(obj("<think>maybe {\"a\": 0}</think>\n{\"a\": \"kept\"}")["a"], "kept");
    }

    #[test]
    fn repairs_raw_newlines_and_trailing_commas() {
        let m = obj("{\"a\": \"line 1\nline 2\",\n \"b\": [1, 2,],\n}");
        assert_eq!(m["a"], "line 1\nline 2");
        assert_eq!(m["b"], serde_json::json!([1, 2]));
        // Braces inside strings do not confuse the span search.
        assert_eq!(obj("text {\"a\": \"}{\"} more")["a"], "}{");
    }

    #[test]
    fn skip_forms() {
        for text in [
            r#"{"skip": true}"#,
            "```json\n{\"skip\": \"true\"}\n```",
            r#"{"skip": 1}"#,
        ] {
            assert_eq!(parse_reply(text), Ok(Reply::Skip), "{text}");
        }
        assert!(matches!(
            parse_reply(r#"{"skip": false, "a": "x"}"#),
            Ok(Reply::Object(_))
        ));
    }

    #[test]
    fn errors_are_typed() {
        assert_eq!(parse_reply("   "), Err(ReplyError::Empty));
        assert!(matches!(
            parse_reply("I cannot do that."),
            Err(ReplyError::NoObject { .. })
        ));
        assert!(matches!(
            parse_reply("[1, 2]"),
            Err(ReplyError::NotAnObject { found: "an array", .. })
        ));
        assert!(matches!(
            parse_reply("\"just a string\""),
            Err(ReplyError::NotAnObject { .. })
        ));
        assert!(matches!(
            parse_reply("{\"a\": \"unterminated"),
            Err(ReplyError::Malformed { .. })
        ));
        assert!(matches!(parse_reply("{{{{"), Err(ReplyError::Malformed { .. })));
    }

    #[test]
    fn never_panics_on_odd_input() {
        let odd = [
            "}",
            "{",
            "```",
            "```json",
            "\"",
            "\\",
            "{\"a\":\"\\",
            "{}}",
            "<think>",
            "</think>{}",
            "{\u{0}}",
            "é{\"é\":\"ü\"}",
            "{\"a\": [}",
        ];
        for text in odd {
            let _ = parse_reply(text);
        }
    }

    #[test]
    fn field_text_shapes() {
        use serde_json::json;
        assert_eq!(field_text(&json!(" x ")), Some("x".into()));
        assert_eq!(field_text(&json!(["a", "b"])), Some("a\nb".into()));
        assert_eq!(field_text(&json!(null)), None);
        assert_eq!(field_text(&json!("")), None);
        assert_eq!(field_text(&json!(3)), Some("3".into()));
    }
}

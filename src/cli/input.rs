//! Reading JSON Lines from stdin: numbered lines (bounded in size, bad
//! UTF-8 reported per line) and field extraction with messages that say
//! which field is wrong and why.

use std::collections::BTreeMap;
use std::io::{self, BufRead};
use std::sync::mpsc::{Receiver, sync_channel};

use deltamem::NodeRef;
use serde_json::{Map, Value};

/// Longest accepted line. A payload is at most 4 MiB and a vector of
/// 16384 floats well under 1 MiB as text, so this leaves ample room while
/// stopping a runaway producer from exhausting memory.
pub const MAX_LINE_BYTES: usize = 64 * 1024 * 1024;

/// One input line: its 1-based number and its text, or why it is unusable.
pub struct Line {
    pub number: u64,
    pub text: Result<String, String>,
}

/// Numbers lines and enforces `MAX_LINE_BYTES`.
pub struct LineReader<R> {
    reader: R,
    number: u64,
}

impl<R: BufRead> LineReader<R> {
    pub fn new(reader: R) -> LineReader<R> {
        LineReader { reader, number: 0 }
    }

    /// The next line, None at end of input.
    pub fn next_line(&mut self) -> io::Result<Option<Line>> {
        let mut bytes = Vec::new();
        let mut too_long = false;
        let mut saw_any = false;
        loop {
            let chunk = self.reader.fill_buf()?;
            if chunk.is_empty() {
                break;
            }
            saw_any = true;
            let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
                Some(at) => (at + 1, true),
                None => (chunk.len(), false),
            };
            if bytes.len() + take > MAX_LINE_BYTES {
                too_long = true;
                bytes.clear();
            } else if !too_long {
                bytes.extend_from_slice(&chunk[..take]);
            }
            self.reader.consume(take);
            if done {
                break;
            }
        }
        if !saw_any {
            return Ok(None);
        }
        self.number += 1;
        let text = if too_long {
            Err(format!("longer than {MAX_LINE_BYTES} bytes"))
        } else {
            String::from_utf8(bytes).map_err(|e| format!("not valid UTF-8 (byte {})", e.utf8_error().valid_up_to() + 1))
        };
        Ok(Some(Line {
            number: self.number,
            text,
        }))
    }
}

/// What the stdin reading thread sends.
pub enum Event {
    Line(Line),
    ReadFailed(io::Error),
}

/// Reads stdin on its own thread, so the caller can wait with a timeout
/// (and keep a sync deadline) while the producer is idle. The channel is
/// bounded so a fast producer cannot run ahead of the bank without limit.
/// The channel disconnects at end of input.
pub fn spawn_stdin_reader() -> Receiver<Event> {
    let (tx, rx) = sync_channel(1024);
    std::thread::spawn(move || {
        let mut reader = LineReader::new(io::stdin().lock());
        loop {
            let event = match reader.next_line() {
                Ok(Some(line)) => Event::Line(line),
                Ok(None) => return,
                Err(e) => Event::ReadFailed(e),
            };
            let failed = matches!(event, Event::ReadFailed(_));
            if tx.send(event).is_err() || failed {
                return;
            }
        }
    });
    rx
}

/// Parses a line as a JSON object. serde_json's own message ends with a
/// position "at line 1 column N"; within a single line only the column
/// means anything, so the message is rebuilt around it.
pub fn parse_object(text: &str) -> Result<Map<String, Value>, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| {
        let full = e.to_string();
        let reason = full.split(" at line ").next().unwrap_or(&full);
        let hint = if ["NaN", "Infinity"].iter().any(|w| text.contains(w)) {
            " (JSON has no NaN or Infinity)"
        } else {
            ""
        };
        format!("malformed JSON at column {}: {reason}{hint}", e.column())
    })?;
    match value {
        Value::Object(map) => Ok(map),
        other => Err(format!("expected a JSON object, got {}", kind(&other))),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub fn required<'a>(obj: &'a Map<String, Value>, name: &str) -> Result<&'a Value, String> {
    obj.get(name).ok_or_else(|| format!("missing field \"{name}\""))
}

pub fn string<'a>(obj: &'a Map<String, Value>, name: &str) -> Result<&'a str, String> {
    match required(obj, name)? {
        Value::String(s) => Ok(s),
        other => Err(format!("\"{name}\" must be a string, got {}", kind(other))),
    }
}

/// A node named in JSON: an integer index or an external id string.
pub fn node_ref(v: &Value, what: &str) -> Result<NodeRef, String> {
    match v {
        Value::String(s) => Ok(NodeRef::External(s.clone())),
        Value::Number(n) => n
            .as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .map(NodeRef::Index)
            .ok_or_else(|| format!("{what} {n} is not a valid node index")),
        other => Err(format!(
            "{what} must be a node index or an external id string, got {}",
            kind(other)
        )),
    }
}

/// A JSON object whose values are all strings.
pub fn string_map(v: &Value, what: &str) -> Result<BTreeMap<String, String>, String> {
    let Value::Object(map) = v else {
        return Err(format!("{what} must be an object, got {}", kind(v)));
    };
    map.iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k.clone(), s.clone())),
            other => Err(format!("{what} field \"{k}\" must be a string, got {}", kind(other))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_numbered_and_checked() {
        let input: &[u8] = b"{}\n\n\xff\xfe\nlast";
        let mut r = LineReader::new(input);
        let mut got = Vec::new();
        while let Some(line) = r.next_line().expect("in-memory read") {
            got.push((line.number, line.text.is_ok()));
        }
        assert_eq!(got, vec![(1, true), (2, true), (3, false), (4, true)]);
    }

    #[test]
    fn json_errors_name_the_column() {
        let e = parse_object(r#"{"a": NaN}"#).unwrap_err();
        assert!(e.contains("column 7") && e.contains("NaN"), "{e}");
        assert!(parse_object("[1]").unwrap_err().contains("an array"));
    }
}

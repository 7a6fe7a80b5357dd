//! The stdio transport of `deltamem mcp`, with limits like the HTTP face's.
//!
//! rmcp reads JSON-RPC lines itself, but a line over its length limit,
//! nested deeper than serde_json's recursion limit, not UTF-8, not JSON,
//! or JSON but not a message it knows (a batch among them) it drops
//! without a word or answers with an error that has no id: the client
//! waits for an answer that never comes. So each line is checked here
//! first, read as rmcp reads it, and a refused one is answered with a
//! JSON-RPC error for every id found in it, as HTTP answers 413 or 400
//! (one with no id to find, a notification, only on stderr: an answer
//! nobody can match could start an error storm with a peer that echoes).
//! Blank lines are skipped. Lines that pass go to rmcp through an
//! in-process pipe. rmcp's answers come back through another pipe and are
//! copied to stdout a whole line at a time, so an error written here
//! never lands inside one of them.

use std::ops::ControlFlow;
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use serde_json::value::RawValue;

use super::http::walk_structure;
use super::vectors::skip_ws;

/// What a request line may be.
#[derive(Debug, Clone, Copy)]
pub(super) struct LineLimits {
    pub max_bytes: usize,
    pub max_depth: usize,
}

impl Default for LineLimits {
    fn default() -> LineLimits {
        LineLimits {
            // A `store_node` payload of 4 MiB may take six times that once
            // JSON-escaped (`\u0001`), and an embedding comes with it.
            max_bytes: 64 << 20,
            // The HTTP face's limit for a body, plus the two levels of the
            // envelope around tool arguments (`{"params": {"arguments": ..}}`).
            max_depth: super::http::Limits::default().json_depth + 2,
        }
    }
}

/// Bytes the in-process pipes buffer each way.
const PIPE_BYTES: usize = 1 << 20;

/// The line buffer's capacity kept between lines.
const KEPT_LINE_BYTES: usize = 1 << 20;

/// rmcp's ends of the two pipes, (read, write), and the task copying its
/// answers to stdout, which ends once rmcp closes its write end. The task
/// feeding it stdin's lines ends with stdin, or when `stop` resolves.
pub(super) fn guarded_stdio(
    limits: LineLimits,
    stop: impl Future<Output = ()> + Send + 'static,
) -> (DuplexStream, DuplexStream, JoinHandle<()>) {
    let (rmcp_read, to_rmcp) = tokio::io::duplex(PIPE_BYTES);
    let (from_rmcp, rmcp_write) = tokio::io::duplex(PIPE_BYTES);
    let stdout = Arc::new(Mutex::new(tokio::io::stdout()));
    let requests = pump_requests(tokio::io::stdin(), to_rmcp, stdout.clone(), limits, stop);
    tokio::spawn(async move {
        if let Err(e) = requests.await {
            eprintln!("deltamem mcp: reading requests: {e}");
        }
    });
    let answers = tokio::spawn(async move {
        if let Err(e) = copy_answers(from_rmcp, stdout).await {
            eprintln!("deltamem mcp: writing answers: {e}");
        }
    });
    (rmcp_read, rmcp_write, answers)
}

/// Reads request lines from `input` until it ends or `stop` resolves: a
/// line within `limits` goes to rmcp, any other is answered on `out` with
/// an error. Returning drops `to_rmcp`, which rmcp reads as the input's
/// end: it serves what it was given and closes. Once `stop` has resolved,
/// the whole lines already read into the buffer are still taken (they
/// were read), and nothing more is read; a line cut off by the stop is
/// dropped, never sent to rmcp in part.
async fn pump_requests<R, W, O>(
    input: R,
    mut to_rmcp: W,
    out: Arc<Mutex<O>>,
    limits: LineLimits,
    stop: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    O: AsyncWrite + Unpin,
{
    let mut input = BufReader::with_capacity(64 << 10, input);
    let mut line = Vec::new();
    let mut stop = std::pin::pin!(stop);
    let mut stopping = false;
    let mut initialized = false;
    loop {
        if line.capacity() > KEPT_LINE_BYTES {
            line = Vec::new(); // a 64 MiB line does not pin 64 MiB for good
        }
        line.clear();
        if stopping && !input.buffer().contains(&b'\n') {
            return Ok(());
        }
        // While stopping, a whole line is in the buffer: no read waits.
        let read = match stopping {
            true => read_line(&mut input, &mut line, limits.max_bytes).await?,
            false => tokio::select! {
                biased;
                read = read_line(&mut input, &mut line, limits.max_bytes) => read?,
                () = &mut stop => {
                    eprintln!("deltamem mcp: stopping: the requests read so far are served, no more are read");
                    stopping = true;
                    // A pending read had emptied the buffer: what it took
                    // of its line is not a whole request.
                    continue;
                }
            },
        };
        let Some(line_bytes) = read else {
            return Ok(());
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue; // nothing was asked: neither forwarded nor answered
        }
        let refused = match refusal(&line, line_bytes, limits) {
            None if !initialized => match before_initialize(&line, &mut initialized) {
                Early::Pass => None,
                Early::Drop => {
                    eprintln!("deltamem mcp: ignored a notification or response sent before `initialize`");
                    continue;
                }
                Early::Refuse(code, message) => Some((code, message)),
            },
            refused => refused,
        };
        match refused {
            None => {
                line.push(b'\n');
                to_rmcp.write_all(&line).await?;
                to_rmcp.flush().await?;
            }
            Some((code, message)) => {
                eprintln!("deltamem mcp: refused a request: {message}");
                let error = serde_json::json!({"code": code, "message": message});
                let mut out = out.lock().await;
                for id in refused_ids(&line) {
                    // The id as sent, byte for byte: a number read into f64
                    // and written again (1.5e3 as 1500.0) would not match.
                    let answer = format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"error\":{error}}}\n");
                    out.write_all(answer.as_bytes()).await?;
                }
                out.flush().await?;
            }
        }
    }
}

/// The `method` and `id` of a message (read once it has passed `refusal`).
#[derive(serde::Deserialize)]
struct Head<'a> {
    #[serde(borrow, default)]
    method: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
}

/// What becomes of a line sent before `initialize`.
enum Early {
    /// `initialize` itself, or `ping`: to rmcp.
    Pass,
    /// A notification or a response: rmcp ended the session (and the
    /// process) at either, and neither has an answer.
    Drop,
    /// Another request, answered here saying why (rmcp answered one with
    /// "request _meta is missing").
    Refuse(i32, String),
}

/// What becomes of a line sent before `initialize` (read once it has
/// passed `refusal`); `initialized` is set at `initialize`.
fn before_initialize(line: &[u8], initialized: &mut bool) -> Early {
    let Ok(head) = serde_json::from_slice::<Head<'_>>(line) else {
        return Early::Drop;
    };
    let Some(method) = head.method.as_deref().filter(|_| head.id.is_some()) else {
        return Early::Drop;
    };
    *initialized = method == "initialize";
    if *initialized || method == "ping" {
        return Early::Pass;
    }
    let message = format!(
        "`{method}` before `initialize`: the session is not initialized yet; send `initialize` (and then the \
         `notifications/initialized` notification) first"
    );
    Early::Refuse(INVALID_REQUEST, message)
}

/// JSON-RPC's code for a request that is not a valid request object.
const INVALID_REQUEST: i32 = -32600;
/// JSON-RPC's code for a request that is not JSON at all.
const PARSE_ERROR: i32 = -32700;
/// JSON-RPC's code for a known method given params it cannot take.
const INVALID_PARAMS: i32 = -32602;

/// Why a line of `line_bytes` bytes (of which `line` holds the first
/// `limits.max_bytes`) is refused, if it is, with the JSON-RPC error code.
/// A line that is not UTF-8 (a stray byte inside a string) is refused
/// here too: rmcp drops it without an answer.
pub(super) fn refusal(line: &[u8], line_bytes: usize, limits: LineLimits) -> Option<(i32, String)> {
    if line_bytes > limits.max_bytes {
        let message = format!(
            "the request line is {line_bytes} bytes, over the limit of {} bytes",
            limits.max_bytes
        );
        return Some((INVALID_REQUEST, message));
    }
    if let Err(e) = std::str::from_utf8(line) {
        let message = format!("the message is not UTF-8 (at byte {})", e.valid_up_to());
        return Some((PARSE_ERROR, message));
    }
    if let Some(at) = super::http::nesting_beyond(line, limits.max_depth) {
        let message = format!(
            "the request nests deeper than {} levels (at byte {at})",
            limits.max_depth
        );
        return Some((INVALID_REQUEST, message));
    }
    // rmcp reads a repeated key as its last value (`"tree":"task",
    // "tree":"env"` stored into env); the HTTP face refuses one.
    if let Some(detail) = repeated_key(line) {
        return Some((INVALID_REQUEST, format!("the message repeats a key: {detail}")));
    }
    // The message is read as rmcp reads it: rmcp drops a line it cannot
    // read without a word, or answers it with an error that has no id
    // (and over HTTP with a 415 in plain text), so the client's requests
    // would wait for answers that never come.
    let e = match serde_json::from_slice::<rmcp::model::ClientJsonRpcMessage>(line) {
        Ok(message) => return params_refusal(&message),
        Err(e) => e,
    };
    use serde_json::error::Category;
    if matches!(e.classify(), Category::Syntax | Category::Eof | Category::Io) {
        return Some((PARSE_ERROR, format!("the message is not JSON: {e}")));
    }
    if line.get(skip_ws(line, 0)) == Some(&b'[') {
        let message = "a JSON-RPC batch: MCP has had none since 2025-06-18; send each message on its own (a line each, or a POST each)";
        return Some((INVALID_REQUEST, message.to_string()));
    }
    Some((INVALID_REQUEST, format!("not a JSON-RPC 2.0 message of MCP: {e}")))
}

/// The first key that an object of `line`'s JSON values holds twice, with
/// where, if one does (a line that is not JSON is left to the parse that
/// follows, which names its error).
fn repeated_key(line: &[u8]) -> Option<String> {
    let repeated = std::cell::Cell::new(false);
    let mut values = serde_json::Deserializer::from_slice(line);
    // Bounded: each turn reads one whole value (at least a byte) or ends.
    for _ in 0..=line.len() {
        if values.end().is_ok() {
            return None;
        }
        match serde::de::DeserializeSeed::deserialize(UniqueKeys(&repeated), &mut values) {
            Ok(()) => {}
            Err(e) if repeated.get() => return Some(e.to_string()),
            Err(_) => return None,
        }
    }
    None
}

/// Walks one JSON value and fails at the first key an object repeats
/// (setting the flag, which tells that failure from any other).
#[derive(Clone, Copy)]
struct UniqueKeys<'a>(&'a std::cell::Cell<bool>);

impl<'de> serde::de::DeserializeSeed<'de> for UniqueKeys<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for UniqueKeys<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(self)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut keys = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            // Asked before it is kept: no copy of every key.
            if keys.contains(&key) {
                self.0.set(true);
                return Err(serde::de::Error::custom(format_args!(
                    "`{key}` appears twice in one object"
                )));
            }
            keys.insert(key);
            map.next_value_seed(self)?;
        }
        Ok(())
    }
}

/// A request for a method this server serves whose params rmcp cannot read
/// as that method's: rmcp then takes it for a method of its own name and
/// answers "method not found" (-32601) with only the name, which sends a
/// client looking for a typo instead of at its params.
fn params_refusal(message: &rmcp::model::ClientJsonRpcMessage) -> Option<(i32, String)> {
    use rmcp::model::{
        CallToolRequestMethod, CallToolRequestParams, ClientRequest, ConstString, InitializeRequestParams,
        InitializeResultMethod, JsonRpcMessage,
    };
    let JsonRpcMessage::Request(request) = message else {
        return None;
    };
    let ClientRequest::CustomRequest(custom) = &request.request else {
        return None;
    };
    let params = custom.params.clone().unwrap_or(serde_json::Value::Null);
    let method = custom.method.as_str();
    let error = if method == CallToolRequestMethod::VALUE {
        serde_json::from_value::<CallToolRequestParams>(params).err()
    } else if method == InitializeResultMethod::VALUE {
        serde_json::from_value::<InitializeRequestParams>(params).err()
    } else {
        return None;
    };
    let why = error.map_or_else(|| "they are not its own".to_string(), |e| e.to_string());
    Some((INVALID_PARAMS, format!("bad params for {method}: {why}")))
}

/// The ids to answer a refused line with: of each whole JSON value on it
/// (two messages may share a line), of each member of a batch (a member
/// without an id is a notification, not answered), and of a message cut
/// off at the end, if its id came before the cut.
pub(super) fn refused_ids(line: &[u8]) -> Vec<&str> {
    let mut ids = Vec::new();
    let mut values = serde_json::Deserializer::from_slice(line).into_iter::<&RawValue>();
    let mut rest_at = 0;
    while let Some(Ok(value)) = values.next() {
        ids.extend(ids_of_value(value.get()));
        rest_at = values.byte_offset();
    }
    let rest = &line[skip_ws(line, rest_at).min(line.len())..];
    match rest.first() {
        None => {}
        // A batch cut off: the ids of the members before the cut.
        Some(b'[') => ids.extend(members_before_cut(&rest[1..])),
        Some(_) => ids.extend(request_id(rest)),
    }
    ids
}

/// The ids of one whole JSON value: its own, or its members' if a batch.
fn ids_of_value(text: &str) -> Vec<&str> {
    if !text.starts_with('[') {
        return request_id(text.as_bytes()).into_iter().collect();
    }
    match serde_json::from_str::<Vec<&RawValue>>(text) {
        Ok(members) => members.iter().filter_map(|m| request_id(m.get().as_bytes())).collect(),
        Err(_) => Vec::new(),
    }
}

/// The ids of the whole members of a batch cut off (or broken) further
/// on, `inside` starting after its `[`, and of the member at the cut.
fn members_before_cut(inside: &[u8]) -> Vec<&str> {
    let mut ids = Vec::new();
    let mut at = 0;
    // Bounded: each turn moves past one member (at least a byte) or ends.
    for _ in 0..=inside.len() {
        at = skip_ws(inside, at).min(inside.len());
        let mut values = serde_json::Deserializer::from_slice(&inside[at..]).into_iter::<&RawValue>();
        let Some(Ok(member)) = values.next() else {
            ids.extend(request_id(&inside[at..]));
            break;
        };
        ids.extend(request_id(member.get().as_bytes()));
        at = skip_ws(inside, at + values.byte_offset());
        if inside.get(at) != Some(&b',') {
            break;
        }
        at += 1;
    }
    ids
}

/// Reads one line (without its newline) into `line`, keeping at most
/// `max_bytes` of it; its whole length, or None at the end of the input.
/// A last line without a newline is dropped, as rmcp drops it: the peer
/// stopped in the middle of a message.
async fn read_line<R: AsyncRead + Unpin>(
    input: &mut BufReader<R>,
    line: &mut Vec<u8>,
    max_bytes: usize,
) -> std::io::Result<Option<usize>> {
    let mut line_bytes = 0usize;
    loop {
        let buf = input.fill_buf().await?;
        if buf.is_empty() {
            return Ok(None);
        }
        let (piece, ended) = match buf.iter().position(|&b| b == b'\n') {
            Some(end) => (&buf[..end], true),
            None => (buf, false),
        };
        let room = (max_bytes + 1).saturating_sub(line.len());
        line.extend_from_slice(&piece[..piece.len().min(room)]);
        line_bytes += piece.len();
        let used = piece.len() + usize::from(ended);
        input.consume(used);
        if ended {
            return Ok(Some(line_bytes));
        }
    }
}

/// The `id` of a JSON-RPC request line as its JSON text, found without
/// parsing the whole line (it may be the refused one): the value of a
/// top-level `"id"` key, if it is a number or a string, and `null` if it
/// is another JSON value (no valid id). Of a line over the
/// length limit only the first `max_bytes` are searched: the MCP SDKs write
/// the id before the params.
fn request_id(line: &[u8]) -> Option<&str> {
    let mut key_start = None;
    let found = walk_structure(line, |state, at, b| {
        let (depth, was_in_string) = (state.depth, state.in_string);
        state.step(b, usize::MAX);
        match (was_in_string, state.in_string) {
            (false, true) if depth == 1 => key_start = Some(at + 1),
            (true, false) if depth == 1 => {
                let colon = skip_ws(line, at + 1);
                if key_start.is_some_and(|s| &line[s..at] == b"id") && line.get(colon) == Some(&b':') {
                    return ControlFlow::Break(skip_ws(line, colon + 1));
                }
            }
            _ => {}
        }
        ControlFlow::Continue(())
    });
    let value_at = found.break_value()?;
    let rest = &line[value_at..];
    // An id that is no id (null, a boolean, an object, an array): the
    // request is invalid and JSON-RPC answers it with a null id.
    if matches!(rest.first(), Some(b'n' | b't' | b'f' | b'{' | b'[')) {
        return Some("null");
    }
    if !matches!(rest.first(), Some(b'"' | b'-' | b'0'..=b'9')) {
        return None;
    }
    // One whole, valid JSON value (a string or a number) and where it ends.
    let mut values = serde_json::Deserializer::from_slice(rest).into_iter::<serde_json::Value>();
    match values.next()? {
        Ok(_) => std::str::from_utf8(&rest[..values.byte_offset()]).ok(),
        // A number no reader can hold (`1e400`) is no id either; a value
        // cut off by the line's end may be one.
        Err(e) if rest[0] != b'"' && e.classify() != serde_json::error::Category::Eof => Some("null"),
        Err(_) => None,
    }
}

/// Copies rmcp's answers to `out` a whole line at a time, until rmcp
/// closes its end.
async fn copy_answers<O: AsyncWrite + Unpin>(from_rmcp: DuplexStream, out: Arc<Mutex<O>>) -> std::io::Result<()> {
    let mut from_rmcp = BufReader::new(from_rmcp);
    let mut answer = Vec::new();
    loop {
        answer.clear();
        if from_rmcp.read_until(b'\n', &mut answer).await? == 0 {
            return Ok(());
        }
        let mut out = out.lock().await;
        out.write_all(&answer).await?;
        out.flush().await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `pump_requests` over `input`: (what reached rmcp, what was
    /// answered here).
    fn pump(input: &[u8], limits: LineLimits) -> (String, Vec<serde_json::Value>) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            let (mut rmcp_read, to_rmcp) = tokio::io::duplex(1 << 20);
            let out = Arc::new(Mutex::new(Vec::new()));
            pump_requests(input, to_rmcp, out.clone(), limits, std::future::pending())
                .await
                .unwrap();
            let mut forwarded = String::new();
            tokio::io::AsyncReadExt::read_to_string(&mut rmcp_read, &mut forwarded)
                .await
                .unwrap();
            let answered = String::from_utf8(out.lock().await.clone()).unwrap();
            let answers = answered.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
            (forwarded, answers)
        })
    }

    /// A key repeated in any object of a message (tool arguments, their
    /// payload, the envelope) is refused with the request's id, naming the
    /// key: rmcp took the last value, so a node went into the tree named
    /// second. Equal values in different objects, or a key repeated
    /// inside a string, pass.
    #[test]
    fn a_repeated_key_anywhere_is_refused_naming_it() {
        let call = |arguments: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"store_node","arguments":{arguments}}}}}"#
            )
        };
        let refused = [
            call(r#"{"tree":"task","tree":"env"}"#),
            call(r#"{"payload":{"a":"1","a":"2"}}"#),
            call(r#"{"k":1,"x":[{"k":1,"k":100}]}"#),
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/list","method":"tools/call"}"#.to_string(),
        ];
        for line in &refused {
            let input = format!("{}\n{line}\n", only_initialize());
            let (forwarded, answered) = pump(input.as_bytes(), LineLimits::default());
            assert_eq!(forwarded.lines().count(), 1, "{line}: {forwarded}");
            assert_eq!(answered.len(), 1, "{line}");
            assert_eq!(answered[0]["id"], 3);
            let message = answered[0]["error"]["message"].as_str().unwrap();
            assert!(message.contains("appears twice"), "{line}: {message}");
        }
        let passed = call(r#"{"tree":"task","payload":{"tree":"task","note":"\"tree\":1,\"tree\":2"}}"#);
        let input = format!("{}\n{passed}\n", only_initialize());
        let (forwarded, answered) = pump(input.as_bytes(), LineLimits::default());
        assert_eq!(forwarded.lines().count(), 2, "{forwarded}");
        assert!(answered.is_empty(), "{answered:?}");
    }

    /// An id that is a number out of every reader's range is answered with
    /// a null id (it was not answered at all, and the client waited).
    #[test]
    fn an_id_out_of_range_is_answered_with_a_null_id() {
        let input = format!(
            "{}\n{}\n",
            only_initialize(),
            r#"{"jsonrpc":"2.0","id":1e400,"method":"tools/list"}"#
        );
        let (forwarded, answered) = pump(input.as_bytes(), LineLimits::default());
        assert_eq!(forwarded.lines().count(), 1, "{forwarded}");
        assert_eq!(answered.len(), 1, "{answered:?}");
        assert!(answered[0]["id"].is_null() && answered[0]["error"]["code"] == PARSE_ERROR);
        assert_eq!(request_id(br#"{"id":-7.5e2,"x":1}"#), Some("-7.5e2"));
        assert_eq!(request_id(br#"{"id":12"#), Some("12"));
        assert_eq!(request_id(br#"{"id":"ab"#), None);
    }

    fn only_initialize() -> &'static str {
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#
    }

    /// `pump` of `input` after an `initialize` line, which is left out of
    /// what reached rmcp.
    fn pump_initialized(input: &[u8], limits: LineLimits) -> (String, Vec<serde_json::Value>) {
        let mut all = format!("{}\n", only_initialize()).into_bytes();
        all.extend_from_slice(input);
        let (forwarded, answers) = pump(&all, limits);
        let first = forwarded.find('\n').map_or(forwarded.len(), |at| at + 1);
        assert_eq!(&forwarded[..first], format!("{}\n", only_initialize()));
        (forwarded[first..].to_string(), answers)
    }

    /// Before `initialize`, a notification or a response is not passed on
    /// (rmcp ended the session, and the process, at one), nor is a request
    /// other than `ping` (it is answered here); after `initialize`
    /// everything is.
    #[test]
    fn only_requests_pass_before_initialize() {
        let lines = [
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":5,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":6,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":8,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{}}"#,
        ];
        let input = lines.iter().map(|l| format!("{l}\n")).collect::<String>();
        let (forwarded, answered) = pump(input.as_bytes(), LineLimits::default());
        let passed: Vec<&str> = forwarded.lines().collect();
        assert_eq!(passed, [lines[3], lines[4], lines[5], lines[6]]);
        // The request before `initialize` is answered here, saying why
        // (rmcp said "request _meta is missing"); a ping passes.
        assert_eq!(answered.len(), 1, "{answered:?}");
        assert_eq!(answered[0]["id"], 6);
        let message = answered[0]["error"]["message"].as_str().unwrap();
        assert!(message.contains("`tools/list` before `initialize`"), "{message}");
    }

    /// Stopped while whole lines wait in the buffer and the client keeps
    /// its end open: every whole line is forwarded (it was read), the cut
    /// one is not, and the pump returns without waiting for more input.
    #[test]
    fn a_stop_serves_the_whole_lines_already_read_and_no_more() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (mut client, server_end) = tokio::io::duplex(1 << 20);
            let good = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
            let lines: String = (0..50).map(|_| format!("{good}\n")).collect();
            client
                .write_all(format!("{lines}{{\"jsonrpc\":\"2.0\",\"id\":9").as_bytes())
                .await
                .unwrap();
            let (mut rmcp_read, to_rmcp) = tokio::io::duplex(1 << 20);
            let out = Arc::new(Mutex::new(Vec::new()));
            let limits = LineLimits::default();
            let pumped = pump_requests(server_end, to_rmcp, out.clone(), limits, std::future::ready(()));
            tokio::time::timeout(std::time::Duration::from_secs(10), pumped)
                .await
                .expect("the pump waited for more input after the stop")
                .unwrap();
            let mut forwarded = String::new();
            tokio::io::AsyncReadExt::read_to_string(&mut rmcp_read, &mut forwarded)
                .await
                .unwrap();
            assert_eq!(forwarded, lines);
            assert!(out.lock().await.is_empty());
            drop(client);
        });
    }

    const SMALL: LineLimits = LineLimits {
        max_bytes: 200,
        max_depth: 4,
    };

    #[test]
    fn lines_within_the_limits_reach_rmcp_and_others_are_answered_with_their_id() {
        let good = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"a":[1]}}}"#;
        let deep = r#"{"jsonrpc":"2.0","id":"q7","params":{"arguments":{"a":[[1]]}}}"#;
        let long = format!(r#"{{"jsonrpc":"2.0","id":3,"params":"{}"}}"#, "x".repeat(300));
        let notification = r#"{"jsonrpc":"2.0","method":"m","params":{"a":[[[[1]]]]}}"#;
        let input = format!("{good}\n{deep}\n{notification}\n{long}\n\n{good}\n{{\"id\": 9, \"cut\": ");
        let (forwarded, answers) = pump_initialized(input.as_bytes(), SMALL);
        assert_eq!(
            forwarded,
            format!("{good}\n{good}\n"),
            "the blank line is skipped, the last, cut-off line dropped"
        );
        assert_eq!(answers.len(), 2, "the notification is not answered: {answers:?}");
        assert_eq!(answers[0]["id"], "q7");
        assert_eq!(answers[0]["error"]["code"], -32600);
        let deep_message = answers[0]["error"]["message"].as_str().unwrap();
        assert!(deep_message.contains("deeper than 4 levels"), "{deep_message}");
        assert_eq!(answers[1]["id"], 3);
        let long_message = answers[1]["error"]["message"].as_str().unwrap();
        assert!(
            long_message.contains(&format!("{} bytes, over the limit of 200", long.len())),
            "{long_message}"
        );
    }

    #[test]
    fn a_line_that_is_not_utf8_is_answered_not_forwarded() {
        let good = r#"{"jsonrpc":"2.0","id":1,"method":"m"}"#;
        let mut input = br#"{"jsonrpc":"2.0","id":5,"method":"m","params":{"s":"a"#.to_vec();
        input.extend_from_slice(b"\xff\"}}\n");
        input.extend_from_slice(format!("{good}\n").as_bytes());
        let (forwarded, answers) = pump_initialized(&input, SMALL);
        assert_eq!(forwarded, format!("{good}\n"));
        assert_eq!(answers.len(), 1, "{answers:?}");
        assert_eq!(answers[0]["id"], 5);
        assert_eq!(answers[0]["error"]["code"], -32700);
        let message = answers[0]["error"]["message"].as_str().unwrap();
        assert!(message.contains("not UTF-8 (at byte 53)"), "{message}");
    }

    #[test]
    fn a_line_that_is_not_json_or_is_a_batch_is_answered_for_each_id() {
        let good = r#"{"jsonrpc":"2.0","id":1,"method":"m"}"#;
        let cut = r#"{"jsonrpc":"2.0","id":3,"method":"tools/list""#;
        let batch = r#" [{"jsonrpc":"2.0","id":"a","method":"m"},{"jsonrpc":"2.0","method":"n"},{"id":1.5e3}]"#;
        let notifications = r#"[{"jsonrpc":"2.0","method":"n"}]"#;
        let input = format!("{cut}\n{batch}\n{notifications}\ngarbage\n \t\n{good}\n");
        let (forwarded, answers) = pump_initialized(input.as_bytes(), SMALL);
        assert_eq!(forwarded, format!("{good}\n"));
        let ids: Vec<String> = answers.iter().map(|a| a["id"].to_string()).collect();
        assert_eq!(ids, ["3", "\"a\"", "1500.0"], "{answers:?}");
        assert_eq!(answers[0]["error"]["code"], -32700);
        let message = answers[0]["error"]["message"].as_str().unwrap();
        assert!(message.contains("not JSON: EOF while parsing"), "{message}");
        for batch_answer in &answers[1..] {
            assert_eq!(batch_answer["error"]["code"], -32600);
            let message = batch_answer["error"]["message"].as_str().unwrap();
            assert!(message.contains("JSON-RPC batch"), "{message}");
        }
    }

    /// Lines rmcp cannot read although they are JSON, or that hold more
    /// than one message, are answered for every id they carry: before,
    /// rmcp dropped them or answered without an id.
    #[test]
    fn every_id_of_a_line_rmcp_cannot_read_is_answered() {
        let limits = LineLimits {
            max_bytes: 4096,
            max_depth: 8,
        };
        let lines = [
            (
                r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"a\ud800"}}"#,
                -32700,
                vec!["7"],
            ),
            (r#"{"jsonrpc":"1.0","id":9,"method":"tools/list"}"#, -32600, vec!["9"]),
            (r#"{"jsonrpc":"2.0","id":5,"id":6,"method":"ping"}"#, -32600, vec!["5"]),
            (
                r#"{"jsonrpc":"2.0","id":12,"method":"ping"} {"jsonrpc":"2.0","id":13,"method":"ping"}"#,
                -32700,
                vec!["12", "13"],
            ),
            (
                r#"[{"jsonrpc":"2.0","id":4,"method":"ping"}, {"jsonrpc":"2.0","id":"c","met"#,
                -32700,
                vec!["4", "\"c\""],
            ),
            (
                r#"{"jsonrpc":"2.0","id":20,"method":"tools/call","params":{"name":5}}"#,
                -32602,
                vec!["20"],
            ),
            (r#"{"jsonrpc":"2.0","id":21,"method":"tools/call"}"#, -32602, vec!["21"]),
            (r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#, -32600, vec!["null"]),
            (
                r#"{"jsonrpc":"2.0","id":true,"method":"tools/list"}"#,
                -32600,
                vec!["null"],
            ),
            (
                r#"{"jsonrpc":"2.0","id":22,"method":"tools/call","params":{"name":"x","arguments":"y"}}"#,
                -32602,
                vec!["22"],
            ),
            (
                r#"{"jsonrpc":"2.0","id":23,"method":"initialize","params":{}}"#,
                -32602,
                vec!["23"],
            ),
        ];
        // Unknown methods and a well-formed call reach rmcp, which
        // answers "method not found" or "unknown tool" itself.
        let good = [
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"prompts/get","params":{"name":5}}"#,
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"x","arguments":{}}}"#,
        ]
        .map(|l| format!("{l}\n"))
        .concat();
        let input: String = lines.iter().map(|(l, _, _)| format!("{l}\n")).collect::<String>() + &good;
        let (forwarded, answers) = pump_initialized(input.as_bytes(), limits);
        assert_eq!(forwarded, good);
        let mut answers = answers.iter();
        for (line, code, ids) in lines {
            for id in ids {
                let answer = answers.next().unwrap_or_else(|| panic!("no answer for {id} of {line}"));
                assert_eq!(answer["id"].to_string(), id, "{line}");
                assert_eq!(answer["error"]["code"], code, "{line}: {answer}");
            }
        }
        assert!(answers.next().is_none());
    }

    #[test]
    fn the_id_is_the_top_level_one_as_sent() {
        let id = |line: &str| request_id(line.as_bytes()).map(str::to_string);
        let some = |text: &str| Some(text.to_string());
        assert_eq!(id(r#"{"params":{"id":5},"id" : 6}"#), some("6"));
        assert_eq!(id(r#"{"x":"\"id\":4","id":"s\"q"}"#), some(r#""s\"q""#));
        for number in ["123456789012345678901234567890", "1.5e3", "-0"] {
            assert_eq!(
                id(&format!(r#"{{"id":{number},"method":"m"}}"#)),
                some(number),
                "byte for byte"
            );
        }
        assert_eq!(id(r#"{"ids":1,"method":"m"}"#), None);
        for no_id in [
            r#"{"id":{"a":1}}"#,
            r#"{"id":null}"#,
            r#"{"id": true,"method":"m"}"#,
            r#"{"id":[1]}"#,
        ] {
            assert_eq!(id(no_id), some("null"), "{no_id}: answered with a null id");
        }
        assert_eq!(id(r#"{"id":7"#), some("7"), "a cut-off line still names its id");
        assert_eq!(id(r#"{"id":"unterminated"#), None);
        assert_eq!(id("not json"), None);
    }
}

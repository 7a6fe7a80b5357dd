//! The HTTP face: router, authentication, limits and JSON bodies.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRequest, MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use subtle::ConstantTimeEq;

use std::ops::ControlFlow;

use super::core::Core;
use super::error::{ApiError, ApiResult};
use super::vectors::{WithEmbedding, parse_with_embedding};
use crate::api::ObjectOnly;

/// Limits on what one request may ask; each breach is a clear 4xx.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request body (413 beyond).
    pub body_bytes: usize,
    /// Most nodes in one batch insert, embeddings in one batch query, ids
    /// in one retrieval count (400 beyond).
    pub batch_items: usize,
    /// Deepest JSON nesting of a body (400 beyond).
    pub json_depth: usize,
    /// Longest time to receive a body or answer a read (408 / 503).
    pub request_ms: u64,
    /// Most nodes in one page of a listing, and the largest `k`.
    pub page_items: usize,
    /// Most matches one batch query may ask for (embeddings times `k`):
    /// each is ~90 bytes of JSON, and the answer is built whole before it
    /// is sent, so 1,024 queries at k = 1,000 would be a ~90 MB answer
    /// from a 30 KB request.
    pub batch_matches: usize,
    /// Most dumps sent at once; more are answered 503. A dump whose client
    /// reads slowly holds about a chunk (~1 MiB) of the server's memory
    /// until it ends or stalls past the time limit: 530 such clients took
    /// 2.6 GB.
    pub dumps: usize,
    /// Most MiB of large answers (1 MiB or more: a batch query's, a list
    /// of summaries) held at once while clients read them; one more is
    /// answered 503. Such an answer is built whole and held until it is
    /// read or the time limit cuts the connection: 24 clients that sent a
    /// 13 MB batch query and read nothing took the server to 495 MiB.
    pub answer_mib: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            body_bytes: 16 * 1024 * 1024,
            batch_items: 1024,
            json_depth: 32,
            request_ms: 30_000,
            page_items: 1000,
            batch_matches: 100_000,
            dumps: 64,
            answer_mib: 256,
        }
    }
}

#[derive(Clone)]
pub struct AppState {
    pub core: Arc<Core>,
    pub limits: Arc<Limits>,
    /// Bearer token every request must carry (None: no authentication).
    pub token: Option<Arc<String>>,
    /// Cancelled at shutdown: ends endless responses (event streams) so
    /// the graceful shutdown does not wait for them forever.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// On loopback TCP, the host names a request may be addressed to
    /// (`Host`, and `Origin` when sent); None elsewhere (a Unix socket,
    /// which no browser reaches, or a public address, which needs a token).
    pub local_names: Option<Arc<[String]>>,
    /// Dumps being sent (`Limits::dumps`).
    pub dumps: Arc<tokio::sync::Semaphore>,
    /// MiB of large answers being sent (`Limits::answer_mib`).
    pub answers: Arc<tokio::sync::Semaphore>,
}

impl AppState {
    /// Runs read-only work on the blocking pool, bounded by the request
    /// time limit (the work finishes anyway; reads change nothing).
    pub async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Arc<Core>) -> ApiResult<T> + Send + 'static,
    ) -> ApiResult<T> {
        self.blocking_until(move |core, _deadline| work(core)).await
    }

    /// `blocking` for work that can stop by itself: it is given the
    /// instant its answer is due, and should give up (`time_limit`)
    /// rather than go on after its request was answered 503.
    pub async fn blocking_until<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Arc<Core>, Instant) -> ApiResult<T> + Send + 'static,
    ) -> ApiResult<T> {
        let core = self.core.clone();
        let deadline = Instant::now() + Duration::from_millis(self.limits.request_ms);
        let task = tokio::task::spawn_blocking(move || work(&core, deadline));
        match tokio::time::timeout_at(deadline.into(), task).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the request handler panicked",
            )),
            Err(_) => Err(time_limit(self.limits.request_ms)),
        }
    }
}

pub(super) fn time_limit(request_ms: u64) -> ApiError {
    ApiError::unavailable(format!("the request took longer than the {request_ms} ms limit"))
}

/// The whole router: the JSON API, the MCP endpoint and the explorer.
pub fn router(state: AppState, mcp: Router<AppState>) -> Router {
    let body_limit = state.limits.body_bytes;
    let mcp = mcp.layer(middleware::from_fn_with_state(state.clone(), mcp_message));
    super::routes::api()
        .merge(mcp)
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// Authentication, the body's framing and metrics around every request
/// (the MCP endpoint's bodies, read by rmcp, included).
async fn guard(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    // A matched path is an Arc'd str: cloned, not copied, per request.
    let matched = request.extensions().get::<MatchedPath>().cloned();
    let unmatched = unmatched_route(request.uri().path());
    let counted = answer_counted(request.method(), matched.as_ref());
    let response = match authorised(&state, &request) {
        true => match check_host(&request)
            .and_then(|()| {
                foreign_address(&state, request.uri(), request.headers())
                    .map_or(Ok(()), |refused| Err(ApiError::new(StatusCode::FORBIDDEN, refused)))
            })
            .and_then(|()| check_framing(request.headers(), &state.limits))
        {
            Ok(()) => {
                let response = next.run(request).await;
                match counted {
                    true => held_while_sent(&state, response),
                    false => response,
                }
            }
            Err(e) => e.into_response(),
        },
        false => {
            let mut r = ApiError::new(StatusCode::UNAUTHORIZED, "missing or wrong bearer token").into_response();
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
            r
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    let route = matched.as_ref().map_or(unmatched, MatchedPath::as_str);
    state.core.metrics().request(route, response.status().as_u16(), seconds);
    response
}

/// The POST routes that only read: their large answers count against
/// `Limits::answer_mib` as GETs' do. A write's answer never does: the
/// write is made by then, and a 503 in place of its acknowledgement
/// would have the client write it again.
const READING_POSTS: [&str; 3] = [
    "/v1/trees/{tree}/query",
    "/v1/trees/{tree}/query_batch",
    "/v1/summaries",
];

fn answer_counted(method: &axum::http::Method, matched: Option<&MatchedPath>) -> bool {
    *method == axum::http::Method::GET
        || (*method == axum::http::Method::POST && matched.is_some_and(|m| READING_POSTS.contains(&m.as_str())))
}

/// Answers from this size on count against `Limits::answer_mib`.
const LARGE_ANSWER_BYTES: u64 = 1 << 20;

/// A large answer of known size takes its MiB from `AppState::answers`
/// until its body is dropped (sent, or the connection cut), or is replaced
/// by a 503 when they are taken. Streams (dumps, events) have no known
/// size and limits of their own.
fn held_while_sent(state: &AppState, response: Response) -> Response {
    use axum::body::HttpBody;
    let Some(size_bytes) = response.body().size_hint().exact().filter(|&n| n >= LARGE_ANSWER_BYTES) else {
        return response;
    };
    let mib = u32::try_from(size_bytes.div_ceil(1 << 20)).unwrap_or(u32::MAX);
    let Ok(permit) = state.answers.clone().try_acquire_many_owned(mib) else {
        return ApiError::unavailable(format!(
            "an answer of {mib} MiB, and {} MiB of answers are being sent already; try again when they are read",
            state.limits.answer_mib
        ))
        .into_response();
    };
    let (mut parts, body) = response.into_parts();
    // The stream below has no size of its own: the length stays declared.
    parts.headers.insert(header::CONTENT_LENGTH, size_bytes.into());
    Response::from_parts(
        parts,
        axum::body::Body::from_stream(holding(body.into_data_stream(), permit)),
    )
}

/// `stream`, keeping `permit` until the stream is dropped: its body was
/// sent, or the connection was cut.
pub(super) fn holding<S: futures_util::Stream>(
    stream: S,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> impl futures_util::Stream<Item = S::Item> {
    futures_util::StreamExt::map(stream, move |chunk| {
        let _held = &permit;
        chunk
    })
}

/// A POST to `/mcp` is read here (within the body's size and time
/// limits) and checked as `deltamem mcp` checks a line: rmcp would answer
/// a body that is not JSON, or is a batch, with a 415 and plain text (and
/// read one of any size). Such a body gets a 400 whose body is a JSON-RPC
/// error, with the request's id when one can be found, null otherwise.
async fn mcp_message(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if request.method() != axum::http::Method::POST {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes = match read_body(Request::from_parts(parts.clone(), body), &state).await {
        Ok(bytes) => bytes,
        Err(e) => return e.into_response(),
    };
    let limits = super::stdio::LineLimits {
        max_bytes: state.limits.body_bytes,
        max_depth: state.limits.json_depth + 2,
    };
    let Some((code, message)) = super::stdio::refusal(&bytes, bytes.len(), limits) else {
        return next
            .run(Request::from_parts(parts, axum::body::Body::from(bytes)))
            .await;
    };
    // The id as sent (`1.5e3` stays so); a batch's members may each have
    // one, and the single answer names none.
    let id = match super::stdio::refused_ids(&bytes).as_slice() {
        [one] if !bytes.trim_ascii_start().starts_with(b"[") => one.to_string(),
        _ => "null".to_string(),
    };
    let error = serde_json::json!({"code": code, "message": message});
    let answer = format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"error\":{error}}}");
    let json = [(header::CONTENT_TYPE, "application/json")];
    (StatusCode::BAD_REQUEST, json, answer).into_response()
}

/// A path no route serves: a JSON 404 like every other error.
async fn no_route(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("no route {method} {}", uri.path()))
}

/// A route asked with a method it does not take (axum adds `Allow`).
async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} does not take {method}", uri.path()),
    )
}

/// Route label of a request no route matched (bounded set of labels).
fn unmatched_route(path: &str) -> &'static str {
    match path.starts_with("/mcp") {
        true => "/mcp",
        false => "unmatched",
    }
}

fn authorised(state: &AppState, request: &Request) -> bool {
    let Some(token) = &state.token else { return true };
    let Some(given) = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        // The scheme's name is case-insensitive (RFC 9110 §11.1).
        .and_then(|(scheme, given)| scheme.eq_ignore_ascii_case("bearer").then_some(given))
    else {
        return false;
    };
    given.as_bytes().ct_eq(token.as_bytes()).into()
}

/// The host names a server listening on `bound` answers to: loopback
/// names and the address itself.
pub fn local_names(bound: &super::ListenAddr) -> Vec<String> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
    if let super::ListenAddr::Tcp(addr) = bound {
        names.push(addr.ip().to_string());
    }
    names
}

/// An HTTP/1.1 request must carry a `Host` (RFC 9112 §3.2: a server
/// answers one without it 400), unless its target is in absolute form;
/// HTTP/1.0 had none.
fn check_host(request: &Request) -> Result<(), ApiError> {
    let lacks_host = request.version() == axum::http::Version::HTTP_11
        && request.uri().authority().is_none()
        && !request.headers().contains_key(header::HOST);
    match lacks_host {
        true => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "an HTTP/1.1 request must carry a Host header",
        )),
        false => Ok(()),
    }
}

/// Why a request to a loopback server is refused as addressed from
/// elsewhere, if it is: a `Host` that is not a local name (a page that
/// rebound its own DNS name to 127.0.0.1), or an `Origin` that is not (a
/// page on another site: a form or a `text/plain` POST needs no CORS
/// preflight, so without this any page the user opens could write to the
/// bank). Without a `Host` (HTTP/1.0) only `Origin` is looked at.
fn foreign_address(state: &AppState, uri: &axum::http::Uri, headers: &axum::http::HeaderMap) -> Option<String> {
    let names = state.local_names.as_ref()?;
    let local =
        |authority: &str| authority_host(authority).is_some_and(|h| names.iter().any(|n| n.eq_ignore_ascii_case(h)));
    for name in [header::HOST, header::ORIGIN] {
        if headers.get_all(&name).iter().count() > 1 {
            return Some(format!("{name} is given more than once"));
        }
    }
    // An absolute-form target (`GET http://host/path`) names the host
    // the request is for, over any `Host` (RFC 9112 §3.2.2).
    if let Some(authority) = uri.authority().filter(|a| !local(a.as_str())) {
        return Some(format!(
            "the request is addressed to {:?}, not a name of this loopback server (DNS-rebinding guard)",
            authority.as_str()
        ));
    }
    if let Some(host) = headers.get(header::HOST) {
        let text = host.to_str().unwrap_or("");
        if !local(text) {
            return Some(format!(
                "Host {:?} is not a name of this loopback server (DNS-rebinding guard)",
                String::from_utf8_lossy(host.as_bytes())
            ));
        }
    }
    let origin = headers.get(header::ORIGIN)?;
    let text = origin.to_str().unwrap_or("");
    let authority = text.split_once("://").and_then(|(scheme, authority)| {
        (scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")).then_some(authority)
    });
    match authority.is_some_and(local) {
        true => None,
        false => Some(format!(
            "Origin {:?} is another site: a loopback server answers only its own pages",
            String::from_utf8_lossy(origin.as_bytes())
        )),
    }
}

/// The host of an authority (`host`, `host:port`, `[v6]`, `[v6]:port`),
/// or None when it is not one: anything after an IPv6 literal's `]` but a
/// port, or a port that is not a number (`[::1]evil.example` and
/// `localhost:evil` were taken for local names).
fn authority_host(authority: &str) -> Option<&str> {
    let (host, rest) = match authority.strip_prefix('[') {
        Some(bracketed) => bracketed.split_once(']')?,
        None => authority
            .split_once(':')
            .map_or((authority, ""), |(host, _)| (host, &authority[host.len()..])),
    };
    let port_ok = match rest.strip_prefix(':') {
        None => rest.is_empty(),
        Some(port) => (1..=5).contains(&port.len()) && port.bytes().all(|b| b.is_ascii_digit()),
    };
    port_ok.then_some(host)
}

/// Whether an address is loopback (serving elsewhere needs a token).
pub fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

/// A JSON body: read within the time limit, nesting checked, then
/// deserialised with the path of the offending field in the error.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, ApiError> {
        let bytes = read_body(request, state).await?;
        parse_json(&bytes, state.limits.json_depth).map(JsonBody)
    }
}

/// A JSON body with a top-level `embedding`, checked and answered as a
/// `JsonBody`, parsed by the faster path of `vectors`.
pub struct VectorBody<T>(pub T);

impl<T: DeserializeOwned + WithEmbedding> FromRequest<AppState> for VectorBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, ApiError> {
        let bytes = read_body(request, state).await?;
        parse_with_embedding(&bytes, state.limits.json_depth).map(VectorBody)
    }
}

/// A request's body, read within the time and size limits.
async fn read_body(request: Request, state: &AppState) -> Result<axum::body::Bytes, ApiError> {
    // `guard` has checked the codings and the declared length.
    let limits = &state.limits;
    let read = axum::body::Bytes::from_request(request, state);
    match tokio::time::timeout(Duration::from_millis(limits.request_ms), read).await {
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("the body did not arrive within {} ms", limits.request_ms),
        )),
        Ok(Err(rejection)) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body larger than {} bytes", limits.body_bytes),
        )),
        Ok(Err(rejection)) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("cannot read the request body: {rejection}"),
        )),
        Ok(Ok(bytes)) => Ok(bytes),
    }
}

/// Refuses a body that arrives compressed: it would reach the JSON parser
/// as bytes it cannot read, or be misread. Every `Content-Encoding`
/// header counts (a second one may name gzip), and every transfer coding
/// but `chunked` (hyper undoes only that one). A declared length over the
/// limit is refused too, before any of the body is read (and before hyper
/// answers an `Expect: 100-continue`), not after the limit's worth has
/// arrived.
fn check_framing(headers: &axum::http::HeaderMap, limits: &Limits) -> Result<(), ApiError> {
    let codings = |name| {
        headers
            .get_all(name)
            .iter()
            .flat_map(|v| {
                String::from_utf8_lossy(v.as_bytes())
                    .split(',')
                    .map(|c| c.trim().to_ascii_lowercase())
                    .collect::<Vec<_>>()
            })
            .filter(|c| !c.is_empty() && c != "identity")
    };
    if let Some(coding) = codings(axum::http::header::CONTENT_ENCODING).next() {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("Content-Encoding {coding:?} is not supported: send the body uncompressed"),
        ));
    }
    if let Some(coding) = codings(axum::http::header::TRANSFER_ENCODING).find(|c| c != "chunked") {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("Transfer-Encoding {coding:?} is not supported: send the body uncompressed"),
        ));
    }
    let declared = headers.get(axum::http::header::CONTENT_LENGTH);
    if let Some(length) = declared
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        && length > limits.body_bytes as u64
    {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body of {length} bytes larger than {} bytes", limits.body_bytes),
        ));
    }
    Ok(())
}

/// Parses a JSON body, naming the field that is wrong.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8], max_depth: usize) -> ApiResult<T> {
    if let Some(depth) = nesting_beyond(bytes, max_depth) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("JSON nested deeper than {max_depth} levels (at byte {depth})"),
        ));
    }
    // The untracked parse is the common case (tracking the path costs a
    // wrapper around every value: ~a third of parsing an embedding); only
    // a body it refuses is parsed again to name the field.
    // A body is an object (`ObjectOnly`), never a positional array.
    if let Ok(ObjectOnly(value)) = serde_json::from_slice(bytes) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let ObjectOnly(value) = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        body_error(bytes, &path, &e.into_inner())
    })?;
    de.end().map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("trailing data after the JSON body: {e}"),
        )
    })?;
    Ok(value)
}

/// The error for a body serde_json refused, `path` the key path where it
/// stopped. Broken JSON is placed by line and column (a body may span
/// lines) and blames only the part of the path the parser knew: a `?`
/// segment stands for a key it had not read yet.
fn body_error(body: &[u8], path: &str, inner: &serde_json::Error) -> ApiError {
    let reason = crate::api::json_reason(inner);
    if inner.is_syntax() || inner.is_eof() {
        let known = path.split('.').take_while(|s| !s.is_empty() && !s.starts_with('?'));
        let known = known.collect::<Vec<_>>().join(".");
        let place = format!("line {} column {}", inner.line(), inner.column());
        let hint = crate::api::nan_hint(body);
        return match known.as_str() {
            "" => ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("malformed JSON body at {place}: {reason}{hint}"),
            ),
            _ => ApiError::bad_field(
                &known,
                format!("malformed JSON in {known:?} at {place}: {reason}{hint}"),
            ),
        };
    }
    // serde_path_to_error's path ends at an unknown field, but stops at the
    // object for a missing or duplicated one.
    let named = field_in_reason(&reason).map(|name| match path {
        "." | "" => name.to_string(),
        _ if path == name || path.ends_with(&format!(".{name}")) => path.to_string(),
        _ => format!("{path}.{name}"),
    });
    match (path, named) {
        (_, Some(field)) => ApiError::bad_field(&field, format!("bad JSON body: {reason}")),
        ("." | "", None) => ApiError::new(StatusCode::BAD_REQUEST, format!("bad JSON body: {reason}")),
        (_, None) => ApiError::bad_field(path, format!("field {path:?}: {reason}")),
    }
}

/// The field serde's message is about, where the message is about a field
/// rather than a value (serde_path_to_error's path stops at the object):
/// "missing field `x`", "duplicate field `x`", "unknown field `x`, ...".
pub(super) fn field_in_reason(reason: &str) -> Option<&str> {
    for lead in ["missing field `", "duplicate field `", "unknown field `"] {
        if let Some(rest) = reason.split_once(lead).map(|(_, rest)| rest) {
            return rest.split_once('`').map(|(name, _)| name).filter(|n| !n.is_empty());
        }
    }
    None
}

/// `field_in_reason` for a query string's error, which also names the
/// field of a bad value first ("limit: invalid digit found in string").
pub(super) fn field_in_query_reason(reason: &str) -> Option<&str> {
    field_in_reason(reason).or_else(|| {
        let (first, _) = reason.split_once(": ")?;
        let is_name = !first.is_empty() && first.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        is_name.then_some(first)
    })
}

/// Bytes scanned at a time by `nesting_beyond`: a block holding none of
/// the bytes that can change the nesting or the string state is skipped
/// whole (an embedding's digits are most of a body).
pub(super) const NESTING_BLOCK_BYTES: usize = 64;

/// The byte offset where nesting first exceeds `max_depth`, if it does.
/// Brackets inside strings do not count.
pub(super) fn nesting_beyond(bytes: &[u8], max_depth: usize) -> Option<usize> {
    let walked = walk_structure(bytes, |state, at, b| match state.step(b, max_depth) {
        true => ControlFlow::Break(at),
        false => ControlFlow::Continue(()),
    });
    walked.break_value()
}

/// Feeds every byte of `bytes` that can matter to the nesting state, with
/// its offset, to `visit`, which steps the state itself and may stop the
/// walk. Blocks holding nothing structural are skipped whole, unless a
/// backslash before them escapes their first byte.
pub(super) fn walk_structure<B>(
    bytes: &[u8],
    mut visit: impl FnMut(&mut Nesting, usize, u8) -> ControlFlow<B>,
) -> ControlFlow<B> {
    let mut state = Nesting::default();
    for (block, chunk) in bytes.chunks(NESTING_BLOCK_BYTES).enumerate() {
        if !state.escaped && !structural_block(chunk) {
            continue;
        }
        for (i, &b) in chunk.iter().enumerate() {
            visit(&mut state, block * NESTING_BLOCK_BYTES + i, b)?;
        }
    }
    ControlFlow::Continue(())
}

/// Whether a block holds a byte that can change the nesting or the string
/// state. A fold over the whole block, not `any`, so that it vectorises;
/// most blocks of a body are numbers and commas.
fn structural_block(chunk: &[u8]) -> bool {
    chunk.iter().fold(false, |seen, &b| seen | is_structural(b))
}

/// Whether a byte can change the nesting or the string state: `"`, `\`
/// and the brackets. `[ \ ]` are 0x5B..=0x5D and `{ | }` 0x7B..=0x7D, so
/// one OR and one range test find all but `"` (and `|`, which then does
/// nothing).
fn is_structural(b: u8) -> bool {
    (b == b'"') | ((b | 0x20).wrapping_sub(0x7B) < 3)
}

/// The nesting scan's state between bytes.
#[derive(Default)]
pub(super) struct Nesting {
    pub depth: usize,
    pub in_string: bool,
    pub escaped: bool,
}

impl Nesting {
    /// Takes one byte; true when it opens a level beyond `max_depth`.
    pub fn step(&mut self, b: u8, max_depth: usize) -> bool {
        if self.in_string {
            match (self.escaped, b) {
                (true, _) => self.escaped = false,
                (false, b'\\') => self.escaped = true,
                (false, b'"') => self.in_string = false,
                _ => {}
            }
            return false;
        }
        match b {
            b'"' => self.in_string = true,
            b'[' | b'{' => {
                self.depth += 1;
                return self.depth > max_depth;
            }
            b']' | b'}' => self.depth = self.depth.saturating_sub(1),
            _ => {}
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_counts_brackets_outside_strings_only() {
        assert_eq!(nesting_beyond(br#"{"a":[[1]]}"#, 3), None);
        assert_eq!(nesting_beyond(br#"{"a":[[[1]]]}"#, 3), Some(7));
        assert_eq!(nesting_beyond(br#"{"a":"[[[[[\"[[["}"#, 1), None);
    }

    /// The byte-at-a-time scan the block skipping must agree with.
    fn nesting_bytewise(bytes: &[u8], max_depth: usize) -> Option<usize> {
        let mut state = Nesting::default();
        bytes.iter().position(|&b| state.step(b, max_depth))
    }

    /// A backslash ending one block escapes the first byte of the next,
    /// even when that block holds nothing structural: the quote after it
    /// then closes the string and the brackets count.
    #[test]
    fn an_escape_carries_across_a_block() {
        let mut body = vec![b'"'];
        body.resize(NESTING_BLOCK_BYTES - 1, b'a');
        body.push(b'\\');
        body.push(b'n');
        body.resize(2 * NESTING_BLOCK_BYTES, b'1');
        body.extend_from_slice(b"\"[[[");
        assert_eq!(nesting_beyond(&body, 2), Some(2 * NESTING_BLOCK_BYTES + 3));
        assert_eq!(nesting_beyond(&body, 2), nesting_bytewise(&body, 2));
    }

    proptest::proptest! {
        /// Skipping blocks finds what the byte-wise scan finds, on bodies
        /// dense in quotes, backslashes and brackets across block edges.
        #[test]
        fn block_skipping_agrees_with_the_bytewise_scan(
            body in proptest::collection::vec(
                proptest::sample::select(b"[]{}\"\\a1,|".to_vec()), 0..400),
            sparse in proptest::bool::ANY,
            max_depth in 0usize..6,
        ) {
            // Sparse bodies: long runs of digits between the structure.
            let body: Vec<u8> = match sparse {
                true => body.iter().flat_map(|&b| [b].into_iter().chain([b'7'; 40])).collect(),
                false => body,
            };
            proptest::prop_assert_eq!(nesting_beyond(&body, max_depth), nesting_bytewise(&body, max_depth));
        }
    }

    /// Broken JSON is placed by line and column; the field is named only
    /// as far as the parser knew it (never serde_path_to_error's `?`).
    #[test]
    fn broken_json_is_placed_not_blamed_on_a_question_mark() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct T {
            a: String,
            payload: crate::api::Fields,
        }
        let e = parse_json::<T>(b"{\"a\":\"x\" \"payload\":{}}", 8).unwrap_err();
        assert_eq!(e.field, None, "{}", e.message);
        assert!(e.message.contains("line 1 column 10"), "{}", e.message);
        let e = parse_json::<T>(b"{\"a\":\"x\",\n\"payload\":{\"k\":\"v\",}}", 8).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("payload"), "{}", e.message);
        assert!(e.message.contains("line 2 column"), "{}", e.message);
        for body in [&b"{\"a\":\"x\""[..], b"", b" "] {
            let e = parse_json::<T>(body, 8).unwrap_err();
            assert_eq!(e.field, None, "{}", e.message);
            assert!(e.message.contains("EOF"), "{}", e.message);
        }
    }

    #[test]
    fn a_bad_field_is_named() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct T {
            embedding: Vec<f32>,
        }
        let e = parse_json::<T>(br#"{"embedding":[1,"x"]}"#, 8).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("embedding[1]"), "{}", e.message);
        let e = parse_json::<T>(br#"{}"#, 8).unwrap_err();
        assert!(e.message.contains("missing field `embedding`"), "{}", e.message);
        assert_eq!(e.field.as_deref(), Some("embedding"), "a missing field is named too");
        let e = parse_json::<T>(br#"{"embedding":[1],"embedding":[2]}"#, 8).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("embedding"), "{}", e.message);
        let reason = "render: provided string was not `true`";
        assert_eq!(field_in_query_reason(reason), Some("render"));
        assert_eq!(
            field_in_reason(reason),
            None,
            "only a query string leads with its field"
        );
        assert_eq!(field_in_query_reason("expected a value at line 1: x"), None);
    }
}

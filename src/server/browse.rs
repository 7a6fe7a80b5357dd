//! Listing and browsing routes (the explorer's), the change stream and
//! the embedded explorer page.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt};
use include_dir::{Dir, include_dir};
use serde::Deserialize;

use super::body::{DueOut, NodeList, NodePage, NodeReply, NodeSummary};
use super::error::{ApiError, ApiResult};
use super::http::AppState;
use super::routes::{node_ref, query_params, resolve, tree_name};
use crate::bank::{Bank, NodeRef};

use axum::Json;

/// The explorer page, embedded at build time.
static EXPLORER: Dir<'_> = include_dir!("$CARGO_MANIFEST_DIR/src/server/explorer");

/// Rows a dump reads per chunk of the stream, at most: the bank is
/// read-locked once per chunk.
const DUMP_CHUNK_NODES: u32 = 512;

/// A chunk ends once it holds this many bytes (and one node more, at
/// most): 512 nodes of 4 MiB payloads made chunks of 2 GB, and a client
/// that did not read held three of them.
const DUMP_CHUNK_BYTES: usize = 1 << 20;
/// Default number of search hits.
const SEARCH_DEFAULT_LIMIT: usize = 20;

fn bank_error(field: &'static str) -> impl Fn(crate::BankError) -> ApiError {
    move |e| ApiError::from_bank(e, field)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageParams {
    #[serde(default)]
    offset: u32,
    #[serde(default)]
    limit: Option<u32>,
}

pub async fn tree_nodes(
    State(state): State<AppState>,
    tree: Result<Path<String>, PathRejection>,
    params: Result<Query<PageParams>, QueryRejection>,
) -> ApiResult<Json<NodePage>> {
    let tree = tree_name(tree)?;
    let params = query_params(params)?;
    // The page size the OpenAPI document states (1..=page_items): an
    // empty page asked for is a mistake, not a query.
    let limit = params.limit.map_or(100, |l| l as usize);
    let limit = within("limit", limit, 1, state.limits.page_items)? as u32;
    state
        .blocking(move |core| {
            let (page, total) = tree_page(core, &tree, params.offset, limit)?;
            let bank = core.read()?;
            let nodes = page
                .into_iter()
                .map(|i| NodeSummary::new(&bank, i))
                .collect::<Result<_, _>>()
                .map_err(bank_error("tree"))?;
            Ok(Json(NodePage { total, nodes }))
        })
        .await
}

/// The indexes of the tree's nodes from position `offset` (at most
/// `limit`), and how many nodes the tree holds.
pub fn tree_page(core: &super::core::Core, tree: &str, offset: u32, limit: u32) -> ApiResult<(Vec<u32>, u32)> {
    let bank = core.read()?;
    let wanted = bank.tree_index(tree).map_err(bank_error("tree"))?;
    let index = core.tree_index(&bank, "tree")?;
    let all = index.tree(wanted);
    let start = (offset as usize).min(all.len());
    let end = start.saturating_add(limit as usize).min(all.len());
    Ok((all[start..end].to_vec(), all.len() as u32))
}

/// Rows a pass over a tree reads under one hold of the shared lock: a
/// write waits for one slice (about 2 ms), not the whole pass.
const HOLD_ROWS: usize = 1 << 14;

/// Calls `visit` with each of `ids` and its row, read a slice per hold of
/// the shared lock; a 503 once past `deadline` (`request_ms` names it).
pub fn visit_rows(
    core: &super::core::Core,
    ids: &[u32],
    (deadline, request_ms): (std::time::Instant, u64),
    mut visit: impl FnMut(u32, &crate::format::row::Row),
) -> ApiResult<()> {
    for slice in ids.chunks(HOLD_ROWS) {
        if std::time::Instant::now() > deadline {
            return Err(super::http::time_limit(request_ms));
        }
        let bank = core.read_hold()?;
        for &id in slice {
            visit(id, &bank.row(id).map_err(bank_error("tree"))?);
        }
    }
    Ok(())
}

/// `value` of query parameter `field` if within `low..=high`, else a 400.
pub fn within(field: &'static str, value: usize, low: usize, high: usize) -> ApiResult<usize> {
    match (low..=high).contains(&value) {
        true => Ok(value),
        false => Err(ApiError::bad_field(
            field,
            format!("{field} must be in {low}..={high}, got {value}"),
        )),
    }
}

/// The tree's nodes as JSON Lines, streamed a chunk at a time: each chunk
/// is read (under the shared lock, on the blocking pool) only when the
/// connection has taken the one before, so a client that reads slowly
/// holds one chunk and no thread (a stalled dump used to park a blocking
/// thread and hold three chunks). At most `Limits::dumps` are sent at once.
/// The first chunk is read before the answer starts, so damage found
/// there is an error answer naming the file and offset; after it, an
/// error can only cut the stream, and is logged.
pub async fn dump(State(state): State<AppState>, tree: Result<Path<String>, PathRejection>) -> ApiResult<Response> {
    let tree = tree_name(tree)?;
    let (wanted, count) = {
        let bank = state.core.read()?;
        (bank.tree_index(&tree).map_err(bank_error("tree"))?, bank.node_count())
    };
    let Ok(permit) = state.dumps.clone().try_acquire_owned() else {
        return Err(ApiError::unavailable(format!(
            "{} dumps are being sent already (--max-dumps); try again when one ends",
            state.limits.dumps.max(1)
        )));
    };
    let core = state.core.clone();
    let (first, next) = dump_chunk_of(core.clone(), wanted, 0, count).await?;
    let rest = futures_util::stream::unfold(Some(next).filter(|&s| s < count), move |next| {
        let (core, tree) = (core.clone(), tree.clone());
        async move {
            let start = next?;
            Some(match dump_chunk_of(core, wanted, start, count).await {
                Ok((bytes, next)) => (Ok(bytes), Some(next).filter(|&s| s < count)),
                // The error ends the body, so the client sees a cut stream.
                Err(e) => {
                    eprintln!(
                        "deltamem serve: the dump of tree {tree:?} was cut at node {start}: {}",
                        e.message
                    );
                    (Err(std::io::Error::other(e.message)), None)
                }
            })
        }
    });
    let stream = super::http::holding(futures_util::stream::once(async { Ok(first) }).chain(rest), permit);
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response())
}

/// One chunk of a dump from row `start`, read on the blocking pool: its
/// bytes and the next row to read.
async fn dump_chunk_of(
    core: std::sync::Arc<super::core::Core>,
    wanted: u16,
    start: u32,
    count: u32,
) -> ApiResult<(Vec<u8>, u32)> {
    let read = tokio::task::spawn_blocking(move || {
        let bank = core.read_hold()?;
        dump_chunk(&bank, wanted, start..(start + DUMP_CHUNK_NODES).min(count)).map_err(bank_error("tree"))
    });
    read.await.unwrap_or_else(|_| {
        Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the dump's reader panicked",
        ))
    })
}

/// The lines of the tree's nodes in `range`, ending early once
/// `DUMP_CHUNK_BYTES` are held; returns them and the next row to read.
fn dump_chunk(bank: &Bank, tree: u16, range: std::ops::Range<u32>) -> Result<(Vec<u8>, u32), crate::BankError> {
    // Room for the chunk and the node that ends it, so the buffer is not
    // grown (doubled) to 2 MiB by the last push.
    let mut out = Vec::with_capacity(DUMP_CHUNK_BYTES + (64 << 10));
    for index in range.clone() {
        if bank.row(index)?.tree == tree {
            let line = NodeReply::read(bank, index, false)?;
            serde_json::to_writer(&mut out, &line).expect("a node serialises");
            out.push(b'\n');
            if out.len() >= DUMP_CHUNK_BYTES {
                return Ok((out, index + 1));
            }
        }
    }
    Ok((out, range.end))
}

/// Indexes of a node's children, ascending.
pub fn children_of(core: &super::core::Core, bank: &Bank, index: u32) -> ApiResult<Vec<u32>> {
    Ok(core.tree_index(bank, "id")?.children(index))
}

pub async fn children(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<super::body::ChildrenOut>> {
    let node = node_ref(id)?;
    state
        .blocking(move |core| {
            let bank = core.read()?;
            let index = resolve(&bank, &node)?;
            let children = children_of(core, &bank, index)?
                .into_iter()
                .map(|i| NodeSummary::new(&bank, i))
                .collect::<Result<_, _>>()
                .map_err(bank_error("id"))?;
            Ok(Json(super::body::ChildrenOut { children }))
        })
        .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchParams {
    #[serde(default)]
    tree: Option<String>,
    q: String,
    #[serde(default)]
    limit: Option<usize>,
}

/// Finds nodes by index, external id, or text in the scenario or payload.
pub async fn search(
    State(state): State<AppState>,
    params: Result<Query<SearchParams>, QueryRejection>,
) -> ApiResult<Json<NodeList>> {
    let params = query_params(params)?;
    let limit = within(
        "limit",
        params.limit.unwrap_or(SEARCH_DEFAULT_LIMIT),
        1,
        state.limits.page_items,
    )?;
    let request_ms = state.limits.request_ms;
    state
        .blocking_until(move |core, deadline| {
            let (tree, mut found) = {
                let bank = core.read()?;
                let tree = params
                    .tree
                    .as_deref()
                    .map(|t| bank.tree_index(t))
                    .transpose()
                    .map_err(bank_error("tree"))?;
                let exact = exact_match(&bank, &params.q);
                (
                    tree,
                    exact
                        .into_iter()
                        .filter(|&i| in_tree(&bank, tree, i))
                        .collect::<Vec<u32>>(),
                )
            };
            let needle = params.q.to_lowercase();
            let mut next = 0u32;
            while found.len() < limit && !needle.is_empty() {
                // A chunk at a time: a write waits for one chunk, not the
                // whole scan, and a search past its time limit stops (it
                // was answered 503 and went on holding the bank).
                if std::time::Instant::now() > deadline {
                    return Err(super::http::time_limit(request_ms));
                }
                let bank = core.read_hold()?;
                let end = next.saturating_add(SEARCH_CHUNK_ROWS).min(bank.node_count());
                if next >= end {
                    break;
                }
                for index in next..end {
                    if found.len() >= limit || !in_tree(&bank, tree, index) || found.contains(&index) {
                        continue;
                    }
                    let payload = bank.payload(index).map_err(bank_error("q"))?;
                    if payload.scenario.to_lowercase().contains(&needle)
                        || payload.fields.values().any(|v| v.to_lowercase().contains(&needle))
                    {
                        found.push(index);
                    }
                }
                next = end;
            }
            found.truncate(limit);
            let bank = core.read()?;
            let nodes = found
                .into_iter()
                .map(|i| NodeSummary::new(&bank, i))
                .collect::<Result<_, _>>()
                .map_err(bank_error("q"))?;
            Ok(Json(NodeList { nodes }))
        })
        .await
}

/// Rows a search reads under one hold of the bank's shared lock.
const SEARCH_CHUNK_ROWS: u32 = 1024;

fn in_tree(bank: &Bank, tree: Option<u16>, index: u32) -> bool {
    tree.is_none_or(|t| bank.row(index).is_ok_and(|r| r.tree == t))
}

/// The node `q` names as an index or an external id, if any.
fn exact_match(bank: &Bank, q: &str) -> Vec<u32> {
    let by_index = q.parse::<u32>().ok().map(NodeRef::Index);
    let by_id = (!q.is_empty()).then(|| NodeRef::External(q.to_string()));
    by_index
        .into_iter()
        .chain(by_id)
        .filter_map(|r| bank.resolve(&r).ok())
        .collect()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DueParams {
    #[serde(default)]
    tree: Option<String>,
}

pub async fn due(
    State(state): State<AppState>,
    params: Result<Query<DueParams>, QueryRejection>,
) -> ApiResult<Json<DueOut>> {
    let params = query_params(params)?;
    state
        .blocking(move |core| {
            let bank = core.read()?;
            let due = bank
                .due_for_consolidation(params.tree.as_deref())
                .map_err(bank_error("tree"))?;
            let due = due
                .into_iter()
                .map(|i| NodeSummary::new(&bank, i))
                .collect::<Result<_, _>>()
                .map_err(bank_error("tree"))?;
            Ok(Json(DueOut { due }))
        })
        .await
}

/// Server-sent events: `change` after each commit round.
pub async fn events(State(state): State<AppState>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let rx = state.core.changes();
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.changed().await.ok()?;
        let change = *rx.borrow_and_update();
        let data = serde_json::json!({"node_count": change.node_count, "last_lsn": change.last_lsn});
        Some((Ok(Event::default().event("change").data(data.to_string())), rx))
    })
    .take_until(state.shutdown.cancelled_owned());
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

pub async fn explorer_index() -> Response {
    asset("index.html")
}

pub async fn explorer_asset(file: Result<Path<String>, PathRejection>) -> Response {
    match file {
        Ok(Path(name)) => asset(&name),
        Err(_) => not_found(),
    }
}

/// An embedded file; names come from the embedded set only, never the disk.
fn asset(name: &str) -> Response {
    let Some(file) = EXPLORER.get_file(name) else {
        return not_found();
    };
    let kind = match name.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("json") => "application/json",
        Some("png") => "image/png",
        _ => "application/octet-stream",
    };
    ([(header::CONTENT_TYPE, kind)], file.contents()).into_response()
}

fn not_found() -> Response {
    ApiError::new(StatusCode::NOT_FOUND, "no such file in the explorer").into_response()
}

//! The JSON API of docs/SERVER.md: one handler per route, each a thin
//! call into the bank through `Core`.

use std::time::Instant;

use axum::Router;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;

use super::body::*;
use super::core::Core;
use super::core::{WriteDone, WriteOp};
use super::error::{ApiError, ApiResult};
use super::http::{AppState, JsonBody, VectorBody, time_limit};
use crate::bank::{Bank, NodeRef, Stats};

use axum::Json;

pub fn api() -> Router<AppState> {
    let router = Router::new();
    #[cfg(feature = "agent")]
    let router = router
        .route("/v1/retrieve", post(super::agent::retrieve))
        .route("/v1/record", post(super::agent::record));
    router
        .route("/healthz", get(|| async { Json(HealthOut { ok: true }) }))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .route("/v1/bank", get(bank_info))
        .route("/v1/stats", get(stats))
        .route("/v1/verify", get(verify))
        .route("/v1/trees/{tree}/query", post(query))
        .route("/v1/trees/{tree}/query_batch", post(query_batch))
        .route("/v1/trees/{tree}/nodes", get(super::browse::tree_nodes))
        .route("/v1/trees/{tree}/history", get(super::history::history))
        .route("/v1/trees/{tree}/outline", get(super::outline::outline))
        .route("/v1/summaries", post(super::outline::summaries))
        .route("/v1/trees/{tree}/dump", get(super::browse::dump))
        .route("/v1/nodes", post(insert))
        .route("/v1/nodes/batch", post(insert_batch))
        .route("/v1/nodes/{id}", get(node))
        .route("/v1/nodes/{id}/chain", get(chain))
        .route("/v1/nodes/{id}/children", get(super::browse::children))
        .route("/v1/nodes/{id}/hit", post(hit))
        .route("/v1/nodes/{id}/consolidate", post(consolidate))
        .route("/v1/retrievals", post(retrievals))
        .route("/v1/search", get(super::browse::search))
        .route("/v1/due", get(super::browse::due))
        .route("/v1/events", get(super::browse::events))
        .route("/", get(super::browse::explorer_index))
        .route("/assets/{*file}", get(super::browse::explorer_asset))
}

/// A node named in a URL path: digits are an index, anything else an
/// external id (ids made only of digits are refused when written).
pub fn node_ref(path: Result<Path<String>, PathRejection>) -> ApiResult<NodeRef> {
    let Path(text) = path.map_err(|e| ApiError::bad_field("id", e.body_text()))?;
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse()
            .map(NodeRef::Index)
            // Digits past u32 name no node: the same 404 as any unknown one
            // (a number shown as a number, unless it is too long to echo).
            .map_err(move |_| {
                let shown = if text.len() <= 20 {
                    text
                } else {
                    crate::bank::shown_id(&text)
                };
                ApiError::from_bank(crate::bank::BankError::UnknownNode(shown), "id")
            });
    }
    Ok(NodeRef::External(text))
}

pub fn tree_name(path: Result<Path<String>, PathRejection>) -> ApiResult<String> {
    path.map(|Path(t)| t)
        .map_err(|e| ApiError::bad_field("tree", e.body_text()))
}

pub fn query_params<T>(q: Result<Query<T>, QueryRejection>) -> ApiResult<T> {
    q.map(|Query(v)| v).map_err(|e| {
        let text = e.body_text();
        // axum puts its own lead before serde's message.
        let reason = text.split_once("query string: ").map_or(text.as_str(), |(_, r)| r);
        let message = format!("bad query string: {reason}");
        match super::http::field_in_query_reason(reason) {
            Some(field) => ApiError::bad_field(field, message),
            None => ApiError::new(StatusCode::BAD_REQUEST, message),
        }
    })
}

pub fn resolve(bank: &Bank, node: &NodeRef) -> ApiResult<u32> {
    bank.resolve(node).map_err(|e| ApiError::from_bank(e, "id"))
}

async fn metrics(State(state): State<AppState>) -> ApiResult<Response> {
    let text = state
        .blocking_until(|core, deadline| {
            // Half the time limit, so a bank too large to count in time
            // still gets its metrics, without the bank's stats.
            let counting = Instant::now() + deadline.saturating_duration_since(Instant::now()) / 2;
            let stats = stats_in_holds(core, counting, |_, stats| stats).ok().flatten();
            Ok(core.metrics().render(stats.as_ref()))
        })
        .await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

async fn bank_info(State(state): State<AppState>) -> ApiResult<Json<BankInfo>> {
    let (read_only, max_batch) = (state.core.read_only(), state.limits.batch_items);
    state
        .blocking(move |core| Ok(Json(BankInfo::new(&*core.read()?, read_only, max_batch))))
        .await
}

/// The OpenAPI document, bounded by this bank's dimension and trees and
/// this server's batch limit (`openapi::Bounds`).
async fn openapi(State(state): State<AppState>) -> ApiResult<Json<serde_json::Value>> {
    let (batch_items, k_max, page_items) = (
        state.limits.batch_items,
        state.limits.page_items,
        state.limits.page_items,
    );
    let token_required = state.token.is_some();
    state
        .blocking(move |core| {
            let bounds = super::openapi::Bounds {
                dim: core.dim_count(),
                trees: core.read()?.tree_names(),
                batch_items,
                k_max,
                page_items,
                token_required,
            };
            Ok(Json(super::openapi::document(&bounds)))
        })
        .await
}

async fn stats(State(state): State<AppState>) -> ApiResult<Json<StatsReply>> {
    let request_ms = state.limits.request_ms;
    state
        .blocking_until(move |core, deadline| {
            let reply = stats_in_holds(core, deadline, |bank, stats| {
                StatsReply::new(stats, bank.manifest(), None)
            })?;
            reply.map(Json).ok_or_else(|| time_limit(request_ms))
        })
        .await
}

/// Rows `stats_in_holds` counts per hold of the lock: about 2.5 ms.
const STATS_HOLD_ROWS: u32 = 1 << 14;

/// The bank's stats, its rows counted a slice per hold of the shared lock
/// (200k rows held writes back 30 ms per ask; `/metrics` asks at every
/// scrape), handed to `finish` under the last hold; None past `deadline`.
fn stats_in_holds<T>(core: &Core, deadline: Instant, finish: impl FnOnce(&Bank, Stats) -> T) -> ApiResult<Option<T>> {
    let bank_error = |e| ApiError::from_bank(e, "bank");
    let (mut tally, first_count) = {
        let bank = core.read()?;
        (bank.start_stats(), bank.node_count())
    };
    let mut counted = 0u32;
    loop {
        if Instant::now() > deadline {
            return Ok(None);
        }
        let bank = core.read_hold()?;
        // The rows added since the count began are counted in one last
        // hold: a stream of batch inserts could otherwise stay ahead.
        let rows = if counted >= first_count {
            u32::MAX
        } else {
            STATS_HOLD_ROWS
        };
        counted = counted.saturating_add(rows);
        if bank.count_rows(&mut tally, rows).map_err(bank_error)? {
            let stats = bank.finish_stats(tally).map_err(bank_error)?;
            return Ok(Some(finish(&bank, stats)));
        }
    }
}

async fn verify(State(state): State<AppState>) -> ApiResult<Json<VerifyReply>> {
    let request_ms = state.limits.request_ms;
    state
        .blocking_until(move |core, deadline| {
            let report = core.verify_until(deadline)?.ok_or_else(|| time_limit(request_ms))?;
            // A problem of the whole bank names no server path.
            Ok(Json(VerifyReply::new(report, "")))
        })
        .await
}

/// Refuses an embedding the scan would refuse, before it joins a batch.
pub fn check_embedding(embedding: &[f32], dim: u32, field: &str) -> ApiResult<()> {
    if embedding.len() != dim as usize {
        return Err(ApiError::bad_field(
            field,
            format!("{field} has {} dimensions, the bank stores {dim}", embedding.len()),
        ));
    }
    // One pass that vectorises (a `position` stops early and does not);
    // the offending index is looked for only when there is one.
    let (finite, nonzero) = embedding
        .iter()
        .fold((true, false), |(f, nz), x| (f & x.is_finite(), nz | (*x != 0.0)));
    if !finite {
        let i = embedding.iter().position(|x| !x.is_finite()).unwrap_or(0);
        return Err(ApiError::bad_field(field, format!("{field}[{i}] is not a finite f32")));
    }
    if !nonzero {
        return Err(ApiError::bad_field(
            field,
            format!("{field} is all zeros: cannot normalise"),
        ));
    }
    Ok(())
}

/// Bounds the matches one query may ask for (each carries its chain).
fn check_k(k: usize, limits: &super::http::Limits) -> ApiResult<()> {
    match k <= limits.page_items {
        true => Ok(()),
        false => Err(ApiError::bad_field(
            "k",
            format!("k must be at most {}", limits.page_items),
        )),
    }
}

async fn query(
    State(state): State<AppState>,
    tree: Result<Path<String>, PathRejection>,
    VectorBody(request): VectorBody<TreeQuery>,
) -> ApiResult<Json<QueryReply>> {
    let tree = tree_name(tree)?;
    let options = request
        .options(QUERY_DEFAULTS)
        .map_err(|e| ApiError::from_bank(e, "k"))?;
    check_k(options.k, &state.limits)?;
    let dim = state.core.dim_count();
    check_embedding(&request.embedding, dim, "embedding")?;
    let answer = state.core.query(&tree, request.embedding, options);
    let limit = std::time::Duration::from_millis(state.limits.request_ms);
    match tokio::time::timeout(limit, answer).await {
        Ok(result) => result.map(Json),
        Err(_) => Err(ApiError::unavailable(
            "the query took longer than the request time limit",
        )),
    }
}

async fn query_batch(
    State(state): State<AppState>,
    tree: Result<Path<String>, PathRejection>,
    JsonBody(request): JsonBody<QueryBatchRequest>,
) -> ApiResult<Json<QueryBatchAnswer>> {
    let tree = tree_name(tree)?;
    let (embeddings, options) = request.into_parts().map_err(|e| ApiError::from_bank(e, "k"))?;
    check_k(options.k, &state.limits)?;
    if embeddings.len() > state.limits.batch_items {
        return Err(ApiError::bad_field(
            "embeddings",
            format!(
                "{} embeddings, the limit is {}",
                embeddings.len(),
                state.limits.batch_items
            ),
        ));
    }
    let asked = embeddings.len().saturating_mul(options.k);
    if asked > state.limits.batch_matches {
        return Err(ApiError::bad_field(
            "k",
            format!(
                "{} embeddings at k = {} ask for {asked} matches, the limit is {} per batch",
                embeddings.len(),
                options.k,
                state.limits.batch_matches
            ),
        ));
    }
    let dim = state.core.dim_count();
    for (i, e) in embeddings.iter().enumerate() {
        check_embedding(e, dim, &format!("embeddings[{i}]"))?;
    }
    let request_ms = state.limits.request_ms;
    state
        .blocking_until(move |core, deadline| {
            let answers = core.query_batch_until(&tree, &embeddings, &options, deadline, request_ms)?;
            Ok(Json(QueryBatchAnswer { answers }))
        })
        .await
}

/// `?embedding=true` adds the stored vector (the explorer's "neighbours
/// of a node").
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeParams {
    #[serde(default)]
    embedding: bool,
}

async fn node(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    params: Result<Query<NodeParams>, QueryRejection>,
) -> ApiResult<Json<NodeDetail>> {
    let node = node_ref(id)?;
    let with_embedding = query_params(params)?.embedding;
    state
        .blocking(move |core| {
            let bank = core.read()?;
            let index = resolve(&bank, &node)?;
            let detail = NodeReply::read(&bank, index, with_embedding).map_err(|e| ApiError::from_bank(e, "id"))?;
            let children = super::browse::children_of(core, &bank, index)?;
            Ok(Json(NodeDetail { node: detail, children }))
        })
        .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChainParams {
    #[serde(default)]
    render: bool,
}

async fn chain(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    params: Result<Query<ChainParams>, QueryRejection>,
) -> ApiResult<Json<ChainOut>> {
    let node = node_ref(id)?;
    let render = query_params(params)?.render;
    state
        .blocking(move |core| chain_of(&*core.read()?, &node, render).map(Json))
        .await
}

/// A node's chain, as nodes or rendered (shared with the MCP tool).
pub fn chain_of(bank: &Bank, node: &NodeRef, render: bool) -> ApiResult<ChainOut> {
    let index = resolve(bank, node)?;
    if render {
        let ids = bank.chain(index).map_err(|e| ApiError::from_bank(e, "id"))?;
        let text = bank.render_chain(index).map_err(|e| ApiError::from_bank(e, "id"))?;
        return Ok(ChainOut::Rendered { chain: ids, text });
    }
    let chain = ChainReply::read(bank, index).map_err(|e| ApiError::from_bank(e, "id"))?;
    Ok(ChainOut::Nodes(chain))
}

fn check_node(state: &AppState, n: &InsertRequest, field: &str) -> ApiResult<u32> {
    let dim = state.core.dim_count();
    check_embedding(&n.embedding, dim, &format!("{field}embedding"))?;
    Ok(dim)
}

async fn insert(
    State(state): State<AppState>,
    VectorBody(request): VectorBody<InsertRequest>,
) -> ApiResult<Json<InsertReply>> {
    check_node(&state, &request, "")?;
    match state.core.write(WriteOp::Insert(request.into())).await? {
        WriteDone::Inserted(mut acks) if acks.len() == 1 => Ok(Json(acks.remove(0))),
        _ => Err(unexpected()),
    }
}

async fn insert_batch(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<InsertBatchRequest>,
) -> ApiResult<Json<AcksOut>> {
    if request.nodes.len() > state.limits.batch_items {
        return Err(ApiError::bad_field(
            "nodes",
            format!(
                "{} nodes, the limit is {}",
                request.nodes.len(),
                state.limits.batch_items
            ),
        ));
    }
    for (i, n) in request.nodes.iter().enumerate() {
        check_node(&state, n, &format!("nodes[{i}]."))?;
    }
    let nodes = request.nodes.into_iter().map(Into::into).collect();
    match state.core.write(WriteOp::Batch(nodes)).await? {
        WriteDone::Inserted(acks) => Ok(Json(AcksOut { acks })),
        _ => Err(unexpected()),
    }
}

async fn hit(State(state): State<AppState>, id: Result<Path<String>, PathRejection>) -> ApiResult<Json<HitReply>> {
    match state.core.write(WriteOp::Hit(node_ref(id)?)).await? {
        WriteDone::Hit(h) => Ok(Json(h)),
        _ => Err(unexpected()),
    }
}

async fn retrievals(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<RetrievalsRequest>,
) -> ApiResult<Json<RetrievalsOut>> {
    if request.ids.len() > state.limits.batch_items {
        return Err(ApiError::bad_field(
            "ids",
            format!("{} ids, the limit is {}", request.ids.len(), state.limits.batch_items),
        ));
    }
    let ids = request.ids.into_iter().map(NodeRef::from).collect();
    match state.core.write(WriteOp::Retrievals(ids)).await? {
        WriteDone::Retrievals(nodes) => Ok(Json(RetrievalsOut { ok: true, nodes })),
        _ => Err(unexpected()),
    }
}

async fn consolidate(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    JsonBody(request): JsonBody<ConsolidateRequest>,
) -> ApiResult<Json<ConsolidateReply>> {
    let node = node_ref(id)?;
    match state.core.write(WriteOp::Consolidate(node, request.payload.0)).await? {
        WriteDone::Consolidated(c) => Ok(Json(c)),
        _ => Err(unexpected()),
    }
}

pub(super) fn unexpected() -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the writer answered a different kind of write",
    )
}

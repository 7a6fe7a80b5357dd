//! A tree's shape without its payloads, and summaries of chosen nodes:
//! what the explorer's tree view needs to draw a 1M-node tree. It used to
//! fetch every node's summary (a payload read and a title for each):
//! 1,000 pages and about 0.45 GB of JavaScript heap at 1M nodes, again at
//! every change of the bank.

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use serde::Deserialize;

use super::body::{NodeList, NodeSummary, OutlineOut, SummariesRequest};
use super::browse::{tree_page, visit_rows, within};
use super::error::{ApiError, ApiResult};
use super::http::{AppState, JsonBody};
use super::routes::{query_params, tree_name};
use crate::bank::NodeRef;
use crate::format::row::{Label, NodeType, Row};

/// Most nodes an outline page holds (about 25 bytes of JSON each).
pub const OUTLINE_PAGE_MAX: u32 = 100_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutlineParams {
    #[serde(default)]
    offset: u32,
    #[serde(default)]
    limit: Option<u32>,
}

pub async fn outline(
    State(state): State<AppState>,
    tree: Result<Path<String>, PathRejection>,
    params: Result<Query<OutlineParams>, QueryRejection>,
) -> ApiResult<Json<OutlineOut>> {
    let tree = tree_name(tree)?;
    let params = query_params(params)?;
    let limit = params.limit.unwrap_or(OUTLINE_PAGE_MAX) as usize;
    let limit = within("limit", limit, 1, OUTLINE_PAGE_MAX as usize)? as u32;
    let request_ms = state.limits.request_ms;
    state
        .blocking_until(move |core, deadline| {
            let (page, total) = tree_page(core, &tree, params.offset, limit)?;
            let mut out = OutlineOut {
                total,
                offset: params.offset.min(total),
                ids: Vec::with_capacity(page.len()),
                parents: Vec::with_capacity(page.len()),
                depths: Vec::with_capacity(page.len()),
                success_hits: Vec::with_capacity(page.len()),
                kinds: Vec::with_capacity(page.len()),
            };
            visit_rows(core, &page, (deadline, request_ms), |id, row| {
                push_row(&mut out, id, row)
            })?;
            Ok(Json(out))
        })
        .await
}

fn push_row(out: &mut OutlineOut, id: u32, row: &Row) {
    let kind = u8::from(row.node_type == NodeType::Residual)
        | u8::from(row.label == Label::Failure) << 1
        | u8::from(row.is_consolidated()) << 2
        | u8::from(row.is_consolidated_root()) << 3;
    out.ids.push(id);
    out.parents.push(row.parent());
    out.depths.push(row.depth);
    out.success_hits.push(row.success_hits);
    out.kinds.push(kind);
}

/// Summaries of the nodes named, in the order named (at most the batch
/// limit); an unknown node is a 404 naming it.
pub async fn summaries(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<SummariesRequest>,
) -> ApiResult<Json<NodeList>> {
    if request.ids.len() > state.limits.batch_items {
        let message = format!("{} ids, the limit is {}", request.ids.len(), state.limits.batch_items);
        return Err(ApiError::bad_field("ids", message));
    }
    state
        .blocking(move |core| {
            let bank = core.read()?;
            let nodes = request
                .ids
                .into_iter()
                .map(|id| {
                    let named = |e| ApiError::from_bank(e, "ids");
                    let index = bank.resolve(&NodeRef::from(id)).map_err(named)?;
                    NodeSummary::new(&bank, index).map_err(named)
                })
                .collect::<ApiResult<_>>()?;
            Ok(Json(NodeList { nodes }))
        })
        .await
}

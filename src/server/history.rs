//! `GET /v1/trees/{tree}/history`: a tree's growth curve, its
//! consolidations and its most-hit nodes, aggregated from the node table
//! in one pass. The explorer's history view drew these from every node
//! summary of the tree: at 1M nodes that was 1,000 pages, 6-12 s and
//! 0.4-0.9 GB of JavaScript heap; this answer is a few hundred samples.

use std::cmp::Reverse;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use serde::Deserialize;

use super::body::{GrowthPoint, HistoryMark, HistoryOut, NodeSummary};
use super::browse::{tree_page, visit_rows, within};
use super::error::{ApiError, ApiResult};
use super::http::AppState;
use super::routes::{query_params, tree_name};
use crate::format::row::Row;

/// Samples of the growth curve (and consolidation marks) unless asked.
const POINTS_DEFAULT: usize = 500;
/// Most-hit nodes listed unless asked.
const TOP_DEFAULT: usize = 40;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryParams {
    #[serde(default)]
    points: Option<usize>,
    #[serde(default)]
    top: Option<usize>,
}

pub async fn history(
    State(state): State<AppState>,
    tree: Result<Path<String>, PathRejection>,
    params: Result<Query<HistoryParams>, QueryRejection>,
) -> ApiResult<Json<HistoryOut>> {
    let tree = tree_name(tree)?;
    let params = query_params(params)?;
    let max = state.limits.page_items;
    let points = within("points", params.points.unwrap_or(POINTS_DEFAULT.min(max)), 1, max)?;
    let top = within("top", params.top.unwrap_or(TOP_DEFAULT.min(max)), 0, max)?;
    let request_ms = state.limits.request_ms;
    let bank_error = |e| ApiError::from_bank(e, "tree");
    state
        .blocking_until(move |core, deadline| {
            let (ids, _) = tree_page(core, &tree, 0, u32::MAX)?;
            let mut tally = Tally::default();
            visit_rows(core, &ids, (deadline, request_ms), |id, row| tally.add(id, row))?;
            let undated = tally.undated;
            let (growth, consolidations, marks, top_ids) = tally.finish(points, top);
            let bank = core.read()?;
            let mut top_hits: Vec<NodeSummary> = top_ids
                .into_iter()
                .map(|id| NodeSummary::new(&bank, id))
                .collect::<Result<_, _>>()
                .map_err(bank_error)?;
            // Hits counted since the pass are in the summaries: ordered by
            // what they show.
            top_hits.sort_by_key(|n| (Reverse(n.success_hits), n.id));
            Ok(Json(HistoryOut {
                nodes: ids.len() as u32,
                undated,
                growth,
                consolidations,
                consolidation_marks: marks,
                top_hits,
            }))
        })
        .await
}

/// What one pass over a tree's rows keeps: 8 bytes a dated node, more
/// only for consolidated roots and nodes with hits.
#[derive(Default)]
struct Tally {
    created_ms: Vec<u64>,
    undated: u32,
    marks: Vec<HistoryMark>,
    /// (success hits, id) of the nodes with at least one.
    hits: Vec<(u32, u32)>,
}

impl Tally {
    fn add(&mut self, id: u32, row: &Row) {
        let created_at_ms = row.created_unix_ms;
        if created_at_ms == 0 {
            self.undated += 1;
        } else {
            self.created_ms.push(created_at_ms);
            if row.is_consolidated_root() {
                self.marks.push(HistoryMark { id, created_at_ms });
            }
        }
        if row.success_hits > 0 {
            self.hits.push((row.success_hits, id));
        }
    }

    /// The growth samples, the count of consolidations, the newest
    /// `points` of them and the ids of the `top` most-hit nodes.
    fn finish(mut self, points: usize, top: usize) -> (Vec<GrowthPoint>, u32, Vec<HistoryMark>, Vec<u32>) {
        let consolidations = self.marks.len() as u32;
        self.marks.sort_unstable_by_key(|m| (m.created_at_ms, m.id));
        let newest = self.marks.split_off(self.marks.len().saturating_sub(points));
        let by_hits = |&(hits, id): &(u32, u32)| (Reverse(hits), id);
        if top < self.hits.len() {
            self.hits.select_nth_unstable_by_key(top, by_hits);
            self.hits.truncate(top);
        }
        self.hits.sort_unstable_by_key(by_hits);
        let top_ids = self.hits.into_iter().map(|(_, id)| id).collect();
        (growth(self.created_ms, points), consolidations, newest, top_ids)
    }
}

/// The cumulative count at each distinct creation time, thinned evenly to
/// at most `points` samples; the oldest and the newest are kept (the
/// newest alone for one sample), so the curve spans the tree's dates and
/// ends at its dated node count.
fn growth(mut times_ms: Vec<u64>, points: usize) -> Vec<GrowthPoint> {
    assert!(points >= 1, "a curve needs one sample");
    times_ms.sort_unstable();
    let steps: Vec<GrowthPoint> = times_ms
        .iter()
        .enumerate()
        .filter(|&(i, t)| times_ms.get(i + 1) != Some(t))
        .map(|(i, &t_ms)| GrowthPoint {
            t_ms,
            nodes: (i + 1) as u32,
        })
        .collect();
    if steps.len() <= points {
        return steps;
    }
    if points == 1 {
        return steps[steps.len() - 1..].to_vec();
    }
    // Evenly spaced steps from the first to the last: the spacing is at
    // least one step (there are more steps than points), so no step is
    // taken twice.
    let last = steps.len() - 1;
    (0..points).map(|k| steps[(k * last).div_ceil(points - 1)]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_curve_counts_every_node_up_to_each_sample() {
        let times: Vec<u64> = [5, 1, 3, 3, 9, 1, 1, 7, 7, 7, 2].to_vec();
        let count_to = |t: u64| times.iter().filter(|&&x| x <= t).count() as u32;
        let every = growth(times.clone(), 100);
        let distinct: Vec<u64> = every.iter().map(|p| p.t_ms).collect();
        assert_eq!(distinct, vec![1, 2, 3, 5, 7, 9]);
        for points in 1..=8 {
            let curve = growth(times.clone(), points);
            assert_eq!(curve.len(), points.min(6), "{points}");
            assert_eq!(curve.last(), Some(&GrowthPoint { t_ms: 9, nodes: 11 }));
            if points > 1 {
                assert_eq!(curve[0], GrowthPoint { t_ms: 1, nodes: 3 });
            }
            assert!(curve.windows(2).all(|w| w[0].t_ms < w[1].t_ms));
            assert!(curve.iter().all(|p| p.nodes == count_to(p.t_ms)), "{curve:?}");
        }
        assert_eq!(growth(Vec::new(), 3), Vec::new());
    }
}

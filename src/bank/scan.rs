//! The failure-penalised similarity scan, run in place over the mapped
//! vector column and the overlay.

use super::mutate::normalise;
use super::{Bank, BankError};
use crate::format::row::{
    FLAG_CONSOLIDATED, Label, NodeType, ROW_DEPTH_OFFSET, ROW_FLAGS_OFFSET, ROW_LABEL_OFFSET, ROW_LINK_OFFSET,
    ROW_SIZE_BYTES, ROW_TREE_OFFSET,
};
use crate::format::{get_u16, get_u32};
use crate::tree::{Candidate, TopK, penalised_score};

#[derive(Debug, Clone, PartialEq)]
pub struct QueryOptions {
    /// How many matches to return.
    pub k: usize,
    /// Overrides the tree's threshold.
    pub tau: Option<f32>,
    /// Overrides the bank's failure penalty.
    pub eps: Option<f32>,
    /// Also match nodes already distilled into a consolidated root.
    pub include_consolidated: bool,
}

impl Default for QueryOptions {
    fn default() -> QueryOptions {
        QueryOptions {
            k: 1,
            tau: None,
            eps: None,
            include_consolidated: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Match {
    pub id: u32,
    pub score: f32,
    pub depth: u8,
    pub node_type: NodeType,
    pub label: Label,
    /// Root first, ending with `id`.
    pub chain: Vec<u32>,
}

/// Dot product with eight independent accumulators, so the compiler can
/// keep several vector registers busy instead of one serial dependency.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0.0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        let (x, y) = (&a[c * 8..c * 8 + 8], &b[c * 8..c * 8 + 8]);
        for lane in 0..8 {
            acc[lane] += x[lane] * y[lane];
        }
    }
    let mut tail = 0.0f32;
    for i in chunks * 8..a.len() {
        tail += a[i] * b[i];
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

struct ScanParams {
    tree: u16,
    tau: f32,
    eps: f32,
    include_consolidated: bool,
    visible_count: u32,
}

impl Bank {
    /// Top-k failure-penalised matches at or above tau, each with its chain.
    pub fn query(&self, tree_name: &str, embedding: &[f32], options: &QueryOptions) -> Result<Vec<Match>, BankError> {
        let tree = self.tree_index(tree_name)?;
        let query = normalise(embedding, self.manifest.dim_count)?;
        for (name, value) in [("tau", options.tau), ("eps", options.eps)] {
            if value.is_some_and(|v| !v.is_finite()) {
                return Err(BankError::BadConfig(format!("{name} must be finite")));
            }
        }
        let mut out = Vec::new();
        for c in self.scan_tree(tree, &query, options)? {
            let row = self.row(c.index)?;
            out.push(Match {
                id: c.index,
                score: c.score,
                depth: c.depth,
                node_type: row.node_type,
                label: row.label,
                chain: self.chain(c.index)?,
            });
        }
        Ok(out)
    }

    /// The ranked candidates of one tree for a normalised query.
    pub(crate) fn scan_tree(
        &self,
        tree: u16,
        query: &[f32],
        options: &QueryOptions,
    ) -> Result<Vec<Candidate>, BankError> {
        let params = ScanParams {
            tree,
            tau: options.tau.unwrap_or(self.manifest.trees[usize::from(tree)].tau),
            eps: options.eps.unwrap_or(self.manifest.eps),
            include_consolidated: options.include_consolidated,
            visible_count: self.node_count(),
        };
        // Checkpointed rows consolidated since the checkpoint still carry
        // the old flag in the mapping. Flags only ever get set, so asking
        // for that many extra candidates and dropping them afterwards gives
        // exactly the top-k of the current state.
        let hidden: Vec<u32> = if params.include_consolidated {
            Vec::new()
        } else {
            self.overlay
                .patched
                .values()
                .filter(|r| r.is_consolidated())
                .map(|r| r.index)
                .collect()
        };
        let mut top = TopK::new(options.k.saturating_add(hidden.len()));
        self.scan_base(query, &params, &mut top)?;
        self.scan_overlay(query, &params, &mut top);
        let mut ranked: Vec<Candidate> = top
            .into_sorted()
            .into_iter()
            .filter(|c| !hidden.contains(&c.index))
            .collect();
        ranked.truncate(options.k);
        self.check_winners(&ranked)?;
        Ok(ranked)
    }

    fn scan_base(&self, query: &[f32], p: &ScanParams, top: &mut TopK) -> Result<(), BankError> {
        let base = &self.base;
        for segment in 0..base.segment_count() {
            let maps = base.segment(segment)?;
            let first = segment * base.rows_per_segment;
            let rows_here = (base.node_count - first).min(base.rows_per_segment) as usize;
            let stride = base.stride_bytes as usize;
            let dim = base.dim_count as usize;
            let vectors: &[f32] = bytemuck::cast_slice(&maps.vectors[..rows_here * stride]);
            let floats_per_row = stride / 4;
            for slot in 0..rows_here {
                let row = &maps.table[slot * ROW_SIZE_BYTES..(slot + 1) * ROW_SIZE_BYTES];
                if get_u16(row, ROW_TREE_OFFSET) != p.tree {
                    continue;
                }
                // A link past the visible nodes is a consolidation committed
                // after this reader opened (see `Bank::row`): not yet in force.
                if !p.include_consolidated
                    && row[ROW_FLAGS_OFFSET] & FLAG_CONSOLIDATED != 0
                    && in_force(get_u32(row, ROW_LINK_OFFSET), p.visible_count)
                {
                    continue;
                }
                let label = if row[ROW_LABEL_OFFSET] == Label::Failure as u8 {
                    Label::Failure
                } else {
                    Label::Success
                };
                let v = &vectors[slot * floats_per_row..slot * floats_per_row + dim];
                let score = penalised_score(dot(query, v), label, p.eps);
                if score >= p.tau && top.admits(score) {
                    top.push(Candidate {
                        index: first + slot as u32,
                        score,
                        depth: row[ROW_DEPTH_OFFSET],
                    });
                }
            }
        }
        Ok(())
    }

    fn scan_overlay(&self, query: &[f32], p: &ScanParams, top: &mut TopK) {
        for row in &self.overlay.rows {
            if row.tree != p.tree || (!p.include_consolidated && row.is_consolidated()) {
                continue;
            }
            let score = penalised_score(dot(query, self.overlay.vector(row.index)), row.label, p.eps);
            if score >= p.tau && top.admits(score) {
                top.push(Candidate {
                    index: row.index,
                    score,
                    depth: row.depth,
                });
            }
        }
    }

    /// The scan reads mapped bytes without checksums (it must run at memory
    /// speed); the rows and vectors it returns are verified before anyone
    /// acts on them, so a corrupt winner is reported, never returned.
    fn check_winners(&self, ranked: &[Candidate]) -> Result<(), BankError> {
        for c in ranked.iter().filter(|c| c.index < self.base.node_count) {
            let row = self.base.row(c.index)?;
            let maps = self.base.segment(c.index / self.base.rows_per_segment)?;
            let v: &[f32] = bytemuck::cast_slice(&maps.vectors[self.base.vector_range(c.index)]);
            self.base.check_vector(&row, v)?;
        }
        Ok(())
    }
}

/// Whether a consolidated flag is in force for a handle that sees
/// `visible_count` nodes: always for an imported one (no link), otherwise
/// only once the root it went into is visible (see `Bank::row`).
#[inline]
fn in_force(link: u32, visible_count: u32) -> bool {
    link == crate::format::NODE_NONE || link < visible_count
}

//! The residual-tree rules of `SEMANTICS.md`, as pure functions: scoring,
//! ranking, the attachment rule, chain walking, consolidation eligibility
//! and prompt rendering. No I/O: the bank feeds rows in.

mod render;

use std::cmp::Ordering;

use thiserror::Error;

use crate::format::row::{Label, NodeType, Row};

pub use render::{TreeStyle, render_chain};

#[derive(Debug, Error, PartialEq)]
pub enum TreeError {
    #[error("tree structure broken at node {node}: {detail}")]
    Inconsistent { node: u32, detail: String },
}

/// The failure penalty: what a FAILURE node's similarity loses (`eps`);
/// nothing for a SUCCESS node. Every scan path subtracts this one (the
/// raw-table scans pass whether the label byte says FAILURE).
#[inline(always)]
pub fn failure_penalty(failed: bool, eps: f32) -> f32 {
    if failed { eps } else { 0.0 }
}

/// The failure-penalised similarity s(v) = cos(q, v) - eps * [v failed].
/// Vectors are unit length, so the dot product is the cosine.
#[inline]
pub fn penalised_score(dot: f32, label: Label, eps: f32) -> f32 {
    dot - failure_penalty(label == Label::Failure, eps)
}

/// A scored node considered by a scan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub index: u32,
    pub score: f32,
    pub depth: u8,
}

/// The deterministic ranking: higher score, then smaller depth, then the
/// older node (smaller index). `Less` means `a` ranks first.
pub fn rank(a: &Candidate, b: &Candidate) -> Ordering {
    b.score
        .total_cmp(&a.score)
        .then(a.depth.cmp(&b.depth))
        .then(a.index.cmp(&b.index))
}

/// Bounded best-k collection. Insertion sort into a small sorted vector:
/// k is small (1-50) and most candidates are rejected by one comparison
/// with the current worst.
#[derive(Debug, Clone)]
pub struct TopK {
    k: usize,
    items: Vec<Candidate>,
}

impl TopK {
    pub fn new(k: usize) -> TopK {
        TopK {
            k,
            items: Vec::with_capacity(k.min(1024) + 1),
        }
    }

    /// The least score `admits`: minus infinity until full, then the
    /// worst kept (plus infinity when k is 0, which admits nothing). For
    /// every finite score s, `admits(s) == (s >= floor())`.
    #[inline]
    pub fn floor(&self) -> f32 {
        if self.items.len() < self.k {
            f32::NEG_INFINITY
        } else {
            self.items.last().map_or(f32::INFINITY, |w| w.score)
        }
    }

    /// The score a candidate must beat (or tie) to enter, once full.
    #[inline]
    pub fn admits(&self, score: f32) -> bool {
        self.items.len() < self.k || self.items.last().is_some_and(|w| score >= w.score)
    }

    pub fn push(&mut self, c: Candidate) {
        if self.k == 0 || !self.admits(c.score) {
            return;
        }
        let at = self.items.partition_point(|x| rank(x, &c) == Ordering::Less);
        if at >= self.k {
            return;
        }
        self.items.insert(at, c);
        self.items.truncate(self.k);
    }

    pub fn into_sorted(self) -> Vec<Candidate> {
        self.items
    }
}

/// Where a new node goes, given the match found when its episode started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    Root,
    Residual { parent: u32, depth: u8 },
}

/// The matched node as the attachment rule needs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MatchedNode {
    pub index: u32,
    pub depth: u8,
    pub parent: Option<u32>,
}

/// The write decision and attachment rule (paper eq. 4-5): no match makes
/// a root; a match at depth < D_max takes the new node as its child; a
/// match at D_max gets a sibling instead, so no chain exceeds D_max nodes.
pub fn place(matched: Option<MatchedNode>, max_depth: u8) -> Placement {
    assert!(max_depth >= 1);
    match matched {
        None => Placement::Root,
        Some(m) if m.depth < max_depth => Placement::Residual {
            parent: m.index,
            depth: m.depth + 1,
        },
        // A sibling of a top-level root is a top-level root (only possible
        // when D_max is 1).
        Some(MatchedNode { parent: None, .. }) => Placement::Root,
        Some(MatchedNode {
            parent: Some(p), depth, ..
        }) => Placement::Residual { parent: p, depth },
    }
}

/// Walks parent links from `start` to its top-level root and returns the
/// chain root first. `row_of` supplies rows; the walk is bounded by the
/// start's depth and checks that depths step down by one.
pub fn chain<E: From<TreeError>>(start: u32, mut row_of: impl FnMut(u32) -> Result<Row, E>) -> Result<Vec<u32>, E> {
    let first = row_of(start)?;
    let mut out = vec![start];
    let mut current = first;
    for _ in 0..usize::from(u8::MAX) {
        let Some(parent) = current.parent() else {
            if current.depth != 1 {
                return Err(inconsistent(current.index, format!("top-level node has depth {}", current.depth)).into());
            }
            out.reverse();
            return Ok(out);
        };
        let up = row_of(parent)?;
        if up.depth + 1 != current.depth || up.tree != current.tree {
            return Err(inconsistent(
                current.index,
                format!("parent {parent} has depth {} tree {}", up.depth, up.tree),
            )
            .into());
        }
        out.push(parent);
        current = up;
    }
    Err(inconsistent(start, "parent chain longer than 255".into()).into())
}

fn inconsistent(node: u32, detail: String) -> TreeError {
    TreeError::Inconsistent { node, detail }
}

/// The shape rule every stored node obeys (FORMAT.md §8 step 5): its tree
/// exists, its depth is in 1..=`max_depth`, a ROOT has no parent and depth
/// 1, a RESIDUAL has a parent with a smaller index in the same tree one
/// level up. `row_of` reads the parent (only called for a RESIDUAL with a
/// plausible parent). Returns what is wrong, if anything; the caller says
/// where (a WAL op, a table segment).
pub fn shape_violation<E>(
    row: &Row,
    tree_count: usize,
    max_depth: u8,
    row_of: impl FnOnce(u32) -> Result<Row, E>,
) -> Result<Option<String>, E> {
    let index = row.index;
    if usize::from(row.tree) >= tree_count {
        return Ok(Some(format!("node {index}: tree {} does not exist", row.tree)));
    }
    if row.depth == 0 || row.depth > max_depth {
        return Ok(Some(format!(
            "node {index}: depth {} outside 1..={max_depth}",
            row.depth
        )));
    }
    if let Some(detail) = link_violation(row) {
        return Ok(Some(detail));
    }
    match (row.parent(), row.node_type) {
        (None, NodeType::Root) if row.depth == 1 => Ok(None),
        (Some(p), NodeType::Residual) if p < index => {
            let parent = row_of(p)?;
            Ok((parent.tree != row.tree || parent.depth + 1 != row.depth).then(|| {
                format!(
                    "node {index}: parent {p} has tree {} depth {}, not tree {} depth {}",
                    parent.tree,
                    parent.depth,
                    row.tree,
                    row.depth - 1
                )
            }))
        }
        (parent, node_type) => Ok(Some(format!(
            "node {index}: {node_type:?} at depth {} does not fit parent {parent:?}",
            row.depth
        ))),
    }
}

/// FORMAT.md §4: only a consolidation sets a link, and its flag says which
/// end the node is. A stray link was dumped, then dropped by a compact,
/// and `verify` saw nothing. Checked of every new row (`shape_violation`)
/// and of every update, which may change the link and the flags.
pub fn link_violation(row: &Row) -> Option<String> {
    let stray = row.link != crate::format::NODE_NONE && !row.is_consolidated() && !row.is_consolidated_root();
    stray.then(|| format!("node {}: link {} without a consolidation flag", row.index, row.link))
}

/// Consolidation eligibility: a residual node with at least K_cons success
/// hits that has not been distilled yet. Roots are excluded: their chain
/// is already one self-contained node, distilling it would only duplicate it.
pub fn is_due(row: &Row, consolidate_after: u32) -> bool {
    row.node_type == NodeType::Residual && !row.is_consolidated() && row.success_hits >= consolidate_after
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(index: u32, score: f32, depth: u8) -> Candidate {
        Candidate { index, score, depth }
    }

    #[test]
    fn topk_orders_by_score_depth_age() {
        let mut t = TopK::new(3);
        for x in [c(5, 0.9, 3), c(1, 0.9, 3), c(2, 0.9, 2), c(3, 0.95, 4), c(4, 0.1, 1)] {
            t.push(x);
        }
        let ids: Vec<u32> = t.into_sorted().iter().map(|x| x.index).collect();
        assert_eq!(ids, vec![3, 2, 1]);
    }

    #[test]
    fn topk_matches_full_sort() {
        // Compare against sorting everything, with many ties.
        let all: Vec<Candidate> = (0..500u32)
            .map(|i| c(i, ((i * 37) % 11) as f32 / 10.0, (i % 4) as u8 + 1))
            .collect();
        for k in [0, 1, 2, 7, 64, 600] {
            let mut t = TopK::new(k);
            all.iter().for_each(|x| t.push(*x));
            let mut sorted = all.clone();
            sorted.sort_by(rank);
            sorted.truncate(k);
            assert_eq!(t.into_sorted(), sorted, "k={k}");
        }
    }

    #[test]
    fn placement_rule() {
        assert_eq!(place(None, 5), Placement::Root);
        let m = |depth, parent| {
            Some(MatchedNode {
                index: 9,
                depth,
                parent,
            })
        };
        assert_eq!(place(m(1, None), 5), Placement::Residual { parent: 9, depth: 2 });
        assert_eq!(place(m(4, Some(3)), 5), Placement::Residual { parent: 9, depth: 5 });
        assert_eq!(place(m(5, Some(3)), 5), Placement::Residual { parent: 3, depth: 5 });
        assert_eq!(place(m(1, None), 1), Placement::Root);
    }

    fn shaped(index: u32, parent: u32, tree: u16, node_type: NodeType, depth: u8) -> Row {
        Row {
            index,
            parent,
            tree,
            node_type,
            label: Label::Success,
            depth,
            flags: 0,
            success_hits: 0,
            retrievals: 0,
            link: crate::format::NODE_NONE,
            vector_crc32: 0,
            payload_offset_bytes: 0,
            payload_size_bytes: 0,
            created_unix_ms: 0,
            external_id: [0; 16],
            vector_sum32: 0,
            qvector_sum32: 0,
        }
    }

    #[test]
    fn shape_rule_names_each_violation() {
        use crate::format::NODE_NONE;
        let parent = shaped(0, NODE_NONE, 1, NodeType::Root, 1);
        let check = |row: &Row| shape_violation(row, 2, 3, |_| Ok::<_, ()>(parent.clone())).unwrap();
        assert_eq!(check(&parent), None);
        assert_eq!(check(&shaped(1, 0, 1, NodeType::Residual, 2)), None);
        let bad = [
            (shaped(1, NODE_NONE, 2, NodeType::Root, 1), "tree 2 does not exist"),
            (shaped(1, NODE_NONE, 0, NodeType::Root, 0), "depth 0 outside 1..=3"),
            (shaped(1, 0, 1, NodeType::Residual, 4), "depth 4 outside 1..=3"),
            (shaped(1, NODE_NONE, 0, NodeType::Root, 2), "Root at depth 2"),
            (shaped(1, 1, 1, NodeType::Residual, 2), "does not fit parent Some(1)"),
            (shaped(1, 0, 1, NodeType::Root, 2), "Root at depth 2"),
            (shaped(1, 0, 0, NodeType::Residual, 2), "parent 0 has tree 1 depth 1"),
            (shaped(1, 0, 1, NodeType::Residual, 3), "parent 0 has tree 1 depth 1"),
            (
                Row {
                    link: 0,
                    ..shaped(1, 0, 1, NodeType::Residual, 2)
                },
                "link 0 without a consolidation flag",
            ),
        ];
        // With either flag, a link is the consolidation's (checked for
        // being mutual by verify).
        for flags in [
            crate::format::row::FLAG_CONSOLIDATED,
            crate::format::row::FLAG_CONSOLIDATED_ROOT,
        ] {
            let linked = Row {
                link: 0,
                flags,
                ..shaped(1, 0, 1, NodeType::Residual, 2)
            };
            assert_eq!(check(&linked), None);
        }
        for (row, want) in bad {
            let got = check(&row).unwrap_or_else(|| panic!("{row:?} accepted"));
            assert!(got.contains(want), "{got:?} lacks {want:?}");
        }
    }

    #[test]
    fn failure_penalty() {
        assert_eq!(penalised_score(0.9, Label::Success, 0.05), 0.9);
        assert!((penalised_score(0.9, Label::Failure, 0.05) - 0.85).abs() < 1e-6);
    }
}

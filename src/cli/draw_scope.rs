//! Which nodes `draw` shows: a whole tree, or the subtree under one node,
//! down to a number of levels, within a budget of nodes. The budget is
//! checked from the node table alone, before any payload is read or any
//! picture is built: a 1M-node tree drawn whole made a 370 MB SVG in memory,
//! which no viewer opens.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::bail;
use deltamem::Bank;

use super::NodeArg;

/// Default of `--max-nodes`: a picture a person can still read (and a
/// viewer still open) is far smaller.
pub const DEFAULT_MAX_NODES: u32 = 10_000;

/// What the command line asked to draw.
pub struct Scope<'a> {
    /// Draw the subtree under this node instead of the whole tree.
    pub root: Option<&'a NodeArg>,
    /// Levels drawn: 1 draws only the starting nodes.
    pub levels: Option<u32>,
    pub max_nodes: u32,
}

/// The nodes a drawing shows.
pub struct Selection {
    /// The nodes the drawing starts from (the tree's top-level roots, or the
    /// node `--root` names), in index order.
    pub starts: Vec<u32>,
    /// Every drawn node's level: 1 for a start, 2 for its children, ...
    pub level: BTreeMap<u32, u32>,
    /// Drawn children of drawn nodes, in index order (oldest first).
    pub children: BTreeMap<u32, Vec<u32>>,
    /// Drawn nodes whose children are not drawn (past `--depth`), with how
    /// many children each has.
    pub hidden: BTreeMap<u32, usize>,
    /// What the drawing starts from, for its title.
    pub start_caption: String,
}

impl Selection {
    pub fn kids(&self, index: u32) -> &[u32] {
        self.children.get(&index).map_or(&[], Vec::as_slice)
    }
}

/// The nodes of tree `tree_name` that `scope` asks for, or a refusal when
/// they are more than its budget (naming the count and how to narrow it).
pub fn select(bank: &Bank, path: &Path, tree_name: &str, scope: &Scope) -> anyhow::Result<Selection> {
    // An unknown tree is named before an unknown node.
    bank.tree_index(tree_name)?;
    let start = scope.root.map(|id| super::resolve(bank, id, path)).transpose()?;
    select_from(bank, tree_name, start, scope.levels, scope.max_nodes)
}

/// A whole tree within the default budget (the demos' small banks).
pub fn whole_tree(bank: &Bank, tree_name: &str) -> anyhow::Result<Selection> {
    select_from(bank, tree_name, None, None, DEFAULT_MAX_NODES)
}

fn select_from(
    bank: &Bank,
    tree_name: &str,
    start: Option<u32>,
    levels: Option<u32>,
    max_nodes: u32,
) -> anyhow::Result<Selection> {
    let tree = bank.tree_index(tree_name)?;
    // (parent, child) for every node of the tree: 8 bytes a node, sorted
    // by parent, so a node's children are one binary search away.
    let mut links: Vec<(u32, u32)> = Vec::new();
    let mut top = Vec::new();
    for index in 0..bank.node_count() {
        let row = bank.row(index)?;
        if row.tree != tree {
            continue;
        }
        match row.parent() {
            Some(parent) => links.push((parent, index)),
            None => top.push(index),
        }
    }
    links.sort_unstable();
    let (starts, start_caption) = match start {
        None => (top, tree_name.to_string()),
        Some(index) => {
            let its_tree = bank.row(index)?.tree;
            if its_tree != tree {
                bail!(
                    "node {index} is in tree {}, not {tree_name}: draw it with --tree {}",
                    bank.tree_name(its_tree),
                    bank.tree_name(its_tree)
                );
            }
            (vec![index], format!("{tree_name}: under #{index}"))
        }
    };
    let selection = walk(&links, starts, levels, start_caption);
    let drawn = selection.level.len();
    if drawn > max_nodes as usize {
        bail!(
            "the drawing would hold {drawn} nodes of tree {tree_name}, more than --max-nodes {max_nodes}: {}",
            narrowing_hint(&selection, start.is_some(), levels, max_nodes)
        );
    }
    Ok(selection)
}

/// How a refused drawing can be narrowed: only the options that would
/// help (`--depth` cannot, when the starts alone are over the budget).
fn narrowing_hint(selection: &Selection, has_root: bool, levels: Option<u32>, max_nodes: u32) -> String {
    let mut ways = Vec::new();
    if !has_root {
        ways.push("--root ID (a node's subtree)");
    }
    if selection.starts.len() <= max_nodes as usize && levels.is_none_or(|l| l > 1) {
        ways.push("--depth N (the top N levels)");
    }
    match ways.is_empty() {
        true => "raise --max-nodes".to_string(),
        false => format!("draw part of it with {}, or raise --max-nodes", ways.join(" or ")),
    }
}

/// Breadth-first from `starts` over `links`, down to `levels` levels.
fn walk(links: &[(u32, u32)], starts: Vec<u32>, levels: Option<u32>, start_caption: String) -> Selection {
    let mut selection = Selection {
        starts: starts.clone(),
        level: BTreeMap::new(),
        children: BTreeMap::new(),
        hidden: BTreeMap::new(),
        start_caption,
    };
    let mut frontier = starts;
    let mut depth = 1;
    // Bounded: each node of the tree enters the frontier at most once (the
    // links form a forest: a child's parent is older than the child).
    while !frontier.is_empty() {
        let mut next = Vec::new();
        for index in frontier {
            let at = links.partition_point(|&(p, _)| p < index);
            let kids: Vec<u32> = links[at..]
                .iter()
                .take_while(|&&(p, _)| p == index)
                .map(|&(_, c)| c)
                .collect();
            assert!(
                selection.level.insert(index, depth).is_none(),
                "node {index} reached twice"
            );
            if kids.is_empty() {
                continue;
            }
            if levels.is_some_and(|l| depth >= l) {
                selection.hidden.insert(index, kids.len());
                continue;
            }
            next.extend_from_slice(&kids);
            selection.children.insert(index, kids);
        }
        frontier = next;
        depth += 1;
    }
    selection
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 0 -> {1, 2}, 1 -> {3}, 3 -> {4}; 5 is a second root.
    fn links() -> Vec<(u32, u32)> {
        vec![(0, 1), (0, 2), (1, 3), (3, 4)]
    }

    #[test]
    fn levels_cut_the_walk_and_count_what_they_hide() {
        let all = walk(&links(), vec![0, 5], None, String::new());
        assert_eq!(all.level.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 3, 4, 5]);
        assert_eq!(all.level[&4], 4);
        assert!(all.hidden.is_empty());
        let two = walk(&links(), vec![0, 5], Some(2), String::new());
        assert_eq!(two.level.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 5]);
        assert_eq!(two.hidden, BTreeMap::from([(1, 1)]));
        assert_eq!(two.kids(0), [1, 2]);
        let under = walk(&links(), vec![1], None, String::new());
        assert_eq!(under.level, BTreeMap::from([(1, 1), (3, 2), (4, 3)]));
    }
}

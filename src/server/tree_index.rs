//! Which nodes each tree holds and which children each node has, kept
//! across requests and caught up with the rows appended since the last
//! one. A page of a tree's listing used to scan every row of the bank to
//! count the tree's nodes and find the page (1M rows: 130 ms a page, and
//! the explorer's tree view asks for a thousand pages), and a node's
//! children were a scan of every later row.
//!
//! Sound because rows are only appended: a node's tree and parent never
//! change once it is stored. A read-only server's view can be replaced by
//! a newer one (`commit::refresh_reader`); the index is rebuilt when the
//! view it was built from is not the current one.

use std::collections::HashMap;

use crate::bank::{Bank, BankError};

#[derive(Default)]
pub struct TreeIndex {
    /// The view (`Shared::views`) the index was built from.
    view: u64,
    /// Rows below this are in the index.
    indexed_below: u32,
    /// Node indexes of each tree, ascending.
    by_tree: Vec<Vec<u32>>,
    /// Children of every node that has any, ascending.
    children: HashMap<u32, Vec<u32>>,
}

impl TreeIndex {
    /// Adds the rows appended since the last call (all of them after a
    /// change of view).
    pub fn catch_up(&mut self, bank: &Bank, view: u64) -> Result<(), BankError> {
        if view != self.view || bank.node_count() < self.indexed_below {
            *self = TreeIndex {
                view,
                ..TreeIndex::default()
            };
        }
        let end = bank.node_count();
        for index in self.indexed_below..end {
            let row = bank.row(index)?;
            let tree = usize::from(row.tree);
            if self.by_tree.len() <= tree {
                self.by_tree.resize_with(tree + 1, Vec::new);
            }
            self.by_tree[tree].push(index);
            if let Some(parent) = row.parent() {
                assert!(parent < index, "node {index}'s parent {parent} is not older");
                self.children.entry(parent).or_default().push(index);
            }
            // Advanced per row: a row that fails to read is read again by
            // the next request, not skipped.
            self.indexed_below = index + 1;
        }
        Ok(())
    }

    /// The nodes of tree `tree`, ascending.
    pub fn tree(&self, tree: u16) -> &[u32] {
        self.by_tree.get(usize::from(tree)).map_or(&[], Vec::as_slice)
    }

    /// The children of node `index`, ascending.
    pub fn children(&self, index: u32) -> &[u32] {
        self.children.get(&index).map_or(&[], Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bank::{Attach, BankConfig, NewNode};
    use crate::format::payload::Payload;
    use crate::format::row::Label;

    fn node(tree: &str, attach: Attach, x: f32) -> NewNode {
        NewNode {
            tree: tree.into(),
            attach,
            label: Label::Success,
            payload: Payload {
                scenario: format!("n{x}"),
                fields: Default::default(),
            },
            embedding: vec![1.0, x],
            external_id: None,
        }
    }

    /// Against a scan of every row, after each of several rounds of
    /// inserts (the index catches up), and after a change of view.
    #[test]
    fn the_index_equals_a_scan_of_the_rows() {
        let dir = tempfile::tempdir().unwrap();
        let mut bank = Bank::create_dir(dir.path(), BankConfig::new(2)).unwrap();
        let mut index = TreeIndex::default();
        let mut rng = crate::storage::sim::Rng(7);
        for round in 0..5 {
            for i in 0..40 {
                let count = bank.node_count();
                let tree = if rng.next().is_multiple_of(3) { "env" } else { "task" };
                let attach = match count {
                    0 => Attach::Root,
                    _ => {
                        let parent = (rng.next() % u64::from(count)) as u32;
                        match bank.row(parent).unwrap().tree == bank.tree_index(tree).unwrap() {
                            true => Attach::Parent(crate::bank::NodeRef::Index(parent)),
                            false => Attach::Root,
                        }
                    }
                };
                bank.insert(node(tree, attach, (round * 40 + i) as f32)).unwrap();
            }
            index.catch_up(&bank, 1).unwrap();
            check(&index, &bank);
        }
        // A newer view (another bank here, larger and shaped otherwise):
        // nothing of the old one may remain.
        let other_dir = tempfile::tempdir().unwrap();
        let mut other = Bank::create_dir(other_dir.path(), BankConfig::new(2)).unwrap();
        for i in 0..bank.node_count() + 10 {
            let attach = match i % 2 {
                0 => Attach::Root,
                _ => Attach::Parent(crate::bank::NodeRef::Index(i - 1)),
            };
            other.insert(node("env", attach, i as f32)).unwrap();
        }
        index.catch_up(&other, 2).unwrap();
        check(&index, &other);
    }

    fn check(index: &TreeIndex, bank: &Bank) {
        for tree in 0..2u16 {
            let want: Vec<u32> = (0..bank.node_count())
                .filter(|&i| bank.row(i).unwrap().tree == tree)
                .collect();
            assert_eq!(index.tree(tree), want);
        }
        for parent in 0..bank.node_count() {
            let want: Vec<u32> = (0..bank.node_count())
                .filter(|&i| bank.row(i).unwrap().parent() == Some(parent))
                .collect();
            assert_eq!(index.children(parent), want, "children of {parent}");
        }
    }
}

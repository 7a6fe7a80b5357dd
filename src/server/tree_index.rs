//! Which nodes each tree holds and which children each node has, kept
//! across requests and caught up with the rows appended since the last
//! one. A page of a tree's listing used to scan every row of the bank to
//! count the tree's nodes and find the page (1M rows: 130 ms a page, and
//! the explorer's tree view asks for a thousand pages), and a node's
//! children were a scan of every later row.
//!
//! Sound because rows are only appended and keep their index (`compact`
//! too): a node's tree and parent never change once it is stored. A
//! read-only server's view is replaced whenever the writer makes anything
//! durable (`commit::refresh_reader`); the index is kept across such a
//! change when the new view is the same bank grown (same creation time,
//! at least as many rows, and the last indexed row unchanged), and
//! rebuilt otherwise.
//!
//! Flat arrays, 12 bytes a node: each tree's list, and the children as
//! linked lists (`first_child`, `next_sibling`), so a bank of many
//! residuals costs no allocation per parent.

use crate::bank::{Bank, BankError};

/// No node (an empty list's head, a list's end).
const NONE: u32 = u32::MAX;

#[derive(Default)]
pub struct TreeIndex {
    /// The bank the index was built from (`created_unix_ms` of its manifest).
    bank_created_unix_ms: u64,
    /// Rows below this are in the index.
    indexed_below: u32,
    /// Node indexes of each tree, ascending.
    by_tree: Vec<Vec<u32>>,
    /// Per node: its newest child (NONE if none).
    first_child: Vec<u32>,
    /// Per node: the next older child of its parent (NONE at the oldest).
    next_sibling: Vec<u32>,
    /// Per node: its parent (NONE for a top-level root), to check a new
    /// view against.
    parent: Vec<u32>,
    /// Times the index was started over (for tests).
    rebuilds: u32,
}

impl TreeIndex {
    /// Adds the rows appended since the last call; starts over when `bank`
    /// is not the bank the index was built from, or not that bank grown.
    pub fn catch_up(&mut self, bank: &Bank) -> Result<(), BankError> {
        if !self.describes_a_prefix_of(bank)? {
            *self = TreeIndex {
                bank_created_unix_ms: bank.manifest().created_unix_ms,
                rebuilds: self.rebuilds + 1,
                ..TreeIndex::default()
            };
        }
        let end = bank.node_count();
        for index in self.indexed_below..end {
            let row = bank.row(index)?;
            let parent = row.parent().unwrap_or(NONE);
            assert!(
                parent == NONE || parent < index,
                "node {index}'s parent {parent} is not older"
            );
            let tree = usize::from(row.tree);
            if self.by_tree.len() <= tree {
                self.by_tree.resize_with(tree + 1, Vec::new);
            }
            self.by_tree[tree].push(index);
            self.parent.push(parent);
            self.first_child.push(NONE);
            self.next_sibling.push(NONE);
            if parent != NONE {
                self.next_sibling[index as usize] = self.first_child[parent as usize];
                self.first_child[parent as usize] = index;
            }
            // Advanced per row: a row that fails to read is read again by
            // the next request, not skipped.
            self.indexed_below = index + 1;
        }
        Ok(())
    }

    /// Whether `bank` holds every indexed row as indexed: the same bank
    /// (creation time), no fewer rows, and the last indexed row with the
    /// same tree and parent (a cheap check against a diverged copy).
    fn describes_a_prefix_of(&self, bank: &Bank) -> Result<bool, BankError> {
        if bank.manifest().created_unix_ms != self.bank_created_unix_ms || bank.node_count() < self.indexed_below {
            return Ok(false);
        }
        let Some(last) = self.indexed_below.checked_sub(1) else {
            return Ok(true);
        };
        let row = bank.row(last)?;
        Ok(self.parent[last as usize] == row.parent().unwrap_or(NONE) && self.tree(row.tree).last() == Some(&last))
    }

    /// The nodes of tree `tree`, ascending.
    pub fn tree(&self, tree: u16) -> &[u32] {
        self.by_tree.get(usize::from(tree)).map_or(&[], Vec::as_slice)
    }

    /// The children of node `index`, ascending.
    pub fn children(&self, index: u32) -> Vec<u32> {
        let mut children = Vec::new();
        let mut at = self.first_child.get(index as usize).copied().unwrap_or(NONE);
        // Bounded: each step goes to an older sibling, and there are at
        // most `indexed_below` nodes.
        while at != NONE {
            assert!(
                children.len() < self.indexed_below as usize,
                "a cycle in the sibling lists"
            );
            children.push(at);
            at = self.next_sibling[at as usize];
        }
        children.reverse();
        children
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
            index.catch_up(&bank).unwrap();
            check(&index, &bank);
        }
        assert_eq!(index.rebuilds, 1, "built once, then caught up");
        // The same bank, grown and seen through a new view (as a read-only
        // server sees it): caught up, not rebuilt.
        bank.insert(node("task", Attach::Root, 1000.0)).unwrap();
        bank.close().unwrap();
        let reopened = Bank::open_dir(dir.path(), Default::default()).unwrap();
        index.catch_up(&reopened).unwrap();
        check(&index, &reopened);
        assert_eq!(index.rebuilds, 1, "a grown view of the same bank is caught up");
        std::thread::sleep(std::time::Duration::from_millis(5));
        // A newer view (another bank here, larger and shaped otherwise):
        // nothing of the old one may remain.
        let other_dir = tempfile::tempdir().unwrap();
        let mut other = Bank::create_dir(other_dir.path(), BankConfig::new(2)).unwrap();
        for i in 0..reopened.node_count() + 10 {
            let attach = match i % 2 {
                0 => Attach::Root,
                _ => Attach::Parent(crate::bank::NodeRef::Index(i - 1)),
            };
            other.insert(node("env", attach, i as f32)).unwrap();
        }
        index.catch_up(&other).unwrap();
        check(&index, &other);
        assert_eq!(index.rebuilds, 2, "another bank is indexed afresh");
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

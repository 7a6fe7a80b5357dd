//! Counts and sizes for `stats`.

use super::{Bank, BankError};
use crate::format::manifest::Precision;
use crate::format::row::{Label, NodeType, ROW_SIZE_BYTES};
use crate::storage::WAL_FILE;
use crate::tree;

/// Counts of one tree. Serialised as is in every face's `stats` reply
/// (`api::TreeStatsReply`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TreeStats {
    pub name: String,
    pub tau: f32,
    pub nodes: u64,
    pub roots: u64,
    pub residuals: u64,
    pub successes: u64,
    pub failures: u64,
    pub consolidated: u64,
    pub consolidated_roots: u64,
    pub due_for_consolidation: u64,
    /// `depth_histogram[d - 1]` = nodes at depth d.
    pub depth_histogram: Vec<u64>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub dim_count: u32,
    pub nodes: u64,
    pub checkpointed_nodes: u64,
    pub trees: Vec<TreeStats>,
    /// How the vector column is stored.
    pub precision: Precision,
    /// Vector column bytes of all nodes, the int8 side column included.
    pub vector_bytes: u64,
    pub table_bytes: u64,
    pub payload_bytes: u64,
    pub wal_bytes: u64,
    pub checkpoint_lsn: u64,
    pub frozen: bool,
}

/// Per-tree counts gathered a slice of rows at a time (`Bank::count_rows`):
/// a server counts a large bank in holds of its lock, so writes go in
/// between. Rows counted earlier may have changed since (a hit, a
/// consolidation): the counts are of each row as it was when read.
#[derive(Debug, Clone)]
pub struct StatsTally {
    trees: Vec<TreeStats>,
    next_row: u32,
}

impl Bank {
    /// Counts and sizes of the whole bank, as it is now.
    pub fn stats(&self) -> Result<Stats, BankError> {
        let mut tally = self.start_stats();
        let counted = self.count_rows(&mut tally, u32::MAX)?;
        assert!(counted, "one call counts every row");
        self.finish_stats(tally)
    }

    /// A tally of no rows yet, one entry per tree.
    pub fn start_stats(&self) -> StatsTally {
        let max_depth = usize::from(self.manifest.max_depth);
        let trees = self
            .manifest
            .trees
            .iter()
            .map(|t| TreeStats {
                name: t.name.clone(),
                tau: t.tau,
                depth_histogram: vec![0; max_depth],
                ..Default::default()
            })
            .collect();
        StatsTally { trees, next_row: 0 }
    }

    /// Adds up to `max_rows` more rows to `tally`; true once it has counted
    /// every row the bank holds now (then `finish_stats`, with no write in
    /// between, gives counts that add up to the node count).
    pub fn count_rows(&self, tally: &mut StatsTally, max_rows: u32) -> Result<bool, BankError> {
        assert_eq!(tally.trees.len(), self.manifest.trees.len(), "a tally of this bank");
        let end = tally.next_row.saturating_add(max_rows).min(self.node_count());
        for index in tally.next_row..end {
            let row = self.row(index)?;
            let t = &mut tally.trees[usize::from(row.tree)];
            t.nodes += 1;
            match row.node_type {
                NodeType::Root => t.roots += 1,
                NodeType::Residual => t.residuals += 1,
            }
            match row.label {
                Label::Success => t.successes += 1,
                Label::Failure => t.failures += 1,
            }
            t.consolidated += u64::from(row.is_consolidated());
            t.consolidated_roots += u64::from(row.is_consolidated_root());
            t.due_for_consolidation += u64::from(tree::is_due(&row, self.manifest.consolidate_after));
            if let Some(slot) = t.depth_histogram.get_mut(usize::from(row.depth).saturating_sub(1)) {
                *slot += 1;
            }
        }
        tally.next_row = end;
        Ok(end == self.node_count())
    }

    /// The counts of a tally that has counted every row, with the bank's
    /// sizes.
    pub fn finish_stats(&self, tally: StatsTally) -> Result<Stats, BankError> {
        assert_eq!(tally.next_row, self.node_count(), "every row counted");
        let trees = tally.trees;
        let nodes = u64::from(self.node_count());
        let wal_bytes = self
            .storage
            .open(WAL_FILE, crate::storage::OpenMode::Read)
            .and_then(|f| f.len_bytes())
            .map_err(crate::storage::StorageError::io(
                "stat",
                self.storage.describe(WAL_FILE),
            ))?;
        Ok(Stats {
            dim_count: self.manifest.dim_count,
            nodes,
            checkpointed_nodes: u64::from(self.base.node_count),
            trees,
            precision: self.manifest.precision,
            vector_bytes: nodes
                * u64::from(
                    self.manifest.row_stride_bytes
                        + self
                            .manifest
                            .precision
                            .qvector_stride_bytes(self.manifest.dim_count)
                            .unwrap_or(0),
                ),
            table_bytes: nodes * ROW_SIZE_BYTES as u64,
            payload_bytes: self.overlay.payload_end_bytes,
            wal_bytes,
            checkpoint_lsn: self.manifest.checkpoint_lsn,
            frozen: self.manifest.is_frozen(),
        })
    }
}

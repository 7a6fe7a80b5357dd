//! Writing a parsed reference tree into a bank.

use serde_json::Value;

use super::REFERENCE_META_FIELD;
use super::parse::{ReferenceNode, ReferenceTree};
use crate::format::payload::Payload;
use crate::interop::InteropError;
use crate::{Attach, Bank, BankError, Change, ChangeAck, ImportedState, NewNode, NodeRef, SyncPolicy};

#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// Overrides the bank's sync policy for the inserts.
    pub sync: Option<SyncPolicy>,
    /// Most nodes per WAL record (one `transact` call).
    pub max_batch_nodes: usize,
}

impl Default for ImportOptions {
    fn default() -> ImportOptions {
        ImportOptions {
            sync: None,
            max_batch_nodes: 4096,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ImportReport {
    pub file: String,
    pub tree: String,
    /// Bank index of each imported node, in [`ReferenceTree::nodes`] order.
    pub ids: Vec<u32>,
    pub placeholders_dropped: usize,
    pub notes: Vec<String>,
}

/// Most body bytes per batch: half a WAL record, leaving room for the
/// compressed payloads we can only estimate (by their plain size).
const BATCH_BODY_BUDGET_BYTES: usize = 32 * 1024 * 1024;

/// Most nodes per batch (a WAL record holds 65535 ops, one per node).
const BATCH_OPS_BUDGET: usize = 60_000;

/// Imports `source` into tree `tree`. The whole file is first run
/// through the bank's own rules ([`Bank::check_changes`], a dry run of
/// the writes: vectors, ids, payloads, placement, counters), so a bad
/// file leaves the bank untouched and can be imported once fixed. The nodes go in
/// parent-first, in batches of one WAL record each (`transact`), with
/// their counters in the same record; a file of at most `max_batch_nodes`
/// nodes (all real reference files) is one atomic write.
///
/// Each node carries its counters, flags and creation time
/// ([`Change::Import`]), so a batch is one atomic write and a node that was
/// consolidated in the source tree is not matched by scans here either.
/// The tree is taken by value: its vectors and payloads become the writes.
pub fn import_tree(
    bank: &mut Bank,
    tree: &str,
    mut source: ReferenceTree,
    options: &ImportOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ImportReport, InteropError> {
    let mut notes = check(bank, tree, &source)?;
    notes.extend(source.notes.iter().cloned());
    let base = bank.node_count();
    // Each node's vector and payload move into its change (the tree keeps
    // what messages name): one copy of the file's data, not two.
    let mut sizes = Vec::with_capacity(source.nodes.len());
    let changes: Vec<Change> = source
        .nodes
        .iter_mut()
        .map(|node| {
            let new = new_node(tree, base, node);
            sizes.push(new.payload.size_bytes());
            Change::Import(new, imported_state(node))
        })
        .collect();
    let source = &source;
    // The whole file through the bank's own rules before anything is
    // written: a refusal leaves the bank as it was, so a fixed file can be
    // imported again.
    let planned = bank
        .check_changes(&changes)
        .map_err(|e| refused(source, 0, changes.len(), e))?;
    for (k, ack) in planned.iter().enumerate() {
        if let ChangeAck::Inserted(ack) = ack {
            check_placed(source, k, base, ack)?;
        }
    }
    check_placeholders(bank, source)?;
    let (total, mut ids) = (source.nodes.len() as u64, Vec::new());
    let mut start = 0;
    while start < changes.len() {
        let end = batch_end(bank, &sizes, start, options.max_batch_nodes);
        let acks = bank
            .transact(&changes[start..end], options.sync)
            .map_err(|e| refused(source, start, end, e))?;
        let inserted = acks.into_iter().filter_map(|a| match a {
            ChangeAck::Inserted(ack) => Some(ack),
            _ => None,
        });
        for (k, ack) in (start..end).zip(inserted) {
            check_placed(source, k, base, &ack)?;
            ids.push(ack.id);
        }
        start = end;
        progress(start as u64, total);
    }
    Ok(ImportReport {
        file: source.file.clone(),
        tree: tree.to_string(),
        ids,
        placeholders_dropped: source.placeholder_ids.len(),
        notes,
    })
}

/// The bank placed node `k` where the file has it (it must: we hold the
/// writer lock and checked the depths; this guards the index prediction).
fn check_placed(source: &ReferenceTree, k: usize, base: u32, ack: &crate::bank::InsertAck) -> Result<(), InteropError> {
    let node = &source.nodes[k];
    let want = base + k as u32;
    if ack.id == want && u32::from(ack.depth) == node.depth && ack.node_type == node.node_type {
        return Ok(());
    }
    let detail = format!(
        "stored as node {} at depth {} ({}), expected node {want} at depth {}",
        ack.id,
        ack.depth,
        ack.node_type.as_str(),
        node.depth
    );
    Err(node_error(source, node, detail))
}

/// What the row takes over from the file.
fn imported_state(node: &ReferenceNode) -> ImportedState {
    ImportedState {
        success_hits: node.success_hits,
        retrievals: node.retrievals,
        consolidated: node.consolidated,
        consolidated_root: node.consolidated_root,
        created_unix_ms: node.created_unix_ms,
    }
}

fn node_error(source: &ReferenceTree, node: &ReferenceNode, detail: String) -> InteropError {
    InteropError::Node {
        file: source.file.clone(),
        node_id: node.node_id.clone(),
        detail,
    }
}

/// Names the node a batch (nodes `start..end`, then their counter bumps)
/// failed on.
fn refused(source: &ReferenceTree, start: usize, end: usize, e: BankError) -> InteropError {
    match e {
        BankError::BatchItem { position, error: cause } if start + position < end => InteropError::Refused {
            file: source.file.clone(),
            node_id: source.nodes[start + position].node_id.clone(),
            reason: cause,
        },
        BankError::BatchItem { error: cause, .. } => InteropError::Node {
            file: source.file.clone(),
            node_id: source.nodes[start].node_id.clone(),
            detail: format!(
                "setting the counters of this node and the {} after it failed: {cause}",
                end - start - 1
            ),
        },
        other => InteropError::from(other),
    }
}

/// Checks the whole file against the bank; returns notes for the user.
fn check(bank: &Bank, tree: &str, source: &ReferenceTree) -> Result<Vec<String>, InteropError> {
    bank.tree_index(tree)?;
    let max_depth = u32::from(bank.manifest().max_depth);
    for node in &source.nodes {
        if node.depth > max_depth {
            return Err(node_error(
                source,
                node,
                format!(
                    "sits at depth {}, deeper than this bank's D_max {max_depth} (create the bank with --max-depth {})",
                    node.depth,
                    source.max_depth()
                ),
            ));
        }
    }
    let mut notes = Vec::new();
    if let Some(name) = source.tree_name.as_deref().filter(|n| *n != tree) {
        notes.push(format!(
            "the file says it holds tree {name:?}; imported into {tree:?} as asked"
        ));
    }
    Ok(notes)
}

/// An empty tree still tells its embedding size through the placeholder:
/// importing it into a bank of another dimension is surely a mistake.
/// (Checked after the nodes, whose own dimension errors say more.)
fn check_placeholders(bank: &Bank, source: &ReferenceTree) -> Result<(), InteropError> {
    let dim = bank.dim_count() as usize;
    for (id, &len) in source.placeholder_ids.iter().zip(&source.placeholder_dim_counts) {
        if len != 0 && len != dim {
            return Err(InteropError::Node {
                file: source.file.clone(),
                node_id: id.clone(),
                detail: format!("placeholder embedding has {len} dimensions, the bank stores {dim}"),
            });
        }
    }
    Ok(())
}

/// The payload as stored: the file's fields plus `reference_meta` (taken
/// from the node).
fn stored_payload(node: &mut ReferenceNode) -> Payload {
    let meta: serde_json::Map<String, Value> = std::mem::take(&mut node.extra_meta).into_iter().collect();
    let mut payload = std::mem::take(&mut node.payload);
    if !meta.is_empty() {
        payload
            .fields
            .insert(REFERENCE_META_FIELD.into(), Value::Object(meta).to_string());
    }
    payload
}

/// The node's insert, its vector and payload taken from it.
fn new_node(tree: &str, base: u32, node: &mut ReferenceNode) -> NewNode {
    // Parents come first, and we hold the writer lock, so the parent's
    // index is known before the batch is written.
    let attach = match node.parent {
        None => Attach::Root,
        Some(p) => Attach::Parent(NodeRef::Index(base + p as u32)),
    };
    NewNode {
        tree: tree.to_string(),
        attach,
        label: node.label,
        payload: stored_payload(node),
        embedding: std::mem::take(&mut node.embedding),
        external_id: Some(node.node_id.clone()),
    }
}

/// End of the batch starting at `start`: at most `max_nodes` nodes (and
/// the ops a WAL record holds), about `BATCH_BODY_BUDGET_BYTES` of body.
fn batch_end(bank: &Bank, sizes: &[usize], start: usize, max_nodes: usize) -> usize {
    let vector_bytes = bank.dim_count() as usize * 4 + 256;
    let mut bytes_left = BATCH_BODY_BUDGET_BYTES;
    let mut end = start;
    while end < sizes.len() && end - start < max_nodes.clamp(1, BATCH_OPS_BUDGET) {
        let bytes = vector_bytes + sizes[end];
        if end > start && bytes > bytes_left {
            break;
        }
        bytes_left = bytes_left.saturating_sub(bytes);
        end += 1;
    }
    end
}

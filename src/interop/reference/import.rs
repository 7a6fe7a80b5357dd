//! Writing a parsed reference tree into a bank.

use serde_json::Value;

use super::REFERENCE_META_FIELD;
use super::parse::{ReferenceNode, ReferenceTree};
use crate::format::MAX_PAYLOAD_BYTES;
use crate::format::payload::Payload;
use crate::format::row::encode_external_id;
use crate::interop::InteropError;
use crate::{Attach, Bank, BankError, Change, ChangeAck, NewNode, NodeRef, SyncPolicy};

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
    /// Counter bumps replayed to set `success_hits` and `retrievals`
    /// (stopgap, see [`import_tree`]).
    pub counter_bumps: u64,
    pub notes: Vec<String>,
}

/// Most body bytes per batch: half a WAL record, leaving room for the
/// compressed payloads we can only estimate (by their plain size).
const BATCH_BODY_BUDGET_BYTES: usize = 32 * 1024 * 1024;

/// Most ops per batch (a WAL record holds 65535): one per node plus one
/// per counter bump.
const BATCH_OPS_BUDGET: u64 = 60_000;

/// Bytes a counter bump takes in the WAL (a row image and its op header).
const BUMP_BYTES: usize = 160;

/// Imports `source` into tree `tree`. Everything that can be checked
/// without writing is checked first (dimensions, depths, ids, payload
/// sizes), so a bad file leaves the bank untouched. The nodes go in
/// parent-first, in batches of one WAL record each (`transact`), with
/// their counters in the same record; a file of at most `max_batch_nodes`
/// nodes (all real reference files) is one atomic write.
///
/// STOPGAP (needs a bank API; see the interop report): `NewNode` cannot
/// carry counters, flags or a creation time. Until it can, `success_hits`
/// and `retrievals` are set by replaying bumps (`Change::SuccessHit` and
/// `Change::Retrievals`, one op per bump, inside the batch's record), and
/// `created_at`, `is_consolidated` and `is_consolidated_root` are kept in
/// the `reference_meta` field only: export restores them, but the bank's
/// own flags stay unset (scans still match such nodes).
pub fn import_tree(
    bank: &mut Bank,
    tree: &str,
    source: &ReferenceTree,
    options: &ImportOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ImportReport, InteropError> {
    let mut notes = check(bank, tree, source)?;
    notes.extend(source.notes.iter().cloned());
    let payloads: Vec<Payload> = source.nodes.iter().map(stored_payload).collect();
    for (node, payload) in source.nodes.iter().zip(&payloads) {
        if payload.size_bytes() > MAX_PAYLOAD_BYTES {
            let detail = format!(
                "payload is {} bytes, the bank's limit is {MAX_PAYLOAD_BYTES}",
                payload.size_bytes()
            );
            return Err(node_error(source, node, detail));
        }
    }
    let base = bank.node_count();
    let (total, mut ids, mut counter_bumps) = (source.nodes.len() as u64, Vec::new(), 0);
    let mut start = 0;
    while start < source.nodes.len() {
        let end = batch_end(bank, source, &payloads, start, options.max_batch_nodes);
        let inserts = (start..end).map(|k| Change::Insert(new_node(tree, base, &source.nodes[k], payloads[k].clone())));
        let bumps = counter_changes(&source.nodes[start..end], base + start as u32);
        counter_bumps += bumps.iter().map(Change::op_estimate).sum::<u64>();
        let changes: Vec<Change> = inserts.chain(bumps).collect();
        let acks = bank
            .transact(&changes, options.sync)
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
        counter_bumps,
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

/// Ops one change writes (`Retrievals` writes one per node).
trait OpEstimate {
    fn op_estimate(&self) -> u64;
}

impl OpEstimate for Change {
    fn op_estimate(&self) -> u64 {
        match self {
            Change::Retrievals(ids) => ids.len() as u64,
            _ => 1,
        }
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
        BankError::BatchItem {
            position,
            source: cause,
        } if start + position < end => InteropError::Refused {
            file: source.file.clone(),
            node_id: source.nodes[start + position].node_id.clone(),
            reason: cause,
        },
        BankError::BatchItem { source: cause, .. } => InteropError::Node {
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
    let dim = bank.dim_count() as usize;
    let max_depth = u32::from(bank.manifest().max_depth);
    for node in &source.nodes {
        if node.embedding.len() != dim {
            return Err(node_error(
                source,
                node,
                format!(
                    "embedding has {} dimensions, the bank stores {dim}",
                    node.embedding.len()
                ),
            ));
        }
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
        if encode_external_id(&node.node_id).is_none() {
            return Err(node_error(
                source,
                node,
                "node_id is neither a lowercase UUID nor 1..=16 bytes of text".into(),
            ));
        }
        if let Ok(existing) = bank.resolve(&NodeRef::External(node.node_id.clone())) {
            return Err(node_error(
                source,
                node,
                format!("already in the bank as node {existing}"),
            ));
        }
    }
    // An empty tree still tells its embedding size through the placeholder:
    // importing it into a bank of another dimension is surely a mistake.
    for (id, &len) in source.placeholder_ids.iter().zip(&source.placeholder_dim_counts) {
        if len != 0 && len != dim {
            return Err(InteropError::Node {
                file: source.file.clone(),
                node_id: id.clone(),
                detail: format!("placeholder embedding has {len} dimensions, the bank stores {dim}"),
            });
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

/// Seconds as the reference writes them: an integer when whole.
fn seconds_value(unix_ms: u64) -> Value {
    if unix_ms.is_multiple_of(1000) {
        Value::from(unix_ms / 1000)
    } else {
        Value::from(unix_ms as f64 / 1000.0)
    }
}

/// The payload as stored: the file's fields plus `reference_meta`.
fn stored_payload(node: &ReferenceNode) -> Payload {
    let mut meta: serde_json::Map<String, Value> = node.extra_meta.clone().into_iter().collect();
    // STOPGAP: the row cannot take these at insert yet (see import_tree).
    if let Some(ms) = node.created_unix_ms {
        meta.insert("created_at".into(), seconds_value(ms));
    }
    if node.consolidated {
        meta.insert("is_consolidated".into(), Value::Bool(true));
    }
    if node.consolidated_root {
        meta.insert("is_consolidated_root".into(), Value::Bool(true));
    }
    let mut payload = node.payload.clone();
    if !meta.is_empty() {
        payload
            .fields
            .insert(REFERENCE_META_FIELD.into(), Value::Object(meta).to_string());
    }
    payload
}

fn new_node(tree: &str, base: u32, node: &ReferenceNode, payload: Payload) -> NewNode {
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
        payload,
        embedding: node.embedding.clone(),
        external_id: Some(node.node_id.clone()),
    }
}

/// End of the batch starting at `start`: at most `max_nodes` nodes, about
/// `BATCH_BODY_BUDGET_BYTES` of body and `BATCH_OPS_BUDGET` ops (a node
/// whose counters alone exceed that goes alone, and the bank refuses it).
fn batch_end(bank: &Bank, source: &ReferenceTree, payloads: &[Payload], start: usize, max_nodes: usize) -> usize {
    let vector_bytes = bank.dim_count() as usize * 4 + 256;
    let (mut bytes_left, mut ops_left) = (BATCH_BODY_BUDGET_BYTES, BATCH_OPS_BUDGET);
    let mut end = start;
    while end < payloads.len() && end - start < max_nodes.max(1) {
        let node = &source.nodes[end];
        let bumps = u64::from(node.success_hits) + u64::from(node.retrievals);
        let ops = 1 + bumps;
        let bytes = vector_bytes + payloads[end].size_bytes() + bumps as usize * BUMP_BYTES;
        if end > start && (bytes > bytes_left || ops > ops_left) {
            break;
        }
        bytes_left = bytes_left.saturating_sub(bytes);
        ops_left = ops_left.saturating_sub(ops);
        end += 1;
    }
    end
}

/// STOPGAP: the bumps that set the counters of `nodes` (stored from index
/// `first_id` on): success hits one by one, retrievals in rounds (a round
/// bumps every node that still needs one).
fn counter_changes(nodes: &[ReferenceNode], first_id: u32) -> Vec<Change> {
    let mut changes = Vec::new();
    for (k, node) in nodes.iter().enumerate() {
        let id = first_id + k as u32;
        changes.extend((0..node.success_hits).map(|_| Change::SuccessHit(id)));
    }
    let rounds = nodes.iter().map(|n| n.retrievals).max().unwrap_or(0);
    for round in 0..rounds {
        let due = nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.retrievals > round)
            .map(|(k, _)| first_id + k as u32)
            .collect();
        changes.push(Change::Retrievals(due));
    }
    changes
}

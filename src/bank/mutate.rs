//! The write API: insert, success hits, retrieval counts, consolidation.

use std::collections::BTreeMap;

use super::apply::check_record_size;
use super::error::shown_id;
use super::open::now_unix_ms;
use super::overlay::Overlay;
use super::scan::QueryOptions;
use super::{Bank, BankError, ExternalKey, NodeRef, SyncPolicy, external_key};
use crate::format::payload::{Payload, encode_record};
use crate::format::row::{FLAG_CONSOLIDATED, FLAG_CONSOLIDATED_ROOT, Label, NodeType, Row, encode_external_id};
use crate::format::wal::{RECORD_HEADER_SIZE_BYTES, WalOp, encode_ops_into, encode_put_node_into};
use crate::format::{MAX_PAYLOAD_BYTES, NODE_NONE};
use crate::tree::{self, MatchedNode, Placement};

/// Where to put a new node.
#[derive(Debug, Clone, PartialEq)]
pub enum Attach {
    /// Scan the tree with the node's own embedding and apply the write
    /// decision and attachment rule.
    Auto,
    /// A new top-level root.
    Root,
    /// Under this node (or beside it, if it sits at D_max).
    Parent(NodeRef),
}

#[derive(Debug, Clone, PartialEq)]
pub struct NewNode {
    pub tree: String,
    pub attach: Attach,
    pub label: Label,
    pub payload: Payload,
    pub embedding: Vec<f32>,
    pub external_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct InsertAck {
    pub id: u32,
    pub tree: String,
    pub node_type: NodeType,
    pub parent: Option<u32>,
    pub depth: u8,
    /// Auto attach only: the scan's best match at or above tau, if any.
    pub matched: Option<(u32, f32)>,
    pub lsn: u64,
}

/// One change of a [`Bank::transact`] transaction.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    Insert(NewNode),
    /// A node brought from elsewhere (another implementation's tree) with
    /// the counters, flags and creation time it had there.
    Import(NewNode, ImportedState),
    SuccessHit(u32),
    /// Retrieval counts of a used chain (each distinct node once).
    Retrievals(Vec<u32>),
}

/// What an imported node had where it came from. A consolidation recorded
/// there does not say which root a node went into, so the bank's link
/// stays empty for it (verify accepts that; a link, when set, is mutual).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ImportedState {
    pub success_hits: u32,
    pub retrievals: u32,
    pub consolidated: bool,
    pub consolidated_root: bool,
    pub created_unix_ms: Option<u64>,
}

/// What one change did; acks carry the transaction's LSN.
#[derive(Debug, Clone, PartialEq)]
pub enum ChangeAck {
    Inserted(InsertAck),
    Hit(HitAck),
    Retrieved { nodes: u32 },
}

/// A transaction being staged: its encoded ops and how to undo them.
#[derive(Default)]
pub(super) struct Txn {
    /// Whether `record` is built (not for a load, which skips the WAL).
    encode: bool,
    /// The WAL record being built: `RECORD_HEADER_SIZE_BYTES` of room for
    /// its header (filled in by the append), then the encoded ops.
    record: Vec<u8>,
    op_count: usize,
    pub(super) undo: Vec<super::overlay::Mark>,
    pub(super) acks: Vec<ChangeAck>,
    keys: Vec<ExternalKey>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HitAck {
    pub id: u32,
    pub success_hits: u32,
    /// The node is now due for consolidation.
    pub due: bool,
    pub lsn: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ConsolidateAck {
    pub source: u32,
    pub new_root: u32,
    pub lsn: u64,
}

/// What `check_content` found a new node's fields to be (its stored
/// vector goes into the caller's buffer).
struct Content {
    tree: u16,
    external_id: [u8; 16],
    id_flags: u8,
}

/// A new node built by `prepare_insert`: its row, payload record, ack and
/// external id key (its vector is in the caller's buffer).
struct Prepared {
    row: Row,
    payload_record: Vec<u8>,
    ack: InsertAck,
    key: Option<ExternalKey>,
}

/// External ids of nodes checked by [`Bank::check_insert`] and not yet
/// written, with the index each will get.
#[derive(Debug, Default)]
pub struct PendingIds {
    ids: std::collections::HashMap<ExternalKey, u32>,
    checked: u32,
}

/// Checks and L2-normalises an embedding.
pub(crate) fn normalise(embedding: &[f32], dim_count: u32) -> Result<Vec<f32>, BankError> {
    let mut out = Vec::new();
    normalise_into(embedding, dim_count, &mut out)?;
    Ok(out)
}

/// As `normalise`, into `out` (replacing what it held): an insert reuses
/// one buffer instead of allocating a vector per node.
pub(crate) fn normalise_into(embedding: &[f32], dim_count: u32, out: &mut Vec<f32>) -> Result<(), BankError> {
    // The caller's memory is read once, into `out`, and checked and scaled
    // there: a binding may hand over a NumPy array that another thread of
    // its program changes meanwhile, and a norm taken from one reading and
    // applied to another stored vectors far from unit length, which
    // `verify` then reports as damage.
    out.clear();
    out.extend_from_slice(embedding);
    let norm = checked_norm(out, dim_count)?;
    // Scaled in f64 and rounded once to f32. A multiply by the reciprocal
    // instead of a division per component: 10x cheaper on the baseline
    // x86-64 target, and it differs from dividing only when a quotient
    // falls within ~2^-52 of an f32 rounding boundary (then by one ulp).
    scale_in_place(out, 1.0 / norm);
    Ok(())
}

/// The rules an embedding must meet to be normalised (its length, finite
/// components, a norm not too small to divide by); its L2 norm in f64.
fn checked_norm(embedding: &[f32], dim_count: u32) -> Result<f64, BankError> {
    if embedding.len() != dim_count as usize {
        return Err(BankError::DimensionMismatch {
            expected: dim_count,
            found: embedding.len(),
        });
    }
    let norm = sum_of_squares(embedding).sqrt();
    if !norm.is_finite() {
        // In f64 a sum of squared finite f32 values cannot overflow, so a
        // component is NaN or infinite.
        let i = embedding.iter().position(|x| !x.is_finite()).unwrap_or(0);
        return Err(BankError::BadEmbedding(format!("component {i} is {}", embedding[i])));
    }
    if norm < 1e-12 {
        return Err(BankError::BadEmbedding(format!(
            "vector norm is {norm}: cannot normalise"
        )));
    }
    Ok(norm)
}

// The two loops of `normalise` are compiled for AVX2 as well and chosen at
// run time: the f64 arithmetic then runs 4 lanes wide instead of the
// baseline's 2 (normalising was ~18% of an insert's instructions). The
// same IEEE multiplies and adds in the same order, never contracted into
// FMAs, so both give the same bits.

fn sum_of_squares(values: &[f32]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { sum_of_squares_avx2(values) };
    }
    sum_of_squares_any(values)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sum_of_squares_avx2(values: &[f32]) -> f64 {
    sum_of_squares_any(values)
}

/// Each of `values` times `scale` in f64, rounded once to f32.
fn scale_in_place(values: &mut [f32], scale: f64) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        unsafe { scale_in_place_avx2(values, scale) };
        return;
    }
    scale_in_place_any(values, scale);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn scale_in_place_avx2(values: &mut [f32], scale: f64) {
    scale_in_place_any(values, scale);
}

#[inline(always)]
fn scale_in_place_any(values: &mut [f32], scale: f64) {
    for x in values {
        *x = (f64::from(*x) * scale) as f32;
    }
}

/// Sum of squares in f64 with eight independent accumulators, so the
/// loop vectorises instead of waiting on one chain of additions.
#[inline(always)]
fn sum_of_squares_any(values: &[f32]) -> f64 {
    const LANES: usize = 8;
    let mut acc = [0f64; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (a, x) in acc.iter_mut().zip(chunk) {
            *a += f64::from(*x) * f64::from(*x);
        }
    }
    let tail_sum: f64 = tail.iter().map(|x| f64::from(*x) * f64::from(*x)).sum();
    acc.iter().sum::<f64>() + tail_sum
}

impl Bank {
    pub fn insert(&mut self, node: NewNode) -> Result<InsertAck, BankError> {
        self.insert_with(node, None)
    }

    /// Inserts one node; `sync` overrides the bank's policy for this call.
    pub fn insert_with(&mut self, node: NewNode, sync: Option<SyncPolicy>) -> Result<InsertAck, BankError> {
        // A transaction of one: the same staging, checks and record as a
        // batch (an error is the node's own, not a batch item's).
        let change = Change::Insert(node);
        match self.transact(std::slice::from_ref(&change), sync) {
            Ok(mut acks) => match acks.pop() {
                Some(ChangeAck::Inserted(ack)) => Ok(ack),
                other => unreachable!("an insert is acked as inserted, not {other:?}"),
            },
            Err(BankError::BatchItem { error, .. }) => Err(*error),
            Err(e) => Err(e),
        }
    }

    /// Inserts many nodes as one WAL record: all or none, one write and at
    /// most one fsync for the lot (bulk imports). Each node is placed with
    /// the ones before it already in the tree. An error names the node.
    pub fn insert_batch(&mut self, nodes: &[NewNode], sync: Option<SyncPolicy>) -> Result<Vec<InsertAck>, BankError> {
        let changes: Vec<Change> = nodes.iter().cloned().map(Change::Insert).collect();
        let acks = self.transact(&changes, sync)?;
        Ok(acks
            .into_iter()
            .filter_map(|a| if let ChangeAck::Inserted(a) = a { Some(a) } else { None })
            .collect())
    }

    /// Applies a list of changes as one WAL record: all of them or none
    /// after a crash (an agent's episode: its new nodes, the retrieval
    /// counts of the chains it used and its success hits). Each change sees
    /// the ones before it. An error names the change's position.
    pub fn transact(&mut self, changes: &[Change], sync: Option<SyncPolicy>) -> Result<Vec<ChangeAck>, BankError> {
        self.transact_staged(changes, None, sync)
    }

    /// As [`Bank::transact`], with the inserts' embeddings given as one
    /// row-major column (`changes.len() * dim_count` floats, row k for
    /// change k, whatever the change) instead of one `Vec` per node, whose
    /// `embedding` must then be empty: spares a batch from an array (the
    /// Python binding's `insert_many`) one allocation and copy per row.
    pub fn transact_column(
        &mut self,
        changes: &[Change],
        column: &[f32],
        sync: Option<SyncPolicy>,
    ) -> Result<Vec<ChangeAck>, BankError> {
        check_column(changes, column, self.manifest.dim_count)?;
        self.transact_staged(changes, Some(column), sync)
    }

    fn transact_staged(
        &mut self,
        changes: &[Change],
        column: Option<&[f32]>,
        sync: Option<SyncPolicy>,
    ) -> Result<Vec<ChangeAck>, BankError> {
        self.check_writable()?;
        let mut txn = self.stage_all(changes, column, true)?;
        if txn.op_count == 0 {
            self.keep_record_buffer(txn.record);
            return Ok(txn.acks);
        }
        let logged = self.log(txn.op_count as u16, &mut txn.record, txn.undo, sync);
        self.keep_record_buffer(txn.record);
        let lsn = match logged {
            Ok(lsn) => lsn,
            Err(e) => {
                self.forget_external_ids(&txn.keys)?;
                return Err(e);
            }
        };
        set_lsn(&mut txn.acks, lsn);
        Ok(txn.acks)
    }

    /// Stages every change (undoably); on an error undoes them all and
    /// names the change. `encode` builds the WAL record body too.
    /// Undoes a staged transaction (newest change first) and frees its
    /// external ids.
    pub(super) fn unstage(&mut self, txn: Txn) -> Result<(), BankError> {
        self.forget_external_ids(&txn.keys)?;
        txn.undo.into_iter().rev().for_each(|m| self.overlay.rollback(m));
        Ok(())
    }

    /// `column`, when given, holds the inserts' embeddings (row k for
    /// change k) in place of their own.
    pub(super) fn stage_all(
        &mut self,
        changes: &[Change],
        column: Option<&[f32]>,
        encode: bool,
    ) -> Result<Txn, BankError> {
        self.stage_all_watched(changes, column, encode, &mut |_: &mut Overlay| {})
    }

    /// As `stage_all`, handing the overlay to `staged` after each change
    /// is staged (a bulk load hands new vectors to its writer thread).
    pub(super) fn stage_all_watched(
        &mut self,
        changes: &[Change],
        column: Option<&[f32]>,
        encode: bool,
        staged: &mut dyn FnMut(&mut Overlay),
    ) -> Result<Txn, BankError> {
        let record = match encode {
            true => self.record_buffer(),
            false => Vec::new(),
        };
        let mut txn = Txn {
            encode,
            record,
            ..Txn::default()
        };
        let dim = self.manifest.dim_count as usize;
        let first_index = self.node_count();
        for (position, change) in changes.iter().enumerate() {
            let embedding = column.map(|c| &c[position * dim..(position + 1) * dim]);
            if let Err(e) = self.stage(change, embedding, &mut txn) {
                self.unstage(txn)?;
                return Err(BankError::BatchItem {
                    position,
                    error: Box::new(within_write(e, first_index)),
                });
            }
            staged(&mut self.overlay);
        }
        Ok(txn)
    }

    /// Builds, encodes and applies (undoably) the ops of one change.
    fn stage(&mut self, change: &Change, embedding: Option<&[f32]>, txn: &mut Txn) -> Result<(), BankError> {
        let (ops, ack) = match change {
            Change::Insert(node) => return self.stage_node(node, None, embedding, txn),
            Change::Import(node, state) => return self.stage_node(node, Some(state), embedding, txn),
            Change::SuccessHit(index) => {
                let (op, ack) = self.prepare_hit(*index)?;
                (vec![op], ChangeAck::Hit(ack))
            }
            Change::Retrievals(indexes) => {
                let ops = self.prepare_retrievals(indexes)?;
                let ack = ChangeAck::Retrieved {
                    nodes: ops.len() as u32,
                };
                (ops, ack)
            }
        };
        txn.op_count += ops.len();
        if txn.encode {
            encode_ops_into(&ops, &mut txn.record);
            check_record_size(txn.op_count, txn.record.len() - RECORD_HEADER_SIZE_BYTES)?;
        }
        txn.undo.push(self.apply_txn_undoable(ops)?);
        txn.acks.push(ack);
        Ok(())
    }

    /// Stages one new node: built, encoded and applied straight from its
    /// parts, its vector normalised into the writer's reused buffer (a
    /// batch of inserts allocates no vector per node and copies each only
    /// into the record and the overlay).
    fn stage_node(
        &mut self,
        node: &NewNode,
        imported: Option<&ImportedState>,
        embedding: Option<&[f32]>,
        txn: &mut Txn,
    ) -> Result<(), BankError> {
        let mut vector = self
            .writer
            .as_mut()
            .map(|w| std::mem::take(&mut w.vector_buffer))
            .unwrap_or_default();
        let staged = self.stage_node_in(node, imported, embedding.unwrap_or(&node.embedding), &mut vector, txn);
        if let Some(w) = self.writer.as_mut() {
            w.vector_buffer = vector;
        }
        staged
    }

    fn stage_node_in(
        &mut self,
        node: &NewNode,
        imported: Option<&ImportedState>,
        embedding: &[f32],
        vector: &mut Vec<f32>,
        txn: &mut Txn,
    ) -> Result<(), BankError> {
        let Prepared {
            mut row,
            payload_record,
            ack,
            key,
        } = self.prepare_insert(node, embedding, vector)?;
        if let Some(state) = imported {
            apply_imported_state(&mut row, state)?;
        }
        txn.op_count += 1;
        if txn.encode {
            encode_put_node_into(&row, vector, &payload_record, &mut txn.record);
            check_record_size(txn.op_count, txn.record.len() - RECORD_HEADER_SIZE_BYTES)?;
        }
        txn.undo.push(self.apply_prepared_node(row, vector, payload_record)?);
        if let Some(key) = key {
            // Visible at once, so a duplicate later in the batch is caught.
            txn.keys.push(key);
            self.with_external_ids(|ids| ids.insert(key, ack.id))?;
        }
        txn.acks.push(ChangeAck::Inserted(ack));
        Ok(())
    }

    /// The writer's kept buffer (see `Writer::record_buffer`), emptied
    /// but for room for a WAL record header.
    pub(super) fn record_buffer(&mut self) -> Vec<u8> {
        let mut record = self
            .writer
            .as_mut()
            .map(|w| std::mem::take(&mut w.record_buffer))
            .unwrap_or_default();
        record.clear();
        record.resize(RECORD_HEADER_SIZE_BYTES, 0);
        record
    }

    /// Keeps a record buffer for the next transaction, up to
    /// `KEPT_RECORD_BYTES` of capacity.
    pub(super) fn keep_record_buffer(&mut self, record: Vec<u8>) {
        if let Some(w) = self.writer.as_mut()
            && record.capacity() <= super::KEPT_RECORD_BYTES
        {
            w.record_buffer = record;
        }
    }

    fn forget_external_ids(&self, keys: &[ExternalKey]) -> Result<(), BankError> {
        self.with_external_ids(|ids| {
            for key in keys {
                ids.remove(key);
            }
        })
    }

    /// Validates a node and builds its op against the current state,
    /// without changing anything. The ack's lsn is filled in by the caller.
    /// `embedding` is the node's own or its row of a load's column.
    fn prepare_insert(&self, node: &NewNode, embedding: &[f32], vector: &mut Vec<f32>) -> Result<Prepared, BankError> {
        let Content {
            tree,
            external_id,
            id_flags,
        } = self.check_content(node, embedding, Some(&mut *vector))?;
        let (placement, matched) = self.placement(tree, &node.tree, &node.attach, vector)?;
        let index = self.node_count();
        let payload_record = encode_record(index, &node.payload);
        let (node_type, parent, depth) = match placement {
            Placement::Root => (NodeType::Root, None, 1),
            Placement::Residual { parent, depth } => (NodeType::Residual, Some(parent), depth),
        };
        let checks = self.vector_checks(vector).expect("storable_vector made it exact");
        let row = Row {
            index,
            parent: parent.unwrap_or(NODE_NONE),
            tree,
            node_type,
            label: node.label,
            depth,
            flags: id_flags,
            success_hits: 0,
            retrievals: 0,
            link: NODE_NONE,
            vector_crc32: checks.crc32,
            payload_offset_bytes: self.overlay.payload_end_bytes,
            payload_size_bytes: payload_record.len() as u32,
            vector_sum32: checks.sum32,
            created_unix_ms: now_unix_ms(),
            external_id,
            qvector_sum32: checks.qsum32,
        };
        let ack = InsertAck {
            id: index,
            tree: node.tree.clone(),
            node_type,
            parent,
            depth,
            matched,
            lsn: 0,
        };
        let key = (id_flags != 0).then_some(external_key(external_id, id_flags));
        Ok(Prepared {
            row,
            payload_record,
            ack,
            key,
        })
    }

    /// The rules a new node meets wherever it goes: a known tree, a
    /// storable vector, a scenario, the payload limit and a free, well
    /// formed external id. Shared by every write and by `check_insert`.
    /// `vector` receives the normalised, storable vector; None checks the
    /// embedding without making it (`check_insert` needs only the verdict).
    fn check_content(
        &self,
        node: &NewNode,
        embedding: &[f32],
        vector: Option<&mut Vec<f32>>,
    ) -> Result<Content, BankError> {
        let tree = self.tree_index(&node.tree)?;
        match vector {
            Some(vector) => {
                normalise_into(embedding, self.manifest.dim_count, vector)?;
                *vector = self.storable_vector(std::mem::take(vector));
            }
            None => {
                checked_norm(embedding, self.manifest.dim_count)?;
            }
        }
        if node.payload.scenario.trim().is_empty() {
            return Err(BankError::EmptyScenario);
        }
        if node.payload.size_bytes() > MAX_PAYLOAD_BYTES {
            return Err(BankError::PayloadTooLarge {
                size_bytes: node.payload.size_bytes(),
                scenario_bytes: node.payload.scenario.len(),
                limit_bytes: MAX_PAYLOAD_BYTES,
            });
        }
        let (external_id, id_flags) = self.check_external_id(node.external_id.as_deref())?;
        Ok(Content {
            tree,
            external_id,
            id_flags,
        })
    }

    /// Checks a node that a later write will insert, without writing or
    /// holding it: every rule of an insert except where it goes (its
    /// parent, the scan), by the insert's own code. `embedding` replaces
    /// the node's own (a row of a column load). `pending` holds the
    /// external ids of nodes checked before it and not written yet: the
    /// node's id must differ from them too, and joins them. For inputs
    /// too large to stage whole (`check_changes` checks placement too).
    pub fn check_insert(
        &self,
        node: &NewNode,
        embedding: Option<&[f32]>,
        pending: &mut PendingIds,
    ) -> Result<(), BankError> {
        let content = self.check_content(node, embedding.unwrap_or(&node.embedding), None)?;
        // The index the node will get if every node checked is written.
        let index = self.node_count().saturating_add(pending.checked);
        pending.checked = pending.checked.saturating_add(1);
        if content.id_flags == 0 {
            return Ok(());
        }
        let key = external_key(content.external_id, content.id_flags);
        match pending.ids.insert(key, index) {
            None => Ok(()),
            // Not stored: an item checked earlier in the same write.
            Some(earlier) => Err(BankError::DuplicateInWrite {
                id: node.external_id.clone().unwrap_or_default(),
                first_item: earlier.saturating_sub(self.node_count()),
            }),
        }
    }

    /// A dry run of `transact` and `load`: stages `changes` with the very
    /// code they use (placement, parents, imported state, external ids)
    /// and undoes them. Nothing is written; the acks are what a write now
    /// would return (lsn 0). Holds the staged nodes in memory meanwhile.
    pub fn check_changes(&mut self, changes: &[Change]) -> Result<Vec<ChangeAck>, BankError> {
        self.check_writable()?;
        let mut txn = self.stage_all(changes, None, false)?;
        let acks = std::mem::take(&mut txn.acks);
        self.unstage(txn)?;
        Ok(acks)
    }

    fn check_external_id(&self, text: Option<&str>) -> Result<([u8; 16], u8), BankError> {
        let Some(text) = text else {
            return Ok(([0; 16], 0));
        };
        // All digits would read as a node index on a command line or in a
        // URL path (and JSON tells the two apart only by quoting).
        if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(BankError::BadExternalId {
                id: shown_id(text),
                detail: "must not be all digits (digits name a node index)".into(),
            });
        }
        let (key, flags) = encode_external_id(text).ok_or_else(|| BankError::BadExternalId {
            id: shown_id(text),
            detail: "must be a lowercase hyphenated UUID or 1..=16 bytes of text".into(),
        })?;
        if let Some(existing) = self.with_external_ids(|ids| ids.get(&external_key(key, flags)).copied())? {
            return Err(BankError::DuplicateExternalId {
                id: text.to_string(),
                existing,
            });
        }
        Ok((key, flags))
    }

    fn placement(
        &self,
        tree: u16,
        tree_name: &str,
        attach: &Attach,
        vector: &[f32],
    ) -> Result<(Placement, Option<(u32, f32)>), BankError> {
        let max_depth = self.manifest.max_depth;
        match attach {
            Attach::Root => Ok((Placement::Root, None)),
            Attach::Auto => {
                let best = self
                    .scan_tree(tree, vector, &QueryOptions::default())?
                    .into_iter()
                    .next();
                let matched = best.map(|c| -> Result<_, BankError> {
                    let row = self.row(c.index)?;
                    Ok((
                        MatchedNode {
                            index: c.index,
                            depth: row.depth,
                            parent: row.parent(),
                        },
                        c.score,
                    ))
                });
                let matched = matched.transpose()?;
                Ok((
                    tree::place(matched.map(|m| m.0), max_depth),
                    matched.map(|(m, s)| (m.index, s)),
                ))
            }
            Attach::Parent(node) => {
                let index = self.resolve(node)?;
                let row = self.row(index)?;
                if row.tree != tree {
                    return Err(BankError::WrongTree {
                        node: index,
                        node_tree: self.tree_name(row.tree).to_string(),
                        wanted: tree_name.to_string(),
                    });
                }
                let m = MatchedNode {
                    index,
                    depth: row.depth,
                    parent: row.parent(),
                };
                Ok((tree::place(Some(m), max_depth), None))
            }
        }
    }

    /// Counts a success hit on the matched node of a successful episode.
    pub fn success_hit(&mut self, index: u32) -> Result<HitAck, BankError> {
        self.check_writable()?;
        let (op, mut ack) = self.prepare_hit(index)?;
        ack.lsn = self.commit(vec![op], None)?;
        Ok(ack)
    }

    fn prepare_hit(&self, index: u32) -> Result<(WalOp, HitAck), BankError> {
        let mut row = self.row(index)?;
        row.success_hits = row.success_hits.saturating_add(1);
        let ack = HitAck {
            id: index,
            success_hits: row.success_hits,
            due: tree::is_due(&row, self.manifest.consolidate_after),
            lsn: 0,
        };
        Ok((WalOp::PutRow { row }, ack))
    }

    /// Bumps `retrievals` of every node of a chain that was used, in one
    /// transaction. Returns its LSN (with no ids nothing is written and
    /// the LSN of the last committed record is returned).
    pub fn record_retrievals(&mut self, indexes: &[u32]) -> Result<u64, BankError> {
        self.check_writable()?;
        let ops = self.prepare_retrievals(indexes)?;
        if ops.is_empty() {
            return Ok(self.last_lsn());
        }
        self.commit(ops, None)
    }

    /// One row update per distinct node (a node listed twice counts once).
    fn prepare_retrievals(&self, indexes: &[u32]) -> Result<Vec<WalOp>, BankError> {
        let mut ops = Vec::with_capacity(indexes.len());
        let mut seen = std::collections::BTreeSet::new();
        for &index in indexes.iter().filter(|&&i| seen.insert(i)) {
            let mut row = self.row(index)?;
            row.retrievals = row.retrievals.saturating_add(1);
            ops.push(WalOp::PutRow { row });
        }
        Ok(ops)
    }

    /// Writes the distilled payload of `index`'s chain as a new root and
    /// flags `index` consolidated, atomically (one WAL record). Optimistic:
    /// fails cleanly if `index` was consolidated meanwhile.
    pub fn consolidate(&mut self, index: u32, fields: BTreeMap<String, String>) -> Result<ConsolidateAck, BankError> {
        self.check_writable()?;
        let mut source = self.row(index)?;
        if source.is_consolidated() {
            return Err(BankError::AlreadyConsolidated {
                node: index,
                root: source.link,
            });
        }
        if source.node_type == NodeType::Root {
            return Err(BankError::NotConsolidatable {
                node: index,
                reason: "a root is already self-contained".into(),
            });
        }
        let payload = Payload {
            scenario: self.payload(index)?.scenario,
            fields,
        };
        if payload.size_bytes() > MAX_PAYLOAD_BYTES {
            return Err(BankError::PayloadTooLarge {
                size_bytes: payload.size_bytes(),
                scenario_bytes: payload.scenario.len(),
                limit_bytes: MAX_PAYLOAD_BYTES,
            });
        }
        let vector = self.vector(index)?;
        let new_root = self.node_count();
        let payload_record = encode_record(new_root, &payload);
        let root_row = Row {
            index: new_root,
            parent: NODE_NONE,
            tree: source.tree,
            node_type: NodeType::Root,
            label: Label::Success,
            depth: 1,
            flags: FLAG_CONSOLIDATED_ROOT,
            success_hits: 0,
            retrievals: 0,
            link: index,
            vector_crc32: source.vector_crc32,
            payload_offset_bytes: self.overlay.payload_end_bytes,
            payload_size_bytes: payload_record.len() as u32,
            vector_sum32: source.vector_sum32,
            created_unix_ms: now_unix_ms(),
            external_id: [0; 16],
            qvector_sum32: source.qvector_sum32,
        };
        source.flags |= FLAG_CONSOLIDATED;
        source.link = new_root;
        let ops = vec![
            WalOp::PutNode {
                row: root_row,
                vector,
                payload_record,
            },
            WalOp::PutRow { row: source },
        ];
        let lsn = self.commit(ops, None)?;
        Ok(ConsolidateAck {
            source: index,
            new_root,
            lsn,
        })
    }
}

/// A column holds one row per change, and its nodes carry no embedding
/// of their own.
fn check_column(changes: &[Change], column: &[f32], dim_count: u32) -> Result<(), BankError> {
    if column.len() != changes.len() * dim_count as usize {
        return Err(BankError::DimensionMismatch {
            expected: dim_count,
            found: column.len() / changes.len().max(1),
        });
    }
    for (position, change) in changes.iter().enumerate() {
        if let Change::Insert(node) | Change::Import(node, _) = change
            && !node.embedding.is_empty()
        {
            return Err(BankError::BatchItem {
                position,
                error: Box::new(BankError::BadEmbedding(
                    "a node of a column batch carries its own embedding too".into(),
                )),
            });
        }
    }
    Ok(())
}

pub(super) fn set_lsn(acks: &mut [ChangeAck], lsn: u64) {
    for ack in acks {
        match ack {
            ChangeAck::Inserted(a) => a.lsn = lsn,
            ChangeAck::Hit(a) => a.lsn = lsn,
            ChangeAck::Retrieved { .. } => {}
        }
    }
}

/// Sets an imported node's counters, flags and creation time on its row.
fn apply_imported_state(row: &mut Row, state: &ImportedState) -> Result<(), BankError> {
    if state.consolidated_root && row.node_type != NodeType::Root {
        return Err(BankError::NotConsolidatable {
            node: row.index,
            reason: "only a top-level root can be a consolidated root".into(),
        });
    }
    row.success_hits = state.success_hits;
    row.retrievals = state.retrievals;
    if state.consolidated {
        row.flags |= FLAG_CONSOLIDATED;
    }
    if state.consolidated_root {
        row.flags |= FLAG_CONSOLIDATED_ROOT;
    }
    if let Some(ms) = state.created_unix_ms {
        row.created_unix_ms = ms;
    }
    Ok(())
}

/// A stage error of a write whose nodes are numbered from `first_index`:
/// an external id "already used" by one of them (staged, then undone) is
/// named as the write's own item, not as a node that is not stored.
fn within_write(e: BankError, first_index: u32) -> BankError {
    match e {
        BankError::DuplicateExternalId { id, existing } if existing >= first_index => BankError::DuplicateInWrite {
            id,
            first_item: existing - first_index,
        },
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The run-time choice (AVX2 here when the CPU has it) gives the bits
    /// of the baseline loops, for lengths with and without a tail and
    /// components across the f32 range, subnormals included.
    #[test]
    fn normalising_gives_the_same_bits_on_every_path() {
        let mut rng = crate::storage::sim::Rng(0x9E37_79B9_7F4A_7C15);
        for len in [1usize, 3, 7, 8, 9, 63, 384, 768, 1537] {
            for _ in 0..40 {
                let v: Vec<f32> = (0..len)
                    .map(|_| {
                        let mantissa = rng.next_f32() - 0.5;
                        mantissa * 2f32.powi((rng.next() % 250) as i32 - 140)
                    })
                    .collect();
                let sum = sum_of_squares(&v);
                assert_eq!(sum.to_bits(), sum_of_squares_any(&v).to_bits(), "len {len}");
                let scale = 1.0 / sum.sqrt().max(1e-300);
                let (mut fast, mut plain) = (v.clone(), v.clone());
                scale_in_place(&mut fast, scale);
                scale_in_place_any(&mut plain, scale);
                let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&fast), bits(&plain), "len {len}");
            }
        }
    }
}

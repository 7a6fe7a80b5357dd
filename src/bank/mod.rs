//! The bank API: ties the format, the storage and the tree rules together.
//!
//! State = checkpoint (data files, `base::Base`) + overlay (everything
//! committed since, rebuilt from the WAL on open). Mutations are validated
//! against the overlay, appended to the WAL as one record, then synced as
//! the sync policy says; checkpoints fold the overlay into the data files.

mod apply;
mod base;
mod checkpoint;
mod compact;
mod error;
pub mod kernels;
mod load;
mod mutate;
mod open;
mod overlay;
mod scan;
mod segment_writer;
mod stats;
mod verify;
mod write_ahead;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub use checkpoint::PreparedCheckpoint;
pub use compact::{CompactReport, FREEZING_MARK_FILE, FreezeReport};
pub(crate) use error::shown_id;
pub use error::{BankError, ErrorKind};
pub use load::BatchResult;
pub use mutate::{Attach, Change, ChangeAck, ConsolidateAck, HitAck, ImportedState, InsertAck, NewNode, PendingIds};
pub use open::{BankConfig, OpenOptions};
pub use scan::{Match, OptionsKey, PreparedQuery, QueryOptions, dot};
pub use stats::{Stats, StatsTally, TreeStats};
pub use verify::{Problem, VerifyReport, VerifyScope};

use crate::format::manifest::{Manifest, Precision};
use crate::format::payload::{Payload, decode_record};
use crate::format::row::Row;
use crate::storage::wal::WalWriter;
use crate::storage::{AlignedFloats, Storage};
use crate::tree::{self, TreeStyle};
use base::Base;
use overlay::Overlay;

/// When the WAL is fsynced relative to acknowledging a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPolicy {
    /// fsync before every acknowledgement.
    Always,
    /// fsync once `records` records or `interval_ms` have accumulated; a
    /// write is acknowledged when the sync covering it completes.
    Batch { records: u32, interval_ms: u64 },
    /// Never fsync except at checkpoints and close; a process crash loses
    /// nothing, a power loss may lose what was written since.
    None,
}

impl SyncPolicy {
    pub fn parse(text: &str) -> Option<SyncPolicy> {
        match text {
            "always" => Some(SyncPolicy::Always),
            "batch" => Some(SyncPolicy::Batch {
                records: 1000,
                interval_ms: 100,
            }),
            "none" => Some(SyncPolicy::None),
            _ => None,
        }
    }
}

/// How a node is named by callers: its index, or its external id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeRef {
    Index(u32),
    External(String),
}

/// A node with everything decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInfo {
    pub row: Row,
    pub tree_name: String,
    pub payload: Payload,
}

/// Whether a consolidation flag with this `link` is in force for a handle
/// that sees `visible_count` nodes: always for an imported one (no link),
/// otherwise once the root it went into is visible. A reader's mapping can
/// show a later checkpoint's flag on a node whose new root it cannot see.
#[inline]
pub(crate) fn consolidation_in_force(link: u32, visible_count: u32) -> bool {
    // `|`, not `||`: the scan's filter stays free of branches.
    (link == crate::format::NODE_NONE) | (link < visible_count)
}

/// An external id as stored: its 16 bytes and whether they are a UUID's
/// (the same bytes as text and as a UUID are two different ids).
pub(crate) type ExternalKey = ([u8; 16], bool);

pub(crate) fn external_key(bytes: [u8; 16], flags: u8) -> ExternalKey {
    (bytes, flags & crate::format::row::FLAG_EXTERNAL_ID_UUID != 0)
}

struct Writer {
    /// The thread writing committed vectors ahead of the checkpoint, when
    /// asked for (`write_vectors_ahead`). Declared before `_lock`, so it is
    /// dropped first: its drop waits for the thread's last write, and no
    /// other writer may open the bank before that.
    ahead: Option<write_ahead::WriteAhead>,
    _lock: Box<dyn Send + Sync>,
    wal: WalWriter,
    policy: SyncPolicy,
    /// Set after any failed write or fsync: the on-disk state is unknown.
    poisoned: Option<String>,
    /// Set instead of `poisoned` by a failure under a shared borrow (in
    /// `prepare_checkpoint`), with the same effect.
    poisoned_shared: std::sync::OnceLock<String>,
    /// A checkpoint run after a durable commit failed (the commit stands).
    checkpoint_failure: Option<String>,
    last_sync: Instant,
    checkpoint_wal_bytes: u64,
    /// Commits leave the checkpoint to the caller (`defer_checkpoints`).
    checkpoints_deferred: bool,
    /// Checkpoints start their WAL in the retired one's file
    /// (`recycle_wals`).
    recycle_wals: bool,
    /// The WAL record buffer of the last commit, kept for the next one
    /// (up to `KEPT_RECORD_BYTES`): a bulk insert's transactions of a few
    /// MB each then reuse its pages instead of faulting fresh ones. Ops
    /// are encoded into it after room for the record header, and it is
    /// written as it is (`WalWriter::append_framed`).
    record_buffer: Vec<u8>,
    /// The vector of the node being staged, normalised into this buffer
    /// (reused: no allocation per inserted node).
    vector_buffer: Vec<f32>,
    /// A bulk load's piece buffers, kept for the next load (at most
    /// `load::KEPT_LOAD_PIECES`): an import is a load per 64 MiB group, and
    /// fresh buffers for each one, grown by doubling, cost a copy and
    /// fresh pages (slow on this project's VMs) for every piece.
    load_pieces: Vec<AlignedFloats>,
}

const KEPT_RECORD_BYTES: usize = 16 << 20;

pub struct Bank {
    storage: Arc<dyn Storage>,
    manifest: Manifest,
    base: Base,
    overlay: Overlay,
    writer: Option<Writer>,
    /// External id -> index, built on first use (O(N) once).
    external_ids: Mutex<Option<HashMap<ExternalKey, u32>>>,
    /// Threads a query scan may use (see `set_query_threads`).
    query_threads: usize,
    /// Where the WAL records this handle read end (`has_news`); None for
    /// a writer, and for a reader that found the WAL stale.
    wal_seen: Option<crate::storage::wal::WalPosition>,
}

impl Bank {
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn dim_count(&self) -> u32 {
        self.manifest.dim_count
    }

    pub fn node_count(&self) -> u32 {
        self.overlay.total_count()
    }

    /// How the vector column is stored (fixed at `init`).
    pub fn precision(&self) -> Precision {
        self.manifest.precision
    }

    /// Lets each query split its scan of the checkpointed column across up
    /// to `threads` threads (0 and 1: the calling thread only). Results
    /// are identical for every thread count; small banks use fewer
    /// threads than asked, as starting one costs more than it saves.
    pub fn set_query_threads(&mut self, threads: usize) {
        self.query_threads = threads.max(1);
    }

    pub fn query_threads(&self) -> usize {
        self.query_threads
    }

    /// The vector as this bank stores it: rounded to the nearest f16 in an
    /// f16 bank (kept as f32 in the WAL and the overlay), so a node scores
    /// the same before and after its checkpoint.
    pub(crate) fn storable_vector(&self, mut vector: Vec<f32>) -> Vec<f32> {
        if self.manifest.precision == Precision::F16 {
            kernels::quant::round_to_f16(&mut vector);
        }
        vector
    }

    /// The check fields of a row holding `vector` (its CRC and lane sums
    /// over the bytes the data files will hold: the f16 bytes in an f16
    /// bank, plus the int8 row in an int8 bank), or None if this bank
    /// cannot hold these values exactly (a WAL vector an f16 bank never
    /// wrote). Every writer of rows takes them from here.
    pub(crate) fn vector_checks(&self, vector: &[f32]) -> Option<VectorChecks> {
        let m = &self.manifest;
        let f16_bytes;
        let stored: &[u8] = match m.precision {
            // The f32 bytes are the vector's own: no copy.
            Precision::F32 | Precision::Int8 => bytemuck::cast_slice(vector),
            Precision::F16 if kernels::quant::is_f16_exact(vector) => {
                let mut bytes = vec![0u8; vector.len() * 2];
                kernels::quant::encode_f16(vector, &mut bytes);
                f16_bytes = bytes;
                &f16_bytes
            }
            Precision::F16 => return None,
        };
        let qrow = m.precision.qvector_stride_bytes(m.dim_count).map(|qstride| {
            let mut qrow = vec![0u8; qstride as usize];
            kernels::quant::encode_int8_row(vector, &mut qrow);
            qrow
        });
        Some(VectorChecks::of_stored(m.version, stored, qrow.as_deref()))
    }

    pub fn is_writer(&self) -> bool {
        self.writer.is_some()
    }

    pub fn tree_names(&self) -> Vec<String> {
        self.manifest.trees.iter().map(|t| t.name.clone()).collect()
    }

    pub fn tree_index(&self, name: &str) -> Result<u16, BankError> {
        self.manifest.tree_index(name).ok_or_else(|| BankError::UnknownTree {
            name: name.to_string(),
            known: self.tree_names().join(", "),
        })
    }

    pub fn tree_name(&self, tree: u16) -> &str {
        &self.manifest.trees[usize::from(tree)].name
    }

    /// LSN of the newest record in this writer's WAL (0: none yet, or a
    /// reader).
    pub(crate) fn last_lsn(&self) -> u64 {
        self.writer.as_ref().map_or(0, |w| w.wal.next_lsn() - 1)
    }

    /// Every record with an LSN below this is durable on disk.
    pub fn durable_below_lsn(&self) -> u64 {
        self.writer.as_ref().map_or(0, |w| w.wal.synced_below())
    }

    /// The newest image of a row.
    pub fn row(&self, index: u32) -> Result<Row, BankError> {
        if let Some(row) = self.overlay.row(index) {
            return Ok(row.clone());
        }
        if index < self.base.node_count {
            let mut row = self.base.row(index)?;
            self.hide_future_consolidation(&mut row);
            return Ok(row);
        }
        Err(BankError::UnknownNode(index.to_string()))
    }

    /// A reader's mapping shows rows a later checkpoint of the writer
    /// rewrote in place: a consolidation into a root this handle cannot
    /// see yet is hidden until `refresh`, so the source stays matchable and
    /// its chain complete.
    pub(crate) fn hide_future_consolidation(&self, row: &mut Row) {
        if !consolidation_in_force(row.link, self.node_count()) {
            row.flags &= !crate::format::row::FLAG_CONSOLIDATED;
            row.link = crate::format::NODE_NONE;
        }
    }

    pub fn payload(&self, index: u32) -> Result<Payload, BankError> {
        let row = self.row(index)?;
        if index >= self.overlay.base_count {
            let record = self.overlay.payload_record(index);
            // Replay checked the record's framing and CRC, not what it
            // holds; the WAL record's offset is no longer known here.
            return decode_record(record, index).map_err(|e| BankError::Corrupt {
                file: self.storage.describe(crate::storage::WAL_FILE),
                offset_bytes: 0,
                detail: format!("the payload of node {index}, from a WAL record: {e}"),
            });
        }
        self.base.payload(&row)
    }

    /// The node's normalised vector (checked against its CRC).
    pub fn vector(&self, index: u32) -> Result<Vec<f32>, BankError> {
        let row = self.row(index)?;
        if index >= self.overlay.base_count {
            return Ok(self.overlay.vector(index).to_vec());
        }
        self.base.vector(&row)
    }

    pub fn node(&self, index: u32) -> Result<NodeInfo, BankError> {
        let row = self.row(index)?;
        let payload = self.payload(index)?;
        let tree_name = self.tree_name(row.tree).to_string();
        Ok(NodeInfo {
            row,
            tree_name,
            payload,
        })
    }

    /// Resolves an index or external id to a node index.
    pub fn resolve(&self, node: &NodeRef) -> Result<u32, BankError> {
        match node {
            NodeRef::Index(i) if *i < self.node_count() => Ok(*i),
            NodeRef::Index(i) => Err(BankError::UnknownNode(i.to_string())),
            NodeRef::External(text) => {
                let (bytes, flags) = crate::format::row::encode_external_id(text)
                    .ok_or_else(|| BankError::UnknownNode(error::shown_id(text)))?;
                self.with_external_ids(|ids| ids.get(&external_key(bytes, flags)).copied())?
                    .ok_or_else(|| BankError::UnknownNode(error::shown_id(text)))
            }
        }
    }

    fn with_external_ids<T>(&self, f: impl FnOnce(&mut HashMap<ExternalKey, u32>) -> T) -> Result<T, BankError> {
        let mut slot = self.external_ids.lock().unwrap();
        if slot.is_none() {
            let mut map = HashMap::new();
            for index in 0..self.node_count() {
                let row = self.row(index)?;
                if row.external_id_text().is_none() {
                    continue;
                }
                if let Some(first) = map.insert(external_key(row.external_id, row.flags), index) {
                    // Inserts refuse a used id, so two rows with one id are
                    // damage: answering with either would be a guess.
                    return Err(self.duplicate_external_id(first, &row));
                }
            }
            *slot = Some(map);
        }
        Ok(f(slot.as_mut().expect("just built")))
    }

    /// The corruption error for `row`, whose external id row `first`
    /// already holds: named at the later row's id field, in its segment
    /// file (or in the WAL, for a row not yet checkpointed).
    pub(crate) fn duplicate_external_id(&self, first: u32, row: &Row) -> BankError {
        let (file, offset_bytes) = if row.index < self.base.node_count {
            let segment = row.index / self.base.rows_per_segment;
            let name = crate::storage::table_segment_file(self.manifest.generation, segment);
            let field = crate::format::row::ROW_EXTERNAL_ID_OFFSET as u64;
            (name, self.row_offset_bytes(row.index) + field)
        } else {
            (crate::storage::WAL_FILE.to_string(), 0)
        };
        BankError::Corrupt {
            file: self.storage.describe(&file),
            offset_bytes,
            detail: format!(
                "node {} has the external id {:?} of node {first}",
                row.index,
                row.external_id_text().unwrap_or_default()
            ),
        }
    }

    /// Where row `index` starts in its node-table segment file.
    pub(crate) fn row_offset_bytes(&self, index: u32) -> u64 {
        u64::from(index % self.base.rows_per_segment) * crate::format::row::ROW_SIZE_BYTES as u64
    }

    /// Chain root-to-node, top-level root first.
    pub fn chain(&self, index: u32) -> Result<Vec<u32>, BankError> {
        tree::chain(index, |i| self.row(i))
    }

    /// The chain rendered as prompt text, in the tree's style.
    pub fn render_chain(&self, index: u32) -> Result<String, BankError> {
        let chain = self.chain(index)?;
        let mut entries = Vec::with_capacity(chain.len());
        for i in &chain {
            entries.push((self.row(*i)?.label, self.payload(*i)?));
        }
        let style = TreeStyle::for_tree_name(self.tree_name(self.row(index)?.tree));
        let refs: Vec<_> = entries.iter().map(|(l, p)| (*l, p)).collect();
        Ok(tree::render_chain(style, &refs))
    }

    /// Nodes whose success hits reached K_cons and that are not yet
    /// consolidated, optionally within one tree, oldest first.
    pub fn due_for_consolidation(&self, tree_name: Option<&str>) -> Result<Vec<u32>, BankError> {
        let tree = tree_name.map(|t| self.tree_index(t)).transpose()?;
        let mut due = Vec::new();
        for index in 0..self.node_count() {
            let row = self.row(index)?;
            if tree.is_none_or(|t| t == row.tree) && tree::is_due(&row, self.manifest.consolidate_after) {
                due.push(index);
            }
        }
        Ok(due)
    }
}

/// How far a stored vector's norm may be from 1 (every vector is stored
/// normalised; f16 and rounding move it a little).
const STORED_NORM_TOLERANCE: f32 = 1e-3;

/// The norm of a stored vector that is not a unit vector (a NaN or an
/// infinite component included), or None: `verify` of segments and WAL
/// replay both refuse one that passes its checksums (a forged vector
/// would otherwise be scored, dumped and exported as it is).
pub(crate) fn off_unit_norm(vector: &[f32]) -> Option<f32> {
    // The scan's dot kernel: a plain sequential sum was half of verify's
    // time (768 dependent adds per node).
    let norm = kernels::dot(vector, vector).sqrt();
    // A NaN norm (a NaN component) is within no tolerance: checked by
    // name, as every comparison with it is false.
    (norm.is_nan() || (norm - 1.0).abs() > STORED_NORM_TOLERANCE).then_some(norm)
}

/// The fields of a row that check its vector (FORMAT.md "Node row"): the
/// CRC (`verify`, single reads, maintenance) and the lane sums the scan
/// kernels compute on the fly (first scan of a vector and its int8 row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VectorChecks {
    pub crc32: u32,
    pub sum32: u32,
    pub qsum32: u32,
}

impl VectorChecks {
    /// Of a vector's stored bytes and, in an int8 bank, its whole int8
    /// row; a format-1 bank has no lane sums (zero).
    pub(crate) fn of_stored(version: u32, stored: &[u8], qrow: Option<&[u8]>) -> VectorChecks {
        let sums = version >= 2;
        VectorChecks {
            crc32: crate::format::crc32(stored),
            sum32: if sums { crate::format::lane_sum32(stored) } else { 0 },
            qsum32: match qrow {
                Some(qrow) if sums => crate::format::lane_sum32(qrow),
                _ => 0,
            },
        }
    }

    pub(crate) fn of_row(row: &Row) -> VectorChecks {
        VectorChecks {
            crc32: row.vector_crc32,
            sum32: row.vector_sum32,
            qsum32: row.qvector_sum32,
        }
    }

    pub(crate) fn set_in(self, row: &mut Row) {
        row.vector_crc32 = self.crc32;
        row.vector_sum32 = self.sum32;
        row.qvector_sum32 = self.qsum32;
    }
}

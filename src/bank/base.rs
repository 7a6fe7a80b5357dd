//! The checkpointed part of a bank: node-table and vector segments mapped
//! on first use, payload records read on demand. A writer's open maps
//! nothing and reads nothing here, so its open cost does not grow with the
//! node count; a reader maps its generation's files at open (`hold_files`),
//! a few syscalls per segment, so that the writer's `compact` cannot delete
//! them from under it.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::BankError;
use super::kernels::quant::{decode_f16, encode_int8_row};
use crate::format::crc32;
use crate::format::manifest::{Manifest, Precision};
use crate::format::payload::{Payload, decode_record};
use crate::format::row::{ROW_SIZE_BYTES, Row, RowBounds};
use crate::storage::{
    Mapping, OpenMode, Storage, StorageError, StorageFile, payload_file, qvector_segment_file, table_segment_file,
    vector_segment_file,
};

/// How a damaged int8 row's problem begins (`check_qvector`): the one
/// damage compact and freeze mend rather than refuse, since their copy
/// derives every int8 row afresh (`Bank::refuse_damaged`).
pub(crate) const INT8_ROW_DIFFERS: &str = "int8 row of node";

pub(crate) struct SegmentMaps {
    pub table: Mapping,
    pub vectors: Mapping,
    /// The int8 side column (precision `Int8` only).
    pub quant: Option<Mapping>,
    /// What every row of the segment shares, if known (see `Summary`).
    pub summary: Summary,
    /// Which rows' vectors this process has checked (in a format-1 int8
    /// bank, together with their int8 rows).
    checked: RowChecks,
    /// Which rows' int8 rows this process has checked (format 2).
    qchecked: RowChecks,
    /// The rows' `vector_sum32` and `qvector_sum32`, copied from the node
    /// table when it was checked (empty when nothing is left to check):
    /// the scan compares the kernels' lane sums with these 4-byte entries
    /// instead of reading a 128-byte row per vector.
    sums: Vec<u32>,
    qsums: Vec<u32>,
}

impl SegmentMaps {
    /// Maps in, ahead of a scan, the column it reads whole: the int8 rows
    /// where the bank has them, else the vectors (`Mapping::populate`).
    fn populate(&self) {
        self.quant.as_ref().unwrap_or(&self.vectors).populate();
    }
}

/// Which column of a segment a scan step reads.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Column {
    /// The vectors (f32 or f16).
    Vectors,
    /// The int8 side column.
    Quant,
}

/// One bit per row of a segment: its vector (or int8 row) was checked.
/// The scan checks a row the first time it reads it, fused into that read
/// (the kernels' lane sums, see `Base::check_sums`; CRC in a format-1
/// bank, see `Base::check_vectors`), so a process pays for each vector
/// once and only for those it reads. Threads may race to check the same
/// row; both compute the same verdict.
struct RowChecks {
    /// Every row is known good: the writer's own checkpoint wrote them.
    all: bool,
    bits: Vec<AtomicU64>,
    /// Rows not checked yet: at zero the scan stops computing lane sums.
    unchecked: AtomicU32,
}

impl RowChecks {
    fn new(rows: u32, all: bool) -> RowChecks {
        let words = if all { 0 } else { rows.div_ceil(64) as usize };
        RowChecks {
            all,
            bits: (0..words).map(|_| AtomicU64::new(0)).collect(),
            unchecked: AtomicU32::new(if all { 0 } else { rows }),
        }
    }

    /// Every row is checked.
    #[inline]
    fn complete(&self) -> bool {
        self.all || self.unchecked.load(Ordering::Relaxed) == 0
    }

    #[inline]
    fn is_set(&self, slot: u32) -> bool {
        self.all || self.bits[(slot / 64) as usize].load(Ordering::Relaxed) & (1 << (slot % 64)) != 0
    }

    fn set(&self, slot: u32) {
        self.set_all(&[slot]);
    }

    /// Marks `slots` checked with one atomic update per 64-row word that
    /// consecutive slots share, not two per row (a scan step's slots are
    /// ascending, so a step of 32 rows costs one or two updates).
    fn set_all(&self, slots: &[u32]) {
        if self.all {
            return; // no bits: every row is known good
        }
        let mut at = 0;
        while at < slots.len() {
            let word = slots[at] / 64;
            let mut mask = 0u64;
            while at < slots.len() && slots[at] / 64 == word {
                mask |= 1 << (slots[at] % 64);
                at += 1;
            }
            let before = self.bits[word as usize].fetch_or(mask, Ordering::Relaxed);
            let newly = (mask & !before).count_ones();
            if newly > 0 {
                self.unchecked.fetch_sub(newly, Ordering::Relaxed);
            }
        }
    }
}

/// Facts about all of a segment's rows, taken when it is first mapped for
/// scanning. A scan of a segment whose rows all belong to the scanned tree
/// and none of which is consolidated needs no per-row filter, so it reads
/// a node-table row only for the few rows whose score could make the
/// top-k (their label). Tree and label never change; a consolidation flag
/// set later by a writer's checkpoint is one this handle cannot see yet
/// (its root is past the handle's nodes), so the summary stays true for
/// the mapping's lifetime.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Summary {
    /// Some(t) when every row is in tree t and none is flagged consolidated.
    pub plain_tree: Option<u16>,
    /// Every row is in tree `t` (consolidated or not).
    pub single_tree: Option<u16>,
}

/// What `check_table` gathers from a segment's rows for the scan.
#[derive(Default)]
struct TableFacts {
    summary: Summary,
    sums: Vec<u32>,
    qsums: Vec<u32>,
}

/// Whether the rows seen so far share one tree, and which.
#[derive(Default)]
struct TreeSet {
    first: Option<u16>,
    mixed: bool,
}

impl TreeSet {
    fn add(&mut self, tree: u16) {
        match self.first {
            None => self.first = Some(tree),
            Some(t) => self.mixed |= t != tree,
        }
    }

    fn summary(&self, flagged: bool) -> Summary {
        let single = if self.mixed { None } else { self.first };
        Summary {
            plain_tree: single.filter(|_| !flagged),
            single_tree: single,
        }
    }
}

/// The files of one segment, each mapped on first use, and what has been
/// checked. Node-table and vector files are mapped and checked
/// independently: a command that reads rows only never maps a vector file.
#[derive(Clone, Default)]
struct Slot {
    table: Option<Mapping>,
    vectors: Option<Mapping>,
    quant: Option<Mapping>,
    /// Set once the scan has used the segment: its node table then was
    /// checked whole (the scan reads it without checksums).
    scan: Option<Arc<SegmentMaps>>,
    /// The writer's own checkpoint wrote the segment: rows and vectors are
    /// known good without a check.
    trusted: bool,
}

impl Slot {
    fn part(&self, part: Part) -> &Option<Mapping> {
        match part {
            Part::Table => &self.table,
            Part::Vectors => &self.vectors,
            Part::Quant => &self.quant,
        }
    }

    fn part_mut(&mut self, part: Part) -> &mut Option<Mapping> {
        match part {
            Part::Table => &mut self.table,
            Part::Vectors => &mut self.vectors,
            Part::Quant => &mut self.quant,
        }
    }
}

/// Which file of a segment.
#[derive(Clone, Copy)]
enum Part {
    Table,
    Vectors,
    Quant,
}

pub(crate) struct Base {
    storage: Arc<dyn Storage>,
    pub node_count: u32,
    pub rows_per_segment: u32,
    /// The manifest's generation: which data files to read.
    pub generation: u32,
    pub dim_count: u32,
    pub precision: Precision,
    /// The manifest's format version: rows of version 2 carry lane sums.
    pub version: u32,
    pub stride_bytes: u32,
    /// Row stride of the int8 side column, if the bank has one.
    pub qstride_bytes: Option<u32>,
    /// Bounds every checkpointed row's fields must keep (see
    /// `Row::check_ranges`).
    tree_count: usize,
    max_depth: u8,
    segments: RwLock<Vec<Slot>>,
    /// One per segment, held while `segment` prepares its scan maps, so
    /// a scan and the thread checking node tables ahead of it
    /// (`prepare_ahead`) never check the same table twice.
    preparing: Vec<Mutex<()>>,
    /// Segments whose scan maps are ready: at `segments.len()` a scan
    /// needs nobody to check ahead of it.
    prepared: AtomicU32,
    payload_file: Mutex<Option<Arc<dyn StorageFile>>>,
    /// Rows torn by a crashed checkpoint, with the WAL image that replaces
    /// them (see `Bank::seed_torn_rows`): the scan reads a copy of their
    /// segment's node table with these images written in (`with_images`),
    /// so it neither fails on their torn bytes nor trusts them.
    pub superseded: std::collections::BTreeMap<u32, Row>,
    /// Read-only handles retry rows that fail their checksum (see
    /// `decode_row`); the writer never races itself.
    pub retry_torn_rows: bool,
}

/// Payload log bytes read at once by `for_each_payload_record`.
const PAYLOAD_BATCH_BYTES: usize = 8 * 1024 * 1024;

/// How often a reader re-reads a row that fails its checksum.
const TORN_ROW_ATTEMPTS: u32 = 16;

impl Base {
    pub fn new(storage: Arc<dyn Storage>, manifest: &Manifest) -> Base {
        Base::with_trust(storage, manifest, &[])
    }

    /// A base whose first segments carry trust over (the writer's own
    /// checkpoint wrote validated data into them; see `trusted_after`).
    pub fn with_trust(storage: Arc<dyn Storage>, manifest: &Manifest, trusted: &[bool]) -> Base {
        let (node_count, rows_per_segment, dim_count) = (
            manifest.node_count as u32,
            manifest.rows_per_segment,
            manifest.dim_count,
        );
        let segment_count = node_count.div_ceil(rows_per_segment) as usize;
        let slots = (0..segment_count).map(|i| Slot {
            trusted: trusted.get(i).copied().unwrap_or(false),
            ..Slot::default()
        });
        Base {
            storage,
            node_count,
            rows_per_segment,
            dim_count,
            generation: manifest.generation,
            precision: manifest.precision,
            version: manifest.version,
            stride_bytes: manifest.precision.vector_stride_bytes(dim_count),
            qstride_bytes: manifest.precision.qvector_stride_bytes(dim_count),
            tree_count: manifest.trees.len(),
            max_depth: manifest.max_depth,
            segments: RwLock::new(slots.collect()),
            preparing: (0..segment_count).map(|_| Mutex::new(())).collect(),
            prepared: AtomicU32::new(0),
            payload_file: Mutex::new(None),
            superseded: Default::default(),
            retry_torn_rows: false,
        }
    }

    pub fn table_segment_size_bytes(&self) -> u64 {
        u64::from(self.rows_per_segment) * ROW_SIZE_BYTES as u64
    }

    pub fn vector_segment_size_bytes(&self) -> u64 {
        u64::from(self.rows_per_segment) * u64::from(self.stride_bytes)
    }

    pub fn qvector_segment_size_bytes(&self) -> Option<u64> {
        self.qstride_bytes
            .map(|q| u64::from(self.rows_per_segment) * u64::from(q))
    }

    /// Which segments a checkpoint that grows the bank to `new_count` rows
    /// may trust: those trusted now, and every segment it creates.
    pub fn trusted_after(&self, new_count: u32) -> Vec<bool> {
        let slots = self.segments.read().unwrap();
        let new_segments = new_count.div_ceil(self.rows_per_segment) as usize;
        (0..new_segments)
            .map(|i| slots.get(i).is_none_or(|s| s.trusted))
            .collect()
    }

    /// The mappings of segment `segment` for the scan. The first call
    /// checks the node table whole (the scan reads flags, tree, label and
    /// vector checks from it without checksums); vectors are checked row
    /// by row as the scan first reads them (`check_sums`, `check_vectors`).
    /// A thread that finds another preparing the segment waits for it.
    pub fn segment(&self, segment: u32) -> Result<Arc<SegmentMaps>, BankError> {
        if let Some(maps) = self.prepared_maps(segment) {
            return Ok(maps);
        }
        let _preparing = self.preparing[segment as usize]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(maps) = self.prepared_maps(segment) {
            return Ok(maps); // prepared while this thread waited
        }
        let trusted = self.segments.read().unwrap()[segment as usize].trusted;
        let table = self.with_images(segment, self.part(segment, Part::Table)?);
        let rows = self.rows_in(segment);
        let checked = match trusted {
            true => TableFacts {
                summary: self.summarise(rows, &table),
                ..TableFacts::default()
            },
            false => self.check_table(segment, &table)?,
        };
        let maps = Arc::new(SegmentMaps {
            summary: checked.summary,
            table,
            vectors: self.part(segment, Part::Vectors)?,
            quant: self.quant_part(segment)?,
            checked: RowChecks::new(rows, trusted),
            qchecked: RowChecks::new(rows, trusted || self.version < 2),
            sums: checked.sums,
            qsums: checked.qsums,
        });
        self.segments.write().unwrap()[segment as usize].scan = Some(maps.clone());
        self.prepared.fetch_add(1, Ordering::Release);
        Ok(maps)
    }

    /// The segment's node table, or a copy of it with the WAL images of
    /// its superseded rows written in: every field the scan reads in place
    /// (tree, label, flags, lane sums, `vector_crc32`) then comes from the
    /// image (immutable fields are the same in every image; the newest
    /// flags come from the overlay as for any row changed since the
    /// checkpoint). A torn row once failed every scan, blaming its vector.
    fn with_images(&self, segment: u32, table: Mapping) -> Mapping {
        let first = segment * self.rows_per_segment;
        let mut images = self.superseded.range(first..first + self.rows_in(segment)).peekable();
        if images.peek().is_none() {
            return table;
        }
        let mut bytes = table.to_vec();
        for (&index, image) in images {
            let at = (index - first) as usize * ROW_SIZE_BYTES;
            if let Some(row) = bytes.get_mut(at..at + ROW_SIZE_BYTES) {
                row.copy_from_slice(&image.encode());
            }
        }
        crate::storage::snapshot(&bytes)
    }

    fn prepared_maps(&self, segment: u32) -> Option<Arc<SegmentMaps>> {
        self.segments.read().unwrap()[segment as usize].scan.clone()
    }

    /// Every segment's scan maps are ready (`segment` was called for each).
    pub fn all_prepared(&self) -> bool {
        self.prepared.load(Ordering::Acquire) as usize == self.preparing.len()
    }

    /// Whether `segment` still needs its first `segment` call.
    pub fn is_prepared(&self, segment: u32) -> bool {
        self.segments.read().unwrap()[segment as usize].scan.is_some()
    }

    /// Calls `segment` for each of `order` in turn, then maps in the
    /// cached pages of the column the scan reads (`SegmentMaps::populate`),
    /// until `stop` is set: a scan's helper thread, working ahead of it. A
    /// segment that fails its checks ends the walk without a report: the
    /// scan calls `segment` itself when it gets there and reports the
    /// error in the order a scan alone would have met it.
    pub fn prepare_ahead(&self, order: &[u32], stop: &std::sync::atomic::AtomicBool) {
        for &segment in order {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            match self.segment(segment) {
                Ok(maps) => maps.populate(),
                Err(_) => return,
            }
        }
    }

    /// Maps a segment without checking it (for `verify`, which reports
    /// every problem itself).
    pub fn segment_unverified(&self, segment: u32) -> Result<Arc<SegmentMaps>, BankError> {
        Ok(Arc::new(SegmentMaps {
            table: self.part(segment, Part::Table)?,
            vectors: self.part(segment, Part::Vectors)?,
            quant: self.quant_part(segment)?,
            summary: Summary::default(),
            checked: RowChecks::new(0, false),
            qchecked: RowChecks::new(0, false),
            sums: Vec::new(),
            qsums: Vec::new(),
        }))
    }

    /// Unmaps every vector and int8 segment that only a plain use mapped
    /// (node tables, and the maps a scan prepared, stay); the next use
    /// maps them again. Compact calls it after its `verify`: a mapping
    /// keeps the old generation's pages, which its copy drops from the
    /// page cache as it goes, so the new files took fresh memory and the
    /// copy's writes ran at under half their speed (1M x 768 f32).
    pub fn release_vector_maps(&self) {
        for slot in self.segments.write().unwrap().iter_mut() {
            slot.vectors = None;
            slot.quant = None;
        }
    }

    /// A segment's node table alone, mapped without checking (for
    /// `verify` of the rows only).
    pub fn table_unverified(&self, segment: u32) -> Result<Mapping, BankError> {
        self.part(segment, Part::Table)
    }

    /// Maps every segment file and opens the payload log now, for a
    /// reader: the writer's `compact` deletes the generation the reader
    /// opened, and a file first needed after that would be gone. A mapping
    /// (or the open log) keeps the file's data until it is dropped. Best
    /// effort: a file that cannot be mapped is left for its first use,
    /// which reports the error (so `verify` still names each bad file).
    pub fn hold_files(&self) {
        let segment_count = self.segments.read().unwrap().len() as u32;
        for segment in 0..segment_count {
            let _ = self.part(segment, Part::Table);
            let _ = self.part(segment, Part::Vectors);
            let _ = self.quant_part(segment);
        }
        let _ = self.payload_handle();
    }

    /// One file of a segment, mapped on first use.
    fn part(&self, segment: u32, part: Part) -> Result<Mapping, BankError> {
        if let Some(map) = self.segments.read().unwrap()[segment as usize].part(part) {
            return Ok(map.clone());
        }
        let map = match part {
            Part::Table => self.map_file(
                &table_segment_file(self.generation, segment),
                self.table_segment_size_bytes(),
            )?,
            Part::Vectors => self.map_file(
                &vector_segment_file(self.generation, segment),
                self.vector_segment_size_bytes(),
            )?,
            Part::Quant => self.map_file(
                &qvector_segment_file(self.generation, segment),
                self.qvector_segment_size_bytes().unwrap_or(0),
            )?,
        };
        *self.segments.write().unwrap()[segment as usize].part_mut(part) = Some(map.clone());
        Ok(map)
    }

    fn quant_part(&self, segment: u32) -> Result<Option<Mapping>, BankError> {
        self.qstride_bytes.map(|_| self.part(segment, Part::Quant)).transpose()
    }

    /// Rows of segment `segment` below `node_count`.
    fn rows_in(&self, segment: u32) -> u32 {
        (self.node_count - segment * self.rows_per_segment).min(self.rows_per_segment)
    }

    fn summarise(&self, rows: u32, table: &[u8]) -> Summary {
        use crate::format::row::{FLAG_CONSOLIDATED, ROW_FLAGS_OFFSET, ROW_TREE_OFFSET};
        let rows = rows as usize;
        let tree_of = |slot: usize| crate::format::get_u16(table, slot * ROW_SIZE_BYTES + ROW_TREE_OFFSET);
        let first = tree_of(0);
        let single = (0..rows).all(|slot| tree_of(slot) == first);
        let flagged = (0..rows).any(|slot| table[slot * ROW_SIZE_BYTES + ROW_FLAGS_OFFSET] & FLAG_CONSOLIDATED != 0);
        Summary {
            plain_tree: (single && !flagged).then_some(first),
            single_tree: single.then_some(first),
        }
    }

    /// Decodes every row of a node-table segment (checksum and field
    /// ranges), skipping rows a WAL image supersedes, and gathers in the
    /// same pass what the scan needs from them: the summary and (format 2)
    /// the rows' lane sums.
    fn check_table(&self, segment: u32, table: &[u8]) -> Result<TableFacts, BankError> {
        use crate::format::row::{
            FLAG_CONSOLIDATED, ROW_FLAGS_OFFSET, ROW_QVECTOR_SUM_OFFSET, ROW_TREE_OFFSET, ROW_VECTOR_SUM_OFFSET,
        };
        let first = segment * self.rows_per_segment;
        let rows = self.rows_in(segment);
        let sums = self.version >= 2;
        let mut facts = TableFacts::default();
        facts.sums.reserve(if sums { rows as usize } else { 0 });
        facts.qsums.reserve(if sums && self.qstride_bytes.is_some() {
            rows as usize
        } else {
            0
        });
        let (mut trees, mut flagged) = (TreeSet::default(), false);
        for index in first..first + rows {
            let at = (index - first) as usize * ROW_SIZE_BYTES;
            let b: &[u8; ROW_SIZE_BYTES] = table[at..at + ROW_SIZE_BYTES].try_into().expect("a whole row");
            let (tree, consolidated, sum, qsum) = if Row::passes_checks(b, index, self.row_bounds()) {
                let get = crate::format::get_u32;
                let consolidated = b[ROW_FLAGS_OFFSET] & FLAG_CONSOLIDATED != 0;
                let tree = crate::format::get_u16(b, ROW_TREE_OFFSET);
                (
                    tree,
                    consolidated,
                    get(b, ROW_VECTOR_SUM_OFFSET),
                    get(b, ROW_QVECTOR_SUM_OFFSET),
                )
            } else {
                // The slow path names the problem, or retries a row a
                // writer was rewriting and then gives its checked image.
                let row = self.decode_row(segment, table, index)?;
                (row.tree, row.is_consolidated(), row.vector_sum32, row.qvector_sum32)
            };
            trees.add(tree);
            flagged |= consolidated;
            if sums {
                facts.sums.push(sum);
                if self.qstride_bytes.is_some() {
                    facts.qsums.push(qsum);
                }
            }
        }
        facts.summary = trees.summary(flagged);
        Ok(facts)
    }

    /// Format 1 (no lane sums): checks the vectors of `slots` (rows of the
    /// segment starting at row `first`) that this process has not checked
    /// yet, against the
    /// `vector_crc32` of their rows (the node table was checked whole by
    /// `segment`), and their int8 rows against the recomputation. The scan
    /// calls it on a few dozen rows just before scoring them, so the bytes
    /// the checksum reads are in cache when the kernel reads them: one pass
    /// over memory, not two.
    pub fn check_vectors(&self, maps: &SegmentMaps, first: u32, slots: &[u32]) -> Result<(), BankError> {
        use crate::format::row::ROW_VECTOR_CRC_OFFSET;
        if self.version >= 2 || maps.checked.complete() {
            return Ok(()); // format 2: the scan checks lane sums instead
        }
        let mut scratch = Vec::new();
        for &slot in slots.iter().filter(|&&slot| !maps.checked.is_set(slot)) {
            let index = first + slot;
            let crc = crate::format::get_u32(&maps.table, slot as usize * ROW_SIZE_BYTES + ROW_VECTOR_CRC_OFFSET);
            let stored = &maps.vectors[self.vector_range(index)];
            self.check_vector_crc(index, crc, stored)?;
            if let Some(quant) = &maps.quant {
                let vector: Vec<f32> = bytemuck::pod_collect_to_vec(stored);
                self.check_qvector(index, &vector, &quant[self.qvector_range(index)], &mut scratch)?;
            }
            maps.checked.set(slot);
        }
        Ok(())
    }

    /// Whether a scan step over `column` of `maps` must compute lane sums
    /// for `check_sums`: a format-2 bank with rows not checked yet.
    #[inline]
    pub fn needs_sums(&self, maps: &SegmentMaps, column: Column) -> bool {
        self.version >= 2
            && !match column {
                Column::Vectors => maps.checked.complete(),
                Column::Quant => maps.qchecked.complete(),
            }
    }

    /// Compares the lane sums a kernel computed while scoring `slots` (rows
    /// of the segment starting at row `first`) with their rows' stored
    /// `vector_sum32` (or `qvector_sum32` for the int8 column) and marks
    /// them checked. The kernel read each byte once, for the score and the
    /// sum together: the check costs no pass over memory. A mismatch fails
    /// the scan (its scores are never admitted), naming the file, offset
    /// and node, and marks none of `slots` checked.
    pub fn check_sums(
        &self,
        maps: &SegmentMaps,
        column: Column,
        first: u32,
        slots: &[u32],
        computed: &[u32],
    ) -> Result<(), BankError> {
        let (checks, stored) = match column {
            Column::Vectors => (&maps.checked, &maps.sums),
            Column::Quant => (&maps.qchecked, &maps.qsums),
        };
        for (&slot, &sum) in slots.iter().zip(computed) {
            let expected = stored[slot as usize];
            if sum != expected && !checks.is_set(slot) {
                let index = first + slot;
                let segment = index / self.rows_per_segment;
                let (file, range, what) = match column {
                    Column::Vectors => (
                        vector_segment_file(self.generation, segment),
                        self.vector_range(index),
                        "vector",
                    ),
                    Column::Quant => (
                        qvector_segment_file(self.generation, segment),
                        self.qvector_range(index),
                        "int8 row",
                    ),
                };
                return Err(BankError::Corrupt {
                    file: self.storage.describe(&file),
                    offset_bytes: range.start as u64,
                    detail: format!(
                        "{what} of node {index} fails its lane sum (stored {expected:#010x}, computed {sum:#010x})"
                    ),
                });
            }
        }
        checks.set_all(slots);
        Ok(())
    }

    /// The int8 side column is derived data: its checksum is equality with
    /// the row recomputed from the (already checked) f32 vector.
    pub fn check_qvector(
        &self,
        index: u32,
        vector: &[f32],
        stored: &[u8],
        scratch: &mut Vec<u8>,
    ) -> Result<(), BankError> {
        scratch.resize(stored.len(), 0);
        encode_int8_row(vector, scratch);
        if stored == &scratch[..] {
            return Ok(());
        }
        match stored.iter().zip(scratch.iter()).position(|(a, b)| a != b) {
            None => Ok(()),
            Some(at) => Err(BankError::Corrupt {
                file: self
                    .storage
                    .describe(&qvector_segment_file(self.generation, index / self.rows_per_segment)),
                offset_bytes: (self.qvector_range(index).start + at) as u64,
                detail: format!("{INT8_ROW_DIFFERS} {index} differs from its f32 vector at byte {at}"),
            }),
        }
    }

    /// Decodes row `index` from its node-table segment: checksum, then the
    /// field ranges against the manifest (`Row::check_ranges`).
    fn decode_row(&self, segment: u32, table: &[u8], index: u32) -> Result<Row, BankError> {
        let offset = (index % self.rows_per_segment) as usize * ROW_SIZE_BYTES;
        // A reader can catch a row mid-rewrite by the writer's checkpoint
        // (shared mapping); a few short retries separate that from damage.
        let attempts = if self.retry_torn_rows { TORN_ROW_ATTEMPTS } else { 1 };
        let mut result = Row::decode(&table[offset..offset + ROW_SIZE_BYTES], index);
        for _ in 1..attempts {
            if result.is_ok() {
                break;
            }
            // The writer's pwrite of one row takes microseconds: yielding
            // lets it finish without slowing down real damage reports.
            std::thread::yield_now();
            result = Row::decode(&table[offset..offset + ROW_SIZE_BYTES], index);
        }
        let row = result.and_then(|row| {
            row.check_ranges(self.tree_count, self.max_depth)?;
            row.check_sums_allowed(self.version, self.qstride_bytes.is_some())?;
            Ok(row)
        });
        row.map_err(|e| {
            StorageError::corrupt(
                self.storage.describe(&table_segment_file(self.generation, segment)),
                offset as u64,
                e,
            )
            .into()
        })
    }

    fn row_bounds(&self) -> RowBounds {
        RowBounds {
            tree_count: self.tree_count,
            max_depth: self.max_depth,
            version: self.version,
            has_side_column: self.qstride_bytes.is_some(),
        }
    }

    fn map_file(&self, name: &str, expected_bytes: u64) -> Result<Mapping, BankError> {
        let desc = self.storage.describe(name);
        let file = self
            .storage
            .open(name, OpenMode::Read)
            .map_err(StorageError::io("open", desc.clone()))?;
        let map = file.map().map_err(StorageError::io("map", desc.clone()))?;
        if map.len() as u64 != expected_bytes {
            return Err(BankError::Corrupt {
                file: desc,
                offset_bytes: map.len() as u64,
                detail: format!("segment is {} bytes, expected {expected_bytes}", map.len()),
            });
        }
        Ok(map)
    }

    /// Reads the vector column of `segment`'s first `out.len() / stride`
    /// rows into `out` in one positioned read, without mapping the file:
    /// maintenance copies each segment once, and pages no process maps
    /// can be dropped from the cache once copied (compact). Unchecked: the
    /// caller checks each vector it uses (`check_vector_crc`). Returns the
    /// open file, for such a hint.
    pub fn read_vectors(&self, segment: u32, out: &mut [u8]) -> Result<Arc<dyn StorageFile>, BankError> {
        let name = vector_segment_file(self.generation, segment);
        let desc = self.storage.describe(&name);
        let file = self
            .storage
            .open(&name, OpenMode::Read)
            .map_err(StorageError::io("open", desc.clone()))?;
        let len = file.len_bytes().map_err(StorageError::io("stat", desc.clone()))?;
        let expected = self.vector_segment_size_bytes();
        if len != expected {
            return Err(BankError::Corrupt {
                file: desc,
                offset_bytes: len,
                detail: format!("segment is {len} bytes, expected {expected}"),
            });
        }
        file.read_exact_at(out, 0).map_err(StorageError::io("read", desc))?;
        Ok(file)
    }

    /// Decodes and checks row `index` (< node_count). Maps the node-table
    /// segment only: reading rows never touches a vector file.
    pub fn row(&self, index: u32) -> Result<Row, BankError> {
        assert!(
            index < self.node_count,
            "row {index} past the checkpoint's {}",
            self.node_count
        );
        let segment = index / self.rows_per_segment;
        self.decode_row(segment, &self.part(segment, Part::Table)?, index)
    }

    /// Byte range of row `index`'s stored vector within its vector segment
    /// (`dim_count` components of the precision's size).
    pub fn vector_range(&self, index: u32) -> std::ops::Range<usize> {
        let start = (index % self.rows_per_segment) as usize * self.stride_bytes as usize;
        start..start + (self.dim_count * self.precision.component_bytes()) as usize
    }

    /// Byte range of row `index`'s whole int8 row (scale, codes, padding).
    pub fn qvector_range(&self, index: u32) -> std::ops::Range<usize> {
        let stride = self.qstride_bytes.unwrap_or(0) as usize;
        let start = (index % self.rows_per_segment) as usize * stride;
        start..start + stride
    }

    /// f32 values of stored vector bytes.
    pub fn decode_vector(&self, bytes: &[u8]) -> Vec<f32> {
        match self.precision {
            Precision::F16 => decode_f16(bytes),
            Precision::F32 | Precision::Int8 => bytemuck::pod_collect_to_vec(bytes),
        }
    }

    /// Copies row `index`'s vector out as f32, checking it against the
    /// row's CRC.
    pub fn vector(&self, row: &Row) -> Result<Vec<f32>, BankError> {
        let vectors = self.part(row.index / self.rows_per_segment, Part::Vectors)?;
        let bytes = &vectors[self.vector_range(row.index)];
        self.check_vector_crc(row.index, row.vector_crc32, bytes)?;
        Ok(self.decode_vector(bytes))
    }

    /// Checks node `index`'s stored vector bytes (f32 or f16, as the
    /// precision says) against its row's `vector_crc32`; the error names
    /// the vector segment, the offset and the node.
    pub fn check_vector_crc(&self, index: u32, expected: u32, stored: &[u8]) -> Result<(), BankError> {
        let computed = crc32(stored);
        if computed != expected {
            let segment = index / self.rows_per_segment;
            return Err(BankError::Corrupt {
                file: self.storage.describe(&vector_segment_file(self.generation, segment)),
                offset_bytes: self.vector_range(index).start as u64,
                detail: format!(
                    "vector of node {index} fails its checksum (stored {expected:#010x}, computed {computed:#010x})"
                ),
            });
        }
        Ok(())
    }

    /// The payload log, opened on first use.
    pub(super) fn payload_handle(&self) -> Result<Arc<dyn StorageFile>, BankError> {
        let mut slot = self.payload_file.lock().unwrap();
        if let Some(f) = slot.as_ref() {
            return Ok(f.clone());
        }
        let desc = self.storage.describe(&payload_file(self.generation));
        let f = self
            .storage
            .open(&payload_file(self.generation), OpenMode::Read)
            .map_err(StorageError::io("open", desc))?;
        *slot = Some(f.clone());
        Ok(f)
    }

    /// The largest record size a row may claim: no real record is larger
    /// than the compressed bound of the payload limit, and a forged size
    /// could otherwise ask for gigabytes.
    fn record_limit_bytes() -> usize {
        zstd::zstd_safe::compress_bound(crate::format::MAX_PAYLOAD_BYTES) + 64 * 1024
    }

    /// Reads the raw payload record of a checkpointed node.
    pub fn payload_record(&self, row: &Row) -> Result<Vec<u8>, BankError> {
        let desc = self.storage.describe(&payload_file(self.generation));
        if row.payload_size_bytes as usize > Self::record_limit_bytes() {
            return Err(BankError::Corrupt {
                file: desc,
                offset_bytes: row.payload_offset_bytes,
                detail: format!(
                    "node {} claims a {}-byte payload record",
                    row.index, row.payload_size_bytes
                ),
            });
        }
        let mut buf = vec![0u8; row.payload_size_bytes as usize];
        self.payload_handle()?
            .read_exact_at(&mut buf, row.payload_offset_bytes)
            .map_err(|e| BankError::Corrupt {
                file: desc,
                offset_bytes: row.payload_offset_bytes,
                detail: format!(
                    "cannot read the {}-byte payload record of node {}: {e}",
                    buf.len(),
                    row.index
                ),
            })?;
        Ok(buf)
    }

    /// Calls `each` with the raw payload record of every row of `rows` (or
    /// the error reading it), in order, with few large reads: a run of
    /// rows whose records lie back to back in the log is read at once, up
    /// to `PAYLOAD_BATCH_BYTES`. Maintenance (verify, freeze, compact)
    /// streams the log this way instead of one read per node.
    pub fn for_each_payload_record(
        &self,
        rows: &[Row],
        mut each: impl FnMut(&Row, Result<&[u8], BankError>) -> Result<(), BankError>,
    ) -> Result<(), BankError> {
        let limit = Self::record_limit_bytes() as u64;
        let mut buf = Vec::new();
        let mut at = 0;
        while at < rows.len() {
            let start = rows[at].payload_offset_bytes;
            let (mut end, mut end_offset) = (at, start);
            while let Some(row) = rows.get(end) {
                let size = u64::from(row.payload_size_bytes);
                let fits = end_offset - start + size <= PAYLOAD_BATCH_BYTES as u64;
                if row.payload_offset_bytes != end_offset || size > limit || !(fits || end == at) {
                    break;
                }
                end_offset += size;
                end += 1;
            }
            let batch = &rows[at..end.max(at + 1)];
            buf.resize((end_offset - start) as usize, 0);
            let read = end > at && self.payload_handle()?.read_exact_at(&mut buf, start).is_ok();
            for row in batch {
                if read {
                    let from = (row.payload_offset_bytes - start) as usize;
                    each(row, Ok(&buf[from..from + row.payload_size_bytes as usize]))?;
                } else {
                    // One at a time, for an error that names the record.
                    match self.payload_record(row) {
                        Ok(record) => each(row, Ok(&record))?,
                        Err(e) => each(row, Err(e))?,
                    }
                }
            }
            at += batch.len();
        }
        Ok(())
    }

    pub fn payload(&self, row: &Row) -> Result<Payload, BankError> {
        let record = self.payload_record(row)?;
        decode_record(&record, row.index).map_err(|e| {
            StorageError::corrupt(
                self.storage.describe(&payload_file(self.generation)),
                row.payload_offset_bytes,
                e,
            )
            .into()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_all_marks_each_row_once_across_words() {
        let checks = RowChecks::new(200, false);
        checks.set_all(&[0, 1, 63, 64, 130]);
        checks.set_all(&[1, 64, 65, 199]); // two of them already checked
        checks.set(2);
        assert_eq!(checks.unchecked.load(Ordering::Relaxed), 200 - 8);
        for slot in [0, 1, 2, 63, 64, 65, 130, 199] {
            assert!(checks.is_set(slot), "{slot}");
        }
        assert!(!checks.is_set(3) && !checks.is_set(129) && !checks.complete());
        checks.set_all(&(0..200).collect::<Vec<_>>());
        assert!(checks.complete());
    }
}

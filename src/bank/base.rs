//! The checkpointed part of a bank: node-table and vector segments mapped
//! on first use, payload records read on demand. Opening maps nothing and
//! reads nothing here, so open cost does not grow with the node count.

use std::sync::{Arc, Mutex, RwLock};

use super::BankError;
use super::kernels::quant::{decode_f16, encode_int8_row};
use crate::format::crc32;
use crate::format::manifest::{Manifest, Precision};
use crate::format::payload::{Payload, decode_record};
use crate::format::row::{ROW_SIZE_BYTES, Row};
use crate::storage::{
    Mapping, OpenMode, Storage, StorageError, StorageFile, payload_file, qvector_segment_file, table_segment_file,
    vector_segment_file,
};

pub(crate) struct SegmentMaps {
    pub table: Mapping,
    pub vectors: Mapping,
    /// The int8 side column (precision `Int8` only).
    pub quant: Option<Mapping>,
    /// What every row of the segment shares, if known (see `Summary`).
    pub summary: Summary,
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

#[derive(Clone, Default)]
struct Slot {
    maps: Option<Arc<SegmentMaps>>,
    /// Every row and vector of the segment is known good: checked once
    /// when first mapped, or written by this process's own checkpoint.
    trusted: bool,
}

pub(crate) struct Base {
    storage: Arc<dyn Storage>,
    pub node_count: u32,
    pub rows_per_segment: u32,
    /// The manifest's generation: which data files to read.
    pub generation: u32,
    pub dim_count: u32,
    pub precision: Precision,
    pub stride_bytes: u32,
    /// Row stride of the int8 side column, if the bank has one.
    pub qstride_bytes: Option<u32>,
    segments: RwLock<Vec<Slot>>,
    payload_file: Mutex<Option<Arc<dyn StorageFile>>>,
    /// Rows torn by a crashed checkpoint whose WAL image replaces them
    /// (see `Bank::seed_torn_rows`); the segment check skips them.
    pub superseded: std::collections::BTreeSet<u32>,
    /// Read-only handles retry rows that fail their checksum (see
    /// `decode_row`); the writer never races itself.
    pub retry_torn_rows: bool,
}

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
            maps: None,
            trusted: trusted.get(i).copied().unwrap_or(false),
        });
        Base {
            storage,
            node_count,
            rows_per_segment,
            dim_count,
            generation: manifest.generation,
            precision: manifest.precision,
            stride_bytes: manifest.precision.vector_stride_bytes(dim_count),
            qstride_bytes: manifest.precision.qvector_stride_bytes(dim_count),
            segments: RwLock::new(slots.collect()),
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

    /// The mappings of segment `segment`, mapped on first use. The first
    /// use also checks every row and vector checksum in it, unless it is
    /// trusted: the scan then reads the mapping without checksums, and a
    /// damaged vector could otherwise silently lose to a worse one.
    pub fn segment(&self, segment: u32) -> Result<Arc<SegmentMaps>, BankError> {
        if let Some(Slot { maps: Some(maps), .. }) = self.segments.read().unwrap().get(segment as usize) {
            return Ok(maps.clone());
        }
        let maps = self.segment_unverified(segment)?;
        if !self.segments.read().unwrap()[segment as usize].trusted {
            self.check_segment(segment, &maps)?;
        }
        let maps = Arc::new(SegmentMaps {
            table: maps.table.clone(),
            vectors: maps.vectors.clone(),
            quant: maps.quant.clone(),
            summary: self.summarise(segment, &maps.table),
        });
        self.segments.write().unwrap()[segment as usize] = Slot {
            maps: Some(maps.clone()),
            trusted: true,
        };
        Ok(maps)
    }

    /// Maps a segment without checking it (for `verify`, which reports
    /// every problem itself).
    pub fn segment_unverified(&self, segment: u32) -> Result<Arc<SegmentMaps>, BankError> {
        if let Some(Slot { maps: Some(maps), .. }) = self.segments.read().unwrap().get(segment as usize) {
            return Ok(maps.clone());
        }
        let quant = match self.qvector_segment_size_bytes() {
            Some(size) => Some(self.map_file(&qvector_segment_file(self.generation, segment), size)?),
            None => None,
        };
        Ok(Arc::new(SegmentMaps {
            table: self.map_file(
                &table_segment_file(self.generation, segment),
                self.table_segment_size_bytes(),
            )?,
            vectors: self.map_file(
                &vector_segment_file(self.generation, segment),
                self.vector_segment_size_bytes(),
            )?,
            quant,
            summary: Summary::default(),
        }))
    }

    fn summarise(&self, segment: u32, table: &[u8]) -> Summary {
        use crate::format::row::{FLAG_CONSOLIDATED, ROW_FLAGS_OFFSET, ROW_TREE_OFFSET};
        let rows = (self.node_count - segment * self.rows_per_segment).min(self.rows_per_segment) as usize;
        let tree_of = |slot: usize| crate::format::get_u16(table, slot * ROW_SIZE_BYTES + ROW_TREE_OFFSET);
        let first = tree_of(0);
        let single = (0..rows).all(|slot| tree_of(slot) == first);
        let flagged = (0..rows).any(|slot| table[slot * ROW_SIZE_BYTES + ROW_FLAGS_OFFSET] & FLAG_CONSOLIDATED != 0);
        Summary {
            plain_tree: (single && !flagged).then_some(first),
            single_tree: single.then_some(first),
        }
    }

    fn check_segment(&self, segment: u32, maps: &SegmentMaps) -> Result<(), BankError> {
        let first = segment * self.rows_per_segment;
        let last = (first + self.rows_per_segment).min(self.node_count);
        let mut scratch = Vec::new();
        for index in (first..last).filter(|i| !self.superseded.contains(i)) {
            let row = self.decode_row(segment, maps, index)?;
            let stored = &maps.vectors[self.vector_range(index)];
            self.check_vector(&row, stored)?;
            if let Some(quant) = &maps.quant {
                let vector: Vec<f32> = bytemuck::pod_collect_to_vec(stored);
                self.check_qvector(index, &vector, &quant[self.qvector_range(index)], &mut scratch)?;
            }
        }
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
                detail: format!("int8 row of node {index} differs from its f32 vector at byte {at}"),
            }),
        }
    }

    fn decode_row(&self, segment: u32, maps: &SegmentMaps, index: u32) -> Result<Row, BankError> {
        let offset = (index % self.rows_per_segment) as usize * ROW_SIZE_BYTES;
        // A reader can catch a row mid-rewrite by the writer's checkpoint
        // (shared mapping); a few short retries separate that from damage.
        let attempts = if self.retry_torn_rows { TORN_ROW_ATTEMPTS } else { 1 };
        let mut result = Row::decode(&maps.table[offset..offset + ROW_SIZE_BYTES], index);
        for _ in 1..attempts {
            if result.is_ok() {
                break;
            }
            // The writer's pwrite of one row takes microseconds: yielding
            // lets it finish without slowing down real damage reports.
            std::thread::yield_now();
            result = Row::decode(&maps.table[offset..offset + ROW_SIZE_BYTES], index);
        }
        result.map_err(|e| {
            StorageError::corrupt(
                self.storage.describe(&table_segment_file(self.generation, segment)),
                offset as u64,
                e,
            )
            .into()
        })
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

    /// Decodes and checks row `index` (< node_count).
    pub fn row(&self, index: u32) -> Result<Row, BankError> {
        debug_assert!(index < self.node_count);
        let segment = index / self.rows_per_segment;
        self.decode_row(segment, &*self.segment(segment)?, index)
    }

    /// As `row`, without checking the rest of its segment (for `verify`).
    pub fn row_unverified(&self, index: u32) -> Result<Row, BankError> {
        let segment = index / self.rows_per_segment;
        self.decode_row(segment, &*self.segment_unverified(segment)?, index)
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
        let maps = self.segment(row.index / self.rows_per_segment)?;
        let bytes = &maps.vectors[self.vector_range(row.index)];
        self.check_vector(row, bytes)?;
        Ok(self.decode_vector(bytes))
    }

    /// Checks stored vector bytes (f32 or f16, as the precision says)
    /// against the row's `vector_crc32`.
    pub fn check_vector(&self, row: &Row, stored: &[u8]) -> Result<(), BankError> {
        let computed = crc32(stored);
        if computed != row.vector_crc32 {
            let segment = row.index / self.rows_per_segment;
            return Err(BankError::Corrupt {
                file: self.storage.describe(&vector_segment_file(self.generation, segment)),
                offset_bytes: self.vector_range(row.index).start as u64,
                detail: format!(
                    "vector of node {} fails its checksum (stored {:#010x}, computed {computed:#010x})",
                    row.index, row.vector_crc32
                ),
            });
        }
        Ok(())
    }

    /// Reads the raw payload record of a checkpointed node.
    pub fn payload_record(&self, row: &Row) -> Result<Vec<u8>, BankError> {
        let desc = self.storage.describe(&payload_file(self.generation));
        let file = {
            let mut slot = self.payload_file.lock().unwrap();
            match slot.as_ref() {
                Some(f) => f.clone(),
                None => {
                    let f = self
                        .storage
                        .open(&payload_file(self.generation), OpenMode::Read)
                        .map_err(StorageError::io("open", desc.clone()))?;
                    *slot = Some(f.clone());
                    f
                }
            }
        };
        // A forged size could ask for gigabytes; no real record is larger
        // than the compressed bound of the payload limit.
        let limit_bytes = zstd::zstd_safe::compress_bound(crate::format::MAX_PAYLOAD_BYTES) + 64 * 1024;
        if row.payload_size_bytes as usize > limit_bytes {
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
        file.read_exact_at(&mut buf, row.payload_offset_bytes)
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

//! Writes new nodes' rows and vectors into the segment files at their
//! final places, for a checkpoint (FORMAT.md §7 steps 2-3) and for a bulk
//! load's writer thread. Owns what it needs (no borrow of the bank), so a
//! load can run one on a second thread while it stages more nodes.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use super::BankError;
use super::kernels::quant::{encode_f16, encode_int8_row};
use crate::format::manifest::{Manifest, Precision};
use crate::format::row::{ROW_SIZE_BYTES, Row};
use crate::storage::{
    AlignedBuf, DIRECT_ALIGN_BYTES, OpenMode, Storage, StorageError, StorageFile, qvector_segment_file,
    table_segment_file, vector_segment_file, write_bulk_at,
};

/// About the largest single write built in memory (encoded vector
/// chunks round it up to whole 2 MiB blocks, at most twice this; vectors
/// of an f32 bank whose stride has no padding are written through the
/// page cache from the overlay as is).
pub(crate) const WRITE_CHUNK_BYTES: usize = 4 << 20;

/// The manifest fields that place rows and vectors in segment files.
#[derive(Debug, Clone, Copy)]
struct Layout {
    generation: u32,
    rows_per_segment: u32,
    dim_count: usize,
    stride_bytes: usize,
    precision: Precision,
}

/// Opens (creating at full size when new) and writes segment files; the
/// files it wrote are fsynced by `sync_all`.
pub(crate) struct SegmentWriter {
    storage: Arc<dyn Storage>,
    layout: Layout,
    open: BTreeMap<String, Arc<dyn StorageFile>>,
    created: bool,
    /// Vector files are written around the page cache where the file
    /// system allows (a bulk load: see `VectorWrites::Uncached`).
    uncached: bool,
    /// Where encoded vectors are built, one piece at a time.
    scratch: AlignedBuf,
}

/// Where a run of consecutive rows of one column file goes.
struct ColumnRun {
    name: String,
    size_bytes: u64,
    stride_bytes: usize,
    first_slot: u32,
}

impl SegmentWriter {
    pub fn new(storage: Arc<dyn Storage>, manifest: &Manifest, uncached: bool) -> SegmentWriter {
        SegmentWriter {
            storage,
            layout: Layout {
                generation: manifest.generation,
                rows_per_segment: manifest.rows_per_segment,
                dim_count: manifest.dim_count as usize,
                stride_bytes: manifest.row_stride_bytes as usize,
                precision: manifest.precision,
            },
            open: BTreeMap::new(),
            created: false,
            uncached,
            scratch: AlignedBuf::new(0),
        }
    }

    /// Rows per piece a bulk load hands to a writer thread: about
    /// `WRITE_CHUNK_BYTES`, in whole aligned blocks of the vector column.
    pub fn piece_rows(manifest: &Manifest) -> usize {
        let stride = manifest.row_stride_bytes as usize;
        chunk_rows(stride).next_multiple_of(whole_block_rows(stride, DIRECT_ALIGN_BYTES))
    }

    fn file(&mut self, name: String, size_bytes: u64, mode: OpenMode) -> Result<Arc<dyn StorageFile>, BankError> {
        if let Some(f) = self.open.get(&name) {
            return Ok(f.clone());
        }
        let desc = self.storage.describe(&name);
        let exists = self
            .storage
            .exists(&name)
            .map_err(StorageError::io("stat", desc.clone()))?;
        let file = self
            .storage
            .open(&name, mode)
            .map_err(StorageError::io("open", desc.clone()))?;
        // Fixed size from birth, so mappings of it never change. A crash
        // can leave a new segment short; no checkpoint refers to it yet.
        if file.len_bytes().map_err(StorageError::io("stat", desc.clone()))? != size_bytes {
            file.set_len(size_bytes).map_err(StorageError::io("size", desc))?;
        }
        self.created |= !exists;
        self.open.insert(name, file.clone());
        Ok(file)
    }

    fn write(
        &mut self,
        name: String,
        size_bytes: u64,
        bytes: &[u8],
        offset_bytes: u64,
        mode: OpenMode,
    ) -> Result<(), BankError> {
        let desc = self.storage.describe(&name);
        let file = self.file(name, size_bytes, mode)?;
        write_bulk_at(file.as_ref(), bytes, offset_bytes).map_err(StorageError::io("write", desc))?;
        Ok(())
    }

    /// Writes rows of consecutive indexes from `first`.
    pub fn put_rows(&mut self, first: u32, rows: &[Row]) -> Result<(), BankError> {
        let rps = self.layout.rows_per_segment;
        let size = u64::from(rps) * ROW_SIZE_BYTES as u64;
        let mut bytes = Vec::new();
        for (segment, slot, range) in segment_runs(first, rows.len(), rps, WRITE_CHUNK_BYTES / ROW_SIZE_BYTES) {
            bytes.clear();
            for row in &rows[range] {
                bytes.extend_from_slice(&row.encode());
            }
            let name = table_segment_file(self.layout.generation, segment);
            let offset = u64::from(slot) * ROW_SIZE_BYTES as u64;
            self.write(name, size, &bytes, offset, OpenMode::Create)?;
        }
        Ok(())
    }

    /// Writes the vectors (`dim_count` floats each) of consecutive new
    /// nodes from `first` in the bank's precision, and their int8
    /// side-column rows when the bank has one.
    pub fn put_vectors(&mut self, first: u32, vectors: &[f32]) -> Result<(), BankError> {
        let Layout {
            generation,
            rows_per_segment: rps,
            dim_count: dim,
            stride_bytes: stride,
            precision,
        } = self.layout;
        let count = vectors.len() / dim.max(1);
        // Vectors stored as they are need no buffer: through the cache,
        // one write per segment run, so the runs' seams fall on the
        // batch's edges only; around it, from `vectors` itself when that
        // is aligned (`put_as_is_uncached`).
        let as_is = precision != Precision::F16 && stride == dim * 4;
        let qstride = precision.qvector_stride_bytes(dim as u32).map(|q| q as usize);
        for (segment, slot, range) in segment_runs(first, count, rps, usize::MAX) {
            let values = &vectors[range.start * dim..range.end * dim];
            let run = ColumnRun {
                name: vector_segment_file(generation, segment),
                size_bytes: u64::from(rps) * stride as u64,
                stride_bytes: stride,
                first_slot: slot,
            };
            if as_is && !self.uncached {
                let offset = u64::from(slot) * stride as u64;
                let bytes = bytemuck::cast_slice(values);
                self.write(run.name, run.size_bytes, bytes, offset, OpenMode::Create)?;
            } else if as_is && self.put_as_is_uncached(&run, values)? {
                // Written from where the vectors are.
            } else {
                self.put_encoded(&run, values, |v, out| {
                    let used = encode_vector(precision, v, out);
                    out[used..].fill(0);
                })?;
            }
            if let Some(qstride) = qstride {
                let run = ColumnRun {
                    name: qvector_segment_file(generation, segment),
                    size_bytes: u64::from(rps) * qstride as u64,
                    stride_bytes: qstride,
                    first_slot: slot,
                };
                self.put_encoded(&run, values, |v, out| {
                    encode_int8_row(v, out);
                    out[4 + v.len()..].fill(0);
                })?;
            }
        }
        Ok(())
    }

    /// Writes vectors stored as they are around the page cache from
    /// `values` itself, when the memory of its first row on a block
    /// boundary of the file is aligned too (a load's pieces are:
    /// `AlignedFloats`), saving the copy into the scratch buffer (a tenth
    /// of a 1M-row import's time, measured). The rows before the run's
    /// first block boundary and after its last go through the page cache
    /// (the storage sends writes that are not whole aligned blocks there),
    /// the whole blocks between in large writes around it. Returns false,
    /// having written nothing, when the memory is not aligned: the caller
    /// copies the rows into the aligned scratch buffer instead.
    fn put_as_is_uncached(&mut self, run: &ColumnRun, values: &[f32]) -> Result<bool, BankError> {
        let stride = run.stride_bytes;
        let rows = values.len() / self.layout.dim_count.max(1);
        let block_rows = whole_block_rows(stride, DIRECT_ALIGN_BYTES);
        let head_rows = ((block_rows - run.first_slot as usize % block_rows) % block_rows).min(rows);
        let body_rows = (rows - head_rows) / block_rows * block_rows;
        let bytes: &[u8] = bytemuck::cast_slice(values);
        let (head, rest) = bytes.split_at(head_rows * stride);
        let (body, tail) = rest.split_at(body_rows * stride);
        if !body.is_empty() && body.as_ptr().align_offset(DIRECT_ALIGN_BYTES) != 0 {
            return Ok(false);
        }
        let mut offset = u64::from(run.first_slot) * stride as u64;
        for part in [head, body, tail] {
            if !part.is_empty() {
                self.write(run.name.clone(), run.size_bytes, part, offset, OpenMode::CreateUncached)?;
            }
            offset += part.len() as u64;
        }
        Ok(true)
    }

    /// Writes `values` (rows of `dim_count` floats) into `run`, each row
    /// encoded into one whole stride by `encode`, in pieces of about
    /// `WRITE_CHUNK_BYTES` built in the aligned scratch buffer.
    ///
    /// Uncached, the file takes writes around the page cache of whole
    /// aligned blocks only. The rows before the run's first block boundary
    /// go through the cache; the last piece is padded with zeros to a whole
    /// block (past the new rows the file holds zeros, or leftovers no
    /// checkpoint refers to), so every other byte may bypass it.
    fn put_encoded(
        &mut self,
        run: &ColumnRun,
        values: &[f32],
        encode: impl Fn(&[f32], &mut [u8]),
    ) -> Result<(), BankError> {
        let dim = self.layout.dim_count;
        let (stride, rows) = (run.stride_bytes, values.len() / dim);
        let block_rows = whole_block_rows(stride, DIRECT_ALIGN_BYTES);
        let (head_rows, mode) = match self.uncached {
            false => (0, OpenMode::Create),
            true => {
                let to_boundary = (block_rows - run.first_slot as usize % block_rows) % block_rows;
                (to_boundary.min(rows), OpenMode::CreateUncached)
            }
        };
        let piece_rows = chunk_rows(stride).next_multiple_of(block_rows);
        let mut scratch = std::mem::replace(&mut self.scratch, AlignedBuf::new(0));
        if scratch.len() < piece_rows * stride {
            scratch = AlignedBuf::new(piece_rows * stride);
        }
        let mut done = 0;
        while done < rows {
            let len = match done < head_rows {
                true => head_rows,
                false => piece_rows.min(rows - done),
            };
            let offset = (u64::from(run.first_slot) + done as u64) * stride as u64;
            let used = len * stride;
            let padded = match self.uncached && done >= head_rows {
                true => (used.next_multiple_of(DIRECT_ALIGN_BYTES) as u64).min(run.size_bytes - offset) as usize,
                false => used,
            };
            let buf = &mut scratch.get_mut()[..padded];
            let rows_values = values[done * dim..(done + len) * dim].chunks_exact(dim);
            for (v, out) in rows_values.zip(buf.chunks_exact_mut(stride)) {
                encode(v, out);
            }
            buf[used..].fill(0);
            self.write(run.name.clone(), run.size_bytes, buf, offset, mode)?;
            done += len;
        }
        self.scratch = scratch;
        Ok(())
    }

    /// Fsyncs every file written; returns whether any was created (the
    /// directory then needs an fsync too).
    pub fn sync_all(self) -> Result<bool, BankError> {
        for (name, file) in &self.open {
            file.sync_data()
                .map_err(StorageError::io("fsync", self.storage.describe(name)))?;
        }
        Ok(self.created)
    }
}

/// Rows per encoded write of `stride_bytes` rows: about
/// `WRITE_CHUNK_BYTES`, rounded up to a whole number of 2 MiB (the huge
/// page size) when that stays under twice as much, so that consecutive
/// chunks from an aligned start keep every write seam on a 2 MiB boundary
/// (see `write_bulk_at`: such writes leave the page cache in large
/// folios). 768-byte f16 rows: 8,192 rows (6 MiB).
fn chunk_rows(stride_bytes: usize) -> usize {
    const HUGE_PAGE_BYTES: usize = 2 << 20;
    let plain = (WRITE_CHUNK_BYTES / stride_bytes).max(1);
    let aligned = whole_block_rows(stride_bytes, HUGE_PAGE_BYTES);
    match aligned <= 2 * plain {
        true => plain.div_ceil(aligned) * aligned,
        false => plain,
    }
}

/// The fewest rows of `stride_bytes` that fill whole blocks of
/// `block_bytes` (a power of two).
fn whole_block_rows(stride_bytes: usize, block_bytes: usize) -> usize {
    let (mut a, mut b) = (stride_bytes, block_bytes);
    while b != 0 {
        (a, b) = (b, a % b);
    }
    block_bytes / a
}

/// Encodes a vector as the vector segments store it into `out` (one row
/// stride, zero padded); returns the bytes used.
pub(crate) fn encode_vector(precision: Precision, vector: &[f32], out: &mut [u8]) -> usize {
    let used = vector.len() * precision.component_bytes() as usize;
    match precision {
        Precision::F16 => encode_f16(vector, &mut out[..used]),
        Precision::F32 | Precision::Int8 => out[..used].copy_from_slice(bytemuck::cast_slice(vector)),
    }
    used
}

/// Splits `count` consecutive nodes from `first` into runs that stay in
/// one segment and hold at most `max_rows`: (segment, first slot, range
/// of positions in the input).
fn segment_runs(first: u32, count: usize, rows_per_segment: u32, max_rows: usize) -> Vec<(u32, u32, Range<usize>)> {
    assert!(rows_per_segment > 0 && max_rows > 0);
    let mut runs = Vec::new();
    let mut done = 0usize;
    while done < count {
        let index = first + done as u32;
        let slot = index % rows_per_segment;
        let len = ((rows_per_segment - slot) as usize).min(count - done).min(max_rows);
        runs.push((index / rows_per_segment, slot, done..done + len));
        done += len;
    }
    runs
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use super::{SegmentWriter, WRITE_CHUNK_BYTES, chunk_rows};
    use crate::format::manifest::Precision;
    use crate::storage::{
        AlignedFloats, DIRECT_ALIGN_BYTES, MemStorage, OpenMode, Storage, StorageError, StorageFile,
        vector_segment_file,
    };
    use crate::{Bank, BankConfig};

    /// Each write's (offset in the file, length, address of its memory).
    type Writes = Arc<Mutex<Vec<(u64, usize, usize)>>>;

    /// Records the writes to the vector files, then passes them on.
    struct Recording {
        inner: MemStorage,
        writes: Writes,
    }

    struct RecordingFile {
        inner: Arc<dyn StorageFile>,
        writes: Writes,
    }

    impl StorageFile for RecordingFile {
        fn read_exact_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
            self.inner.read_exact_at(buf, offset_bytes)
        }
        fn write_all_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
            self.writes
                .lock()
                .unwrap()
                .push((offset_bytes, buf.len(), buf.as_ptr() as usize));
            self.inner.write_all_at(buf, offset_bytes)
        }
        fn start_writeback(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
            self.inner.start_writeback(offset_bytes, len_bytes)
        }
        fn map(&self) -> io::Result<crate::storage::Mapping> {
            self.inner.map()
        }
        crate::storage::forward_size_ops!();
    }

    impl Storage for Recording {
        fn open(&self, name: &str, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
            let inner = self.inner.open(name, mode)?;
            Ok(match name.starts_with("vectors") {
                true => Arc::new(RecordingFile {
                    inner,
                    writes: self.writes.clone(),
                }),
                false => inner,
            })
        }
        crate::storage::forward_directory_ops!();
    }

    /// A load's aligned piece of f32 vectors is written from its own
    /// memory, not copied: every write of whole aligned blocks reads the
    /// piece itself, the rows before the first block boundary and after
    /// the last go through the cache, and the file holds what the copying
    /// path writes (a piece built unaligned takes that path).
    #[test]
    fn an_aligned_piece_is_written_from_where_it_is() {
        let dim = 768;
        let config = BankConfig {
            precision: Precision::F32,
            ..BankConfig::new(dim as u32)
        };
        let manifest = Bank::create(Arc::new(MemStorage::new()), config)
            .unwrap()
            .manifest()
            .clone();
        // From slot 1 (3 rows to the first boundary of 4 rows = 3 blocks),
        // whole blocks, and 2 rows after the last boundary.
        let (first, rows) = (1u32, 3 + 4 * 9 + 2);
        let values: Vec<f32> = (0..rows * dim).map(|i| (i % 977) as f32 - 300.0).collect();
        let write = |piece: &[f32], first: u32| {
            let recording = Arc::new(Recording {
                inner: MemStorage::new(),
                writes: Writes::default(),
            });
            let mut writer = SegmentWriter::new(recording.clone(), &manifest, true);
            writer.put_vectors(first, piece).unwrap();
            assert!(writer.sync_all().unwrap());
            let bytes = recording.inner.file_bytes(&vector_segment_file(0, 0)).unwrap();
            (bytes, recording.writes.lock().unwrap().clone())
        };
        // The rows from the first boundary on must sit on an aligned address.
        let mut aligned = AlignedFloats::with_capacity(DIRECT_ALIGN_BYTES + rows * dim);
        aligned.extend_from_slice(&vec![0.0; dim]);
        aligned.extend_from_slice(&values);
        let piece = &aligned.as_slice()[dim..];
        let (bytes, writes) = write(piece, first);
        let expected: &[u8] = bytemuck::cast_slice(&values);
        let at = first as usize * 4 * dim;
        assert_eq!(&bytes[at..at + expected.len()], expected);
        let memory = piece.as_ptr() as usize..piece.as_ptr() as usize + expected.len();
        let whole = |(offset, len, _): &(u64, usize, usize)| offset % 4096 == 0 && len % 4096 == 0;
        let blocks: Vec<_> = writes.iter().filter(|w| whole(w)).collect();
        assert_eq!(blocks.iter().map(|w| w.1).sum::<usize>(), 4 * 9 * 4 * dim);
        assert!(blocks.iter().all(|w| memory.contains(&w.2)), "copied: {writes:?}");
        assert!(
            writes.iter().all(|w| memory.contains(&w.2)),
            "head or tail copied: {writes:?}"
        );
        // A piece whose blocks are not aligned in memory is copied first.
        let mut shifted = AlignedFloats::with_capacity(rows * dim + 1);
        shifted.extend_from_slice(&[0.0]);
        shifted.extend_from_slice(&values);
        let (copied_bytes, copied_writes) = write(&shifted.as_slice()[1..], first);
        assert_eq!(copied_bytes, bytes);
        let start = shifted.as_slice().as_ptr() as usize;
        let source = start..start + 4 * shifted.len();
        assert!(
            copied_writes
                .iter()
                .filter(|w| whole(w))
                .all(|w| !source.contains(&w.2))
        );
    }

    /// Encoded chunks fill whole 2 MiB blocks when a modest size allows it,
    /// and stay near `WRITE_CHUNK_BYTES` otherwise.
    #[test]
    fn encoded_chunks_fill_whole_huge_pages() {
        const HUGE: usize = 2 << 20;
        for stride in [64usize, 768, 1536, 3072, 4096] {
            let bytes = chunk_rows(stride) * stride;
            assert_eq!(bytes % HUGE, 0, "stride {stride}");
            assert!(
                (WRITE_CHUNK_BYTES..=2 * WRITE_CHUNK_BYTES).contains(&bytes),
                "stride {stride}"
            );
        }
        assert_eq!(chunk_rows(768), 8192);
        // 64 x 255 bytes: whole 2 MiB blocks would take 255 x 2 MiB.
        assert_eq!(chunk_rows(64 * 255), WRITE_CHUNK_BYTES / (64 * 255));
        assert_eq!(chunk_rows(WRITE_CHUNK_BYTES * 3), 1);
    }
}

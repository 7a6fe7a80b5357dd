//! Pure encode/decode of every on-disk structure. No I/O happens here.
//!
//! Every offset below mirrors a row of `format-spec/FORMAT.md`; the test
//! `tests/format_spec.rs` parses the tables in that document and compares
//! them with these constants, so the two cannot drift apart silently.

pub mod manifest;
pub mod payload;
pub mod row;
pub mod wal;

use thiserror::Error;

/// A decoding failure. `offset_bytes` is relative to the start of the
/// structure being decoded; the storage layer adds the file name and the
/// absolute offset when it reports the error.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum FormatError {
    #[error("{what}: bad magic at offset {offset_bytes} (not a deltamem file?)")]
    BadMagic { what: &'static str, offset_bytes: u64 },
    #[error("{what}: unsupported format version {found} (this build reads versions up to {supported})")]
    UnsupportedVersion {
        what: &'static str,
        found: u32,
        supported: u32,
    },
    #[error("{what}: checksum mismatch at offset {offset_bytes} (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum {
        what: &'static str,
        offset_bytes: u64,
        stored: u32,
        computed: u32,
    },
    #[error("{what}: invalid field at offset {offset_bytes}: {detail}")]
    Invalid {
        what: &'static str,
        offset_bytes: u64,
        detail: String,
    },
    #[error("{what}: truncated: need {need_bytes} bytes, have {have_bytes}")]
    Truncated {
        what: &'static str,
        need_bytes: u64,
        have_bytes: u64,
    },
}

impl FormatError {
    /// Offset within the structure, if the error names one.
    pub fn offset_bytes(&self) -> u64 {
        match self {
            FormatError::BadMagic { offset_bytes, .. }
            | FormatError::Checksum { offset_bytes, .. }
            | FormatError::Invalid { offset_bytes, .. } => *offset_bytes,
            FormatError::UnsupportedVersion { .. } => 0,
            FormatError::Truncated { have_bytes, .. } => *have_bytes,
        }
    }
}

/// The format version this build writes. It also reads every version from
/// `OLDEST_FORMAT_VERSION` on (FORMAT.md §3).
pub const FORMAT_VERSION: u32 = 2;

/// The oldest format version this build reads: version 1 rows carry no
/// lane sums, so scans check their vectors with the CRC instead.
pub const OLDEST_FORMAT_VERSION: u32 = 1;

/// The version of the WAL header layout, unchanged since version 1 (the
/// manifest's version says how the rows inside the WAL are read).
pub const WAL_FORMAT_VERSION: u32 = 1;

/// Sentinel for "no node" in u32 node-index fields (parent of a root, link).
pub const NODE_NONE: u32 = u32::MAX;

/// Largest embedding dimension accepted at `init`.
pub const MAX_DIM_COUNT: u32 = 16_384;

/// Largest uncompressed payload (scenario + all fields) accepted on insert.
pub const MAX_PAYLOAD_BYTES: usize = 4 * 1024 * 1024;

/// Vector rows are padded to this alignment so SIMD loads never straddle a
/// cache line and every row starts on a 64-byte boundary of the mapping.
pub const VECTOR_ALIGN_BYTES: u32 = 64;

/// Bytes of one vector row for `dim_count` f32 components, padded to 64.
pub fn vector_stride_bytes(dim_count: u32) -> u32 {
    let raw = dim_count * 4;
    raw.div_ceil(VECTOR_ALIGN_BYTES) * VECTOR_ALIGN_BYTES
}

/// Default rows per segment: the largest power of two whose vector segment
/// (`row_stride_bytes` per row, so an f16 bank gets twice the rows of an
/// f32 one) stays within 64 MiB, clamped to [1024, 65536]. Fixed-size
/// segments let the bank grow without ever remapping a live mapping.
pub fn default_rows_per_segment(row_stride_bytes: u32) -> u32 {
    let stride = u64::from(row_stride_bytes);
    let budget_bytes: u64 = 64 * 1024 * 1024;
    let mut rows: u64 = 65_536;
    while rows > u64::from(INIT_MIN_ROWS_PER_SEGMENT) && rows * stride > budget_bytes {
        rows /= 2;
    }
    rows as u32
}

/// Most segments a bank may have. A process maps up to three files per
/// segment (node table, vectors, int8 side column), so a bank never needs
/// more than 12,288 mappings: under a fifth of Linux's default
/// `vm.max_map_count` (65,530), leaving the rest to the host process.
pub const MAX_SEGMENT_COUNT: u32 = 4096;

/// Fewest rows per segment `init` accepts, so that every bank holds at
/// least `INIT_MIN_ROWS_PER_SEGMENT * MAX_SEGMENT_COUNT` = 4,194,304 nodes.
/// (The library accepts smaller segments, down to 1, for tests that need
/// many segments; the segment cap holds for them too.)
pub const INIT_MIN_ROWS_PER_SEGMENT: u32 = 1024;

/// Most nodes a bank with `rows_per_segment` rows per segment can hold:
/// `MAX_SEGMENT_COUNT` segments, and never `NODE_NONE` or past it.
pub fn node_capacity(rows_per_segment: u32) -> u64 {
    (u64::from(rows_per_segment) * u64::from(MAX_SEGMENT_COUNT)).min(u64::from(NODE_NONE))
}

/// CRC-32 (IEEE, as computed by crc32fast) of `bytes`.
pub fn crc32(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// CRC of the vector bytes as stored (little-endian f32 components).
pub fn vector_crc32(vector: &[f32]) -> u32 {
    crc32(bytemuck::cast_slice(vector))
}

/// Lanes of the lane sum (`lane_sum32`): 16 words, one 64-byte cache line.
pub const LANE_SUM_LANES: usize = 16;

/// The odd weight of each lane in `lane_sum32`'s fold. Odd, so a change of
/// any one word changes the folded value (an odd number is invertible mod
/// 2^32); distinct, so moving a word to another lane usually does too.
pub const LANE_SUM_WEIGHTS: [u32; LANE_SUM_LANES] = {
    let mut w = [0u32; LANE_SUM_LANES];
    let mut j = 0;
    while j < LANE_SUM_LANES {
        w[j] = 0x9E37_79B9u32.wrapping_mul(2 * j as u32 + 1) | 1;
        j += 1;
    }
    w
};

/// The lane sum of stored bytes (FORMAT.md "Node row", `vector_sum32`): the
/// bytes as little-endian u32 words (the last one zero-extended), word `i`
/// added (wrapping) into lane `i % 16`, and the lanes folded by
/// `fold_lanes`. A scan kernel computes it with one integer add per load
/// while it reads the row for the dot product, so checking a vector on
/// first read costs no second pass; this is the portable definition every
/// kernel must equal, and the one function writers call.
///
/// Whole 64-byte blocks (16 words, one per lane) are added lane by lane,
/// a loop the compiler vectorises: `verify`, `compact` and writers sum
/// every stored vector, and a word-at-a-time loop was a quarter of
/// `verify`'s time. The tail's words start again at lane 0.
pub fn lane_sum32(bytes: &[u8]) -> u32 {
    let mut lanes = [0u32; LANE_SUM_LANES];
    let mut blocks = bytes.chunks_exact(4 * LANE_SUM_LANES);
    for block in &mut blocks {
        for (lane, word) in lanes.iter_mut().zip(block.chunks_exact(4)) {
            *lane = lane.wrapping_add(u32::from_le_bytes([word[0], word[1], word[2], word[3]]));
        }
    }
    for (lane, word) in lanes.iter_mut().zip(blocks.remainder().chunks(4)) {
        let mut w = [0u8; 4];
        w[..word.len()].copy_from_slice(word);
        *lane = lane.wrapping_add(u32::from_le_bytes(w));
    }
    fold_lanes(&lanes)
}

/// Folds 16 lane totals into the 32-bit lane sum: `sum_j w_j * lane_j`
/// (wrapping), `w` = `LANE_SUM_WEIGHTS`.
pub fn fold_lanes(lanes: &[u32; LANE_SUM_LANES]) -> u32 {
    lanes
        .iter()
        .zip(LANE_SUM_WEIGHTS)
        .fold(0u32, |acc, (&lane, w)| acc.wrapping_add(lane.wrapping_mul(w)))
}

pub(crate) fn get_u16(buf: &[u8], offset: usize) -> u16 {
    u16::from_le_bytes([buf[offset], buf[offset + 1]])
}

pub(crate) fn get_u32(buf: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(buf[offset..offset + 4].try_into().expect("4-byte slice"))
}

pub(crate) fn get_u64(buf: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(buf[offset..offset + 8].try_into().expect("8-byte slice"))
}

pub(crate) fn get_f32(buf: &[u8], offset: usize) -> f32 {
    f32::from_bits(get_u32(buf, offset))
}

pub(crate) fn put_u16(buf: &mut [u8], offset: usize, value: u16) {
    buf[offset..offset + 2].copy_from_slice(&value.to_le_bytes());
}

pub(crate) fn put_u32(buf: &mut [u8], offset: usize, value: u32) {
    buf[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
}

pub(crate) fn put_u64(buf: &mut [u8], offset: usize, value: u64) {
    buf[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
}

pub(crate) fn put_f32(buf: &mut [u8], offset: usize, value: f32) {
    put_u32(buf, offset, value.to_bits());
}

/// Checks that `buf` holds at least `need` bytes.
pub(crate) fn need(what: &'static str, buf: &[u8], need_bytes: usize) -> Result<(), FormatError> {
    if buf.len() < need_bytes {
        return Err(FormatError::Truncated {
            what,
            need_bytes: need_bytes as u64,
            have_bytes: buf.len() as u64,
        });
    }
    Ok(())
}

/// Reserved bytes must be zero: a non-zero reserved byte under a valid CRC
/// means a layout this build does not know, which must not be misread.
pub(crate) fn check_zero(what: &'static str, buf: &[u8], range: std::ops::Range<usize>) -> Result<(), FormatError> {
    match buf[range.clone()].iter().position(|&b| b != 0) {
        None => Ok(()),
        Some(at) => Err(FormatError::Invalid {
            what,
            offset_bytes: (range.start + at) as u64,
            detail: "reserved byte is not zero".into(),
        }),
    }
}

/// Verifies a trailing or embedded CRC field.
pub(crate) fn check_crc(what: &'static str, offset_bytes: u64, stored: u32, computed: u32) -> Result<(), FormatError> {
    if stored != computed {
        return Err(FormatError::Checksum {
            what,
            offset_bytes,
            stored,
            computed,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {

    /// The blocked `lane_sum32` equals its definition (word `i` into lane
    /// `i % 16`, last word zero-extended) at every length around the
    /// 64-byte block edges.
    #[test]
    fn lane_sum32_matches_its_word_by_word_definition() {
        let bytes: Vec<u8> = (0..300u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in 0..bytes.len() {
            let mut lanes = [0u32; LANE_SUM_LANES];
            for (i, word) in bytes[..len].chunks(4).enumerate() {
                let mut w = [0u8; 4];
                w[..word.len()].copy_from_slice(word);
                lanes[i % LANE_SUM_LANES] = lanes[i % LANE_SUM_LANES].wrapping_add(u32::from_le_bytes(w));
            }
            assert_eq!(lane_sum32(&bytes[..len]), fold_lanes(&lanes), "length {len}");
        }
    }
    use super::*;

    #[test]
    fn stride_is_padded_to_64() {
        assert_eq!(vector_stride_bytes(1), 64);
        assert_eq!(vector_stride_bytes(16), 64);
        assert_eq!(vector_stride_bytes(17), 128);
        assert_eq!(vector_stride_bytes(768), 3072);
        assert_eq!(vector_stride_bytes(384), 1536);
    }

    #[test]
    fn default_segment_fits_budget() {
        for dim in [1, 8, 384, 768, 1024, 4096, 16_384] {
            for stride in [vector_stride_bytes(dim), (dim * 2).next_multiple_of(64)] {
                let rows = default_rows_per_segment(stride);
                assert!(rows.is_power_of_two());
                assert!((1024..=65_536).contains(&rows));
                let seg = u64::from(rows) * u64::from(stride);
                assert!(seg <= 64 * 1024 * 1024 || rows == 1024, "dim {dim}");
                assert!(
                    rows == 65_536 || seg * 2 > 64 * 1024 * 1024,
                    "dim {dim}: not the largest"
                );
            }
        }
    }
}

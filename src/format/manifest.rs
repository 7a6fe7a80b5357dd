//! The manifest (superblock): bank geometry, tree table and the checkpoint.
//! One fixed-size block, replaced atomically (write temp, fsync, rename,
//! fsync directory) at every checkpoint.

use super::*;

pub const MANIFEST_MAGIC: [u8; 8] = *b"DMEMBANK";
pub const MANIFEST_SIZE_BYTES: usize = 1024;

pub const MAN_MAGIC_OFFSET: usize = 0;
pub const MAN_VERSION_OFFSET: usize = 8;
pub const MAN_SIZE_OFFSET: usize = 12;
pub const MAN_SEQUENCE_OFFSET: usize = 16;
pub const MAN_FLAGS_OFFSET: usize = 24;
pub const MAN_DIM_OFFSET: usize = 28;
pub const MAN_STRIDE_OFFSET: usize = 32;
pub const MAN_ROWS_PER_SEGMENT_OFFSET: usize = 36;
pub const MAN_EPS_OFFSET: usize = 40;
pub const MAN_MAX_DEPTH_OFFSET: usize = 44;
pub const MAN_TREE_COUNT_OFFSET: usize = 45;
pub const MAN_PRECISION_OFFSET: usize = 46;
pub const MAN_CONSOLIDATE_AFTER_OFFSET: usize = 48;
pub const MAN_GENERATION_OFFSET: usize = 52;
pub const MAN_CHECKPOINT_LSN_OFFSET: usize = 56;
pub const MAN_NODE_COUNT_OFFSET: usize = 64;
pub const MAN_PAYLOAD_END_OFFSET: usize = 72;
pub const MAN_WAL_SALT_OFFSET: usize = 80;
pub const MAN_CREATED_OFFSET: usize = 88;
pub const MAN_TREES_OFFSET: usize = 128;
pub const MAN_CRC_OFFSET: usize = 1020;

pub const MAX_TREES: usize = 16;
pub const TREE_ENTRY_SIZE_BYTES: usize = 48;
pub const TREE_NAME_MAX_BYTES: usize = 40;
pub const TREE_TAU_OFFSET: usize = 40;

/// Manifest flag: the bank is frozen (read-only forever, WAL empty).
pub const MANIFEST_FLAG_FROZEN: u32 = 1;

/// Byte ranges of the manifest that must be zero (FORMAT.md "Manifest").
pub const MANIFEST_RESERVED: [std::ops::Range<usize>; 3] = [
    MAN_PRECISION_OFFSET + 1..MAN_CONSOLIDATE_AFTER_OFFSET,
    MAN_CREATED_OFFSET + 8..MAN_TREES_OFFSET,
    MAN_TREES_OFFSET + MAX_TREES * TREE_ENTRY_SIZE_BYTES..MAN_CRC_OFFSET,
];
/// Byte ranges of a tree entry that must be zero (FORMAT.md "Tree entry").
// An array of one range (not the range itself), like every table's.
#[allow(clippy::single_range_in_vec_init)]
pub const TREE_ENTRY_RESERVED: [std::ops::Range<usize>; 1] = [TREE_TAU_OFFSET + 4..TREE_ENTRY_SIZE_BYTES];

/// How the embedding column is stored, fixed at `init` (FORMAT.md §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Precision {
    /// f32 column only.
    #[default]
    F32 = 0,
    /// The column of record is IEEE binary16: half the bytes, scores
    /// within a documented bound of the f32 ones.
    F16 = 1,
    /// f32 column of record plus a derived int8 side column for a fast
    /// first pass; answers equal the f32 scan's (exact re-rank).
    Int8 = 2,
}

impl Precision {
    pub fn from_u8(value: u8) -> Option<Precision> {
        match value {
            0 => Some(Precision::F32),
            1 => Some(Precision::F16),
            2 => Some(Precision::Int8),
            _ => None,
        }
    }

    pub fn parse(text: &str) -> Option<Precision> {
        match text {
            "f32" => Some(Precision::F32),
            "f16" => Some(Precision::F16),
            "int8" => Some(Precision::Int8),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::F16 => "f16",
            Precision::Int8 => "int8",
        }
    }

    /// Bytes of one stored component in the vector segments.
    pub fn component_bytes(self) -> u32 {
        match self {
            Precision::F16 => 2,
            Precision::F32 | Precision::Int8 => 4,
        }
    }

    /// Bytes of one row of the vector segments: the components, padded to 64.
    pub fn vector_stride_bytes(self, dim_count: u32) -> u32 {
        (dim_count * self.component_bytes()).div_ceil(VECTOR_ALIGN_BYTES) * VECTOR_ALIGN_BYTES
    }

    /// Bytes of one row of the int8 side column (f32 scale, then one byte
    /// per component), padded to 64; only `Int8` banks have that column.
    pub fn qvector_stride_bytes(self, dim_count: u32) -> Option<u32> {
        (self == Precision::Int8).then(|| (4 + dim_count).div_ceil(VECTOR_ALIGN_BYTES) * VECTOR_ALIGN_BYTES)
    }
}

const WHAT: &str = "manifest";

#[derive(Debug, Clone, PartialEq)]
pub struct TreeSpec {
    pub name: String,
    /// Match threshold (inclusive) for this tree's scans.
    pub tau: f32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// The format version of the bank (1 or 2, FORMAT.md §3): version 2
    /// rows carry lane sums. Kept by checkpoints; `compact` and `freeze`
    /// write the current one.
    pub version: u32,
    pub sequence: u64,
    pub flags: u32,
    pub dim_count: u32,
    pub row_stride_bytes: u32,
    pub rows_per_segment: u32,
    /// How the vector column is stored; decides `row_stride_bytes`.
    pub precision: Precision,
    pub eps: f32,
    pub max_depth: u8,
    pub consolidate_after: u32,
    /// Which set of data files is live; `compact` writes the next one
    /// beside it and switches by replacing the manifest.
    pub generation: u32,
    pub checkpoint_lsn: u64,
    pub node_count: u64,
    pub payload_end_bytes: u64,
    pub wal_salt: u64,
    pub created_unix_ms: u64,
    pub trees: Vec<TreeSpec>,
}

impl Manifest {
    pub fn is_frozen(&self) -> bool {
        self.flags & MANIFEST_FLAG_FROZEN != 0
    }

    pub fn tree_index(&self, name: &str) -> Option<u16> {
        self.trees.iter().position(|t| t.name == name).map(|i| i as u16)
    }

    pub fn encode(&self) -> [u8; MANIFEST_SIZE_BYTES] {
        assert!(self.trees.len() <= MAX_TREES);
        let mut b = [0u8; MANIFEST_SIZE_BYTES];
        b[MAN_MAGIC_OFFSET..MAN_MAGIC_OFFSET + 8].copy_from_slice(&MANIFEST_MAGIC);
        assert!((OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&self.version));
        put_u32(&mut b, MAN_VERSION_OFFSET, self.version);
        put_u32(&mut b, MAN_SIZE_OFFSET, MANIFEST_SIZE_BYTES as u32);
        put_u64(&mut b, MAN_SEQUENCE_OFFSET, self.sequence);
        put_u32(&mut b, MAN_FLAGS_OFFSET, self.flags);
        put_u32(&mut b, MAN_DIM_OFFSET, self.dim_count);
        put_u32(&mut b, MAN_STRIDE_OFFSET, self.row_stride_bytes);
        put_u32(&mut b, MAN_ROWS_PER_SEGMENT_OFFSET, self.rows_per_segment);
        put_f32(&mut b, MAN_EPS_OFFSET, self.eps);
        b[MAN_MAX_DEPTH_OFFSET] = self.max_depth;
        b[MAN_TREE_COUNT_OFFSET] = self.trees.len() as u8;
        b[MAN_PRECISION_OFFSET] = self.precision as u8;
        put_u32(&mut b, MAN_CONSOLIDATE_AFTER_OFFSET, self.consolidate_after);
        put_u32(&mut b, MAN_GENERATION_OFFSET, self.generation);
        put_u64(&mut b, MAN_CHECKPOINT_LSN_OFFSET, self.checkpoint_lsn);
        put_u64(&mut b, MAN_NODE_COUNT_OFFSET, self.node_count);
        put_u64(&mut b, MAN_PAYLOAD_END_OFFSET, self.payload_end_bytes);
        put_u64(&mut b, MAN_WAL_SALT_OFFSET, self.wal_salt);
        put_u64(&mut b, MAN_CREATED_OFFSET, self.created_unix_ms);
        for (i, tree) in self.trees.iter().enumerate() {
            let at = MAN_TREES_OFFSET + i * TREE_ENTRY_SIZE_BYTES;
            let name = tree.name.as_bytes();
            assert!(name.len() <= TREE_NAME_MAX_BYTES);
            b[at..at + name.len()].copy_from_slice(name);
            put_f32(&mut b, at + TREE_TAU_OFFSET, tree.tau);
        }
        let crc = crc32(&b[..MAN_CRC_OFFSET]);
        put_u32(&mut b, MAN_CRC_OFFSET, crc);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Manifest, FormatError> {
        need(WHAT, b, MANIFEST_SIZE_BYTES)?;
        if b.len() != MANIFEST_SIZE_BYTES {
            // Bytes past the CRC'd 1,024 are not the manifest's: a file
            // that long was not written by a checkpoint.
            return Err(FormatError::Invalid {
                what: WHAT,
                offset_bytes: MANIFEST_SIZE_BYTES as u64,
                detail: format!("file is {} bytes, a manifest is exactly {MANIFEST_SIZE_BYTES}", b.len()),
            });
        }
        if b[..8] != MANIFEST_MAGIC {
            return Err(FormatError::BadMagic {
                what: WHAT,
                offset_bytes: 0,
            });
        }
        // Version is checked before the CRC so that a future version with a
        // different layout gets the clear "unsupported version" message.
        let version = get_u32(b, MAN_VERSION_OFFSET);
        if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(FormatError::UnsupportedVersion {
                what: WHAT,
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        check_crc(
            WHAT,
            MAN_CRC_OFFSET as u64,
            get_u32(b, MAN_CRC_OFFSET),
            crc32(&b[..MAN_CRC_OFFSET]),
        )?;
        for reserved in MANIFEST_RESERVED {
            check_zero(WHAT, b, reserved)?;
        }
        let flags = get_u32(b, MAN_FLAGS_OFFSET);
        if flags & !MANIFEST_FLAG_FROZEN != 0 {
            return Err(FormatError::Invalid {
                what: WHAT,
                offset_bytes: MAN_FLAGS_OFFSET as u64,
                detail: format!("unknown flags {flags:#x}"),
            });
        }
        let precision = Precision::from_u8(b[MAN_PRECISION_OFFSET]).ok_or_else(|| FormatError::Invalid {
            what: WHAT,
            offset_bytes: MAN_PRECISION_OFFSET as u64,
            detail: format!("unknown precision {}", b[MAN_PRECISION_OFFSET]),
        })?;
        let m = Manifest {
            version,
            sequence: get_u64(b, MAN_SEQUENCE_OFFSET),
            flags,
            dim_count: get_u32(b, MAN_DIM_OFFSET),
            row_stride_bytes: get_u32(b, MAN_STRIDE_OFFSET),
            rows_per_segment: get_u32(b, MAN_ROWS_PER_SEGMENT_OFFSET),
            precision,
            eps: get_f32(b, MAN_EPS_OFFSET),
            max_depth: b[MAN_MAX_DEPTH_OFFSET],
            consolidate_after: get_u32(b, MAN_CONSOLIDATE_AFTER_OFFSET),
            generation: get_u32(b, MAN_GENERATION_OFFSET),
            checkpoint_lsn: get_u64(b, MAN_CHECKPOINT_LSN_OFFSET),
            node_count: get_u64(b, MAN_NODE_COUNT_OFFSET),
            payload_end_bytes: get_u64(b, MAN_PAYLOAD_END_OFFSET),
            wal_salt: get_u64(b, MAN_WAL_SALT_OFFSET),
            created_unix_ms: get_u64(b, MAN_CREATED_OFFSET),
            trees: decode_trees(b)?,
        };
        m.validate()?;
        Ok(m)
    }

    /// Structural checks shared by decode and by `init` (a CRC-valid block
    /// can still hold values this build cannot work with).
    pub fn validate(&self) -> Result<(), FormatError> {
        let bad = |offset: usize, detail: String| {
            Err(FormatError::Invalid {
                what: WHAT,
                offset_bytes: offset as u64,
                detail,
            })
        };
        let settings = Settings {
            dim_count: self.dim_count,
            rows_per_segment: self.rows_per_segment,
            eps: self.eps,
            max_depth: self.max_depth,
            consolidate_after: self.consolidate_after,
            trees: &self.trees,
        };
        if let Err((offset, detail)) = settings.check() {
            return bad(offset, detail);
        }
        if self.row_stride_bytes != self.precision.vector_stride_bytes(self.dim_count) {
            return bad(
                MAN_STRIDE_OFFSET,
                format!("row stride {} does not match dimension", self.row_stride_bytes),
            );
        }
        if self.node_count >= u64::from(NODE_NONE) {
            return bad(MAN_NODE_COUNT_OFFSET, format!("node count {}", self.node_count));
        }
        if self.node_count > super::node_capacity(self.rows_per_segment) {
            return bad(
                MAN_NODE_COUNT_OFFSET,
                format!(
                    "node count {} needs more than {} segments of {} rows",
                    self.node_count,
                    super::MAX_SEGMENT_COUNT,
                    self.rows_per_segment
                ),
            );
        }
        Ok(())
    }
}

/// Rows per segment a bank may have (`rows_per_segment`).
pub const MIN_ROWS_PER_SEGMENT: u32 = 1;
pub const MAX_ROWS_PER_SEGMENT: u32 = 1 << 20;

/// The range of a similarity threshold: for `init` and for every query.
pub fn check_tau(tau: f32) -> Result<(), String> {
    match tau.is_finite() && (-1.0..=1.0).contains(&tau) {
        true => Ok(()),
        false => Err(format!("tau {tau} outside -1..=1")),
    }
}

/// The range of the failure penalty: for `init` and for every query.
pub fn check_eps(eps: f32) -> Result<(), String> {
    match eps.is_finite() && eps >= 0.0 {
        true => Ok(()),
        false => Err(format!("eps {eps} must be finite and >= 0")),
    }
}

/// The settings fixed at `init`, as the rules of FORMAT.md §4 and §10 see
/// them: the one home of those rules, for `BankConfig::validate` (before
/// anything is written) and `Manifest::validate` (on every decode).
pub struct Settings<'a> {
    pub dim_count: u32,
    pub rows_per_segment: u32,
    pub eps: f32,
    pub max_depth: u8,
    pub consolidate_after: u32,
    pub trees: &'a [TreeSpec],
}

impl Settings<'_> {
    /// The first rule broken: the manifest offset of the field and what is
    /// wrong, naming the field and its allowed range.
    pub fn check(&self) -> Result<(), (usize, String)> {
        if self.dim_count == 0 || self.dim_count > MAX_DIM_COUNT {
            let detail = format!("dimension {} outside 1..={MAX_DIM_COUNT}", self.dim_count);
            return Err((MAN_DIM_OFFSET, detail));
        }
        if !(MIN_ROWS_PER_SEGMENT..=MAX_ROWS_PER_SEGMENT).contains(&self.rows_per_segment) {
            let detail = format!(
                "rows per segment {} outside {MIN_ROWS_PER_SEGMENT}..={MAX_ROWS_PER_SEGMENT}",
                self.rows_per_segment
            );
            return Err((MAN_ROWS_PER_SEGMENT_OFFSET, detail));
        }
        check_eps(self.eps).map_err(|detail| (MAN_EPS_OFFSET, detail))?;
        if self.max_depth == 0 {
            return Err((MAN_MAX_DEPTH_OFFSET, "max depth 0 outside 1..=255".into()));
        }
        if self.consolidate_after == 0 {
            return Err((
                MAN_CONSOLIDATE_AFTER_OFFSET,
                "consolidate-after 0 must be at least 1".into(),
            ));
        }
        if self.trees.is_empty() || self.trees.len() > MAX_TREES {
            let detail = format!("{} trees, allowed 1..={MAX_TREES}", self.trees.len());
            return Err((MAN_TREE_COUNT_OFFSET, detail));
        }
        for (i, tree) in self.trees.iter().enumerate() {
            let at = MAN_TREES_OFFSET + i * TREE_ENTRY_SIZE_BYTES;
            if tree.name.is_empty() || tree.name.len() > TREE_NAME_MAX_BYTES || tree.name.contains('\0') {
                let detail = format!(
                    "tree name {:?} must be 1..={TREE_NAME_MAX_BYTES} bytes, no NUL",
                    tree.name
                );
                return Err((at, detail));
            }
            if let Err(detail) = check_tau(tree.tau) {
                return Err((at + TREE_TAU_OFFSET, format!("tree {:?}: {detail}", tree.name)));
            }
            if self.trees[..i].iter().any(|t| t.name == tree.name) {
                return Err((at, format!("tree {:?} given twice", tree.name)));
            }
        }
        Ok(())
    }
}

fn decode_trees(b: &[u8]) -> Result<Vec<TreeSpec>, FormatError> {
    let count = usize::from(b[MAN_TREE_COUNT_OFFSET]);
    if count > MAX_TREES {
        return Err(FormatError::Invalid {
            what: WHAT,
            offset_bytes: MAN_TREE_COUNT_OFFSET as u64,
            detail: format!("tree count {count} > {MAX_TREES}"),
        });
    }
    // Slots past tree_count must be empty: an entry there under a valid
    // CRC is a layout this build does not know (found by fuzzing).
    let unused = MAN_TREES_OFFSET + count * TREE_ENTRY_SIZE_BYTES..MAN_TREES_OFFSET + MAX_TREES * TREE_ENTRY_SIZE_BYTES;
    check_zero(WHAT, b, unused)?;
    let mut trees = Vec::with_capacity(count);
    for i in 0..count {
        let at = MAN_TREES_OFFSET + i * TREE_ENTRY_SIZE_BYTES;
        let raw = &b[at..at + TREE_NAME_MAX_BYTES];
        let len = raw.iter().position(|&c| c == 0).unwrap_or(TREE_NAME_MAX_BYTES);
        check_zero(WHAT, b, at + len..at + TREE_NAME_MAX_BYTES)?;
        for reserved in TREE_ENTRY_RESERVED {
            check_zero(WHAT, b, at + reserved.start..at + reserved.end)?;
        }
        let name = std::str::from_utf8(&raw[..len]).map_err(|_| FormatError::Invalid {
            what: WHAT,
            offset_bytes: at as u64,
            detail: "tree name is not UTF-8".into(),
        })?;
        if name.is_empty() {
            return Err(FormatError::Invalid {
                what: WHAT,
                offset_bytes: at as u64,
                detail: "empty tree name".into(),
            });
        }
        trees.push(TreeSpec {
            name: name.to_string(),
            tau: get_f32(b, at + TREE_TAU_OFFSET),
        });
    }
    Ok(trees)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample() -> Manifest {
        Manifest {
            version: FORMAT_VERSION,
            sequence: 7,
            flags: 0,
            dim_count: 768,
            row_stride_bytes: vector_stride_bytes(768),
            rows_per_segment: 16_384,
            precision: Precision::F32,
            eps: 0.05,
            max_depth: 5,
            consolidate_after: 3,
            generation: 2,
            checkpoint_lsn: 41,
            node_count: 40,
            payload_end_bytes: 9000,
            wal_salt: 0xDEAD_BEEF_0123_4567,
            created_unix_ms: 1_700_000_000_000,
            trees: vec![
                TreeSpec {
                    name: "task".into(),
                    tau: 0.82,
                },
                TreeSpec {
                    name: "env".into(),
                    tau: 0.85,
                },
            ],
        }
    }

    #[test]
    fn roundtrip() {
        let m = sample();
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let good = sample().encode();
        for byte in 0..MANIFEST_SIZE_BYTES {
            for bit in 0..8 {
                let mut b = good;
                b[byte] ^= 1 << bit;
                assert!(Manifest::decode(&b).is_err(), "flip at byte {byte} bit {bit} accepted");
            }
        }
    }

    #[test]
    fn precision_roundtrips_and_sets_the_stride() {
        for (precision, stride) in [(Precision::F32, 3072), (Precision::F16, 1536), (Precision::Int8, 3072)] {
            let m = Manifest {
                precision,
                row_stride_bytes: stride,
                ..sample()
            };
            assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
            let wrong = Manifest {
                row_stride_bytes: if stride == 3072 { 1536 } else { 3072 },
                ..m
            };
            assert!(wrong.validate().is_err(), "{precision:?}");
        }
        assert_eq!(Precision::Int8.qvector_stride_bytes(768), Some(832));
        assert_eq!(Precision::Int8.qvector_stride_bytes(60), Some(64));
        assert_eq!(Precision::F16.qvector_stride_bytes(768), None);
        let mut b = sample().encode();
        b[MAN_PRECISION_OFFSET] = 3;
        let crc = crc32(&b[..MAN_CRC_OFFSET]);
        put_u32(&mut b, MAN_CRC_OFFSET, crc);
        assert!(Manifest::decode(&b).is_err());
    }

    #[test]
    fn a_tree_entry_past_tree_count_is_refused() {
        let mut b = sample().encode();
        let slot = MAN_TREES_OFFSET + 2 * TREE_ENTRY_SIZE_BYTES;
        b[slot..slot + 3].copy_from_slice(b"xyz");
        let crc = crc32(&b[..MAN_CRC_OFFSET]);
        put_u32(&mut b, MAN_CRC_OFFSET, crc);
        let err = Manifest::decode(&b).unwrap_err();
        assert!(
            matches!(err, FormatError::Invalid { offset_bytes, .. } if offset_bytes == slot as u64),
            "{err}"
        );
    }

    #[test]
    fn unknown_version_is_refused_by_name() {
        let mut b = sample().encode();
        for version in [0, FORMAT_VERSION + 1] {
            put_u32(&mut b, MAN_VERSION_OFFSET, version);
            let err = Manifest::decode(&b).unwrap_err();
            assert!(
                matches!(err, FormatError::UnsupportedVersion { found, .. } if found == version),
                "{err}"
            );
        }
    }
}

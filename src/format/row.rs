//! Node-table rows: one fixed 128-byte little-endian record per node.
//! The fields the scan filters on (tree, type, label, depth, flags) sit in
//! the first 16 bytes so the scan touches one cache line per row.

use super::*;

pub const ROW_SIZE_BYTES: usize = 128;

pub const ROW_INDEX_OFFSET: usize = 0;
pub const ROW_PARENT_OFFSET: usize = 4;
pub const ROW_TREE_OFFSET: usize = 8;
pub const ROW_TYPE_OFFSET: usize = 10;
pub const ROW_LABEL_OFFSET: usize = 11;
pub const ROW_DEPTH_OFFSET: usize = 12;
pub const ROW_FLAGS_OFFSET: usize = 13;
pub const ROW_SUCCESS_HITS_OFFSET: usize = 16;
pub const ROW_RETRIEVALS_OFFSET: usize = 20;
pub const ROW_LINK_OFFSET: usize = 24;
pub const ROW_VECTOR_CRC_OFFSET: usize = 28;
pub const ROW_PAYLOAD_OFFSET_OFFSET: usize = 32;
pub const ROW_PAYLOAD_SIZE_OFFSET: usize = 40;
pub const ROW_VECTOR_SUM_OFFSET: usize = 44;
pub const ROW_CREATED_OFFSET: usize = 48;
pub const ROW_EXTERNAL_ID_OFFSET: usize = 56;
pub const ROW_QVECTOR_SUM_OFFSET: usize = 72;
pub const ROW_CRC_OFFSET: usize = 124;

pub const EXTERNAL_ID_MAX_BYTES: usize = 16;

/// Byte ranges of a row that must be zero (FORMAT.md "Node row").
pub const ROW_RESERVED: [std::ops::Range<usize>; 2] = [
    ROW_FLAGS_OFFSET + 1..ROW_SUCCESS_HITS_OFFSET,
    ROW_QVECTOR_SUM_OFFSET + 4..ROW_CRC_OFFSET,
];

/// The lane-sum fields, reserved (zero) in format version 1 rows.
pub const ROW_SUMS_V1_RESERVED: [std::ops::Range<usize>; 2] = [
    ROW_VECTOR_SUM_OFFSET..ROW_VECTOR_SUM_OFFSET + 4,
    ROW_QVECTOR_SUM_OFFSET..ROW_QVECTOR_SUM_OFFSET + 4,
];

/// What a residue check of a whole row gives: the CRC-32 of any message
/// followed by its own CRC (little-endian) is this constant, so
/// `crc32(row[0..128]) == ROW_CRC_RESIDUE` holds exactly when the stored
/// `crc32` equals `crc32(row[0..124])`. One 128-byte CRC is the fast
/// path of crc32fast; 124 bytes is not.
pub const ROW_CRC_RESIDUE: u32 = 0x2144_DF1C;

/// Row flag: this node's chain was distilled into a new root.
pub const FLAG_CONSOLIDATED: u8 = 1 << 0;
/// Row flag: this root was produced by consolidation.
pub const FLAG_CONSOLIDATED_ROOT: u8 = 1 << 1;
/// Row flag: `external_id` holds a value.
pub const FLAG_HAS_EXTERNAL_ID: u8 = 1 << 2;
/// Row flag: `external_id` holds the 16 bytes of a UUID (else UTF-8 text).
pub const FLAG_EXTERNAL_ID_UUID: u8 = 1 << 3;
const KNOWN_FLAGS: u8 = 0x0F;

const WHAT: &str = "node row";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeType {
    Root = 0,
    Residual = 1,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Label {
    Success = 0,
    Failure = 1,
}

impl NodeType {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeType::Root => "ROOT",
            NodeType::Residual => "RESIDUAL",
        }
    }
}

impl Label {
    pub fn as_str(self) -> &'static str {
        match self {
            Label::Success => "SUCCESS",
            Label::Failure => "FAILURE",
        }
    }

    pub fn parse(text: &str) -> Option<Label> {
        match text {
            "SUCCESS" => Some(Label::Success),
            "FAILURE" => Some(Label::Failure),
            _ => None,
        }
    }
}

/// What a row's fields are checked against: the bank's manifest.
#[derive(Debug, Clone, Copy)]
pub struct RowBounds {
    pub tree_count: usize,
    pub max_depth: u8,
    pub version: u32,
    pub has_side_column: bool,
}

/// A decoded node-table row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub index: u32,
    /// `NODE_NONE` for a top-level root (its parent is the virtual root).
    pub parent: u32,
    pub tree: u16,
    pub node_type: NodeType,
    pub label: Label,
    /// 1 for a top-level root; parent depth + 1 otherwise.
    pub depth: u8,
    pub flags: u8,
    pub success_hits: u32,
    pub retrievals: u32,
    /// For a consolidated node: the root distilled from it. For a
    /// consolidated root: its source node. Otherwise `NODE_NONE`.
    pub link: u32,
    pub vector_crc32: u32,
    pub payload_offset_bytes: u64,
    pub payload_size_bytes: u32,
    /// `lane_sum32` of the stored vector bytes (format 2; 0 in format 1).
    pub vector_sum32: u32,
    pub created_unix_ms: u64,
    pub external_id: [u8; EXTERNAL_ID_MAX_BYTES],
    /// `lane_sum32` of the whole int8 side-column row (format 2, precision
    /// 2; 0 otherwise).
    pub qvector_sum32: u32,
}

impl Row {
    pub fn is_consolidated(&self) -> bool {
        self.flags & FLAG_CONSOLIDATED != 0
    }

    pub fn is_consolidated_root(&self) -> bool {
        self.flags & FLAG_CONSOLIDATED_ROOT != 0
    }

    pub fn parent(&self) -> Option<u32> {
        (self.parent != NODE_NONE).then_some(self.parent)
    }

    pub fn link(&self) -> Option<u32> {
        (self.link != NODE_NONE).then_some(self.link)
    }

    pub fn encode(&self) -> [u8; ROW_SIZE_BYTES] {
        let mut b = [0u8; ROW_SIZE_BYTES];
        put_u32(&mut b, ROW_INDEX_OFFSET, self.index);
        put_u32(&mut b, ROW_PARENT_OFFSET, self.parent);
        put_u16(&mut b, ROW_TREE_OFFSET, self.tree);
        b[ROW_TYPE_OFFSET] = self.node_type as u8;
        b[ROW_LABEL_OFFSET] = self.label as u8;
        b[ROW_DEPTH_OFFSET] = self.depth;
        b[ROW_FLAGS_OFFSET] = self.flags;
        put_u32(&mut b, ROW_SUCCESS_HITS_OFFSET, self.success_hits);
        put_u32(&mut b, ROW_RETRIEVALS_OFFSET, self.retrievals);
        put_u32(&mut b, ROW_LINK_OFFSET, self.link);
        put_u32(&mut b, ROW_VECTOR_CRC_OFFSET, self.vector_crc32);
        put_u64(&mut b, ROW_PAYLOAD_OFFSET_OFFSET, self.payload_offset_bytes);
        put_u32(&mut b, ROW_PAYLOAD_SIZE_OFFSET, self.payload_size_bytes);
        put_u32(&mut b, ROW_VECTOR_SUM_OFFSET, self.vector_sum32);
        put_u64(&mut b, ROW_CREATED_OFFSET, self.created_unix_ms);
        b[ROW_EXTERNAL_ID_OFFSET..ROW_EXTERNAL_ID_OFFSET + EXTERNAL_ID_MAX_BYTES].copy_from_slice(&self.external_id);
        put_u32(&mut b, ROW_QVECTOR_SUM_OFFSET, self.qvector_sum32);
        let crc = crc32(&b[..ROW_CRC_OFFSET]);
        put_u32(&mut b, ROW_CRC_OFFSET, crc);
        b
    }

    /// The fields a reader indexes with, against the bank they belong to:
    /// a CRC-valid row can still name a tree past `tree_count`, a depth
    /// outside 1..=`max_depth` or a parent at or after itself (damage
    /// written with a fresh checksum, or a forged file). Callers index
    /// `trees[tree]` and walk parents, so such a row is corruption.
    pub fn check_ranges(&self, tree_count: usize, max_depth: u8) -> Result<(), FormatError> {
        let invalid = |offset: usize, detail: String| FormatError::Invalid {
            what: WHAT,
            offset_bytes: offset as u64,
            detail,
        };
        if usize::from(self.tree) >= tree_count {
            let detail = format!("row {} names tree {} of {tree_count}", self.index, self.tree);
            return Err(invalid(ROW_TREE_OFFSET, detail));
        }
        if self.depth == 0 || self.depth > max_depth {
            let detail = format!("row {} has depth {} outside 1..={max_depth}", self.index, self.depth);
            return Err(invalid(ROW_DEPTH_OFFSET, detail));
        }
        if self.parent().is_some_and(|p| p >= self.index) {
            let detail = format!("row {} names parent {}, not an earlier row", self.index, self.parent);
            return Err(invalid(ROW_PARENT_OFFSET, detail));
        }
        Ok(())
    }

    /// Whether `b` (a full row) passes every check of `decode`,
    /// `check_ranges` and `check_sums_allowed`, without building the row
    /// or an error: the first scan of a segment checks a million rows, and
    /// only a failing one needs the slow path's error (which must then
    /// fail: `the_fast_check_agrees_with_decode` holds the two together).
    #[inline]
    pub fn passes_checks(b: &[u8; ROW_SIZE_BYTES], expected_index: u32, bank: RowBounds) -> bool {
        let parent = get_u32(b, ROW_PARENT_OFFSET);
        let (tree, depth) = (get_u16(b, ROW_TREE_OFFSET), b[ROW_DEPTH_OFFSET]);
        let sum = get_u32(b, ROW_VECTOR_SUM_OFFSET);
        let qsum = get_u32(b, ROW_QVECTOR_SUM_OFFSET);
        let reserved_zero = ROW_RESERVED.iter().all(|r| b[r.clone()].iter().all(|&x| x == 0));
        crc32(b) == ROW_CRC_RESIDUE
            && get_u32(b, ROW_INDEX_OFFSET) == expected_index
            && b[ROW_TYPE_OFFSET] <= 1
            && b[ROW_LABEL_OFFSET] <= 1
            && b[ROW_FLAGS_OFFSET] & !KNOWN_FLAGS == 0
            && reserved_zero
            && usize::from(tree) < bank.tree_count
            && depth != 0
            && depth <= bank.max_depth
            && (parent == NODE_NONE || parent < expected_index)
            && (bank.version >= 2 || sum == 0)
            && ((bank.version >= 2 && bank.has_side_column) || qsum == 0)
            && external_id_problem(b[ROW_FLAGS_OFFSET], external_id_field(b)).is_none()
    }

    /// The lane-sum fields against the bank's format version and side
    /// column: format 1 reserved them (zero), and a bank without an int8
    /// side column has no int8 row to sum.
    pub fn check_sums_allowed(&self, version: u32, has_side_column: bool) -> Result<(), FormatError> {
        let reserved = |offset: usize, value: u32, why: &str| FormatError::Invalid {
            what: WHAT,
            offset_bytes: offset as u64,
            detail: format!("row {} holds {value:#010x} where {why} (must be zero)", self.index),
        };
        if version < 2 && self.vector_sum32 != 0 {
            return Err(reserved(
                ROW_VECTOR_SUM_OFFSET,
                self.vector_sum32,
                "format 1 reserves the bytes",
            ));
        }
        if (version < 2 || !has_side_column) && self.qvector_sum32 != 0 {
            let why = "the bank has no int8 row lane sum";
            return Err(reserved(ROW_QVECTOR_SUM_OFFSET, self.qvector_sum32, why));
        }
        Ok(())
    }

    /// Decodes and checks one row. `expected_index` is the row's position in
    /// the table: a row stored at the wrong place is corruption too.
    pub fn decode(b: &[u8], expected_index: u32) -> Result<Row, FormatError> {
        need(WHAT, b, ROW_SIZE_BYTES)?;
        if crc32(&b[..ROW_SIZE_BYTES]) != ROW_CRC_RESIDUE {
            check_crc(
                WHAT,
                ROW_CRC_OFFSET as u64,
                get_u32(b, ROW_CRC_OFFSET),
                crc32(&b[..ROW_CRC_OFFSET]),
            )?;
        }
        let invalid = |offset: usize, detail: String| FormatError::Invalid {
            what: WHAT,
            offset_bytes: offset as u64,
            detail,
        };
        let index = get_u32(b, ROW_INDEX_OFFSET);
        if index != expected_index {
            return Err(invalid(
                ROW_INDEX_OFFSET,
                format!("row {expected_index} claims index {index}"),
            ));
        }
        let node_type = match b[ROW_TYPE_OFFSET] {
            0 => NodeType::Root,
            1 => NodeType::Residual,
            other => return Err(invalid(ROW_TYPE_OFFSET, format!("node type {other}"))),
        };
        let label = match b[ROW_LABEL_OFFSET] {
            0 => Label::Success,
            1 => Label::Failure,
            other => return Err(invalid(ROW_LABEL_OFFSET, format!("label {other}"))),
        };
        let flags = b[ROW_FLAGS_OFFSET];
        if flags & !KNOWN_FLAGS != 0 {
            return Err(invalid(ROW_FLAGS_OFFSET, format!("unknown flags {flags:#04x}")));
        }
        for reserved in ROW_RESERVED {
            check_zero(WHAT, b, reserved)?;
        }
        let external_id = *external_id_field(b);
        if let Some(problem) = external_id_problem(flags, &external_id) {
            return Err(invalid(ROW_EXTERNAL_ID_OFFSET, format!("row {index}: {problem}")));
        }
        Ok(Row {
            index,
            parent: get_u32(b, ROW_PARENT_OFFSET),
            tree: get_u16(b, ROW_TREE_OFFSET),
            node_type,
            label,
            depth: b[ROW_DEPTH_OFFSET],
            flags,
            success_hits: get_u32(b, ROW_SUCCESS_HITS_OFFSET),
            retrievals: get_u32(b, ROW_RETRIEVALS_OFFSET),
            link: get_u32(b, ROW_LINK_OFFSET),
            vector_crc32: get_u32(b, ROW_VECTOR_CRC_OFFSET),
            payload_offset_bytes: get_u64(b, ROW_PAYLOAD_OFFSET_OFFSET),
            payload_size_bytes: get_u32(b, ROW_PAYLOAD_SIZE_OFFSET),
            vector_sum32: get_u32(b, ROW_VECTOR_SUM_OFFSET),
            created_unix_ms: get_u64(b, ROW_CREATED_OFFSET),
            external_id,
            qvector_sum32: get_u32(b, ROW_QVECTOR_SUM_OFFSET),
        })
    }

    /// The external id as text: a hyphenated UUID, or the stored UTF-8.
    pub fn external_id_text(&self) -> Option<String> {
        if self.flags & FLAG_HAS_EXTERNAL_ID == 0 {
            return None;
        }
        if self.flags & FLAG_EXTERNAL_ID_UUID != 0 {
            return Some(format_uuid(&self.external_id));
        }
        let len = self
            .external_id
            .iter()
            .position(|&c| c == 0)
            .unwrap_or(EXTERNAL_ID_MAX_BYTES);
        Some(String::from_utf8_lossy(&self.external_id[..len]).into_owned())
    }
}

/// The `external_id` field of a full row.
fn external_id_field(b: &[u8]) -> &[u8; EXTERNAL_ID_MAX_BYTES] {
    b[ROW_EXTERNAL_ID_OFFSET..ROW_EXTERNAL_ID_OFFSET + EXTERNAL_ID_MAX_BYTES]
        .try_into()
        .expect("the row holds the field")
}

/// Why an `external_id` field and the flags that describe it break
/// FORMAT.md §4, if they do: only what `encode_external_id` writes is
/// valid (no id: all zero; a UUID: any 16 bytes; text: 1..=16 bytes of
/// UTF-8 without NUL, zero-padded). A row past its CRC with any other id
/// would be shown as lossy text, or found under an id no insert can name.
fn external_id_problem(flags: u8, id: &[u8; EXTERNAL_ID_MAX_BYTES]) -> Option<&'static str> {
    let has_id = flags & FLAG_HAS_EXTERNAL_ID != 0;
    let is_uuid = flags & FLAG_EXTERNAL_ID_UUID != 0;
    match (has_id, is_uuid) {
        (false, true) => Some("the UUID flag is set without an external id"),
        (false, false) if id.iter().any(|&c| c != 0) => Some("external id bytes without the external id flag"),
        (false, false) | (true, true) => None,
        (true, false) => {
            let len = id.iter().position(|&c| c == 0).unwrap_or(EXTERNAL_ID_MAX_BYTES);
            if len == 0 {
                Some("empty external id text")
            } else if id[len..].iter().any(|&c| c != 0) {
                Some("external id text with a NUL inside it")
            } else if std::str::from_utf8(&id[..len]).is_err() {
                Some("external id text that is not UTF-8")
            } else {
                None
            }
        }
    }
}

/// Encodes an external id: a UUID in canonical hyphenated form is stored as
/// its 16 bytes; any other non-empty text of at most 16 bytes is stored raw.
/// Returns the bytes and the flags to set, or None if it does not fit.
pub fn encode_external_id(text: &str) -> Option<([u8; EXTERNAL_ID_MAX_BYTES], u8)> {
    if let Some(bytes) = parse_uuid(text) {
        return Some((bytes, FLAG_HAS_EXTERNAL_ID | FLAG_EXTERNAL_ID_UUID));
    }
    let raw = text.as_bytes();
    if raw.is_empty() || raw.len() > EXTERNAL_ID_MAX_BYTES || raw.contains(&0) {
        return None;
    }
    let mut out = [0u8; EXTERNAL_ID_MAX_BYTES];
    out[..raw.len()].copy_from_slice(raw);
    Some((out, FLAG_HAS_EXTERNAL_ID))
}

fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let t = text.as_bytes();
    if t.len() != 36 || t[8] != b'-' || t[13] != b'-' || t[18] != b'-' || t[23] != b'-' {
        return None;
    }
    let hex: Vec<u8> = t.iter().copied().filter(|&c| c != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        // Only lowercase hex round-trips to the same text, so accept only it.
        if s.chars().any(|c| c.is_ascii_uppercase()) {
            return None;
        }
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// The canonical lowercase hyphenated form of 16 UUID bytes.
pub fn format_uuid(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Row {
        let (external_id, idflags) = encode_external_id("15322d79-189f-4d8b-a672-ea78630c3370").unwrap();
        Row {
            index: 9,
            parent: 4,
            tree: 1,
            node_type: NodeType::Residual,
            label: Label::Failure,
            depth: 3,
            flags: FLAG_CONSOLIDATED | idflags,
            success_hits: 2,
            retrievals: 11,
            link: 12,
            vector_crc32: 0xABCD,
            payload_offset_bytes: 1 << 33,
            payload_size_bytes: 777,
            vector_sum32: 0x1234_5678,
            created_unix_ms: 1_773_056_512_000,
            external_id,
            qvector_sum32: 0x9ABC_DEF0,
        }
    }

    /// Every single-bit change of a row, with its CRC rewritten (so the
    /// field checks are reached) and without: the fast check passes
    /// exactly the rows the full decode and field checks accept.
    #[test]
    fn the_fast_check_agrees_with_decode() {
        for version in [1, 2] {
            for has_side_column in [false, true] {
                let bank = RowBounds {
                    tree_count: 2,
                    max_depth: 3,
                    version,
                    has_side_column,
                };
                // A UUID id, a text id of 5 bytes (a flip may add a byte
                // after its end or break its UTF-8) and none.
                for id in [Some("15322d79-189f-4d8b-a672-ea78630c3370"), Some("ext-1"), None] {
                    let mut row = sample();
                    (row.depth, row.parent) = (2, 4);
                    let (external_id, idflags) = id.map_or(([0; 16], 0), |t| encode_external_id(t).unwrap());
                    row.external_id = external_id;
                    row.flags = FLAG_CONSOLIDATED | idflags;
                    agree_on_every_flip(&row, bank);
                }
            }
        }
    }

    /// `passes_checks` against `decode` and the field checks, for every
    /// single-bit flip of `row` in `bank`.
    fn agree_on_every_flip(row: &Row, bank: RowBounds) {
        let good = row.encode();
        for bit in 0..ROW_SIZE_BYTES * 8 {
            for fresh_crc in [false, true] {
                let mut b = good;
                b[bit / 8] ^= 1 << (bit % 8);
                if fresh_crc {
                    let crc = crc32(&b[..ROW_CRC_OFFSET]);
                    put_u32(&mut b, ROW_CRC_OFFSET, crc);
                }
                let slow = Row::decode(&b, 9).and_then(|r| {
                    r.check_ranges(bank.tree_count, bank.max_depth)?;
                    r.check_sums_allowed(bank.version, bank.has_side_column)
                });
                assert_eq!(
                    Row::passes_checks(&b, 9, bank),
                    slow.is_ok(),
                    "bit {bit} {bank:?} {slow:?}"
                );
            }
        }
    }

    /// Ids no insert writes, each with a fresh CRC: the decoder names the
    /// id field, and the fast check agrees.
    #[test]
    fn malformed_external_ids_are_rejected() {
        let pad = |t: &[u8]| {
            let mut id = [0u8; 16];
            id[..t.len()].copy_from_slice(t);
            id
        };
        let cases: [(&str, u8, [u8; 16]); 5] = [
            ("not UTF-8", FLAG_HAS_EXTERNAL_ID, pad(b"\xff\xfe")),
            ("NUL inside", FLAG_HAS_EXTERNAL_ID, pad(b"a\0b")),
            ("empty", FLAG_HAS_EXTERNAL_ID, [0; 16]),
            ("bytes without the flag", 0, pad(b"zz")),
            ("UUID flag alone", FLAG_EXTERNAL_ID_UUID, [0; 16]),
        ];
        let bank = RowBounds {
            tree_count: 2,
            max_depth: 3,
            version: 2,
            has_side_column: true,
        };
        for (what, flags, id) in cases {
            let mut row = sample();
            (row.depth, row.parent, row.flags, row.external_id) = (2, 4, flags, id);
            let b = row.encode();
            let err = Row::decode(&b, 9).expect_err(what);
            assert!(
                matches!(err, FormatError::Invalid { offset_bytes, .. } if offset_bytes == ROW_EXTERNAL_ID_OFFSET as u64),
                "{what}: {err:?}"
            );
            assert!(!Row::passes_checks(&b, 9, bank), "{what}");
        }
        // The longest text id (16 bytes, no padding) is valid.
        let mut row = sample();
        (row.flags, row.external_id) = (FLAG_HAS_EXTERNAL_ID, *b"abcdefghijklmnop");
        assert_eq!(
            Row::decode(&row.encode(), 9).unwrap().external_id_text().unwrap(),
            "abcdefghijklmnop"
        );
    }

    #[test]
    fn the_residue_check_agrees_with_the_stored_crc() {
        let mut b = sample().encode();
        assert_eq!(crc32(&b), ROW_CRC_RESIDUE);
        for bit in 0..ROW_SIZE_BYTES * 8 {
            b[bit / 8] ^= 1 << (bit % 8);
            assert_ne!(crc32(&b), ROW_CRC_RESIDUE, "bit {bit}");
            assert!(
                matches!(Row::decode(&b, 9), Err(FormatError::Checksum { .. })),
                "bit {bit}"
            );
            b[bit / 8] ^= 1 << (bit % 8);
        }
    }

    #[test]
    fn roundtrip_and_uuid_text() {
        let r = sample();
        let d = Row::decode(&r.encode(), 9).unwrap();
        assert_eq!(d, r);
        assert_eq!(d.external_id_text().unwrap(), "15322d79-189f-4d8b-a672-ea78630c3370");
    }

    #[test]
    fn misplaced_row_is_rejected() {
        assert!(Row::decode(&sample().encode(), 10).is_err());
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let good = sample().encode();
        for byte in 0..ROW_SIZE_BYTES {
            for bit in 0..8 {
                let mut b = good;
                b[byte] ^= 1 << bit;
                assert!(Row::decode(&b, 9).is_err(), "flip at byte {byte} bit {bit}");
            }
        }
    }

    #[test]
    fn short_text_ids_and_limits() {
        let (bytes, flags) = encode_external_id("node-7").unwrap();
        let mut r = sample();
        r.external_id = bytes;
        r.flags = flags;
        assert_eq!(r.external_id_text().unwrap(), "node-7");
        assert!(encode_external_id("").is_none());
        assert!(encode_external_id("seventeen-bytes-x").is_none());
        // Uppercase UUIDs are not canonical: stored as text would not fit.
        assert!(encode_external_id("15322D79-189F-4D8B-A672-EA78630C3370").is_none());
    }
}

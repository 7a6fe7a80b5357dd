//! Write-ahead log: a 64-byte header and a chain of records.
//!
//! Each record's CRC covers the previous record's CRC (the header's CRC for
//! the first record), so a record left over from an older WAL generation or
//! a torn write cannot validate in the middle of the current chain.

use super::row::{ROW_SIZE_BYTES, Row};
use super::*;

pub const WAL_MAGIC: [u8; 8] = *b"DMEMWAL\0";
pub const WAL_HEADER_SIZE_BYTES: usize = 64;
pub const WALH_MAGIC_OFFSET: usize = 0;
pub const WALH_VERSION_OFFSET: usize = 8;
pub const WALH_SALT_OFFSET: usize = 16;
pub const WALH_START_LSN_OFFSET: usize = 24;
pub const WALH_CRC_OFFSET: usize = 60;
/// Byte ranges of the WAL header that must be zero (FORMAT.md "WAL header").
pub const WAL_HEADER_RESERVED: [std::ops::Range<usize>; 2] = [
    WALH_VERSION_OFFSET + 4..WALH_SALT_OFFSET,
    WALH_START_LSN_OFFSET + 8..WALH_CRC_OFFSET,
];

pub const RECORD_HEADER_SIZE_BYTES: usize = 24;
pub const REC_BODY_SIZE_OFFSET: usize = 0;
pub const REC_CRC_OFFSET: usize = 4;
pub const REC_LSN_OFFSET: usize = 8;
pub const REC_KIND_OFFSET: usize = 16;
pub const REC_OP_COUNT_OFFSET: usize = 18;
/// Byte ranges of a record header that must be zero.
// An array of one range (not the range itself), like every table's.
#[allow(clippy::single_range_in_vec_init)]
pub const RECORD_RESERVED: [std::ops::Range<usize>; 1] = [REC_OP_COUNT_OFFSET + 2..RECORD_HEADER_SIZE_BYTES];

/// Record kind: a transaction, a list of ops applied all or nothing.
pub const RECORD_KIND_TXN: u16 = 1;
/// Upper bound on one record's body; anything larger is corruption.
pub const MAX_RECORD_BODY_BYTES: usize = 64 * 1024 * 1024;

pub const OP_HEADER_SIZE_BYTES: usize = 4;
/// Byte ranges of an op header that must be zero (after its kind byte).
// An array of one range (not the range itself), like every table's.
#[allow(clippy::single_range_in_vec_init)]
pub const OP_HEADER_RESERVED: [std::ops::Range<usize>; 1] = [1..OP_HEADER_SIZE_BYTES];
pub const OP_PUT_NODE: u8 = 1;
pub const OP_PUT_ROW: u8 = 2;

const WHAT_HEADER: &str = "WAL header";
const WHAT_RECORD: &str = "WAL record";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalHeader {
    pub salt: u64,
    pub start_lsn: u64,
}

impl WalHeader {
    pub fn encode(&self) -> [u8; WAL_HEADER_SIZE_BYTES] {
        let mut b = [0u8; WAL_HEADER_SIZE_BYTES];
        b[..8].copy_from_slice(&WAL_MAGIC);
        put_u32(&mut b, WALH_VERSION_OFFSET, WAL_FORMAT_VERSION);
        put_u64(&mut b, WALH_SALT_OFFSET, self.salt);
        put_u64(&mut b, WALH_START_LSN_OFFSET, self.start_lsn);
        let crc = crc32(&b[..WALH_CRC_OFFSET]);
        put_u32(&mut b, WALH_CRC_OFFSET, crc);
        b
    }

    pub fn decode(b: &[u8]) -> Result<WalHeader, FormatError> {
        need(WHAT_HEADER, b, WAL_HEADER_SIZE_BYTES)?;
        if b[..8] != WAL_MAGIC {
            return Err(FormatError::BadMagic {
                what: WHAT_HEADER,
                offset_bytes: 0,
            });
        }
        let version = get_u32(b, WALH_VERSION_OFFSET);
        if version != WAL_FORMAT_VERSION {
            return Err(FormatError::UnsupportedVersion {
                what: WHAT_HEADER,
                found: version,
                supported: WAL_FORMAT_VERSION,
            });
        }
        check_crc(
            WHAT_HEADER,
            WALH_CRC_OFFSET as u64,
            get_u32(b, WALH_CRC_OFFSET),
            crc32(&b[..WALH_CRC_OFFSET]),
        )?;
        for reserved in WAL_HEADER_RESERVED {
            check_zero(WHAT_HEADER, b, reserved)?;
        }
        Ok(WalHeader {
            salt: get_u64(b, WALH_SALT_OFFSET),
            start_lsn: get_u64(b, WALH_START_LSN_OFFSET),
        })
    }

    /// The chain seed of the first record: the header's own CRC.
    pub fn chain_seed(&self) -> u32 {
        get_u32(&self.encode(), WALH_CRC_OFFSET)
    }
}

/// One change inside a transaction record.
#[derive(Debug, Clone, PartialEq)]
pub enum WalOp {
    /// A new node: its row, its (normalised) vector and its payload record.
    PutNode {
        row: Row,
        vector: Vec<f32>,
        payload_record: Vec<u8>,
    },
    /// A new image of an existing node's row (counters, flags).
    PutRow { row: Row },
}

pub fn encode_ops(ops: &[WalOp]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_ops_into(ops, &mut out);
    out
}

/// Appends the encoding of `ops` to `out` (a transaction being built in a
/// reused buffer: no allocation per op).
pub fn encode_ops_into(ops: &[WalOp], out: &mut Vec<u8>) {
    for op in ops {
        match op {
            WalOp::PutNode {
                row,
                vector,
                payload_record,
            } => encode_put_node_into(row, vector, payload_record, out),
            WalOp::PutRow { row } => {
                out.extend_from_slice(&[OP_PUT_ROW, 0, 0, 0]);
                out.extend_from_slice(&row.encode());
            }
        }
    }
}

/// Appends the encoding of one `WalOp::PutNode` made of these parts
/// (an insert staged without building the op).
pub fn encode_put_node_into(row: &Row, vector: &[f32], payload_record: &[u8], out: &mut Vec<u8>) {
    out.reserve(OP_HEADER_SIZE_BYTES + ROW_SIZE_BYTES + size_of_val(vector) + 4 + payload_record.len());
    out.extend_from_slice(&[OP_PUT_NODE, 0, 0, 0]);
    out.extend_from_slice(&row.encode());
    out.extend_from_slice(bytemuck::cast_slice(vector));
    out.extend_from_slice(&(payload_record.len() as u32).to_le_bytes());
    out.extend_from_slice(payload_record);
}

/// Decodes `op_count` ops from a record body. `dim_count` fixes the vector
/// length; offsets in errors are relative to the body start.
pub fn decode_ops(body: &[u8], op_count: u16, dim_count: u32) -> Result<Vec<WalOp>, FormatError> {
    let mut ops = Vec::with_capacity(usize::from(op_count));
    let mut at = 0usize;
    let invalid = |at: usize, detail: String| FormatError::Invalid {
        what: WHAT_RECORD,
        offset_bytes: at as u64,
        detail,
    };
    for _ in 0..op_count {
        let take = |at: usize, len: usize| -> Result<&[u8], FormatError> {
            body.get(at..at + len)
                .ok_or_else(|| invalid(at, format!("op runs past body end ({} bytes)", body.len())))
        };
        let op_header = take(at, OP_HEADER_SIZE_BYTES)?;
        let kind = op_header[0];
        if OP_HEADER_RESERVED
            .iter()
            .any(|r| op_header[r.clone()].iter().any(|&b| b != 0))
        {
            return Err(invalid(at + 1, "reserved op header bytes are not zero".into()));
        }
        at += OP_HEADER_SIZE_BYTES;
        let row_bytes = take(at, ROW_SIZE_BYTES)?;
        let row = Row::decode(row_bytes, get_u32(row_bytes, 0))?;
        at += ROW_SIZE_BYTES;
        match kind {
            OP_PUT_NODE => {
                let vec_bytes = take(at, dim_count as usize * 4)?;
                let vector = vec_bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect();
                at += vec_bytes.len();
                let len = get_u32(take(at, 4)?, 0) as usize;
                at += 4;
                let payload_record = take(at, len)?.to_vec();
                at += len;
                ops.push(WalOp::PutNode {
                    row,
                    vector,
                    payload_record,
                });
            }
            OP_PUT_ROW => ops.push(WalOp::PutRow { row }),
            other => {
                return Err(invalid(
                    at - ROW_SIZE_BYTES - OP_HEADER_SIZE_BYTES,
                    format!("unknown op {other}"),
                ));
            }
        }
    }
    if at != body.len() {
        return Err(invalid(
            at,
            format!("{} trailing bytes after {op_count} ops", body.len() - at),
        ));
    }
    Ok(ops)
}

/// Encodes a record chained to `prev_crc`. Returns the bytes and its CRC.
pub fn encode_record(prev_crc: u32, lsn: u64, op_count: u16, body: &[u8]) -> (Vec<u8>, u32) {
    let mut out = vec![0u8; RECORD_HEADER_SIZE_BYTES];
    out.extend_from_slice(body);
    let crc = frame_record(prev_crc, lsn, op_count, &mut out);
    (out, crc)
}

/// Fills in the header of a record whose body was built in place after
/// `RECORD_HEADER_SIZE_BYTES` bytes of room (`record[..24]`, any content)
/// and returns its CRC: a transaction's ops are encoded straight into the
/// buffer that is written, with no copy of the body into a frame.
pub fn frame_record(prev_crc: u32, lsn: u64, op_count: u16, record: &mut [u8]) -> u32 {
    let body_bytes = record.len() - RECORD_HEADER_SIZE_BYTES;
    assert!(body_bytes <= MAX_RECORD_BODY_BYTES);
    record[..RECORD_HEADER_SIZE_BYTES].fill(0);
    put_u32(record, REC_BODY_SIZE_OFFSET, body_bytes as u32);
    put_u64(record, REC_LSN_OFFSET, lsn);
    put_u16(record, REC_KIND_OFFSET, RECORD_KIND_TXN);
    put_u16(record, REC_OP_COUNT_OFFSET, op_count);
    let crc = chained_crc(prev_crc, record);
    put_u32(record, REC_CRC_OFFSET, crc);
    crc
}

pub(crate) fn chained_crc(prev_crc: u32, record: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&prev_crc.to_le_bytes());
    h.update(&record[REC_LSN_OFFSET..]);
    h.finalize()
}

/// A record header as read from disk, not yet verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub body_size_bytes: u32,
    pub crc: u32,
    pub lsn: u64,
    pub kind: u16,
    pub op_count: u16,
}

pub fn decode_record_header(b: &[u8]) -> Result<RecordHeader, FormatError> {
    need(WHAT_RECORD, b, RECORD_HEADER_SIZE_BYTES)?;
    Ok(RecordHeader {
        body_size_bytes: get_u32(b, REC_BODY_SIZE_OFFSET),
        crc: get_u32(b, REC_CRC_OFFSET),
        lsn: get_u64(b, REC_LSN_OFFSET),
        kind: get_u16(b, REC_KIND_OFFSET),
        op_count: get_u16(b, REC_OP_COUNT_OFFSET),
    })
}

/// Verifies a whole record (header + body) against the chain.
pub fn verify_record(prev_crc: u32, expected_lsn: u64, record: &[u8]) -> Result<RecordHeader, FormatError> {
    let h = decode_record_header(record)?;
    need(
        WHAT_RECORD,
        record,
        RECORD_HEADER_SIZE_BYTES + h.body_size_bytes as usize,
    )?;
    // The LSN first: it costs nothing, and a search past damage (or over a
    // recycled WAL's old records) tries many candidates whose claimed
    // bodies run to megabytes of CRC.
    if h.lsn != expected_lsn {
        return Err(FormatError::Invalid {
            what: WHAT_RECORD,
            offset_bytes: REC_LSN_OFFSET as u64,
            detail: format!("lsn {} where {expected_lsn} was expected", h.lsn),
        });
    }
    check_crc(WHAT_RECORD, REC_CRC_OFFSET as u64, h.crc, chained_crc(prev_crc, record))?;
    for reserved in RECORD_RESERVED {
        check_zero(WHAT_RECORD, record, reserved)?;
    }
    if h.kind != RECORD_KIND_TXN {
        return Err(FormatError::Invalid {
            what: WHAT_RECORD,
            offset_bytes: REC_KIND_OFFSET as u64,
            detail: format!("unknown record kind {}", h.kind),
        });
    }
    Ok(h)
}

/// Why a record that is intact (whole, its CRC chained from `prev_crc`,
/// its LSN `expected_lsn`) still cannot be read: an unknown kind or
/// reserved bytes that are not zero, as a newer format could write. None
/// for a record that is not intact (torn or damaged) or reads fine. Such a
/// record is never a torn write: dropping it would lose a change that was
/// written whole (FORMAT.md §8).
pub fn unreadable_intact_record(prev_crc: u32, expected_lsn: u64, record: &[u8]) -> Option<String> {
    let h = decode_record_header(record).ok()?;
    let whole = record.get(..RECORD_HEADER_SIZE_BYTES + h.body_size_bytes as usize)?;
    if h.crc != chained_crc(prev_crc, whole) || h.lsn != expected_lsn {
        return None;
    }
    verify_record(prev_crc, expected_lsn, whole)
        .err()
        .map(|e| format!("its CRC and LSN hold, but {e}: a record a newer deltamem may have written, not a torn one"))
}

#[cfg(test)]
mod tests {
    use super::super::row::{Label, NodeType};
    use super::*;

    fn row(index: u32) -> Row {
        Row {
            index,
            parent: NODE_NONE,
            tree: 0,
            node_type: NodeType::Root,
            label: Label::Success,
            depth: 1,
            flags: 0,
            success_hits: 0,
            retrievals: 0,
            link: NODE_NONE,
            vector_crc32: 0,
            payload_offset_bytes: 0,
            payload_size_bytes: 3,
            created_unix_ms: 0,
            external_id: [0; 16],
            vector_sum32: 0,
            qvector_sum32: 0,
        }
    }

    #[test]
    fn ops_roundtrip() {
        let ops = vec![
            WalOp::PutNode {
                row: row(3),
                vector: vec![0.5, -0.25, 1.0],
                payload_record: vec![1, 2, 3],
            },
            WalOp::PutRow { row: row(1) },
        ];
        let body = encode_ops(&ops);
        assert_eq!(decode_ops(&body, 2, 3).unwrap(), ops);
        assert!(decode_ops(&body, 3, 3).is_err());
        assert!(decode_ops(&body[..body.len() - 1], 2, 3).is_err());
    }

    #[test]
    fn chain_rejects_stale_and_torn_records() {
        let header = WalHeader {
            salt: 42,
            start_lsn: 10,
        };
        let seed = header.chain_seed();
        let (r1, c1) = encode_record(seed, 10, 0, b"");
        let (r2, _) = encode_record(c1, 11, 0, b"");
        assert!(verify_record(seed, 10, &r1).is_ok());
        assert!(verify_record(c1, 11, &r2).is_ok());
        // Same record seen from a different generation (other salt).
        let other_seed = WalHeader {
            salt: 43,
            start_lsn: 10,
        }
        .chain_seed();
        assert!(verify_record(other_seed, 10, &r1).is_err());
        // Out of order.
        assert!(verify_record(seed, 11, &r2).is_err());
        for byte in 0..r1.len() {
            let mut b = r1.clone();
            b[byte] ^= 0x01;
            assert!(verify_record(seed, 10, &b).is_err(), "flip at {byte}");
        }
    }

    #[test]
    fn header_with_a_reserved_byte_set_is_refused() {
        let h = WalHeader { salt: 7, start_lsn: 1 };
        for range in WAL_HEADER_RESERVED {
            for at in range {
                let mut b = h.encode();
                b[at] = 1;
                let crc = crc32(&b[..WALH_CRC_OFFSET]);
                put_u32(&mut b, WALH_CRC_OFFSET, crc); // CRC-valid: only the rule can refuse it
                assert!(WalHeader::decode(&b).is_err(), "reserved byte {at} accepted");
            }
        }
    }

    /// A record framed in place (header room left holding garbage)
    /// verifies against its chain and gives its ops back.
    #[test]
    fn a_record_framed_in_place_verifies_and_decodes() {
        let ops = vec![WalOp::PutRow { row: row(4) }];
        let mut framed = vec![0xA5u8; RECORD_HEADER_SIZE_BYTES];
        encode_ops_into(&ops, &mut framed);
        let crc = frame_record(0xDEAD_BEEF, 12, 1, &mut framed);
        let h = verify_record(0xDEAD_BEEF, 12, &framed).unwrap();
        assert_eq!(
            (h.crc, h.op_count, h.body_size_bytes as usize),
            (crc, 1, framed.len() - 24)
        );
        assert_eq!(decode_ops(&framed[RECORD_HEADER_SIZE_BYTES..], 1, 3).unwrap(), ops);
        assert!(
            verify_record(0xDEAD_BEEE, 12, &framed).is_err(),
            "chained to the previous CRC"
        );
    }

    #[test]
    fn header_roundtrip() {
        let h = WalHeader {
            salt: 0x1234,
            start_lsn: 99,
        };
        assert_eq!(WalHeader::decode(&h.encode()).unwrap(), h);
    }
}

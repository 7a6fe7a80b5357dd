//! Payload records in the append-only payload log.
//!
//! A record is a 16-byte header followed by a zstd frame whose content is
//! the postcard (v1 wire format) encoding of [`Payload`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::*;

pub const PAYLOAD_MAGIC: [u8; 4] = *b"DMPL";
pub const PAYLOAD_HEADER_SIZE_BYTES: usize = 16;
pub const PAY_MAGIC_OFFSET: usize = 0;
pub const PAY_BODY_SIZE_OFFSET: usize = 4;
pub const PAY_NODE_INDEX_OFFSET: usize = 8;
pub const PAY_CRC_OFFSET: usize = 12;

/// zstd level: 3 is zstd's default, a good ratio at a few hundred MB/s.
pub const ZSTD_LEVEL: i32 = 3;

const WHAT: &str = "payload record";

thread_local! {
    /// One compression context per thread: creating one per record cost
    /// more than compressing a short payload (bulk imports encode ~10^5).
    static COMPRESSOR: std::cell::RefCell<zstd::bulk::Compressor<'static>> = std::cell::RefCell::new(
        zstd::bulk::Compressor::new(ZSTD_LEVEL).expect("a zstd context at a valid level"),
    );
}

/// What a node carries besides its vector: the scenario text its embedding
/// was computed from, and free-form string fields (activation condition,
/// procedure, trajectory, provenance, ...). A BTreeMap keeps the encoding
/// deterministic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Payload {
    pub scenario: String,
    pub fields: BTreeMap<String, String>,
}

impl Payload {
    /// Uncompressed size in bytes, as limited by `MAX_PAYLOAD_BYTES`.
    pub fn size_bytes(&self) -> usize {
        self.scenario.len() + self.fields.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
    }
}

/// Encoded payloads shorter than this go into a zstd frame of one raw
/// block instead of being compressed: zstd's per-frame work (histograms,
/// Huffman and FSE tables) was ~8% of a bulk insert's CPU for payloads of
/// ~90 bytes, and text this short has too few repeats to win back the
/// frame's own bytes.
pub const RAW_BELOW_BYTES: usize = 128;

/// Bytes of a raw frame's header (`raw_frame_header`).
const RAW_FRAME_HEADER_BYTES: usize = 9;

/// The header of a zstd frame holding `plain_len` bytes as one raw
/// (stored) block: magic, a frame header of a single segment with a 1-byte
/// content size, no checksum or dictionary, then a last-block header of
/// type raw (RFC 8878 §3.1.1). Any zstd decoder reads it; zstd has no
/// call that writes one.
fn raw_frame_header(plain_len: usize) -> [u8; RAW_FRAME_HEADER_BYTES] {
    assert!(plain_len < 256, "a 1-byte content size");
    const ZSTD_MAGIC: u32 = 0xFD2F_B528;
    const SINGLE_SEGMENT: u8 = 1 << 5;
    const LAST_BLOCK: u32 = 1; // block type raw = 0 in bits 1-2
    let mut out = [0u8; RAW_FRAME_HEADER_BYTES];
    out[..4].copy_from_slice(&ZSTD_MAGIC.to_le_bytes());
    out[4] = SINGLE_SEGMENT;
    out[5] = plain_len as u8;
    out[6..].copy_from_slice(&((plain_len as u32) << 3 | LAST_BLOCK).to_le_bytes()[..3]);
    out
}

/// Encodes a full record (header + compressed body) for node `node_index`.
/// The payload is serialised in place after room for the record and raw
/// frame headers: a short payload (most) costs one allocation, the
/// record's own.
pub fn encode_record(node_index: u32, payload: &Payload) -> Vec<u8> {
    let plain_at = PAYLOAD_HEADER_SIZE_BYTES + RAW_FRAME_HEADER_BYTES;
    // postcard adds a varint length per string and per map.
    let varints_bytes = 5 * (2 + 2 * payload.fields.len());
    let mut out = Vec::with_capacity(plain_at + payload.size_bytes() + varints_bytes);
    out.resize(plain_at, 0);
    let mut out = postcard::to_extend(payload, out).expect("postcard encoding of strings cannot fail");
    let plain_len = out.len() - plain_at;
    if plain_len < RAW_BELOW_BYTES {
        out[PAYLOAD_HEADER_SIZE_BYTES..plain_at].copy_from_slice(&raw_frame_header(plain_len));
    } else {
        let body = COMPRESSOR
            .with(|c| c.borrow_mut().compress(&out[plain_at..]))
            .expect("zstd compression of an in-memory buffer");
        out.truncate(PAYLOAD_HEADER_SIZE_BYTES);
        out.extend_from_slice(&body);
    }
    out[..4].copy_from_slice(&PAYLOAD_MAGIC);
    let body_bytes = out.len() - PAYLOAD_HEADER_SIZE_BYTES;
    put_u32(&mut out, PAY_BODY_SIZE_OFFSET, body_bytes as u32);
    put_u32(&mut out, PAY_NODE_INDEX_OFFSET, node_index);
    let crc = record_crc(&out);
    put_u32(&mut out, PAY_CRC_OFFSET, crc);
    out
}

fn record_crc(record: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&record[..PAY_CRC_OFFSET]);
    h.update(&record[PAYLOAD_HEADER_SIZE_BYTES..]);
    h.finalize()
}

/// Checks a record's framing and CRC without decompressing it.
pub fn check_record(record: &[u8], node_index: u32) -> Result<(), FormatError> {
    need(WHAT, record, PAYLOAD_HEADER_SIZE_BYTES)?;
    if record[..4] != PAYLOAD_MAGIC {
        return Err(FormatError::BadMagic {
            what: WHAT,
            offset_bytes: 0,
        });
    }
    let body_size = get_u32(record, PAY_BODY_SIZE_OFFSET) as usize;
    if record.len() != PAYLOAD_HEADER_SIZE_BYTES + body_size {
        return Err(FormatError::Invalid {
            what: WHAT,
            offset_bytes: PAY_BODY_SIZE_OFFSET as u64,
            detail: format!("body size {body_size} does not match record size {}", record.len()),
        });
    }
    check_crc(
        WHAT,
        PAY_CRC_OFFSET as u64,
        get_u32(record, PAY_CRC_OFFSET),
        record_crc(record),
    )?;
    let stored_index = get_u32(record, PAY_NODE_INDEX_OFFSET);
    if stored_index != node_index {
        return Err(FormatError::Invalid {
            what: WHAT,
            offset_bytes: PAY_NODE_INDEX_OFFSET as u64,
            detail: format!("record belongs to node {stored_index}, expected {node_index}"),
        });
    }
    Ok(())
}

thread_local! {
    /// One decompression context per thread, reused record after record.
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// Checks and decodes a record. Decompression is bounded so a forged
/// header cannot make us allocate more than the payload limit.
pub fn decode_record(record: &[u8], node_index: u32) -> Result<Payload, FormatError> {
    check_record(record, node_index)?;
    let body = &record[PAYLOAD_HEADER_SIZE_BYTES..];
    // postcard adds at most a few varint bytes per string on top of the text.
    let limit_bytes = MAX_PAYLOAD_BYTES + 64 * 1024;
    // The frame states its content size (ours always do): allocating that,
    // not the limit, keeps a record's decode from mapping and faulting in
    // megabytes (verify and dump decode every record). A missing or forged
    // size still cannot exceed the limit: zstd stops at the capacity.
    let capacity = match zstd::zstd_safe::get_frame_content_size(body) {
        Ok(Some(size)) if size <= limit_bytes as u64 => size as usize,
        _ => limit_bytes,
    };
    let plain = DECOMPRESSOR
        .with(|slot| {
            let mut slot = slot.borrow_mut();
            let decompressor = match slot.as_mut() {
                Some(d) => d,
                None => slot.insert(zstd::bulk::Decompressor::new()?),
            };
            decompressor.decompress(body, capacity)
        })
        .map_err(|e| FormatError::Invalid {
            what: WHAT,
            offset_bytes: PAYLOAD_HEADER_SIZE_BYTES as u64,
            detail: format!("zstd: {e}"),
        })?;
    let invalid = |detail: String| FormatError::Invalid {
        what: WHAT,
        offset_bytes: PAYLOAD_HEADER_SIZE_BYTES as u64,
        detail,
    };
    let payload: Payload = postcard::from_bytes(&plain).map_err(|e| invalid(format!("postcard: {e}")))?;
    // A payload has one encoding, the one `encode_record` writes. postcard
    // also decodes keys out of order or repeated (the last one wins) and
    // ignores bytes after the payload: such a record was not written by
    // this engine, and what it holds differs from what it decodes to.
    if postcard::to_extend(&payload, Vec::with_capacity(plain.len()))
        .ok()
        .as_deref()
        != Some(&plain[..])
    {
        return Err(invalid(
            "postcard: not the one encoding of its payload (keys out of order or repeated, or bytes after it)".into(),
        ));
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record of node 0 framing `plain` (postcard bytes) as it is.
    fn framed(plain: &[u8]) -> Vec<u8> {
        let mut out = vec![0; PAYLOAD_HEADER_SIZE_BYTES];
        out.extend_from_slice(&raw_frame_header(plain.len()));
        out.extend_from_slice(plain);
        out[..4].copy_from_slice(&PAYLOAD_MAGIC);
        let body_bytes = out.len() - PAYLOAD_HEADER_SIZE_BYTES;
        put_u32(&mut out, PAY_BODY_SIZE_OFFSET, body_bytes as u32);
        let crc = record_crc(&out);
        put_u32(&mut out, PAY_CRC_OFFSET, crc);
        out
    }

    /// postcard bytes of scenario "s" with `fields` in the order given.
    fn plain(fields: &[(&str, &str)]) -> Vec<u8> {
        let mut out = vec![1, b's', fields.len() as u8];
        for (k, v) in fields {
            out.push(k.len() as u8);
            out.extend_from_slice(k.as_bytes());
            out.push(v.len() as u8);
            out.extend_from_slice(v.as_bytes());
        }
        out
    }

    #[test]
    fn only_the_one_encoding_decodes() {
        let sorted = plain(&[("a", "1"), ("b", "2")]);
        let payload = decode_record(&framed(&sorted), 0).unwrap();
        assert_eq!(payload.fields.len(), 2);
        assert_eq!(encode_record(0, &payload), framed(&sorted));
        let mut trailing = sorted.clone();
        trailing.push(0);
        for forged in [
            plain(&[("b", "2"), ("a", "1")]),
            plain(&[("a", "1"), ("a", "2")]),
            trailing,
        ] {
            let e = decode_record(&framed(&forged), 0).unwrap_err().to_string();
            assert!(e.contains("not the one encoding"), "{forged:?}: {e}");
        }
    }

    fn sample() -> Payload {
        let mut fields = BTreeMap::new();
        fields.insert("activation_condition".into(), "when the stove is off".into());
        fields.insert(
            "execution_procedure".into(),
            "1. go to kitchen\n2. activate stove".repeat(20),
        );
        Payload {
            scenario: "boil water".into(),
            fields,
        }
    }

    #[test]
    fn roundtrip_and_compresses() {
        let p = sample();
        let rec = encode_record(5, &p);
        assert!(rec.len() < p.size_bytes(), "{} vs {}", rec.len(), p.size_bytes());
        assert_eq!(decode_record(&rec, 5).unwrap(), p);
    }

    /// Short payloads are stored raw in a frame the zstd library itself
    /// decodes, content size included; longer ones are compressed.
    #[test]
    fn short_payloads_are_stored_in_raw_frames_zstd_reads() {
        for scenario_len in [0usize, 1, 40, 80, 110, 200] {
            let p = Payload {
                scenario: "s".repeat(scenario_len),
                fields: BTreeMap::from([("k".to_string(), "v w".to_string())]),
            };
            let plain = postcard::to_stdvec(&p).unwrap();
            let rec = encode_record(3, &p);
            let body = &rec[PAYLOAD_HEADER_SIZE_BYTES..];
            let decoded = zstd::bulk::decompress(body, plain.len()).unwrap();
            assert_eq!(decoded, plain, "zstd reads the frame");
            let size = zstd::zstd_safe::get_frame_content_size(body).unwrap();
            assert_eq!(size, Some(plain.len() as u64));
            assert_eq!(decode_record(&rec, 3).unwrap(), p);
            let raw = body.len() == plain.len() + 9 && body[9..] == plain[..];
            assert_eq!(raw, plain.len() < RAW_BELOW_BYTES, "{} bytes", plain.len());
        }
    }

    #[test]
    fn wrong_node_and_bit_flips_are_detected() {
        let rec = encode_record(5, &sample());
        assert!(decode_record(&rec, 6).is_err());
        for byte in 0..rec.len() {
            let mut b = rec.clone();
            b[byte] ^= 0x10;
            assert!(decode_record(&b, 5).is_err(), "flip at {byte}");
        }
    }
}

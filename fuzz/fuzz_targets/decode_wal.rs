#![no_main]
//! WAL bytes: header, chained records and their ops. Whatever validates
//! must decode into ops that re-encode to the same body.
use deltamem::format::wal::{RECORD_HEADER_SIZE_BYTES, WAL_HEADER_SIZE_BYTES, WalHeader, decode_ops, encode_ops, verify_record};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(header) = WalHeader::decode(data) else { return };
    let mut prev = header.chain_seed();
    let mut lsn = header.start_lsn;
    let mut rest = &data[WAL_HEADER_SIZE_BYTES..];
    for _ in 0..64 {
        let Ok(h) = verify_record(prev, lsn, rest) else { return };
        let end = RECORD_HEADER_SIZE_BYTES + h.body_size_bytes as usize;
        let body = &rest[RECORD_HEADER_SIZE_BYTES..end];
        if let Ok(ops) = decode_ops(body, h.op_count, 4) {
            assert_eq!(encode_ops(&ops), body);
        }
        prev = h.crc;
        lsn += 1;
        rest = &rest[end..];
    }
});

#![no_main]
//! A row that decodes must re-encode to the same 128 bytes.
use deltamem::format::row::{ROW_SIZE_BYTES, Row};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let index = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
    if let Ok(row) = Row::decode(&data[4..], index) {
        assert_eq!(&row.encode()[..], &data[4..4 + ROW_SIZE_BYTES]);
    }
});

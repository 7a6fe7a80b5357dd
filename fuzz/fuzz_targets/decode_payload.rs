#![no_main]
//! Payload records: never panic, never allocate past the payload limit; a
//! record that decodes must round-trip through the encoder's decoder.
use deltamem::format::payload::{decode_record, encode_record};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = decode_record(data, u32::from_le_bytes(data.get(8..12).and_then(|b| b.try_into().ok()).unwrap_or([0; 4]))) {
        let again = encode_record(0, &p);
        assert_eq!(decode_record(&again, 0).unwrap(), p);
    }
});

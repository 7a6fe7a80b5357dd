#![no_main]
//! Any bytes: decode must return an error or a manifest that re-encodes to
//! the same bytes (the CRC covers everything, so no other outcome is valid).
use deltamem::format::manifest::{MANIFEST_SIZE_BYTES, Manifest};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Manifest::decode(data) {
        assert_eq!(&m.encode()[..], &data[..MANIFEST_SIZE_BYTES]);
    }
});

#![no_main]
//! See tests/common/fuzz_bodies.rs (shared with the corpus replay test).
#[path = "../../tests/common/fuzz_bodies.rs"]
mod fuzz_bodies;
#[path = "../../tests/common/crashkit.rs"]
mod crashkit;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_bodies::decode_wal(data));

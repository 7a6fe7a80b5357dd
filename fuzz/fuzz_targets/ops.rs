#![no_main]
//! Operation sequences over the simulated store with one injected fault,
//! checked against a ledger. See tests/common/fuzz_bodies.rs.
#[path = "../../tests/common/fuzz_bodies.rs"]
mod fuzz_bodies;
#[path = "../../tests/common/crashkit.rs"]
mod crashkit;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_bodies::ops_with_faults(data));

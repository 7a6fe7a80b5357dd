pub mod crashkit;
pub mod fuzz_bodies;

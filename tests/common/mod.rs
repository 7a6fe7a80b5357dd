pub mod crashkit;
pub mod fuzz_bodies;
pub mod llm_server;
pub mod ranges;
pub mod snapshot;

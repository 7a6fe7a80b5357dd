//! Mappings for stores without files (memory, simulator): a copy of the
//! bytes, 64-byte aligned so vector rows can be viewed as f32 slices
//! exactly as in a page-aligned mmap.

use std::sync::Arc;

use super::{MappedBytes, Mapping};

struct Snapshot {
    blocks: Vec<[u8; 64]>,
    len: usize,
}

impl MappedBytes for Snapshot {
    fn bytes(&self) -> &[u8] {
        &self.blocks.as_flattened()[..self.len]
    }
}

/// A read-only copy of `bytes` as a [`Mapping`].
pub(crate) fn snapshot(bytes: &[u8]) -> Mapping {
    let mut blocks = vec![[0u8; 64]; bytes.len().div_ceil(64)];
    blocks.as_flattened_mut()[..bytes.len()].copy_from_slice(bytes);
    Mapping::new(Arc::new(Snapshot {
        blocks,
        len: bytes.len(),
    }))
}

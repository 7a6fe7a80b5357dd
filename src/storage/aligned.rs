//! A byte buffer aligned for writes that bypass the page cache.

use super::DIRECT_ALIGN_BYTES;

/// A zeroed byte buffer that starts on a `DIRECT_ALIGN_BYTES` boundary,
/// so a write of it may bypass the page cache (`OpenMode::CreateUncached`).
/// Over-allocates by one block instead of using a custom allocation: safe
/// code, and one block is nothing beside the megabytes these hold.
pub struct AlignedBuf {
    bytes: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    pub fn new(len: usize) -> AlignedBuf {
        let bytes = vec![0u8; len + DIRECT_ALIGN_BYTES];
        let start = bytes.as_ptr().align_offset(DIRECT_ALIGN_BYTES);
        assert!(start < DIRECT_ALIGN_BYTES, "a byte pointer can always be aligned");
        AlignedBuf { bytes, start, len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self) -> &[u8] {
        &self.bytes[self.start..self.start + self.len]
    }

    pub fn get_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::{AlignedBuf, DIRECT_ALIGN_BYTES};

    #[test]
    fn starts_on_a_block_boundary_and_holds_zeros() {
        for len in [0, 1, 4095, 4096, 3 << 20] {
            let mut buf = AlignedBuf::new(len);
            assert_eq!(buf.get().len(), len);
            assert!(buf.get().iter().all(|&b| b == 0));
            assert_eq!(buf.get_mut().as_ptr() as usize % DIRECT_ALIGN_BYTES, 0, "len {len}");
        }
    }
}

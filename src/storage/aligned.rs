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

/// A growable buffer of floats whose first float starts on a
/// `DIRECT_ALIGN_BYTES` boundary, so whole aligned blocks of it can be
/// written around the page cache as they are, with no copy into an
/// `AlignedBuf` first (a bulk load's vector pieces). Safe code, as
/// `AlignedBuf`: a `Vec<f32>` over-allocated by one block, the data
/// starting at its first aligned float. Growth moves the data to a new
/// allocation, aligned again; nothing else reallocates (a `Vec` with room
/// enough never moves), so a buffer filled within its capacity stays
/// aligned. Writers check the alignment anyway (`is_aligned`) and copy
/// when it does not hold: it decides speed, never bytes.
#[derive(Debug)]
pub struct AlignedFloats {
    /// `start` unused floats, then the data; all initialised.
    floats: Vec<f32>,
    start: usize,
}

/// Floats in one aligned block.
const BLOCK_FLOATS: usize = DIRECT_ALIGN_BYTES / size_of::<f32>();

impl Default for AlignedFloats {
    fn default() -> AlignedFloats {
        AlignedFloats::with_capacity(0)
    }
}

impl AlignedFloats {
    /// An empty buffer with room for `capacity` floats.
    pub fn with_capacity(capacity: usize) -> AlignedFloats {
        let mut floats: Vec<f32> = Vec::with_capacity(capacity + BLOCK_FLOATS);
        // In floats; below one block since the pointer is f32-aligned.
        let start = floats.as_ptr().align_offset(DIRECT_ALIGN_BYTES);
        assert!(start < BLOCK_FLOATS, "an f32 pointer can always be block aligned");
        floats.resize(start, 0.0);
        AlignedFloats { floats, start }
    }

    pub fn len(&self) -> usize {
        self.floats.len() - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Floats it holds without moving.
    pub fn capacity(&self) -> usize {
        self.floats.capacity() - self.start
    }

    pub fn as_slice(&self) -> &[f32] {
        &self.floats[self.start..]
    }

    /// Whether the data still starts on a block boundary.
    pub fn is_aligned(&self) -> bool {
        self.as_slice().as_ptr().cast::<u8>().align_offset(DIRECT_ALIGN_BYTES) == 0
    }

    pub fn extend_from_slice(&mut self, values: &[f32]) {
        let needed = self.len() + values.len();
        if needed > self.capacity() {
            let mut grown = AlignedFloats::with_capacity(needed.max(2 * self.capacity()));
            grown.floats.extend_from_slice(self.as_slice());
            *self = grown;
        }
        self.floats.extend_from_slice(values);
    }

    pub fn truncate(&mut self, len: usize) {
        self.floats.truncate(self.start + len);
    }

    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Drops the first `count` floats, moving the rest to the front.
    pub fn remove_front(&mut self, count: usize) {
        assert!(count <= self.len());
        self.floats.copy_within(self.start + count.., self.start);
        self.floats.truncate(self.floats.len() - count);
    }
}

#[cfg(test)]
mod tests {
    use super::{AlignedBuf, AlignedFloats, DIRECT_ALIGN_BYTES};

    /// Filled within its capacity or past it, cut, emptied and refilled,
    /// it holds what a plain `Vec` would, from a block boundary.
    #[test]
    fn aligned_floats_hold_what_a_vec_holds_from_a_block_boundary() {
        let mut buf = AlignedFloats::with_capacity(3000);
        let mut model: Vec<f32> = Vec::new();
        let step = |buf: &mut AlignedFloats, model: &mut Vec<f32>, values: &[f32]| {
            buf.extend_from_slice(values);
            model.extend_from_slice(values);
            assert_eq!(buf.as_slice(), &model[..]);
            assert!(buf.is_aligned());
            assert!(buf.capacity() >= buf.len());
        };
        let ramp: Vec<f32> = (0..2500).map(|i| i as f32).collect();
        step(&mut buf, &mut model, &ramp);
        let before = buf.as_slice().as_ptr();
        step(&mut buf, &mut model, &ramp[..400]);
        assert_eq!(
            buf.as_slice().as_ptr(),
            before,
            "filled within its capacity, it did not move"
        );
        step(&mut buf, &mut model, &ramp);
        buf.remove_front(1000);
        model.drain(..1000);
        assert_eq!(buf.as_slice(), &model[..]);
        buf.truncate(7);
        model.truncate(7);
        assert_eq!(buf.as_slice(), &model[..]);
        buf.clear();
        model.clear();
        assert!(buf.is_empty());
        step(&mut buf, &mut model, &ramp[5..9]);
        assert_eq!(buf.as_slice(), &[5.0, 6.0, 7.0, 8.0]);
        assert!(AlignedFloats::default().is_aligned());
    }

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

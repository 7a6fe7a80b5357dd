//! Everything committed since the checkpoint, held in memory: new nodes
//! (rows, vectors, payload records) and new images of checkpointed rows.
//! Rebuilt from the WAL on open; written into the data files and dropped
//! by the next checkpoint.

use std::collections::BTreeMap;

use crate::format::row::Row;
use crate::storage::AlignedFloats;

#[derive(Debug, Default)]
pub(crate) struct Overlay {
    /// Node count of the checkpoint; new nodes are numbered from here.
    pub base_count: u32,
    pub dim_count: u32,
    /// New nodes, index `base_count + i`.
    pub rows: Vec<Row>,
    /// Their vectors, `dim_count` floats each, already normalised.
    pub vectors: Vec<f32>,
    /// Their encoded payload records.
    pub payloads: Vec<Vec<u8>>,
    /// New images of checkpointed rows (counters, flags, links).
    pub patched: BTreeMap<u32, Row>,
    /// End of the payload log once the new nodes' records are appended.
    pub payload_end_bytes: u64,
    /// Set only inside a bulk load whose nodes need no scan of the
    /// overlay (no auto attach): the vectors of nodes staged after
    /// `vectors` ends are handed to the load's writer thread instead of
    /// being kept.
    pub handoff: Option<Handoff>,
}

/// The vectors a bulk load hands to its writer thread as it stages them:
/// `pending` holds the ones not handed over yet, nodes `pending_from..`.
/// No one reads the others until the load's checkpoint has put them in
/// the data files (and emptied the overlay).
#[derive(Debug, Default)]
pub(crate) struct Handoff {
    pub pending_from: u32,
    /// Aligned, so the writer thread writes whole pieces of it as they
    /// are, around the page cache.
    pub pending: AlignedFloats,
}

/// Enough to undo a partly applied transaction.
pub(crate) struct Mark {
    rows_len: usize,
    payload_end_bytes: u64,
    undo: Vec<(u32, Option<Row>)>,
}

impl Overlay {
    pub fn new(base_count: u32, dim_count: u32, payload_end_bytes: u64) -> Overlay {
        Overlay {
            base_count,
            dim_count,
            payload_end_bytes,
            ..Default::default()
        }
    }

    /// Empties the overlay after a checkpoint of `base_count` nodes. The
    /// vector buffer keeps its memory up to `KEPT_VECTOR_BYTES`: a bulk
    /// load checkpoints after every batch, and fresh pages for each one
    /// cost more in page faults than filling them. 64 MiB covers what the
    /// default checkpoint threshold (a 64 MiB WAL) lets accumulate, so a
    /// stream of WAL inserts reuses it too; it is what the overlay held
    /// just before the checkpoint, so the peak does not grow. A larger
    /// buffer is cut down to that much rather than dropped: the WAL's
    /// 64 MiB of 768-dim inserts (~21k nodes) grow the buffer by doubling
    /// past 64 MiB (to 100 MiB at 16,385 nodes), and dropping it made
    /// every checkpoint cycle of a server under inserts fault its vector
    /// pages in afresh (2-3% of the CPU of a durable insert).
    pub fn reset(&mut self, base_count: u32, payload_end_bytes: u64) {
        const KEPT_VECTOR_BYTES: usize = 64 << 20;
        let mut vectors = std::mem::take(&mut self.vectors);
        vectors.clear();
        vectors.shrink_to(KEPT_VECTOR_BYTES / size_of::<f32>());
        *self = Overlay {
            vectors,
            ..Overlay::new(base_count, self.dim_count, payload_end_bytes)
        };
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.patched.is_empty()
    }

    pub fn total_count(&self) -> u32 {
        self.base_count + self.rows.len() as u32
    }

    /// The newest image of `index` held here, if any.
    pub fn row(&self, index: u32) -> Option<&Row> {
        if index >= self.base_count {
            self.rows.get((index - self.base_count) as usize)
        } else {
            self.patched.get(&index)
        }
    }

    /// Vector of a new node (index >= base_count).
    pub fn vector(&self, index: u32) -> &[f32] {
        let dim = self.dim_count as usize;
        if let Some(h) = self.handoff.as_ref() {
            let kept_end = self.base_count + (self.vectors.len() / dim) as u32;
            if index >= kept_end {
                assert!(index >= h.pending_from, "node {index}'s vector went to a load's writer");
                let at = (index - h.pending_from) as usize * dim;
                return &h.pending.as_slice()[at..at + dim];
            }
        }
        let at = (index - self.base_count) as usize * dim;
        &self.vectors[at..at + dim]
    }

    /// Starts handing the vectors of nodes staged from now on to a load's
    /// writer (`Handoff`).
    /// `pending` is an empty buffer to collect them in.
    pub fn start_handoff(&mut self, pending: AlignedFloats) {
        assert!(pending.is_empty());
        self.handoff = Some(Handoff {
            pending_from: self.total_count(),
            pending,
        });
    }

    pub fn payload_record(&self, index: u32) -> &[u8] {
        &self.payloads[(index - self.base_count) as usize]
    }

    pub fn mark(&self) -> Mark {
        Mark {
            rows_len: self.rows.len(),
            payload_end_bytes: self.payload_end_bytes,
            undo: Vec::new(),
        }
    }

    pub fn push_node(&mut self, row: Row, vector: &[f32], payload_record: Vec<u8>) {
        assert_eq!(row.index, self.total_count());
        assert_eq!(vector.len(), self.dim_count as usize);
        assert_eq!(row.payload_offset_bytes, self.payload_end_bytes);
        self.payload_end_bytes += payload_record.len() as u64;
        self.rows.push(row);
        match self.handoff.as_mut() {
            Some(h) => h.pending.extend_from_slice(vector),
            None => self.vectors.extend_from_slice(vector),
        }
        self.payloads.push(payload_record);
    }

    pub fn put_row(&mut self, row: Row, mark: &mut Mark) {
        let index = row.index;
        if index >= self.base_count {
            let slot = &mut self.rows[(index - self.base_count) as usize];
            mark.undo.push((index, Some(slot.clone())));
            *slot = row;
        } else {
            let previous = self.patched.insert(index, row);
            mark.undo.push((index, previous));
        }
    }

    /// Restores the state at `mark`.
    pub fn rollback(&mut self, mark: Mark) {
        for (index, previous) in mark.undo.into_iter().rev() {
            if index >= self.base_count {
                if let (Some(prev), Some(slot)) = (previous, self.rows.get_mut((index - self.base_count) as usize)) {
                    *slot = prev;
                }
            } else {
                match previous {
                    Some(prev) => self.patched.insert(index, prev),
                    None => self.patched.remove(&index),
                };
            }
        }
        self.rows.truncate(mark.rows_len);
        self.payloads.truncate(mark.rows_len);
        self.vectors.truncate(mark.rows_len * self.dim_count as usize);
        if let Some(h) = self.handoff.as_mut() {
            // Nodes handed over past the mark come back as free indexes
            // (their vectors are written again, see `load.rs`).
            let end = self.base_count + mark.rows_len as u32;
            match end.checked_sub(h.pending_from) {
                Some(kept) => h.pending.truncate(kept as usize * self.dim_count as usize),
                None => {
                    h.pending.clear();
                    h.pending_from = end;
                }
            }
        }
        self.payload_end_bytes = mark.payload_end_bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vector buffer grown past the kept size keeps that much across a
    /// reset (not nothing), and a smaller one keeps all of it.
    #[test]
    fn reset_keeps_at_most_the_kept_vector_memory() {
        let mut overlay = Overlay::new(0, 4, 0);
        // Capacity only: no page of it is touched.
        overlay.vectors = Vec::with_capacity(25 << 20);
        overlay.reset(10, 0);
        assert_eq!(overlay.vectors.capacity(), 16 << 20, "cut to 64 MiB of f32");
        assert_eq!((overlay.base_count, overlay.vectors.len()), (10, 0));
        overlay.vectors = Vec::with_capacity(1000);
        overlay.reset(20, 0);
        assert!(overlay.vectors.capacity() >= 1000);
    }
}

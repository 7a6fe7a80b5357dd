//! The schedule of a circular ("elevator") scan: the column is read a
//! chunk of `chunk_rows` rows at a time, round and round, and a query
//! joins the rotation in progress at the next chunk instead of waiting
//! for a whole pass to end and its own to start.
//!
//! A query joins with the node count it sees (`limit`): it is scored on
//! the chunks that hold rows below it, each exactly once, starting at the
//! chunk the rotation is at and wrapping around, and is finished when the
//! last of them is scored. The cursor wraps once past the last chunk any
//! unfinished query still needs, so a query joined at chunk `j` gets
//! chunks `j, j+1, ..` and then `0, .., j-1`. Several workers may claim
//! chunks at once (each the next one); a query's state is merged under
//! the caller's lock when a claim completes.

use std::ops::Range;
use std::sync::Arc;

/// A query in the rotation: what workers read (`item`) and what the
/// completions merge into (`state`).
struct Joined<P, S> {
    id: u64,
    item: Arc<P>,
    state: S,
    /// Rows below this are scanned (the node count at join).
    limit: u32,
    /// Chunks holding rows below `limit` (at least one).
    chunks: u32,
    assigned: u32,
    done: u32,
}

/// One chunk a worker scores, with the queries that need it.
pub(super) struct Claim<P> {
    pub chunk: u32,
    /// Each query with its id, its rows of the chunk and its limit.
    pub queries: Vec<(u64, Arc<P>, Range<u32>, u32)>,
}

pub(super) struct Rotation<P, S> {
    chunk_rows: u32,
    /// The next chunk to claim (wrapped lazily, see `claim`).
    cursor: u32,
    next_id: u64,
    active: Vec<Joined<P, S>>,
}

impl<P, S> Rotation<P, S> {
    pub fn new(chunk_rows: u32) -> Rotation<P, S> {
        assert!(chunk_rows > 0);
        Rotation {
            chunk_rows,
            cursor: 0,
            next_id: 0,
            active: Vec::new(),
        }
    }

    /// Adds a query that sees `limit` rows; it starts at the next claim.
    pub fn join(&mut self, item: P, state: S, limit: u32) {
        self.active.push(Joined {
            id: self.next_id,
            item: Arc::new(item),
            state,
            limit,
            chunks: limit.div_ceil(self.chunk_rows).max(1),
            assigned: 0,
            done: 0,
        });
        self.next_id += 1;
    }

    /// No query is in the rotation.
    pub fn is_empty(&self) -> bool {
        self.active.is_empty()
    }

    /// The next chunk and every query that still needs it; `None` when no
    /// query needs another chunk (the rest are being scored).
    pub fn claim(&mut self) -> Option<Claim<P>> {
        let unassigned = self.active.iter().filter(|q| q.assigned < q.chunks);
        let span = unassigned.map(|q| q.chunks).max()?;
        if self.cursor >= span {
            self.cursor = 0;
        }
        let chunk = self.cursor;
        self.cursor += 1;
        let start = chunk * self.chunk_rows;
        let mut queries = Vec::new();
        for q in self.active.iter_mut() {
            if q.assigned < q.chunks && chunk < q.chunks {
                q.assigned += 1;
                let rows = start.min(q.limit)..(start + self.chunk_rows).min(q.limit);
                queries.push((q.id, q.item.clone(), rows, q.limit));
            }
        }
        Some(Claim { chunk, queries })
    }

    /// Removes every query (claims in flight then complete on none).
    pub fn drain(&mut self) -> Vec<(Arc<P>, S)> {
        self.active.drain(..).map(|q| (q.item, q.state)).collect()
    }

    /// Records a scored claim: `merge(i, state)` for its `i`th query.
    /// Returns the queries that have now been scored on all their chunks.
    pub fn complete(&mut self, claim: &Claim<P>, mut merge: impl FnMut(usize, &mut S)) -> Vec<(Arc<P>, S)> {
        for (i, (id, ..)) in claim.queries.iter().enumerate() {
            if let Some(q) = self.active.iter_mut().find(|q| q.id == *id) {
                merge(i, &mut q.state);
                q.done += 1;
            }
        }
        let (finished, active) = std::mem::take(&mut self.active)
            .into_iter()
            .partition(|q| q.done == q.chunks);
        self.active = active;
        finished.into_iter().map(|q| (q.item, q.state)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Claims and completes one chunk; each query's state records the
    /// chunks it was scored on. Returns the finished queries' names.
    fn step(r: &mut Rotation<&'static str, Vec<u32>>) -> (u32, Vec<&'static str>) {
        let claim = r.claim().expect("a query needs a chunk");
        let chunk = claim.chunk;
        let done = r.complete(&claim, |_, s| s.push(chunk));
        (chunk, done.into_iter().map(|(p, _)| *p).collect())
    }

    fn covered(r: &mut Rotation<&'static str, Vec<u32>>, name: &str) -> Vec<u32> {
        loop {
            let claim = r.claim().expect("a query needs a chunk");
            let chunk = claim.chunk;
            let done = r.complete(&claim, |_, s| s.push(chunk));
            if let Some((_, s)) = done.into_iter().find(|(p, _)| **p == name) {
                return s;
            }
        }
    }

    /// A query joining mid-rotation is scored on every chunk exactly once,
    /// from the chunk the rotation is at, wrapping around, and is answered
    /// after exactly one rotation.
    #[test]
    fn a_query_joining_mid_rotation_covers_each_chunk_once() {
        let mut r = Rotation::new(10);
        r.join("a", Vec::new(), 45); // 5 chunks
        assert_eq!(step(&mut r), (0, vec![]));
        assert_eq!(step(&mut r), (1, vec![]));
        r.join("b", Vec::new(), 45);
        assert_eq!(step(&mut r), (2, vec![]));
        assert_eq!(step(&mut r), (3, vec![]));
        assert_eq!(step(&mut r), (4, vec!["a"]), "a covered 0..5");
        assert_eq!(step(&mut r), (0, vec![]), "the cursor wraps after the last chunk");
        assert_eq!(
            step(&mut r),
            (1, vec!["b"]),
            "b leaves after one rotation: 2, 3, 4, 0, 1"
        );
        assert!(r.is_empty());
        assert!(r.claim().is_none());
    }

    #[test]
    fn a_query_finishes_after_one_rotation_and_the_first_when_all_chunks_are_done() {
        let mut r = Rotation::new(10);
        r.join("a", Vec::new(), 30);
        step(&mut r);
        r.join("b", Vec::new(), 30);
        assert_eq!(step(&mut r), (1, vec![]));
        assert_eq!(step(&mut r), (2, vec!["a"]));
        assert_eq!(covered(&mut r, "b"), [1, 2, 0]);
    }

    /// A query that sees more rows (appended after an earlier query
    /// joined) has more chunks; the earlier one skips them and each gets
    /// its own rows of the last chunk.
    #[test]
    fn queries_with_different_limits_cover_their_own_chunks() {
        let mut r = Rotation::new(10);
        r.join("short", Vec::new(), 25);
        let claim = r.claim().unwrap();
        r.complete(&claim, |_, s| s.push(claim.chunk));
        r.join("long", Vec::new(), 52);
        let claim = r.claim().unwrap();
        assert_eq!(claim.chunk, 1);
        let rows: Vec<_> = claim.queries.iter().map(|q| q.2.clone()).collect();
        assert_eq!(rows, [10..20, 10..20]);
        r.complete(&claim, |_, s| s.push(claim.chunk));
        let claim = r.claim().unwrap();
        let rows: Vec<_> = claim.queries.iter().map(|q| (*q.1, q.2.clone())).collect();
        assert_eq!(rows, [("short", 20..25), ("long", 20..30)]);
        let done = r.complete(&claim, |_, s| s.push(claim.chunk));
        assert_eq!(
            done.iter().map(|d| (*d.0, d.1.clone())).collect::<Vec<_>>(),
            [("short", vec![0, 1, 2])]
        );
        let mut long = covered(&mut r, "long");
        assert_eq!(long, [1, 2, 3, 4, 5, 0]);
        long.sort();
        assert_eq!(long, (0..6).collect::<Vec<_>>(), "every chunk of 0..52 once");
    }

    /// A query that sees fewer rows skips the chunks past them while the
    /// rotation serves a query that sees more, and still gets the chunk
    /// before the one it joined at.
    #[test]
    fn a_shorter_query_skips_the_chunks_past_its_rows() {
        let mut r = Rotation::new(10);
        r.join("a", Vec::new(), 25);
        step(&mut r);
        r.join("b", Vec::new(), 25);
        step(&mut r);
        r.join("c", Vec::new(), 52);
        assert_eq!(step(&mut r), (2, vec!["a"]));
        assert_eq!(covered(&mut r, "b"), [1, 2, 0]);
        assert_eq!(covered(&mut r, "c"), [2, 3, 4, 5, 0, 1]);
    }

    /// Two workers claim chunks one after the other before either
    /// completes: no chunk is given twice to a query, and a query is
    /// answered only once all its claims completed, whatever their order.
    #[test]
    fn concurrent_claims_complete_in_any_order() {
        let mut r = Rotation::new(10);
        r.join("a", Vec::new(), 30);
        let (c0, c1) = (r.claim().unwrap(), r.claim().unwrap());
        let c2 = r.claim().unwrap();
        assert_eq!([c0.chunk, c1.chunk, c2.chunk], [0, 1, 2]);
        assert!(r.claim().is_none(), "every chunk of a is claimed");
        assert!(r.complete(&c2, |_, s| s.push(2)).is_empty());
        assert!(r.complete(&c0, |_, s| s.push(0)).is_empty());
        let done = r.complete(&c1, |_, s| s.push(1));
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].1, [2, 0, 1]);
    }

    /// An empty bank: one (empty) chunk, so the query is still answered.
    #[test]
    fn an_empty_bank_takes_one_empty_chunk() {
        let mut r: Rotation<&str, Vec<u32>> = Rotation::new(10);
        r.join("a", Vec::new(), 0);
        let claim = r.claim().unwrap();
        assert_eq!(claim.queries[0].2, 0..0);
        assert_eq!(r.complete(&claim, |_, _| ()).len(), 1);
    }
}

//! A scan taken a row range at a time, as the server's circular scan
//! takes it, for tests that compare it with one whole query.
#![allow(dead_code)]

use deltamem::tree::TopK;
use deltamem::{Bank, Match, QueryOptions};

/// The answer of a scan taken a row range at a time (`Bank::scan_rows`,
/// the server's circular scan): `chunk` rows per range, starting at range
/// `first` and wrapping around, each range's candidates merged.
pub fn by_ranges(
    bank: &Bank,
    tree: &str,
    queries: &[Vec<f32>],
    opts: &QueryOptions,
    chunk: u32,
    first: u32,
) -> Vec<Vec<Match>> {
    let visible = bank.node_count();
    let prepared: Vec<_> = queries
        .iter()
        .map(|q| bank.prepare_query(tree, q, opts).unwrap())
        .collect();
    let refs: Vec<_> = prepared.iter().collect();
    let mut tops: Vec<TopK> = queries.iter().map(|_| TopK::new(opts.k)).collect();
    let chunks = visible.div_ceil(chunk).max(1);
    for c in (0..chunks).map(|c| (c + first) % chunks) {
        let lists = bank.scan_rows(&refs, c * chunk..(c + 1) * chunk, visible).unwrap();
        for (top, list) in tops.iter_mut().zip(lists) {
            list.into_iter().for_each(|c| top.push(c));
        }
    }
    tops.into_iter()
        .map(|t| bank.matches(&t.into_sorted()).unwrap())
        .collect()
}

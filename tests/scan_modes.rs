//! The scan's modes give the same answers as the plain single-threaded f32
//! scan: threads, batched queries, and int8 banks (approximate first pass,
//! exact re-rank) on random and adversarial data; f16 banks stay within
//! their documented bound of f32 scores.

use std::collections::BTreeMap;
use std::sync::Arc;

use deltamem::bank::kernels::quant::f16_score_bound;
use deltamem::format::manifest::Precision;
use deltamem::storage::MemStorage;
use deltamem::tree::TopK;
use deltamem::{Attach, Bank, BankConfig, Label, Match, NewNode, NodeRef, Payload, QueryOptions};

use deltamem::storage::sim::Rng;

mod common;
use common::ranges::by_ranges;

/// Draws on the shared seeded generator.
trait Draw {
    fn below(&mut self, n: usize) -> usize;
    fn f32(&mut self) -> f32;
    fn vector(&mut self, n: usize) -> Vec<f32>;
}

impl Draw for Rng {
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// Uniform in [-1, 1).
    fn f32(&mut self) -> f32 {
        self.next_f32() * 2.0 - 1.0
    }
    fn vector(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| Draw::f32(self)).collect()
    }
}

/// Kinds of data: random; near-ties (one base direction plus 1e-6 noise,
/// so scores differ by ~1e-6); mass on a few dimensions (large int8
/// scales); exact duplicates (ties broken only by depth and index, and by
/// the failure penalty).
#[derive(Debug, Clone, Copy)]
enum Data {
    Random,
    NearTies,
    Concentrated,
    Duplicates,
    /// Random vectors, trees in runs longer than a segment: whole
    /// segments of one tree (scanned without per-row filters).
    Runs,
    /// One base direction plus 1e-3 noise: scores differ by about as much
    /// as bfloat16 rounding moves them, so the rounded order is often not
    /// the exact one.
    CloseTies,
}

fn embedding(rng: &mut Rng, dim: usize, data: Data, base: &[f32]) -> Vec<f32> {
    match data {
        Data::Random => rng.vector(dim),
        Data::NearTies => base.iter().map(|b| b + rng.f32() * 1e-6).collect(),
        Data::CloseTies => base.iter().map(|b| b + rng.f32() * 1e-3).collect(),
        Data::Concentrated => {
            let mut v: Vec<f32> = rng.vector(dim).iter().map(|x| x * 0.01).collect();
            v[rng.below(3)] += 1.0 + rng.f32() * 0.1;
            v
        }
        Data::Duplicates => base.iter().map(|b| b * (1.0 + rng.below(3) as f32)).collect(),
        Data::Runs => rng.vector(dim),
    }
}

fn node(rng: &mut Rng, i: usize, count: usize, embedding: Vec<f32>, runs: bool) -> NewNode {
    let tree = match runs {
        true if (i / 300) % 3 == 2 => "env",
        true => "task",
        false if rng.below(4) == 0 => "env",
        false => "task",
    };
    // Parents only among the first batch, whose bank indexes equal list
    // positions (consolidations add nodes after it).
    let parents = i.min(count * 3 / 4);
    let attach = if runs && !i.is_multiple_of(300) && i <= parents && rng.below(3) == 0 {
        Attach::Parent(NodeRef::Index(i as u32 - 1)) // same run, same tree
    } else if parents > 0 && rng.below(3) == 0 && !runs {
        Attach::Parent(NodeRef::Index(rng.below(parents) as u32))
    } else {
        Attach::Root
    };
    NewNode {
        tree: tree.into(),
        attach,
        label: if rng.below(3) == 0 {
            Label::Failure
        } else {
            Label::Success
        },
        payload: Payload {
            scenario: format!("scenario {i}"),
            fields: BTreeMap::new(),
        },
        embedding,
        external_id: None,
    }
}

struct Pair {
    f32: Bank,
    other: Bank,
    queries: Vec<Vec<f32>>,
}

/// Two banks fed the same operations, one at `precision`; part of each
/// bank checkpointed, the rest in the overlay, a few nodes consolidated
/// (some before the checkpoint, some after).
fn pair(precision: Precision, data: Data, dim: usize, count: usize, seed: u64) -> Pair {
    let mut banks = Vec::new();
    let mut queries = Vec::new();
    for p in [Precision::F32, precision] {
        let mut config = BankConfig::new(dim as u32);
        config.rows_per_segment = Some(97); // segments cut across chunks
        config.precision = p;
        config.max_depth = 4;
        let mut bank = Bank::create(Arc::new(MemStorage::new()), config).unwrap();
        let mut rng = Rng(seed);
        let base = rng.vector(dim);
        let mut nodes = Vec::new();
        for i in 0..count {
            let e = embedding(&mut rng, dim, data, &base);
            nodes.push(node(&mut rng, i, count, e, matches!(data, Data::Runs)));
        }
        let parent_tree = |nodes: &[NewNode], i: usize| match nodes[i].attach {
            Attach::Parent(NodeRef::Index(p)) => Some(p as usize),
            _ => None,
        };
        for i in 0..count {
            if let Some(p) = parent_tree(&nodes, i) {
                let t = nodes[p].tree.clone();
                nodes[i].tree = t;
            }
        }
        let split = count * 3 / 4;
        // A WAL record holds at most 65,535 ops.
        for batch in nodes[..split].chunks(20_000) {
            bank.insert_batch(batch, None).unwrap();
        }
        consolidate_a_residual(&mut bank, 0..split as u32);
        bank.checkpoint().unwrap();
        for batch in nodes[split..].chunks(20_000) {
            bank.insert_batch(batch, None).unwrap();
        }
        // One consolidated since the checkpoint (the mapping still shows
        // it unconsolidated), one in the overlay.
        consolidate_a_residual(&mut bank, 0..split as u32);
        let end = bank.node_count();
        consolidate_a_residual(&mut bank, split as u32..end);
        queries = (0..12).map(|_| embedding(&mut rng, dim, data, &base)).collect();
        banks.push(bank);
    }
    let other = banks.pop().unwrap();
    Pair {
        f32: banks.pop().unwrap(),
        other,
        queries,
    }
}

fn consolidate_a_residual(bank: &mut Bank, range: std::ops::Range<u32>) {
    let due = range.clone().find(|&i| {
        let row = bank.row(i).unwrap();
        row.node_type == deltamem::NodeType::Residual && !row.is_consolidated()
    });
    if let Some(i) = due {
        let fields = BTreeMap::from([("execution_procedure".to_string(), "distilled".to_string())]);
        bank.consolidate(i, fields).unwrap();
    }
}

fn options(k: usize, eps: Option<f32>) -> QueryOptions {
    QueryOptions {
        k,
        tau: Some(-1.0),
        eps,
        include_consolidated: false,
    }
}

fn summary(matches: &[Match]) -> Vec<(u32, u32, u8)> {
    matches.iter().map(|m| (m.id, m.score.to_bits(), m.depth)).collect()
}

#[test]
fn int8_answers_equal_the_f32_scan_on_random_and_adversarial_data() {
    let cases = [
        (Data::Random, 48, 600),
        (Data::NearTies, 48, 600),
        (Data::Concentrated, 40, 500),
        (Data::Duplicates, 24, 400),
        (Data::Runs, 32, 1500),
        (Data::Random, 4096, 60),
        (Data::NearTies, 1000, 120),
    ];
    for (seed, (data, dim, count)) in cases.into_iter().enumerate() {
        let pair = pair(Precision::Int8, data, dim, count, seed as u64 + 1);
        assert!(pair.other.verify().unwrap().is_ok());
        for k in [1, 3, 10, 50] {
            // eps 0 makes failures tie with successes of equal cosine;
            // 1e-6 makes them tie across near-equal cosines. (A negative
            // eps is refused, as at init: issue 11.)
            for eps in [None, Some(0.0), Some(1e-6), Some(0.3)] {
                let opts = options(k, eps);
                for tree in ["task", "env"] {
                    for q in &pair.queries {
                        let want = pair.f32.query(tree, q, &opts).unwrap();
                        let got = pair.other.query(tree, q, &opts).unwrap();
                        assert_eq!(summary(&got), summary(&want), "{data:?} dim {dim} k {k} eps {eps:?}");
                        let with = QueryOptions {
                            include_consolidated: true,
                            ..opts.clone()
                        };
                        let want = pair.f32.query(tree, q, &with).unwrap();
                        let got = pair.other.query(tree, q, &with).unwrap();
                        assert_eq!(
                            summary(&got),
                            summary(&want),
                            "{data:?} dim {dim} k {k} eps {eps:?} all"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn threads_and_batches_give_the_single_thread_answers() {
    // Enough checkpointed rows (67,500) that the scan really splits into
    // four (at least 16,384 rows per thread).
    for precision in [Precision::F32, Precision::F16, Precision::Int8] {
        let mut pair = pair(precision, Data::Random, 8, 90_000, 9);
        let opts = options(10, None);
        let want: Vec<Vec<Match>> = pair
            .queries
            .iter()
            .map(|q| pair.other.query("task", q, &opts).unwrap())
            .collect();
        for threads in [2, 3, 4] {
            pair.other.set_query_threads(threads);
            for (q, w) in pair.queries.iter().zip(&want) {
                assert_eq!(
                    &pair.other.query("task", q, &opts).unwrap(),
                    w,
                    "{precision:?} threads {threads}"
                );
            }
            for n in [1, 5, 8, 9, 12] {
                let got = pair.other.query_batch("task", &pair.queries[..n], &opts).unwrap();
                assert_eq!(got, want[..n], "{precision:?} threads {threads} batch of {n}");
            }
        }
        pair.other.set_query_threads(1);
        let got = pair.other.query_batch("task", &pair.queries, &opts).unwrap();
        assert_eq!(got, want, "{precision:?} batch, one thread");
    }
}

#[test]
fn f16_scores_stay_within_the_documented_bound() {
    for (data, dim) in [(Data::Random, 768), (Data::Concentrated, 64), (Data::NearTies, 300)] {
        let pair = pair(Precision::F16, data, dim, 300, 5);
        let bound = f16_score_bound(dim) as f32;
        let opts = options(300, Some(0.0));
        let (mut agree, mut total) = (0, 0);
        for q in &pair.queries {
            let a = pair.f32.query("task", q, &opts).unwrap();
            let b = pair.other.query("task", q, &opts).unwrap();
            assert_eq!(a.len(), b.len());
            let by_id: BTreeMap<u32, f32> = b.iter().map(|m| (m.id, m.score)).collect();
            for m in &a {
                let diff = (m.score - by_id[&m.id]).abs();
                assert!(diff <= bound, "{data:?} node {}: {diff} > {bound}", m.id);
            }
            let top = |ms: &[Match]| ms.iter().take(10).map(|m| m.id).collect::<Vec<_>>();
            agree += usize::from(top(&a) == top(&b));
            total += 1;
        }
        println!("{data:?} dim {dim}: identical top-10 for {agree}/{total} queries");
    }
}

/// The scan against a brute-force oracle (f64 dot products of the stored
/// vectors, the filters and ranking rules applied by hand), on data where
/// whole segments hold one tree, so both the filtered and the unfiltered
/// chunk paths run. Only well-separated ranks are compared (f64 and the
/// f32 kernels differ by rounding).
#[test]
fn scan_equals_a_brute_force_oracle() {
    let pair = pair(Precision::F32, Data::Runs, 32, 1500, 77);
    let bank = &pair.f32;
    for eps in [0.0f32, 0.2] {
        for include_consolidated in [false, true] {
            for tree in ["task", "env"] {
                for q in &pair.queries {
                    let opts = QueryOptions {
                        k: 10,
                        tau: Some(-1.0),
                        eps: Some(eps),
                        include_consolidated,
                    };
                    let got: Vec<u32> = bank.query(tree, q, &opts).unwrap().iter().map(|m| m.id).collect();
                    let norm = q.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
                    let mut all: Vec<(f64, u8, u32)> = Vec::new();
                    for i in 0..bank.node_count() {
                        let row = bank.row(i).unwrap();
                        if bank.tree_name(row.tree) != tree || (!include_consolidated && row.is_consolidated()) {
                            continue;
                        }
                        let v = bank.vector(i).unwrap();
                        let dot: f64 = q
                            .iter()
                            .zip(&v)
                            .map(|(a, b)| f64::from(*a) * f64::from(*b))
                            .sum::<f64>()
                            / norm;
                        let penalty = if row.label == Label::Failure {
                            f64::from(eps)
                        } else {
                            0.0
                        };
                        all.push((dot - penalty, row.depth, i));
                    }
                    all.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
                    // Compare up to the first rank whose score is within
                    // 1e-5 of its neighbours (rounding could swap them).
                    let clear = (0..all.len().min(10))
                        .take_while(|&r| r + 1 >= all.len() || all[r].0 - all[r + 1].0 > 1e-5)
                        .count();
                    let want: Vec<u32> = all.iter().take(10).map(|x| x.2).collect();
                    assert_eq!(
                        got[..clear],
                        want[..clear],
                        "eps {eps} {tree} consolidated {include_consolidated}"
                    );
                    assert_eq!(got.len(), want.len());
                }
            }
        }
    }
}

/// The circular scan's ranges, merged, answer what `query` answers, for
/// every precision, on checkpointed and overlay rows across several
/// segments (97 rows each, cut across ranges), with consolidations before
/// and after the checkpoint, failures, and every option.
#[test]
fn row_ranges_merged_give_the_query_answers() {
    for (seed, precision) in [Precision::F32, Precision::F16, Precision::Int8]
        .into_iter()
        .enumerate()
    {
        for data in [Data::Random, Data::Duplicates, Data::Runs] {
            let pair = pair(precision, data, 16, 700, seed as u64 + 20);
            let bank = &pair.other;
            for (k, eps, all) in [
                (1, None, false),
                (5, Some(0.3), false),
                (10, Some(0.0), true),
                (40, None, true),
            ] {
                let opts = QueryOptions {
                    include_consolidated: all,
                    ..options(k, eps)
                };
                for tree in ["task", "env"] {
                    let want: Vec<Vec<Match>> = pair
                        .queries
                        .iter()
                        .map(|q| bank.query(tree, q, &opts).unwrap())
                        .collect();
                    for (chunk, first) in [(64, 0), (100, 3), (256, 2), (5_000, 0)] {
                        let got = by_ranges(bank, tree, &pair.queries, &opts, chunk, first);
                        assert_eq!(got, want, "{precision:?} {data:?} k {k} chunk {chunk} from {first}");
                    }
                }
            }
        }
    }
}

/// Between two ranges of a scan, a checkpoint moves the overlay rows into
/// the column under the same indices, and nodes appended or consolidated
/// into new roots are not seen by a scan that sees the earlier node count:
/// the merged answer is the one before those writes.
#[test]
fn row_ranges_across_a_checkpoint_and_later_writes_give_the_earlier_answer() {
    for precision in [Precision::F32, Precision::Int8] {
        let mut pair = pair(precision, Data::Random, 16, 700, 31);
        let opts = options(8, Some(0.3));
        let bank = &mut pair.other;
        let want: Vec<Vec<Match>> = pair
            .queries
            .iter()
            .map(|q| bank.query("task", q, &opts).unwrap())
            .collect();
        let visible = bank.node_count();
        let prepared: Vec<_> = pair
            .queries
            .iter()
            .map(|q| bank.prepare_query("task", q, &opts).unwrap())
            .collect();
        let mut tops: Vec<TopK> = pair.queries.iter().map(|_| TopK::new(opts.k)).collect();
        let chunk = 128;
        let chunks = visible.div_ceil(chunk);
        for c in (0..chunks).map(|c| (c + 2) % chunks) {
            if c == 0 {
                // Midway: the overlay checkpointed, then copies of the
                // queries appended (they would rank first) and a residual
                // among the answers consolidated into a new root (which
                // would hide it).
                bank.checkpoint().unwrap();
                for q in &pair.queries {
                    let mut copy = node(&mut Rng(1), 0, 1, q.clone(), false);
                    copy.tree = "task".into();
                    bank.insert(copy).unwrap();
                }
                let residual = want
                    .iter()
                    .flatten()
                    .find(|m| m.node_type == deltamem::NodeType::Residual && !bank.row(m.id).unwrap().is_consolidated())
                    .expect("a residual among the answers")
                    .id;
                let fields = BTreeMap::from([("execution_procedure".to_string(), "distilled".to_string())]);
                bank.consolidate(residual, fields).unwrap();
            }
            let refs: Vec<_> = prepared.iter().collect();
            let lists = bank.scan_rows(&refs, c * chunk..(c + 1) * chunk, visible).unwrap();
            for (top, list) in tops.iter_mut().zip(lists) {
                list.into_iter().for_each(|c| top.push(c));
            }
        }
        let got: Vec<Vec<Match>> = tops
            .into_iter()
            .map(|t| bank.matches(&t.into_sorted()).unwrap())
            .collect();
        assert_eq!(got, want, "{precision:?}");
    }
}

#[test]
fn wide_f32_batches_give_the_one_query_answers() {
    // Eight or more f32 queries may be scored first in bfloat16 or 16-bit
    // integers and then re-scored exactly (`kernels::bf16`,
    // `kernels::fixed16`): near-ties and duplicates sit
    // far inside the rounding error, so any pair the bound wrongly skips
    // shows here. k = 400 with tau -1 re-scores most pairs, so the scan
    // falls back to the exact kernel part of the way.
    let level = deltamem::bank::kernels::Level::active();
    match deltamem::bank::kernels::first_pass_name(level) {
        Some(name) => println!("{name} first pass in use"),
        None => println!("no first pass here: this test compares the exact kernels only"),
    }
    let cases = [
        (Data::Random, 48, 900),
        (Data::NearTies, 48, 900),
        (Data::Concentrated, 40, 700),
        (Data::Duplicates, 24, 600),
        (Data::Runs, 32, 1500),
        (Data::NearTies, 1000, 300),
        (Data::CloseTies, 48, 900),
        (Data::CloseTies, 768, 400),
        (Data::CloseTies, 96, 900),
        (Data::CloseTies, 300, 600),
        // Two threads of at least 16,384 rows each, and chunks enough that
        // a fall back to the exact kernel ends and the rounded pass resumes.
        (Data::CloseTies, 32, 40_000),
    ];
    for (seed, (data, dim, count)) in cases.into_iter().enumerate() {
        let mut pair = pair(Precision::F32, data, dim, count, seed as u64 + 40);
        pair.f32.set_query_threads(if count > 32_768 { 2 } else { 1 });
        for k in [1, 3, 10, 400] {
            for eps in [None, Some(0.0), Some(1e-6), Some(0.3)] {
                for tau in [Some(-1.0), Some(0.2)] {
                    for include_consolidated in [false, true] {
                        let opts = QueryOptions {
                            k,
                            tau,
                            eps,
                            include_consolidated,
                        };
                        for tree in ["task", "env"] {
                            let want: Vec<Vec<(u32, u32, u8)>> = pair
                                .queries
                                .iter()
                                .map(|q| summary(&pair.f32.query(tree, q, &opts).unwrap()))
                                .collect();
                            for n in [8, 9, 12] {
                                let got = pair.f32.query_batch(tree, &pair.queries[..n], &opts).unwrap();
                                let got: Vec<_> = got.iter().map(|m| summary(m)).collect();
                                assert_eq!(got, want[..n], "{data:?} dim {dim} {opts:?} {tree} batch of {n}");
                            }
                        }
                    }
                }
            }
        }
    }
}

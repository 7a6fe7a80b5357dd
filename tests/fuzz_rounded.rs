//! Differential fuzz of the approximate first pass (bfloat16 on AVX-512
//! BF16, 16-bit integers on AVX2; `scan::exact::scan_rows_rounded`):
//! for seeded random f32 banks, `query_batch` (8..=64 queries) and merged
//! `scan_rows` ranges must equal `query` run per query, bit for bit.
//!
//! Bounded by case count and time: FUZZ_CASES (default 200, ~20 s here),
//! FUZZ_SECS (a cap, default 120), FUZZ_SEED (first seed, default 1). A
//! longer run: `FUZZ_CASES=100000 FUZZ_SECS=960 cargo test --release --test
//! fuzz_rounded -- --nocapture` (4,128 cases, ~370,000 comparisons each of
//! batches and ranges, when it was written: no mismatch).
//!
//! On a CPU with neither (or with `DELTAMEM_BF16=off` and
//! `DELTAMEM_FIXED16=off`) every pass is exact and this compares the exact
//! kernels only; the test says which.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deltamem::storage::MemStorage;
use deltamem::storage::sim::Rng;
mod common;
use common::ranges::by_ranges;
use deltamem::{Attach, Bank, BankConfig, Label, Match, NewNode, NodeRef, Payload, QueryOptions};

trait Draw {
    fn below(&mut self, n: usize) -> usize;
    fn f32(&mut self) -> f32;
    fn vector(&mut self, n: usize) -> Vec<f32>;
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T;
}

impl Draw for Rng {
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn f32(&mut self) -> f32 {
        self.next_f32() * 2.0 - 1.0
    }
    fn vector(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| Draw::f32(self)).collect()
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Random,
    Duplicate,
    NearDup(f32),
    DynamicRange,
    OneHot,
    Concentrated,
    Mixed,
}

fn nonzero(mut v: Vec<f32>, rng: &mut Rng) -> Vec<f32> {
    // The bank refuses norms below 1e-12: keep a component of order 1.
    if v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt() < 1e-6 {
        let i = rng.below(v.len());
        v[i] = 1.0;
    }
    v
}

fn vector(rng: &mut Rng, dim: usize, kind: Kind, bases: &[Vec<f32>]) -> Vec<f32> {
    let kind = if kind == Kind::Mixed {
        rng.pick(&[
            Kind::Random,
            Kind::Duplicate,
            Kind::NearDup(1e-6),
            Kind::NearDup(1e-4),
            Kind::NearDup(1e-2),
            Kind::DynamicRange,
            Kind::OneHot,
            Kind::Concentrated,
        ])
    } else {
        kind
    };
    let v = match kind {
        Kind::Random | Kind::Mixed => rng.vector(dim),
        Kind::Duplicate => {
            let b = &bases[rng.below(bases.len())];
            let s = rng.pick(&[1.0f32, 1.0, 2.0, 0.5, 3.0]);
            b.iter().map(|x| x * s).collect()
        }
        Kind::NearDup(noise) => {
            let b = &bases[rng.below(bases.len())];
            b.iter().map(|x| x + rng.f32() * noise).collect()
        }
        Kind::DynamicRange => (0..dim)
            .map(|_| {
                let e = rng.pick(&[-30i32, -30, -25, -20, -38, -12, -3, 0, 0, 20, 30]);
                let m = rng.f32();
                m * 10f32.powi(e)
            })
            .collect(),
        Kind::OneHot => {
            let mut v = vec![0.0f32; dim];
            let n = 1 + rng.below(2);
            for _ in 0..n {
                let span = 1 + rng.below(8);
                let i = rng.below(dim.min(span));
                v[i] = if rng.below(4) == 0 { -1.0 } else { 1.0 };
            }
            if rng.below(3) == 0 {
                // tiny leaks next to the hot component
                for x in v.iter_mut() {
                    if *x == 0.0 && rng.below(4) == 0 {
                        *x = rng.f32() * 1e-30;
                    }
                }
            }
            v
        }
        Kind::Concentrated => {
            let mut v: Vec<f32> = rng.vector(dim).iter().map(|x| x * 0.01).collect();
            let i = rng.below(dim.min(3));
            v[i] += 1.0 + rng.f32() * 0.1;
            v
        }
    };
    nonzero(v, rng)
}

#[derive(Debug, Clone)]
struct Case {
    seed: u64,
    dim: usize,
    count: usize,
    rows_per_segment: Option<u32>,
    trees: usize,
    kind: Kind,
    threads: usize,
    max_depth: u8,
}

fn draw_case(seed: u64) -> Case {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let dim = rng.pick(&[1usize, 2, 31, 32, 33, 100, 768, 16, 64, 3]);
    let big = rng.below(8) == 0;
    let count = if big && dim <= 100 {
        32_769 + rng.below(17_000)
    } else if dim >= 768 {
        50 + rng.below(3000)
    } else {
        rng.pick(&[1usize, 5, 40, 300, 1000, 3000, 8000]) + rng.below(500)
    };
    let rows_per_segment = if count > 10_000 {
        rng.pick(&[Some(7u32), Some(97), Some(1024), Some(4096), None])
    } else {
        rng.pick(&[Some(1u32), Some(2), Some(7), Some(97), Some(255), Some(1024), None])
    };
    let kind = rng.pick(&[
        Kind::Random,
        Kind::Duplicate,
        Kind::NearDup(1e-6),
        Kind::NearDup(1e-3),
        Kind::NearDup(1e-2),
        Kind::DynamicRange,
        Kind::OneHot,
        Kind::Concentrated,
        Kind::Mixed,
        Kind::Mixed,
    ]);
    let rows_per_segment = match rows_per_segment {
        Some(r) if (r as usize) * 4000 < count => Some((count / 4000 + 1) as u32),
        r => r,
    };
    Case {
        seed,
        dim,
        count,
        rows_per_segment,
        trees: 1 + rng.below(2),
        kind,
        threads: if count > 32_768 || rng.below(3) == 0 { 2 } else { 1 },
        max_depth: rng.pick(&[1u8, 2, 4, 8]),
    }
}

fn tree_name(t: usize) -> String {
    ["task", "env"][t % 2].to_string()
}

fn make_nodes(rng: &mut Rng, case: &Case, bank: &Bank, start: usize, n: usize, bases: &[Vec<f32>]) -> Vec<NewNode> {
    let mut trees_local: Vec<String> = Vec::with_capacity(n);
    let mut out = Vec::with_capacity(n);
    for j in 0..n {
        let e = vector(rng, case.dim, case.kind, bases);
        let here = start + j;
        let (attach, tree) = if here > 0 && rng.below(3) == 0 {
            let p = rng.below(here);
            let tree = if p < start {
                bank.tree_name(bank.row(p as u32).unwrap().tree).to_string()
            } else {
                trees_local[p - start].clone()
            };
            (Attach::Parent(NodeRef::Index(p as u32)), tree)
        } else {
            (Attach::Root, tree_name(rng.below(case.trees)))
        };
        trees_local.push(tree.clone());
        out.push(NewNode {
            tree,
            attach,
            label: if rng.below(3) == 0 {
                Label::Failure
            } else {
                Label::Success
            },
            payload: Payload {
                scenario: format!("s{here}"),
                fields: BTreeMap::new(),
            },
            embedding: e,
            external_id: None,
        });
    }
    out
}

fn consolidate_some(rng: &mut Rng, bank: &mut Bank, range: std::ops::Range<u32>, times: usize) -> usize {
    let mut done = 0;
    for _ in 0..times {
        if range.is_empty() {
            break;
        }
        let from = range.start + rng.below((range.end - range.start) as usize) as u32;
        let due = (from..range.end).chain(range.start..from).find(|&i| {
            let row = bank.row(i).unwrap();
            row.node_type == deltamem::NodeType::Residual && !row.is_consolidated()
        });
        if let Some(i) = due {
            let fields = BTreeMap::from([("execution_procedure".to_string(), "distilled".to_string())]);
            if bank.consolidate(i, fields).is_ok() {
                done += 1;
            }
        }
    }
    done
}

struct Built {
    bank: Bank,
    vectors: Vec<Vec<f32>>,
    bases: Vec<Vec<f32>>,
}

fn build(case: &Case) -> Built {
    let mut rng = Rng(case.seed ^ 0xD1B5_4A32_D192_ED03 | 1);
    let mut config = BankConfig::new(case.dim as u32);
    config.rows_per_segment = case.rows_per_segment;
    config.max_depth = case.max_depth;
    let mut bank = Bank::create(Arc::new(MemStorage::new()), config).unwrap();
    let bases: Vec<Vec<f32>> = (0..1 + rng.below(4))
        .map(|_| nonzero(rng.vector(case.dim), &mut rng))
        .collect();
    // Phase A: checkpointed; phase B: overlay (sometimes checkpointed too, then phase C in overlay).
    let split = match rng.below(4) {
        0 => case.count,
        1 => 0,
        _ => case.count * (1 + rng.below(9)) / 10,
    };
    let mut vectors = Vec::new();
    let a = make_nodes(&mut rng, case, &bank, 0, split, &bases);
    vectors.extend(a.iter().map(|n| n.embedding.clone()));
    for batch in a.chunks(20_000) {
        bank.insert_batch(batch, None).unwrap();
    }
    let end = bank.node_count();
    let times = rng.below(6);
    consolidate_some(&mut rng, &mut bank, 0..end, times);
    bank.checkpoint().unwrap();
    let start = bank.node_count() as usize;
    let b = make_nodes(&mut rng, case, &bank, start, case.count - split, &bases);
    vectors.extend(b.iter().map(|n| n.embedding.clone()));
    for batch in b.chunks(20_000) {
        bank.insert_batch(batch, None).unwrap();
    }
    let times = rng.below(4);
    consolidate_some(&mut rng, &mut bank, 0..start as u32, times);
    let end = bank.node_count();
    let times = rng.below(4);
    consolidate_some(&mut rng, &mut bank, start as u32..end, times);
    if rng.below(3) == 0 {
        bank.checkpoint().unwrap();
        let start = bank.node_count() as usize;
        let extra = 1 + rng.below(300);
        let c = make_nodes(&mut rng, case, &bank, start, extra, &bases);
        vectors.extend(c.iter().map(|n| n.embedding.clone()));
        bank.insert_batch(&c, None).unwrap();
        let end = bank.node_count();
        let times = rng.below(3);
        consolidate_some(&mut rng, &mut bank, 0..end, times);
    }
    bank.set_query_threads(case.threads);
    Built { bank, vectors, bases }
}

fn queries(rng: &mut Rng, built: &Built, case: &Case, n: usize) -> Vec<Vec<f32>> {
    let qkind = rng.below(4);
    (0..n)
        .map(|_| {
            let k = if qkind == 3 { rng.below(4) } else { qkind };
            match k {
                // equal to a stored row (as inserted, or as stored)
                0 if !built.vectors.is_empty() => {
                    let i = rng.below(built.bank.node_count() as usize);
                    if rng.below(2) == 0 {
                        built.bank.vector(i as u32).unwrap().to_vec()
                    } else {
                        built.vectors[i.min(built.vectors.len() - 1)].clone()
                    }
                }
                // near a stored row
                1 if !built.vectors.is_empty() => {
                    let v = &built.vectors[rng.below(built.vectors.len())];
                    let noise = rng.pick(&[1e-7f32, 1e-6, 1e-4, 1e-2]);
                    nonzero(v.iter().map(|x| x + rng.f32() * noise).collect(), rng)
                }
                2 => vector(rng, case.dim, Kind::Mixed, &built.bases),
                _ => vector(rng, case.dim, case.kind, &built.bases),
            }
        })
        .collect()
}

fn summary(ms: &[Match]) -> Vec<(u32, u32, f32, u8)> {
    ms.iter().map(|m| (m.id, m.score.to_bits(), m.score, m.depth)).collect()
}

struct Stats {
    cases: u64,
    batch_cmp: u64,
    range_cmp: u64,
    query_cmp: u64,
    mismatches: Vec<String>,
    panics: Vec<String>,
}

fn first_diff(got: &[Match], want: &[Match]) -> String {
    let g = summary(got);
    let w = summary(want);
    let pos = (0..g.len().max(w.len())).find(|&i| g.get(i) != w.get(i) || got.get(i) != want.get(i));
    match pos {
        Some(i) => format!(
            "len got {} want {}; first diff at rank {i}: got {:?} want {:?}",
            g.len(),
            w.len(),
            g.get(i),
            w.get(i)
        ),
        None => "no diff?".into(),
    }
}

fn run_case(case: &Case, st: &mut Stats, deadline: Instant) {
    let built = build(case);
    let bank = &built.bank;
    let mut rng = Rng(case.seed ^ 0x94D0_49BB_1331_11EB | 1);
    let nodes = bank.node_count() as usize;
    let rounds = 1 + rng.below(4);
    for round in 0..rounds {
        if Instant::now() > deadline {
            break;
        }
        let n = 8 + rng.below(57);
        let qs = queries(&mut rng, &built, case, n);
        let k = match rng.below(6) {
            0 => 1,
            1 => 1 + rng.below(10),
            2 => 1 + rng.below(500),
            3 => nodes + 1 + rng.below(10),
            4 => rng.pick(&[10usize, 50, 100, 500]),
            _ => (nodes / 2).max(1),
        };
        let tau = rng.pick(&[
            Some(-1.0f32),
            Some(-1.0),
            None,
            Some(0.0),
            Some(0.5),
            Some(0.9),
            Some(0.99),
            Some(0.999_999),
        ]);
        let eps = rng.pick(&[
            None,
            Some(0.0f32),
            Some(1e-7),
            Some(1e-6),
            Some(1e-3),
            Some(0.3),
            Some(1.0),
            Some(2.0),
        ]);
        let include_consolidated = rng.below(2) == 0;
        let opts = QueryOptions {
            k,
            tau,
            eps,
            include_consolidated,
        };
        let tree = tree_name(rng.below(case.trees));
        // a tree may not exist if nothing landed in it
        let want: Vec<Vec<Match>> = match qs
            .iter()
            .map(|q| bank.query(&tree, q, &opts))
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(w) => w,
            Err(e) => {
                // unknown tree etc.: batch must fail the same way
                let b = bank.query_batch(&tree, &qs, &opts);
                if b.is_ok() {
                    st.mismatches
                        .push(format!("{case:?} round {round}: query errs ({e}) but batch ok"));
                }
                continue;
            }
        };
        st.query_cmp += n as u64;
        let got = bank.query_batch(&tree, &qs, &opts).unwrap();
        st.batch_cmp += n as u64;
        for (qi, (g, w)) in got.iter().zip(&want).enumerate() {
            if g != w {
                st.mismatches.push(format!(
                    "BATCH {case:?} round {round} tree {tree} n {n} {opts:?} query {qi}: {}",
                    first_diff(g, w)
                ));
                break;
            }
        }
        // merged ranges
        let chunk = rng.pick(&[1u32, 7, 64, 100, 256, 1000, 4096, 16_384, 1 << 20]).max(1);
        let chunk = if nodes as u32 / chunk > 3000 {
            (nodes as u32 / 3000).max(1)
        } else {
            chunk
        };
        let first = rng.below(5) as u32;
        let ranged = by_ranges(bank, &tree, &qs, &opts, chunk, first);
        st.range_cmp += n as u64;
        for (qi, (g, w)) in ranged.iter().zip(&want).enumerate() {
            if g != w {
                st.mismatches.push(format!(
                    "RANGES chunk {chunk} first {first} {case:?} round {round} tree {tree} n {n} {opts:?} query {qi}: {}",
                    first_diff(g, w)
                ));
                break;
            }
        }
    }
}

#[test]
fn rounded_batches_and_ranges_equal_single_queries() {
    let level = deltamem::bank::kernels::Level::active();
    let pass = deltamem::bank::kernels::first_pass_name(level);
    println!("first pass: {}", pass.unwrap_or("OFF"));
    let secs: u64 = std::env::var("FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    let max_cases: u64 = std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let seed0: u64 = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let start = Instant::now();
    let deadline = start + Duration::from_secs(secs);
    let mut st = Stats {
        cases: 0,
        batch_cmp: 0,
        range_cmp: 0,
        query_cmp: 0,
        mismatches: Vec::new(),
        panics: Vec::new(),
    };
    let mut seed = seed0;
    while Instant::now() < deadline && st.cases < max_cases {
        let case = draw_case(seed);
        let before = st.mismatches.len();
        let r = catch_unwind(AssertUnwindSafe(|| run_case(&case, &mut st, deadline)));
        if let Err(e) = r {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            st.panics.push(format!("{case:?}: {msg}"));
            println!("PANIC seed {seed}: {msg}");
        }
        for m in &st.mismatches[before..] {
            println!("MISMATCH seed {seed}: {m}");
        }
        st.cases += 1;
        if st.cases.is_multiple_of(25) {
            println!(
                "[{:>5.0}s] cases {} batch-cmp {} range-cmp {} mismatches {} panics {}",
                start.elapsed().as_secs_f64(),
                st.cases,
                st.batch_cmp,
                st.range_cmp,
                st.mismatches.len(),
                st.panics.len()
            );
        }
        seed += 1;
    }
    println!(
        "DONE seeds {seed0}..{seed} in {:.0}s: cases {} query-calls {} batch-cmp {} range-cmp {} mismatches {} panics {}",
        start.elapsed().as_secs_f64(),
        st.cases,
        st.query_cmp,
        st.batch_cmp,
        st.range_cmp,
        st.mismatches.len(),
        st.panics.len()
    );
    assert!(
        st.mismatches.is_empty() && st.panics.is_empty(),
        "{:#?}\n{:#?}",
        st.mismatches,
        st.panics
    );
}

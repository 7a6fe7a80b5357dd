//! Engine benchmarks: scan against an in-heap peer over the same vectors,
//! insert throughput per sync policy, open time. Run with
//! `cargo bench --bench engine`; quote medians and ratios, not single runs.

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use deltamem::{Attach, Bank, BankConfig, Label, NewNode, OpenOptions, Payload, QueryOptions, SyncPolicy};

const DIM: u32 = 768;

/// xorshift64*: deterministic vectors without a dependency.
struct Rng(u64);

impl Rng {
    fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    fn vector(&mut self) -> Vec<f32> {
        let v: Vec<f32> = (0..DIM).map(|_| self.next_f32()).collect();
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.into_iter().map(|x| x / n).collect()
    }
}

fn node(rng: &mut Rng, i: usize) -> NewNode {
    let mut fields = BTreeMap::new();
    fields.insert(
        "execution_procedure".into(),
        format!("step one for {i}; step two; check the result"),
    );
    NewNode {
        tree: if i % 2 == 0 { "task" } else { "env" }.into(),
        attach: Attach::Root,
        label: if i % 7 == 0 { Label::Failure } else { Label::Success },
        payload: Payload {
            scenario: format!("scenario {i}"),
            fields,
        },
        embedding: rng.vector(),
        external_id: None,
    }
}

fn build(dir: &std::path::Path, rows: usize) -> Vec<f32> {
    let mut bank = Bank::create_dir(dir, BankConfig::new(DIM)).unwrap();
    bank.set_sync_policy(SyncPolicy::None);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut heap = Vec::with_capacity(rows * DIM as usize);
    for i in 0..rows {
        let n = node(&mut rng, i);
        heap.extend_from_slice(&n.embedding);
        bank.insert(n).unwrap();
    }
    bank.close().unwrap();
    heap
}

/// The peer: the same dot product over a plain heap matrix, no filters.
fn heap_scan(heap: &[f32], q: &[f32]) -> (usize, f32) {
    let mut best = (0, f32::MIN);
    for (i, row) in heap.chunks_exact(DIM as usize).enumerate() {
        let s = deltamem::bank::dot(q, row);
        if s > best.1 {
            best = (i, s);
        }
    }
    best
}

fn scan(c: &mut Criterion) {
    let mut group = c.benchmark_group("scan_f32_768");
    group.sample_size(20);
    for rows in [10_000usize, 100_000] {
        let dir = tempfile::tempdir().unwrap();
        let heap = build(dir.path(), rows);
        let bank = Bank::open_dir(
            dir.path(),
            OpenOptions {
                read_only: true,
                ..Default::default()
            },
        )
        .unwrap();
        let q = Rng(42).vector();
        let opts = QueryOptions {
            k: 10,
            tau: Some(-1.0),
            ..Default::default()
        };
        group.throughput(Throughput::Bytes((rows * DIM as usize * 4) as u64));
        // Both trees share the column; query both so every row is scored.
        group.bench_with_input(BenchmarkId::new("deltamem_mmap_both_trees", rows), &rows, |b, _| {
            b.iter(|| {
                black_box(bank.query("task", &q, &opts).unwrap());
                black_box(bank.query("env", &q, &opts).unwrap());
            })
        });
        group.bench_with_input(BenchmarkId::new("heap_peer", rows), &rows, |b, _| {
            b.iter(|| black_box(heap_scan(&heap, &q)))
        });
    }
    group.finish();
}

fn insert(c: &mut Criterion) {
    let mut group = c.benchmark_group("insert_768");
    group.sample_size(10);
    let policies = [
        ("none", SyncPolicy::None),
        (
            "batch_1000",
            SyncPolicy::Batch {
                records: 1000,
                interval_ms: 1000,
            },
        ),
        ("always", SyncPolicy::Always),
    ];
    for (name, policy) in policies {
        let count = if policy == SyncPolicy::Always { 200 } else { 5_000 };
        group.throughput(Throughput::Elements(count as u64));
        group.bench_function(name, |b| {
            b.iter_batched(
                || {
                    let dir = tempfile::tempdir().unwrap();
                    let mut bank = Bank::create_dir(dir.path(), BankConfig::new(DIM)).unwrap();
                    bank.set_sync_policy(policy);
                    let mut rng = Rng(7);
                    let nodes: Vec<NewNode> = (0..count).map(|i| node(&mut rng, i)).collect();
                    (dir, bank, nodes)
                },
                |(dir, mut bank, nodes)| {
                    for n in nodes {
                        bank.insert(n).unwrap();
                    }
                    bank.sync().unwrap();
                    (dir, bank)
                },
                criterion::BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

fn open(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), 20_000);
    c.bench_function("open_read_only_20k", |b| {
        b.iter(|| {
            black_box(
                Bank::open_dir(
                    dir.path(),
                    OpenOptions {
                        read_only: true,
                        ..Default::default()
                    },
                )
                .unwrap(),
            )
        })
    });
}

criterion_group!(benches, scan, insert, open);
criterion_main!(benches);

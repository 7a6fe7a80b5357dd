//! Engine benchmarks (criterion). Run all with `cargo bench --bench engine`,
//! or a group with e.g. `cargo bench --bench engine -- scan_precision`.
//! Quote medians and ratios from quiet machines, not single runs.
//!
//! Groups: `scan_size` (f32 scan of 10k, 100k, 1M rows at dim 768),
//! `scan_precision` (f32, f16, int8 + exact re-rank at 100k and 1M),
//! `scan_threads` (1 vs 2 threads), `scan_batch` (8 queries one by one vs
//! one `query_batch` pass), `insert` (per sync policy), `import` (100k x
//! 768 rows: the CLI's `import --npy`, and in the library `load_column`
//! against `insert_batch` through the WAL), `open` (read-only
//! open of a 1M bank), `recovery` (writer open replaying a WAL of 100k
//! un-checkpointed records). Banks are built once and cached under
//! target/bench-banks/ (see benches/support): the first run of the 1M
//! groups takes a few minutes and ~10 GB of disk.

mod support;

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkGroup, BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use deltamem::format::manifest::Precision;
use deltamem::{Bank, BankConfig, Change, NewNode, OpenOptions, QueryOptions, SyncPolicy};
use support::{DIM, Rng, bank_dir, node, npy_file, open_read_only, queries, recovery_dir};

const K: usize = 10;

fn options() -> QueryOptions {
    QueryOptions {
        k: K,
        tau: Some(-1.0),
        ..QueryOptions::default()
    }
}

/// Long-running iterations: few samples, one iteration each.
fn slow<M: criterion::measurement::Measurement>(group: &mut BenchmarkGroup<'_, M>) {
    group.sample_size(10);
    group.sampling_mode(SamplingMode::Flat);
    group.warm_up_time(Duration::from_secs(2));
    group.measurement_time(Duration::from_secs(8));
}

/// Benchmarks one query per iteration (cycling through 16 queries) on a
/// cached bank; `threads` scan threads. The bank is opened inside the
/// closure, so filtered-out benchmarks never build or map their bank.
fn bench_query<M: criterion::measurement::Measurement>(
    group: &mut BenchmarkGroup<'_, M>,
    id: BenchmarkId,
    rows: usize,
    precision: Precision,
    threads: usize,
) {
    group.bench_function(id, |b| {
        let mut bank = open_read_only(&bank_dir(rows, precision));
        bank.set_query_threads(threads);
        let qs = queries(16);
        bank.query("all", &qs[0], &options()).unwrap(); // first map: checks
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % qs.len();
            black_box(bank.query("all", &qs[i], &options()).unwrap())
        })
    });
}

fn scan_size(c: &mut Criterion) {
    let mut group = c.benchmark_group("scan_size");
    slow(&mut group);
    for rows in [10_000usize, 100_000, 1_000_000] {
        group.throughput(Throughput::Bytes(rows as u64 * u64::from(DIM) * 4));
        bench_query(&mut group, BenchmarkId::new("f32", rows), rows, Precision::F32, 1);
    }
    group.finish();
}

fn scan_precision(c: &mut Criterion) {
    let mut group = c.benchmark_group("scan_precision");
    slow(&mut group);
    for rows in [100_000usize, 1_000_000] {
        group.throughput(Throughput::Elements(rows as u64));
        for precision in [Precision::F32, Precision::F16, Precision::Int8] {
            let id = BenchmarkId::new(precision.as_str(), rows);
            bench_query(&mut group, id, rows, precision, 1);
        }
    }
    group.finish();
}

fn scan_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("scan_threads");
    slow(&mut group);
    group.throughput(Throughput::Elements(1_000_000));
    for precision in [Precision::F32, Precision::Int8] {
        for threads in [1, 2] {
            let id = BenchmarkId::new(format!("{}_1m", precision.as_str()), format!("{threads}_threads"));
            bench_query(&mut group, id, 1_000_000, precision, threads);
        }
    }
    group.finish();
}

fn scan_batch(c: &mut Criterion) {
    let mut group = c.benchmark_group("scan_batch");
    slow(&mut group);
    let qs = queries(8);
    group.throughput(Throughput::Elements(qs.len() as u64));
    for precision in [Precision::F32, Precision::F16, Precision::Int8] {
        let name = format!("{}_1m", precision.as_str());
        group.bench_function(BenchmarkId::new(name.clone(), "8_one_by_one"), |b| {
            let bank = open_read_only(&bank_dir(1_000_000, precision));
            bank.query("all", &qs[0], &options()).unwrap();
            b.iter(|| {
                for q in &qs {
                    black_box(bank.query("all", q, &options()).unwrap());
                }
            })
        });
        group.bench_function(BenchmarkId::new(name, "8_in_one_pass"), |b| {
            let bank = open_read_only(&bank_dir(1_000_000, precision));
            bank.query("all", &qs[0], &options()).unwrap();
            b.iter(|| black_box(bank.query_batch("all", &qs, &options()).unwrap()))
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
                    let nodes: Vec<NewNode> = (0..count)
                        .map(|i| node(&mut rng, i, if i % 2 == 0 { "task" } else { "env" }))
                        .collect();
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

const IMPORT_ROWS: usize = 100_000;
const IMPORT_BATCH_ROWS: usize = 4096;

/// Bulk import of 100k x 768 rows. `cli_npy`: the real binary importing a
/// cached .npy into a fresh bank (process start, decode, checks, acks to
/// /dev/null included). In the library, from rows in memory: `load_column`
/// (data files only) against its peer `insert_batch` (WAL, then the
/// checkpoint of `close`); batches of 4096 rows both.
fn import(c: &mut Criterion) {
    let mut group = c.benchmark_group("import");
    slow(&mut group);
    group.throughput(Throughput::Elements(IMPORT_ROWS as u64));
    group.bench_function("cli_npy_100k", |b| {
        let npy = npy_file(IMPORT_ROWS);
        b.iter_batched(
            || {
                let dir = tempfile::tempdir().unwrap();
                Bank::create_dir(dir.path(), BankConfig::new(DIM))
                    .unwrap()
                    .close()
                    .unwrap();
                dir
            },
            |dir| {
                let status = std::process::Command::new(env!("CARGO_BIN_EXE_deltamem"))
                    .args(["import", "--quiet", "--tree", "task", "--npy"])
                    .arg(&npy)
                    .arg(dir.path())
                    .stdout(std::process::Stdio::null())
                    .status()
                    .unwrap();
                assert!(status.success());
                dir
            },
            criterion::BatchSize::PerIteration,
        )
    });
    let mut rng = Rng(0x1A_2B);
    let nodes: Vec<NewNode> = (0..IMPORT_ROWS).map(|i| node(&mut rng, i, "task")).collect();
    group.bench_function("load_column_100k", |b| {
        let column: Vec<f32> = nodes.iter().flat_map(|n| n.embedding.iter().copied()).collect();
        let bare: Vec<Change> = nodes
            .iter()
            .map(|n| {
                Change::Insert(NewNode {
                    embedding: Vec::new(),
                    ..n.clone()
                })
            })
            .collect();
        let width = IMPORT_BATCH_ROWS * DIM as usize;
        b.iter_batched(
            || tempfile::tempdir().unwrap(),
            |dir| {
                let mut bank = Bank::create_dir(dir.path(), BankConfig::new(DIM)).unwrap();
                for (changes, column) in bare.chunks(IMPORT_BATCH_ROWS).zip(column.chunks(width)) {
                    bank.load_column(changes, column).unwrap();
                }
                bank.close().unwrap();
                dir
            },
            criterion::BatchSize::PerIteration,
        )
    });
    group.bench_function("insert_batch_wal_100k", |b| {
        b.iter_batched(
            || tempfile::tempdir().unwrap(),
            |dir| {
                let mut bank = Bank::create_dir(dir.path(), BankConfig::new(DIM)).unwrap();
                bank.set_sync_policy(SyncPolicy::None);
                for batch in nodes.chunks(IMPORT_BATCH_ROWS) {
                    bank.insert_batch(batch, None).unwrap();
                }
                bank.close().unwrap();
                dir
            },
            criterion::BatchSize::PerIteration,
        )
    });
    group.finish();
}

fn open(c: &mut Criterion) {
    let mut group = c.benchmark_group("open");
    group.bench_function("read_only_1m", |b| {
        let dir = bank_dir(1_000_000, Precision::F32);
        b.iter(|| black_box(open_read_only(&dir)))
    });
    group.finish();
}

fn recovery(c: &mut Criterion) {
    let mut group = c.benchmark_group("recovery");
    slow(&mut group);
    group.throughput(Throughput::Elements(100_000));
    group.bench_function("writer_open_100k_wal_records", |b| {
        let dir = recovery_dir(100_000);
        let options = OpenOptions {
            checkpoint_wal_bytes: u64::MAX,
            ..OpenOptions::default()
        };
        b.iter(|| {
            // Dropped without close: the WAL stays as it is for the next.
            let bank = Bank::open_dir(&dir, options.clone()).unwrap();
            assert_eq!(bank.node_count(), 100_000);
            black_box(bank)
        })
    });
    group.finish();
}

criterion_group!(
    benches,
    scan_size,
    scan_precision,
    scan_threads,
    scan_batch,
    insert,
    import,
    open,
    recovery
);
criterion_main!(benches);

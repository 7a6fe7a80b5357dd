//! Timing harness for tools/bench-vs-peers.py and the README figures.
//! Each subcommand prints one JSON object per line on stdout.
//!
//! ```text
//! bench_scan gen       <out.npy> <rows> <dim> [seed] [queries.npy] [count] [f32|f16]
//!     random unit rows (seeded); optionally `count` noisy copies of
//!     stored rows as queries
//! bench_scan build     <data.npy> <bank-dir> [f32|f16|int8] [rows-per-call] [none|batch|always]
//!                      bank from a matrix (one tree) through insert_batch
//!                      (default 10,000 rows a call, sync none); prints the
//!                      whole time and `insert_seconds` (inserts and a final
//!                      sync, not creation or the closing checkpoint)
//! bench_scan scan      <bank-dir> <queries.npy> [k] [threads] [rounds] [batch]
//! bench_scan bandwidth [gb] [rounds]          streaming sum over a hot heap buffer
//! bench_scan open      <bank-dir> [rounds]    read-only open time
//! bench_scan heap      <bank-dir> <queries.npy>   heap while scanning
//! bench_scan recover   <bank-dir> <rows>      writer open of a WAL of <rows> records
//! bench_scan size      <reference.json>...   bytes per node: JSON vs banks
//! bench_scan banks     <queries.npy> <rounds> <threads> <bank-dir[@threads]>...
//!     the banks' query() interleaved query by query (same machine
//!     conditions for each), medians and speed-ups over the first bank;
//!     `dir@2` scans that bank with 2 threads
//! bench_scan compare   <bank-dir> <queries.npy> [rounds] [gb]
//!     interleaved rounds of: streaming sum over a hot heap buffer, the raw
//!     kernel over the mapped vector files (no metadata, no top-k), and
//!     the bank's query(); medians of each, so their ratios are measured
//!     under the same machine conditions
//! ```
//!
//! Heap is measured two ways: a counting global allocator (peak live heap
//! bytes since the mark) and RssAnon from /proc/self/status (resident
//! anonymous memory: heap, stacks; mapped bank files count as RssFile).

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use deltamem::format::manifest::Precision;
use deltamem::interop::npy::NpyRowReader;
use deltamem::{Attach, Bank, BankConfig, Label, NewNode, OpenOptions, Payload, QueryOptions, SyncPolicy, TreeSpec};

struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static PEAK_BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK_BYTES.fetch_max(live, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> T {
    args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let cmd = args.get(1).map(String::as_str).unwrap_or("");
    match cmd {
        "build" => build(
            Path::new(&args[2]),
            Path::new(&args[3]),
            args.get(4).map_or("f32", |s| s),
            arg(&args, 5, 10_000usize),
            SyncPolicy::parse(args.get(6).map_or("none", |s| s)).expect("none, batch or always"),
        ),
        "gen" => generate(&args),
        "scan" => scan(Path::new(&args[2]), Path::new(&args[3]), &args),
        "bandwidth" => bandwidth(arg(&args, 2, 2.0), arg(&args, 3, 9)),
        "open" => open_time(Path::new(&args[2]), arg(&args, 3, 21)),
        "heap" => heap(Path::new(&args[2]), Path::new(&args[3])),
        "recover" => recover(Path::new(&args[2]), arg(&args, 3, 100_000)),
        "size" => size(&args[2..]),
        "banks" => banks(Path::new(&args[2]), arg(&args, 3, 5), arg(&args, 4, 1), &args[5..]),
        "rawq" => raw_int8(Path::new(&args[2]), Path::new(&args[3]), arg(&args, 4, 5)),
        "compare" => compare(
            Path::new(&args[2]),
            Path::new(&args[3]),
            arg(&args, 4, 7),
            arg(&args, 5, 2.0),
        ),
        _ => {
            eprintln!("usage: bench_scan build|scan|bandwidth|open|heap|recover ... (see the source)");
            std::process::exit(2);
        }
    }
}

/// A unit vector of `dim` components from `rng` (uniform in [-1, 1), then
/// normalised).
fn unit_row(rng: &mut deltamem::storage::sim::Rng, dim: usize, out: &mut Vec<f32>) {
    out.clear();
    out.extend((0..dim).map(|_| rng.next_f32() * 2.0 - 1.0));
    let norm = out.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
    out.iter_mut().for_each(|x| *x /= norm);
}

fn generate(args: &[String]) {
    use deltamem::interop::npy::{NpyElement, NpyMatrixWriter};
    let (rows, dim, seed) = (
        arg(args, 3, 1_000_000u64),
        arg(args, 4, 768usize),
        arg(args, 5, 20240607u64),
    );
    // args[8] = "f16" writes the data matrix as float16 (half the bytes:
    // the 10M-row run of tools/bench-million.sh imports it into an f16 bank).
    let element = match args.get(8).map(String::as_str) {
        Some("f16") => NpyElement::F16,
        _ => NpyElement::F32,
    };
    let mut rng = deltamem::storage::sim::Rng(seed);
    let mut writer = NpyMatrixWriter::create(Path::new(&args[2]), rows, dim, element).unwrap();
    let mut row = Vec::with_capacity(dim);
    let mut kept = Vec::new();
    let count = arg(args, 7, 16usize);
    for i in 0..rows {
        unit_row(&mut rng, dim, &mut row);
        writer.write_row(&row).unwrap();
        if (i as usize) < count {
            kept.push(row.clone());
        }
    }
    writer.finish().unwrap();
    if let Some(path) = args.get(6) {
        let mut writer = NpyMatrixWriter::create(Path::new(path), kept.len() as u64, dim, NpyElement::F32).unwrap();
        for stored in &kept {
            // A noisy copy: the stored row plus a small random direction.
            unit_row(&mut rng, dim, &mut row);
            let noisy: Vec<f32> = stored.iter().zip(&row).map(|(a, b)| a + 0.1 * b).collect();
            writer.write_row(&noisy).unwrap();
        }
        writer.finish().unwrap();
    }
}

fn read_matrix(path: &Path) -> (usize, Vec<f32>) {
    let mut reader = NpyRowReader::open(path).unwrap();
    let dim = reader.info().dim_count;
    let mut out = Vec::new();
    while reader.read_rows(65_536, &mut out).unwrap() > 0 {}
    (dim, out)
}

fn node(i: usize, embedding: Vec<f32>) -> NewNode {
    NewNode {
        tree: "all".into(),
        attach: Attach::Root,
        label: if i.is_multiple_of(7) {
            Label::Failure
        } else {
            Label::Success
        },
        payload: Payload {
            scenario: format!("scenario {i}"),
            fields: BTreeMap::from([("execution_procedure".to_string(), format!("step one for {i}; check"))]),
        },
        embedding,
        external_id: None,
    }
}

/// A one-tree bank of every row of the matrix (eps 0, so scores are the
/// plain inner products the peers compute).
fn build(npy: &Path, dir: &Path, precision: &str, per_call: usize, sync: SyncPolicy) {
    let started = Instant::now();
    let mut reader = NpyRowReader::open(npy).unwrap();
    let dim = reader.info().dim_count;
    let mut config = BankConfig::new(dim as u32);
    config.trees = vec![TreeSpec {
        name: "all".into(),
        tau: -1.0,
    }];
    config.eps = 0.0;
    config.precision = Precision::parse(precision).expect("f32, f16 or int8");
    Bank::create_dir(dir, config).unwrap().close().unwrap();
    let options = OpenOptions {
        sync,
        checkpoint_wal_bytes: 512 << 20,
        ..OpenOptions::default()
    };
    let mut bank = Bank::open_dir(dir, options).unwrap();
    let mut rows = Vec::new();
    let mut done = 0;
    let inserting = Instant::now();
    loop {
        rows.clear();
        let n = reader.read_rows(per_call, &mut rows).unwrap();
        if n == 0 {
            break;
        }
        let nodes: Vec<NewNode> = rows
            .chunks_exact(dim)
            .enumerate()
            .map(|(i, r)| node(done + i, r.to_vec()))
            .collect();
        bank.insert_batch(&nodes, None).unwrap();
        done += n;
    }
    bank.sync().unwrap();
    let insert_seconds = inserting.elapsed().as_secs_f64();
    bank.close().unwrap();
    println!(
        "{{\"cmd\":\"build\",\"rows\":{done},\"precision\":\"{precision}\",\"seconds\":{:.2},\"insert_seconds\":{insert_seconds:.3}}}",
        started.elapsed().as_secs_f64()
    );
}

fn open_read_only(dir: &Path) -> Bank {
    Bank::open_dir(
        dir,
        OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        },
    )
    .unwrap()
}

/// Times `rounds` passes over the queries, one query at a time (or
/// `batch` at a time through `query_batch`); reports the median ms per
/// query over all passes and each query's top-10 ids.
fn scan(dir: &Path, queries: &Path, args: &[String]) {
    let (k, threads, rounds, batch) = (arg(args, 4, 10), arg(args, 5, 1), arg(args, 6, 3), arg(args, 7, 0usize));
    let (dim, flat) = read_matrix(queries);
    let queries: Vec<Vec<f32>> = flat.chunks_exact(dim).map(<[f32]>::to_vec).collect();
    let mut bank = open_read_only(dir);
    bank.set_query_threads(threads);
    let opts = QueryOptions {
        k,
        tau: Some(-1.0),
        ..QueryOptions::default()
    };
    let warm = Instant::now();
    bank.query("all", &queries[0], &opts).unwrap(); // maps and checks every segment
    let warm_ms = warm.elapsed().as_secs_f64() * 1e3;
    let mut per_query_ms = Vec::new();
    let mut ids = Vec::new();
    for round in 0..rounds {
        if batch > 0 {
            for block in queries.chunks(batch) {
                let t = Instant::now();
                let found = bank.query_batch("all", block, &opts).unwrap();
                per_query_ms.push(t.elapsed().as_secs_f64() * 1e3 / block.len() as f64);
                if round == 0 {
                    ids.extend(found.iter().map(|m| m.iter().map(|x| x.id).collect::<Vec<_>>()));
                }
            }
        } else {
            for q in &queries {
                let t = Instant::now();
                let found = bank.query("all", q, &opts).unwrap();
                per_query_ms.push(t.elapsed().as_secs_f64() * 1e3);
                if round == 0 {
                    ids.push(found.iter().map(|m| m.id).collect::<Vec<_>>());
                }
            }
        }
    }
    let stats = bank.stats().unwrap();
    let (precision, dim) = (stats.precision, stats.dim_count);
    // The column a scan streams: the int8 side column in an int8 bank.
    let row_bytes = precision
        .qvector_stride_bytes(dim)
        .unwrap_or(precision.vector_stride_bytes(dim));
    println!(
        "{{\"cmd\":\"scan\",\"rows\":{},\"precision\":\"{}\",\"kernel\":\"{}\",\"threads\":{threads},\"batch\":{batch},\
         \"first_query_ms\":{warm_ms:.1},\"median_ms\":{:.3},\"column_bytes\":{},\"ids\":{:?}}}",
        stats.nodes,
        precision.as_str(),
        deltamem::bank::kernels::Level::active().name(),
        median(per_query_ms),
        stats.nodes * u64::from(row_bytes),
        ids
    );
}

/// Single-core read bandwidth: a 4-accumulator streaming f32 sum over a
/// hot buffer, the same loop shape as the scan without the multiply.
fn bandwidth(gb: f64, rounds: usize) {
    let hot = hot_buffer(gb + 0.003);
    let buf = aligned(&hot);
    let floats = buf.len();
    let mut gbps = Vec::new();
    let mut sink = 0.0f32;
    for _ in 0..rounds {
        let t = Instant::now();
        sink += stream_sum(buf);
        gbps.push(floats as f64 * 4.0 / t.elapsed().as_secs_f64() / 1e9);
    }
    let best = gbps.iter().cloned().fold(0.0, f64::max);
    println!(
        "{{\"cmd\":\"bandwidth\",\"gb\":{gb},\"median_gbps\":{:.2},\"best_gbps\":{best:.2},\"sink\":{sink}}}",
        median(gbps.clone())
    );
}

/// A filled anonymous buffer of `gb` GB, backed by transparent huge pages
/// where the kernel allows (fewer TLB misses: the fastest streaming read
/// this machine offers, so the scan is measured against the best case).
fn hot_buffer(gb: f64) -> memmap2::MmapMut {
    let bytes = ((gb * 1e9) as usize).next_multiple_of(1 << 21);
    let mut map = memmap2::MmapMut::map_anon(bytes).unwrap();
    #[cfg(target_os = "linux")]
    map.advise(memmap2::Advice::HugePage).ok();
    for (i, x) in map.chunks_exact_mut(4).enumerate() {
        x.copy_from_slice(&((i % 1000) as f32).to_le_bytes());
    }
    map
}

/// The 2 MiB-aligned part of a hot buffer (huge pages need the alignment).
fn aligned(map: &memmap2::MmapMut) -> &[f32] {
    let skip = map.as_ptr().align_offset(1 << 21).min(map.len());
    let usable = (map.len() - skip) / 4 * 4;
    bytemuck::cast_slice(&map[skip..skip + usable])
}

/// Sums a buffer with four independent vector accumulators: a pure
/// streaming read at the widest SIMD this CPU has.
fn stream_sum(buf: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { stream_sum_avx512(buf) };
        }
    }
    let mut acc = [0.0f32; 16];
    for c in buf.chunks_exact(16) {
        acc.iter_mut().zip(c).for_each(|(a, x)| *a += x);
    }
    acc.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn stream_sum_avx512(buf: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_ps(); 4];
    for c in buf.chunks_exact(64) {
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: c holds 64 floats, so j * 16 + 16 <= 64 are in bounds.
            *a = _mm512_add_ps(*a, unsafe { _mm512_loadu_ps(c.as_ptr().add(16 * j)) });
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(
        _mm512_add_ps(acc[0], acc[1]),
        _mm512_add_ps(acc[2], acc[3]),
    ))
}

fn open_time(dir: &Path, rounds: usize) {
    let mut ms = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        let bank = open_read_only(dir);
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box(bank.node_count());
    }
    println!("{{\"cmd\":\"open\",\"median_ms\":{:.3}}}", median(ms));
}

fn rss_anon_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn heap(dir: &Path, queries: &Path) {
    let (dim, flat) = read_matrix(queries);
    let queries: Vec<Vec<f32>> = flat.chunks_exact(dim).map(<[f32]>::to_vec).collect();
    drop(flat);
    let before_live = LIVE_BYTES.load(Ordering::Relaxed);
    let before_rss = rss_anon_kb();
    PEAK_BYTES.store(before_live, Ordering::Relaxed);
    let bank = open_read_only(dir);
    let opts = QueryOptions {
        k: 10,
        tau: Some(-1.0),
        ..QueryOptions::default()
    };
    for q in &queries {
        std::hint::black_box(bank.query("all", q, &opts).unwrap());
    }
    println!(
        "{{\"cmd\":\"heap\",\"peak_heap_bytes\":{},\"rss_anon_kb_before\":{before_rss},\"rss_anon_kb_after\":{}}}",
        PEAK_BYTES.load(Ordering::Relaxed) - before_live,
        rss_anon_kb()
    );
}

/// Appends `rows` single-node records to a new bank without
/// checkpointing (once), then times a writer open: reading and checking the
/// WAL and replaying every record into the overlay.
fn recover(dir: &Path, rows: usize) {
    if !dir.join("MANIFEST").exists() {
        Bank::create_dir(dir, BankConfig::new(768)).unwrap().close().unwrap();
        let options = OpenOptions {
            sync: SyncPolicy::None,
            checkpoint_wal_bytes: u64::MAX,
            ..OpenOptions::default()
        };
        let mut bank = Bank::open_dir(dir, options).unwrap();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for i in 0..rows {
            let e: Vec<f32> = (0..768)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x >> 40) as f32 - 8e6
                })
                .collect();
            let mut n = node(i, e);
            n.tree = "task".into();
            bank.insert(n).unwrap();
        }
        bank.sync().unwrap();
        drop(bank); // no close: the records stay un-checkpointed
    }
    let mut ms = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let options = OpenOptions {
            checkpoint_wal_bytes: u64::MAX,
            ..OpenOptions::default()
        };
        let bank = Bank::open_dir(dir, options).unwrap(); // the writer's recovery
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(bank.node_count() as usize, rows);
        assert_eq!(bank.stats().unwrap().checkpointed_nodes, 0);
    }
    println!(
        "{{\"cmd\":\"recover\",\"records\":{rows},\"median_ms\":{:.1}}}",
        median(ms)
    );
}

/// The f32 column scanned by the kernel alone: every row of every mapped
/// vector segment, no filters, no top-k (the best score is kept only so
/// the work is not optimised away).
fn raw_scan(
    level: deltamem::bank::kernels::Level,
    maps: &[memmap2::Mmap],
    rows: usize,
    rows_per_segment: usize,
    dim: usize,
    q: &[f32],
) -> f32 {
    use deltamem::bank::kernels::{self, Rows};
    let slots: Vec<u32> = (0..256).collect();
    let mut scores = vec![0.0f32; 256];
    let mut best = f32::MIN;
    for (s, map) in maps.iter().enumerate() {
        let here = rows.saturating_sub(s * rows_per_segment).min(rows_per_segment);
        let mut at = 0;
        while at < here {
            let n = (here - at).min(256);
            let rows = Rows {
                bytes: &map[at * dim * 4..],
                stride_bytes: dim * 4,
                offset_bytes: 0,
                slots: &slots[..n],
            };
            kernels::score_f32(level, &[q], dim, rows, &mut scores);
            best = scores[..n].iter().fold(best, |b, &x| b.max(x));
            at += n;
        }
    }
    best
}

fn compare(dir: &Path, queries: &Path, rounds: usize, gb: f64) {
    let (dim, flat) = read_matrix(queries);
    let queries: Vec<Vec<f32>> = flat.chunks_exact(dim).map(<[f32]>::to_vec).collect();
    let bank = open_read_only(dir);
    let m = bank.manifest().clone();
    assert_eq!(m.precision, Precision::F32, "compare runs on an f32 bank");
    let rows = m.node_count as usize;
    let maps: Vec<memmap2::Mmap> = (0..rows.div_ceil(m.rows_per_segment as usize))
        .map(|s| {
            let f = std::fs::File::open(dir.join(format!("vectors-{s:06}.seg"))).unwrap();
            // SAFETY: the bank's segment files are fixed-size and nothing
            // writes this read-only bank while the benchmark runs.
            unsafe { memmap2::Mmap::map(&f).unwrap() }
        })
        .collect();
    let opts = QueryOptions {
        k: 10,
        tau: Some(-1.0),
        ..QueryOptions::default()
    };
    bank.query("all", &queries[0], &opts).unwrap();
    let hot = hot_buffer(gb + 0.003);
    let buf = aligned(&hot);
    let (mut bw, mut raw, mut full) = (Vec::new(), Vec::new(), Vec::new());
    let levels = deltamem::bank::kernels::Level::all_supported();
    let mut by_level = vec![Vec::new(); levels.len()];
    let column_bytes = (rows * dim * 4) as f64;
    for _ in 0..rounds {
        let t = Instant::now();
        std::hint::black_box(stream_sum(buf));
        bw.push(buf.len() as f64 * 4.0 / t.elapsed().as_secs_f64() / 1e9);
        for q in &queries {
            for (l, &level) in levels.iter().enumerate() {
                let t = Instant::now();
                std::hint::black_box(raw_scan(level, &maps, rows, m.rows_per_segment as usize, dim, q));
                by_level[l].push(t.elapsed().as_secs_f64() * 1e3);
            }
            let t = Instant::now();
            let active = deltamem::bank::kernels::Level::active();
            std::hint::black_box(raw_scan(active, &maps, rows, m.rows_per_segment as usize, dim, q));
            raw.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            std::hint::black_box(bank.query("all", q, &opts).unwrap());
            full.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    for (l, level) in levels.iter().enumerate() {
        let med = median(by_level[l].clone());
        println!(
            "{{\"cmd\":\"compare\",\"raw_level\":\"{}\",\"median_ms\":{med:.2},\"gbps\":{:.1}}}",
            level.name(),
            column_bytes / med / 1e6
        );
    }
    let (bw, raw, full) = (median(bw), median(raw), median(full));
    println!(
        "{{\"cmd\":\"compare\",\"rows\":{rows},\"kernel\":\"{}\",\"bandwidth_gbps\":{bw:.2},\"raw_kernel_ms\":{raw:.2},\
         \"query_ms\":{full:.2},\"raw_pct_of_bandwidth\":{:.1},\"query_pct_of_bandwidth\":{:.1},\"query_vs_raw\":{:.3}}}",
        deltamem::bank::kernels::Level::active().name(),
        100.0 * column_bytes / raw / 1e6 / bw,
        100.0 * column_bytes / full / 1e6 / bw,
        full / raw
    );
}

fn banks(queries: &Path, rounds: usize, threads: usize, dirs: &[String]) {
    let (dim, flat) = read_matrix(queries);
    let queries: Vec<Vec<f32>> = flat.chunks_exact(dim).map(<[f32]>::to_vec).collect();
    let opts = QueryOptions {
        k: 10,
        tau: Some(-1.0),
        ..QueryOptions::default()
    };
    let banks: Vec<Bank> = dirs
        .iter()
        .map(|spec| {
            let (d, t) = spec
                .split_once('@')
                .map_or((spec.as_str(), threads), |(d, t)| (d, t.parse().unwrap()));
            let mut b = open_read_only(Path::new(d));
            b.set_query_threads(t);
            b.query("all", &queries[0], &opts).unwrap();
            b
        })
        .collect();
    let mut ms = vec![Vec::new(); banks.len()];
    let mut ids = vec![Vec::new(); banks.len()];
    for round in 0..rounds {
        for q in &queries {
            for (i, bank) in banks.iter().enumerate() {
                let t = Instant::now();
                let found = bank.query("all", q, &opts).unwrap();
                ms[i].push(t.elapsed().as_secs_f64() * 1e3);
                if round == 0 {
                    ids[i].push(found.iter().map(|m| m.id).collect::<Vec<_>>());
                }
            }
        }
    }
    let first = median(ms[0].clone());
    for (i, bank) in banks.iter().enumerate() {
        let same = ids[i].iter().zip(&ids[0]).filter(|(a, b)| a == b).count();
        let med = median(ms[i].clone());
        println!(
            "{{\"cmd\":\"banks\",\"bank\":{:?},\"precision\":\"{}\",\"threads\":{},\"median_ms\":{med:.3},\
             \"speedup_vs_first\":{:.3},\"top10_equal_to_first\":\"{same}/{}\"}}",
            dirs[i],
            bank.precision().as_str(),
            bank.query_threads(),
            first / med,
            queries.len()
        );
    }
}

/// The int8 kernels alone over the mapped side column, every level and
/// instruction path this CPU has, interleaved query by query.
fn raw_int8(dir: &Path, queries: &Path, rounds: usize) {
    use deltamem::bank::kernels::quant::QueryInt8;
    use deltamem::bank::kernels::{self, Int8Path, Level, Rows};
    let (dim, flat) = read_matrix(queries);
    let bank = open_read_only(dir);
    let m = bank.manifest().clone();
    let rows = m.node_count as usize;
    let rps = m.rows_per_segment as usize;
    let qstride = m.precision.qvector_stride_bytes(m.dim_count).expect("an int8 bank") as usize;
    let maps: Vec<memmap2::Mmap> = (0..rows.div_ceil(rps))
        .map(|s| {
            let f = std::fs::File::open(dir.join(format!("qvectors-{s:06}.seg"))).unwrap();
            // SAFETY: fixed-size files of a bank nobody writes meanwhile.
            unsafe { memmap2::Mmap::map(&f).unwrap() }
        })
        .collect();
    let mut combos = Vec::new();
    for level in Level::all_supported() {
        for path in [Int8Path::MultiplyAdd, Int8Path::Vnni256, Int8Path::Vnni512] {
            if path.runs_at(level) {
                combos.push((level, path));
            }
        }
    }
    let slots: Vec<u32> = (0..256).collect();
    let mut dots = vec![0i32; 256];
    let mut ms = vec![Vec::new(); combos.len()];
    for _ in 0..rounds {
        for q in flat.chunks_exact(dim) {
            let qi = QueryInt8::new(q, 0.0);
            for (c, &(level, path)) in combos.iter().enumerate() {
                let t = Instant::now();
                let mut best = i32::MIN;
                for (s, map) in maps.iter().enumerate() {
                    let here = rows.saturating_sub(s * rps).min(rps);
                    let mut at = 0;
                    while at < here {
                        let n = (here - at).min(256);
                        let set = Rows {
                            bytes: &map[at * qstride..],
                            stride_bytes: qstride,
                            offset_bytes: 0,
                            slots: &slots[..n],
                        };
                        kernels::score_i8_path(level, path, &[&qi.codes], set, &mut dots);
                        best = dots[..n].iter().fold(best, |b, &x| b.max(x));
                        at += n;
                    }
                }
                std::hint::black_box(best);
                ms[c].push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    for (c, (level, path)) in combos.iter().enumerate() {
        let med = median(ms[c].clone());
        println!(
            "{{\"cmd\":\"rawq\",\"level\":\"{}\",\"path\":\"{path:?}\",\"median_ms\":{med:.3},\"gbps\":{:.1}}}",
            level.name(),
            (rows * qstride) as f64 / med / 1e6
        );
    }
}

/// Bytes per node of reference JSON trees against banks holding the same
/// nodes at each precision: the data files' logical bytes (node rows,
/// vector column, int8 side column, payload log; the unused tail of a
/// fixed-size segment is not counted: it is sparse on disk and filled by
/// later inserts).
fn size(files: &[String]) {
    use deltamem::interop::reference::{ImportOptions, import_tree, read_reference};
    let trees: Vec<_> = files.iter().map(|f| read_reference(Path::new(f)).unwrap()).collect();
    let json_bytes: u64 = files.iter().map(|f| std::fs::metadata(f).unwrap().len()).sum();
    let nodes: usize = trees.iter().map(|t| t.nodes.len()).sum();
    let dim = trees
        .iter()
        .flat_map(|t| t.nodes.first())
        .map(|n| n.embedding.len())
        .next()
        .unwrap();
    println!(
        "{{\"cmd\":\"size\",\"what\":\"reference json\",\"nodes\":{nodes},\"bytes_per_node\":{}}}",
        json_bytes / nodes as u64
    );
    for precision in [Precision::F32, Precision::F16, Precision::Int8] {
        let dir = tempfile::tempdir().unwrap();
        let mut config = BankConfig::new(dim as u32);
        config.precision = precision;
        let mut bank = Bank::create_dir(dir.path(), config).unwrap();
        for (tree, name) in trees.iter().zip(["task", "env"].iter().cycle()) {
            let name = tree
                .tree_name
                .clone()
                .filter(|n| n == "task" || n == "env")
                .unwrap_or(name.to_string());
            import_tree(
                &mut bank,
                &name,
                tree.clone(),
                &ImportOptions::default(),
                &mut |_, _| {},
            )
            .unwrap();
        }
        bank.checkpoint().unwrap();
        let s = bank.stats().unwrap();
        let total = s.vector_bytes + s.table_bytes + s.payload_bytes;
        println!(
            "{{\"cmd\":\"size\",\"what\":\"bank {}\",\"nodes\":{},\"bytes_per_node\":{},\"vector\":{},\"row\":{},\
             \"payload\":{},\"fraction_of_json\":{:.4}}}",
            precision.as_str(),
            s.nodes,
            total / s.nodes,
            s.vector_bytes / s.nodes,
            s.table_bytes / s.nodes,
            s.payload_bytes / s.nodes,
            total as f64 / json_bytes as f64
        );
    }
}

//! Opening a bank reads the same bytes whatever its node count: the
//! manifest and the WAL and nothing else; payloads are read on first use.
//! A writer's open maps nothing (segments are mapped on first use); a
//! reader's open maps each segment file of its generation once, without
//! reading it, so that the writer's `compact` cannot delete them from
//! under it. Proved by counting, through `CountingStorage`, the bytes read
//! and the files mapped while opening a 1,000-node and a 100,000-node bank.
//!
//! Timings and sizes are printed (`--nocapture`), never asserted.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use deltamem::storage::{CountingStorage, FileStorage, IoCounts, Storage};
use deltamem::{
    Attach, Bank, BankConfig, Label, NewNode, NodeRef, OpenOptions, Payload, QueryOptions, SyncPolicy, VerifyScope,
};

const DIM: usize = 64;

/// splitmix64: a tiny seeded PRNG, enough for test vectors.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn unit_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// A random direction, L2-normalised.
    fn vector(&mut self) -> Vec<f32> {
        loop {
            let v: Vec<f32> = (0..DIM).map(|_| self.unit_f32()).collect();
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            if norm > 1e-3 {
                return v.iter().map(|x| x / norm).collect();
            }
        }
    }
}

/// Builds a bank of `count` nodes in `dir` through the public API and
/// closes it (close checkpoints, leaving an empty WAL).
fn build(dir: &Path, count: u32) {
    build_with(dir, count, BankConfig::new(DIM as u32));
}

fn build_with(dir: &Path, count: u32, config: BankConfig) {
    let started = Instant::now();
    let mut bank = Bank::create_dir(dir, config).unwrap();
    bank.set_sync_policy(SyncPolicy::None);
    let mut rng = Rng(0x5eed ^ u64::from(count));
    let mut last_root = [0u32; 2];
    for i in 0..count {
        let tree = (i % 2) as usize;
        // Mostly roots; every third node a residual under its tree's last
        // root (explicit parents: no O(N) scan per insert).
        let attach = if i >= 2 && i % 3 == 0 {
            Attach::Parent(NodeRef::Index(last_root[tree]))
        } else {
            Attach::Root
        };
        let mut fields = BTreeMap::new();
        fields.insert("execution_procedure".to_string(), format!("step {i}"));
        let ack = bank
            .insert(NewNode {
                tree: ["task", "env"][tree].into(),
                attach,
                label: if i % 5 == 0 { Label::Failure } else { Label::Success },
                payload: Payload {
                    scenario: format!("scenario {i}"),
                    fields,
                },
                embedding: rng.vector(),
                external_id: None,
            })
            .unwrap();
        if ack.parent.is_none() {
            last_root[tree] = ack.id;
        }
    }
    let inserted = started.elapsed();
    bank.close().unwrap();
    eprintln!(
        "build {count} nodes: inserts {:.2?} ({:.1} us/node), close (checkpoint) {:.2?}",
        inserted,
        inserted.as_secs_f64() * 1e6 / f64::from(count),
        started.elapsed() - inserted
    );
}

/// Sum of file sizes: logical (metadata len; segments are sparse) and
/// allocated (blocks * 512).
fn disk_usage(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut logical = 0;
    let mut allocated = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let meta = entry.unwrap().metadata().unwrap();
        if meta.is_file() {
            logical += meta.len();
            allocated += meta.blocks() * 512;
        }
    }
    (logical, allocated)
}

fn is_data_file(name: &str) -> bool {
    name.starts_with("vectors-") || name.starts_with("nodes-") || name == "payloads.log"
}

/// Asserts that no data byte was read, and that data files were mapped
/// only where `may_map` (a reader's open, each file once).
fn assert_open_touches_no_data(counts: &IoCounts, what: &str, may_map: bool) {
    for (name, bytes) in &counts.read_bytes {
        assert!(
            !is_data_file(name) || *bytes == 0,
            "{what}: open read {bytes} bytes of {name}"
        );
    }
    for (name, maps) in &counts.maps {
        let most = if may_map { 1 } else { 0 };
        assert!(
            !is_data_file(name) || *maps <= most,
            "{what}: open mapped {name} {maps} times"
        );
    }
    let total: u64 = counts.read_bytes.values().sum();
    assert!(total < 4096, "{what}: open read {total} bytes: {counts:?}");
}

struct Measured {
    writer: IoCounts,
    /// What the reader's open read (its maps grow with the segments).
    reader_read_bytes: BTreeMap<String, u64>,
}

/// Opens the bank at `dir` as writer, then as reader, each through a
/// counting storage, and checks what the opens touched. Then runs a query
/// through the reader and checks the counting does see the segments.
fn measure(dir: &Path, count: u32) -> Measured {
    let counting = Arc::new(CountingStorage::new(FileStorage::new(dir)));
    let storage: Arc<dyn Storage> = counting.clone();
    let started = Instant::now();
    let writer = Bank::open(storage.clone(), OpenOptions::default()).unwrap();
    let writer_time = started.elapsed();
    let writer_counts = counting.counts();
    assert_eq!(writer.node_count(), count);
    assert_open_touches_no_data(&writer_counts, &format!("writer open of {count} nodes"), false);
    drop(writer);

    counting.reset();
    let started = Instant::now();
    let reader = Bank::open(
        storage,
        OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        },
    )
    .unwrap();
    let reader_time = started.elapsed();
    let reader_counts = counting.counts();
    assert_eq!(reader.node_count(), count);
    assert_open_touches_no_data(&reader_counts, &format!("reader open of {count} nodes"), true);

    // The reader's open mapped every vector and node-table segment once,
    // and queries map none again; a payload read reads the payload log.
    let mut rng = Rng(7);
    let started = Instant::now();
    let mut matches = Vec::new();
    for _ in 0..3 {
        matches = reader
            .query(
                "task",
                &rng.vector(),
                &QueryOptions {
                    k: 5,
                    tau: Some(-1.0),
                    ..QueryOptions::default()
                },
            )
            .unwrap();
    }
    let query_time = started.elapsed() / 3;
    assert_eq!(matches.len(), 5);
    reader.payload(matches[0].id).unwrap();
    let after = counting.counts();
    let segments = count.div_ceil(reader.manifest().rows_per_segment);
    for s in 0..segments {
        for name in [format!("vectors-{s:06}.seg"), format!("nodes-{s:06}.seg")] {
            assert_eq!(
                after.maps.get(&name).copied(),
                Some(1),
                "{name} must be mapped exactly once, at open: {after:?}"
            );
        }
    }
    assert!(
        after.read_bytes.get("payloads.log").copied().unwrap_or(0) > 0,
        "reading a payload must read payloads.log: {after:?}"
    );

    let (logical, allocated) = disk_usage(dir);
    eprintln!(
        "{count} nodes: open writer {writer_time:.2?}, open reader {reader_time:.2?}, \
         query mean of 3 (the first maps the segments) {query_time:.2?}; on disk {logical} bytes logical \
         ({:.0} B/node), {allocated} bytes allocated ({:.0} B/node); open read {:?}",
        logical as f64 / f64::from(count),
        allocated as f64 / f64::from(count),
        writer_counts.read_bytes
    );
    Measured {
        writer: writer_counts,
        reader_read_bytes: reader_counts.read_bytes,
    }
}

#[test]
fn open_cost_does_not_depend_on_node_count() {
    let small_dir = tempfile::tempdir().unwrap();
    let large_dir = tempfile::tempdir().unwrap();
    build(small_dir.path(), 1_000);
    build(large_dir.path(), 100_000);
    let small = measure(small_dir.path(), 1_000);
    let large = measure(large_dir.path(), 100_000);
    assert_eq!(
        small.writer, large.writer,
        "writer open touched different bytes for 1k and 100k nodes"
    );
    assert_eq!(
        small.reader_read_bytes, large.reader_read_bytes,
        "reader open read different bytes for 1k and 100k nodes"
    );
}

/// A bank of 3,000 nodes in three segments of 1,024 rows, behind a
/// storage that counts what is mapped and read.
fn three_segments_counted() -> (tempfile::TempDir, Arc<CountingStorage<FileStorage>>) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = BankConfig::new(DIM as u32);
    config.rows_per_segment = Some(1024);
    build_with(dir.path(), 3_000, config);
    let counting = Arc::new(CountingStorage::new(FileStorage::new(dir.path())));
    (dir, counting)
}

/// `stats` reports on rows only, so it reads the node table and nothing
/// else: for a writer, every node-table segment mapped once and no vector
/// file mapped (a reader mapped all of them at open, and maps none again);
/// no payload byte read. (Before, mapping a segment for a row read checked
/// its vectors too, so `stats` on a cold cache read the whole column.)
#[test]
fn stats_reads_only_the_node_table() {
    let (_dir, counting) = three_segments_counted();
    for read_only in [true, false] {
        let options = OpenOptions {
            read_only,
            ..OpenOptions::default()
        };
        let bank = Bank::open(counting.clone(), options).unwrap();
        counting.reset();
        let stats = bank.stats().unwrap();
        assert_eq!(stats.nodes, 3_000);
        let counts = counting.counts();
        let mapped: Vec<&String> = counts.maps.keys().collect();
        let tables = ["nodes-000000.seg", "nodes-000001.seg", "nodes-000002.seg"];
        let want: &[&str] = if read_only { &[] } else { &tables };
        assert_eq!(
            mapped,
            want.iter().collect::<Vec<_>>(),
            "stats (read_only {read_only}) mapped: {counts:?}"
        );
        assert!(counts.maps.values().all(|&n| n == 1), "{counts:?}");
        let data_read: u64 = counts
            .read_bytes
            .iter()
            .filter(|(name, _)| is_data_file(name))
            .map(|(_, bytes)| bytes)
            .sum();
        assert_eq!(data_read, 0, "stats read data files: {counts:?}");
    }
}

/// `freeze` checks its copy with `verify_scope(SkipVectorColumns)`: that
/// maps no vector file and reads every row and payload record, while the
/// full `verify` maps every vector segment. (Counted on a writer, which
/// maps on first use; a reader maps every file at open.)
#[test]
fn verify_without_the_vector_column_maps_no_vector_file() {
    let (_dir, counting) = three_segments_counted();
    let writer = OpenOptions::default();
    let vector_maps = |counts: &IoCounts| counts.maps.keys().filter(|n| n.starts_with("vectors-")).count();
    for (scope, want_vector_maps) in [(VerifyScope::SkipVectorColumns, 0), (VerifyScope::Everything, 3)] {
        let bank = Bank::open(counting.clone(), writer.clone()).unwrap();
        counting.reset();
        let report = bank.verify_scope(scope).unwrap();
        assert!(report.is_ok() && report.nodes_checked == 3_000, "{scope:?}: {report:?}");
        let counts = counting.counts();
        assert_eq!(vector_maps(&counts), want_vector_maps, "{scope:?}: {counts:?}");
        let tables = counts.maps.keys().filter(|n| n.starts_with("nodes-")).count();
        assert_eq!(tables, 3, "{scope:?}: {counts:?}");
        let payload_read = counts.read_bytes.get("payloads.log").copied().unwrap_or(0);
        assert!(payload_read > 0, "{scope:?} read no payload record: {counts:?}");
    }
}

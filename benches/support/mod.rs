//! Bank building and caching for the engine benchmarks.
//!
//! Banks of random unit vectors (dim 768, one tree "all" holding every
//! row, so a query scores the whole column as the peers do) are built once
//! with `insert_batch` and kept under `target/bench-banks/`, keyed by row
//! count and precision, so reruns do not rebuild them. A bank is complete
//! once its `READY` marker exists; delete the directory to reclaim space.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use deltamem::format::manifest::Precision;
use deltamem::{Attach, Bank, BankConfig, Label, NewNode, OpenOptions, Payload, SyncPolicy, TreeSpec};

pub const DIM: u32 = 768;

pub use deltamem::storage::sim::Rng;

/// A deterministic unit vector of `DIM` components.
pub fn vector(rng: &mut Rng) -> Vec<f32> {
    let v: Vec<f32> = (0..DIM).map(|_| rng.next_f32() - 0.5).collect();
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.into_iter().map(|x| x / n).collect()
}

pub fn node(rng: &mut Rng, i: usize, tree: &str) -> NewNode {
    let mut fields = BTreeMap::new();
    fields.insert(
        "execution_procedure".into(),
        format!("step one for {i}; step two; check the result"),
    );
    NewNode {
        tree: tree.into(),
        attach: Attach::Root,
        label: if i.is_multiple_of(7) {
            Label::Failure
        } else {
            Label::Success
        },
        payload: Payload {
            scenario: format!("scenario {i}"),
            fields,
        },
        embedding: vector(rng),
        external_id: None,
    }
}

pub fn cache_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target").join("bench-banks")
}

/// Queries: near-duplicates of stored rows (one clear best match, then
/// the crowd), from the same generator as the bank.
pub fn queries(count: usize) -> Vec<Vec<f32>> {
    let mut rng = Rng(0xDEC0_DE00 + count as u64);
    (0..count)
        .map(|_| {
            let base = vector(&mut rng);
            let noise = vector(&mut rng);
            base.iter().zip(&noise).map(|(b, n)| b + 0.5 * n).collect()
        })
        .collect()
}

/// The cached bank of `rows` rows at `precision`, built if missing.
pub fn bank_dir(rows: usize, precision: Precision) -> PathBuf {
    let dir = cache_dir().join(format!("scan-{rows}-{}", precision.as_str()));
    if dir.join("READY").exists() {
        return dir;
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir).unwrap(); // an interrupted build
    }
    eprintln!("building {} (once; cached)", dir.display());
    let mut config = BankConfig::new(DIM);
    config.trees = vec![TreeSpec {
        name: "all".into(),
        tau: -1.0,
    }];
    config.precision = precision;
    Bank::create_dir(&dir, config).unwrap().close().unwrap();
    let options = OpenOptions {
        sync: SyncPolicy::None,
        checkpoint_wal_bytes: 512 << 20,
        ..OpenOptions::default()
    };
    let mut bank = Bank::open_dir(&dir, options).unwrap();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut done = 0;
    while done < rows {
        let n = (rows - done).min(10_000);
        let nodes: Vec<NewNode> = (done..done + n).map(|i| node(&mut rng, i, "all")).collect();
        bank.insert_batch(&nodes, None).unwrap();
        done += n;
    }
    bank.close().unwrap();
    std::fs::write(dir.join("READY"), b"").unwrap();
    dir
}

pub fn open_read_only(dir: &Path) -> Bank {
    Bank::open_dir(
        dir,
        OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        },
    )
    .unwrap()
}

/// A bank whose WAL holds `records` un-checkpointed single-node records
/// (dim 768), built once.
pub fn recovery_dir(records: usize) -> PathBuf {
    let dir = cache_dir().join(format!("recovery-{records}"));
    if dir.join("READY").exists() {
        return dir;
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir).unwrap();
    }
    eprintln!("building {} (once; cached)", dir.display());
    Bank::create_dir(&dir, BankConfig::new(DIM)).unwrap().close().unwrap();
    let options = OpenOptions {
        sync: SyncPolicy::None,
        checkpoint_wal_bytes: u64::MAX,
        ..OpenOptions::default()
    };
    let mut bank = Bank::open_dir(&dir, options).unwrap();
    let mut rng = Rng(11);
    for i in 0..records {
        bank.insert(node(&mut rng, i, "task")).unwrap();
    }
    bank.sync().unwrap();
    drop(bank); // no close: the records stay in the WAL only
    std::fs::write(dir.join("READY"), b"").unwrap();
    dir
}

/// A cached `(rows, DIM)` f32 .npy of random unit vectors (for the
/// import benchmarks), written once through the library's writer.
pub fn npy_file(rows: usize) -> PathBuf {
    let path = cache_dir().join(format!("rows-{rows}x{DIM}.npy"));
    if path.exists() {
        return path;
    }
    std::fs::create_dir_all(cache_dir()).unwrap();
    let mut w = deltamem::interop::npy::NpyMatrixWriter::create(
        &path,
        rows as u64,
        DIM as usize,
        deltamem::interop::npy::NpyElement::F32,
    )
    .unwrap();
    let mut rng = Rng(0x1A_2B);
    for _ in 0..rows {
        w.write_row(&vector(&mut rng)).unwrap();
    }
    w.finish().unwrap();
    path
}

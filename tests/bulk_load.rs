//! `Bank::load` and `Bank::load_column`: the same nodes as a transaction
//! of the same changes, durable without the WAL, all or nothing, and only
//! for changes that add nodes. (Crash points of loads are in crash.rs.)

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::crashkit::as_column;
use common::snapshot::node_snapshot;
use deltamem::format::manifest::Precision;
use deltamem::storage::sim::Rng;
use deltamem::{
    Attach, Bank, BankConfig, BankError, Change, ChangeAck, ImportedState, Label, NewNode, NodeRef, OpenOptions,
    Payload,
};

const DIM: usize = 12;

fn config(precision: Precision) -> BankConfig {
    let mut c = BankConfig::new(DIM as u32);
    c.rows_per_segment = Some(5); // loads that straddle segments
    c.precision = precision;
    c
}

/// Node `k` of a deterministic family: several directions so auto attach
/// finds parents, some failures, explicit parents, an external id.
fn node(k: usize) -> NewNode {
    let embedding = (0..DIM)
        .map(|i| {
            if i == k % 4 {
                3.0
            } else {
                ((i * 7 + k * 13) % 11) as f32 * 0.05 - 0.2
            }
        })
        .collect();
    let attach = match k % 3 {
        0 => Attach::Root,
        1 => Attach::Auto,
        _ => Attach::Parent(NodeRef::Index((k / 2) as u32)),
    };
    let mut fields = BTreeMap::new();
    fields.insert("execution_procedure".to_string(), format!("steps of node {k}"));
    NewNode {
        tree: "task".into(),
        attach,
        label: if k % 5 == 4 { Label::Failure } else { Label::Success },
        payload: Payload {
            scenario: format!("scenario {k}"),
            fields,
        },
        embedding,
        external_id: k.is_multiple_of(4).then(|| format!("ext-{k}")),
    }
}

fn inserts(range: std::ops::Range<usize>) -> Vec<Change> {
    range.map(|k| Change::Insert(node(k))).collect()
}

fn wal_size_bytes(dir: &Path) -> u64 {
    std::fs::metadata(dir.join("wal.log")).unwrap().len()
}

#[test]
fn a_load_stores_what_a_transaction_stores_and_skips_the_wal() {
    for precision in [Precision::F32, Precision::F16, Precision::Int8] {
        let (a, b, c) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let mut logged = Bank::create_dir(a.path(), config(precision)).unwrap();
        let mut loaded = Bank::create_dir(b.path(), config(precision)).unwrap();
        let mut by_column = Bank::create_dir(c.path(), config(precision)).unwrap();
        // A WAL record before the load: the load's checkpoint takes it too.
        for bank in [&mut logged, &mut loaded, &mut by_column] {
            bank.transact(&inserts(0..3), None).unwrap();
        }
        let wal_before = wal_size_bytes(b.path());
        assert!(wal_before > 64, "the first transaction is in the WAL");

        let changes = inserts(3..23);
        let acks_logged = logged.transact(&changes, None).unwrap();
        let acks_loaded = loaded.load(&changes).unwrap();
        let (stripped, column) = as_column(&changes);
        let acks_column = by_column.load_column(&stripped, &column).unwrap();
        let ids = |acks: &[ChangeAck]| -> Vec<_> {
            acks.iter()
                .map(|a| match a {
                    ChangeAck::Inserted(a) => (a.id, a.parent, a.depth, a.node_type, a.matched),
                    other => panic!("{other:?}"),
                })
                .collect()
        };
        assert_eq!(ids(&acks_loaded), ids(&acks_logged), "{precision:?}");
        assert_eq!(ids(&acks_column), ids(&acks_logged), "{precision:?}");
        assert_eq!(node_snapshot(&loaded), node_snapshot(&logged), "{precision:?}");
        assert_eq!(node_snapshot(&by_column), node_snapshot(&logged), "{precision:?}");
        // Checkpointed, not logged: the WAL is a bare header again.
        assert_eq!(wal_size_bytes(b.path()), 64, "{precision:?}");
        assert_eq!(wal_size_bytes(c.path()), 64, "{precision:?}");
        assert!(loaded.durable_below_lsn() > acks_loaded.iter().map(lsn).max().unwrap());

        // Durable without close (the handle is just dropped) and intact.
        let expected = node_snapshot(&logged);
        drop((loaded, by_column));
        for dir in [b.path(), c.path()] {
            let reopened = Bank::open_dir(dir, OpenOptions::default()).unwrap();
            assert_eq!(node_snapshot(&reopened), expected, "{precision:?}");
            assert!(reopened.verify().unwrap().problems.is_empty(), "{precision:?}");
            assert_eq!(reopened.resolve(&NodeRef::External("ext-8".into())).unwrap(), 8);
        }
    }
}

fn lsn(ack: &ChangeAck) -> u64 {
    match ack {
        ChangeAck::Inserted(a) => a.lsn,
        ChangeAck::Hit(a) => a.lsn,
        ChangeAck::Retrieved { .. } => 0,
    }
}

#[test]
fn a_load_is_all_or_nothing_and_names_the_bad_item() {
    let dir = tempfile::tempdir().unwrap();
    let mut bank = Bank::create_dir(dir.path(), config(Precision::F32)).unwrap();
    bank.load(&inserts(0..4)).unwrap();
    let before = node_snapshot(&bank);

    let mut bad_vector = inserts(4..9);
    if let Change::Insert(n) = &mut bad_vector[3] {
        n.embedding[2] = f32::NAN;
    }
    let mut reused_id = inserts(4..9);
    if let Change::Insert(n) = &mut reused_id[2] {
        n.external_id = Some("ext-0".into());
    }
    let with_hit = [inserts(4..6), vec![Change::SuccessHit(1)]].concat();
    let with_retrievals = [vec![Change::Retrievals(vec![0, 1])], inserts(4..6)].concat();
    let cases: [(&[Change], usize, &str); 4] = [
        (&bad_vector, 3, "component 2 is NaN"),
        (&reused_id, 2, "already used by node 0"),
        (&with_hit, 2, "a success hit"),
        (&with_retrievals, 0, "a retrieval count"),
    ];
    for (changes, position, says) in cases {
        match bank.load(changes) {
            Err(BankError::BatchItem { position: p, error }) => {
                assert_eq!(p, position, "{error}");
                assert!(error.to_string().contains(says), "{error}");
            }
            other => panic!("expected a batch item error, got {other:?}"),
        }
        assert_eq!(node_snapshot(&bank), before, "a refused load left nothing behind");
    }
    // Still writable, and the ids of the refused loads are free again.
    bank.load(&inserts(4..9)).unwrap();
    assert_eq!(bank.node_count(), 9);
    drop(bank);
    let bank = Bank::open_dir(dir.path(), OpenOptions::default()).unwrap();
    assert_eq!(bank.node_count(), 9);
    assert_eq!(bank.resolve(&NodeRef::External("ext-8".into())).unwrap(), 8);
}

/// Batches loaded together: one checkpoint for all, each batch all or
/// nothing on its own (a bad one fails alone and frees its external ids),
/// the same nodes as loading the good batches one by one.
#[test]
fn batches_loaded_together_share_one_checkpoint_and_fail_alone() {
    use deltamem::storage::{
        CountingStorage, MANIFEST_FILE, MANIFEST_TMP_FILE, MemStorage, OpenMode, Storage, WAL_TMP_FILE,
    };
    use std::sync::Arc;
    let storage = Arc::new(CountingStorage::new(MemStorage::new()));
    let mut bank = Bank::create(storage.clone(), config(Precision::F32)).unwrap();
    let mut one_by_one = Bank::create(Arc::new(MemStorage::new()), config(Precision::F32)).unwrap();
    for b in [&mut bank, &mut one_by_one] {
        b.load(&inserts(0..4)).unwrap();
    }
    let mut bad = inserts(9..14);
    if let Change::Insert(n) = &mut bad[4] {
        n.embedding[1] = f32::NAN;
    }
    let batches = [as_column(&inserts(4..9)), as_column(&bad), as_column(&inserts(9..14))];
    let refs: Vec<(&[Change], &[f32])> = batches.iter().map(|(c, v)| (c.as_slice(), v.as_slice())).collect();
    storage.reset();
    let results = bank.load_columns(&refs).unwrap();
    // A checkpoint writes one manifest to MANIFEST.tmp. With no WAL
    // record to retire it keeps the WAL (no new header in wal.tmp).
    let manifest_bytes = storage
        .open(MANIFEST_FILE, OpenMode::Read)
        .unwrap()
        .len_bytes()
        .unwrap();
    let written = storage.counts().written_bytes;
    assert_eq!(written.get(MANIFEST_TMP_FILE), Some(&manifest_bytes), "one checkpoint");
    assert_eq!(written.get(WAL_TMP_FILE), None, "the WAL stays");
    assert!(
        matches!(&results[1], Err(BankError::BatchItem { position: 4, .. })),
        "{:?}",
        results[1]
    );
    for (k, range) in [(0, 4..9), (2, 9..14)] {
        let ids: Vec<u32> = results[k]
            .as_ref()
            .unwrap()
            .iter()
            .map(|a| match a {
                ChangeAck::Inserted(a) => a.id,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(ids, range.clone().map(|i| i as u32).collect::<Vec<_>>());
        one_by_one.load(&inserts(range)).unwrap();
    }
    assert_eq!(node_snapshot(&bank), node_snapshot(&one_by_one));
    assert_eq!(bank.resolve(&NodeRef::External("ext-12".into())).unwrap(), 12);
    // Durable: a reopen of the same storage finds them all.
    drop(bank);
    let reopened = Bank::open(storage, OpenOptions::default()).unwrap();
    assert_eq!(node_snapshot(&reopened), node_snapshot(&one_by_one));
}

#[test]
fn a_column_must_fit_the_changes() {
    let dir = tempfile::tempdir().unwrap();
    let mut bank = Bank::create_dir(dir.path(), config(Precision::F32)).unwrap();
    let (stripped, column) = as_column(&inserts(0..3));
    let short = &column[..column.len() - 1];
    assert!(matches!(
        bank.load_column(&stripped, short),
        Err(BankError::DimensionMismatch { expected, .. }) if expected == DIM as u32
    ));
    // A node that brings its own embedding too is ambiguous: refused.
    let mut both = stripped.clone();
    both[1] = inserts(1..2).remove(0);
    match bank.load_column(&both, &column) {
        Err(BankError::BatchItem { position: 1, error }) => {
            assert!(matches!(*error, BankError::BadEmbedding(_)), "{error}")
        }
        other => panic!("expected a batch item error, got {other:?}"),
    }
    assert_eq!(bank.node_count(), 0);
    // Imports keep their state through a column load.
    let imported = vec![Change::Import(
        NewNode {
            embedding: Vec::new(),
            ..node(0)
        },
        ImportedState {
            success_hits: 7,
            retrievals: 9,
            created_unix_ms: Some(1_234),
            ..ImportedState::default()
        },
    )];
    bank.load_column(&imported, &node(0).embedding).unwrap();
    let row = bank.row(0).unwrap();
    assert_eq!((row.success_hits, row.retrievals, row.created_unix_ms), (7, 9, 1_234));
}

#[test]
fn a_read_only_handle_cannot_load() {
    let dir = tempfile::tempdir().unwrap();
    Bank::create_dir(dir.path(), config(Precision::F32))
        .unwrap()
        .close()
        .unwrap();
    let mut reader = Bank::open_dir(
        dir.path(),
        OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        },
    )
    .unwrap();
    assert!(matches!(reader.load(&inserts(0..2)), Err(BankError::ReadOnly(_))));
}

/// An I/O error at each operation of a load in turn. Acked: durable even
/// after a power loss. Refused: the poisoned handle shows what a restart
/// finds (a load whose manifest did not land is taken back out of
/// memory; one whose directory fsync failed may be either), and it
/// neither writes nor freezes.
#[test]
fn a_failed_load_shows_what_a_restart_finds() {
    // A load after a WAL record retires the WAL (a new one after the
    // manifest, which can fail after the commit); a load alone keeps it.
    // Roots only: the load hands its vectors to its writer thread instead
    // of keeping them (auto attach would scan them).
    for roots_only in [false, true] {
        let (taken_back, acked_despite_failure, clean) = fail_each_step_of_a_load(true, roots_only);
        assert!(taken_back > 10, "{taken_back}");
        assert!(acked_despite_failure > 0);
        assert_eq!(clean, 1);
        let (taken_back, acked_despite_failure, clean) = fail_each_step_of_a_load(false, roots_only);
        assert!(taken_back > 10, "{taken_back}");
        assert_eq!(acked_despite_failure, 0, "nothing is written after the manifest");
        assert_eq!(clean, 1);
    }
}

/// Fails each I/O operation of a load in turn (after a WAL record, with
/// `after_record`; of root nodes only, with `roots_only`); how often the load was taken back, acked despite a
/// failure, and ran clean. What the handle shows is what a restart finds.
fn fail_each_step_of_a_load(after_record: bool, roots_only: bool) -> (usize, usize, usize) {
    use deltamem::storage::{FaultKind, FaultPlan, Loss, SimStorage};
    use std::sync::Arc;

    let first = inserts(0..3);
    let mut more = inserts(4..9);
    for change in more.iter_mut().filter(|_| roots_only) {
        if let Change::Insert(node) = change {
            node.attach = Attach::Root;
        }
    }
    let (mut taken_back, mut acked_despite_failure, mut clean) = (0, 0, 0);
    for j in 0.. {
        let storage = SimStorage::new();
        let mut bank = Bank::create(Arc::new(storage.clone()), config(Precision::Int8)).unwrap();
        bank.load(&first).unwrap();
        match after_record {
            true => bank.transact(&inserts(3..4), None).map(drop).unwrap(),
            false => bank.load(&inserts(3..4)).map(drop).unwrap(),
        }
        let before = node_snapshot(&bank);
        let at_op = storage.op_count() + j;
        storage.set_plan(Some(FaultPlan {
            at_op,
            kind: FaultKind::Fail,
        }));
        let result = bank.load(&more);
        let fired = storage.op_count() > at_op;
        storage.set_plan(None);
        let shown = node_snapshot(&bank);
        let reopen =
            |loss| node_snapshot(&Bank::open(Arc::new(storage.crash_image(loss)), OpenOptions::default()).unwrap());
        match result {
            Ok(_) => {
                assert_eq!(shown.len(), 9);
                for loss in [Loss::KeepAll, Loss::LoseUnsynced] {
                    assert_eq!(
                        reopen(loss),
                        shown,
                        "fault at +{j}: an acked load is durable ({loss:?})"
                    );
                }
                if !fired {
                    clean += 1;
                    break;
                }
                acked_despite_failure += 1;
            }
            Err(e) => {
                let after_restart = reopen(Loss::KeepAll);
                // Only a failed directory fsync after the manifest's rename
                // leaves the outcome open (in this simulator, the rename is
                // then forgotten with the failed fsync).
                let open_outcome = e.to_string().contains("fsync directory") && shown.len() == 9;
                assert!(
                    after_restart == shown || (open_outcome && after_restart == before),
                    "fault at +{j} ({e}): handle shows {} nodes, a restart finds {}",
                    shown.len(),
                    after_restart.len()
                );
                if shown == before {
                    taken_back += 1;
                }
                let frozen = tempfile::tempdir().unwrap();
                assert!(matches!(
                    bank.freeze_to(&frozen.path().join("f")),
                    Err(BankError::Poisoned(_))
                ));
                assert!(matches!(bank.load(&more), Err(BankError::Poisoned(_))));
            }
        }
        assert!(j < 200, "the load should finish without a fault by now");
    }
    (taken_back, acked_despite_failure, clean)
}

/// A row of `dim` components drawn from a generator seeded by `k`, and (with `bulky`)
/// a 3,000-letter field, so a load's payloads exceed one 4 MiB write.
fn wide_node(k: usize, dim: usize, bulky: bool) -> NewNode {
    let mut rng = Rng((k as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let embedding = (0..dim).map(|_| rng.next_f32() * 2.0 - 1.0).collect();
    let mut fields = BTreeMap::new();
    if bulky {
        let text: String = (0..3000).map(|_| char::from(b'a' + (rng.next() % 26) as u8)).collect();
        fields.insert("trajectory".to_string(), text);
    }
    NewNode {
        tree: "task".into(),
        attach: Attach::Root,
        label: if k % 7 == 3 { Label::Failure } else { Label::Success },
        payload: Payload {
            scenario: format!("scenario {k}"),
            fields,
        },
        embedding,
        external_id: None,
    }
}

/// Two empty banks of `dim` and `precision` in directories of their own,
/// with segments of 1,500 rows (so large loads cross segment edges).
fn two_banks(dim: usize, precision: Precision) -> (tempfile::TempDir, tempfile::TempDir, Bank, Bank) {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut c = BankConfig::new(dim as u32);
    c.rows_per_segment = Some(1500);
    c.precision = precision;
    let first = Bank::create_dir(a.path(), c.clone()).unwrap();
    let second = Bank::create_dir(b.path(), c).unwrap();
    (a, b, first, second)
}

/// Loads large enough for several writes per file: strides with and
/// without padding, every precision, segment boundaries inside the load,
/// ~6 MB of payloads. Equal to the same nodes through the WAL; intact
/// after reopen, for `verify` and for a reader's first whole-segment check.
#[test]
fn big_loads_equal_transactions() {
    for dim in [1024usize, 1000] {
        for precision in [Precision::F32, Precision::F16, Precision::Int8] {
            let what = format!("dim {dim} {precision:?}");
            let (_a, b, mut logged, mut loaded) = two_banks(dim, precision);
            let first: Vec<Change> = (0..3).map(|k| Change::Insert(wide_node(k, dim, false))).collect();
            logged.transact(&first, None).unwrap();
            loaded.transact(&first, None).unwrap();
            let big: Vec<Change> = (3..2600).map(|k| Change::Insert(wide_node(k, dim, k < 2000))).collect();
            for chunk in big.chunks(1000) {
                logged.transact(chunk, None).unwrap();
            }
            loaded.load(&big).unwrap();
            let want = node_snapshot(&logged);
            assert_eq!(node_snapshot(&loaded), want, "{what}");
            drop((logged, loaded));
            let reopened = Bank::open_dir(b.path(), OpenOptions::default()).unwrap();
            assert_eq!(node_snapshot(&reopened), want, "{what}: reopened");
            let report = reopened.verify().unwrap();
            assert!(report.problems.is_empty(), "{what}: {:?}", report.problems);
            drop(reopened);
            let read_only = OpenOptions {
                read_only: true,
                ..OpenOptions::default()
            };
            let reader = Bank::open_dir(b.path(), read_only).unwrap();
            let best = reader.query("task", &wide_node(2500, dim, false).embedding, &Default::default());
            assert_eq!(best.unwrap()[0].id, 2500, "{what}");
        }
    }
}

/// `loaded` (a handle on the bank in `dir`) holds the same nodes as
/// `logged`, and so does the bank reopened, which `verify` finds intact.
fn same_nodes_as(logged: &Bank, loaded: Bank, dir: &Path, what: &str) {
    let want = node_snapshot(logged);
    assert_eq!(node_snapshot(&loaded), want, "{what}");
    drop(loaded);
    let reopened = Bank::open_dir(dir, OpenOptions::default()).unwrap();
    assert_eq!(node_snapshot(&reopened), want, "{what}: reopened");
    let report = reopened.verify().unwrap();
    assert!(report.problems.is_empty(), "{what}: {:?}", report.problems);
}

/// A load's writer thread writes each batch's vectors while later ones
/// are staged. A batch refused at its last node, after most of its
/// vectors were written, gives its indexes to the next batch: the files
/// must end up with the next batch's vectors there, in every precision,
/// with pieces, blocks and segments crossing the batch edges, and with
/// nodes committed through the WAL before the load.
#[test]
fn a_refused_batch_leaves_no_vectors_behind_for_the_next() {
    let dim = 1000; // a padded stride: 4,032 bytes in f32
    for precision in [Precision::F32, Precision::F16, Precision::Int8] {
        let what = format!("{precision:?}");
        let (_a, b, mut logged, mut loaded) = two_banks(dim, precision);
        let wide = |range: std::ops::Range<usize>| -> Vec<Change> {
            range.map(|k| Change::Insert(wide_node(k, dim, false))).collect()
        };
        for bank in [&mut logged, &mut loaded] {
            bank.transact(&wide(0..7), None).unwrap();
        }
        let mut refused = wide(1000..3300);
        if let Change::Insert(n) = refused.last_mut().unwrap() {
            n.embedding[5] = f32::NAN;
        }
        let batches = [
            as_column(&wide(7..1107)),
            as_column(&refused),
            as_column(&wide(5000..7000)),
        ];
        let refs: Vec<(&[Change], &[f32])> = batches.iter().map(|(c, v)| (c.as_slice(), v.as_slice())).collect();
        let results = loaded.load_columns(&refs).unwrap();
        assert!(
            matches!(&results[1], Err(BankError::BatchItem { position: 2299, .. })),
            "{what}: {:?}",
            results[1]
        );
        assert!(results[0].is_ok() && results[2].is_ok(), "{what}");
        for range in [7..1107, 5000..7000] {
            logged.transact(&wide(range), None).unwrap();
        }
        same_nodes_as(&logged, loaded, b.path(), &what);
    }
}

/// A handle keeps a load's piece buffers for its next load. Loads in a
/// row (the second with a refused batch, whose indexes the next batch
/// takes) must each store their own vectors, never bytes a kept buffer
/// held from before: equal to the same nodes through the WAL, in memory
/// and after reopen.
#[test]
fn loads_in_a_row_on_one_handle_store_their_own_vectors() {
    let dim = 1000;
    for precision in [Precision::F32, Precision::F16, Precision::Int8] {
        let what = format!("{precision:?}");
        let (_a, b, mut logged, mut loaded) = two_banks(dim, precision);
        let wide = |range: std::ops::Range<usize>| -> Vec<Change> {
            range.map(|k| Change::Insert(wide_node(k, dim, false))).collect()
        };
        loaded.load(&wide(0..2500)).unwrap();
        let mut refused = wide(9000..9700);
        if let Change::Insert(n) = refused.last_mut().unwrap() {
            n.embedding[3] = f32::INFINITY;
        }
        let batches = [as_column(&refused), as_column(&wide(3000..4200))];
        let refs: Vec<(&[Change], &[f32])> = batches.iter().map(|(c, v)| (c.as_slice(), v.as_slice())).collect();
        let results = loaded.load_columns(&refs).unwrap();
        assert!(results[0].is_err() && results[1].is_ok(), "{what}: {results:?}");
        loaded.load(&wide(6000..6900)).unwrap();
        for range in [0..2500, 3000..4200, 6000..6900] {
            logged.transact(&wide(range), None).unwrap();
        }
        same_nodes_as(&logged, loaded, b.path(), &what);
    }
}

/// Every byte the bulk paths write into data files (a load's checkpoint,
/// compact, freeze) is handed to the storage's writeback hint, so dirty
/// pages are flushed as they are written instead of piling up for the
/// final fdatasync; the small atomic files (WAL, manifest) are not hinted.
#[test]
fn bulk_writes_start_writeback_of_every_data_byte() {
    use deltamem::storage::{CountingStorage, IoCounts, MemStorage, data_file_generation};
    use std::sync::Arc;

    fn assert_hinted(counts: &IoCounts, what: &str) {
        let data: Vec<_> = counts
            .written_bytes
            .iter()
            .filter(|(name, _)| data_file_generation(name).is_some())
            .collect();
        assert!(data.len() >= 3, "{what} wrote rows, vectors and payloads: {data:?}");
        for (name, written) in data {
            assert_eq!(counts.writeback_bytes.get(name), Some(written), "{what}: {name}");
        }
        for name in counts.writeback_bytes.keys() {
            assert!(data_file_generation(name).is_some(), "{what} hinted {name}");
        }
    }

    let storage = Arc::new(CountingStorage::new(MemStorage::new()));
    let mut bank = Bank::create(storage.clone(), config(Precision::F16)).unwrap();
    storage.reset();
    bank.load(&inserts(0..23)).unwrap();
    assert_hinted(&storage.counts(), "load");
    storage.reset();
    bank.compact().unwrap();
    assert_hinted(&storage.counts(), "compact");
    let target = CountingStorage::new(MemStorage::new());
    bank.freeze_into(&target).unwrap();
    assert_hinted(&target.counts(), "freeze");
}

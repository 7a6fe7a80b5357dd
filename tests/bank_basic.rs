//! Lifecycle tests of the bank API on real files: insert, scan, reopen,
//! recovery without close, consolidation, lock, bad input.

use std::collections::BTreeMap;

mod common;

use common::snapshot::node_snapshot;
use deltamem::{
    Attach, Bank, BankConfig, BankError, Label, NewNode, NodeRef, NodeType, OpenOptions, Payload, QueryOptions,
};

fn config(dim: u32) -> BankConfig {
    let mut c = BankConfig::new(dim);
    c.rows_per_segment = Some(4); // force several segments
    c
}

fn unit(dim: usize, hot: usize) -> Vec<f32> {
    let mut v = vec![0.0; dim];
    v[hot] = 1.0;
    v
}

fn node(tree: &str, attach: Attach, label: Label, scenario: &str, embedding: Vec<f32>) -> NewNode {
    let mut fields = BTreeMap::new();
    fields.insert("execution_procedure".to_string(), format!("steps for {scenario}"));
    NewNode {
        tree: tree.into(),
        attach,
        label,
        payload: Payload {
            scenario: scenario.into(),
            fields,
        },
        embedding,
        external_id: None,
    }
}

#[test]
fn auto_attach_builds_chains_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut bank = Bank::create_dir(dir.path(), config(8)).unwrap();
    let root = bank
        .insert(node("task", Attach::Auto, Label::Success, "boil water", unit(8, 0)))
        .unwrap();
    assert_eq!(
        (root.node_type, root.parent, root.depth, root.matched),
        (NodeType::Root, None, 1, None)
    );
    // Same direction: matches the root, becomes its child.
    let child = bank
        .insert(node(
            "task",
            Attach::Auto,
            Label::Success,
            "boil water again",
            unit(8, 0),
        ))
        .unwrap();
    assert_eq!(
        (child.node_type, child.parent, child.depth),
        (NodeType::Residual, Some(root.id), 2)
    );
    assert_eq!(child.matched.unwrap().0, root.id);
    // Orthogonal: no match, new root; other tree is independent.
    let other = bank
        .insert(node("task", Attach::Auto, Label::Success, "melt ice", unit(8, 1)))
        .unwrap();
    assert_eq!(other.node_type, NodeType::Root);
    let env = bank
        .insert(node("env", Attach::Auto, Label::Success, "kitchen", unit(8, 0)))
        .unwrap();
    assert_eq!(env.node_type, NodeType::Root, "env tree has no nodes yet");

    let q = bank
        .query(
            "task",
            &unit(8, 0),
            &QueryOptions {
                k: 5,
                ..Default::default()
            },
        )
        .unwrap();
    // Tie on score: smaller depth first.
    assert_eq!(q.iter().map(|m| m.id).collect::<Vec<_>>(), vec![root.id, child.id]);
    assert_eq!(q[1].chain, vec![root.id, child.id]);
    drop(bank); // no close: the WAL alone must bring everything back

    let bank = Bank::open_dir(dir.path(), OpenOptions::default()).unwrap();
    assert_eq!(bank.node_count(), 4);
    assert_eq!(bank.chain(child.id).unwrap(), vec![root.id, child.id]);
    assert_eq!(bank.payload(other.id).unwrap().scenario, "melt ice");
    bank.close().unwrap();

    let bank = Bank::open_dir(
        dir.path(),
        OpenOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(bank.manifest().node_count, 4, "close checkpointed");
    assert!(bank.verify().unwrap().is_ok());
    let q = bank.query("task", &unit(8, 1), &QueryOptions::default()).unwrap();
    assert_eq!(q[0].id, other.id);
}

#[test]
fn failure_penalty_changes_the_winner() {
    let dir = tempfile::tempdir().unwrap();
    let mut bank = Bank::create_dir(dir.path(), config(4)).unwrap();
    let failed = bank
        .insert(node(
            "task",
            Attach::Root,
            Label::Failure,
            "a",
            vec![1.0, 0.0, 0.0, 0.0],
        ))
        .unwrap();
    let ok = bank
        .insert(node(
            "task",
            Attach::Root,
            Label::Success,
            "b",
            vec![0.98, 0.2, 0.0, 0.0],
        ))
        .unwrap();
    // cos(q, failed) = 1.0 - 0.05 = 0.95; cos(q, ok) ~ 0.98.
    let q = bank
        .query(
            "task",
            &[1.0, 0.0, 0.0, 0.0],
            &QueryOptions {
                k: 2,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(q[0].id, ok.id);
    assert_eq!(q[1].id, failed.id);
    let q = bank
        .query(
            "task",
            &[1.0, 0.0, 0.0, 0.0],
            &QueryOptions {
                k: 2,
                eps: Some(0.0),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(q[0].id, failed.id);
}

#[test]
fn consolidation_is_atomic_and_optimistic() {
    let dir = tempfile::tempdir().unwrap();
    let mut bank = Bank::create_dir(dir.path(), config(4)).unwrap();
    let root = bank
        .insert(node(
            "task",
            Attach::Root,
            Label::Success,
            "r",
            vec![1.0, 0.0, 0.0, 0.0],
        ))
        .unwrap();
    let mid = bank
        .insert(node(
            "task",
            Attach::Parent(NodeRef::Index(root.id)),
            Label::Success,
            "m",
            vec![1.0, 0.1, 0.0, 0.0],
        ))
        .unwrap();
    for expect_due in [false, false, true] {
        assert_eq!(bank.success_hit(mid.id).unwrap().due, expect_due);
    }
    assert_eq!(bank.due_for_consolidation(Some("task")).unwrap(), vec![mid.id]);
    let mut fields = BTreeMap::new();
    fields.insert("execution_procedure".into(), "distilled".into());
    let ack = bank.consolidate(mid.id, fields.clone()).unwrap();
    assert!(matches!(
        bank.consolidate(mid.id, fields),
        Err(BankError::AlreadyConsolidated { .. })
    ));
    assert!(bank.due_for_consolidation(None).unwrap().is_empty());
    // The consolidated node no longer matches; the new root does.
    let q = bank
        .query(
            "task",
            &[1.0, 0.1, 0.0, 0.0],
            &QueryOptions {
                k: 3,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(q[0].id, ack.new_root);
    assert!(q.iter().all(|m| m.id != mid.id));
    let with = QueryOptions {
        k: 3,
        include_consolidated: true,
        ..Default::default()
    };
    assert!(
        bank.query("task", &[1.0, 0.1, 0.0, 0.0], &with)
            .unwrap()
            .iter()
            .any(|m| m.id == mid.id)
    );
    bank.checkpoint().unwrap();
    // After the checkpoint the flag comes from the mapped table.
    let q = bank
        .query(
            "task",
            &[1.0, 0.1, 0.0, 0.0],
            &QueryOptions {
                k: 3,
                ..Default::default()
            },
        )
        .unwrap();
    assert!(q.iter().all(|m| m.id != mid.id));
    let new_root = bank.row(ack.new_root).unwrap();
    assert!(new_root.is_consolidated_root() && new_root.link == mid.id && new_root.depth == 1);
    assert!(bank.verify().unwrap().is_ok());
}

#[test]
fn second_writer_is_refused_readers_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let _bank = Bank::create_dir(dir.path(), config(4)).unwrap();
    let err = Bank::open_dir(dir.path(), OpenOptions::default()).err().unwrap();
    assert!(err.to_string().contains("locked by another process"), "{err}");
    Bank::open_dir(
        dir.path(),
        OpenOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
}

#[test]
fn bad_input_is_rejected_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut bank = Bank::create_dir(dir.path(), config(4)).unwrap();
    bank.insert(node(
        "task",
        Attach::Root,
        Label::Success,
        "ok",
        vec![1.0, 0.0, 0.0, 0.0],
    ))
    .unwrap();
    let cases: Vec<(NewNode, &str)> = vec![
        (
            node("task", Attach::Root, Label::Success, "x", vec![1.0, 0.0, 0.0]),
            "dimensions",
        ),
        (
            node("task", Attach::Root, Label::Success, "x", vec![f32::NAN, 0.0, 0.0, 1.0]),
            "component 0",
        ),
        (node("task", Attach::Root, Label::Success, "x", vec![0.0; 4]), "norm"),
        (
            node("task", Attach::Root, Label::Success, "  ", vec![1.0, 0.0, 0.0, 0.0]),
            "scenario",
        ),
        (
            node("nope", Attach::Root, Label::Success, "x", vec![1.0, 0.0, 0.0, 0.0]),
            "unknown tree",
        ),
        (
            node(
                "task",
                Attach::Parent(NodeRef::Index(99)),
                Label::Success,
                "x",
                vec![1.0, 0.0, 0.0, 0.0],
            ),
            "unknown node",
        ),
        (
            node(
                "env",
                Attach::Parent(NodeRef::Index(0)),
                Label::Success,
                "x",
                vec![1.0, 0.0, 0.0, 0.0],
            ),
            "belongs to tree",
        ),
    ];
    for (n, needle) in cases {
        let err = bank.insert(n).unwrap_err().to_string();
        assert!(err.contains(needle), "{err:?} should mention {needle:?}");
    }
    let mut big = node("task", Attach::Root, Label::Success, "x", vec![1.0, 0.0, 0.0, 0.0]);
    big.payload
        .fields
        .insert("trajectory".into(), "x".repeat(5 * 1024 * 1024));
    assert!(matches!(bank.insert(big), Err(BankError::PayloadTooLarge { .. })));
    assert_eq!(bank.node_count(), 1);
    bank.close().unwrap();
    assert_eq!(
        Bank::open_dir(dir.path(), OpenOptions::default()).unwrap().node_count(),
        1
    );
}

#[test]
fn foreign_and_corrupt_directories_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let err = Bank::open_dir(dir.path(), OpenOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("not a deltamem bank"), "{err}");
    std::fs::write(dir.path().join("MANIFEST"), b"{\"json\": true}").unwrap();
    let err = Bank::open_dir(dir.path(), OpenOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("MANIFEST") && err.contains("truncated"), "{err}");
}

#[test]
fn external_ids_resolve_and_must_be_unique() {
    let dir = tempfile::tempdir().unwrap();
    let mut bank = Bank::create_dir(dir.path(), config(4)).unwrap();
    let uuid = "07221cb0-35b2-46b2-9b05-844af65063c0";
    let mut n = node("task", Attach::Root, Label::Success, "x", vec![1.0, 0.0, 0.0, 0.0]);
    n.external_id = Some(uuid.into());
    let a = bank.insert(n.clone()).unwrap();
    assert!(matches!(bank.insert(n), Err(BankError::DuplicateExternalId { .. })));
    bank.close().unwrap();
    let bank = Bank::open_dir(dir.path(), OpenOptions::default()).unwrap();
    assert_eq!(bank.resolve(&NodeRef::External(uuid.into())).unwrap(), a.id);
    assert_eq!(bank.row(a.id).unwrap().external_id_text().unwrap(), uuid);
}

/// A torn row whose bytes are all gone (zeros) is scanned as its WAL
/// image: in its own tree, with its own label, not as the zeros say (tree
/// 0). Once only its lane sums came from the image, and it was scored as
/// a node of the other tree.
#[test]
fn a_zeroed_torn_row_is_scanned_as_its_wal_image() {
    use deltamem::storage::MemStorage;
    use std::sync::Arc;
    let storage = MemStorage::new();
    let mut bank = Bank::create(Arc::new(storage.clone()), config(4)).unwrap();
    let e = bank
        .insert(node("env", Attach::Root, Label::Failure, "e", vec![0.0, 1.0, 0.0, 0.0]))
        .unwrap();
    let t = bank
        .insert(node(
            "task",
            Attach::Root,
            Label::Success,
            "t",
            vec![1.0, 0.0, 0.0, 0.0],
        ))
        .unwrap();
    bank.close().unwrap();
    let mut bank = Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap();
    bank.success_hit(e.id).unwrap();
    drop(bank); // crash: the hit, and the row's image, live in the WAL
    let mut table = storage.file_bytes("nodes-000000.seg").unwrap();
    let at = e.id as usize * deltamem::format::row::ROW_SIZE_BYTES;
    table[at..at + deltamem::format::row::ROW_SIZE_BYTES].fill(0);
    storage.set_file_bytes("nodes-000000.seg", table);

    let bank = Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap();
    let options = QueryOptions {
        k: 2,
        tau: Some(-1.0),
        eps: Some(0.25),
        ..Default::default()
    };
    let ids = |tree: &str| -> Vec<(u32, f32)> {
        let found = bank.query(tree, &[0.0, 1.0, 0.0, 0.0], &options).unwrap();
        found.iter().map(|m| (m.id, m.score)).collect()
    };
    // The env node scores 1 less its failure penalty; the task node 0.
    assert_eq!(ids("env"), vec![(e.id, 0.75)]);
    assert_eq!(ids("task"), vec![(t.id, 0.0)]);
    assert!(bank.verify().unwrap().is_ok());
}

#[test]
fn row_torn_by_a_crashed_checkpoint_is_repaired_from_the_wal() {
    use deltamem::storage::MemStorage;
    use std::sync::Arc;
    let storage = MemStorage::new();
    let mut bank = Bank::create(Arc::new(storage.clone()), config(4)).unwrap();
    let a = bank
        .insert(node(
            "task",
            Attach::Root,
            Label::Success,
            "a",
            vec![1.0, 0.0, 0.0, 0.0],
        ))
        .unwrap();
    let b = bank
        .insert(node(
            "task",
            Attach::Parent(NodeRef::Index(a.id)),
            Label::Success,
            "b",
            vec![1.0, 0.2, 0.0, 0.0],
        ))
        .unwrap();
    bank.close().unwrap();
    let mut bank = Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap();
    bank.success_hit(a.id).unwrap();
    drop(bank); // crash: the hit lives only in the WAL
    // A checkpoint that was rewriting row `a` in place tore it.
    let mut table = storage.file_bytes("nodes-000000.seg").unwrap();
    table[20] ^= 0xFF;
    storage.set_file_bytes("nodes-000000.seg", table);

    let mut bank = Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap();
    assert_eq!(bank.row(a.id).unwrap().success_hits, 1);
    assert_eq!(bank.chain(b.id).unwrap(), vec![a.id, b.id]);
    assert!(bank.verify().unwrap().is_ok(), "superseded torn row is not a problem");
    // Its vector is scanned and checked against the image's lane sums (a
    // scan once failed here, blaming the vector for the torn row).
    let found = bank
        .query(
            "task",
            &[1.0, 0.0, 0.0, 0.0],
            &QueryOptions {
                k: 2,
                tau: Some(-1.0),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(found.iter().map(|m| m.id).collect::<Vec<_>>(), vec![a.id, b.id]);
    bank.checkpoint().unwrap();
    drop(bank);
    let bank = Bank::open(
        Arc::new(storage),
        OpenOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(bank.row(a.id).unwrap().success_hits, 1);
    assert!(bank.verify().unwrap().is_ok());
}

#[test]
fn bad_config_names_the_option_and_leaves_no_directory() {
    let parent = tempfile::tempdir().unwrap();
    let path = parent.path().join("bank");
    let mut c = config(4);
    c.trees[0].tau = 2.0;
    let err = Bank::create_dir(&path, c).err().unwrap().to_string();
    assert!(err.contains("tau 2") && err.contains("task"), "{err}");
    assert!(!path.exists(), "a refused init must not leave a directory");
    let mut c = config(4);
    c.consolidate_after = 0;
    assert!(
        Bank::create_dir(&path, c)
            .err()
            .unwrap()
            .to_string()
            .contains("consolidate-after 0 must be at least 1")
    );
}

#[test]
fn batch_insert_is_one_atomic_record() {
    let dir = tempfile::tempdir().unwrap();
    let mut bank = Bank::create_dir(dir.path(), config(4)).unwrap();
    let mut nodes: Vec<NewNode> = (0..10)
        .map(|i| {
            let mut n = node(
                "task",
                Attach::Auto,
                Label::Success,
                &format!("s{i}"),
                vec![1.0, i as f32 * 0.01, 0.0, 0.0],
            );
            n.external_id = Some(format!("n{i}"));
            n
        })
        .collect();
    let acks = bank.insert_batch(&nodes, None).unwrap();
    assert_eq!(
        acks.iter().map(|a| a.id).collect::<Vec<_>>(),
        (0..10).collect::<Vec<_>>()
    );
    // Auto placement sees the earlier nodes of the same batch.
    assert_eq!((acks[0].node_type, acks[1].parent), (NodeType::Root, Some(0)));
    assert!(acks.windows(2).all(|w| w[0].lsn == w[1].lsn), "one record");

    // A bad node anywhere rejects the whole batch and names its position.
    nodes
        .iter_mut()
        .enumerate()
        .for_each(|(i, n)| n.external_id = Some(format!("m{i}")));
    nodes[7].embedding = vec![0.0; 4];
    let err = bank.insert_batch(&nodes, None).unwrap_err();
    assert!(matches!(&err, BankError::BatchItem { position: 7, .. }), "{err}");
    assert_eq!(bank.node_count(), 10);
    assert!(
        bank.resolve(&NodeRef::External("m3".into())).is_err(),
        "rolled-back ids are forgotten"
    );
    // Duplicate ids inside one batch are caught too.
    nodes[7].embedding = vec![1.0, 0.0, 0.0, 0.0];
    nodes[5].external_id = Some("m2".into());
    assert!(matches!(
        bank.insert_batch(&nodes, None).unwrap_err(),
        BankError::BatchItem { position: 5, .. }
    ));
    drop(bank);
    let bank = Bank::open_dir(dir.path(), OpenOptions::default()).unwrap();
    assert_eq!(bank.node_count(), 10);
    assert_eq!(bank.resolve(&NodeRef::External("n9".into())).unwrap(), 9);
}

fn all_answers(bank: &Bank) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..bank.node_count() {
        let mut n = bank.node(i).unwrap();
        n.row.payload_offset_bytes = 0; // compaction may move records
        out.push(format!(
            "{n:?} {:?} {:?}",
            bank.vector(i).unwrap(),
            bank.chain(i).unwrap()
        ));
    }
    for hot in 0..4 {
        let q = bank.query(
            "task",
            &unit(4, hot),
            &QueryOptions {
                k: 5,
                tau: Some(-1.0),
                ..Default::default()
            },
        );
        out.push(format!("{:?}", q.unwrap()));
    }
    out
}

fn populated(dir: &std::path::Path) -> Bank {
    let mut bank = Bank::create_dir(dir, config(4)).unwrap();
    for i in 0..9 {
        let attach = if i % 3 == 0 { Attach::Root } else { Attach::Auto };
        bank.insert(node(
            "task",
            attach,
            Label::Success,
            &format!("s{i}"),
            vec![1.0, i as f32 * 0.05, 0.0, 0.1],
        ))
        .unwrap();
    }
    bank.success_hit(1).unwrap();
    bank.checkpoint().unwrap();
    bank.success_hit(2).unwrap(); // left in the WAL
    bank
}

#[test]
fn compact_switches_generation_and_keeps_every_answer() {
    let dir = tempfile::tempdir().unwrap();
    let mut bank = populated(dir.path());
    let before = all_answers(&bank);
    let report = bank.compact().unwrap();
    assert_eq!((report.generation, report.nodes), (1, 9));
    assert_eq!(all_answers(&bank), before);
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        names.iter().all(|n| !n.starts_with("nodes-") || n.ends_with(".g1.seg")),
        "old generation removed: {names:?}"
    );
    bank.insert(node("task", Attach::Root, Label::Failure, "after", unit(4, 2)))
        .unwrap();
    bank.close().unwrap();
    let mut bank = Bank::open_dir(dir.path(), OpenOptions::default()).unwrap();
    assert_eq!(bank.node_count(), 10);
    assert!(bank.verify().unwrap().is_ok());
    assert_eq!(bank.compact().unwrap().generation, 2);
    assert!(bank.verify().unwrap().is_ok());
}

/// A reader keeps the node set of its open while the writer compacts:
/// the compact deletes the generation the reader opened, whose files the
/// reader had not yet needed (nothing was read through it before).
#[test]
fn a_reader_opened_before_a_compact_still_answers_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = populated(dir.path());
    writer.checkpoint().unwrap();
    let expected = all_answers(&writer);
    let reader = open_read_only(dir.path());
    assert_eq!(writer.compact().unwrap().generation, 1);
    writer
        .insert(node("task", Attach::Root, Label::Success, "later", unit(4, 3)))
        .unwrap();
    writer.checkpoint().unwrap();
    assert_eq!(all_answers(&reader), expected);
    // Its verify reads its own generation's files too (the payload log's
    // length was read through a fresh open of the deleted name).
    let report = reader.verify().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

/// A MANIFEST put back from an earlier state, beside a WAL that holds
/// records after the manifest's own checkpoint and one more: the WAL is
/// newer than the manifest. It was taken for a stale WAL, its records were
/// ignored by readers and `verify`, and the next writer truncated them.
#[test]
fn a_wal_newer_than_the_manifest_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mut bank = populated(dir.path());
    bank.checkpoint().unwrap();
    let old_manifest = std::fs::read(dir.path().join("MANIFEST")).unwrap();
    bank.insert(node("task", Attach::Root, Label::Success, "x", unit(4, 1)))
        .unwrap();
    bank.checkpoint().unwrap();
    for i in 0..3 {
        bank.insert(node("task", Attach::Root, Label::Success, "in the WAL", unit(4, i)))
            .unwrap();
    }
    drop(bank); // as a crash: the last three are in the WAL only
    std::fs::write(dir.path().join("MANIFEST"), old_manifest).unwrap();
    let wal = std::fs::read(dir.path().join("wal.log")).unwrap();
    for read_only in [false, true] {
        let options = OpenOptions {
            read_only,
            ..Default::default()
        };
        let err = Bank::open_dir(dir.path(), options).err().expect("refused").to_string();
        assert!(
            err.contains("wal.log") && err.contains("not of one bank state"),
            "{err}"
        );
    }
    assert_eq!(std::fs::read(dir.path().join("wal.log")).unwrap(), wal);
}

fn open_read_only(path: &std::path::Path) -> Bank {
    Bank::open_dir(
        path,
        OpenOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Checks the raw segment files of generation `suffix` ("" or ".gN") of
/// a bank of `nodes` rows: every vector slot's padding is zero, and every
/// slot past the last row is zero in both columns (as in a fresh file).
fn assert_zeros_past_rows(dir: &std::path::Path, suffix: &str, nodes: u32, stride_bytes: usize) {
    let (rows_per_segment, vector_bytes, row_bytes) = (4u32, 4 * 4, 128);
    for segment in 0..nodes.div_ceil(rows_per_segment) {
        let read = |kind: &str| std::fs::read(dir.join(format!("{kind}-{segment:06}{suffix}.seg"))).unwrap();
        let (vectors, table) = (read("vectors"), read("nodes"));
        for slot in 0..rows_per_segment as usize {
            let index = segment * rows_per_segment + slot as u32;
            let vector = &vectors[slot * stride_bytes..(slot + 1) * stride_bytes];
            let unused = if index < nodes { &vector[vector_bytes..] } else { vector };
            assert!(
                unused.iter().all(|&b| b == 0),
                "vector slot of node {index}: {vector:?}"
            );
            if index >= nodes {
                let row = &table[slot * row_bytes..(slot + 1) * row_bytes];
                assert!(row.iter().all(|&b| b == 0), "table slot {index} past the rows: {row:?}");
            }
        }
    }
}

/// Compact and freeze build each segment in buffers reused from one
/// segment to the next: a short last segment must not carry the rows of
/// the segment before it.
#[test]
fn compact_and_freeze_leave_zeros_past_the_last_row() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let mut bank = populated(&live);
    let stride_bytes = bank.manifest().row_stride_bytes as usize;
    assert_eq!(bank.compact().unwrap().generation, 1);
    assert_zeros_past_rows(&live, ".g1", 9, stride_bytes);
    // Two nodes in the overlay: the frozen copy's last segment mixes a
    // copied row and two encoded ones.
    for i in 0..2 {
        bank.insert(node("task", Attach::Root, Label::Success, &format!("o{i}"), unit(4, i)))
            .unwrap();
    }
    let before = all_answers(&bank);
    let out = dir.path().join("frozen");
    assert_eq!(bank.freeze_to(&out).unwrap().nodes, 11);
    assert_zeros_past_rows(&out, "", 11, stride_bytes);
    let frozen = open_read_only(&out);
    assert_eq!(all_answers(&frozen), before);
    assert!(frozen.verify().unwrap().is_ok());
}

#[test]
fn freeze_writes_a_read_only_copy_with_the_same_answers() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let bank = populated(&dir.path().join("live"));
    let before = all_answers(&bank);
    let out = dir.path().join("frozen");
    let report = bank.freeze_to(&out).unwrap();
    assert_eq!(report.nodes, 9);
    assert!(matches!(bank.freeze_to(&out), Err(BankError::AlreadyExists { .. })));
    drop(bank);
    let frozen = open_read_only(&out);
    assert!(frozen.manifest().is_frozen());
    assert_eq!(all_answers(&frozen), before);
    let report = frozen.verify().unwrap();
    assert!(report.is_ok() && report.wal_records == 0, "{report:?}");
    let err = Bank::open_dir(&out, OpenOptions::default()).err().unwrap().to_string();
    assert!(err.contains("frozen"), "{err}");
    assert!(
        !out.join("LOCK").exists(),
        "refusing a writer must not write into a frozen bank"
    );
    let mode = std::fs::metadata(out.join("MANIFEST")).unwrap().permissions().mode();
    assert_eq!(mode & 0o222, 0, "frozen files are read-only");
}

#[test]
fn transact_commits_an_episode_as_one_record() {
    use deltamem::{Change, ChangeAck};
    let dir = tempfile::tempdir().unwrap();
    let mut bank = Bank::create_dir(dir.path(), config(4)).unwrap();
    let root = bank
        .insert(node("task", Attach::Root, Label::Success, "r", unit(4, 0)))
        .unwrap()
        .id;
    let episode = vec![
        Change::Insert(node(
            "task",
            Attach::Parent(NodeRef::Index(root)),
            Label::Success,
            "c",
            unit(4, 0),
        )),
        Change::Retrievals(vec![root, root]),
        Change::SuccessHit(root),
        Change::SuccessHit(1), // the node inserted by this same transaction
    ];
    let acks = bank.transact(&episode, None).unwrap();
    let lsns: Vec<u64> = acks
        .iter()
        .filter_map(|a| match a {
            ChangeAck::Inserted(a) => Some(a.lsn),
            ChangeAck::Hit(a) => Some(a.lsn),
            ChangeAck::Retrieved { nodes } => {
                assert_eq!(*nodes, 1, "a node listed twice counts once");
                None
            }
        })
        .collect();
    assert!(lsns.len() == 3 && lsns.iter().all(|&l| l == lsns[0]), "{lsns:?}");
    assert_eq!(
        (bank.row(root).unwrap().success_hits, bank.row(root).unwrap().retrievals),
        (1, 1)
    );
    assert_eq!(bank.row(1).unwrap().success_hits, 1);

    // A bad change undoes the counters staged before it, too.
    let bad = vec![
        Change::SuccessHit(root),
        Change::Retrievals(vec![root]),
        Change::SuccessHit(99),
    ];
    let err = bank.transact(&bad, None).unwrap_err();
    assert!(matches!(err, BankError::BatchItem { position: 2, .. }), "{err}");
    assert_eq!(
        (bank.row(root).unwrap().success_hits, bank.row(root).unwrap().retrievals),
        (1, 1)
    );
    drop(bank);
    let bank = Bank::open_dir(dir.path(), OpenOptions::default()).unwrap();
    assert_eq!((bank.node_count(), bank.row(root).unwrap().success_hits), (2, 1));
}

#[test]
fn imported_state_sets_counters_and_a_linkless_consolidation() {
    use deltamem::{Change, ImportedState};
    let dir = tempfile::tempdir().unwrap();
    let mut bank = Bank::create_dir(dir.path(), config(4)).unwrap();
    let root = node("task", Attach::Root, Label::Success, "r", unit(4, 0));
    let state = ImportedState {
        success_hits: 4,
        retrievals: 9,
        created_unix_ms: Some(1_773_056_512_000),
        ..Default::default()
    };
    let mut child = node(
        "task",
        Attach::Parent(NodeRef::Index(0)),
        Label::Success,
        "c",
        vec![1.0, 0.1, 0.0, 0.0],
    );
    child.external_id = Some("child".into());
    let gone = ImportedState {
        consolidated: true,
        ..Default::default()
    };
    bank.transact(&[Change::Import(root, state), Change::Import(child, gone)], None)
        .unwrap();
    let row = bank.row(0).unwrap();
    assert_eq!(
        (row.success_hits, row.retrievals, row.created_unix_ms),
        (4, 9, 1_773_056_512_000)
    );
    assert!(bank.row(1).unwrap().is_consolidated() && bank.row(1).unwrap().link().is_none());
    // An imported consolidation is in force: the node is not matched, before
    // and after a checkpoint, and verify accepts the missing link.
    for checkpoint in [false, true] {
        if checkpoint {
            bank.checkpoint().unwrap();
        }
        let q = bank
            .query(
                "task",
                &[1.0, 0.1, 0.0, 0.0],
                &QueryOptions {
                    k: 5,
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(
            q.iter().map(|m| m.id).collect::<Vec<_>>(),
            vec![0],
            "checkpoint {checkpoint}"
        );
        assert!(bank.verify().unwrap().is_ok());
    }
    assert!(
        bank.due_for_consolidation(None).unwrap().is_empty(),
        "a root is never due; a consolidated node neither"
    );
    // Only a top-level root can be a consolidated root.
    let bad = ImportedState {
        consolidated_root: true,
        ..Default::default()
    };
    let under = node(
        "task",
        Attach::Parent(NodeRef::Index(0)),
        Label::Success,
        "x",
        unit(4, 1),
    );
    assert!(bank.transact(&[Change::Import(under, bad)], None).is_err());
}

/// Issue 11, item 13: a reader (`verify` included) takes no lock and can
/// read the WAL while the writer is in the middle of appending a record.
/// What it sees then is a torn tail, which is not corruption: every open
/// and every verify beside a writer appending large records (so a read
/// often lands inside one) must succeed and report nothing. Bounded: the
/// writer stops after 2 s or 400 records.
#[test]
fn verify_beside_a_running_writer_never_reports_a_record_being_written() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let mut bank = Bank::create_dir(&path, config(4)).unwrap();
    bank.set_sync_policy(deltamem::SyncPolicy::None);
    let done = std::sync::Arc::new(AtomicBool::new(false));
    let writer_done = done.clone();
    let writer = std::thread::spawn(move || {
        let started = std::time::Instant::now();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for k in 0..400 {
            if started.elapsed() > std::time::Duration::from_secs(2) {
                break;
            }
            // ~3 MiB of letters: poorly compressible, so each record is
            // large and its write takes long enough to be caught.
            let noise: String = (0..3 << 20)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    char::from(b'a' + (seed % 26) as u8)
                })
                .collect();
            let mut n = node("task", Attach::Root, Label::Success, &format!("n{k}"), unit(4, k % 4));
            n.payload.fields.insert("trajectory".into(), noise);
            bank.insert(n).unwrap();
        }
        writer_done.store(true, Ordering::SeqCst);
        bank.close().unwrap();
    });
    let read_only = OpenOptions {
        read_only: true,
        ..Default::default()
    };
    let mut verifies = 0;
    while !done.load(Ordering::SeqCst) {
        let reader = Bank::open_dir(&path, read_only.clone()).unwrap_or_else(|e| panic!("open beside the writer: {e}"));
        let report = reader.verify().unwrap();
        assert!(report.is_ok(), "verify beside the writer: {:?}", report.problems);
        verifies += 1;
    }
    writer.join().unwrap();
    println!("{verifies} verifies beside the writer");
    assert!(verifies > 0);
}

/// Issue 11: an error's message must not repeat its cause. Printed as a
/// chain (anyhow's `{:#}`: each error, then its `source()`), a storage
/// error read "create MANIFEST.tmp: Is a directory: Is a directory". For
/// an I/O failure and a corrupt file, no error in the chain may contain
/// the message of the error below it.
#[test]
fn errors_do_not_repeat_their_cause() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let io = Bank::create_dir(file.join("bank"), config(4))
        .err()
        .expect("created under a file");
    let bank_dir = dir.path().join("bank");
    Bank::create_dir(&bank_dir, config(4)).unwrap().close().unwrap();
    std::fs::write(bank_dir.join("MANIFEST"), vec![0u8; 1024]).unwrap();
    let corrupt = Bank::open_dir(&bank_dir, OpenOptions::default())
        .err()
        .expect("opened a zeroed MANIFEST");
    for top in [&io, &corrupt] {
        error_chain(top);
    }
}

/// The messages of `top` and its sources, checking on the way that no
/// message contains the one below it.
fn error_chain(top: &dyn std::error::Error) -> Vec<String> {
    let mut level = top;
    let mut chain = vec![level.to_string()];
    while let Some(next) = level.source() {
        let (text, below) = (level.to_string(), next.to_string());
        assert!(
            !text.contains(&below),
            "{chain:?}: {text:?} repeats its cause {below:?}"
        );
        chain.push(below);
        level = next;
    }
    chain
}

/// Issue 11: a refused batch read "batch item 1: X: X" as a chain, because
/// the item's error was both in its message and its `source()`. Printed
/// as anyhow's `{:#}` does, the cause appears exactly once.
#[test]
fn batch_item_errors_do_not_repeat_their_cause() {
    let dir = tempfile::tempdir().unwrap();
    let mut bank = Bank::create_dir(dir.path(), config(4)).unwrap();
    let nodes = vec![
        node("task", Attach::Root, Label::Success, "a", unit(4, 0)),
        node("task", Attach::Root, Label::Success, "b", vec![0.0; 4]),
    ];
    let err = bank.insert_batch(&nodes, None).unwrap_err();
    let BankError::BatchItem { position: 1, error } = &err else {
        panic!("expected batch item 1, got {err:?}");
    };
    let cause = error.to_string();
    let printed = error_chain(&err).join(": ");
    assert_eq!(printed.matches(&cause).count(), 1, "{printed}");
    assert_eq!(printed, format!("batch item 1: {cause}"));
}

/// `freeze OUT` says precisely why an existing OUT is refused, and never
/// deletes what the engine did not create: a leftover `OUT.freezing` is
/// cleared only when it carries the engine's mark, and only of the files
/// a freeze writes.
#[test]
fn freeze_refuses_existing_targets_precisely_and_keeps_foreign_files() {
    let dir = tempfile::tempdir().unwrap();
    let bank = populated(&dir.path().join("live"));
    let refused = |out: &std::path::Path| bank.freeze_to(out).unwrap_err().to_string();

    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    assert!(refused(&empty).contains("is an empty directory"), "{}", refused(&empty));
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), "mine").unwrap();
    assert!(refused(&other).contains("not a bank"), "{}", refused(&other));
    let file = dir.path().join("plain");
    std::fs::write(&file, "mine").unwrap();
    assert!(refused(&file).contains("is a file"), "{}", refused(&file));
    assert!(std::fs::read(&file).unwrap() == b"mine" && other.join("notes.txt").exists());

    // A work directory the engine did not make is left alone.
    let out = dir.path().join("copy");
    let work = dir.path().join("copy.freezing");
    std::fs::create_dir(&work).unwrap();
    std::fs::write(work.join("precious"), "mine").unwrap();
    assert!(refused(&out).contains("no FREEZING mark"), "{}", refused(&out));
    assert_eq!(std::fs::read(work.join("precious")).unwrap(), b"mine");

    // Marked, but holding a file a freeze never writes: the engine's files
    // go, the foreign one stays, and the freeze is refused.
    std::fs::write(work.join(deltamem::bank::FREEZING_MARK_FILE), "").unwrap();
    std::fs::write(work.join("MANIFEST.tmp"), "half").unwrap();
    assert!(refused(&out).contains("kept"), "{}", refused(&out));
    assert_eq!(std::fs::read(work.join("precious")).unwrap(), b"mine");
    assert!(!work.join("MANIFEST.tmp").exists());

    // An unfinished freeze of the engine's own is cleared and redone.
    std::fs::remove_file(work.join("precious")).unwrap();
    std::fs::write(work.join(deltamem::bank::FREEZING_MARK_FILE), "").unwrap();
    std::fs::write(work.join("nodes-000000.seg"), "torn").unwrap();
    assert_eq!(bank.freeze_to(&out).unwrap().nodes, 9);
    assert!(!work.exists() && !out.join(deltamem::bank::FREEZING_MARK_FILE).exists());
}

/// A bank holds at most `MAX_SEGMENT_COUNT` segments, so its map count
/// stays far below the OS limit however it was configured: with one row
/// per segment the 4,097th node is refused (nothing written), and a
/// manifest claiming more nodes than its segments can hold is corrupt.
#[test]
fn a_bank_never_needs_more_than_max_segment_count_segments() {
    use deltamem::format::MAX_SEGMENT_COUNT;
    use deltamem::format::manifest::Manifest;
    use deltamem::storage::MemStorage;
    let storage = MemStorage::new();
    let mut c = config(4);
    c.rows_per_segment = Some(1);
    let mut bank = Bank::create(std::sync::Arc::new(storage.clone()), c).unwrap();
    bank.set_sync_policy(deltamem::SyncPolicy::None);
    for i in 0..MAX_SEGMENT_COUNT as usize {
        bank.insert(node("task", Attach::Root, Label::Success, "s", unit(4, i % 4)))
            .unwrap();
    }
    let e = bank
        .insert(node("task", Attach::Root, Label::Success, "s", unit(4, 0)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("full") && e.contains("4096"), "{e}");
    bank.close().unwrap();
    let names = storage.file_names();
    assert_eq!(names.iter().filter(|n| n.starts_with("nodes-")).count(), 4096);

    let mut manifest = Manifest::decode(&storage.file_bytes("MANIFEST").unwrap()).unwrap();
    manifest.node_count += 1;
    let e = Manifest::decode(&manifest.encode()).unwrap_err().to_string();
    assert!(e.contains("4096 segments"), "{e}");
}

/// `transact_column` (the inserts' vectors as one row-major column, as
/// the Python binding's `insert_many` passes an array) stores and logs
/// what `transact` does with the same vectors in the nodes, for every
/// precision: the reopened banks (WAL replay, which recomputes every
/// vector's checksum and lane sums) agree node for node. A column of the
/// wrong length or a node with its own vector is refused, nothing stored.
#[test]
fn a_column_transaction_stores_what_a_transaction_stores() {
    use deltamem::format::manifest::Precision;
    use deltamem::{Change, ChangeAck};
    const DIM: usize = 8;
    let vector = |k: usize| -> Vec<f32> { (0..DIM).map(|i| ((i * 5 + k * 3) % 7) as f32 - 2.5).collect() };
    let changes: Vec<Change> = (0..9)
        .map(|k| {
            let attach = if k % 2 == 0 { Attach::Root } else { Attach::Auto };
            let mut n = node("task", attach, Label::Success, &format!("c{k}"), vector(k));
            n.external_id = (k == 4).then(|| "col-4".to_string());
            Change::Insert(n)
        })
        .collect();
    let column: Vec<f32> = (0..9).flat_map(vector).collect();
    let stripped: Vec<Change> = changes
        .iter()
        .map(|c| match c {
            Change::Insert(n) => Change::Insert(NewNode {
                embedding: Vec::new(),
                ..n.clone()
            }),
            other => other.clone(),
        })
        .collect();
    for precision in [Precision::F32, Precision::F16, Precision::Int8] {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut cfg = config(DIM as u32);
        cfg.precision = precision;
        let mut by_nodes = Bank::create_dir(a.path(), cfg.clone()).unwrap();
        let mut by_column = Bank::create_dir(b.path(), cfg).unwrap();
        let acks = by_nodes.transact(&changes, None).unwrap();
        let err = by_column.transact_column(&stripped, &column[DIM..], None).unwrap_err();
        assert!(matches!(err, BankError::DimensionMismatch { .. }), "{err}");
        let err = by_column.transact_column(&changes, &column, None).unwrap_err();
        assert!(matches!(&err, BankError::BatchItem { position: 0, .. }), "{err}");
        assert_eq!(by_column.node_count(), 0, "refused, nothing stored");
        let column_acks = by_column.transact_column(&stripped, &column, None).unwrap();
        let placed = |acks: &[ChangeAck]| -> Vec<String> { acks.iter().map(|a| format!("{a:?}")).collect() };
        assert_eq!(placed(&column_acks), placed(&acks), "{precision:?}");
        let expected = node_snapshot(&by_nodes);
        assert_eq!(node_snapshot(&by_column), expected, "{precision:?}");
        drop((by_nodes, by_column)); // no close: the reopen replays the WAL
        for dir in [a.path(), b.path()] {
            let reopened = Bank::open_dir(dir, OpenOptions::default()).unwrap();
            assert_eq!(node_snapshot(&reopened), expected, "{precision:?}");
            assert_eq!(reopened.resolve(&NodeRef::External("col-4".into())).unwrap(), 4);
        }
    }
}

/// A read-only server asks `has_news` every 200 ms and reopens the bank
/// when it says yes. A torn last record left by a dead writer is not news:
/// it was, at every ask, so the reader reopened and replayed the whole WAL
/// five times a second for as long as no writer came. Truncating it is not
/// news either; the record a new writer appends is.
#[test]
fn a_torn_wal_tail_is_news_only_once_a_writer_appends() {
    let dir = tempfile::tempdir().unwrap();
    let wal_path = dir.path().join("wal.log");
    let mut bank = Bank::create_dir(dir.path(), config(4)).unwrap();
    for i in 0..2 {
        bank.insert(node("task", Attach::Root, Label::Success, "n", unit(4, i)))
            .unwrap();
    }
    bank.sync().unwrap();
    let two = std::fs::read(&wal_path).unwrap();
    bank.insert(node("task", Attach::Root, Label::Success, "torn", unit(4, 2)))
        .unwrap();
    drop(bank); // a crash
    let mut three = std::fs::read(&wal_path).unwrap();
    let start = (0..two.len()).find(|&i| two[i] != three[i]).unwrap();
    let body_bytes = u32::from_le_bytes(three[start..start + 4].try_into().unwrap()) as usize;
    // Half the third record's body never reached the disk.
    let end = start + 24 + body_bytes;
    three[end - body_bytes / 2..end].fill(0);
    std::fs::write(&wal_path, &three).unwrap();

    let read_only = OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    };
    let mut reader = Bank::open_dir(dir.path(), read_only.clone()).unwrap();
    assert_eq!(reader.node_count(), 2);
    assert!(!reader.has_news().unwrap(), "a torn tail is not news");
    assert!(!reader.has_news().unwrap(), "nor at the next ask");
    let mut writer = Bank::open_dir(dir.path(), OpenOptions::default()).unwrap();
    assert_eq!(writer.node_count(), 2);
    assert!(!reader.has_news().unwrap(), "a writer's truncation adds nothing");
    writer
        .insert(node("task", Attach::Root, Label::Success, "new", unit(4, 3)))
        .unwrap();
    writer.sync().unwrap();
    assert!(reader.has_news().unwrap(), "the new writer's record is news");
    reader.refresh().unwrap();
    assert_eq!(reader.node_count(), 3);
    assert_eq!(reader.payload(2).unwrap().scenario, "new");
    assert!(!reader.has_news().unwrap());
}

/// A stale WAL (a checkpoint's crash left the previous one beside the new
/// manifest) is not news at every ask either; a writer that replaces it
/// is news once.
#[test]
fn a_stale_wal_is_news_only_once_a_writer_replaces_it() {
    let dir = tempfile::tempdir().unwrap();
    let wal_path = dir.path().join("wal.log");
    let mut bank = Bank::create_dir(dir.path(), config(4)).unwrap();
    bank.insert(node("task", Attach::Root, Label::Success, "a", unit(4, 0)))
        .unwrap();
    bank.sync().unwrap();
    let old_wal = std::fs::read(&wal_path).unwrap();
    bank.checkpoint().unwrap();
    drop(bank);
    std::fs::write(&wal_path, &old_wal).unwrap();

    let read_only = OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    };
    let mut reader = Bank::open_dir(dir.path(), read_only).unwrap();
    assert_eq!(reader.node_count(), 1);
    assert!(!reader.has_news().unwrap(), "a stale WAL is not news");
    let writer = Bank::open_dir(dir.path(), OpenOptions::default()).unwrap();
    assert!(reader.has_news().unwrap(), "the writer replaced the stale WAL");
    reader.refresh().unwrap();
    assert!(!reader.has_news().unwrap());
    drop(writer);
}

/// A reader (a `freeze` beside a running writer) that sees, through its
/// mapping, a source row the writer's checkpoint rewrote with a link to a
/// root past the reader's view: `verify` hides that consolidation as every
/// read does, so the freeze (which verifies first) is not refused as
/// damaged (it was: "consolidation link 2 is dangling").
#[test]
fn a_reader_verifies_and_freezes_beside_a_writer_that_consolidated() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(4);
    c.consolidate_after = 1;
    let mut writer = Bank::create_dir(dir.path(), c).unwrap();
    let root = writer
        .insert(node("task", Attach::Root, Label::Success, "r", unit(4, 0)))
        .unwrap()
        .id;
    let child = node(
        "task",
        Attach::Parent(NodeRef::Index(root)),
        Label::Success,
        "c",
        unit(4, 1),
    );
    let child = writer.insert(child).unwrap().id;
    writer.success_hit(child).unwrap();
    writer.checkpoint().unwrap();
    let read_only = OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    };
    let reader = Bank::open_dir(dir.path(), read_only).unwrap();
    assert_eq!(reader.node_count(), 2);
    let mut fields = BTreeMap::new();
    fields.insert("execution_procedure".to_string(), "distilled".to_string());
    writer.consolidate(child, fields).unwrap();
    writer.checkpoint().unwrap();
    let report = reader.verify().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    let out = dir.path().with_extension("frozen");
    reader.freeze_to(&out).unwrap();
    // The copy is the reader's view: two nodes, the consolidation hidden.
    let frozen = Bank::open_dir(
        &out,
        OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        },
    )
    .unwrap();
    assert_eq!(frozen.node_count(), 2);
    assert!(!frozen.row(child).unwrap().is_consolidated());
    // A writer's own dangling link is still damage (see tests/corruption.rs).
    drop(writer);
}

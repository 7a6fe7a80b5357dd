//! Reduced-precision banks on disk: an f16 node scores the same before and
//! after its checkpoint and after recovery; the int8 side column is
//! written by checkpoint, compact and freeze, checked on first map and by
//! `verify` (a flipped byte is reported and never answered wrongly).

use std::collections::BTreeMap;
use std::sync::Arc;

use deltamem::format::manifest::Precision;
use deltamem::storage::MemStorage;
use deltamem::{Attach, Bank, BankConfig, Label, NewNode, OpenOptions, Payload, QueryOptions};

const DIM: usize = 20;

fn rng_vector(seed: u64) -> Vec<f32> {
    let mut rng = deltamem::storage::sim::Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    (0..DIM).map(|_| rng.next_f32() * 2.0 - 1.0).collect()
}

fn node(i: u64) -> NewNode {
    NewNode {
        tree: if i.is_multiple_of(3) { "env" } else { "task" }.into(),
        attach: Attach::Root,
        label: if i % 4 == 1 { Label::Failure } else { Label::Success },
        payload: Payload {
            scenario: format!("scenario {i}"),
            fields: BTreeMap::from([("execution_procedure".to_string(), format!("do {i}"))]),
        },
        embedding: rng_vector(i),
        external_id: None,
    }
}

fn config(precision: Precision) -> BankConfig {
    let mut c = BankConfig::new(DIM as u32);
    c.rows_per_segment = Some(8);
    c.precision = precision;
    c
}

fn everything(bank: &Bank) -> Vec<String> {
    let opts = QueryOptions {
        k: 7,
        tau: Some(-1.0),
        ..Default::default()
    };
    let mut out = Vec::new();
    for q in 100..106 {
        for tree in ["task", "env"] {
            out.push(format!("{:?}", bank.query(tree, &rng_vector(q), &opts).unwrap()));
        }
    }
    for i in 0..bank.node_count() {
        let v: Vec<u32> = bank.vector(i).unwrap().iter().map(|x| x.to_bits()).collect();
        out.push(format!("{v:?}"));
    }
    out
}

#[test]
fn answers_do_not_depend_on_checkpoints_or_recovery() {
    for precision in [Precision::F32, Precision::F16, Precision::Int8] {
        let storage = MemStorage::new();
        let mut bank = Bank::create(Arc::new(storage.clone()), config(precision)).unwrap();
        for i in 0..30 {
            bank.insert(node(i)).unwrap();
        }
        let in_overlay = everything(&bank);
        drop(bank); // recovery replays the WAL
        let mut bank = Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap();
        assert_eq!(everything(&bank), in_overlay, "{precision:?} after replay");
        bank.checkpoint().unwrap();
        assert_eq!(everything(&bank), in_overlay, "{precision:?} after checkpoint");
        bank.compact().unwrap();
        assert_eq!(everything(&bank), in_overlay, "{precision:?} after compact");
        let report = bank.verify().unwrap();
        assert!(report.is_ok(), "{precision:?}: {:?}", report.problems);
        let names = storage.file_names();
        let side = names.iter().filter(|n| n.starts_with("qvectors-")).count();
        assert_eq!(side > 0, precision == Precision::Int8, "{names:?}");
        assert!(
            names.iter().all(|n| !n.contains("-") || n.contains(".g1.")),
            "old generation left: {names:?}"
        );
        let stats = bank.stats().unwrap();
        let per_node = (precision.vector_stride_bytes(DIM as u32)
            + precision.qvector_stride_bytes(DIM as u32).unwrap_or(0)) as u64;
        assert_eq!((stats.precision, stats.vector_bytes), (precision, 30 * per_node));
        bank.close().unwrap();
        let reader = Bank::open(
            Arc::new(storage.clone()),
            OpenOptions {
                read_only: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(everything(&reader), in_overlay, "{precision:?} reader after close");
    }
}

#[test]
fn f16_bank_is_half_the_column_and_stores_rounded_values() {
    let dir = tempfile::tempdir().unwrap();
    let mut bank = Bank::create_dir(dir.path(), config(Precision::F16)).unwrap();
    let ack = bank.insert(node(1)).unwrap();
    let stored = bank.vector(ack.id).unwrap();
    assert!(stored.iter().all(|x| half::f16::from_f32(*x).to_f32() == *x));
    bank.close().unwrap();
    let seg = std::fs::metadata(dir.path().join("vectors-000000.seg")).unwrap().len();
    assert_eq!(seg, 8 * 64, "dim 20 at 2 bytes is 40, padded to 64");
    let frozen = dir.path().with_extension("frozen");
    let bank = Bank::open_dir(dir.path(), OpenOptions::default()).unwrap();
    bank.freeze_to(&frozen).unwrap();
    let copy = Bank::open_dir(
        &frozen,
        OpenOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(copy.verify().unwrap().is_ok());
    assert_eq!(everything(&copy), everything(&bank));
    make_writable(&frozen);
    std::fs::remove_dir_all(&frozen).unwrap();
}

fn make_writable(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
}

#[test]
fn int8_frozen_copy_verifies_and_checks_its_unused_space() {
    let dir = tempfile::tempdir().unwrap();
    let mut bank = Bank::create_dir(dir.path().join("b"), config(Precision::Int8)).unwrap();
    for i in 0..13 {
        bank.insert(node(i)).unwrap();
    }
    let out = dir.path().join("frozen");
    bank.freeze_to(&out).unwrap();
    let copy = Bank::open_dir(
        &out,
        OpenOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(copy.verify().unwrap().is_ok());
    assert_eq!(everything(&copy), everything(&bank));
    // Garbage past the last node of a frozen side column is reported.
    make_writable(&out);
    let path = out.join("qvectors-000001.seg");
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] = 1;
    std::fs::write(&path, bytes).unwrap();
    let copy = Bank::open_dir(
        &out,
        OpenOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    let report = copy.verify().unwrap();
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.file.ends_with("qvectors-000001.seg") && p.offset_bytes == last as u64),
        "{:?}",
        report.problems
    );
}

#[test]
fn every_flipped_side_column_byte_is_reported_and_never_answered_wrongly() {
    let storage = MemStorage::new();
    let mut bank = Bank::create(Arc::new(storage.clone()), config(Precision::Int8)).unwrap();
    for i in 0..11 {
        bank.insert(node(i)).unwrap();
    }
    bank.close().unwrap();
    let read_only = OpenOptions {
        read_only: true,
        ..Default::default()
    };
    let good = everything(&Bank::open(Arc::new(storage.clone()), read_only.clone()).unwrap());
    let qstride = Precision::Int8.qvector_stride_bytes(DIM as u32).unwrap() as usize;
    let (mut flips, mut refused) = (0, 0);
    for name in storage.file_names().into_iter().filter(|n| n.starts_with("qvectors-")) {
        let original = storage.file_bytes(&name).unwrap();
        let segment: usize = name[9..15].parse().unwrap();
        let live = 11usize.saturating_sub(segment * 8).min(8) * qstride;
        for offset in 0..live {
            let mut damaged = original.clone();
            damaged[offset] ^= 1 << (offset % 8);
            storage.set_file_bytes(&name, damaged);
            let bank = Bank::open(Arc::new(storage.clone()), read_only.clone()).unwrap();
            let report = bank.verify().unwrap();
            let row = offset / qstride * qstride..offset / qstride * qstride + qstride;
            assert!(
                report
                    .problems
                    .iter()
                    .any(|p| p.file.ends_with(&name) && row.contains(&(p.offset_bytes as usize))),
                "{name} byte {offset}: {:?}",
                report.problems
            );
            let bank = Bank::open(Arc::new(storage.clone()), read_only.clone()).unwrap();
            let opts = QueryOptions {
                k: 7,
                tau: Some(-1.0),
                ..Default::default()
            };
            for q in 100..106 {
                match bank.query("task", &rng_vector(q), &opts) {
                    Err(e) => {
                        refused += 1;
                        assert!(e.to_string().contains(&name), "{e}");
                    }
                    Ok(m) => assert_eq!(format!("{m:?}"), good[2 * (q as usize - 100)], "{name} byte {offset}"),
                }
            }
            flips += 1;
        }
        storage.set_file_bytes(&name, original);
    }
    assert!(flips >= 11 * qstride && refused > 0, "{flips} flips, {refused} refused");
}

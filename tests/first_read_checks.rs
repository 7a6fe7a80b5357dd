//! The scan's first-read check of format 2 (lane sums computed by the
//! scoring kernels, FORMAT.md §4 "When data-file bytes are checked") next
//! to the CRC that single reads, `verify` and maintenance use: damage each
//! of them misses is caught by the other on the path that uses it, every
//! precision's scan catches a flipped bit, and format-1 banks (no lane
//! sums) are still read, written and upgraded by `compact`.

mod common;

use std::sync::Arc;

use common::crashkit::root_node;
use deltamem::format::manifest::{Manifest, Precision};
use deltamem::format::row::{ROW_SIZE_BYTES, Row};
use deltamem::storage::MemStorage;
use deltamem::{Bank, BankConfig, Change, OpenOptions, QueryOptions};

/// 40 components: f32 rows of 40 words and f16 rows of 20 words, so each
/// has two words 16 apart (the same lane); not a multiple of 16.
const DIM: usize = 40;
const ROWS: u32 = 6;

fn embedding(i: usize) -> Vec<f32> {
    (0..DIM)
        .map(|d| ((i * 7 + d * 3) % 11) as f32 - 5.0 + 0.25 * i as f32)
        .collect()
}

fn build(precision: Precision) -> MemStorage {
    let storage = MemStorage::new();
    let mut config = BankConfig::new(DIM as u32);
    config.rows_per_segment = Some(4);
    config.precision = precision;
    let mut bank = Bank::create(Arc::new(storage.clone()), config).unwrap();
    for i in 0..ROWS as usize {
        bank.insert(root_node(i, embedding(i))).unwrap();
    }
    bank.close().unwrap();
    storage
}

fn read_only(storage: &MemStorage) -> Bank {
    let options = OpenOptions {
        read_only: true,
        ..Default::default()
    };
    Bank::open(Arc::new(storage.clone()), options).unwrap()
}

fn options() -> QueryOptions {
    QueryOptions {
        k: ROWS as usize,
        tau: Some(-1.0),
        ..Default::default()
    }
}

/// Every node's answer to a query of every node's embedding.
fn answers(bank: &Bank) -> Result<Vec<String>, String> {
    (0..ROWS as usize)
        .map(|i| {
            bank.query("task", &embedding(i), &options())
                .map(|m| format!("{m:?}"))
                .map_err(|e| e.to_string())
        })
        .collect()
}

fn edit(storage: &MemStorage, name: &str, change: impl FnOnce(&mut Vec<u8>)) {
    let mut bytes = storage.file_bytes(name).unwrap();
    change(&mut bytes);
    storage.set_file_bytes(name, bytes);
}

/// Rewrites row `index` (4 rows per segment) with a fresh CRC.
fn forge_row(storage: &MemStorage, index: u32, forge: impl FnOnce(&mut Row)) {
    let name = format!("nodes-{:06}.seg", index / 4);
    let at = (index % 4) as usize * ROW_SIZE_BYTES;
    edit(storage, &name, |bytes| {
        let mut row = Row::decode(&bytes[at..at + ROW_SIZE_BYTES], index).unwrap();
        forge(&mut row);
        bytes[at..at + ROW_SIZE_BYTES].copy_from_slice(&row.encode());
    });
}

fn stride(precision: Precision) -> usize {
    precision.vector_stride_bytes(DIM as u32) as usize
}

/// A flipped bit in a vector (and in an int8 row) fails the scan of a
/// fresh process, in every precision, naming the file and the node, while
/// reads that never touch the vector column still answer.
#[test]
fn a_flipped_bit_fails_the_first_scan_in_every_precision() {
    for precision in [Precision::F32, Precision::F16, Precision::Int8] {
        let mut files = vec![("vectors-000000.seg", stride(precision))];
        if let Some(q) = precision.qvector_stride_bytes(DIM as u32) {
            files.push(("qvectors-000000.seg", q as usize));
        }
        for (name, row_stride) in files {
            for (byte, bit) in [(0usize, 0u8), (5, 3), (41, 7), (63, 1)] {
                let storage = build(precision);
                answers(&read_only(&storage)).expect("the undamaged bank answers");
                // Node 2's stored bytes (int8: scale, codes or padding).
                let at = 2 * row_stride + byte % (row_stride.min(DIM * precision.component_bytes() as usize));
                edit(&storage, name, |b| b[at] ^= 1 << bit);
                let bank = read_only(&storage);
                let what = format!("{precision:?} {name} byte {at} bit {bit}");
                let e = answers(&bank).expect_err(&what);
                assert!(e.contains(name) && e.contains("node 2"), "{what}: {e}");
                // A bank that never scanned: stats and rows are unaffected.
                let fresh = read_only(&storage);
                assert_eq!(fresh.stats().unwrap().nodes, u64::from(ROWS), "{what}");
                assert!(fresh.row(2).is_ok(), "{what}");
            }
        }
    }
}

/// A first scan over enough segments that another thread checks node
/// tables ahead of it (`scan::with_tables_ahead`): damage in a later
/// segment's table still fails the scan, naming that segment, on every
/// scan of the process, and rows alone still read.
#[test]
fn a_table_damaged_ahead_of_the_scan_fails_every_scan() {
    const ROWS_PER_SEGMENT: u32 = 1_024;
    let storage = MemStorage::new();
    let mut config = BankConfig::new(DIM as u32);
    config.rows_per_segment = Some(ROWS_PER_SEGMENT);
    let mut bank = Bank::create(Arc::new(storage.clone()), config).unwrap();
    let rows = (24 * ROWS_PER_SEGMENT) as usize;
    let changes: Vec<Change> = (0..rows).map(|i| Change::Insert(root_node(i, embedding(i)))).collect();
    bank.load(&changes).unwrap();
    bank.close().unwrap();
    read_only(&storage)
        .query("task", &embedding(3), &options())
        .expect("the undamaged bank answers");
    // A bit of row 5 of segment 17's node table (its tree field).
    edit(&storage, "nodes-000017.seg", |b| b[5 * ROW_SIZE_BYTES + 9] ^= 4);
    let bank = read_only(&storage);
    for scan in 0..2 {
        let e = bank.query("task", &embedding(3), &options()).unwrap_err().to_string();
        assert!(e.contains("nodes-000017.seg"), "scan {scan}: {e}");
    }
    assert!(bank.row(17 * ROWS_PER_SEGMENT + 6).is_ok());
}

/// A pass wider than the summing kernels (an f32 `query_batch` of more
/// than `MAX_BLOCK` queries, which the register-blocked kernel scores):
/// on a fresh open it still checks every vector it reads, and on an intact
/// bank it answers exactly as one query at a time.
#[test]
fn a_wide_f32_pass_checks_vectors_on_first_read() {
    let wide = deltamem::bank::kernels::MAX_BLOCK * 2 + 3;
    let queries: Vec<Vec<f32>> = (0..wide).map(|i| embedding(i % ROWS as usize)).collect();
    let storage = build(Precision::F32);
    let batch = read_only(&storage).query_batch("task", &queries, &options()).unwrap();
    let fresh = read_only(&storage);
    for (q, got) in queries.iter().zip(&batch) {
        assert_eq!(&fresh.query("task", q, &options()).unwrap(), got);
    }
    for node in [0usize, 2, 5] {
        let storage = build(Precision::F32);
        let name = format!("vectors-{:06}.seg", node / 4);
        let at = (node % 4) * stride(Precision::F32) + 9;
        edit(&storage, &name, |b| b[at] ^= 0x10);
        let e = read_only(&storage)
            .query_batch("task", &queries, &options())
            .expect_err("a flipped bit in a wide pass");
        let e = e.to_string();
        assert!(e.contains(&name) && e.contains(&format!("node {node}")), "{e}");
    }
}

/// A vector whose CRC still matches but whose row claims another lane sum
/// (a forged row, fresh row CRC): the scan's check refuses it; the CRC
/// paths (a single read) accept the vector, and `verify` names the field.
#[test]
fn a_wrong_lane_sum_under_a_valid_crc_fails_the_scan_and_verify_names_it() {
    for precision in [Precision::F32, Precision::F16, Precision::Int8] {
        type Forge = fn(&mut Row);
        let sums: [(&str, Forge); 2] = [
            ("vector_sum32", |r| r.vector_sum32 ^= 1 << 20),
            ("qvector_sum32", |r| r.qvector_sum32 ^= 1),
        ];
        for (field, forge) in sums {
            if field == "qvector_sum32" && precision != Precision::Int8 {
                continue;
            }
            let storage = build(precision);
            forge_row(&storage, 1, forge);
            let bank = read_only(&storage);
            let what = format!("{precision:?} {field}");
            assert!(bank.vector(1).is_ok(), "{what}: the CRC path reads it");
            let e = answers(&bank).expect_err(&what);
            assert!(e.contains("node 1") && e.contains("lane sum"), "{what}: {e}");
            let report = bank.verify().unwrap();
            assert!(
                report
                    .problems
                    .iter()
                    .any(|p| p.file.ends_with("nodes-000000.seg") && p.detail.contains(field)),
                "{what}: {:?}",
                report.problems
            );
        }
    }
}

/// Two words of a vector 16 words apart (one lane) swapped: the lane sum
/// cannot see it (FORMAT.md says so), the CRC does: a single read,
/// `verify` and `compact` (which copies vectors after their CRC check)
/// refuse it.
#[test]
fn damage_that_keeps_the_lane_sum_is_caught_by_every_crc_path() {
    for precision in [Precision::F32, Precision::F16] {
        let storage = build(precision);
        let at = 3 * stride(precision);
        edit(&storage, "vectors-000000.seg", |b| {
            let (first, second) = (b[at..at + 4].to_vec(), b[at + 64..at + 68].to_vec());
            assert_ne!(first, second, "the test needs two different words");
            b[at..at + 4].copy_from_slice(&second);
            b[at + 64..at + 68].copy_from_slice(&first);
        });
        let bank = read_only(&storage);
        let e = bank.vector(3).unwrap_err().to_string();
        assert!(
            e.contains("vectors-000000.seg") && e.contains("node 3"),
            "{precision:?}: {e}"
        );
        let report = bank.verify().unwrap();
        assert!(
            report
                .problems
                .iter()
                .any(|p| p.file.ends_with("vectors-000000.seg") && p.offset_bytes == at as u64),
            "{precision:?}: {:?}",
            report.problems
        );
        drop(bank);
        let mut writer = Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap();
        let e = writer.compact().unwrap_err().to_string();
        assert!(e.contains("node 3"), "{precision:?}: {e}");
    }
}

/// Turns a bank written by this build into the format-1 bank an older
/// build wrote: manifest version 1, every row's lane sums zero.
fn downgrade_to_format_1(storage: &MemStorage) {
    edit(storage, "MANIFEST", |b| {
        let mut m = Manifest::decode(b).unwrap();
        m.version = 1;
        *b = m.encode().to_vec();
    });
    for index in 0..ROWS {
        forge_row(storage, index, |r| {
            r.vector_sum32 = 0;
            r.qvector_sum32 = 0;
        });
    }
}

fn manifest(storage: &MemStorage) -> Manifest {
    Manifest::decode(&storage.file_bytes("MANIFEST").unwrap()).unwrap()
}

/// A format-1 bank answers as before, its scan falls back to the CRC
/// (catching a swap the lane sum would miss), a writer keeps it at
/// format 1 (so an older build can still open it), and `compact` upgrades
/// it to format 2 with the same answers.
#[test]
fn format_1_banks_are_read_written_and_upgraded_by_compact() {
    for precision in [Precision::F32, Precision::F16, Precision::Int8] {
        let storage = build(precision);
        let want = answers(&read_only(&storage)).unwrap();
        downgrade_to_format_1(&storage);
        assert_eq!(answers(&read_only(&storage)).unwrap(), want, "{precision:?}");

        let damaged = MemStorage::new();
        for name in storage.file_names() {
            damaged.set_file_bytes(&name, storage.file_bytes(&name).unwrap());
        }
        let at = 3 * stride(precision);
        edit(&damaged, "vectors-000000.seg", |b| {
            let second = b[at + 64..at + 68].to_vec();
            b.copy_within(at..at + 4, at + 64);
            b[at..at + 4].copy_from_slice(&second);
        });
        let e = answers(&read_only(&damaged)).unwrap_err();
        assert!(e.contains("node 3") && e.contains("checksum"), "{precision:?}: {e}");

        // A non-zero lane sum in a format-1 row is a reserved byte.
        forge_row(&damaged, 5, |r| r.vector_sum32 = 7);
        let e = read_only(&damaged).row(5).unwrap_err().to_string();
        assert!(
            e.contains("nodes-000001.seg") && e.contains("must be zero"),
            "{precision:?}: {e}"
        );

        let mut writer = Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap();
        writer.success_hit(0).unwrap();
        writer.checkpoint().unwrap();
        assert_eq!(
            manifest(&storage).version,
            1,
            "{precision:?}: a checkpoint keeps the version"
        );
        assert_eq!(writer.row(0).unwrap().vector_sum32, 0);
        writer.compact().unwrap();
        writer.close().unwrap();
        let upgraded = manifest(&storage);
        assert_eq!(upgraded.version, 2, "{precision:?}");
        let bank = read_only(&storage);
        assert!(bank.row(0).unwrap().vector_sum32 != 0, "{precision:?}");
        assert_eq!(answers(&bank).unwrap(), want, "{precision:?}");
        assert!(bank.verify().unwrap().problems.is_empty(), "{precision:?}");
    }
}

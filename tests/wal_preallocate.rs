//! The WAL is zero-filled ahead of small records (FORMAT.md §6 step 2), so
//! a durable insert's fdatasync overwrites blocks that already exist
//! instead of growing the file. These tests check the bytes on disk and
//! that recovery reads such a log exactly: zeros end it, a torn record in
//! them is cut off, and the log goes on after both.

use std::collections::BTreeMap;
use std::sync::Arc;

use deltamem::storage::wal::{WAL_PREALLOCATE_STEP_BYTES, preallocated_end, scan};
use deltamem::storage::{MemStorage, Storage};
use deltamem::{Attach, Bank, BankConfig, Label, NewNode, OpenOptions, Payload};

const STEP: usize = WAL_PREALLOCATE_STEP_BYTES as usize;

fn node(k: usize) -> NewNode {
    let mut embedding = vec![0.1f32; 8];
    embedding[k % 8] = 1.0;
    NewNode {
        tree: "task".into(),
        attach: Attach::Root,
        label: Label::Success,
        payload: Payload {
            scenario: format!("scenario {k}"),
            fields: BTreeMap::from([("step".to_string(), format!("do {k}"))]),
        },
        embedding,
        external_id: None,
    }
}

fn open(storage: &MemStorage, read_only: bool) -> Bank {
    let options = OpenOptions {
        read_only,
        ..OpenOptions::default()
    };
    Bank::open(Arc::new(storage.clone()), options).unwrap()
}

/// The scenarios of every node, in index order.
fn scenarios(bank: &Bank) -> Vec<String> {
    (0..bank.node_count())
        .map(|i| bank.payload(i).unwrap().scenario)
        .collect()
}

fn expected(count: usize) -> Vec<String> {
    (0..count).map(|k| format!("scenario {k}")).collect()
}

/// Where the records of the WAL end (the scan's valid end).
fn records_end(storage: &MemStorage) -> usize {
    let wal = scan(&*Arc::new(storage.clone()) as &dyn Storage).unwrap();
    assert!(wal.stop_reason.is_none(), "{:?}", wal.stop_reason);
    wal.valid_end_bytes as usize
}

/// A bank holding nodes 0..count in its WAL only (dropped, never closed:
/// no checkpoint).
fn crashed_after_inserts(count: usize) -> MemStorage {
    let storage = MemStorage::new();
    let mut bank = Bank::create(Arc::new(storage.clone()), BankConfig::new(8)).unwrap();
    for k in 0..count {
        bank.insert(node(k)).unwrap();
    }
    drop(bank);
    storage
}

#[test]
fn small_records_overwrite_zeros_written_ahead_and_survive_reopen() {
    let storage = crashed_after_inserts(3);
    let wal = storage.file_bytes("wal.log").unwrap();
    let end = records_end(&storage);
    assert!(end > 64 && wal.len() > end, "zeros written ahead");
    assert_eq!(wal.len() % 4096, 0);
    assert!(wal[end..].iter().all(|&b| b == 0));

    // A writer keeps the zeros and writes its records over them.
    let mut bank = open(&storage, false);
    assert_eq!(scenarios(&bank), expected(3));
    assert_eq!(storage.file_bytes("wal.log").unwrap().len(), wal.len(), "zeros kept");
    // Records fill the zeros; the file grows only with the record that
    // no longer fits in them. Bounded: the zeros hold a few dozen.
    let mut k = 3;
    for _ in 0..1000 {
        bank.insert(node(k)).unwrap();
        k += 1;
        if records_end(&storage) > wal.len() {
            break;
        }
        assert_eq!(storage.file_bytes("wal.log").unwrap().len(), wal.len(), "grew early");
    }
    assert!(k > 4, "several records went into the zeros");
    assert!(bank.verify().unwrap().is_ok());
    drop(bank);
    let grown = storage.file_bytes("wal.log").unwrap().len();
    let end_now = records_end(&storage);
    assert!(end_now > wal.len() && grown == preallocated_end(end_now as u64) as usize);
    let reader = open(&storage, true);
    assert_eq!(scenarios(&reader), expected(k));
    assert!(reader.verify().unwrap().is_ok());
}

/// Zeros ahead double a small log and then grow by at most a step.
#[test]
fn zeros_ahead_double_a_small_log_and_then_grow_by_steps() {
    assert_eq!(preallocated_end(100), 4096);
    assert_eq!(preallocated_end(5000), 12288);
    assert_eq!(preallocated_end(STEP as u64), 2 * STEP as u64);
    assert_eq!(preallocated_end(10 * STEP as u64 + 1), 11 * STEP as u64 + 4096);
}

#[test]
fn a_record_torn_inside_the_zeros_is_cut_off_and_the_log_goes_on() {
    let storage = crashed_after_inserts(2);
    // The start of a third record reached the disk, the rest did not.
    let end = records_end(&storage);
    let mut wal = storage.file_bytes("wal.log").unwrap();
    wal[end..end + 40].fill(0xA5);
    storage.set_file_bytes("wal.log", wal);
    let torn = scan(&*Arc::new(storage.clone()) as &dyn Storage).unwrap();
    assert!(torn.stop_reason.is_some() && torn.damage.is_none(), "a torn tail");

    let mut bank = open(&storage, false);
    assert_eq!(scenarios(&bank), expected(2));
    assert_eq!(
        storage.file_bytes("wal.log").unwrap().len(),
        end,
        "the torn tail is cut off"
    );
    bank.insert(node(2)).unwrap();
    drop(bank);
    let wal = storage.file_bytes("wal.log").unwrap();
    let end_now = records_end(&storage);
    assert!(
        end_now > end && wal.len() == preallocated_end(end_now as u64) as usize,
        "zeros ahead again"
    );
    assert_eq!(scenarios(&open(&storage, true)), expected(3));
}

#[test]
fn large_records_are_written_without_zeros_after_them() {
    let storage = MemStorage::new();
    let mut bank = Bank::create(Arc::new(storage.clone()), BankConfig::new(8)).unwrap();
    // About 4,000 nodes of ~100 bytes each: one record past a quarter step.
    let nodes: Vec<NewNode> = (0..4000).map(node).collect();
    bank.insert_batch(&nodes, None).unwrap();
    drop(bank);
    let wal = storage.file_bytes("wal.log").unwrap();
    assert!(wal.len() > STEP / 4 && wal.len() == records_end(&storage));
    assert_eq!(scenarios(&open(&storage, true)), expected(4000));
}

/// A writer that recycles (`Bank::recycle_wals`, as `deltamem serve`
/// does) starts each checkpoint's WAL in the same file: its length stays,
/// the records after the new header are the old generation's (not
/// zeros), new records go over them without growing the file, and every
/// open reads exactly the new generation's records.
#[test]
fn a_recycled_wal_keeps_its_file_and_reads_back_only_the_new_generation() {
    let storage = MemStorage::new();
    let mut bank = Bank::create(Arc::new(storage.clone()), BankConfig::new(8)).unwrap();
    bank.recycle_wals(true);
    for k in 0..40 {
        bank.insert(node(k)).unwrap();
    }
    let before = storage.file_bytes("wal.log").unwrap();
    bank.checkpoint().unwrap();
    let recycled = storage.file_bytes("wal.log").unwrap();
    assert_eq!(recycled.len(), before.len(), "the same file, not a new one");
    let scanned = scan(&*Arc::new(storage.clone()) as &dyn Storage).unwrap();
    assert!(
        scanned.records.is_empty() && scanned.valid_end_bytes == 64,
        "no record of the new generation"
    );
    assert!(
        scanned.damage.is_none(),
        "the old records end the scan as a torn tail does"
    );
    assert_eq!(
        recycled[64..],
        before[64..],
        "the old records are left to be written over"
    );
    assert!(recycled[64..].iter().any(|&b| b != 0));
    for k in 40..60 {
        bank.insert(node(k)).unwrap();
    }
    assert_eq!(
        storage.file_bytes("wal.log").unwrap().len(),
        before.len(),
        "no zeros written ahead"
    );
    drop(bank); // a crash: no close, no checkpoint
    let reader = open(&storage, true);
    assert_eq!(scenarios(&reader), expected(60));
    assert!(reader.verify().unwrap().is_ok());
    drop(reader);
    let mut writer = open(&storage, false);
    assert_eq!(scenarios(&writer), expected(60));
    writer.insert(node(60)).unwrap();
    writer.close().unwrap();
    assert_eq!(scenarios(&open(&storage, true)), expected(61));
}

/// `close` leaves a WAL of its header alone even while recycling.
#[test]
fn a_closed_bank_s_wal_is_its_header_alone_even_when_recycling() {
    let storage = MemStorage::new();
    let mut bank = Bank::create(Arc::new(storage.clone()), BankConfig::new(8)).unwrap();
    bank.recycle_wals(true);
    for k in 0..20 {
        bank.insert(node(k)).unwrap();
    }
    bank.close().unwrap();
    assert_eq!(storage.file_bytes("wal.log").unwrap().len(), 64);
    assert_eq!(scenarios(&open(&storage, true)), expected(20));
}

/// A bank whose checkpoint recycled its WAL and stopped: 30 nodes in the
/// data files, the WAL's new header over the 30 old records; `more` nodes
/// inserted after it.
fn recycled_then_stopped(more: usize) -> MemStorage {
    let storage = MemStorage::new();
    let mut bank = Bank::create(Arc::new(storage.clone()), BankConfig::new(8)).unwrap();
    bank.recycle_wals(true);
    for k in 0..30 {
        bank.insert(node(k)).unwrap();
    }
    bank.checkpoint().unwrap();
    for k in 30..30 + more {
        bank.insert(node(k)).unwrap();
    }
    drop(bank);
    storage
}

fn tear_header(storage: &MemStorage) {
    let mut wal = storage.file_bytes("wal.log").unwrap();
    wal[20] ^= 0x40; // inside the salt: the header's CRC fails
    storage.set_file_bytes("wal.log", wal);
}

/// A header torn while a checkpoint recycled the WAL (no record of the new
/// generation yet) reads as the stale WAL it replaced: the checkpoint
/// holds everything, and a writer starts a new WAL.
#[test]
fn a_torn_header_over_no_live_record_reads_as_the_stale_wal() {
    let storage = recycled_then_stopped(0);
    tear_header(&storage);
    let reader = open(&storage, true);
    assert_eq!(scenarios(&reader), expected(30));
    assert!(reader.verify().unwrap().is_ok());
    drop(reader);
    let mut writer = open(&storage, false);
    writer.insert(node(30)).unwrap();
    drop(writer);
    assert_eq!(scenarios(&open(&storage, true)), expected(31));
}

/// The same damage over a record of the new generation is a damaged live
/// WAL: refused, naming the header, never read as stale (which would lose
/// the record).
#[test]
fn a_damaged_header_over_a_live_record_is_refused() {
    let storage = recycled_then_stopped(2);
    tear_header(&storage);
    for read_only in [true, false] {
        let options = OpenOptions {
            read_only,
            ..OpenOptions::default()
        };
        let refused = Bank::open(Arc::new(storage.clone()), options).err().expect("refused");
        assert!(refused.to_string().contains("WAL header"), "{refused}");
    }
}

/// A header of another format version over live records is never read as
/// a torn recycle (it would be replaced, its records dropped): refused,
/// naming the version.
#[test]
fn a_wal_header_of_another_version_over_live_records_is_refused() {
    let storage = recycled_then_stopped(2);
    let mut wal = storage.file_bytes("wal.log").unwrap();
    wal[8] = 2; // version 2, CRC then recomputed: a newer build's header
    let crc = crc32fast::hash(&wal[..60]);
    wal[60..64].copy_from_slice(&crc.to_le_bytes());
    storage.set_file_bytes("wal.log", wal);
    let refused = Bank::open(Arc::new(storage.clone()), OpenOptions::default())
        .err()
        .expect("refused");
    assert!(refused.to_string().contains("version"), "{refused}");
    // Nothing was replaced: the records are still there.
    assert_eq!(storage.file_bytes("wal.log").unwrap()[8], 2);
}

/// `close` after recycling with nothing left to checkpoint (the overlay
/// empty, so no new WAL is started) still leaves a WAL of its header alone.
#[test]
fn close_cuts_a_recycled_wal_with_no_record_to_its_header() {
    let storage = MemStorage::new();
    let mut bank = Bank::create(Arc::new(storage.clone()), BankConfig::new(8)).unwrap();
    bank.recycle_wals(true);
    for k in 0..20 {
        bank.insert(node(k)).unwrap();
    }
    bank.checkpoint().unwrap();
    assert!(
        storage.file_bytes("wal.log").unwrap().len() > 64,
        "recycled, old records kept"
    );
    bank.close().unwrap();
    assert_eq!(storage.file_bytes("wal.log").unwrap().len(), 64);
    assert_eq!(scenarios(&open(&storage, true)), expected(20));
}

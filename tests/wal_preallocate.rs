//! The WAL is zero-filled ahead of small records (FORMAT.md §6 step 2), so
//! a durable insert's fdatasync overwrites blocks that already exist
//! instead of growing the file. These tests check the bytes on disk and
//! that recovery reads such a log exactly: zeros end it, a torn record in
//! them is cut off, and the log goes on after both.

use std::collections::BTreeMap;
use std::sync::Arc;

use deltamem::storage::wal::{WAL_PREALLOCATE_STEP_BYTES, scan};
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

#[test]
fn small_records_overwrite_zeros_written_ahead_and_survive_reopen() {
    let storage = MemStorage::new();
    let mut bank = Bank::create(Arc::new(storage.clone()), BankConfig::new(8)).unwrap();
    for k in 0..3 {
        bank.insert(node(k)).unwrap();
    }
    drop(bank); // no checkpoint: the nodes live in the WAL only
    let wal = storage.file_bytes("wal.log").unwrap();
    let end = records_end(&storage);
    assert_eq!(wal.len(), STEP, "one step of zeros written ahead");
    assert!(end > 64 && wal[end..].iter().all(|&b| b == 0));

    // A writer keeps the zeros and writes its records over them.
    let mut bank = open(&storage, false);
    assert_eq!(scenarios(&bank), expected(3));
    assert_eq!(storage.file_bytes("wal.log").unwrap().len(), STEP, "zeros kept");
    for k in 3..5 {
        bank.insert(node(k)).unwrap();
    }
    assert!(bank.verify().unwrap().is_ok());
    drop(bank);
    assert_eq!(storage.file_bytes("wal.log").unwrap().len(), STEP);
    assert!(records_end(&storage) > end);
    let reader = open(&storage, true);
    assert_eq!(scenarios(&reader), expected(5));
    assert!(reader.verify().unwrap().is_ok());
}

#[test]
fn a_record_torn_inside_the_zeros_is_cut_off_and_the_log_goes_on() {
    let storage = MemStorage::new();
    let mut bank = Bank::create(Arc::new(storage.clone()), BankConfig::new(8)).unwrap();
    for k in 0..2 {
        bank.insert(node(k)).unwrap();
    }
    drop(bank);
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
    assert_eq!(wal.len(), STEP, "zeros written ahead again");
    assert!(records_end(&storage) > end);
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

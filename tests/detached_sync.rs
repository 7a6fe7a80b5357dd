//! `Bank::detach_sync` / `finish_sync`: the fsync a server runs outside its
//! lock makes exactly the writes before it durable, and a failed one
//! poisons the bank like a failed `sync`.

mod common;

use std::sync::Arc;

use common::crashkit::root_node;
use deltamem::storage::{FaultKind, FaultPlan, Loss, SimStorage};
use deltamem::{Bank, BankConfig, NewNode, OpenOptions, SyncPolicy};

fn node(i: usize) -> NewNode {
    let mut embedding = vec![0.0; 4];
    embedding[i % 4] = 1.0;
    embedding[(i + 1) % 4] = i as f32;
    root_node(i, embedding)
}

fn count_after_power_loss(storage: &SimStorage) -> u32 {
    let image = storage.crash_image(Loss::LoseUnsynced);
    Bank::open(Arc::new(image), OpenOptions::default())
        .unwrap()
        .node_count()
}

#[test]
fn a_detached_sync_makes_the_writes_before_it_durable() {
    let storage = SimStorage::new();
    let mut bank = Bank::create(Arc::new(storage.clone()), BankConfig::new(4)).unwrap();
    assert!(bank.detach_sync().unwrap().is_none(), "nothing to sync yet");
    for i in 0..3 {
        bank.insert_with(node(i), Some(SyncPolicy::None)).unwrap();
    }
    assert_eq!(count_after_power_loss(&storage), 0, "unsynced inserts are lost");
    let pending = bank.detach_sync().unwrap().expect("three unsynced records");
    // A write after the detach is not covered by it.
    bank.insert_with(node(3), Some(SyncPolicy::None)).unwrap();
    let before = bank.durable_below_lsn();
    let outcome = pending.run();
    bank.finish_sync(&pending, outcome).unwrap();
    assert_eq!(bank.durable_below_lsn(), pending.below_lsn());
    assert!(bank.durable_below_lsn() > before);
    // The fourth write reached the file before the fsync ran, so the
    // image may hold it; the first three must be there.
    assert!(count_after_power_loss(&storage) >= 3);
    let last = bank.detach_sync().unwrap().expect("the fourth record");
    let outcome = last.run();
    bank.finish_sync(&last, outcome).unwrap();
    assert_eq!(count_after_power_loss(&storage), 4);
}

#[test]
fn a_failed_detached_sync_poisons_the_bank() {
    let storage = SimStorage::new();
    let mut bank = Bank::create(Arc::new(storage.clone()), BankConfig::new(4)).unwrap();
    bank.insert_with(node(0), Some(SyncPolicy::None)).unwrap();
    let pending = bank.detach_sync().unwrap().unwrap();
    storage.set_plan(Some(FaultPlan {
        at_op: storage.op_count(),
        kind: FaultKind::Fail,
    }));
    let outcome = pending.run();
    storage.set_plan(None);
    assert!(outcome.is_err(), "the planned fault hits the fsync");
    assert!(bank.finish_sync(&pending, outcome).is_err());
    let refused = bank.insert(node(1)).unwrap_err();
    assert!(refused.to_string().contains("fsync"), "{refused}");
    assert_eq!(count_after_power_loss(&storage), 0);
}

#[test]
fn a_sync_overtaken_by_a_checkpoint_changes_nothing() {
    let storage = SimStorage::new();
    let mut bank = Bank::create(Arc::new(storage.clone()), BankConfig::new(4)).unwrap();
    bank.insert_with(node(0), Some(SyncPolicy::None)).unwrap();
    let pending = bank.detach_sync().unwrap().unwrap();
    bank.checkpoint().unwrap();
    let after_checkpoint = bank.durable_below_lsn();
    let outcome = pending.run();
    bank.finish_sync(&pending, outcome).unwrap();
    assert_eq!(
        bank.durable_below_lsn(),
        after_checkpoint,
        "the new WAL generation is untouched"
    );
    assert_eq!(count_after_power_loss(&storage), 1);
}

/// Commits run through `commit_gathered` write their WAL records in one
/// write when it returns, and until then no detached fsync claims them:
/// one taken inside covers only what was written before.
#[test]
fn gathered_commits_are_written_once_and_claimed_durable_only_after() {
    let storage = SimStorage::new();
    let mut bank = Bank::create(Arc::new(storage.clone()), BankConfig::new(4)).unwrap();
    bank.insert_with(node(0), Some(SyncPolicy::None)).unwrap();
    let ops_before = storage.op_count();
    let (inside, written) = bank.commit_gathered(|bank| {
        for i in 1..6 {
            bank.insert_with(node(i), Some(SyncPolicy::None)).unwrap();
        }
        let pending = bank.detach_sync().unwrap().expect("node 0's record is written");
        (storage.op_count(), pending.below_lsn())
    });
    written.unwrap();
    let (ops_inside, covered_below) = inside;
    assert_eq!(ops_inside, ops_before, "nothing written while gathering");
    assert_eq!(storage.op_count(), ops_before + 1, "five records, one write");
    assert_eq!(covered_below, 2, "the fsync taken inside covers node 0 only");
    assert_eq!(count_after_power_loss(&storage), 0, "nothing synced yet");
    let pending = bank.detach_sync().unwrap().expect("six written records");
    assert_eq!(pending.below_lsn(), 7);
    let outcome = pending.run();
    bank.finish_sync(&pending, outcome).unwrap();
    assert_eq!(count_after_power_loss(&storage), 6);
}

/// A gathered write that fails poisons the bank: the commits it held are
/// applied but in no file, so no later sync may call them durable.
#[test]
fn a_failed_gathered_write_poisons_the_bank() {
    let storage = SimStorage::new();
    let mut bank = Bank::create(Arc::new(storage.clone()), BankConfig::new(4)).unwrap();
    bank.insert(node(0)).unwrap();
    let ((), written) = bank.commit_gathered(|bank| {
        for i in 1..4 {
            bank.insert_with(node(i), Some(SyncPolicy::None)).unwrap();
        }
        storage.set_plan(Some(FaultPlan {
            at_op: storage.op_count(),
            kind: FaultKind::Fail,
        }));
    });
    storage.set_plan(None);
    assert!(written.is_err(), "the planned fault hits the gathered write");
    assert!(bank.detach_sync().is_err(), "no fsync may claim them");
    assert!(bank.sync().is_err());
    assert!(bank.insert(node(4)).is_err(), "further writes are refused");
    assert_eq!(count_after_power_loss(&storage), 1, "only the synced node");
}

/// Gathered records written ahead of a large record whose write fails
/// with them: the batch is reported unwritten, not only the large record
/// (under `none` a server answers the small ones at once otherwise).
#[test]
fn a_write_failing_inside_a_gathered_batch_fails_the_batch() {
    let storage = SimStorage::new();
    let mut bank = Bank::create(Arc::new(storage.clone()), BankConfig::new(4)).unwrap();
    bank.insert(node(0)).unwrap();
    let big: Vec<NewNode> = (0..2500).map(node).collect(); // a record past 256 KiB
    let (results, written) = bank.commit_gathered(|bank| {
        let small = bank.insert_with(node(1), Some(SyncPolicy::None)).is_ok();
        storage.set_plan(Some(FaultPlan {
            at_op: storage.op_count(),
            kind: FaultKind::Fail,
        }));
        let large = bank.insert_batch(&big, Some(SyncPolicy::None)).is_ok();
        storage.set_plan(None);
        (small, large)
    });
    assert_eq!(
        results,
        (true, false),
        "the small commit was applied, the large one refused"
    );
    assert!(written.is_err(), "the small commit's record is in no file");
    assert!(bank.detach_sync().is_err());
}

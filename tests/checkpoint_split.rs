//! The checkpoint in two halves (`prepare_checkpoint` on a shared borrow,
//! `publish_checkpoint` on the exclusive one): readers of a shared bank
//! run while the long half writes, and a write between the halves is not
//! lost. Crash points inside and between the halves are enumerated by
//! tests/crash.rs (`Op::Checkpoint`, `Op::CheckpointAround`).

mod common;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use common::crashkit::root_node;
use deltamem::storage::{GatedStorage, SimStorage};
use deltamem::{Bank, BankConfig, NewNode, OpenOptions, QueryOptions};

fn node(i: usize) -> NewNode {
    let mut embedding = vec![0.1; 4];
    embedding[i % 4] = 1.0 + i as f32;
    root_node(i, embedding)
}

/// Node `i`'s query finds node `i` first.
fn finds(bank: &Bank, i: usize) -> bool {
    let found = bank
        .query("task", &node(i).embedding, &QueryOptions::default())
        .unwrap();
    found.first().is_some_and(|m| m.id as usize == i)
}

/// A checkpoint stopped at its vector write (no timing: a gated storage)
/// holds only the shared lock: `try_read` succeeds, and a query on this
/// thread and on another one answer from the state before the checkpoint,
/// new nodes (overlay) and a hit on a checkpointed row included. After it
/// completes, a reopen holds the same state with nothing left in the WAL.
#[test]
fn readers_run_while_the_checkpoint_writes_vectors() {
    let sim = SimStorage::new();
    let gated = GatedStorage::new(sim.clone(), "vectors-");
    let gate = gated.control();
    let mut bank = Bank::create(Arc::new(gated), BankConfig::new(4)).unwrap();
    for i in 0..4 {
        bank.insert(node(i)).unwrap();
    }
    bank.checkpoint().unwrap();
    for i in 4..9 {
        bank.insert(node(i)).unwrap();
    }
    bank.success_hit(1).unwrap();
    let shared = Arc::new(RwLock::new(bank));
    gate.arm();
    let writer = {
        let shared = shared.clone();
        std::thread::spawn(move || {
            let prepared = shared.read().unwrap().prepare_checkpoint();
            shared.write().unwrap().publish_checkpoint(prepared)
        })
    };
    assert!(
        gate.wait_held(Duration::from_secs(20)),
        "the checkpoint never wrote vectors"
    );
    {
        let bank = shared.try_read().expect("a reader waits for the checkpoint's writes");
        assert!((0..9).all(|i| finds(&bank, i)));
        assert_eq!(bank.row(1).unwrap().success_hits, 1);
        assert_eq!(bank.stats().unwrap().checkpointed_nodes, 4);
    }
    let other = {
        let shared = shared.clone();
        std::thread::spawn(move || finds(&shared.read().unwrap(), 7))
    };
    assert!(other.join().unwrap(), "a query on another thread during the checkpoint");
    gate.release();
    writer.join().unwrap().unwrap();
    assert_eq!(shared.read().unwrap().stats().unwrap().checkpointed_nodes, 9);
    drop(shared);
    let reopened = Bank::open(Arc::new(sim), OpenOptions::default()).unwrap();
    let stats = reopened.stats().unwrap();
    assert_eq!((stats.nodes, stats.checkpointed_nodes), (9, 9));
    assert!((0..9).all(|i| finds(&reopened, i)));
    assert_eq!(reopened.row(1).unwrap().success_hits, 1);
    assert!(reopened.verify().unwrap().problems.is_empty());
}

/// A write between the halves: the publish sees that the prepared bytes
/// no longer cover the overlay and writes the new nodes whole, so the
/// manifest never counts a node whose row and vector were not written.
#[test]
fn a_write_between_prepare_and_publish_is_checkpointed_too() {
    let sim = SimStorage::new();
    let mut bank = Bank::create(Arc::new(sim.clone()), BankConfig::new(4)).unwrap();
    bank.insert(node(0)).unwrap();
    let prepared = bank.prepare_checkpoint();
    bank.insert(node(1)).unwrap();
    bank.success_hit(0).unwrap();
    bank.publish_checkpoint(prepared).unwrap();
    drop(bank);
    let reopened = Bank::open(Arc::new(sim), OpenOptions::default()).unwrap();
    let stats = reopened.stats().unwrap();
    assert_eq!((stats.nodes, stats.checkpointed_nodes), (2, 2));
    assert!(finds(&reopened, 0) && finds(&reopened, 1));
    assert_eq!(reopened.row(0).unwrap().success_hits, 1);
    assert!(reopened.verify().unwrap().problems.is_empty());
}

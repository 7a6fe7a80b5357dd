//! Crash-point enumeration over the simulated store.
//!
//! For each seeded workload: a reference run records a digest of the
//! bank's whole state after every operation (the ledger of committed
//! states). Then, for every I/O operation k of the workload, the workload
//! is run again with operation k (a) crashing the machine, recovered under
//! four loss models, and (b) failing with EIO, after which the bank must
//! refuse writes and then be recovered under two loss models. Each
//! recovery must open, pass `verify`, equal a ledger state that includes
//! every acknowledged operation, and accept new writes. A sample of crash
//! points also crashes again during recovery (compound crashes).
//!
//! `DELTAMEM_CRASH_SEEDS` sets the number of workloads (default 48).

mod common;

use common::crashkit::*;
use deltamem::SyncPolicy;
use deltamem::storage::{FaultKind, FaultPlan, Loss, SimStorage};

/// Crash points, recoveries checked, compound crash points and poisoned-bank
/// checks of one seeded workload.
fn crash_seed(seed: u64) -> [u64; 4] {
    let (mut points, mut variants, mut compounds, mut poison_checks) = (0u64, 0u64, 0u64, 0u64);
    let ledger = ledger(seed);
    let policy = if seed % 4 == 3 {
        SyncPolicy::Batch {
            records: 3,
            interval_ms: u64::MAX,
        }
    } else {
        SyncPolicy::Always
    };
    for k in 0..ledger.io_ops {
        points += 1;
        let storage = SimStorage::new();
        storage.set_plan(Some(FaultPlan {
            at_op: k,
            kind: FaultKind::Crash,
        }));
        let out = drive(&storage, &ledger.ops, policy);
        for loss in [
            Loss::KeepAll,
            Loss::LoseUnsynced,
            Loss::TornLast { seed: k },
            Loss::Subset { seed: k ^ seed },
        ] {
            variants += 1;
            check_recovery(
                &ledger,
                &storage.crash_image(loss),
                &out,
                &format!("seed {seed} crash at op {k} {loss:?}"),
            );
        }
        if k % 16 == 0 {
            compounds += compound(
                &ledger,
                &storage.crash_image(Loss::KeepAll),
                &out,
                &format!("seed {seed} k {k}"),
            );
        }

        let storage = SimStorage::new();
        storage.set_plan(Some(FaultPlan {
            at_op: k,
            kind: FaultKind::Fail,
        }));
        let out = drive(&storage, &ledger.ops, policy);
        poison_checks += u64::from(out.poison_checked);
        for loss in [Loss::KeepAll, Loss::LoseUnsynced] {
            variants += 1;
            check_recovery(
                &ledger,
                &storage.crash_image(loss),
                &out,
                &format!("seed {seed} EIO at op {k} {loss:?}"),
            );
        }
    }
    [points, variants, compounds, poison_checks]
}

fn env_seeds(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

#[test]
fn every_crash_point_recovers_to_an_acknowledged_prefix() {
    let seeds = env_seeds("DELTAMEM_CRASH_SEEDS", 48);
    let mut total = [0u64; 4];
    for seed in 0..seeds {
        let counts = crash_seed(seed);
        total.iter_mut().zip(counts).for_each(|(t, c)| *t += c);
    }
    let [points, variants, compounds, poison_checks] = total;
    println!(
        "crash points {points}, recoveries checked {variants}, compound crash points {compounds}, poisoned-bank checks {poison_checks}"
    );
    assert!(
        seeds < 48 || points >= 10_000,
        "CI-sized run must cover at least 10,000 crash points, got {points}"
    );
}

/// The same enumeration on f16 banks (the f16 column of record) and int8
/// banks (the derived side column written beside the f32 one), fewer seeds.
/// `DELTAMEM_CRASH_PRECISION_SEEDS` sets the number (default 8).
#[test]
fn reduced_precision_banks_recover_at_every_crash_point() {
    use deltamem::format::manifest::Precision;
    let seeds = env_seeds("DELTAMEM_CRASH_PRECISION_SEEDS", 8);
    let mut points = 0;
    for seed in 0..seeds {
        let precision = if seed % 2 == 0 { Precision::Int8 } else { Precision::F16 };
        PRECISION.with(|p| p.set(precision));
        // Offset seeds: other workloads than the f32 run's.
        points += crash_seed(1000 + seed)[0];
    }
    println!("reduced precision: crash points {points}");
    assert!(seeds == 0 || points > 0);
}

/// Everything observable of a bank, payload offsets and creation times
/// aside (a frozen copy lays its payload log out afresh).
fn frozen_digest(bank: &deltamem::Bank) -> Vec<String> {
    (0..bank.node_count())
        .map(|i| {
            let mut row = bank.row(i).unwrap();
            row.payload_offset_bytes = 0;
            format!("{row:?} {:?} {:?}", bank.payload(i).unwrap(), bank.vector(i).unwrap())
        })
        .collect()
}

/// `freeze` under the simulator: for every I/O operation k of freezing a
/// workload's bank, the freeze crashes at k (four loss models) or fails
/// with EIO there. What the target then holds is nothing, the engine's
/// `FREEZING` mark (unfinished work, safe to delete) or a complete frozen bank that
/// verifies and shows exactly the source's state; never a bank without
/// the mark that is incomplete or different.
#[test]
fn every_freeze_crash_point_leaves_the_mark_or_the_whole_copy() {
    use deltamem::bank::FREEZING_MARK_FILE;
    use deltamem::{Bank, OpenOptions};
    use std::sync::Arc;
    let seeds = env_seeds("DELTAMEM_CRASH_FREEZE_SEEDS", 6);
    let (mut points, mut complete, mut marked) = (0u64, 0u64, 0u64);
    for seed in 0..seeds {
        let source_store = SimStorage::new();
        let out = drive(&source_store, &workload(seed), SyncPolicy::Always);
        assert_eq!(
            out.acked, out.attempted,
            "seed {seed}: the workload runs without faults"
        );
        let read_only = OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        };
        let source = Bank::open(Arc::new(source_store.clone()), read_only.clone()).unwrap();
        let want = frozen_digest(&source);
        let clean = SimStorage::new();
        source.freeze_into(&clean).unwrap();
        for k in 0..clean.op_count() {
            for kind in [FaultKind::Crash, FaultKind::Fail] {
                points += 1;
                let target = SimStorage::new();
                target.set_plan(Some(FaultPlan { at_op: k, kind }));
                assert!(
                    source.freeze_into(&target).is_err(),
                    "seed {seed} op {k}: the fault must surface"
                );
                for loss in [
                    Loss::KeepAll,
                    Loss::LoseUnsynced,
                    Loss::TornLast { seed: k },
                    Loss::Subset { seed: k ^ seed },
                ] {
                    let image = target.crash_image(loss);
                    let what = format!("seed {seed} {kind:?} at op {k} {loss:?}");
                    let names = image.file_names();
                    if names.is_empty() || names.iter().any(|n| n == FREEZING_MARK_FILE) {
                        marked += 1; // nothing yet, or the engine's unfinished work
                        continue;
                    }
                    complete += 1;
                    let copy = Bank::open(Arc::new(image), read_only.clone())
                        .unwrap_or_else(|e| panic!("{what}: no mark, yet no frozen bank: {e}"));
                    assert!(copy.manifest().is_frozen(), "{what}");
                    assert!(copy.verify().unwrap().is_ok(), "{what}");
                    assert_eq!(frozen_digest(&copy), want, "{what}: the copy differs from the source");
                }
            }
        }
    }
    println!("freeze crash points {points}: {marked} images with the mark, {complete} complete copies");
    assert!(seeds == 0 || (marked > 0 && complete > 0));
}

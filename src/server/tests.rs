//! The writer thread's sync policies, driven through `Core` directly.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::core::{Core, WriteOp};
use crate::bank::{Attach, Bank, BankConfig, NewNode, OpenOptions, SyncPolicy};
use crate::format::payload::Payload;
use crate::format::row::Label;

fn node(i: usize) -> NewNode {
    NewNode {
        tree: "task".into(),
        attach: Attach::Root,
        label: Label::Success,
        payload: Payload {
            scenario: format!("node {i}"),
            fields: BTreeMap::new(),
        },
        embedding: vec![1.0, i as f32, 0.5, 0.25],
        external_id: None,
    }
}

/// A new empty bank (dim 4) served by a `Core` under `policy`.
fn served(policy: SyncPolicy) -> (tempfile::TempDir, std::sync::Arc<Core>) {
    let dir = tempfile::tempdir().unwrap();
    Bank::create_dir(dir.path(), BankConfig::new(4))
        .unwrap()
        .close()
        .unwrap();
    let core = Core::open(
        dir.path(),
        policy,
        OpenOptions::default(),
        1,
        std::time::Duration::ZERO,
        || {},
    )
    .unwrap();
    (dir, core)
}

/// Waits (bounded) until the writer has applied `rounds` rounds.
fn applied(core: &Core, rounds: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while core.metrics().write_round_count() < rounds {
        assert!(Instant::now() < deadline, "the writer never applied round {rounds}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Under `batch` the server acknowledges a write after the fsync of its
/// group, as the library defines the policy: two writes applied in two
/// rounds wait, the third reaches the group's record count, and one fsync
/// answers all three. (The server used to fsync every round, as under
/// `always`: three fsyncs.)
#[test]
fn batch_policy_shares_one_fsync_across_rounds() {
    let policy = SyncPolicy::Batch {
        records: 3,
        interval_ms: 3_600_000,
    };
    let (dir, core) = served(policy);
    let mut pending = Vec::new();
    for i in 0..3 {
        pending.push(core.submit(WriteOp::Insert(node(i))).unwrap());
        applied(&core, i as u64 + 1);
    }
    for rx in pending {
        assert!(rx.blocking_recv().unwrap().is_ok());
    }
    assert_eq!(core.metrics().wal_sync_count(), 1, "one fsync for the group of three");
    core.shutdown().unwrap();
    drop(core);
    let bank = Bank::open_dir(dir.path(), Default::default()).unwrap();
    assert_eq!(bank.node_count(), 3);
}

/// Under `always` each round is made durable before its answer.
#[test]
fn always_policy_syncs_every_round() {
    let (_dir, core) = served(SyncPolicy::Always);
    for i in 0..3 {
        let rx = core.submit(WriteOp::Insert(node(i))).unwrap();
        assert!(rx.blocking_recv().unwrap().is_ok());
        assert_eq!(core.metrics().wal_sync_count(), i as u64 + 1);
    }
    core.shutdown().unwrap();
}

/// Readers never wait for a checkpoint (issue 13): the writer thread's
/// automatic checkpoint is stopped at its vector-segment write (a gated
/// storage, no timing), and while it is stopped the bank's lock must be
/// free for readers and a query through the server must answer, seeing
/// every acknowledged node. Then the checkpoint completes: the WAL is
/// empty and a reopen holds every node. (With the checkpoint inside the
/// writer's exclusive section, `try_read` fails here.)
#[test]
fn queries_run_while_the_automatic_checkpoint_writes() {
    use crate::bank::{OpenOptions, QueryOptions};
    use crate::storage::{GatedStorage, SimStorage};
    use std::sync::Arc;
    let sim = SimStorage::new();
    Bank::create(Arc::new(sim.clone()), BankConfig::new(4))
        .unwrap()
        .close()
        .unwrap();
    let gated = GatedStorage::new(sim.clone(), "vectors-");
    let gate = gated.control();
    let options = OpenOptions {
        sync: SyncPolicy::None,
        checkpoint_wal_bytes: 4096,
        ..OpenOptions::default()
    };
    let bank = Bank::open(Arc::new(gated), options.clone()).unwrap();
    let core = Core::serve(bank, SyncPolicy::Always, 1).unwrap();
    gate.arm();
    // Each insert's record is ~200 bytes: the WAL passes 4 KiB within 40.
    // The write that passes it is answered before its checkpoint begins.
    let mut acked = 0;
    loop {
        assert!(
            acked < 200,
            "no checkpoint seen in progress after {acked} inserts (a reader could not look while one ran)"
        );
        core.write_blocking(WriteOp::Insert(node(acked))).unwrap();
        acked += 1;
        if core.lock().read().unwrap().checkpoint_is_due() {
            break;
        }
    }
    assert!(
        gate.wait_held(Duration::from_secs(20)),
        "the checkpoint never wrote vectors"
    );
    let before = core.lock().read().unwrap().stats().unwrap();
    assert_eq!(before.checkpointed_nodes, 0);
    let guard = core.lock().try_read().expect("a reader waits for the checkpoint");
    let answer = guard
        .query("task", &node(acked - 1).embedding, &QueryOptions::default())
        .unwrap();
    assert_eq!(guard.node_count() as usize, acked);
    assert_eq!(answer[0].id as usize, acked - 1);
    drop(guard);
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let reply = runtime
        .block_on(core.query("task", node(0).embedding, QueryOptions::default()))
        .unwrap();
    assert_eq!(reply.matches[0].id, 0);
    // Held 50 ms more, so the prepare half outlasts the publish half.
    std::thread::sleep(Duration::from_millis(50));
    gate.release();
    // /metrics counts it, its held half beside queries, once it is done.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let text = loop {
        let text = core.metrics().render(None);
        if text.contains("deltamem_checkpoints_total 1\n") || std::time::Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(text.contains("deltamem_checkpoints_total 1\n"), "{text}");
    let seconds = |name: &str| -> f64 {
        let line = text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap();
        line[name.len() + 1..].parse().unwrap()
    };
    let (prepare_s, publish_s) = (
        seconds("deltamem_checkpoint_prepare_seconds_total"),
        seconds("deltamem_checkpoint_publish_seconds_total"),
    );
    assert!(
        prepare_s > publish_s,
        "the gate held the prepare half: {prepare_s} vs {publish_s}"
    );
    assert_eq!(seconds("deltamem_checkpoint_publish_seconds_max"), publish_s);
    core.shutdown().unwrap();
    drop(core);
    let reopened = Bank::open(Arc::new(sim), options).unwrap();
    let after = reopened.stats().unwrap();
    assert_eq!(
        (after.nodes as usize, after.checkpointed_nodes as usize),
        (acked, acked)
    );
}

/// A bank with checkpointed and overlay rows over several segments (50
/// rows each), residuals, failures and a consolidation: 421 nodes of
/// dimension 8 in "task". `rng` then gives query vectors.
fn mixed_bank(dir: &std::path::Path, rng: &mut crate::storage::sim::Rng) -> Bank {
    let mut config = BankConfig::new(8);
    config.rows_per_segment = Some(50);
    Bank::create_dir(dir, config).unwrap().close().unwrap();
    let options = OpenOptions {
        sync: SyncPolicy::None,
        ..OpenOptions::default()
    };
    let mut bank = Bank::open_dir(dir, options).unwrap();
    for i in 0..420 {
        let mut n = node(i);
        n.embedding = vector8(rng);
        n.label = if i % 3 == 0 { Label::Failure } else { Label::Success };
        if i % 4 == 1 {
            n.attach = Attach::Parent(crate::bank::NodeRef::Index(i as u32 - 1));
        }
        bank.insert(n).unwrap();
        if i == 300 {
            bank.checkpoint().unwrap();
        }
    }
    bank.consolidate(5, BTreeMap::new()).unwrap();
    bank
}

fn vector8(rng: &mut crate::storage::sim::Rng) -> Vec<f32> {
    (0..8).map(|_| rng.next_f32() - 0.5).collect()
}

/// Queries with every mix of options the scan treats apart.
fn mixed_queries(rng: &mut crate::storage::sim::Rng) -> Vec<(Vec<f32>, crate::bank::QueryOptions)> {
    (0..12)
        .map(|i| {
            let options = crate::bank::QueryOptions {
                k: [1, 4, 10][i % 3],
                tau: Some(-1.0),
                eps: [None, Some(0.3)][i % 2],
                include_consolidated: i % 5 == 0,
            };
            (vector8(rng), options)
        })
        .collect()
}

/// The circular scan answers what `Bank::query` answers on `mixed_bank`,
/// scanned in chunks of 64 rows (cut across segments and the overlay) by
/// queries with different options, a second set joining after three
/// chunks (so it starts mid-rotation and wraps).
#[test]
fn the_circular_scan_answers_what_query_answers() {
    use crate::storage::sim::Rng;
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(5);
    let bank = mixed_bank(dir.path(), &mut rng);
    let queries = mixed_queries(&mut rng);
    let want: Vec<_> = queries
        .iter()
        .map(|(e, o)| crate::api::QueryReply::new(&bank, bank.query("task", e, o).unwrap()).unwrap())
        .collect();
    let core = Core::serve_chunked(bank, 1, 64);
    let mut replies = core.queue_for_rotation("task", queries[..6].to_vec());
    for _ in 0..3 {
        assert!(core.step_rotation("task"));
    }
    replies.extend(core.queue_for_rotation("task", queries[6..].to_vec()));
    let mut steps = 3;
    while core.step_rotation("task") {
        steps += 1;
        assert!(steps < 100, "the rotation never ends");
    }
    // 421 nodes: 7 chunks; the second set joined at chunk 3 and ends after
    // chunk 2, one rotation later.
    assert_eq!(steps, 3 + 7);
    for (i, (mut rx, want)) in replies.into_iter().zip(want).enumerate() {
        let got = rx.try_recv().expect("answered").unwrap();
        assert_eq!(got, want, "query {i}");
    }
    core.shutdown().unwrap();
}

/// A client's batch query, scanned 37 rows per thread and hold of the
/// lock (cut across segments and the overlay), on one thread and split
/// between three, answers what `Bank::query_batch` answers, for each mix
/// of options; past its deadline it gives up.
#[test]
fn a_batch_query_in_holds_answers_what_query_batch_answers() {
    use crate::storage::sim::Rng;
    for threads in [1, 3] {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = Rng(9);
        let bank = mixed_bank(dir.path(), &mut rng);
        let queries = mixed_queries(&mut rng);
        let embeddings: Vec<Vec<f32>> = queries.iter().map(|q| q.0.clone()).collect();
        let wants: Vec<Vec<crate::api::QueryReply>> = queries
            .iter()
            .map(|(_, o)| {
                let found = bank.query_batch("task", &embeddings, o).unwrap();
                found
                    .into_iter()
                    .map(|m| crate::api::QueryReply::new(&bank, m).unwrap())
                    .collect()
            })
            .collect();
        let core = Core::serve(bank, SyncPolicy::None, threads).unwrap();
        let later = Instant::now() + Duration::from_secs(600);
        for ((_, options), want) in queries.iter().zip(wants) {
            let got = core
                .query_batch_in_holds("task", &embeddings, options, 37, later)
                .unwrap();
            assert_eq!(got, Some(want), "{threads} threads, {options:?}");
        }
        let past = Instant::now() - Duration::from_millis(1);
        let late = core
            .query_batch_in_holds("task", &embeddings, &queries[0].1, 37, past)
            .unwrap();
        assert_eq!(late, None);
        core.shutdown().unwrap();
    }
}

/// Stats counted a slice of rows at a time (the server's holds) equal
/// `Bank::stats`, on a bank with residuals, failures, a consolidation and
/// rows on both sides of a checkpoint; the tally ends only at the last
/// row.
#[test]
fn stats_counted_in_slices_equal_stats() {
    let dir = tempfile::tempdir().unwrap();
    let bank = mixed_bank(dir.path(), &mut crate::storage::sim::Rng(3));
    let whole = bank.stats().unwrap();
    let mut tally = bank.start_stats();
    let mut slices = 1;
    while !bank.count_rows(&mut tally, 37).unwrap() {
        slices += 1;
        assert!(slices < 100, "the tally never ends");
    }
    assert_eq!(slices, bank.node_count().div_ceil(37));
    assert_eq!(bank.finish_stats(tally).unwrap(), whole);
    assert!(whole.trees[0].residuals > 0 && whole.trees[0].failures > 0 && whole.trees[0].consolidated_roots > 0);
}

/// `/v1/verify` reads a view of its own; a view cannot be opened over a
/// WAL damaged in the middle (intact records after a bad one), and that is
/// exactly what verify must report: the live bank's verify does, as a
/// report with problems, not an error.
#[test]
fn verify_reports_wal_damage_that_a_view_cannot_open_over() {
    let (dir, core) = served(SyncPolicy::Always);
    for i in 0..3 {
        let rx = core.submit(WriteOp::Insert(node(i))).unwrap();
        assert!(rx.blocking_recv().unwrap().is_ok());
    }
    let later = Instant::now() + Duration::from_secs(600);
    assert!(core.verify_until(later).unwrap().unwrap().is_ok());
    let wal_path = dir.path().join("wal.log");
    let mut wal = std::fs::read(&wal_path).unwrap();
    // A byte of the first record's body (after the 64-byte header and the
    // record's 24-byte header).
    wal[64 + 24 + 2] ^= 0xff;
    std::fs::write(&wal_path, &wal).unwrap();
    let report = core.verify_until(later).unwrap().expect("not past the deadline");
    assert!(!report.is_ok(), "{report:?}");
    core.shutdown().ok();
}

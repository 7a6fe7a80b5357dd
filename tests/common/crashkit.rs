//! The crash-test kit shared by tests/crash.rs and the `ops` fuzz target
//! (included there by path): seeded or fuzzer-driven workloads, a ledger of
//! committed states, a driver that stops at the first I/O failure, and the
//! recovery check (opens, equals a ledger state containing every
//! acknowledged op, passes verify, takes new writes).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use deltamem::storage::{FaultKind, FaultPlan, Loss, SimStorage};
use deltamem::{
    Attach, Bank, BankConfig, BankError, Change, ChangeAck, Label, NewNode, NodeRef, OpenOptions, Payload, SyncPolicy,
};

pub const DIM: usize = 8;
pub const OPS_PER_WORKLOAD: usize = 40;

/// Where a workload's choices come from: a seeded generator (crash test)
/// or the fuzzer's bytes.
pub trait Choices {
    fn next(&mut self) -> u64;
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    /// False once a finite source is used up.
    fn more(&self) -> bool {
        true
    }
}

pub use deltamem::storage::sim::Rng;

impl Choices for Rng {
    fn next(&mut self) -> u64 {
        Rng::next(self)
    }
}

/// Fuzzer bytes as choices: one byte each, zeros once used up.
pub struct Bytes<'a>(pub &'a [u8]);

impl Choices for Bytes<'_> {
    fn next(&mut self) -> u64 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                u64::from(b)
            }
            None => 0,
        }
    }
    fn more(&self) -> bool {
        !self.0.is_empty()
    }
}

#[derive(Debug, Clone)]
pub enum Op {
    Insert(NewNode),
    Hit(u32),
    Retrievals(Vec<u32>),
    Consolidate(u32),
    Checkpoint,
    /// A checkpoint in the server's two halves with a write between them
    /// (`prepare_checkpoint`, insert, `publish_checkpoint`): the publish
    /// must see the write and fall back to writing the new nodes itself.
    CheckpointAround(NewNode),
    Compact,
    Reopen,
    /// An agent episode: a node, the chain it used, a hit, one record.
    Episode(Vec<Change>),
    /// A bulk load of inserts (durable by checkpoint, not WAL); `true`
    /// passes the embeddings as one column (`Bank::load_column`).
    Load(Vec<Change>, bool),
}

thread_local! {
    /// The vector precision `config` creates banks with: the crash test
    /// runs workloads again on f16 and int8 banks (their column files).
    pub static PRECISION: std::cell::Cell<deltamem::format::manifest::Precision> = Default::default();
}

pub fn config() -> BankConfig {
    let mut c = BankConfig::new(DIM as u32);
    c.rows_per_segment = Some(4);
    c.max_depth = 3;
    c.consolidate_after = 2;
    c.precision = PRECISION.with(|p| p.get());
    c
}

fn embedding(rng: &mut impl Choices) -> Vec<f32> {
    // A few directions so auto-attach finds matches often.
    let base = rng.below(4);
    (0..DIM)
        .map(|i| if i == base { 1.0 } else { (rng.below(3) as f32) * 0.1 })
        .collect()
}

pub fn new_node(rng: &mut impl Choices, bank: &Bank) -> NewNode {
    let tree = if rng.below(3) == 0 { "env" } else { "task" };
    let attach = match (rng.below(5), bank.node_count()) {
        (0, _) | (_, 0) => Attach::Root,
        (1, n) => Attach::Parent(NodeRef::Index(rng.below(n as usize) as u32)),
        _ => Attach::Auto,
    };
    let mut fields = BTreeMap::new();
    fields.insert(
        "execution_procedure".into(),
        format!("step {} then step {}", rng.next() % 100, rng.next() % 100),
    );
    if rng.below(5) == 0 {
        // Large and poorly compressible: records span several sectors.
        let noise: String = (0..3000).map(|_| char::from(b'a' + (rng.next() % 26) as u8)).collect();
        fields.insert("trajectory".into(), noise);
    }
    NewNode {
        tree: tree.into(),
        attach,
        label: if rng.below(5) == 0 {
            Label::Failure
        } else {
            Label::Success
        },
        payload: Payload {
            scenario: format!("scenario {}", rng.below(50)),
            fields,
        },
        embedding: embedding(rng),
        external_id: None,
    }
}

/// A write that is valid on any bank state.
pub fn probe_node() -> NewNode {
    let mut node = new_node(
        &mut Rng(3),
        &Bank::create(Arc::new(SimStorage::new()), config()).unwrap(),
    );
    node.attach = Attach::Root;
    node
}

/// A workload valid on the reference bank (parents exist in the tree).
pub fn workload(seed: u64) -> Vec<Op> {
    workload_from(&mut Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1), OPS_PER_WORKLOAD)
}

/// A workload of at most `max_ops` ops drawn from `rng`.
pub fn workload_from(rng: &mut impl Choices, max_ops: usize) -> Vec<Op> {
    let mut bank = Bank::create(Arc::new(SimStorage::new()), config()).unwrap();
    let mut ops = Vec::new();
    while ops.len() < max_ops && rng.more() {
        let n = bank.node_count() as usize;
        let op = match rng.below(20) {
            0..=9 => Op::Insert(insertable_node(rng, &bank)),
            10..=12 if n > 0 => Op::Hit(rng.below(n) as u32),
            13 | 14 if n > 0 => Op::Retrievals(bank.chain(rng.below(n) as u32).unwrap()),
            15 | 16 => match bank.due_for_consolidation(None).unwrap().first() {
                Some(&due) => Op::Consolidate(due),
                None => continue,
            },
            17 if rng.below(2) == 0 => match rng.below(2) {
                0 => Op::Checkpoint,
                _ => Op::CheckpointAround(insertable_node(rng, &bank)),
            },
            17 => {
                // Explicit parents are earlier nodes; auto attach may also
                // pick a node of the same load (staged in order).
                let mut changes = Vec::new();
                for _ in 0..=rng.below(4) {
                    let mut node = new_node(rng, &bank);
                    if let Attach::Parent(NodeRef::Index(p)) = node.attach {
                        node.tree = bank.tree_name(bank.row(p).unwrap().tree).to_string();
                    }
                    changes.push(Change::Insert(node));
                }
                Op::Load(changes, rng.below(2) == 0)
            }
            19 if rng.below(2) == 0 => Op::Compact,
            19 if n > 0 => {
                let used = rng.below(n) as u32;
                let mut node = new_node(rng, &bank);
                node.attach = Attach::Parent(NodeRef::Index(used));
                node.tree = bank.tree_name(bank.row(used).unwrap().tree).to_string();
                let chain = bank.chain(used).unwrap();
                Op::Episode(vec![
                    Change::Insert(node),
                    Change::Retrievals(chain),
                    Change::SuccessHit(used),
                ])
            }
            18 => Op::Reopen,
            _ => continue,
        };
        apply_owned(&mut bank, &op);
        ops.push(op);
    }
    ops
}

/// A new node whose explicit parent (if any) is in its tree.
fn insertable_node(rng: &mut impl Choices, bank: &Bank) -> NewNode {
    let mut node = new_node(rng, bank);
    if let Attach::Parent(NodeRef::Index(p)) = node.attach {
        node.tree = bank.tree_name(bank.row(p).unwrap().tree).to_string();
    }
    node
}

/// Applies an op to the reference bank (it must succeed there).
pub fn apply_owned(bank: &mut Bank, op: &Op) {
    if matches!(op, Op::Reopen) {
        // The reference keeps one handle: a checkpoint has the same effect
        // on the state digest as close + open.
        bank.checkpoint().unwrap();
        return;
    }
    run_op(bank, op).unwrap_or_else(|e| panic!("reference op {op:?} failed: {e}"));
}

/// Runs one op; returns the LSN it was logged under, if it logs one.
pub fn run_op(bank: &mut Bank, op: &Op) -> Result<Option<u64>, BankError> {
    Ok(match op {
        Op::Insert(node) => Some(bank.insert(node.clone())?.lsn),
        Op::Hit(i) => Some(bank.success_hit(*i)?.lsn),
        Op::Retrievals(ids) => Some(bank.record_retrievals(ids)?),
        Op::Consolidate(i) => {
            let mut fields = BTreeMap::new();
            fields.insert("execution_procedure".to_string(), format!("distilled {i}"));
            Some(bank.consolidate(*i, fields)?.lsn)
        }
        Op::Checkpoint => {
            bank.checkpoint()?;
            None
        }
        Op::CheckpointAround(node) => {
            let prepared = bank.prepare_checkpoint();
            let lsn = bank.insert(node.clone())?.lsn;
            bank.publish_checkpoint(prepared)?;
            Some(lsn)
        }
        Op::Compact => {
            bank.compact()?;
            None
        }
        Op::Episode(changes) => bank.transact(changes, None)?.iter().find_map(|a| match a {
            ChangeAck::Inserted(a) => Some(a.lsn),
            _ => None,
        }),
        Op::Load(changes, false) => {
            bank.load(changes)?;
            None
        }
        Op::Load(changes, true) => {
            let (stripped, column) = as_column(changes);
            bank.load_column(&stripped, &column)?;
            None
        }
        Op::Reopen => None, // handled by the driver
    })
}

/// The inserts without their embeddings, and the embeddings as a column.
pub fn as_column(changes: &[Change]) -> (Vec<Change>, Vec<f32>) {
    let mut column = Vec::new();
    let stripped = changes
        .iter()
        .map(|c| match c {
            Change::Insert(node) => {
                column.extend_from_slice(&node.embedding);
                Change::Insert(NewNode {
                    embedding: Vec::new(),
                    ..node.clone()
                })
            }
            other => other.clone(),
        })
        .collect();
    (stripped, column)
}

/// Digest of everything observable, except creation times.
pub fn digest(bank: &Bank) -> u64 {
    let mut h = DefaultHasher::new();
    for i in 0..bank.node_count() {
        let mut row = bank.row(i).unwrap();
        row.created_unix_ms = 0;
        format!("{row:?}").hash(&mut h);
        let p = bank.payload(i).unwrap();
        (p.scenario, p.fields).hash(&mut h);
        for x in bank.vector(i).unwrap() {
            x.to_bits().hash(&mut h);
        }
    }
    h.finish()
}

pub struct Outcome {
    /// Ops acknowledged as durable (a prefix of the workload).
    pub acked: usize,
    /// Ops started (the last may be half done).
    pub attempted: usize,
    pub poison_checked: bool,
    /// Whether the run let records go unsynced behind later ones (not
    /// `always`): a power loss can then keep a later record and lose an
    /// earlier one, which recovery must call damage, never a torn tail.
    pub unsynced_runs: bool,
}

pub fn open_writer(storage: &SimStorage, policy: SyncPolicy) -> Result<Bank, BankError> {
    Bank::open(
        Arc::new(storage.clone()),
        OpenOptions {
            sync: policy,
            ..OpenOptions::default()
        },
    )
}

/// Runs the workload on `storage` until the first error.
pub fn drive(storage: &SimStorage, ops: &[Op], policy: SyncPolicy) -> Outcome {
    drive_with(storage, ops, policy, false)
}

/// As `drive`; `ahead`: as `deltamem serve` runs a bank, every handle
/// writes each commit's vectors ahead of the checkpoint on its thread
/// (`Bank::write_vectors_ahead`), whose writes then interleave with the
/// commits' in an order no run repeats, and recycles its WAL files
/// (`Bank::recycle_wals`).
pub fn drive_with(storage: &SimStorage, ops: &[Op], policy: SyncPolicy, ahead: bool) -> Outcome {
    let open = |bank: Result<Bank, BankError>| {
        bank.map(|mut b| {
            if ahead {
                b.write_vectors_ahead_in_pieces(1);
                b.recycle_wals(true);
            }
            b
        })
    };
    let mut out = Outcome {
        acked: 0,
        attempted: 0,
        poison_checked: false,
        unsynced_runs: policy != SyncPolicy::Always,
    };
    let Ok(mut bank) = open(Bank::create(Arc::new(storage.clone()), config())) else {
        return out;
    };
    bank.set_sync_policy(policy);
    let mut lsns: Vec<Option<u64>> = Vec::new();
    for op in ops {
        out.attempted += 1;
        let result = match op {
            Op::Reopen => {
                let closed = bank.close();
                match open(closed.and_then(|()| open_writer(storage, policy))) {
                    Ok(b) => {
                        bank = b;
                        Ok(None)
                    }
                    Err(_) => return out, // no handle left to check
                }
            }
            _ => run_op(&mut bank, op),
        };
        match result {
            Ok(lsn) => {
                let everything_before_durable = lsn.is_none();
                lsns.push(lsn);
                if everything_before_durable {
                    out.acked = lsns.len();
                }
                let durable_below = bank.durable_below_lsn();
                while out.acked < lsns.len() && lsns[out.acked].is_none_or(|l| l < durable_below) {
                    out.acked += 1;
                }
            }
            Err(_) => {
                // Whatever failed, the bank must not take another write.
                assert!(
                    bank.insert(probe_node()).is_err(),
                    "bank accepted a write after an I/O failure in {op:?}"
                );
                out.poison_checked = true;
                return out;
            }
        }
    }
    out
}

pub struct Ledger {
    pub ops: Vec<Op>,
    /// digest after i ops, for i in 0..=ops.len().
    pub states: Vec<u64>,
    pub io_ops: u64,
}

pub fn ledger(seed: u64) -> Ledger {
    ledger_of(workload(seed))
}

pub fn ledger_of(ops: Vec<Op>) -> Ledger {
    let storage = SimStorage::new();
    let mut bank = Bank::create(Arc::new(storage.clone()), config()).unwrap();
    let mut states = vec![digest(&bank)];
    for op in &ops {
        if matches!(op, Op::Reopen) {
            bank.close().unwrap();
            bank = open_writer(&storage, SyncPolicy::Always).unwrap();
        } else {
            run_op(&mut bank, op).unwrap();
        }
        states.push(digest(&bank));
    }
    drop(bank);
    Ledger {
        ops,
        states,
        io_ops: storage.op_count(),
    }
}

/// Recovers `image` and checks it against the ledger.
pub fn check_recovery(ledger: &Ledger, image: &SimStorage, out: &Outcome, what: &str) {
    let mut bank = match open_writer(image, SyncPolicy::Always) {
        Ok(b) => b,
        Err(BankError::NotABank { .. }) if out.acked == 0 => return, // crashed inside create
        // Records after a lost one can only be unacknowledged ones (an
        // acknowledged record was synced with all before it): the repair
        // must then yield a ledger state holding every acknowledged op.
        Err(BankError::WalDamaged { .. }) if out.unsynced_runs => {
            let dropped =
                Bank::repair(Arc::new(image.clone())).unwrap_or_else(|e| panic!("{what}: repair failed: {e}"));
            assert!(dropped.is_some(), "{what}: repair found no damage");
            open_writer(image, SyncPolicy::Always).unwrap_or_else(|e| panic!("{what}: open after repair: {e}"))
        }
        Err(e) => panic!("{what}: recovery failed: {e}"),
    };
    let d = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| digest(&bank)))
        .unwrap_or_else(|_| panic!("{what}: reading the recovered bank failed"));
    let matched = (out.acked..=out.attempted).find(|&p| ledger.states[p] == d);
    assert!(
        matched.is_some(),
        "{what}: recovered state matches no ledger prefix in {}..={} (acked {}, found in all: {:?})",
        out.acked,
        out.attempted,
        out.acked,
        ledger.states.iter().position(|&s| s == d)
    );
    let report = bank.verify().unwrap();
    assert!(report.is_ok(), "{what}: verify: {:?}", report.problems);
    let before = bank.node_count();
    bank.insert(probe_node())
        .unwrap_or_else(|e| panic!("{what}: no new write: {e}"));
    bank.close().unwrap();
    assert_eq!(
        open_writer(image, SyncPolicy::Always).unwrap().node_count(),
        before + 1,
        "{what}"
    );
}

/// Crashes again at every step of recovery, then recovers for real.
pub fn compound(ledger: &Ledger, image: &SimStorage, out: &Outcome, what: &str) -> u64 {
    let probe = image.crash_image(Loss::KeepAll);
    if open_writer(&probe, SyncPolicy::Always).is_err() {
        return 0;
    }
    let recovery_ops = probe.op_count();
    for j in 0..recovery_ops {
        let attempt = image.crash_image(Loss::KeepAll);
        attempt.set_plan(Some(FaultPlan {
            at_op: j,
            kind: FaultKind::Crash,
        }));
        let _ = open_writer(&attempt, SyncPolicy::Always);
        let second = attempt.crash_image(Loss::LoseUnsynced);
        check_recovery(ledger, &second, out, &format!("{what}, crash {j} of recovery"));
    }
    recovery_ops
}

/// A root of tree "task" with scenario "scenario {i}" and `embedding`.
pub fn root_node(i: usize, embedding: Vec<f32>) -> NewNode {
    NewNode {
        tree: "task".into(),
        attach: Attach::Root,
        label: Label::Success,
        payload: Payload {
            scenario: format!("scenario {i}"),
            fields: BTreeMap::new(),
        },
        embedding,
        external_id: None,
    }
}

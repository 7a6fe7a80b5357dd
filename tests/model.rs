//! Model-based property tests: random operation sequences run against the
//! bank and against a naive in-memory model of `SEMANTICS.md`, compared after
//! every operation.
//!
//! The model is deliberately dumb: a `Vec` of nodes, a full scan with a full
//! sort for every query, parents followed one by one. It knows nothing about
//! segments, the WAL, the overlay or checkpoints, so reopening, crashing
//! (dropping the bank without `close`) and checkpointing must leave every
//! answer unchanged.
//!
//! Scores: the model computes dot products in f64 while the bank uses an f32
//! kernel, so scores are compared within 1e-5. Vectors come from a small
//! discrete alphabet whose penalised scores are either bit-identical (same
//! vector: exact ties, which exercise tie-breaking) or at least 1e-3 apart,
//! and at least 2e-3 away from every threshold used (checked by
//! `alphabet_is_well_separated`), so rounding can never change a decision.
//!
//! Environment: `DELTAMEM_PROPTEST_CASES` overrides the number of cases of
//! each property (default 48).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use deltamem::format::payload::encode_record;
use deltamem::format::row::{FLAG_CONSOLIDATED, FLAG_CONSOLIDATED_ROOT, FLAG_EXTERNAL_ID_UUID, FLAG_HAS_EXTERNAL_ID};
use deltamem::format::vector_crc32;
use deltamem::storage::{MemStorage, Storage};
use deltamem::{
    Attach, Bank, BankConfig, BankError, Label, NewNode, NodeRef, NodeType, OpenOptions, Payload, QueryOptions,
    SyncPolicy, TreeSpec,
};
use proptest::prelude::*;

// ---------------------------------------------------------------------------
// Parameters shared by the bank and the model.

const DIM: usize = 8;
const MAX_DEPTH: u8 = 3;
const K_CONS: u32 = 2;
const EPS: f32 = 0.05;
const TREES: [(&str, f32); 2] = [("task", 0.82), ("env", 0.86)];

/// Raw embeddings. Cosines between them (rounded): A-B .894, A-C .800,
/// A-D .943, B-C .716, B-D .949, C-D .896; E-F .928, E-G .728, F-G .856;
/// H is orthogonal to everything; the two groups are orthogonal. Orthogonal
/// pairs have disjoint supports, so their dot product is exactly 0 in any
/// summation order (exact ties again).
const ALPHABET: [[f32; DIM]; 8] = [
    [4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], // A
    [4.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], // B
    [4.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0], // C
    [4.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0], // D
    [0.0, 0.0, 0.0, 4.0, 0.0, 0.0, 0.0, 0.0], // E
    [0.0, 0.0, 0.0, 5.0, 2.0, 0.0, 0.0, 0.0], // F
    [0.0, 0.0, 0.0, 3.0, 2.0, 2.0, 0.0, 0.0], // G
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.0, 1.0], // H
];
/// Powers of two: scaling by them normalises to bit-identical vectors.
const SCALES: [f32; 3] = [1.0, 2.0, 0.5];
/// -1 matches everything (every score is >= -0.15 here).
const TAU_OVERRIDES: [f32; 5] = [0.5, 0.77, 0.92, 0.985, -1.0];
const EPS_OVERRIDES: [f32; 3] = [0.0, 0.04, 0.15];

/// External ids offered to inserts, with whether the bank must accept them.
/// (Valid: a lowercase hyphenated UUID, or 1..=16 bytes of text.)
const EXTERNAL_IDS: [(&str, bool); 8] = [
    ("alpha", true),
    ("b", true),
    ("ext-2", true),
    ("0123456789abcdef", true),
    ("15322d79-189f-4d8b-a672-ea78630c3370", true),
    ("0123456789abcdefg", false),
    ("15322D79-189F-4D8B-A672-EA78630C3370", false),
    ("", false),
];

const SCENARIOS: [&str; 5] = [
    "boil water",
    "find the thermometer",
    "kitchen with a stove",
    "measure the melting point of ice",
    "   ",
];
const FIELD_KEYS: [&str; 4] = [
    "activation_condition",
    "execution_procedure",
    "termination_condition",
    "trajectory",
];

fn config() -> BankConfig {
    BankConfig {
        dim_count: DIM as u32,
        trees: TREES
            .iter()
            .map(|(name, tau)| TreeSpec {
                name: (*name).into(),
                tau: *tau,
            })
            .collect(),
        eps: EPS,
        max_depth: MAX_DEPTH,
        consolidate_after: K_CONS,
        rows_per_segment: Some(4),
        ..BankConfig::new(DIM as u32)
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// L2 normalisation, computed in f64 like the spec's reference would.
fn normalise(v: &[f32]) -> Vec<f32> {
    let norm = v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
    v.iter().map(|x| (f64::from(*x) / norm) as f32).collect()
}

fn dot64(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum()
}

fn raw_vector(base: usize, scale: usize) -> Vec<f32> {
    ALPHABET[base].iter().map(|x| x * SCALES[scale]).collect()
}

/// ~`len` bytes of poorly compressible text from a seed (xorshift64*).
fn noise_text(seed: u64, len: usize) -> String {
    let mut x = seed | 1;
    let mut out = String::with_capacity(len);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
        for i in 0..8 {
            let c = (r >> (i * 8)) as u8 % 62;
            out.push(match c {
                0..=9 => (b'0' + c) as char,
                10..=35 => (b'a' + c - 10) as char,
                _ => (b'A' + c - 36) as char,
            });
        }
    }
    out.truncate(len);
    out
}

// ---------------------------------------------------------------------------
// The model.

#[derive(Debug, Clone)]
struct MNode {
    tree: usize,
    parent: Option<u32>,
    depth: u8,
    node_type: NodeType,
    label: Label,
    hits: u32,
    retrievals: u32,
    consolidated: bool,
    consolidated_root: bool,
    link: Option<u32>,
    payload: Payload,
    vector: Vec<f32>,
    external_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
enum MErr {
    UnknownNode,
    UnknownTree,
    WrongTree,
    DuplicateExternalId { existing: u32 },
    BadExternalId,
    AlreadyConsolidated { root: u32 },
    NotConsolidatable,
    EmptyScenario,
    BadEmbedding,
    DimensionMismatch,
    BadConfig,
    ReadOnly,
}

fn classify(e: &BankError) -> Option<MErr> {
    Some(match e {
        BankError::UnknownNode(_) => MErr::UnknownNode,
        BankError::UnknownTree { .. } => MErr::UnknownTree,
        BankError::WrongTree { .. } => MErr::WrongTree,
        BankError::DuplicateExternalId { existing, .. } => MErr::DuplicateExternalId { existing: *existing },
        BankError::BadExternalId { .. } => MErr::BadExternalId,
        BankError::AlreadyConsolidated { root, .. } => MErr::AlreadyConsolidated { root: *root },
        BankError::NotConsolidatable { .. } => MErr::NotConsolidatable,
        BankError::EmptyScenario => MErr::EmptyScenario,
        BankError::BadEmbedding(_) => MErr::BadEmbedding,
        BankError::DimensionMismatch { .. } => MErr::DimensionMismatch,
        // Query options out of init's ranges are bad configuration too.
        BankError::BadConfig(_) | BankError::BadQueryOption(_) => MErr::BadConfig,
        BankError::ReadOnly(_) => MErr::ReadOnly,
        _ => return None,
    })
}

/// Asserts that the bank's error is one of those the model allows.
fn assert_error_in(got: &BankError, allowed: &[MErr], context: &str) {
    let kind = classify(got);
    assert!(
        kind.as_ref().is_some_and(|k| allowed.contains(k)),
        "{context}: bank failed with {got:?}, model allows {allowed:?}"
    );
}

#[derive(Debug, Clone, PartialEq)]
struct MInsert {
    id: u32,
    node_type: NodeType,
    parent: Option<u32>,
    depth: u8,
    matched: Option<(u32, f64)>,
    /// The target sat at D_max, so the node became its sibling.
    sibling: bool,
}

#[derive(Debug, Clone, PartialEq)]
struct MMatch {
    id: u32,
    score: f64,
    depth: u8,
    node_type: NodeType,
    label: Label,
    chain: Vec<u32>,
}

#[derive(Debug, Clone, Default)]
struct Model {
    nodes: Vec<MNode>,
}

impl Model {
    fn len(&self) -> u32 {
        self.nodes.len() as u32
    }

    fn node(&self, i: u32) -> Option<&MNode> {
        self.nodes.get(i as usize)
    }

    fn resolve(&self, r: &NodeRef) -> Option<u32> {
        match r {
            NodeRef::Index(i) => self.node(*i).map(|_| *i),
            NodeRef::External(s) => self
                .nodes
                .iter()
                .position(|n| n.external_id.as_deref() == Some(s.as_str()))
                .map(|i| i as u32),
        }
    }

    fn score(&self, query: &[f32], i: u32, eps: f32) -> f64 {
        let n = &self.nodes[i as usize];
        let cos = dot64(query, &n.vector);
        match n.label {
            Label::Success => cos,
            Label::Failure => cos - f64::from(eps),
        }
    }

    /// Every node of the tree scored, filtered at tau, fully sorted by
    /// (score desc, depth asc, index asc), cut at k.
    fn ranked(
        &self,
        tree: usize,
        query: &[f32],
        k: usize,
        tau: f32,
        eps: f32,
        include_consolidated: bool,
    ) -> Vec<(u32, f64)> {
        let mut all = Vec::new();
        for i in 0..self.len() {
            let n = &self.nodes[i as usize];
            if n.tree != tree || (n.consolidated && !include_consolidated) {
                continue;
            }
            let s = self.score(query, i, eps);
            if s >= f64::from(tau) {
                all.push((i, s));
            }
        }
        all.sort_by(|a, b| {
            b.1.partial_cmp(&a.1)
                .unwrap()
                .then(self.nodes[a.0 as usize].depth.cmp(&self.nodes[b.0 as usize].depth))
                .then(a.0.cmp(&b.0))
        });
        all.truncate(k);
        all
    }

    fn chain(&self, i: u32) -> Vec<u32> {
        let mut out = vec![i];
        let mut at = i;
        while let Some(p) = self.nodes[at as usize].parent {
            out.push(p);
            at = p;
        }
        out.reverse();
        out
    }

    fn is_due(&self, i: u32) -> bool {
        let n = &self.nodes[i as usize];
        n.node_type == NodeType::Residual && !n.consolidated && n.hits >= K_CONS
    }

    fn due(&self, tree: Option<usize>) -> Vec<u32> {
        (0..self.len())
            .filter(|i| tree.is_none_or(|t| self.nodes[*i as usize].tree == t) && self.is_due(*i))
            .collect()
    }

    fn query(
        &self,
        tree: usize,
        query: &[f32],
        k: usize,
        tau: Option<f32>,
        eps: Option<f32>,
        include_consolidated: bool,
    ) -> Vec<MMatch> {
        let tau = tau.unwrap_or(TREES[tree].1);
        let eps = eps.unwrap_or(EPS);
        self.ranked(tree, query, k, tau, eps, include_consolidated)
            .into_iter()
            .map(|(id, score)| {
                let n = &self.nodes[id as usize];
                MMatch {
                    id,
                    score,
                    depth: n.depth,
                    node_type: n.node_type,
                    label: n.label,
                    chain: self.chain(id),
                }
            })
            .collect()
    }

    /// The write decision and attachment rule. `vector` is normalised.
    #[allow(clippy::too_many_arguments)]
    fn insert(
        &mut self,
        tree: usize,
        attach: &Attach,
        label: Label,
        payload: Payload,
        vector: Vec<f32>,
        external_id: Option<(&str, bool)>,
    ) -> Result<MInsert, Vec<MErr>> {
        let mut errors = Vec::new();
        if payload.scenario.trim().is_empty() {
            errors.push(MErr::EmptyScenario);
        }
        if let Some((text, valid)) = external_id {
            if !valid {
                errors.push(MErr::BadExternalId);
            } else if let Some(existing) = self.resolve(&NodeRef::External(text.into())) {
                errors.push(MErr::DuplicateExternalId { existing });
            }
        }
        // The node the new one attaches to (None: a new root), and the match.
        let mut matched = None;
        let target = match attach {
            Attach::Root => None,
            Attach::Auto => {
                let best = self
                    .ranked(tree, &vector, 1, TREES[tree].1, EPS, false)
                    .into_iter()
                    .next();
                matched = best;
                best.map(|(i, _)| i)
            }
            Attach::Parent(r) => match self.resolve(r) {
                None => {
                    errors.push(MErr::UnknownNode);
                    None
                }
                Some(p) if self.nodes[p as usize].tree != tree => {
                    errors.push(MErr::WrongTree);
                    None
                }
                Some(p) => Some(p),
            },
        };
        if !errors.is_empty() {
            return Err(errors);
        }
        let sibling = target.is_some_and(|m| self.nodes[m as usize].depth >= MAX_DEPTH);
        let (node_type, parent, depth) = match target {
            None => (NodeType::Root, None, 1),
            Some(m) => {
                let mn = &self.nodes[m as usize];
                if mn.depth < MAX_DEPTH {
                    (NodeType::Residual, Some(m), mn.depth + 1)
                } else {
                    // A sibling of the match: same parent, same depth.
                    match mn.parent {
                        Some(p) => (NodeType::Residual, Some(p), mn.depth),
                        None => (NodeType::Root, None, 1),
                    }
                }
            }
        };
        let id = self.len();
        self.nodes.push(MNode {
            tree,
            parent,
            depth,
            node_type,
            label,
            hits: 0,
            retrievals: 0,
            consolidated: false,
            consolidated_root: false,
            link: None,
            payload,
            vector,
            external_id: external_id.map(|(t, _)| t.to_string()),
        });
        Ok(MInsert {
            id,
            node_type,
            parent,
            depth,
            matched,
            sibling,
        })
    }

    fn success_hit(&mut self, i: u32) -> Result<(u32, bool), Vec<MErr>> {
        if self.node(i).is_none() {
            return Err(vec![MErr::UnknownNode]);
        }
        self.nodes[i as usize].hits += 1;
        Ok((self.nodes[i as usize].hits, self.is_due(i)))
    }

    fn record_retrievals(&mut self, list: &[u32]) -> Result<(), Vec<MErr>> {
        if list.iter().any(|i| self.node(*i).is_none()) {
            return Err(vec![MErr::UnknownNode]);
        }
        let unique: BTreeSet<u32> = list.iter().copied().collect();
        for i in unique {
            self.nodes[i as usize].retrievals += 1;
        }
        Ok(())
    }

    fn consolidate(&mut self, i: u32, fields: BTreeMap<String, String>) -> Result<u32, Vec<MErr>> {
        let Some(source) = self.node(i) else {
            return Err(vec![MErr::UnknownNode]);
        };
        if source.consolidated {
            return Err(vec![MErr::AlreadyConsolidated {
                root: source.link.unwrap(),
            }]);
        }
        if source.node_type == NodeType::Root {
            return Err(vec![MErr::NotConsolidatable]);
        }
        let new_root = self.len();
        let node = MNode {
            tree: source.tree,
            parent: None,
            depth: 1,
            node_type: NodeType::Root,
            label: Label::Success,
            hits: 0,
            retrievals: 0,
            consolidated: false,
            consolidated_root: true,
            link: Some(i),
            payload: Payload {
                scenario: source.payload.scenario.clone(),
                fields,
            },
            vector: source.vector.clone(),
            external_id: None,
        };
        self.nodes.push(node);
        let source = &mut self.nodes[i as usize];
        source.consolidated = true;
        source.link = Some(new_root);
        Ok(new_root)
    }
}

// ---------------------------------------------------------------------------
// Comparing a bank with the model.

fn compare_query(bank: &Bank, model: &Model, tree: usize, raw: &[f32], opts: &QueryOptions) {
    if opts.k == 0 {
        // No matches asked for is the caller's mistake, refused by name.
        let e = bank.query(TREES[tree].0, raw, opts).expect_err("k = 0 is refused");
        assert!(e.to_string().contains("k must be at least 1"), "{e}");
        return;
    }
    let got = bank
        .query(TREES[tree].0, raw, opts)
        .unwrap_or_else(|e| panic!("query {opts:?} failed: {e}"));
    let want = model.query(
        tree,
        &normalise(raw),
        opts.k,
        opts.tau,
        opts.eps,
        opts.include_consolidated,
    );
    let ids = |g: &[deltamem::Match]| g.iter().map(|m| m.id).collect::<Vec<_>>();
    assert_eq!(
        ids(&got),
        want.iter().map(|m| m.id).collect::<Vec<_>>(),
        "query tree {} raw {raw:?} {opts:?}: ranked ids differ\n bank: {got:?}\nmodel: {want:?}",
        TREES[tree].0
    );
    for (g, w) in got.iter().zip(&want) {
        assert!(
            (f64::from(g.score) - w.score).abs() < 1e-5,
            "score of {} differs: bank {} model {}",
            g.id,
            g.score,
            w.score
        );
        assert_eq!(
            (g.depth, g.node_type, g.label, &g.chain),
            (w.depth, w.node_type, w.label, &w.chain),
            "match {} differs",
            g.id
        );
    }
}

/// A fixed battery of queries (every alphabet vector, both trees, top-5,
/// with and without consolidated nodes).
fn compare_query_battery(bank: &Bank, model: &Model) {
    for tree in 0..TREES.len() {
        for raw in &ALPHABET {
            for include_consolidated in [false, true] {
                let opts = QueryOptions {
                    k: 5,
                    include_consolidated,
                    ..QueryOptions::default()
                };
                compare_query(bank, model, tree, raw, &opts);
            }
        }
    }
}

/// Compares every row (and, if `deep`, every payload and vector) plus the
/// derived answers (chains, due lists, external ids).
fn compare_state(bank: &Bank, model: &Model, deep: bool, start_ms: u64) {
    assert_eq!(bank.node_count(), model.len(), "node count");
    let mut payload_end = 0u64;
    for i in 0..model.len() {
        let m = &model.nodes[i as usize];
        let row = bank.row(i).unwrap_or_else(|e| panic!("row {i}: {e}"));
        let ctx = format!("node {i} (model {m:?})\nrow {row:?}");
        assert_eq!(row.index, i, "{ctx}");
        assert_eq!(row.tree as usize, m.tree, "tree of {ctx}");
        assert_eq!(row.parent(), m.parent, "parent of {ctx}");
        assert_eq!(row.depth, m.depth, "depth of {ctx}");
        assert_eq!(row.node_type, m.node_type, "type of {ctx}");
        assert_eq!(row.label, m.label, "label of {ctx}");
        assert_eq!(row.success_hits, m.hits, "success hits of {ctx}");
        assert_eq!(row.retrievals, m.retrievals, "retrievals of {ctx}");
        assert_eq!(row.link(), m.link, "link of {ctx}");
        let mut flags = 0;
        if m.consolidated {
            flags |= FLAG_CONSOLIDATED;
        }
        if m.consolidated_root {
            flags |= FLAG_CONSOLIDATED_ROOT;
        }
        if let Some(id) = &m.external_id {
            flags |= FLAG_HAS_EXTERNAL_ID;
            if id.len() == 36 {
                flags |= FLAG_EXTERNAL_ID_UUID;
            }
        }
        assert_eq!(row.flags, flags, "flags of {ctx}");
        assert_eq!(row.is_consolidated(), m.consolidated, "{ctx}");
        assert_eq!(row.is_consolidated_root(), m.consolidated_root, "{ctx}");
        assert_eq!(row.external_id_text(), m.external_id, "external id of {ctx}");
        assert!(
            row.created_unix_ms >= start_ms && row.created_unix_ms <= now_ms(),
            "created time of {ctx}"
        );
        assert_eq!(
            row.payload_offset_bytes, payload_end,
            "payload records must be contiguous: {ctx}"
        );
        payload_end += u64::from(row.payload_size_bytes);
        assert_eq!(bank.chain(i).unwrap(), model.chain(i), "chain of {ctx}");
        if deep {
            assert_eq!(bank.payload(i).unwrap(), m.payload, "payload of node {i}");
            assert_eq!(
                row.payload_size_bytes as usize,
                encode_record(i, &m.payload).len(),
                "payload record size of node {i}"
            );
            let v = bank.vector(i).unwrap();
            assert_eq!(v.len(), DIM);
            for (a, b) in v.iter().zip(&m.vector) {
                assert!((a - b).abs() < 1e-6, "vector of node {i}: {v:?} vs {:?}", m.vector);
            }
            assert_eq!(row.vector_crc32, vector_crc32(&v), "vector crc of node {i}");
            let info = bank.node(i).unwrap();
            assert_eq!(info.tree_name, TREES[m.tree].0);
        }
        if let Some(id) = &m.external_id {
            assert_eq!(
                bank.resolve(&NodeRef::External(id.clone())).unwrap(),
                i,
                "external id {id:?}"
            );
        }
    }
    assert_eq!(bank.due_for_consolidation(None).unwrap(), model.due(None), "due");
    for (t, (name, _)) in TREES.iter().enumerate() {
        assert_eq!(
            bank.due_for_consolidation(Some(name)).unwrap(),
            model.due(Some(t)),
            "due in {name}"
        );
    }
    for (text, valid) in EXTERNAL_IDS {
        if valid && model.resolve(&NodeRef::External(text.into())).is_none() {
            assert!(matches!(
                bank.resolve(&NodeRef::External(text.into())),
                Err(BankError::UnknownNode(_))
            ));
        }
    }
}

fn assert_verified(bank: &Bank) {
    let report = bank.verify().unwrap();
    assert!(report.is_ok(), "verify found problems: {:#?}", report.problems);
}

// ---------------------------------------------------------------------------
// Operations.

#[derive(Debug, Clone, Copy)]
enum Pick {
    /// seed % node count.
    Existing(u32),
    /// One of the newest nodes (0 = newest).
    Recent(u32),
    /// The node last matched by a query or an auto insert (the v* of the
    /// episode), or the newest node.
    LastMatch,
    /// node count + offset: does not exist.
    Missing(u32),
    /// seed % number of residual nodes (the ones that can become due).
    Residual(u32),
}

#[derive(Debug, Clone)]
enum AttachGen {
    Auto,
    Root,
    /// seed % number of nodes of the insert's tree.
    ParentInTree(u32),
    ParentIndex(Pick),
    ParentExternal(usize),
}

#[derive(Debug, Clone)]
enum ConsolidateTarget {
    /// One of the nodes due for consolidation (seed %), else any node.
    Due(u32),
    Any(Pick),
}

#[derive(Debug, Clone)]
enum Op {
    /// Does nothing. First in the strategy so that shrinking turns the ops
    /// a failure does not need into no-ops (the sequence cannot get shorter
    /// than its minimum length).
    Nop,
    Insert {
        env: bool,
        attach: AttachGen,
        failure: bool,
        base: usize,
        scale: usize,
        scenario: usize,
        fields: Vec<(usize, u8)>,
        /// Seed of a ~100 KB field.
        large: Option<u64>,
        external_id: Option<usize>,
    },
    Hit(Pick),
    Retrieve(Vec<Pick>),
    Consolidate {
        target: ConsolidateTarget,
        large: Option<u64>,
    },
    Query {
        env: bool,
        base: usize,
        scale: usize,
        k: usize,
        tau: Option<usize>,
        eps: Option<usize>,
        include_consolidated: bool,
    },
    /// Bad input of kind n: must fail without changing anything.
    BadInput(u8),
    Checkpoint,
    /// close() then open as writer with these options.
    Reopen(ReopenOpts),
    /// Drop the writer without close, then open.
    Crash(ReopenOpts),
    /// Open a fresh reader (or refresh the long-lived one) and compare it.
    Reader {
        refresh: bool,
    },
}

#[derive(Debug, Clone, Copy)]
struct ReopenOpts {
    /// 0 Always, 1 None, 2 Batch (long interval).
    policy: u8,
    /// Checkpoint once the WAL passes 3000 bytes instead of 64 MiB.
    small_wal: bool,
}

impl ReopenOpts {
    fn options(self) -> OpenOptions {
        OpenOptions {
            read_only: false,
            sync: match self.policy {
                0 => SyncPolicy::Always,
                1 => SyncPolicy::None,
                _ => SyncPolicy::Batch {
                    records: 3,
                    interval_ms: 60_000,
                },
            },
            checkpoint_wal_bytes: if self.small_wal {
                3000
            } else {
                OpenOptions::default().checkpoint_wal_bytes
            },
        }
    }
}

/// An operation sequence, printed one op per line without the no-ops.
#[derive(Clone)]
struct Ops(Vec<Op>);

impl std::fmt::Debug for Ops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "[")?;
        for (i, op) in self.0.iter().enumerate() {
            if !matches!(op, Op::Nop) {
                writeln!(f, "  #{i}: {op:?}")?;
            }
        }
        write!(f, "]")
    }
}

fn ops_strategy(len: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = Ops> {
    prop::collection::vec(op_strategy(), len).prop_map(Ops)
}

fn pick_strategy() -> impl Strategy<Value = Pick> {
    prop_oneof![
        6 => any::<u32>().prop_map(Pick::Existing),
        2 => (0u32..3).prop_map(Pick::Recent),
        4 => Just(Pick::LastMatch),
        1 => (0u32..3).prop_map(Pick::Missing),
    ]
}

fn reopen_strategy() -> impl Strategy<Value = ReopenOpts> {
    (0u8..3, any::<bool>()).prop_map(|(policy, small_wal)| ReopenOpts { policy, small_wal })
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let attach = prop_oneof![
        6 => Just(AttachGen::Auto),
        2 => Just(AttachGen::Root),
        3 => any::<u32>().prop_map(AttachGen::ParentInTree),
        1 => pick_strategy().prop_map(AttachGen::ParentIndex),
        1 => (0..EXTERNAL_IDS.len()).prop_map(AttachGen::ParentExternal),
    ];
    let insert = (
        any::<bool>(),
        attach,
        prop::bool::weighted(0.3),
        0..ALPHABET.len(),
        prop_oneof![4 => Just(0usize), 1 => 1usize..3],
        prop_oneof![12 => 0usize..4, 1 => Just(4usize)],
        prop::collection::vec((0..FIELD_KEYS.len(), any::<u8>()), 0..4),
        prop::option::weighted(0.04, any::<u64>()),
        prop::option::weighted(0.1, 0..EXTERNAL_IDS.len()),
    )
        .prop_map(
            |(env, attach, failure, base, scale, scenario, fields, large, external_id)| Op::Insert {
                env,
                attach,
                failure,
                base,
                scale,
                scenario,
                fields,
                large,
                external_id,
            },
        );
    let consolidate = (
        prop_oneof![
            3 => any::<u32>().prop_map(ConsolidateTarget::Due),
            1 => pick_strategy().prop_map(ConsolidateTarget::Any),
        ],
        prop::option::weighted(0.05, any::<u64>()),
    )
        .prop_map(|(target, large)| Op::Consolidate { target, large });
    let query = (
        any::<bool>(),
        0..ALPHABET.len(),
        prop_oneof![4 => Just(0usize), 1 => 1usize..3],
        0usize..=5,
        prop::option::weighted(0.3, 0..TAU_OVERRIDES.len()),
        prop::option::weighted(0.3, 0..EPS_OVERRIDES.len()),
        prop::bool::weighted(0.3),
    )
        .prop_map(|(env, base, scale, k, tau, eps, include_consolidated)| Op::Query {
            env,
            base,
            scale,
            k,
            tau,
            eps,
            include_consolidated,
        });
    prop_oneof![
        1 => Just(Op::Nop),
        30 => insert,
        12 => prop_oneof![
            1 => pick_strategy(),
            1 => any::<u32>().prop_map(Pick::Residual),
        ]
        .prop_map(Op::Hit),
        6 => prop::collection::vec(pick_strategy(), 0..5).prop_map(Op::Retrieve),
        8 => consolidate,
        14 => query,
        2 => (0u8..7).prop_map(Op::BadInput),
        3 => Just(Op::Checkpoint),
        3 => reopen_strategy().prop_map(Op::Reopen),
        3 => reopen_strategy().prop_map(Op::Crash),
        3 => any::<bool>().prop_map(|refresh| Op::Reader { refresh }),
    ]
}

// ---------------------------------------------------------------------------
// The harness: a bank on some storage, the model, and the op interpreter.

enum Backend {
    Dir(tempfile::TempDir),
    Mem(MemStorage),
}

impl Backend {
    fn create(&self) -> Bank {
        match self {
            Backend::Dir(d) => Bank::create_dir(d.path(), config()).unwrap(),
            Backend::Mem(s) => Bank::create(Arc::new(s.clone()), config()).unwrap(),
        }
    }

    fn open(&self, options: OpenOptions) -> Bank {
        let storage: Arc<dyn Storage> = match self {
            Backend::Dir(d) => {
                return Bank::open_dir(d.path(), options).unwrap_or_else(|e| panic!("open: {e}"));
            }
            Backend::Mem(s) => Arc::new(s.clone()),
        };
        Bank::open(storage, options).unwrap_or_else(|e| panic!("open: {e}"))
    }
}

struct Harness {
    backend: Backend,
    bank: Option<Bank>,
    reader: Option<Bank>,
    model: Model,
    last_lsn: u64,
    last_match: Option<u32>,
    always_sync: bool,
    start_ms: u64,
}

impl Harness {
    fn new(backend: Backend) -> Harness {
        let start_ms = now_ms();
        let bank = backend.create();
        Harness {
            backend,
            bank: Some(bank),
            reader: None,
            model: Model::default(),
            last_lsn: 0,
            last_match: None,
            always_sync: true,
            start_ms,
        }
    }

    fn bank(&mut self) -> &mut Bank {
        self.bank.as_mut().unwrap()
    }

    fn pick(&self, p: Pick) -> u32 {
        let n = self.model.len();
        match p {
            Pick::Existing(seed) if n > 0 => seed % n,
            Pick::Recent(back) if n > 0 => n.saturating_sub(1 + back),
            Pick::LastMatch if n > 0 => self.last_match.unwrap_or(n - 1),
            Pick::Missing(offset) => n + offset,
            Pick::Residual(seed) => {
                let residual: Vec<u32> = (0..n)
                    .filter(|i| self.model.nodes[*i as usize].node_type == NodeType::Residual)
                    .collect();
                if residual.is_empty() {
                    self.pick(Pick::Existing(seed))
                } else {
                    residual[seed as usize % residual.len()]
                }
            }
            _ => 0,
        }
    }

    /// Every acknowledged write has a larger LSN than the previous one, and
    /// under `Always` it is durable when acknowledged.
    fn check_lsn(&mut self, lsn: u64) {
        assert!(lsn > self.last_lsn, "LSN {lsn} after {}", self.last_lsn);
        self.last_lsn = lsn;
        if self.always_sync {
            let durable = self.bank.as_ref().unwrap().durable_below_lsn();
            assert!(durable > lsn, "LSN {lsn} acknowledged but durable below {durable}");
        }
    }

    fn run(&mut self, op: &Op) {
        count("ops");
        match op {
            Op::Nop => {}
            Op::Insert {
                env,
                attach,
                failure,
                base,
                scale,
                scenario,
                fields,
                large,
                external_id,
            } => {
                let tree = usize::from(*env);
                let attach = match attach {
                    AttachGen::Auto => Attach::Auto,
                    AttachGen::Root => Attach::Root,
                    AttachGen::ParentIndex(p) => Attach::Parent(NodeRef::Index(self.pick(*p))),
                    AttachGen::ParentInTree(seed) => {
                        let same: Vec<u32> = (0..self.model.len())
                            .filter(|i| self.model.nodes[*i as usize].tree == tree)
                            .collect();
                        let i = if same.is_empty() {
                            self.pick(Pick::Existing(*seed))
                        } else {
                            same[*seed as usize % same.len()]
                        };
                        Attach::Parent(NodeRef::Index(i))
                    }
                    AttachGen::ParentExternal(e) => Attach::Parent(NodeRef::External(EXTERNAL_IDS[*e].0.into())),
                };
                let label = if *failure { Label::Failure } else { Label::Success };
                let mut payload = Payload {
                    scenario: SCENARIOS[*scenario].into(),
                    fields: BTreeMap::new(),
                };
                for (key, value) in fields {
                    payload.fields.insert(FIELD_KEYS[*key].into(), format!("value {value}"));
                }
                if let Some(seed) = large {
                    payload.fields.insert("trajectory".into(), noise_text(*seed, 100_000));
                }
                let raw = raw_vector(*base, *scale);
                let ext = external_id.map(|e| EXTERNAL_IDS[e]);
                let want = self
                    .model
                    .insert(tree, &attach, label, payload.clone(), normalise(&raw), ext);
                let got = self.bank().insert(NewNode {
                    tree: TREES[tree].0.into(),
                    attach: attach.clone(),
                    label,
                    payload,
                    embedding: raw,
                    external_id: ext.map(|(t, _)| t.to_string()),
                });
                match (got, want) {
                    (Ok(g), Ok(w)) => {
                        let ctx = format!("insert {attach:?}: bank {g:?} model {w:?}");
                        assert_eq!(g.id, w.id, "{ctx}");
                        assert_eq!(g.tree, TREES[tree].0, "{ctx}");
                        assert_eq!(
                            (g.node_type, g.parent, g.depth),
                            (w.node_type, w.parent, w.depth),
                            "{ctx}"
                        );
                        assert_eq!(g.matched.map(|m| m.0), w.matched.map(|m| m.0), "{ctx}");
                        if let (Some(gm), Some(wm)) = (g.matched, w.matched) {
                            assert!((f64::from(gm.1) - wm.1).abs() < 1e-5, "{ctx}");
                        }
                        if let Some((m, _)) = w.matched {
                            self.last_match = Some(m);
                        }
                        count(match (w.node_type, w.sibling) {
                            (NodeType::Root, _) => "insert root",
                            (_, true) => "insert sibling at D_max",
                            _ => "insert child",
                        });
                        if w.matched.is_some() {
                            count("insert auto matched");
                        }
                        if large.is_some() {
                            count("insert large payload");
                        }
                        self.check_lsn(g.lsn);
                    }
                    (Err(g), Err(w)) => {
                        count("insert error");
                        assert_error_in(&g, &w, "insert")
                    }
                    (g, w) => panic!("insert {attach:?}: bank {g:?}, model {w:?}"),
                }
            }
            Op::Hit(p) => {
                let i = self.pick(*p);
                let want = self.model.success_hit(i);
                match (self.bank().success_hit(i), want) {
                    (Ok(g), Ok((hits, due))) => {
                        assert_eq!((g.id, g.success_hits, g.due), (i, hits, due), "hit {i}");
                        count(if due { "hit made due" } else { "hit" });
                        self.check_lsn(g.lsn);
                    }
                    (Err(g), Err(w)) => assert_error_in(&g, &w, "success_hit"),
                    (g, w) => panic!("success_hit {i}: bank {g:?}, model {w:?}"),
                }
            }
            Op::Retrieve(picks) => {
                let list: Vec<u32> = picks.iter().map(|p| self.pick(*p)).collect();
                let want = self.model.record_retrievals(&list);
                match (self.bank().record_retrievals(&list), want) {
                    // An empty list writes nothing; what LSN it should
                    // report is `bug_empty_record_retrievals_reports_a_future_lsn`.
                    (Ok(lsn), Ok(())) if !list.is_empty() => self.check_lsn(lsn),
                    (Ok(_), Ok(())) => {}
                    (Err(g), Err(w)) => assert_error_in(&g, &w, "record_retrievals"),
                    (g, w) => panic!("record_retrievals {list:?}: bank {g:?}, model {w:?}"),
                }
            }
            Op::Consolidate { target, large } => {
                let i = match target {
                    ConsolidateTarget::Due(seed) => {
                        let due = self.model.due(None);
                        if due.is_empty() {
                            self.pick(Pick::Existing(*seed))
                        } else {
                            due[*seed as usize % due.len()]
                        }
                    }
                    ConsolidateTarget::Any(p) => self.pick(*p),
                };
                let mut fields = BTreeMap::new();
                fields.insert("execution_procedure".to_string(), format!("distilled {i}"));
                if let Some(seed) = large {
                    fields.insert("trajectory".into(), noise_text(*seed, 100_000));
                }
                let want = self.model.consolidate(i, fields.clone());
                match (self.bank().consolidate(i, fields), want) {
                    (Ok(g), Ok(new_root)) => {
                        assert_eq!((g.source, g.new_root), (i, new_root), "consolidate {i}");
                        count("consolidate ok");
                        self.check_lsn(g.lsn);
                    }
                    (Err(g), Err(w)) => {
                        count("consolidate error");
                        assert_error_in(&g, &w, "consolidate")
                    }
                    (g, w) => panic!("consolidate {i}: bank {g:?}, model {w:?}"),
                }
            }
            Op::Query {
                env,
                base,
                scale,
                k,
                tau,
                eps,
                include_consolidated,
            } => {
                let tree = usize::from(*env);
                let raw = raw_vector(*base, *scale);
                let opts = QueryOptions {
                    k: *k,
                    tau: tau.map(|t| TAU_OVERRIDES[t]),
                    eps: eps.map(|e| EPS_OVERRIDES[e]),
                    include_consolidated: *include_consolidated,
                };
                compare_query(self.bank.as_ref().unwrap(), &self.model, tree, &raw, &opts);
                let all = self
                    .model
                    .query(tree, &normalise(&raw), *k, opts.tau, opts.eps, *include_consolidated);
                count(if all.is_empty() { "query empty" } else { "query matched" });
                if all.windows(2).any(|w| w[0].score == w[1].score) {
                    count("query with exact tie");
                }
                if *include_consolidated && self.model.nodes.iter().any(|n| n.consolidated) {
                    count("query include_consolidated with consolidated nodes");
                }
                let best = self
                    .model
                    .query(tree, &normalise(&raw), 1, opts.tau, opts.eps, *include_consolidated);
                if let Some(m) = best.first() {
                    self.last_match = Some(m.id);
                }
            }
            Op::BadInput(kind) => self.bad_input(*kind),
            Op::Checkpoint => {
                count("checkpoint");
                self.bank().checkpoint().unwrap();
                compare_state(self.bank.as_ref().unwrap(), &self.model, false, self.start_ms);
            }
            Op::Reopen(o) | Op::Crash(o) => {
                let bank = self.bank.take().unwrap();
                if matches!(op, Op::Reopen(_)) {
                    count("close + reopen");
                    bank.close().unwrap();
                } else {
                    count("crash + reopen");
                    drop(bank);
                }
                self.bank = Some(self.backend.open(o.options()));
                self.always_sync = o.policy == 0;
                let bank = self.bank.as_ref().unwrap();
                compare_state(bank, &self.model, true, self.start_ms);
                assert_verified(bank);
            }
            Op::Reader { refresh } => {
                let mut reader = match (self.reader.take(), refresh) {
                    (Some(mut r), true) => {
                        count("reader refreshed");
                        r.refresh().unwrap();
                        r
                    }
                    _ => {
                        count("reader opened");
                        self.backend.open(OpenOptions {
                            read_only: true,
                            ..OpenOptions::default()
                        })
                    }
                };
                assert!(!reader.is_writer());
                compare_state(&reader, &self.model, true, self.start_ms);
                compare_query_battery(&reader, &self.model);
                let refused = reader.success_hit(0);
                assert!(
                    matches!(refused, Err(BankError::ReadOnly(_))),
                    "a reader must refuse writes: {refused:?}"
                );
                self.reader = Some(reader);
            }
        }
        compare_state(self.bank.as_ref().unwrap(), &self.model, false, self.start_ms);
    }

    fn bad_input(&mut self, kind: u8) {
        let good = raw_vector(0, 0);
        let node = |tree: &str, embedding: Vec<f32>| NewNode {
            tree: tree.into(),
            attach: Attach::Auto,
            label: Label::Success,
            payload: Payload {
                scenario: "bad input".into(),
                fields: BTreeMap::new(),
            },
            embedding,
            external_id: None,
        };
        let bank = self.bank.as_mut().unwrap();
        let (result, want) = match kind {
            0 => (bank.insert(node("task", vec![0.0; DIM])).map(drop), MErr::BadEmbedding),
            1 => (
                bank.insert(node("task", vec![1.0; DIM - 1])).map(drop),
                MErr::DimensionMismatch,
            ),
            2 => (bank.insert(node("nope", good)).map(drop), MErr::UnknownTree),
            3 => {
                let mut v = good;
                v[3] = f32::NAN;
                (bank.insert(node("env", v)).map(drop), MErr::BadEmbedding)
            }
            4 => (
                bank.query("nope", &good, &QueryOptions::default()).map(drop),
                MErr::UnknownTree,
            ),
            5 => {
                let mut v = good;
                v[0] = f32::INFINITY;
                (
                    bank.query("task", &v, &QueryOptions::default()).map(drop),
                    MErr::BadEmbedding,
                )
            }
            _ => (
                bank.query(
                    "task",
                    &good,
                    &QueryOptions {
                        tau: Some(f32::NAN),
                        ..QueryOptions::default()
                    },
                )
                .map(drop),
                MErr::BadConfig,
            ),
        };
        match result {
            Err(e) => assert_error_in(&e, &[want], &format!("bad input {kind}")),
            Ok(()) => panic!("bad input {kind} was accepted"),
        }
    }

    /// End of a case: full comparison, verify, and the same after a close
    /// and a reopen.
    fn finish(mut self) {
        count("cases");
        *COVERAGE.lock().unwrap().entry("nodes").or_default() += u64::from(self.model.len());
        let bank = self.bank.take().unwrap();
        compare_state(&bank, &self.model, true, self.start_ms);
        compare_query_battery(&bank, &self.model);
        assert_verified(&bank);
        drop(self.reader.take());
        bank.close().unwrap();
        let bank = self.backend.open(OpenOptions::default());
        compare_state(&bank, &self.model, true, self.start_ms);
        compare_query_battery(&bank, &self.model);
        assert_verified(&bank);
        print_coverage("coverage so far");
    }
}

/// Coverage counters, summed over all cases of a run; printed after each
/// case when `DELTAMEM_MODEL_STATS` is set (the last line is the total).
static COVERAGE: std::sync::Mutex<BTreeMap<&'static str, u64>> = std::sync::Mutex::new(BTreeMap::new());

fn count(what: &'static str) {
    *COVERAGE.lock().unwrap().entry(what).or_default() += 1;
}

fn print_coverage(label: &str) {
    if std::env::var_os("DELTAMEM_MODEL_STATS").is_some() {
        eprintln!("{label}: {:?}", COVERAGE.lock().unwrap());
    }
}

fn cases() -> u32 {
    std::env::var("DELTAMEM_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 2000,
        // The minimal failing sequence is printed; no regression files are
        // written into the source tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Random sessions on real files.
    #[test]
    fn bank_matches_model_on_files(ops in ops_strategy(30..=80)) {
        let mut h = Harness::new(Backend::Dir(tempfile::tempdir().unwrap()));
        for op in &ops.0 {
            h.run(op);
        }
        h.finish();
    }

    /// Shorter random sessions on the in-memory storage backend.
    #[test]
    fn bank_matches_model_in_memory(ops in ops_strategy(15..=40)) {
        let mut h = Harness::new(Backend::Mem(MemStorage::new()));
        for op in &ops.0 {
            h.run(op);
        }
        h.finish();
    }
}

// ---------------------------------------------------------------------------
// Deterministic tests of specific rules.

/// The premise of the float tolerance: distinct candidate scores are far
/// apart, and far from every threshold used.
#[test]
fn alphabet_is_well_separated() {
    let vectors: Vec<Vec<f32>> = ALPHABET.iter().map(|v| normalise(v)).collect();
    let taus: Vec<f64> = TREES.iter().map(|t| t.1).chain(TAU_OVERRIDES).map(f64::from).collect();
    let lowest_tau = taus.iter().copied().fold(f64::INFINITY, f64::min);
    for q in &vectors {
        for eps in std::iter::once(EPS).chain(EPS_OVERRIDES) {
            let mut scores = Vec::new();
            for (a, v) in vectors.iter().enumerate() {
                for failed in [false, true] {
                    let cos = dot64(q, v);
                    let s = cos - if failed { f64::from(eps) } else { 0.0 };
                    scores.push((a, failed, s, cos));
                }
            }
            for (i, x) in scores.iter().enumerate() {
                for t in &taus {
                    assert!((x.2 - t).abs() > 2e-3, "score {x:?} too close to tau {t}");
                }
                for y in &scores[i + 1..] {
                    let same_cos = x.0 == y.0 || (x.3 == 0.0 && y.3 == 0.0);
                    let same_value = same_cos && (x.1 == y.1 || eps == 0.0);
                    if same_value || x.2.max(y.2) < lowest_tau - 0.01 {
                        continue;
                    }
                    assert!(
                        (x.2 - y.2).abs() > 1e-3,
                        "scores {x:?} and {y:?} nearly tie (eps {eps})"
                    );
                }
            }
        }
    }
    // Orthogonal means disjoint supports (exactly 0 in f32 too).
    for a in &ALPHABET {
        for b in &ALPHABET {
            if dot64(a, b) == 0.0 {
                assert!(a.iter().zip(b).all(|(x, y)| *x == 0.0 || *y == 0.0));
            }
        }
    }
    // Scaling by a power of two normalises to the very same bits.
    for (base, expected) in vectors.iter().enumerate() {
        for scale in 0..SCALES.len() {
            assert_eq!(&normalise(&raw_vector(base, scale)), expected);
        }
    }
}

fn new_node(tree: &str, attach: Attach, label: Label, embedding: &[f32]) -> NewNode {
    NewNode {
        tree: tree.into(),
        attach,
        label,
        payload: Payload {
            scenario: "s".into(),
            fields: BTreeMap::new(),
        },
        embedding: embedding.to_vec(),
        external_id: None,
    }
}

const A: usize = 0;
const B: usize = 1;
const D: usize = 3;

#[test]
fn match_at_max_depth_gets_a_sibling() {
    let dir = tempfile::tempdir().unwrap();
    let mut bank = Bank::create_dir(dir.path(), config()).unwrap();
    let ok = Label::Success;
    // B, then D (matches B), then A (scores D .943 over B .894): a chain of 3.
    let r = bank.insert(new_node("task", Attach::Auto, ok, &ALPHABET[B])).unwrap();
    let c2 = bank.insert(new_node("task", Attach::Auto, ok, &ALPHABET[D])).unwrap();
    let c3 = bank.insert(new_node("task", Attach::Auto, ok, &ALPHABET[A])).unwrap();
    assert_eq!((r.node_type, r.depth), (NodeType::Root, 1));
    assert_eq!((c2.parent, c2.depth), (Some(r.id), 2));
    assert_eq!((c3.parent, c3.depth, c3.matched.unwrap().0), (Some(c2.id), 3, c2.id));
    // A again matches c3, which sits at D_max = 3: sibling under c2.
    let s = bank.insert(new_node("task", Attach::Auto, ok, &ALPHABET[A])).unwrap();
    assert_eq!(s.matched.unwrap().0, c3.id);
    assert_eq!((s.node_type, s.parent, s.depth), (NodeType::Residual, Some(c2.id), 3));
    assert_eq!(bank.chain(s.id).unwrap(), vec![r.id, c2.id, s.id]);
    // An explicit parent at D_max gets a sibling too.
    let e = bank
        .insert(new_node(
            "task",
            Attach::Parent(NodeRef::Index(c3.id)),
            ok,
            &ALPHABET[B],
        ))
        .unwrap();
    assert_eq!((e.parent, e.depth), (Some(c2.id), 3));
    // And it all survives a reopen.
    bank.close().unwrap();
    let bank = Bank::open_dir(dir.path(), OpenOptions::default()).unwrap();
    assert_eq!(bank.row(e.id).unwrap().parent(), Some(c2.id));
    assert_verified(&bank);
}

#[test]
fn consolidated_node_is_not_matched_before_or_after_checkpoint_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut bank = Bank::create_dir(dir.path(), config()).unwrap();
    let ok = Label::Success;
    let root = bank.insert(new_node("env", Attach::Root, ok, &ALPHABET[B])).unwrap();
    let child = bank
        .insert(new_node(
            "env",
            Attach::Parent(NodeRef::Index(root.id)),
            ok,
            &ALPHABET[A],
        ))
        .unwrap();
    for _ in 0..K_CONS {
        bank.success_hit(child.id).unwrap();
    }
    assert_eq!(bank.due_for_consolidation(Some("env")).unwrap(), vec![child.id]);
    // Checkpoint first, so the flag lands on a checkpointed row (overlay patch).
    bank.checkpoint().unwrap();
    let ack = bank.consolidate(child.id, BTreeMap::new()).unwrap();
    assert!(bank.due_for_consolidation(None).unwrap().is_empty());
    let again = bank.consolidate(child.id, BTreeMap::new());
    assert!(matches!(
        again,
        Err(BankError::AlreadyConsolidated { node, root }) if node == child.id && root == ack.new_root
    ));

    let check = |bank: &Bank, when: &str| {
        let q = |include_consolidated| {
            bank.query(
                "env",
                &ALPHABET[A],
                &QueryOptions {
                    k: 3,
                    include_consolidated,
                    ..QueryOptions::default()
                },
            )
            .unwrap()
            .iter()
            .map(|m| m.id)
            .collect::<Vec<_>>()
        };
        // The distilled root (depth 1) wins; the source is skipped.
        assert_eq!(q(false), vec![ack.new_root, root.id], "{when}");
        // With the switch the source is back, after its tie-mate at depth 1.
        assert_eq!(q(true), vec![ack.new_root, child.id, root.id], "{when}");
        let r = bank.row(ack.new_root).unwrap();
        assert!(r.is_consolidated_root() && r.link() == Some(child.id), "{when}");
        assert_eq!(bank.row(child.id).unwrap().link(), Some(ack.new_root), "{when}");
    };
    check(&bank, "in the overlay");
    bank.checkpoint().unwrap();
    check(&bank, "after checkpoint");
    bank.close().unwrap();
    let mut bank = Bank::open_dir(dir.path(), OpenOptions::default()).unwrap();
    check(&bank, "after reopen");
    assert_verified(&bank);
    // An auto insert of A matches the distilled root, not the source.
    let auto = bank.insert(new_node("env", Attach::Auto, ok, &ALPHABET[A])).unwrap();
    assert_eq!(auto.matched.unwrap().0, ack.new_root);
    assert_eq!(auto.parent, Some(ack.new_root));
}

#[test]
fn failure_penalty_flips_the_winner() {
    let dir = tempfile::tempdir().unwrap();
    let mut bank = Bank::create_dir(dir.path(), config()).unwrap();
    // Query A: A itself scores 1.0, D scores .943.
    let a = bank
        .insert(new_node("task", Attach::Root, Label::Failure, &ALPHABET[A]))
        .unwrap();
    let d = bank
        .insert(new_node("task", Attach::Root, Label::Success, &ALPHABET[D]))
        .unwrap();
    let top = |bank: &Bank, eps: Option<f32>| {
        let m = bank
            .query(
                "task",
                &ALPHABET[A],
                &QueryOptions {
                    k: 2,
                    eps,
                    ..QueryOptions::default()
                },
            )
            .unwrap();
        (m[0].id, m[0].score)
    };
    // eps .05: the failed A still wins (.95 > .943); eps .15: D wins.
    let (id, score) = top(&bank, None);
    assert_eq!(id, a.id);
    assert!((score - 0.95).abs() < 1e-5);
    assert_eq!(top(&bank, Some(0.15)).0, d.id);
    assert_eq!(top(&bank, Some(0.0)).0, a.id);
    // With the default eps, a failed exact match loses to a success at .97.
    let dir2 = tempfile::tempdir().unwrap();
    let mut bank = Bank::create_dir(dir2.path().join("a"), config()).unwrap();
    let q = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
    let near = [0.97, (1.0f32 - 0.97 * 0.97).sqrt(), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
    bank.insert(new_node("task", Attach::Root, Label::Failure, &q)).unwrap();
    let success = bank
        .insert(new_node("task", Attach::Root, Label::Success, &near))
        .unwrap();
    let child = bank.insert(new_node("task", Attach::Auto, Label::Success, &q)).unwrap();
    assert_eq!(child.matched.unwrap().0, success.id);
    assert_eq!(child.parent, Some(success.id));
    // A failure pushed below tau is no match at all: .85 - .05 < .82.
    let mut bank2 = Bank::create_dir(dir2.path().join("b"), config()).unwrap();
    let v85 = [0.85, (1.0f32 - 0.85 * 0.85).sqrt(), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
    bank2
        .insert(new_node("task", Attach::Root, Label::Failure, &v85))
        .unwrap();
    let lone = bank2
        .insert(new_node("task", Attach::Auto, Label::Success, &q))
        .unwrap();
    assert_eq!((lone.node_type, lone.matched), (NodeType::Root, None));
}

#[test]
fn ties_prefer_smaller_depth_then_older_node() {
    let dir = tempfile::tempdir().unwrap();
    let mut bank = Bank::create_dir(dir.path(), config()).unwrap();
    let ok = Label::Success;
    let a = &ALPHABET[A];
    let r1 = bank.insert(new_node("task", Attach::Root, ok, a)).unwrap().id;
    let r2 = bank.insert(new_node("task", Attach::Root, ok, a)).unwrap().id;
    let c2 = bank
        .insert(new_node("task", Attach::Parent(NodeRef::Index(r2)), ok, a))
        .unwrap()
        .id;
    bank.checkpoint().unwrap(); // half in the segments, half in the overlay
    let c1 = bank
        .insert(new_node("task", Attach::Parent(NodeRef::Index(r1)), ok, a))
        .unwrap()
        .id;
    let g = bank
        .insert(new_node("task", Attach::Parent(NodeRef::Index(c1)), ok, &ALPHABET[A]))
        .unwrap()
        .id;
    let ids = |bank: &Bank| {
        bank.query(
            "task",
            a,
            &QueryOptions {
                k: 10,
                ..QueryOptions::default()
            },
        )
        .unwrap()
        .iter()
        .map(|m| m.id)
        .collect::<Vec<_>>()
    };
    assert_eq!(ids(&bank), vec![r1, r2, c2, c1, g]);
    // Auto attach takes the tie winner r1 as parent.
    let auto = bank
        .insert(new_node(
            "task",
            Attach::Auto,
            ok,
            &[8.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        ))
        .unwrap();
    assert_eq!((auto.matched.unwrap().0, auto.parent), (r1, Some(r1)));
    bank.close().unwrap();
    let bank = Bank::open_dir(dir.path(), OpenOptions::default()).unwrap();
    assert_eq!(ids(&bank), vec![r1, r2, c2, c1, auto.id, g]);
}

#[test]
fn tau_is_inclusive() {
    let dir = tempfile::tempdir().unwrap();
    let mut bank = Bank::create_dir(dir.path(), config()).unwrap();
    let e0 = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
    let id = bank
        .insert(new_node("task", Attach::Root, Label::Success, &e0))
        .unwrap()
        .id;
    // A unit basis vector scores exactly 1.0 against itself.
    let at = |tau| {
        bank.query(
            "task",
            &e0,
            &QueryOptions {
                tau: Some(tau),
                ..QueryOptions::default()
            },
        )
        .map(|found| found.iter().map(|m| m.id).collect::<Vec<_>>())
    };
    assert_eq!(at(1.0).unwrap(), vec![id]);
    // Above 1 nothing could match: refused with init's range (issue 11).
    let e = at(1.0000001).unwrap_err().to_string();
    assert!(e.contains("outside -1..=1"), "{e}");
}

// ---------------------------------------------------------------------------
// Library bugs found by these tests. Each test states the expected
// behaviour; see the report for the proposed fix.

/// BUG (src/bank/mutate.rs, `record_retrievals`, the `ops.is_empty()` early
/// return): an empty list writes no record but returns `next_lsn()`, the
/// LSN the *next* commit will get. So two different calls return the same
/// LSN, and under `SyncPolicy::Always` the returned LSN is not durable
/// (`durable_below_lsn() <= lsn`), breaking "an acknowledged LSN is durable"
/// for anyone who waits on it. Expected: the last committed LSN
/// (`next_lsn() - 1`), which is what "nothing new to log" means.
#[test]
fn empty_record_retrievals_reports_the_last_committed_lsn() {
    let dir = tempfile::tempdir().unwrap();
    let mut bank = Bank::create_dir(dir.path(), config()).unwrap();
    let ack = bank
        .insert(new_node("task", Attach::Root, Label::Success, &ALPHABET[A]))
        .unwrap();
    let empty = bank.record_retrievals(&[]).unwrap();
    assert!(
        empty <= ack.lsn,
        "an empty record_retrievals wrote nothing but reported LSN {empty} (last commit {})",
        ack.lsn
    );
    assert!(bank.durable_below_lsn() > empty, "reported LSN {empty} is not durable");
    let next = bank.success_hit(ack.id).unwrap();
    assert!(next.lsn > empty, "LSN {} reported twice", next.lsn);
}

/// BUG (src/bank/mod.rs `with_external_ids` / `resolve` and
/// src/bank/mutate.rs `check_external_id`): external ids are keyed by their
/// 16 stored bytes only, without the UUID flag. A 16-byte text id and the
/// UUID whose bytes spell the same ASCII are different ids (SEMANTICS.md:
/// import must keep the reference's ids), yet the second insert is refused
/// as a duplicate, and resolving one returns the other node.
#[test]
fn text_external_id_and_uuid_of_same_bytes_are_distinct() {
    let dir = tempfile::tempdir().unwrap();
    let mut bank = Bank::create_dir(dir.path(), config()).unwrap();
    let text = "0123456789abcdef"; // 16 bytes of text
    let uuid = "30313233-3435-3637-3839-616263646566"; // the same 16 bytes as a UUID
    let mut n = new_node("task", Attach::Root, Label::Success, &ALPHABET[A]);
    n.external_id = Some(text.into());
    let first = bank.insert(n).unwrap().id;
    let mut n = new_node("task", Attach::Root, Label::Success, &ALPHABET[B]);
    n.external_id = Some(uuid.into());
    let second = bank.insert(n);
    assert!(second.is_ok(), "distinct external ids refused: {second:?}");
    let second = second.unwrap().id;
    assert_eq!(bank.resolve(&NodeRef::External(text.into())).unwrap(), first);
    assert_eq!(bank.resolve(&NodeRef::External(uuid.into())).unwrap(), second);
    assert_eq!(bank.row(second).unwrap().external_id_text().as_deref(), Some(uuid));
}

/// BUG (src/bank/checkpoint.rs `write_data_files` rewrites updated rows in
/// place in `nodes-*.seg`; src/storage/fs.rs maps segments MAP_SHARED):
/// ARCHITECTURE.md, "Concurrency", promises "A reader sees the state as of
/// its open (or last `refresh`)". On real files a reader that outlives a
/// writer checkpoint sees the new images of rows updated since its open
/// (counters, consolidated flag, a link to a node it cannot see), mixed with
/// its old node count: the source is hidden from its scans while the
/// distilled root is invisible to it. (MemStorage maps snapshots, so only
/// FileStorage shows this.)
#[test]
fn reader_never_follows_a_consolidation_it_cannot_see() {
    let dir = tempfile::tempdir().unwrap();
    let mut bank = Bank::create_dir(dir.path(), config()).unwrap();
    let ok = Label::Success;
    let root = bank
        .insert(new_node("task", Attach::Root, ok, &ALPHABET[B]))
        .unwrap()
        .id;
    let child = bank
        .insert(new_node("task", Attach::Parent(NodeRef::Index(root)), ok, &ALPHABET[A]))
        .unwrap()
        .id;
    bank.checkpoint().unwrap();
    let reader = Bank::open_dir(
        dir.path(),
        OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        },
    )
    .unwrap();
    let top = |b: &Bank| {
        b.query("task", &ALPHABET[A], &QueryOptions::default())
            .unwrap()
            .iter()
            .map(|m| m.id)
            .collect::<Vec<_>>()
    };
    assert_eq!(top(&reader), vec![child]); // maps the segment now
    for _ in 0..K_CONS {
        bank.success_hit(child).unwrap();
    }
    bank.record_retrievals(&[root, child]).unwrap();
    let distilled = bank.consolidate(child, BTreeMap::new()).unwrap().new_root;
    bank.checkpoint().unwrap();
    let row = reader.row(child).unwrap();
    assert_eq!(reader.node_count(), 2);
    // Documented semantics (ARCHITECTURE.md, Concurrency): counters may be
    // newer than the reader's open, never older; a consolidation into a
    // root the reader cannot see is not in force for it.
    assert!(row.success_hits <= K_CONS, "counters are the writer's, at most newer");
    assert_eq!(
        (row.is_consolidated(), row.link(), top(&reader)),
        (false, None, vec![child]),
        "without a refresh the reader (node count 2) must not lose the child to an invisible root"
    );
    let mut reader = reader;
    reader.refresh().unwrap();
    assert_eq!(top(&reader), vec![distilled]);
}

//! What the bank returns, as small immutable Python objects (attributes
//! named like the CLI's JSON keys) or dicts.

use std::collections::BTreeMap;

use deltamem::{CompactReport, ConsolidateAck, FreezeReport, HitAck, InsertAck, Match, NodeInfo, Stats, VerifyReport};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// Fields shown by `repr`, in order.
fn repr_of(class: &str, fields: &[(&str, String)]) -> String {
    let body: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{class}({})", body.join(", "))
}

fn opt<T: std::fmt::Debug>(value: &Option<T>) -> String {
    value.as_ref().map_or_else(|| "None".into(), |v| format!("{v:?}"))
}

/// What an insert did.
#[pyclass(name = "InsertAck", module = "deltamem", frozen, get_all, eq)]
#[derive(Debug, Clone, PartialEq)]
pub struct PyInsertAck {
    pub id: u32,
    pub tree: String,
    /// "ROOT" or "RESIDUAL".
    pub r#type: &'static str,
    pub parent: Option<u32>,
    pub depth: u8,
    /// Auto attach: the best match at or above tau, as (id, score).
    pub matched: Option<(u32, f32)>,
    pub lsn: u64,
}

impl From<InsertAck> for PyInsertAck {
    fn from(a: InsertAck) -> PyInsertAck {
        PyInsertAck {
            id: a.id,
            tree: a.tree,
            r#type: a.node_type.as_str(),
            parent: a.parent,
            depth: a.depth,
            matched: a.matched,
            lsn: a.lsn,
        }
    }
}

#[pymethods]
impl PyInsertAck {
    fn __repr__(&self) -> String {
        repr_of(
            "InsertAck",
            &[
                ("id", self.id.to_string()),
                ("tree", format!("{:?}", self.tree)),
                ("type", format!("{:?}", self.r#type)),
                ("parent", opt(&self.parent)),
                ("depth", self.depth.to_string()),
                ("matched", opt(&self.matched)),
                ("lsn", self.lsn.to_string()),
            ],
        )
    }
}

/// One query answer: the node, its failure-penalised score, its chain.
#[pyclass(name = "Match", module = "deltamem", frozen, get_all, eq)]
#[derive(Debug, Clone, PartialEq)]
pub struct PyMatch {
    pub id: u32,
    pub score: f32,
    pub depth: u8,
    pub r#type: &'static str,
    /// "SUCCESS" or "FAILURE".
    pub label: &'static str,
    /// Root first, ending with `id`.
    pub chain: Vec<u32>,
}

impl From<Match> for PyMatch {
    fn from(m: Match) -> PyMatch {
        PyMatch {
            id: m.id,
            score: m.score,
            depth: m.depth,
            r#type: m.node_type.as_str(),
            label: m.label.as_str(),
            chain: m.chain,
        }
    }
}

#[pymethods]
impl PyMatch {
    fn __repr__(&self) -> String {
        repr_of(
            "Match",
            &[
                ("id", self.id.to_string()),
                ("score", format!("{:.6}", self.score)),
                ("depth", self.depth.to_string()),
                ("type", format!("{:?}", self.r#type)),
                ("label", format!("{:?}", self.label)),
                ("chain", format!("{:?}", self.chain)),
            ],
        )
    }
}

/// A node with its payload and counters.
#[pyclass(name = "Node", module = "deltamem", frozen, get_all, eq)]
#[derive(Debug, Clone, PartialEq)]
pub struct PyNode {
    pub id: u32,
    pub tree: String,
    pub r#type: &'static str,
    pub label: &'static str,
    pub depth: u8,
    pub parent: Option<u32>,
    pub external_id: Option<String>,
    pub scenario: String,
    pub payload: BTreeMap<String, String>,
    pub success_hits: u32,
    pub retrievals: u32,
    /// Distilled into a consolidated root (not matched by default).
    pub consolidated: bool,
    /// A root distilled from another node.
    pub consolidated_root: bool,
    /// The consolidation link: the new root of a consolidated node, or
    /// the source of a consolidated root.
    pub link: Option<u32>,
    pub created_unix_ms: u64,
}

impl From<NodeInfo> for PyNode {
    fn from(n: NodeInfo) -> PyNode {
        let row = n.row;
        PyNode {
            id: row.index,
            tree: n.tree_name,
            r#type: row.node_type.as_str(),
            label: row.label.as_str(),
            depth: row.depth,
            parent: row.parent(),
            external_id: row.external_id_text(),
            scenario: n.payload.scenario,
            payload: n.payload.fields,
            success_hits: row.success_hits,
            retrievals: row.retrievals,
            consolidated: row.is_consolidated(),
            consolidated_root: row.is_consolidated_root(),
            link: row.link(),
            created_unix_ms: row.created_unix_ms,
        }
    }
}

#[pymethods]
impl PyNode {
    fn __repr__(&self) -> String {
        repr_of(
            "Node",
            &[
                ("id", self.id.to_string()),
                ("tree", format!("{:?}", self.tree)),
                ("type", format!("{:?}", self.r#type)),
                ("label", format!("{:?}", self.label)),
                ("depth", self.depth.to_string()),
                ("parent", opt(&self.parent)),
                ("scenario", format!("{:?}", self.scenario)),
            ],
        )
    }
}

#[pyclass(name = "HitAck", module = "deltamem", frozen, get_all, eq)]
#[derive(Debug, Clone, PartialEq)]
pub struct PyHitAck {
    pub id: u32,
    pub success_hits: u32,
    /// The node is now due for consolidation.
    pub due: bool,
    pub lsn: u64,
}

impl From<HitAck> for PyHitAck {
    fn from(a: HitAck) -> PyHitAck {
        PyHitAck {
            id: a.id,
            success_hits: a.success_hits,
            due: a.due,
            lsn: a.lsn,
        }
    }
}

#[pymethods]
impl PyHitAck {
    fn __repr__(&self) -> String {
        format!(
            "HitAck(id={}, success_hits={}, due={}, lsn={})",
            self.id,
            self.success_hits,
            if self.due { "True" } else { "False" },
            self.lsn
        )
    }
}

#[pyclass(name = "ConsolidateAck", module = "deltamem", frozen, get_all, eq)]
#[derive(Debug, Clone, PartialEq)]
pub struct PyConsolidateAck {
    pub source: u32,
    pub new_root: u32,
    pub lsn: u64,
}

impl From<ConsolidateAck> for PyConsolidateAck {
    fn from(a: ConsolidateAck) -> PyConsolidateAck {
        PyConsolidateAck {
            source: a.source,
            new_root: a.new_root,
            lsn: a.lsn,
        }
    }
}

#[pymethods]
impl PyConsolidateAck {
    fn __repr__(&self) -> String {
        format!(
            "ConsolidateAck(source={}, new_root={}, lsn={})",
            self.source, self.new_root, self.lsn
        )
    }
}

/// One problem `verify` found, with its file and offset.
#[pyclass(name = "Problem", module = "deltamem", frozen, get_all, eq)]
#[derive(Debug, Clone, PartialEq)]
pub struct PyProblem {
    pub file: String,
    pub offset_bytes: u64,
    pub detail: String,
}

#[pymethods]
impl PyProblem {
    fn __repr__(&self) -> String {
        format!(
            "Problem(file={:?}, offset_bytes={}, detail={:?})",
            self.file, self.offset_bytes, self.detail
        )
    }
}

/// What `verify` checked and found; true when no problem was found.
#[pyclass(name = "VerifyReport", module = "deltamem", frozen, get_all)]
#[derive(Debug, Clone)]
pub struct PyVerifyReport {
    pub ok: bool,
    pub nodes_checked: u64,
    pub wal_records: u64,
    pub problems: Vec<PyProblem>,
}

impl From<VerifyReport> for PyVerifyReport {
    fn from(r: VerifyReport) -> PyVerifyReport {
        PyVerifyReport {
            ok: r.is_ok(),
            nodes_checked: r.nodes_checked,
            wal_records: r.wal_records,
            problems: r
                .problems
                .into_iter()
                .map(|p| PyProblem {
                    file: p.file,
                    offset_bytes: p.offset_bytes,
                    detail: p.detail,
                })
                .collect(),
        }
    }
}

#[pymethods]
impl PyVerifyReport {
    fn __bool__(&self) -> bool {
        self.ok
    }

    fn __repr__(&self) -> String {
        format!(
            "VerifyReport(ok={}, nodes_checked={}, wal_records={}, problems={})",
            if self.ok { "True" } else { "False" },
            self.nodes_checked,
            self.wal_records,
            self.problems.len()
        )
    }
}

pub fn stats_dict<'py>(py: Python<'py>, s: &Stats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("dim", s.dim_count)?;
    d.set_item("nodes", s.nodes)?;
    d.set_item("checkpointed_nodes", s.checkpointed_nodes)?;
    d.set_item("precision", s.precision.as_str())?;
    d.set_item("vector_bytes", s.vector_bytes)?;
    d.set_item("table_bytes", s.table_bytes)?;
    d.set_item("payload_bytes", s.payload_bytes)?;
    d.set_item("wal_bytes", s.wal_bytes)?;
    d.set_item("checkpoint_lsn", s.checkpoint_lsn)?;
    d.set_item("frozen", s.frozen)?;
    let trees = PyDict::new(py);
    for t in &s.trees {
        let td = PyDict::new(py);
        td.set_item("tau", t.tau)?;
        td.set_item("nodes", t.nodes)?;
        td.set_item("roots", t.roots)?;
        td.set_item("residuals", t.residuals)?;
        td.set_item("successes", t.successes)?;
        td.set_item("failures", t.failures)?;
        td.set_item("consolidated", t.consolidated)?;
        td.set_item("consolidated_roots", t.consolidated_roots)?;
        td.set_item("due_for_consolidation", t.due_for_consolidation)?;
        td.set_item("depth_histogram", PyList::new(py, &t.depth_histogram)?)?;
        trees.set_item(&t.name, td)?;
    }
    d.set_item("trees", trees)?;
    Ok(d)
}

pub fn freeze_dict<'py>(py: Python<'py>, r: &FreezeReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("nodes", r.nodes)?;
    d.set_item("bytes_written", r.bytes_written)?;
    d.set_item("out", &r.out)?;
    Ok(d)
}

pub fn compact_dict<'py>(py: Python<'py>, r: &CompactReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("nodes", r.nodes)?;
    d.set_item("bytes_before", r.bytes_before)?;
    d.set_item("bytes_after", r.bytes_after)?;
    d.set_item("generation", r.generation)?;
    Ok(d)
}

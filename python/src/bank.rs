//! `deltamem.Bank`: one bank handle shared by any number of Python threads.
//!
//! The handle sits behind a read-write lock: queries and other reads run in
//! parallel, writes one at a time. Every call that scans, writes, fsyncs,
//! checkpoints or imports releases the GIL first and takes the lock
//! without it, so a thread waiting for the lock never blocks the others.

use std::path::PathBuf;
use std::sync::RwLock;
use std::time::Duration;

use deltamem::interop::InteropError;
use deltamem::{Bank, BankConfig, BankError, Change, ChangeAck, NewNode, OpenOptions, QueryOptions, TreeSpec};
use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::args::{self, RowArgs};
use crate::arrays;
use crate::errors;
use crate::values::{
    PyConsolidateAck, PyHitAck, PyInsertAck, PyMatch, PyNode, PyVerifyReport, compact_dict, freeze_dict, stats_dict,
};

/// Why a call failed, carried out of the GIL-free section.
pub enum Fail {
    Closed,
    Bank(BankError),
    Interop(InteropError),
}

impl From<BankError> for Fail {
    fn from(e: BankError) -> Fail {
        Fail::Bank(e)
    }
}

impl From<InteropError> for Fail {
    fn from(e: InteropError) -> Fail {
        Fail::Interop(e)
    }
}

impl Fail {
    pub fn into_py(self, py: Python<'_>) -> PyErr {
        match self {
            Fail::Closed => errors::closed(py),
            Fail::Bank(e) => errors::bank(py, e),
            Fail::Interop(e) => errors::interop(py, e),
        }
    }
}

fn panicked() -> Fail {
    Fail::Bank(BankError::Poisoned(
        "an earlier call on this handle panicked while holding it".into(),
    ))
}

#[pyclass(name = "Bank", module = "deltamem", frozen)]
pub struct PyBank {
    inner: RwLock<Option<Bank>>,
    path: PathBuf,
    dim: u32,
}

impl PyBank {
    /// A handle on the bank `make` creates or opens, without the GIL.
    fn opened(
        py: Python<'_>,
        path: PathBuf,
        make: impl FnOnce(&std::path::Path) -> Result<Bank, BankError> + Send,
    ) -> PyResult<PyBank> {
        let bank = py.detach(|| make(&path)).map_err(|e| errors::bank(py, e))?;
        Ok(PyBank {
            dim: bank.dim_count(),
            inner: RwLock::new(Some(bank)),
            path,
        })
    }

    /// Runs `f` on the bank under the read lock, without the GIL.
    pub fn read<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&Bank) -> Result<T, Fail> + Send) -> PyResult<T> {
        py.detach(|| {
            let guard = self.inner.read().map_err(|_| panicked())?;
            f(guard.as_ref().ok_or(Fail::Closed)?)
        })
        .map_err(|e| e.into_py(py))
    }

    /// Runs `f` on the bank under the write lock, without the GIL.
    pub fn write<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut Bank) -> Result<T, Fail> + Send) -> PyResult<T> {
        py.detach(|| {
            let mut guard = self.inner.write().map_err(|_| panicked())?;
            f(guard.as_mut().ok_or(Fail::Closed)?)
        })
        .map_err(|e| e.into_py(py))
    }

    fn resolve(&self, py: Python<'_>, node: &Bound<'_, PyAny>) -> PyResult<u32> {
        let node = args::node_ref(node)?;
        self.read(py, |b| Ok(b.resolve(&node)?))
    }
}

fn tree_specs(trees: &Bound<'_, PyAny>) -> PyResult<Vec<TreeSpec>> {
    let py = trees.py();
    let dict = trees
        .cast::<PyDict>()
        .map_err(|_| errors::invalid(py, "trees must be a dict of tree name to tau"))?;
    let mut out = Vec::with_capacity(dict.len());
    for (name, tau) in dict.iter() {
        out.push(TreeSpec {
            name: name
                .extract()
                .map_err(|_| errors::invalid(py, format!("tree name {name} is not a str")))?,
            tau: tau
                .extract()
                .map_err(|_| errors::invalid(py, format!("tau of tree {name} is not a number")))?,
        });
    }
    Ok(out)
}

/// Most cells of `query_batch`'s [m, k] answer (12 bytes each: ~3 GiB).
const MAX_BATCH_RESULTS: usize = 1 << 28;

fn query_options(
    py: Python<'_>,
    k: usize,
    tau: Option<f32>,
    eps: Option<f32>,
    include: bool,
) -> PyResult<QueryOptions> {
    let options = QueryOptions {
        k,
        tau,
        eps,
        include_consolidated: include,
    };
    // Checked before the batch's answer is sized (the bank checks again).
    options.validate().map_err(|e| errors::bank(py, e))?;
    Ok(options)
}

fn inserted(acks: Vec<ChangeAck>) -> Vec<PyInsertAck> {
    acks.into_iter()
        .filter_map(|a| match a {
            ChangeAck::Inserted(a) => Some(a.into()),
            _ => None,
        })
        .collect()
}

/// Every node of `tree` (all trees if None), in index order.
fn node_ids(bank: &Bank, tree: Option<&str>) -> Result<Vec<u32>, Fail> {
    let tree = tree.map(|t| bank.tree_index(t)).transpose()?;
    let mut out = Vec::new();
    for index in 0..bank.node_count() {
        if tree.is_none_or(|t| bank.row(index).is_ok_and(|r| r.tree == t)) {
            out.push(index);
        }
    }
    Ok(out)
}

#[pymethods]
impl PyBank {
    /// Creates a bank in directory `path` and returns it open for writing.
    #[staticmethod]
    #[pyo3(signature = (path, dim, trees=None, eps=0.05, max_depth=5, consolidate_after=3, precision="f32", sync="always", rows_per_segment=None))]
    #[allow(clippy::too_many_arguments)]
    fn create(
        py: Python<'_>,
        path: PathBuf,
        dim: u32,
        trees: Option<&Bound<'_, PyAny>>,
        eps: f32,
        max_depth: u8,
        consolidate_after: u32,
        precision: &str,
        sync: &str,
        rows_per_segment: Option<u32>,
    ) -> PyResult<PyBank> {
        let mut config = BankConfig::new(dim);
        if let Some(trees) = trees {
            config.trees = tree_specs(trees)?;
        }
        config.eps = eps;
        config.max_depth = max_depth;
        config.consolidate_after = consolidate_after;
        config.rows_per_segment = rows_per_segment;
        config.precision = deltamem::format::manifest::Precision::parse(precision).ok_or_else(|| {
            errors::invalid(
                py,
                format!("precision {precision:?} is not \"f32\", \"f16\" or \"int8\""),
            )
        })?;
        let policy = args::sync(py, sync)?;
        PyBank::opened(py, path, |path| {
            let mut bank = Bank::create_dir(path, config)?;
            bank.set_sync_policy(policy);
            Ok(bank)
        })
    }

    /// Opens an existing bank: the writer (one process at a time), or a
    /// read-only handle (any number, alongside the writer). The writer
    /// waits up to `lock_wait_s` for another process's lock (without the
    /// GIL), then raises `LockedError`.
    #[staticmethod]
    #[pyo3(signature = (path, read_only=false, sync="always", query_threads=1, lock_wait_s=0.0))]
    fn open(
        py: Python<'_>,
        path: PathBuf,
        read_only: bool,
        sync: &str,
        query_threads: usize,
        lock_wait_s: f64,
    ) -> PyResult<PyBank> {
        let options = OpenOptions {
            read_only,
            sync: args::sync(py, sync)?,
            ..OpenOptions::default()
        };
        let lock_wait = Duration::try_from_secs_f64(lock_wait_s)
            .map_err(|_| errors::invalid(py, format!("lock_wait_s {lock_wait_s} is not a duration")))?;
        // Ctrl-C while waiting for the lock: the wait checks for signals
        // between tries (the GIL is taken for that only) and raises
        // KeyboardInterrupt at once instead of waiting the time out.
        let opened = PyBank::opened(py, path, |path| {
            let mut bank = Bank::open_dir_waiting_unless(path, options, lock_wait, errors::signal_pending)?;
            bank.set_query_threads(query_threads);
            Ok(bank)
        });
        match errors::take_signal() {
            Some(e) => Err(e),
            None => opened,
        }
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// Closes the bank (with a checkpoint for the writer), also when the
    /// block raised.
    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    /// Checkpoints (the writer) and releases the bank; later calls raise
    /// ClosedError. Closing twice is a no-op.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            let mut guard = self.inner.write().map_err(|_| panicked())?;
            match guard.take() {
                Some(bank) => Ok(bank.close()?),
                None => Ok(()),
            }
        })
        .map_err(|e: Fail| e.into_py(py))
    }

    /// Read-only handles: picks up what the writer committed since.
    fn refresh(&self, py: Python<'_>) -> PyResult<()> {
        self.write(py, |b| Ok(b.refresh()?))
    }

    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    #[getter]
    fn dim(&self) -> u32 {
        self.dim
    }

    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        // Without the GIL: a writer may hold the lock for a while.
        py.detach(|| self.inner.read().map_or(true, |g| g.is_none()))
    }

    #[getter]
    fn read_only(&self, py: Python<'_>) -> PyResult<bool> {
        self.read(py, |b| Ok(!b.is_writer()))
    }

    #[getter]
    fn precision(&self, py: Python<'_>) -> PyResult<&'static str> {
        self.read(py, |b| Ok(b.precision().as_str()))
    }

    /// Tree names and their thresholds, in creation order.
    #[getter]
    fn trees<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let trees = self.read(py, |b| Ok(b.manifest().trees.clone()))?;
        let d = PyDict::new(py);
        for t in trees {
            d.set_item(t.name, t.tau)?;
        }
        Ok(d)
    }

    /// Threads one query may use to scan the checkpointed column.
    #[getter]
    fn query_threads(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |b| Ok(b.query_threads()))
    }

    /// Lets each query split its scan over up to `threads` threads
    /// (results are the same for any count).
    fn set_query_threads(&self, py: Python<'_>, threads: usize) -> PyResult<()> {
        self.write(py, |b| {
            b.set_query_threads(threads);
            Ok(())
        })
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |b| Ok(b.node_count() as usize))
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        match self.read(py, |b| Ok((b.node_count(), b.is_writer()))) {
            Ok((n, w)) => format!(
                "Bank({:?}, dim={}, nodes={n}, {})",
                self.path,
                self.dim,
                if w { "writer" } else { "read-only" }
            ),
            Err(_) => format!("Bank({:?}, closed)", self.path),
        }
    }

    /// Inserts one node (one WAL record) and returns its ack.
    #[pyo3(signature = (tree, embedding, scenario, payload=None, label="SUCCESS", attach=None, external_id=None, sync=None))]
    #[allow(clippy::too_many_arguments)]
    fn insert(
        &self,
        py: Python<'_>,
        tree: &str,
        embedding: &Bound<'_, PyAny>,
        scenario: String,
        payload: Option<&Bound<'_, PyAny>>,
        label: &str,
        attach: Option<&Bound<'_, PyAny>>,
        external_id: Option<String>,
        sync: Option<&str>,
    ) -> PyResult<PyInsertAck> {
        let vector = arrays::vector(embedding, self.dim, "embedding")?;
        let node = NewNode {
            tree: tree.to_string(),
            attach: attach.map_or(Ok(deltamem::Attach::Auto), args::attach)?,
            label: args::label(py, label)?,
            payload: deltamem::Payload {
                scenario,
                fields: args::fields(payload)?,
            },
            embedding: vector.values().to_vec(),
            external_id,
        };
        let sync = args::opt_sync(py, sync)?;
        self.write(py, |b| Ok(b.insert_with(node, sync)?.into()))
    }

    /// Inserts `n` nodes as one transaction (one WAL record, all or none).
    #[pyo3(signature = (tree, embeddings, scenarios, payloads=None, labels=None, attach=None, external_ids=None, sync=None))]
    #[allow(clippy::too_many_arguments)]
    fn insert_many(
        &self,
        py: Python<'_>,
        tree: &str,
        embeddings: &Bound<'_, PyAny>,
        scenarios: &Bound<'_, PyAny>,
        payloads: Option<&Bound<'_, PyAny>>,
        labels: Option<&Bound<'_, PyAny>>,
        attach: Option<&Bound<'_, PyAny>>,
        external_ids: Option<&Bound<'_, PyAny>>,
        sync: Option<&str>,
    ) -> PyResult<Vec<PyInsertAck>> {
        let matrix = arrays::matrix(embeddings, self.dim, "embeddings")?;
        let rows = RowArgs {
            tree,
            rows: matrix.rows(),
            scenarios: Some(scenarios),
            payloads,
            labels,
            attach,
            external_ids,
            default_attach: deltamem::Attach::Auto,
            default_scenarios: false,
        };
        let changes: Vec<Change> = args::new_nodes(py, &rows)?.into_iter().map(Change::Insert).collect();
        let sync = args::opt_sync(py, sync)?;
        // The rows are read in place from the array (no copy per row).
        let values = matrix.values();
        self.write(py, move |b| Ok(inserted(b.transact_column(&changes, values, sync)?)))
    }

    /// Bulk load for build pipelines: the rows are made durable by one
    /// checkpoint (written once, straight to the vector segments, not
    /// through the WAL); all or nothing. Returns the new ids.
    #[pyo3(signature = (tree, embeddings, scenarios=None, payloads=None, labels=None, attach=None, external_ids=None))]
    #[allow(clippy::too_many_arguments)]
    fn load<'py>(
        &self,
        py: Python<'py>,
        tree: &str,
        embeddings: &Bound<'py, PyAny>,
        scenarios: Option<&Bound<'py, PyAny>>,
        payloads: Option<&Bound<'py, PyAny>>,
        labels: Option<&Bound<'py, PyAny>>,
        attach: Option<&Bound<'py, PyAny>>,
        external_ids: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let matrix = arrays::matrix(embeddings, self.dim, "embeddings")?;
        let rows = RowArgs {
            tree,
            rows: matrix.rows(),
            scenarios,
            payloads,
            labels,
            attach,
            external_ids,
            default_attach: deltamem::Attach::Root,
            default_scenarios: true,
        };
        let nodes = args::new_nodes(py, &rows)?;
        let values = matrix.values();
        let ids = self.write(py, move |b| {
            let changes: Vec<Change> = nodes.into_iter().map(Change::Insert).collect();
            let acks = b.load_column(&changes, values)?;
            Ok(inserted(acks).iter().map(|a| i64::from(a.id)).collect::<Vec<i64>>())
        })?;
        Ok(PyArray1::from_vec(py, ids))
    }

    /// Top-k failure-penalised matches at or above tau, best first.
    #[pyo3(signature = (tree, embedding, k=1, tau=None, eps=None, include_consolidated=false))]
    #[allow(clippy::too_many_arguments)]
    fn query(
        &self,
        py: Python<'_>,
        tree: &str,
        embedding: &Bound<'_, PyAny>,
        k: usize,
        tau: Option<f32>,
        eps: Option<f32>,
        include_consolidated: bool,
    ) -> PyResult<Vec<PyMatch>> {
        let vector = arrays::vector(embedding, self.dim, "embedding")?;
        let options = query_options(py, k, tau, eps, include_consolidated)?;
        let values = vector.values();
        self.read(py, |b| {
            Ok(b.query(tree, values, &options)?
                .into_iter()
                .map(PyMatch::from)
                .collect())
        })
    }

    /// Many queries in one pass over the column. Returns `(ids, scores)`,
    /// both `[m, k]` (id -1 and score NaN where fewer than k matched), and
    /// with `chains=True` also each match's chain as lists.
    #[pyo3(signature = (tree, queries, k=1, tau=None, eps=None, include_consolidated=false, chains=false))]
    #[allow(clippy::too_many_arguments)]
    fn query_batch<'py>(
        &self,
        py: Python<'py>,
        tree: &str,
        queries: &Bound<'py, PyAny>,
        k: usize,
        tau: Option<f32>,
        eps: Option<f32>,
        include_consolidated: bool,
        chains: bool,
    ) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
        let matrix = arrays::matrix(queries, self.dim, "queries")?;
        let options = query_options(py, k, tau, eps, include_consolidated)?;
        let (values, dim, m) = (matrix.values(), self.dim as usize, matrix.rows());
        // The answer is two [m, k] arrays: refused before the scan when
        // they could not be allocated, rather than aborting the process.
        if m.checked_mul(k).is_none_or(|cells| cells > MAX_BATCH_RESULTS) {
            return Err(errors::invalid(
                py,
                format!("query_batch: {m} queries x k = {k} is over {MAX_BATCH_RESULTS} results; ask for a smaller k"),
            ));
        }
        let answers = self.read(py, |b| {
            let rows: Vec<&[f32]> = values.chunks_exact(dim.max(1)).collect();
            Ok(b.query_batch(tree, &rows, &options)?)
        })?;
        let mut ids = vec![-1i64; m * k];
        let mut scores = vec![f32::NAN; m * k];
        for (q, matches) in answers.iter().enumerate() {
            for (j, found) in matches.iter().enumerate().take(k) {
                ids[q * k + j] = i64::from(found.id);
                scores[q * k + j] = found.score;
            }
        }
        let ids = PyArray1::from_vec(py, ids).reshape([m, k])?;
        let scores = PyArray1::from_vec(py, scores).reshape([m, k])?;
        if !chains {
            return pyo3::types::PyTuple::new(py, [ids.into_any(), scores.into_any()]);
        }
        let chain_lists = PyList::empty(py);
        for matches in &answers {
            let per_query: Vec<&Vec<u32>> = matches.iter().map(|found| &found.chain).collect();
            chain_lists.append(per_query)?;
        }
        pyo3::types::PyTuple::new(py, [ids.into_any(), scores.into_any(), chain_lists.into_any()])
    }

    /// A node by index (int) or external id (str).
    fn node(&self, py: Python<'_>, id: &Bound<'_, PyAny>) -> PyResult<PyNode> {
        let node = args::node_ref(id)?;
        self.read(py, |b| {
            let index = b.resolve(&node)?;
            Ok(b.node(index)?.into())
        })
    }

    /// The index of the node with this external id (NotFoundError if none).
    fn resolve_id(&self, py: Python<'_>, external_id: &Bound<'_, PyAny>) -> PyResult<u32> {
        self.resolve(py, external_id)
    }

    /// Iterates over the nodes of `tree` (every tree if None), by index.
    #[pyo3(signature = (tree=None))]
    fn nodes(slf: Bound<'_, Self>, tree: Option<&str>) -> PyResult<NodeIter> {
        let py = slf.py();
        let ids = slf.get().read(py, |b| node_ids(b, tree))?;
        Ok(NodeIter {
            bank: slf.unbind(),
            ids,
            next: 0,
        })
    }

    /// Node ids of the chain, top-level root first, ending with `id`.
    fn chain(&self, py: Python<'_>, id: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
        let node = args::node_ref(id)?;
        self.read(py, |b| Ok(b.chain(b.resolve(&node)?)?))
    }

    /// The chain as prompt text, in the tree's style.
    fn render_chain(&self, py: Python<'_>, id: &Bound<'_, PyAny>) -> PyResult<String> {
        let node = args::node_ref(id)?;
        self.read(py, |b| Ok(b.render_chain(b.resolve(&node)?)?))
    }

    /// `(ids, vectors)` of the nodes of `tree` (all if None): int64 `[n]`
    /// and the stored (normalised) float32 vectors `[n, dim]`.
    #[pyo3(signature = (tree=None))]
    fn embeddings<'py>(&self, py: Python<'py>, tree: Option<&str>) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
        let dim = self.dim as usize;
        let (ids, values) = self.read(py, |b| {
            let ids = node_ids(b, tree)?;
            let mut values = Vec::with_capacity(ids.len() * dim);
            for &i in &ids {
                values.extend_from_slice(&b.vector(i)?);
            }
            Ok((ids, values))
        })?;
        let n = ids.len();
        let ids = PyArray1::from_vec(py, ids.into_iter().map(i64::from).collect());
        let vectors = PyArray1::from_vec(py, values).reshape([n, dim])?;
        pyo3::types::PyTuple::new(py, [ids.into_any(), vectors.into_any()])
    }

    /// Counts one success of the node's chain (toward consolidation).
    #[pyo3(signature = (id, sync=None))]
    fn success_hit(&self, py: Python<'_>, id: &Bound<'_, PyAny>, sync: Option<&str>) -> PyResult<PyHitAck> {
        let node = args::node_ref(id)?;
        let sync = args::opt_sync(py, sync)?;
        self.write(py, |b| {
            let index = b.resolve(&node)?;
            let acks = b.transact(&[Change::SuccessHit(index)], sync)?;
            match acks.into_iter().next() {
                Some(ChangeAck::Hit(hit)) => Ok(hit.into()),
                _ => unreachable!("a success hit is acknowledged by a hit ack"),
            }
        })
    }

    /// Counts one retrieval of each distinct node; returns the record's LSN.
    fn record_retrievals(&self, py: Python<'_>, ids: Vec<Bound<'_, PyAny>>) -> PyResult<u64> {
        let refs: Vec<_> = ids.iter().map(args::node_ref).collect::<PyResult<_>>()?;
        self.write(py, |b| {
            let indexes: Vec<u32> = refs.iter().map(|r| b.resolve(r)).collect::<Result<_, _>>()?;
            Ok(b.record_retrievals(&indexes)?)
        })
    }

    /// Nodes due for consolidation (success hits reached K_cons).
    #[pyo3(signature = (tree=None))]
    fn due(&self, py: Python<'_>, tree: Option<&str>) -> PyResult<Vec<u32>> {
        self.read(py, |b| Ok(b.due_for_consolidation(tree)?))
    }

    /// Distils a due node into a new consolidated root with `payload`.
    fn consolidate(
        &self,
        py: Python<'_>,
        id: &Bound<'_, PyAny>,
        payload: &Bound<'_, PyAny>,
    ) -> PyResult<PyConsolidateAck> {
        let node = args::node_ref(id)?;
        let fields = args::fields(Some(payload))?;
        self.write(py, |b| {
            let index = b.resolve(&node)?;
            Ok(b.consolidate(index, fields)?.into())
        })
    }

    /// Folds the WAL into the data files.
    fn checkpoint(&self, py: Python<'_>) -> PyResult<()> {
        self.write(py, |b| Ok(b.checkpoint()?))
    }

    /// Makes every acknowledged write durable now (sync="batch"/"none").
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        self.write(py, |b| Ok(b.sync()?))
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.read(py, |b| Ok(b.stats()?))?;
        stats_dict(py, &stats)
    }

    /// Checks every checksum and invariant; lists problems with file and
    /// offset instead of stopping at the first.
    fn verify(&self, py: Python<'_>) -> PyResult<PyVerifyReport> {
        self.read(py, |b| Ok(b.verify()?.into()))
    }

    /// Writes a compacted, read-only copy to `out` (which must not exist).
    fn freeze<'py>(&self, py: Python<'py>, out: PathBuf) -> PyResult<Bound<'py, PyDict>> {
        let report = self.read(py, |b| Ok(b.freeze_to(&out)?))?;
        freeze_dict(py, &report)
    }

    /// Rewrites the data files without dead payload bytes.
    fn compact<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let report = self.write(py, |b| Ok(b.compact()?))?;
        compact_dict(py, &report)
    }

    /// Imports a tree file of the DeltaMem reference implementation into
    /// `tree`; returns the new ids in the file's node order.
    #[pyo3(signature = (tree, path, batch=4096, sync=None))]
    fn import_reference(
        &self,
        py: Python<'_>,
        tree: &str,
        path: PathBuf,
        batch: usize,
        sync: Option<&str>,
    ) -> PyResult<Vec<u32>> {
        crate::interop::import_reference(self, py, tree, &path, batch, args::opt_sync(py, sync)?)
    }

    /// Writes `tree` as a reference tree file ("reference-json") or JSON
    /// Lines ("jsonl"), through a temporary file renamed into place.
    #[pyo3(signature = (tree, path, format="reference-json"))]
    fn export_reference(&self, py: Python<'_>, tree: &str, path: PathBuf, format: &str) -> PyResult<u64> {
        crate::interop::export_reference(self, py, tree, &path, format)
    }

    /// Loads a `.npy` matrix (float32/float16/float64 `[n, dim]`, memory
    /// mapped) into `tree` with `load`; the other arguments as for `load`.
    #[pyo3(signature = (tree, path, scenarios=None, payloads=None, labels=None, attach=None, external_ids=None))]
    #[allow(clippy::too_many_arguments)]
    fn import_npy<'py>(
        &self,
        py: Python<'py>,
        tree: &str,
        path: PathBuf,
        scenarios: Option<&Bound<'py, PyAny>>,
        payloads: Option<&Bound<'py, PyAny>>,
        labels: Option<&Bound<'py, PyAny>>,
        attach: Option<&Bound<'py, PyAny>>,
        external_ids: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let matrix = crate::interop::read_npy(py, &path)?;
        self.load(py, tree, &matrix, scenarios, payloads, labels, attach, external_ids)
    }

    /// Writes the stored vectors of `tree` as a float32 `.npy` matrix;
    /// returns the node id of each row.
    fn export_npy<'py>(&self, py: Python<'py>, tree: &str, path: PathBuf) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let ids = crate::interop::export_npy(self, py, tree, &path)?;
        Ok(PyArray1::from_vec(py, ids))
    }
}

/// Iterator of `Bank.nodes()`: the ids are fixed when it is made, each
/// node is read when reached.
#[pyclass(module = "deltamem")]
pub struct NodeIter {
    bank: Py<PyBank>,
    ids: Vec<u32>,
    next: usize,
}

#[pymethods]
impl NodeIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<PyNode>> {
        let Some(&index) = self.ids.get(self.next) else {
            return Ok(None);
        };
        self.next += 1;
        self.bank.get().read(py, |b| Ok(Some(b.node(index)?.into())))
    }

    fn __len__(&self) -> usize {
        self.ids.len() - self.next
    }
}

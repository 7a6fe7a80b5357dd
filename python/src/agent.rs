//! `deltamem.MemoryLoop`: the agent loop of `deltamem::agent` with the
//! built-in ONNX embedder and HTTP chat client, or any Python callables in
//! their place (`embedder(texts, role) -> ndarray[len(texts), dim]`,
//! `llm(messages) -> str`).
//!
//! A callable runs with the GIL taken back for the call only. When it
//! raises, the loop fails as it would for a failed model (before anything
//! is written), and the Python exception becomes the `__cause__` of the
//! `AgentError` raised.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deltamem::agent::{
    AgentConfig, AgentError, ChatMessage, ChatModel, DomainProfile, EmbedError, Embedder, Episode, HttpChat, LlmConfig,
    LlmError, MemoryLoop, OnnxConfig, OnnxEmbedder, TextRole,
};
use deltamem::{Bank, OpenOptions};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use crate::arrays;
use crate::errors::{self, Details, Kind};

/// The exception a Python callable raised, kept for the `__cause__`.
type Raised = Arc<Mutex<Option<PyErr>>>;

fn callable_name(obj: &Bound<'_, PyAny>) -> String {
    obj.getattr("__name__")
        .and_then(|n| n.extract::<String>())
        .or_else(|_| obj.get_type().name().map(|n| n.to_string()))
        .unwrap_or_else(|_| "python-callable".into())
}

/// A Python embedder callable.
struct PyEmbedder {
    callable: Py<PyAny>,
    name: String,
    dim: usize,
    raised: Raised,
}

impl PyEmbedder {
    fn call(&self, py: Python<'_>, texts: &[&str], role: TextRole) -> PyResult<Vec<Vec<f32>>> {
        let role = match role {
            TextRole::Query => "query",
            TextRole::Passage => "passage",
        };
        let out = self.callable.bind(py).call1((PyList::new(py, texts)?, role))?;
        let matrix = arrays::matrix(&out, self.dim as u32, "the embedder's result")?;
        if matrix.rows() != texts.len() {
            return Err(errors::invalid(
                py,
                format!(
                    "the embedder returned {} vectors for {} texts",
                    matrix.rows(),
                    texts.len()
                ),
            ));
        }
        Ok(matrix.values().chunks_exact(self.dim).map(<[f32]>::to_vec).collect())
    }
}

impl Embedder for PyEmbedder {
    fn dim(&self) -> usize {
        self.dim
    }

    fn model_id(&self) -> String {
        format!("python:{}", self.name)
    }

    fn embed_batch(&mut self, texts: &[&str], role: TextRole) -> Result<Vec<Vec<f32>>, EmbedError> {
        if let Some(index) = texts.iter().position(|t| t.trim().is_empty()) {
            return Err(EmbedError::EmptyText { index });
        }
        Python::attach(|py| {
            self.call(py, texts, role).map_err(|e| {
                let detail = format!("embedder {} raised {e}", self.name);
                *self.raised.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                EmbedError::Inference(detail)
            })
        })
    }
}

/// A Python chat callable.
struct PyChat {
    callable: Py<PyAny>,
    name: String,
    raised: Raised,
}

impl ChatModel for PyChat {
    fn complete(&self, messages: &[ChatMessage]) -> Result<String, LlmError> {
        Python::attach(|py| {
            let call = || -> PyResult<String> {
                let list = PyList::empty(py);
                for m in messages {
                    let d = PyDict::new(py);
                    d.set_item("role", &m.role)?;
                    d.set_item("content", &m.content)?;
                    list.append(d)?;
                }
                let reply = self.callable.bind(py).call1((list,))?;
                match reply.cast::<PyString>() {
                    Ok(text) => Ok(text.to_cow()?.into_owned()),
                    Err(_) => Err(errors::invalid(
                        py,
                        format!("the llm callable returned a {}, not a str", reply.get_type().name()?),
                    )),
                }
            };
            call().map_err(|e| {
                let detail = e.to_string();
                *self.raised.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                LlmError::Failed {
                    model: self.model_id(),
                    detail,
                }
            })
        })
    }

    fn model_id(&self) -> String {
        format!("python:{}", self.name)
    }
}

enum AnyEmbedder {
    Onnx(Box<OnnxEmbedder>),
    Py(PyEmbedder),
}

impl Embedder for AnyEmbedder {
    fn dim(&self) -> usize {
        match self {
            AnyEmbedder::Onnx(e) => e.dim(),
            AnyEmbedder::Py(e) => e.dim(),
        }
    }

    fn model_id(&self) -> String {
        match self {
            AnyEmbedder::Onnx(e) => e.model_id(),
            AnyEmbedder::Py(e) => e.model_id(),
        }
    }

    fn embed_batch(&mut self, texts: &[&str], role: TextRole) -> Result<Vec<Vec<f32>>, EmbedError> {
        match self {
            AnyEmbedder::Onnx(e) => e.embed_batch(texts, role),
            AnyEmbedder::Py(e) => e.embed_batch(texts, role),
        }
    }
}

enum AnyChat {
    Http(HttpChat),
    Py(PyChat),
}

impl ChatModel for AnyChat {
    fn complete(&self, messages: &[ChatMessage]) -> Result<String, LlmError> {
        match self {
            AnyChat::Http(c) => c.complete(messages),
            AnyChat::Py(c) => c.complete(messages),
        }
    }

    fn model_id(&self) -> String {
        match self {
            AnyChat::Http(c) => c.model_id(),
            AnyChat::Py(c) => c.model_id(),
        }
    }
}

fn agent_error(py: Python<'_>, e: AgentError, raised: &Raised) -> PyErr {
    let cause = raised.lock().unwrap_or_else(|p| p.into_inner()).take();
    let err = match e {
        AgentError::Bank(b) => errors::bank(py, b),
        AgentError::BadEpisode(_) | AgentError::Config(_) => errors::invalid(py, e.to_string()),
        other => errors::make(py, Kind::Agent, other.to_string(), &Details::default()),
    };
    if let Some(cause) = cause {
        err.set_cause(py, Some(cause));
    }
    err
}

fn profile(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<DomainProfile> {
    if let Ok(name) = obj.cast::<PyString>() {
        let name = name.to_cow()?;
        let name: &str = &name;
        return DomainProfile::by_name(name).ok_or_else(|| {
            errors::invalid(
                py,
                format!(
                    "unknown profile {name:?} (built in: {})",
                    DomainProfile::BUILT_IN.join(", ")
                ),
            )
        });
    }
    let text: String = py.import("json")?.call_method1("dumps", (obj,))?.extract()?;
    DomainProfile::from_json(&text).map_err(|e| errors::invalid(py, format!("profile: {e}")))
}

fn onnx_embedder(py: Python<'_>, assets: Option<PathBuf>) -> PyResult<AnyEmbedder> {
    let made = py.detach(|| {
        let config = match assets {
            Some(dir) => OnnxConfig::minilm(dir),
            None => OnnxConfig::from_env()?,
        };
        OnnxEmbedder::new(config)
    });
    made.map(|e| AnyEmbedder::Onnx(Box::new(e)))
        .map_err(|e| errors::make(py, Kind::Agent, e.to_string(), &Details::default()))
}

/// A positive, finite number of seconds.
fn timeout(py: Python<'_>, seconds: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(seconds)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| errors::invalid(py, format!("timeout_s {seconds} is not a positive number of seconds")))
}

/// The built-in client from a dict of `LlmConfig` settings.
fn http_chat(py: Python<'_>, settings: Option<&Bound<'_, PyDict>>) -> PyResult<AnyChat> {
    let bad = |e: LlmError| errors::invalid(py, e.to_string());
    let Some(d) = settings else {
        return HttpChat::new(LlmConfig::from_env().map_err(bad)?)
            .map(AnyChat::Http)
            .map_err(bad);
    };
    let get = |key: &str| d.get_item(key);
    let base_url: String = get("base_url")?
        .ok_or_else(|| errors::invalid(py, "llm settings need \"base_url\""))?
        .extract()?;
    let model: String = get("model")?
        .ok_or_else(|| errors::invalid(py, "llm settings need \"model\""))?
        .extract()?;
    let mut config = LlmConfig::new(base_url, model);
    for (key, _) in d.iter() {
        let key: String = key.extract()?;
        let value = get(&key)?.expect("iterated key");
        match key.as_str() {
            "base_url" | "model" => {}
            "api_key" => config.api_key = value.extract()?,
            "temperature" => config.temperature = value.extract()?,
            "max_tokens" => config.max_tokens = value.extract()?,
            "timeout_s" => config.read_timeout = timeout(py, value.extract()?)?,
            "max_attempts" => config.max_attempts = value.extract()?,
            other => return Err(errors::invalid(py, format!("unknown llm setting {other:?}"))),
        }
    }
    HttpChat::new(config).map(AnyChat::Http).map_err(bad)
}

#[pyclass(name = "MemoryLoop", module = "deltamem", frozen)]
pub struct PyMemoryLoop {
    inner: Mutex<MemoryLoop>,
    raised: Raised,
}

#[pymethods]
impl PyMemoryLoop {
    #[new]
    #[pyo3(signature = (bank_path, profile=None, embedder=None, llm=None, assets=None, task_tree="task", env_tree="env", include_consolidated=false, sync="always", lock_wait_s=30.0, max_steps=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        bank_path: PathBuf,
        profile: Option<&Bound<'_, PyAny>>,
        embedder: Option<&Bound<'_, PyAny>>,
        llm: Option<&Bound<'_, PyAny>>,
        assets: Option<PathBuf>,
        task_tree: &str,
        env_tree: &str,
        include_consolidated: bool,
        sync: &str,
        lock_wait_s: f64,
        max_steps: Option<u32>,
    ) -> PyResult<PyMemoryLoop> {
        let raised: Raised = Arc::new(Mutex::new(None));
        let profile = match profile {
            Some(p) => self::profile(py, p)?,
            None => DomainProfile::generic(),
        };
        let mut config = AgentConfig::new(&bank_path, profile);
        config.task_tree = task_tree.into();
        config.env_tree = env_tree.into();
        config.include_consolidated = include_consolidated;
        config.sync = crate::args::sync(py, sync)?;
        config.lock_wait = Duration::try_from_secs_f64(lock_wait_s)
            .map_err(|_| errors::invalid(py, format!("lock_wait_s {lock_wait_s} is not a duration")))?;
        config.interrupted = Some(errors::signal_pending);
        config.max_steps = max_steps;
        let embedder = match embedder {
            Some(e) if e.is_callable() => {
                // The bank fixes the dimension a callable must produce.
                let dim = bank_dim(py, &bank_path)?;
                AnyEmbedder::Py(PyEmbedder {
                    callable: e.clone().unbind(),
                    name: callable_name(e),
                    dim,
                    raised: raised.clone(),
                })
            }
            Some(e) if e.extract::<String>().is_ok_and(|s| s == "onnx") => onnx_embedder(py, assets)?,
            None => onnx_embedder(py, assets)?,
            Some(e) => {
                return Err(errors::invalid(
                    py,
                    format!("embedder must be \"onnx\" or a callable, not {}", e.get_type().name()?),
                ));
            }
        };
        let llm = match llm {
            Some(l) if l.is_callable() => AnyChat::Py(PyChat {
                callable: l.clone().unbind(),
                name: callable_name(l),
                raised: raised.clone(),
            }),
            Some(l) => match l.cast::<PyDict>() {
                Ok(d) => http_chat(py, Some(d))?,
                Err(_) => {
                    return Err(errors::invalid(
                        py,
                        "llm must be a callable or a dict of client settings",
                    ));
                }
            },
            None => http_chat(py, None)?,
        };
        Ok(PyMemoryLoop {
            inner: Mutex::new(MemoryLoop::new(config, embedder, llm)),
            raised,
        })
    }

    /// Searches both trees with the task and env texts; returns a dict like
    /// `deltamem retrieve` prints (context, task, env).
    fn retrieve<'py>(&self, py: Python<'py>, task: String, env: String) -> PyResult<Bound<'py, PyAny>> {
        let found = self.run(py, |l| l.retrieve(&task, &env))?;
        to_python(py, &found)
    }

    /// Records a finished episode (a dict like `deltamem record` reads:
    /// task_text, env_text, trajectory, success, ...). Pass the dict
    /// `retrieve` returned at the episode's start as `retrieval`, to count
    /// and extend the chains it found.
    #[pyo3(signature = (episode, retrieval=None))]
    fn record<'py>(
        &self,
        py: Python<'py>,
        episode: &Bound<'py, PyAny>,
        retrieval: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut episode: Episode = from_python(py, episode, "episode")?;
        if let Some(r) = retrieval.filter(|r| !r.is_none()) {
            let r: deltamem::agent::Retrieval = from_python(py, r, "retrieval")?;
            episode = episode.with_retrieval(&r);
        }
        let outcome = self.run(py, |l| l.record(&episode))?;
        to_python(py, &outcome)
    }

    /// Distils every node of the two trees that is due for consolidation
    /// (a retry of those whose distillation failed during `record`).
    fn consolidate_due<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let outcomes = self.run(py, MemoryLoop::consolidate_due)?;
        to_python(py, &outcomes)
    }
}

thread_local! {
    /// The address of the `MemoryLoop` this thread is running, if any: its
    /// callables run on the same thread, and one that calls back into the
    /// loop would wait forever for the lock this thread holds.
    static RUNNING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Marks this thread as running a loop until dropped (a panic included).
struct Running {
    before: usize,
}

impl Running {
    fn enter(address: usize) -> Running {
        Running {
            before: RUNNING.replace(address),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.set(self.before);
    }
}

impl PyMemoryLoop {
    /// Runs `work` on the loop without the GIL, and turns its outcome into
    /// Python's: an agent error (with the exception a callable raised as
    /// its cause), or the callable's own exception if that was not an
    /// `Exception` (Ctrl-C, `sys.exit`), which the loop's own error
    /// handling must not swallow.
    fn run<T: Send>(
        &self,
        py: Python<'_>,
        work: impl FnOnce(&mut MemoryLoop) -> Result<T, AgentError> + Send,
    ) -> PyResult<T> {
        let address = self as *const PyMemoryLoop as usize;
        if RUNNING.get() == address {
            return Err(errors::invalid(
                py,
                "this MemoryLoop was called from inside one of its own embedder or llm callables",
            ));
        }
        // An exception a callable raised in an earlier call whose failure the
        // loop absorbed (a failed consolidation is reported, not raised) must
        // not become the cause of a later, unrelated error.
        self.raised.lock().unwrap_or_else(|p| p.into_inner()).take();
        let done = py.detach(|| {
            // A panic inside the loop leaves no half-done bank write behind
            // (the bank's own rules), so the loop stays usable.
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let _running = Running::enter(address);
            work(&mut inner)
        });
        if let Some(signal) = errors::take_signal() {
            return Err(signal);
        }
        let interrupt = {
            let mut raised = self.raised.lock().unwrap_or_else(|p| p.into_inner());
            let is_interrupt = raised
                .as_ref()
                .is_some_and(|e| !e.is_instance_of::<pyo3::exceptions::PyException>(py));
            if is_interrupt { raised.take() } else { None }
        };
        if let Some(interrupt) = interrupt {
            return Err(interrupt);
        }
        done.map_err(|e| agent_error(py, e, &self.raised))
    }
}

fn bank_dim(py: Python<'_>, path: &std::path::Path) -> PyResult<usize> {
    let options = OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    };
    py.detach(|| Bank::open_dir(path, options).map(|b| b.dim_count() as usize))
        .map_err(|e| errors::bank(py, e))
}

/// A serde value as plain Python objects (dicts, lists), through JSON.
fn to_python<'py>(py: Python<'py>, value: &impl serde::Serialize) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(value).expect("agent results serialise");
    py.import("json")?.call_method1("loads", (text,))
}

fn from_python<T: serde::de::DeserializeOwned>(py: Python<'_>, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<T> {
    let text: String = py
        .import("json")?
        .call_method1("dumps", (obj,))
        .map_err(|e| errors::invalid(py, format!("{what}: not JSON-serialisable: {e}")))?
        .extract()?;
    serde_json::from_str(&text).map_err(|e| errors::invalid(py, format!("{what}: {e}")))
}

//! Text embeddings: the [`Embedder`] trait and a local ONNX Runtime
//! implementation for BERT-family sentence encoders.
//!
//! [`OnnxEmbedder`] tokenizes with a HuggingFace `tokenizer.json`
//! (truncation at `max_length`, padding to the longest text of each
//! batch), runs the model through ONNX Runtime loaded from a shared
//! library at run time (`ort`'s `load-dynamic`: nothing is downloaded at
//! build or run time), pools the last hidden state (attention-masked mean,
//! or the CLS token) and L2-normalises. Optional query/passage prefixes
//! serve E5-style models. [`OnnxConfig::minilm`] matches the files that
//! `tools/setup-agent-assets.sh` puts in `assets/`.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ort::environment::Environment;
use ort::session::{Session, SessionInputValue};
use ort::value::Tensor;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy, tokenizer::Encoding};

/// Environment variables read by [`OnnxConfig::from_env`] and
/// [`resolve_runtime`].
pub const ENV_ASSETS: &str = "DELTAMEM_ASSETS";
pub const ENV_ORT_LIB: &str = "DELTAMEM_ORT_LIB";
pub const ENV_MODEL: &str = "DELTAMEM_EMBED_MODEL";
pub const ENV_TOKENIZER: &str = "DELTAMEM_EMBED_TOKENIZER";
pub const ENV_POOLING: &str = "DELTAMEM_EMBED_POOLING";
pub const ENV_MAX_LENGTH: &str = "DELTAMEM_EMBED_MAX_LENGTH";
pub const ENV_QUERY_PREFIX: &str = "DELTAMEM_EMBED_QUERY_PREFIX";
pub const ENV_PASSAGE_PREFIX: &str = "DELTAMEM_EMBED_PASSAGE_PREFIX";

/// The ONNX Runtime version the setup script installs.
pub const ORT_LIBRARY_VERSION: &str = "1.31.1";

/// What a text is used for; selects the prefix (E5 wants `query: ` and
/// `passage: `; MiniLM and the DeltaMem reference use none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TextRole {
    /// A retrieval query.
    Query,
    /// A stored node's scenario text.
    Passage,
}

#[derive(Debug, Error)]
pub enum EmbedError {
    #[error("text {index} is empty (or only whitespace); nothing to embed")]
    EmptyText { index: usize },
    #[error(
        "ONNX Runtime library not found (looked at: {tried}); run tools/setup-agent-assets.sh or set {ENV_ORT_LIB} to libonnxruntime.so"
    )]
    RuntimeNotFound { tried: String },
    #[error("cannot load ONNX Runtime from {path}: {detail}")]
    RuntimeLoad { path: String, detail: String },
    #[error("ONNX Runtime is already loaded from {loaded} in this process; cannot also load {wanted}")]
    RuntimeMismatch { loaded: String, wanted: String },
    #[error("{what} file {path} not found; run tools/setup-agent-assets.sh or configure its path")]
    FileNotFound { what: &'static str, path: String },
    #[error("tokenizer {path}: {detail}")]
    Tokenizer { path: String, detail: String },
    #[error("model {path}: {detail}")]
    Model { path: String, detail: String },
    #[error("inference failed: {0}")]
    Inference(String),
    #[error("embedding configuration: {0}")]
    Config(String),
}

/// Turns texts into vectors. `&mut self` because ONNX Runtime sessions are
/// not safe to run concurrently.
pub trait Embedder {
    /// Length of every vector returned.
    fn dim(&self) -> usize;
    /// Names the model in provenance records.
    fn model_id(&self) -> String;
    /// One vector per text, in order. Empty texts are an error.
    fn embed_batch(&mut self, texts: &[&str], role: TextRole) -> Result<Vec<Vec<f32>>, EmbedError>;

    fn embed(&mut self, text: &str, role: TextRole) -> Result<Vec<f32>, EmbedError> {
        let mut v = self.embed_checked(&[text], role)?;
        Ok(v.pop().expect("embed_checked returns one vector per text"))
    }

    /// `embed_batch`, with its result checked: one vector per text, each of
    /// `dim()` finite components. Every caller in the agent goes through
    /// here, so an embedder that misbehaves (a Python callable returning
    /// NaN, a model of another size) is an embedder error, not a refusal
    /// by the bank that reads as bad input.
    fn embed_checked(&mut self, texts: &[&str], role: TextRole) -> Result<Vec<Vec<f32>>, EmbedError> {
        let vectors = self.embed_batch(texts, role)?;
        if vectors.len() != texts.len() {
            let detail = format!(
                "the embedder returned {} vectors for {} texts",
                vectors.len(),
                texts.len()
            );
            return Err(EmbedError::Inference(detail));
        }
        let dim = self.dim();
        for (i, v) in vectors.iter().enumerate() {
            if v.len() != dim {
                let detail = format!(
                    "vector {i} has {} components, the embedder's dimension is {dim}",
                    v.len()
                );
                return Err(EmbedError::Inference(detail));
            }
            if let Some(at) = v.iter().position(|x| !x.is_finite()) {
                let detail = format!("vector {i} has a non-finite value at component {at}");
                return Err(EmbedError::Inference(detail));
            }
        }
        Ok(vectors)
    }
}

impl<E: Embedder + ?Sized> Embedder for Box<E> {
    fn dim(&self) -> usize {
        (**self).dim()
    }
    fn model_id(&self) -> String {
        (**self).model_id()
    }
    fn embed_batch(&mut self, texts: &[&str], role: TextRole) -> Result<Vec<Vec<f32>>, EmbedError> {
        (**self).embed_batch(texts, role)
    }
}

/// How token vectors become one sentence vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pooling {
    /// Mean over the tokens the attention mask keeps (sentence-transformers,
    /// MiniLM, E5).
    Mean,
    /// The first token's vector (BGE-style models).
    Cls,
}

impl Pooling {
    pub fn parse(text: &str) -> Option<Pooling> {
        match text.trim().to_ascii_lowercase().as_str() {
            "mean" => Some(Pooling::Mean),
            "cls" => Some(Pooling::Cls),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OnnxConfig {
    /// The `.onnx` file (inputs `input_ids`, optionally `attention_mask`
    /// and `token_type_ids`, all int64; output `[batch, seq, hidden]` or an
    /// already pooled `[batch, hidden]`).
    pub model: PathBuf,
    /// HuggingFace `tokenizer.json`.
    pub tokenizer: PathBuf,
    /// The ONNX Runtime shared library (a file, or a directory holding
    /// one); None: see [`resolve_runtime`].
    pub runtime: Option<PathBuf>,
    pub pooling: Pooling,
    pub normalize: bool,
    /// Tokens per text, special tokens included; longer texts are cut.
    pub max_length: usize,
    pub query_prefix: String,
    pub passage_prefix: String,
    /// Texts per inference call.
    pub batch_size: usize,
    /// ONNX Runtime intra-op threads; None lets it choose.
    pub intra_threads: Option<usize>,
    /// Model output to pool; None: `last_hidden_state` if present, else
    /// the first output.
    pub output_name: Option<String>,
}

impl OnnxConfig {
    /// all-MiniLM-L6-v2 (int8 ONNX) as installed by the setup script under
    /// `assets_dir`: mean pooling, normalised, 256 tokens, no prefixes.
    pub fn minilm(assets_dir: impl AsRef<Path>) -> OnnxConfig {
        let dir = assets_dir.as_ref();
        OnnxConfig {
            model: dir.join("minilm/model.onnx"),
            tokenizer: dir.join("minilm/tokenizer.json"),
            runtime: Some(dir.join("onnxruntime")),
            pooling: Pooling::Mean,
            normalize: true,
            max_length: 256,
            query_prefix: String::new(),
            passage_prefix: String::new(),
            batch_size: 32,
            intra_threads: None,
            output_name: None,
        }
    }

    /// An E5 model (the paper's e5-base-v2, exported to ONNX): mean
    /// pooling, 512 tokens, `query: ` / `passage: ` prefixes. The DeltaMem
    /// reference embedded bare text; clear the prefixes to match it.
    pub fn e5(model: impl Into<PathBuf>, tokenizer: impl Into<PathBuf>) -> OnnxConfig {
        OnnxConfig {
            model: model.into(),
            tokenizer: tokenizer.into(),
            runtime: None,
            max_length: 512,
            query_prefix: "query: ".into(),
            passage_prefix: "passage: ".into(),
            ..OnnxConfig::minilm("assets")
        }
    }

    /// MiniLM under `$DELTAMEM_ASSETS` (default `./assets`), then overridden
    /// by `DELTAMEM_EMBED_MODEL`, `_TOKENIZER`, `_POOLING` (mean|cls),
    /// `_MAX_LENGTH`, `_QUERY_PREFIX`, `_PASSAGE_PREFIX` and
    /// `DELTAMEM_ORT_LIB` where set.
    pub fn from_env() -> Result<OnnxConfig, EmbedError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let assets = var(ENV_ASSETS).unwrap_or_else(|| "assets".into());
        let mut config = OnnxConfig::minilm(&assets);
        if let Some(v) = var(ENV_MODEL) {
            config.model = v.into();
        }
        if let Some(v) = var(ENV_TOKENIZER) {
            config.tokenizer = v.into();
        }
        if let Some(v) = var(ENV_POOLING) {
            config.pooling = Pooling::parse(&v)
                .ok_or_else(|| EmbedError::Config(format!("{ENV_POOLING}={v:?}: expected mean or cls")))?;
        }
        if let Some(v) = var(ENV_MAX_LENGTH) {
            config.max_length = v
                .trim()
                .parse()
                .map_err(|_| EmbedError::Config(format!("{ENV_MAX_LENGTH}={v:?} is not a whole number")))?;
        }
        if let Some(v) = var(ENV_QUERY_PREFIX) {
            config.query_prefix = v;
        }
        if let Some(v) = var(ENV_PASSAGE_PREFIX) {
            config.passage_prefix = v;
        }
        if let Some(v) = var(ENV_ORT_LIB) {
            config.runtime = Some(v.into());
        }
        Ok(config)
    }

    fn validate(&self) -> Result<(), EmbedError> {
        if !(4..=8192).contains(&self.max_length) {
            return Err(EmbedError::Config(format!(
                "max_length {} outside 4..=8192",
                self.max_length
            )));
        }
        if self.batch_size == 0 {
            return Err(EmbedError::Config("batch_size must be at least 1".into()));
        }
        for (what, path) in [("model", &self.model), ("tokenizer", &self.tokenizer)] {
            if !path.is_file() {
                return Err(EmbedError::FileNotFound {
                    what,
                    path: path.display().to_string(),
                });
            }
        }
        Ok(())
    }
}

/// Finds the ONNX Runtime shared library: `explicit` if given (a file, or
/// a directory searched for `libonnxruntime.so*`), else `DELTAMEM_ORT_LIB`,
/// else `ORT_DYLIB_PATH`, else `$DELTAMEM_ASSETS/onnxruntime` (default
/// `./assets/onnxruntime`). An explicit path that does not hold a library
/// is an error, not a reason to look elsewhere.
pub fn resolve_runtime(explicit: Option<&Path>) -> Result<PathBuf, EmbedError> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = explicit {
        candidates.push(p.to_path_buf());
    } else {
        for name in [ENV_ORT_LIB, "ORT_DYLIB_PATH"] {
            if let Some(v) = std::env::var_os(name).filter(|v| !v.is_empty()) {
                candidates.push(v.into());
            }
        }
        let assets = std::env::var_os(ENV_ASSETS)
            .filter(|v| !v.is_empty())
            .map_or_else(|| PathBuf::from("assets"), PathBuf::from);
        candidates.push(assets.join("onnxruntime"));
    }
    for candidate in &candidates {
        if candidate.is_file() {
            return Ok(candidate.clone());
        }
        if candidate.is_dir()
            && let Some(found) = library_in(candidate)
        {
            return Ok(found);
        }
    }
    Err(EmbedError::RuntimeNotFound {
        tried: candidates
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// The ONNX Runtime library in `dir`: the exact version the setup script
/// installs if present, else the `libonnxruntime.so*` / `.dylib` /
/// `onnxruntime.dll` with the longest name (the most specific version).
fn library_in(dir: &Path) -> Option<PathBuf> {
    let exact = dir.join(format!("libonnxruntime.so.{ORT_LIBRARY_VERSION}"));
    if exact.is_file() {
        return Some(exact);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            p.is_file()
                && (name.starts_with("libonnxruntime.so")
                    || (name.starts_with("libonnxruntime") && name.ends_with(".dylib"))
                    || name == "onnxruntime.dll")
        })
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    found.into_iter().next()
}

/// One ONNX Runtime environment per process (an `ort` rule), kept alive
/// for the process's lifetime, with the library it was loaded from.
static RUNTIME: Mutex<Option<(PathBuf, Environment)>> = Mutex::new(None);

fn runtime_environment(path: &Path) -> Result<Environment, EmbedError> {
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut slot = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((loaded, env)) = slot.as_ref() {
        if *loaded != canonical {
            return Err(EmbedError::RuntimeMismatch {
                loaded: loaded.display().to_string(),
                wanted: canonical.display().to_string(),
            });
        }
        return Ok(env.clone());
    }
    let load_err = |detail: String| EmbedError::RuntimeLoad {
        path: canonical.display().to_string(),
        detail,
    };
    let env = ort::init_from(&canonical)
        .map_err(|e| load_err(e.to_string()))?
        .with_name("deltamem")
        .build()
        .map_err(|e| load_err(e.to_string()))?;
    *slot = Some((canonical, env.clone()));
    Ok(env)
}

/// Which inputs the model takes.
#[derive(Debug, Clone, Copy)]
struct Inputs {
    attention_mask: bool,
    token_type_ids: bool,
}

/// A BERT-family sentence encoder run by ONNX Runtime.
pub struct OnnxEmbedder {
    config: OnnxConfig,
    tokenizer: Tokenizer,
    session: Session,
    inputs: Inputs,
    output: String,
    dim: usize,
    runtime_path: PathBuf,
}

impl std::fmt::Debug for OnnxEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnnxEmbedder")
            .field("config", &self.config)
            .field("dim", &self.dim)
            .field("runtime", &self.runtime_path)
            .finish_non_exhaustive()
    }
}

impl OnnxEmbedder {
    pub fn new(config: OnnxConfig) -> Result<OnnxEmbedder, EmbedError> {
        config.validate()?;
        let runtime_path = resolve_runtime(config.runtime.as_deref())?;
        let env = runtime_environment(&runtime_path)?;
        let tokenizer = load_tokenizer(&config)?;
        let model_path = config.model.display().to_string();
        let model_err = |detail: String| EmbedError::Model {
            path: model_path.clone(),
            detail,
        };
        let mut builder = Session::builder(&env).map_err(|e| model_err(e.to_string()))?;
        if let Some(n) = config.intra_threads {
            builder = builder.with_intra_threads(n).map_err(|e| model_err(e.to_string()))?;
        }
        let session = builder
            .commit_from_file(&config.model)
            .map_err(|e| model_err(e.to_string()))?;
        let mut inputs = Inputs {
            attention_mask: false,
            token_type_ids: false,
        };
        let mut has_ids = false;
        for input in session.inputs() {
            match input.name() {
                "input_ids" => has_ids = true,
                "attention_mask" => inputs.attention_mask = true,
                "token_type_ids" => inputs.token_type_ids = true,
                other => {
                    return Err(model_err(format!(
                        "unsupported input {other:?} (expected input_ids, attention_mask, token_type_ids)"
                    )));
                }
            }
        }
        if !has_ids {
            return Err(model_err("the model has no input_ids input".into()));
        }
        let names: Vec<&str> = session.outputs().iter().map(|o| o.name()).collect();
        let output = match &config.output_name {
            Some(name) if names.contains(&name.as_str()) => name.clone(),
            Some(name) => {
                return Err(model_err(format!("no output {name:?} (outputs: {})", names.join(", "))));
            }
            None if names.contains(&"last_hidden_state") => "last_hidden_state".into(),
            None => names
                .first()
                .map(|s| s.to_string())
                .ok_or_else(|| model_err("the model has no outputs".into()))?,
        };
        let mut embedder = OnnxEmbedder {
            config,
            tokenizer,
            session,
            inputs,
            output,
            dim: 0,
            runtime_path,
        };
        // The hidden size is often symbolic in the graph: ask the model.
        embedder.dim = embedder
            .run_batch(&["dimension probe".to_string()])?
            .first()
            .map_or(0, Vec::len);
        if embedder.dim == 0 {
            return Err(EmbedError::Model {
                path: embedder.config.model.display().to_string(),
                detail: "the model produced an empty vector".into(),
            });
        }
        Ok(embedder)
    }

    /// [`OnnxEmbedder::new`] with [`OnnxConfig::from_env`].
    pub fn from_env() -> Result<OnnxEmbedder, EmbedError> {
        OnnxEmbedder::new(OnnxConfig::from_env()?)
    }

    pub fn config(&self) -> &OnnxConfig {
        &self.config
    }

    /// The ONNX Runtime library actually loaded.
    pub fn runtime_path(&self) -> &Path {
        &self.runtime_path
    }

    /// Token ids, attention mask and type ids exactly as fed to the model
    /// (before padding), for checking against another implementation.
    pub fn tokenize(&self, texts: &[&str], role: TextRole) -> Result<Vec<Encoding>, EmbedError> {
        let prefixed = self.prefixed(texts, role)?;
        self.encode(&prefixed)
    }

    fn prefixed(&self, texts: &[&str], role: TextRole) -> Result<Vec<String>, EmbedError> {
        let prefix = match role {
            TextRole::Query => &self.config.query_prefix,
            TextRole::Passage => &self.config.passage_prefix,
        };
        texts
            .iter()
            .enumerate()
            .map(|(index, t)| {
                if t.trim().is_empty() {
                    Err(EmbedError::EmptyText { index })
                } else {
                    Ok(format!("{prefix}{t}"))
                }
            })
            .collect()
    }

    fn encode(&self, texts: &[String]) -> Result<Vec<Encoding>, EmbedError> {
        self.tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| EmbedError::Tokenizer {
                path: self.config.tokenizer.display().to_string(),
                detail: e.to_string(),
            })
    }

    /// Tokenize, pad to the longest, run, pool, normalise: one batch.
    fn run_batch(&mut self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let encodings = self.encode(texts)?;
        let batch = encodings.len();
        let seq = encodings.iter().map(|e| e.len()).max().unwrap_or(0).max(1);
        let mut ids = vec![0i64; batch * seq];
        let mut mask = vec![0i64; batch * seq];
        let mut types = vec![0i64; batch * seq];
        for (row, e) in encodings.iter().enumerate() {
            let at = row * seq;
            for (i, ((id, m), t)) in e
                .get_ids()
                .iter()
                .zip(e.get_attention_mask())
                .zip(e.get_type_ids())
                .enumerate()
            {
                ids[at + i] = i64::from(*id);
                mask[at + i] = i64::from(*m);
                types[at + i] = i64::from(*t);
            }
        }
        let infer = |e: ort::Error| EmbedError::Inference(e.to_string());
        let shape = [batch, seq];
        let mut feed: Vec<(Cow<'_, str>, SessionInputValue<'_>)> = Vec::with_capacity(3);
        feed.push((
            "input_ids".into(),
            Tensor::from_array((shape, ids)).map_err(infer)?.into(),
        ));
        if self.inputs.attention_mask {
            feed.push((
                "attention_mask".into(),
                Tensor::from_array((shape, mask.clone())).map_err(infer)?.into(),
            ));
        }
        if self.inputs.token_type_ids {
            feed.push((
                "token_type_ids".into(),
                Tensor::from_array((shape, types)).map_err(infer)?.into(),
            ));
        }
        let outputs = self.session.run(feed).map_err(infer)?;
        let value = outputs
            .get(&self.output)
            .ok_or_else(|| EmbedError::Inference(format!("output {:?} missing", self.output)))?;
        let (out_shape, data) = value.try_extract_tensor::<f32>().map_err(infer)?;
        let dims: Vec<usize> = out_shape.iter().map(|d| (*d).max(0) as usize).collect();
        let mut vectors = match dims.as_slice() {
            [b, s, h] if *b == batch && *s == seq => pool(data, batch, seq, *h, &mask, self.config.pooling),
            [b, h] if *b == batch => data.chunks(*h).map(|c| c.to_vec()).collect(),
            _ => {
                return Err(EmbedError::Inference(format!(
                    "output {:?} has shape {dims:?}, expected [{batch}, {seq}, hidden] or [{batch}, hidden]",
                    self.output
                )));
            }
        };
        for v in &mut vectors {
            if let Some(i) = v.iter().position(|x| !x.is_finite()) {
                return Err(EmbedError::Inference(format!(
                    "the model produced a non-finite value at component {i}"
                )));
            }
            if self.config.normalize {
                normalize(v);
            }
        }
        Ok(vectors)
    }
}

fn load_tokenizer(config: &OnnxConfig) -> Result<Tokenizer, EmbedError> {
    let path = config.tokenizer.display().to_string();
    let err = |detail: String| EmbedError::Tokenizer {
        path: path.clone(),
        detail,
    };
    let mut tokenizer = Tokenizer::from_file(&config.tokenizer).map_err(|e| err(e.to_string()))?;
    // tokenizer.json files often pin padding and truncation (MiniLM's to
    // 128): replace both with ours.
    tokenizer
        .with_truncation(Some(TruncationParams {
            direction: TruncationDirection::Right,
            max_length: config.max_length,
            strategy: TruncationStrategy::LongestFirst,
            stride: 0,
        }))
        .map_err(|e| err(e.to_string()))?;
    tokenizer.with_padding(None);
    Ok(tokenizer)
}

/// Pools `[batch, seq, hidden]` token vectors into one vector per text.
fn pool(data: &[f32], batch: usize, seq: usize, hidden: usize, mask: &[i64], pooling: Pooling) -> Vec<Vec<f32>> {
    (0..batch)
        .map(|b| {
            let tokens = &data[b * seq * hidden..(b + 1) * seq * hidden];
            match pooling {
                Pooling::Cls => tokens[..hidden].to_vec(),
                Pooling::Mean => {
                    let mut sum = vec![0f64; hidden];
                    let mut count = 0f64;
                    for t in 0..seq {
                        if mask[b * seq + t] == 0 {
                            continue;
                        }
                        count += 1.0;
                        for (s, x) in sum.iter_mut().zip(&tokens[t * hidden..(t + 1) * hidden]) {
                            *s += f64::from(*x);
                        }
                    }
                    let count = count.max(1e-9);
                    sum.into_iter().map(|s| (s / count) as f32).collect()
                }
            }
        })
        .collect()
}

fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
    if norm > 1e-12 {
        for x in v.iter_mut() {
            *x = (f64::from(*x) / norm) as f32;
        }
    }
}

impl Embedder for OnnxEmbedder {
    fn dim(&self) -> usize {
        self.dim
    }

    fn model_id(&self) -> String {
        let file = |p: &Path| {
            let parent = p
                .parent()
                .and_then(|d| d.file_name())
                .and_then(|n| n.to_str())
                .unwrap_or("");
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("?");
            if parent.is_empty() {
                name.to_string()
            } else {
                format!("{parent}/{name}")
            }
        };
        format!(
            "onnx:{} ({:?} pooling, {} tokens)",
            file(&self.config.model),
            self.config.pooling,
            self.config.max_length
        )
    }

    fn embed_batch(&mut self, texts: &[&str], role: TextRole) -> Result<Vec<Vec<f32>>, EmbedError> {
        let prefixed = self.prefixed(texts, role)?;
        let mut out = Vec::with_capacity(texts.len());
        for chunk in prefixed.chunks(self.config.batch_size) {
            out.extend(self.run_batch(chunk)?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Returns what it was given, whatever the texts.
    struct Canned(Vec<Vec<f32>>);

    impl Embedder for Canned {
        fn dim(&self) -> usize {
            2
        }
        fn model_id(&self) -> String {
            "canned".into()
        }
        fn embed_batch(&mut self, _texts: &[&str], _role: TextRole) -> Result<Vec<Vec<f32>>, EmbedError> {
            Ok(self.0.clone())
        }
    }

    #[test]
    fn an_embedders_result_is_checked_before_use() {
        let cases = [
            (vec![vec![1.0, 0.0], vec![0.0, 1.0]], "2 vectors for 1 texts"),
            (
                vec![vec![1.0, 0.0, 0.0]],
                "vector 0 has 3 components, the embedder's dimension is 2",
            ),
            (
                vec![vec![0.5, f32::NAN]],
                "vector 0 has a non-finite value at component 1",
            ),
            (vec![vec![f32::INFINITY, 0.0]], "non-finite value at component 0"),
        ];
        for (vectors, want) in cases {
            match Canned(vectors).embed("text", TextRole::Query) {
                Err(EmbedError::Inference(detail)) => assert!(detail.contains(want), "{detail}"),
                other => panic!("{want}: {other:?}"),
            }
        }
        assert_eq!(
            Canned(vec![vec![0.6, 0.8]]).embed("t", TextRole::Passage).unwrap(),
            vec![0.6, 0.8]
        );
    }

    #[test]
    fn mean_pooling_respects_the_mask() {
        // Two texts, three tokens, hidden 2; the second text has one pad.
        let data = [1., 2., 3., 4., 100., 100., 5., 6., 7., 8., 100., 100.];
        let mask = [1, 1, 0, 1, 1, 0];
        let v = pool(&data, 2, 3, 2, &mask, Pooling::Mean);
        assert_eq!(v, vec![vec![2., 3.], vec![6., 7.]]);
        let c = pool(&data, 2, 3, 2, &mask, Pooling::Cls);
        assert_eq!(c, vec![vec![1., 2.], vec![5., 6.]]);
    }

    #[test]
    fn missing_files_are_reported() {
        let config = OnnxConfig::minilm("/nonexistent-deltamem-assets");
        match OnnxEmbedder::new(config) {
            Err(EmbedError::FileNotFound { what, .. }) => assert_eq!(what, "model"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            resolve_runtime(Some(Path::new("/nonexistent-deltamem-ort"))),
            Err(EmbedError::RuntimeNotFound { .. })
        ));
        // A file that is not a shared library: a load error, not a panic.
        let not_a_library = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        assert!(matches!(
            runtime_environment(&not_a_library),
            Err(EmbedError::RuntimeLoad { .. })
        ));
    }
}

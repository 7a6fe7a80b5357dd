//! The Model Context Protocol face: the bank's operations as MCP tools,
//! over stdio (`deltamem mcp BANK`) and Streamable HTTP (`/mcp` on serve).
//!
//! Tools call a [`Memory`]: under `serve`, the server's [`Core`] (writes
//! join its group commit); under `deltamem mcp`, a [`SharedBank`] that
//! holds no lock between calls, so many stdio processes (one per client
//! window) share one bank: each write takes the writer lock for that
//! write only, with a bounded wait, and each read first refreshes to see
//! the others' writes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, InitializeResult, ServerCapabilities};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::tower::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::body::{InsertRequest, NodeRefJson, QueryReply, StatsReply};
use super::core::{Core, WriteDone, WriteOp, apply};
use super::error::{ApiError, ApiResult};
use super::routes::{chain_of, check_embedding};
use crate::bank::{Bank, BankError, NodeRef, OpenOptions, QueryOptions, SyncPolicy};

/// What the tools need from a bank, called on a blocking thread.
pub trait Memory: Send + Sync + 'static {
    fn read<T>(&self, f: impl FnOnce(&Bank) -> ApiResult<T>) -> ApiResult<T>
    where
        Self: Sized;
    fn query(&self, tree: &str, embedding: Vec<f32>, options: QueryOptions) -> ApiResult<QueryReply>;
    fn write(&self, op: WriteOp) -> ApiResult<WriteDone>;
    /// Whether writes can be taken at all (asked before an LLM call).
    fn writable(&self) -> ApiResult<()> {
        Ok(())
    }
}

impl Memory for Arc<Core> {
    fn read<T>(&self, f: impl FnOnce(&Bank) -> ApiResult<T>) -> ApiResult<T> {
        f(&*Core::read(self)?)
    }

    fn query(&self, tree: &str, embedding: Vec<f32>, options: QueryOptions) -> ApiResult<QueryReply> {
        tokio::runtime::Handle::current().block_on(Core::query(self, tree, embedding, options))
    }

    fn write(&self, op: WriteOp) -> ApiResult<WriteDone> {
        self.write_blocking(op)
    }

    fn writable(&self) -> ApiResult<()> {
        Core::writable(self)
    }
}

/// A bank shared with other processes: no lock held between calls.
pub struct SharedBank {
    path: PathBuf,
    reader: Mutex<Bank>,
    lock_wait: Duration,
}

impl SharedBank {
    pub fn open(path: &Path, lock_wait: Duration) -> Result<SharedBank, BankError> {
        let options = OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        };
        Ok(SharedBank {
            path: path.to_path_buf(),
            reader: Mutex::new(Bank::open_dir(path, options)?),
            lock_wait,
        })
    }

    /// Opens the bank as its writer, waiting up to `lock_wait` for another
    /// process's write to finish.
    fn open_writer(&self) -> ApiResult<Bank> {
        let options = OpenOptions {
            sync: SyncPolicy::Always,
            // Small, so a per-write open replays little.
            checkpoint_wal_bytes: 4 * 1024 * 1024,
            ..OpenOptions::default()
        };
        Bank::open_dir_waiting(&self.path, options, self.lock_wait).map_err(|e| ApiError::from_bank(e, "bank"))
    }
}

impl Memory for SharedBank {
    fn read<T>(&self, f: impl FnOnce(&Bank) -> ApiResult<T>) -> ApiResult<T> {
        let mut bank = self
            .reader
            .lock()
            .map_err(|_| ApiError::unavailable("reader lock poisoned"))?;
        bank.refresh().map_err(|e| ApiError::from_bank(e, "bank"))?;
        f(&bank)
    }

    fn query(&self, tree: &str, embedding: Vec<f32>, options: QueryOptions) -> ApiResult<QueryReply> {
        self.read(|bank| {
            let found = bank
                .query(tree, &embedding, &options)
                .map_err(|e| ApiError::from_bank(e, "embedding"))?;
            super::core::answer(bank, found)
        })
    }

    fn write(&self, op: WriteOp) -> ApiResult<WriteDone> {
        let mut bank = self.open_writer()?;
        let done = apply(&mut bank, op)?;
        bank.sync().map_err(|e| ApiError::from_bank(e, "bank"))?;
        // Dropped without a checkpoint: the WAL holds the write, and the
        // lock is free for the next process at once.
        Ok(done)
    }
}

/// Arguments of `query_memory`. Unknown arguments are refused by name, as
/// `store_node` and the HTTP routes refuse unknown keys: a misspelt `K`
/// must not quietly mean k = 1.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QueryParams {
    /// Tree to search, e.g. "task" or "env".
    pub tree: String,
    /// Query vector with the bank's dimension: an array of numbers, or
    /// base64 of little-endian f32 values (as `store_node` takes).
    #[serde(deserialize_with = "crate::api::embedding::embedding")]
    #[schemars(with = "crate::api::embedding::EmbeddingSchema")]
    pub embedding: Vec<f32>,
    /// How many matches to return (default 1, at most 100).
    #[serde(default)]
    #[schemars(range(min = 1, max = 100))]
    pub k: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeParams {
    /// Node index (a number) or external id (a string).
    pub id: NodeRefJson,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChainParams {
    /// Node index (a number) or external id (a string).
    pub id: NodeRefJson,
    /// Return the chain as prompt-ready text instead of JSON nodes.
    #[serde(default)]
    pub render: bool,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

/// Tool arguments read with the path of whatever they refuse: rmcp's own
/// message ("failed to deserialize parameters: -1 is not a valid node
/// index") did not say which field was wrong, as the HTTP face's 400 does.
/// The schema is `T`'s.
#[derive(Debug)]
pub struct Named<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Named<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Named<T>, D::Error> {
        serde_path_to_error::deserialize(d).map(Named).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            match path.as_str() {
                "." | "" => inner,
                _ => serde::de::Error::custom(format!("{inner} (field {path})")),
            }
        })
    }
}

impl<T: JsonSchema> JsonSchema for Named<T> {
    fn inline_schema() -> bool {
        T::inline_schema()
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        T::schema_name()
    }

    fn schema_id() -> std::borrow::Cow<'static, str> {
        T::schema_id()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        T::json_schema(generator)
    }
}

/// The tool set, over any [`Memory`].
#[derive(Clone)]
pub struct MemoryTools<M: Memory> {
    memory: Arc<M>,
}

fn reply<T: Serialize>(result: ApiResult<T>) -> Result<CallToolResult, rmcp::ErrorData> {
    Ok(match result {
        Ok(value) => CallToolResult::success(vec![ContentBlock::text(
            serde_json::to_string(&value).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}")),
        )]),
        Err(e) => CallToolResult::error(vec![ContentBlock::text(e.to_string())]),
    })
}

/// The most matches one tool call returns: an agent's prompt holds a few
/// chains, not pages of them.
pub(super) const TOOL_K_MAX: u32 = 100;

/// Query options of a tool call: `k` matches, 1 by default. A `k` out of
/// 1..=`TOOL_K_MAX` is refused by name, not silently clamped: the caller
/// would otherwise get fewer matches than it asked for without knowing.
pub(super) fn tool_options(k: Option<u32>) -> ApiResult<QueryOptions> {
    let k = k.unwrap_or(1);
    if !(1..=TOOL_K_MAX).contains(&k) {
        return Err(ApiError::bad_field("k", format!("must be 1..={TOOL_K_MAX}, got {k}")));
    }
    Ok(QueryOptions {
        k: k as usize,
        ..QueryOptions::default()
    })
}

impl<M: Memory> MemoryTools<M> {
    /// Every tool: the bank's, and with the `agent` feature those that
    /// embed text or call the LLM (`server/agent.rs`).
    fn all_tools() -> rmcp::handler::server::router::tool::ToolRouter<Self> {
        let tools = Self::tool_router();
        #[cfg(feature = "agent")]
        let tools = tools + Self::agent_tools();
        tools
    }

    /// Runs a tool's work on the blocking pool (bank reads, writes, LLM
    /// calls) and turns its result into the tool's answer.
    pub(super) async fn run<T: Serialize + Send + 'static>(
        &self,
        work: impl FnOnce(&M) -> ApiResult<T> + Send + 'static,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let memory = self.memory.clone();
        let result = tokio::task::spawn_blocking(move || work(&memory))
            .await
            .unwrap_or_else(|_| Err(ApiError::unavailable("the tool panicked")));
        reply(result)
    }
}

#[tool_router]
impl<M: Memory> MemoryTools<M> {
    pub fn new(memory: Arc<M>) -> Self {
        MemoryTools { memory }
    }

    #[tool(
        description = "Search one tree of the memory bank for the stored experiences most similar to a \
        query vector. Failures are penalised in the ranking. Returns each match's id, score, type, label \
        and its chain of node ids from the top-level root."
    )]
    async fn query_memory(
        &self,
        Parameters(Named(p)): Parameters<Named<QueryParams>>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        self.run(move |m| {
            let dim = m.read(|b| Ok(b.dim_count()))?;
            check_embedding(&p.embedding, dim, "embedding")?;
            m.query(&p.tree, p.embedding, tool_options(p.k)?)
        })
        .await
    }

    #[tool(
        description = "Store one experience node in the bank. attach is \"auto\" (placed under its \
        closest match, or as a new root), \"root\", or {\"parent\": ID}. Answers once the node is durable."
    )]
    async fn store_node(
        &self,
        Parameters(Named(p)): Parameters<Named<InsertRequest>>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        self.run(move |m| {
            let dim = m.read(|b| Ok(b.dim_count()))?;
            check_embedding(&p.embedding, dim, "embedding")?;
            match m.write(WriteOp::Insert(p.into()))? {
                WriteDone::Inserted(mut acks) => Ok(acks.remove(0)),
                _ => Err(ApiError::unavailable("unexpected answer from the writer")),
            }
        })
        .await
    }

    #[tool(
        description = "Count one success hit on a node whose experience helped an episode succeed. \
        Returns the new count and whether the node is now due for consolidation."
    )]
    async fn count_success_hit(
        &self,
        Parameters(Named(p)): Parameters<Named<NodeParams>>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        self.run(move |m| match m.write(WriteOp::Hit(p.id.into()))? {
            WriteDone::Hit(h) => Ok(h),
            _ => Err(ApiError::unavailable("unexpected answer from the writer")),
        })
        .await
    }

    #[tool(
        description = "Show the chain of a node: its top-level root first, then each refinement down \
        to the node; with render=true, as text ready to put in a prompt."
    )]
    async fn show_chain(
        &self,
        Parameters(Named(p)): Parameters<Named<ChainParams>>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        self.run(move |m| {
            let node: NodeRef = p.id.into();
            m.read(|b| chain_of(b, &node, p.render))
        })
        .await
    }

    #[tool(
        description = "Counts and sizes of the memory bank: nodes per tree, roots, successes, \
        failures, consolidations, depth histogram, bytes on disk."
    )]
    async fn bank_stats(&self, Parameters(_): Parameters<Named<NoParams>>) -> Result<CallToolResult, rmcp::ErrorData> {
        self.run(|m| {
            m.read(|b| {
                b.stats()
                    .map(|s| StatsReply::new(s, b.manifest(), None))
                    .map_err(|e| ApiError::from_bank(e, "bank"))
            })
        })
        .await
    }
}

#[tool_handler(router = Self::all_tools())]
impl<M: Memory> ServerHandler for MemoryTools<M> {
    fn get_info(&self) -> InitializeResult {
        // Without a name of its own the server introduces itself as
        // rmcp, with rmcp's version, in every client's server list.
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("deltamem", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Long-term experience memory of an agent (deltamem): query it for past experiences \
             similar to the current situation, store new ones, and count the ones that helped.",
            )
    }
}

/// The tools on Streamable HTTP, as a router nested at `/mcp`, taking
/// bodies up to the server's `body_bytes` like every other route (rmcp's
/// own default, 4 MiB, refused a batch the JSON API takes).
pub fn http_service<S: Clone + Send + Sync + 'static>(
    core: Arc<Core>,
    bound: &super::ListenAddr,
    cancel: CancellationToken,
    body_bytes: usize,
) -> Router<S> {
    let memory = Arc::new(core);
    // Host validation guards a loopback server against DNS rebinding; the
    // address it was told to listen on is allowed too.
    let hosts = super::http::local_names(bound);
    let config = StreamableHttpServerConfig::default()
        .with_cancellation_token(cancel)
        .with_allowed_hosts(hosts)
        .with_max_request_body_bytes(body_bytes);
    let sessions = Arc::new(LocalSessionManager::default());
    let service = StreamableHttpService::new(move || Ok(MemoryTools::new(memory.clone())), sessions.clone(), config);
    let cap = axum::middleware::from_fn(move |request, next| cap_sessions(sessions.clone(), request, next));
    Router::new().nest_service("/mcp", service).layer(cap)
}

/// Most MCP sessions open at once over HTTP. rmcp keeps each (~50 KB)
/// until it is closed (`DELETE /mcp`) or idle for 5 minutes, and sets no
/// limit: a client that only ever initialises grew the server by ~100 MB
/// a second. At the cap a new session is refused (503) until one ends.
const MAX_MCP_SESSIONS: usize = 1024;

/// Refuses a POST that would open a session (one without a session id)
/// while `MAX_MCP_SESSIONS` are open.
async fn cap_sessions(
    sessions: Arc<LocalSessionManager>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let opens = request.method() == axum::http::Method::POST && !request.headers().contains_key("mcp-session-id");
    if opens && sessions.sessions.read().await.len() >= MAX_MCP_SESSIONS {
        let message = format!(
            "{MAX_MCP_SESSIONS} MCP sessions are open, the most this server keeps: close one (DELETE /mcp \
             with its Mcp-Session-Id) or wait for an idle one to expire (5 minutes)"
        );
        return ApiError::unavailable(message).into_response();
    }
    next.run(request).await
}

/// The stop of `deltamem mcp`: a future that resolves at the first
/// SIGTERM or SIGINT (and a flag set then). A second signal exits at once
/// (status 128 + 15), as the first would have without a handler: a
/// client that signals twice wants the process gone even if a request is
/// still waiting, e.g. for the writer lock.
fn stop_on_signals() -> Result<(impl Future<Output = ()> + use<>, Arc<std::sync::atomic::AtomicBool>), super::ServeError>
{
    use tokio::signal::unix::{SignalKind, signal};
    let cannot = |e: std::io::Error| super::ServeError::Config(format!("cannot handle SIGTERM/SIGINT: {e}"));
    let mut term = signal(SignalKind::terminate()).map_err(cannot)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(cannot)?;
    let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (first, first_seen) = tokio::sync::oneshot::channel::<()>();
    let flag = stopped.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = interrupt.recv() => {}
        }
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = first.send(());
        tokio::select! {
            _ = term.recv() => {}
            _ = interrupt.recv() => {}
        }
        eprintln!("deltamem mcp: a second signal: exiting at once");
        std::process::exit(128 + 15);
    });
    Ok((
        async move {
            let _ = first_seen.await;
        },
        stopped,
    ))
}

/// `deltamem mcp BANK`: the tools over stdin/stdout until stdin closes
/// or a SIGTERM or SIGINT comes.
pub fn serve_stdio(path: &Path, lock_wait: Duration) -> Result<(), super::ServeError> {
    let memory = Arc::new(SharedBank::open(path, lock_wait)?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| super::ServeError::Config(format!("cannot start the async runtime: {e}")))?;
    let served = runtime.block_on(async move {
        let limits = super::stdio::LineLimits::default();
        // SIGTERM or SIGINT ends the input as a closed stdin does: the
        // requests already read are served and answered, then it exits 0.
        let (stop, stopped) = stop_on_signals()?;
        let (read, write, answers) = super::stdio::guarded_stdio(limits, stop);
        // The pump refuses longer lines itself, with an answer.
        let transport = AsyncRwTransport::new_server(read, write).with_max_line_length(limits.max_bytes + 1);
        let service = match MemoryTools::new(memory).serve(transport).await {
            Ok(service) => service,
            // Stopped before a client finished the handshake: a stop.
            Err(_) if stopped.load(std::sync::atomic::Ordering::SeqCst) => return Ok(()),
            Err(e) => return Err(super::ServeError::Config(format!("MCP handshake failed: {e}"))),
        };
        service
            .waiting()
            .await
            .map_err(|e| super::ServeError::Config(format!("MCP session failed: {e}")))?;
        // rmcp has closed its end: the last answers reach stdout.
        let _ = answers.await;
        Ok(())
    });
    // A read of stdin may still be blocked on a pool thread (after a
    // signal, stdin is still open), and a read cannot be cancelled: the
    // runtime is not waited for, as dropping it would wait for that read.
    runtime.shutdown_background();
    served
}

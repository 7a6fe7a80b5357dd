//! `deltamem serve` and `deltamem mcp` (feature `server`): one bank served
//! over HTTP/JSON and the Model Context Protocol (docs/SERVER.md). A thin
//! face over the bank API: `core` owns the bank (writer thread, group
//! commit, query batching), `routes`/`browse` map HTTP onto it, `mcp`
//! exposes the same operations as MCP tools.

mod address;
#[cfg(feature = "agent")]
mod agent;
mod batch_query;
mod batcher;
pub mod body;
mod browse;
mod commit;
mod core;
mod error;
mod history;
mod http;
mod listen;
pub mod mcp;
mod metrics;
pub mod openapi;
mod outline;
mod rotation;
mod routes;
mod stdio;
#[cfg(test)]
mod tests;
mod tree_index;
mod vectors;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use self::core::Core;
pub use address::ListenAddr;
pub use error::ApiError;
pub use http::Limits;

use crate::bank::{BankError, OpenOptions, SyncPolicy};

/// Everything `deltamem serve` is told.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub bank: PathBuf,
    pub listen: ListenAddr,
    /// Bearer token; required unless `listen` is a loopback address or a
    /// Unix socket.
    pub token: Option<String>,
    /// Threads of the runtime and of each scan.
    pub threads: usize,
    pub sync: SyncPolicy,
    pub read_only: bool,
    /// The bank's checkpoint threshold (`OpenOptions::checkpoint_wal_bytes`).
    pub checkpoint_wal_bytes: u64,
    /// Longest wait at start for another process (a `deltamem mcp`, a CLI
    /// write) to release the bank's writer lock.
    pub lock_wait: Duration,
    /// Called with the bank's path and `lock_wait` if that wait begins
    /// (the CLI says on stderr why the server has not started yet).
    pub on_lock_wait: Option<fn(&std::path::Path, Duration)>,
    pub limits: Limits,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Bank(#[from] BankError),
    #[error("{0}")]
    Config(String),
    // The io::Error is the source, not repeated in the message: `{:#}`
    // (anyhow) prints it after this text (it was printed twice).
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ServeError {
    let what = what.into();
    move |source| ServeError::Io { what, source }
}

/// Runs the server until SIGTERM or SIGINT, then stops accepting,
/// finishes requests in flight (waiting at most `SHUTDOWN_DRAIN`),
/// checkpoints and returns. `ready` is told
/// the bound address (the port may have been 0).
pub fn serve(config: ServeConfig, ready: impl FnOnce(&ListenAddr)) -> Result<(), ServeError> {
    serve_until(config, ready, std::future::pending())
}

/// As `serve`, stopping also when `stop` resolves (a program that runs
/// servers of its own, such as a benchmark that starts one per run).
pub fn serve_until(
    config: ServeConfig,
    ready: impl FnOnce(&ListenAddr),
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), ServeError> {
    if !config.listen.is_local() && config.token.is_none() {
        return Err(ServeError::Config(format!(
            "{} is not a loopback address: give a bearer token (--token-file or DELTAMEM_TOKEN)",
            config.listen
        )));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.threads.max(1))
        .enable_all()
        .build()
        .map_err(io("cannot start the async runtime"))?;
    let options = OpenOptions {
        read_only: config.read_only,
        checkpoint_wal_bytes: config.checkpoint_wal_bytes,
        ..OpenOptions::default()
    };
    let waiting = || {
        if let Some(note) = config.on_lock_wait {
            note(&config.bank, config.lock_wait);
        }
    };
    let core = Core::open(
        &config.bank,
        config.sync,
        options,
        config.threads,
        config.lock_wait,
        waiting,
    )?;
    let served = runtime.block_on(run(config, core.clone(), ready, stop));
    // Requests in flight have finished: drain the writer and checkpoint.
    let closed = core.shutdown();
    served?;
    closed.map_err(ServeError::from)
}

async fn run(
    config: ServeConfig,
    core: Arc<Core>,
    ready: impl FnOnce(&ListenAddr),
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), ServeError> {
    match config.listen.clone() {
        ListenAddr::Tcp(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(io(format!("cannot listen on {addr}")))?;
            let bound = listener.local_addr().map_err(io("cannot read the bound address"))?;
            run_on(listener, ListenAddr::Tcp(bound), config, core, ready, stop).await
        }
        ListenAddr::Unix(path) => {
            let socket = address::bind_unix(&path)?;
            run_on(socket, ListenAddr::Unix(path), config, core, ready, stop).await
        }
    }
}

async fn run_on<L: listen::Accept>(
    listener: L,
    bound: ListenAddr,
    config: ServeConfig,
    core: Arc<Core>,
    ready: impl FnOnce(&ListenAddr),
    asked: impl std::future::Future<Output = ()>,
) -> Result<(), ServeError> {
    let cancel = tokio_util::sync::CancellationToken::new();
    let state = http::AppState {
        core: core.clone(),
        limits: Arc::new(config.limits.clone()),
        token: config.token.map(Arc::new),
        shutdown: cancel.clone(),
        local_names: match &bound {
            ListenAddr::Tcp(addr) if addr.ip().is_loopback() => Some(http::local_names(&bound).into()),
            _ => None,
        },
        dumps: Arc::new(tokio::sync::Semaphore::new(config.limits.dumps.max(1))),
        answers: Arc::new(tokio::sync::Semaphore::new(config.limits.answer_mib as usize)),
    };
    let mcp = mcp::http_service(core, &bound, cancel.clone(), config.limits.body_bytes);
    let app = http::router(state, mcp);
    let signal = shutdown_signal()?;
    ready(&bound);
    let stop = async move {
        tokio::select! {
            () = signal => {}
            () = asked => {}
        }
        cancel.cancel();
    };
    let head = Duration::from_millis(config.limits.request_ms);
    listen::serve(listener, app, stop, head, SHUTDOWN_DRAIN).await;
    Ok(())
}

/// How long a shutdown waits for requests in flight. Long enough for a
/// `/v1/record` whose LLM calls are slow (the client reads for up to 300 s
/// a try, docs/AGENT.md), bounded so that a client that stops reading its
/// answer cannot keep the server from exiting. Cut-off requests lose only
/// their answers: the writer still drains and the checkpoint runs.
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(600);

/// Resolves on SIGTERM or SIGINT. The handlers are installed when this
/// is called (before the server announces itself), not when first polled,
/// so a signal sent right after the announcement is not fatal.
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>, ServeError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(io("cannot handle SIGTERM"))?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(io("cannot handle SIGINT"))?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = term.recv() => {}
        }
    })
}

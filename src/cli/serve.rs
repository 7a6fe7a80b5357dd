//! `deltamem serve` and `deltamem mcp` (feature `server`, docs/SERVER.md).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use deltamem::server::body::BATCH_ITEMS_CAP;

use super::Status;
use super::insert::SyncArg;

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    bank: PathBuf,
    /// Address to listen on (anything but loopback needs a token), or
    /// unix:PATH for an owner-only Unix socket.
    #[arg(long, default_value = "127.0.0.1:7878")]
    listen: deltamem::server::ListenAddr,
    /// File holding the bearer token (else $DELTAMEM_TOKEN, if set).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Runtime worker threads, and threads one scan may use.
    #[arg(long, default_value_t = default_threads())]
    threads: usize,
    /// When a write is acknowledged: after its group's fsync (always,
    /// batch) or at once (none).
    #[arg(long, value_enum, default_value_t = SyncArg::Always)]
    sync: SyncArg,
    /// Serve reads only (takes no writer lock).
    #[arg(long)]
    read_only: bool,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = 16 * 1024 * 1024)]
    max_body_bytes: usize,
    /// Most items in one batch request (at most 65,536).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=BATCH_ITEMS_CAP as u64))]
    max_batch: u64,
    /// Longest time to receive a body or answer a read, in ms (1 ms to a
    /// day: 0 answered every body that came in a second packet with 408).
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    request_timeout_ms: u64,
    /// Most tree dumps sent at once (more are answered 503): a client that
    /// reads one slowly holds about 1 MiB of the server's memory.
    #[arg(long, default_value_t = 64)]
    max_dumps: usize,
    /// Most MiB of large answers (1 MiB or more, e.g. a batch query's)
    /// held at once while clients read them (more are answered 503).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    max_answer_mib: u32,
    /// Checkpoint once the WAL holds this many MiB: a larger WAL means
    /// fewer checkpoints and a longer replay after a crash.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    checkpoint_wal_mib: u64,
}

#[derive(Debug, clap::Args)]
pub struct McpArgs {
    bank: PathBuf,
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// The token from the file (trimmed), else from $DELTAMEM_TOKEN (unless
/// empty). Refused unless it is at least 16 visible ASCII characters: a
/// token a client cannot send in an `Authorization` header (a second line
/// of the file, a space inside, a non-ASCII letter) would start a server
/// that answers every request with 401.
fn read_token(file: Option<&Path>) -> anyhow::Result<Option<String>> {
    let token = match file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the token file {}", path.display()))?
                .trim()
                .to_string(),
        ),
        // An empty variable (`DELTAMEM_TOKEN= deltamem serve`) is unset, as
        // shells and env files write "no token"; one of blanks is refused
        // as too short (a token meant, and lost).
        None => match std::env::var("DELTAMEM_TOKEN") {
            Ok(t) if t.is_empty() => None,
            Ok(t) => Some(t.trim().to_string()),
            Err(std::env::VarError::NotPresent) => None,
            Err(std::env::VarError::NotUnicode(_)) => bail!("DELTAMEM_TOKEN is not UTF-8"),
        },
    };
    let Some(token) = token else {
        return Ok(None);
    };
    if let Some(bad) = token.chars().find(|c| !c.is_ascii_graphic()) {
        bail!(
            "the bearer token holds {bad:?}: a client can send only visible ASCII characters \
             (a token file holds one line)"
        );
    }
    if token.len() < 16 {
        bail!("the bearer token must be at least 16 characters");
    }
    Ok(Some(token))
}

pub fn serve(args: ServeArgs, quiet: bool) -> anyhow::Result<Status> {
    let config = deltamem::server::ServeConfig {
        token: read_token(args.token_file.as_deref())?,
        bank: args.bank.clone(),
        listen: args.listen.clone(),
        threads: args.threads.max(1),
        sync: args.sync.policy(),
        read_only: args.read_only,
        checkpoint_wal_bytes: args.checkpoint_wal_mib << 20,
        lock_wait: super::lock_wait(),
        on_lock_wait: (!quiet).then_some(say_waiting),
        limits: deltamem::server::Limits {
            body_bytes: args.max_body_bytes,
            batch_items: args.max_batch as usize,
            request_ms: args.request_timeout_ms,
            dumps: args.max_dumps.max(1),
            answer_mib: args.max_answer_mib,
            ..Default::default()
        },
    };
    deltamem::server::serve(config, |bound| {
        if !quiet {
            // Scripts (and the tests) read the port from this line.
            eprintln!("deltamem: serving {} on {bound}", args.bank.display());
        }
    })
    .with_context(|| format!("serving {}", args.bank.display()))?;
    Ok(Status::Ok)
}

/// Told when `serve` finds the writer lock held at start.
fn say_waiting(bank: &Path, lock_wait: Duration) {
    eprintln!(
        "deltamem: {} is locked by another writer; waiting up to {} ms for it (--lock-wait-ms)",
        bank.display(),
        lock_wait.as_millis()
    );
}

pub fn mcp(args: McpArgs) -> anyhow::Result<Status> {
    deltamem::server::mcp::serve_stdio(&args.bank, super::lock_wait())
        .with_context(|| format!("MCP server on {}", args.bank.display()))?;
    Ok(Status::Ok)
}

//! `deltamem`: the command-line front end of the storage engine. Every
//! command that produces data writes JSON Lines on stdout, so scripts can
//! drive a bank without linking the library; diagnostics go to stderr.

mod cli;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use cli::{NodeArg, Status, TreeArg};

#[derive(Debug, Parser)]
#[command(name = "deltamem", version, about = "Crash-safe residual-tree memory for LLM agents")]
struct Cli {
    /// Print only results and errors, no progress or narration.
    #[arg(long, global = true)]
    quiet: bool,
    /// Longest wait, in ms, for another process (a `deltamem mcp`, an
    /// agent, another command) to release the bank's writer lock before a
    /// command that writes, `serve` or `mcp` gives up.
    #[arg(long, global = true, default_value_t = 10_000)]
    lock_wait_ms: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create a new bank directory.
    Init {
        bank: PathBuf,
        /// Embedding dimension every node of the bank will have.
        #[arg(long = "dim")]
        dim_count: u32,
        /// A tree as NAME or NAME:tau=X; repeat for several trees. Giving
        /// any replaces the default pair `task` and `env`.
        #[arg(long = "tree", value_name = "NAME[:tau=X]", value_parser = cli::init::parse_tree_arg)]
        trees: Vec<TreeArg>,
        /// Score penalty subtracted from FAILURE nodes.
        #[arg(long)]
        eps: Option<f32>,
        /// D_max: longest chain, in nodes (1..=255).
        #[arg(long, value_parser = clap::value_parser!(u8).range(1..))]
        max_depth: Option<u8>,
        /// K_cons: success hits that make a residual node due.
        #[arg(long)]
        consolidate_after: Option<u32>,
        /// Rows per segment file (default: about 64 MiB of vectors).
        #[arg(long)]
        rows_per_segment: Option<u32>,
        /// How vectors are stored: f32, f16 (half the size), or int8
        /// (f32 plus an int8 side column for a faster exact scan).
        #[arg(long, value_enum, default_value_t = cli::init::PrecisionArg::F32)]
        precision: cli::init::PrecisionArg,
    },
    /// Add nodes: one JSON object per stdin line, one acknowledgement each.
    Insert {
        bank: PathBuf,
        /// When to fsync: before each ack, in groups, or only at close.
        #[arg(long, value_enum, default_value_t = cli::insert::SyncArg::Always)]
        sync: cli::insert::SyncArg,
    },
    /// Answer similarity queries read from stdin (or every row of --npy),
    /// one result line each.
    Query {
        bank: PathBuf,
        /// Matches per query, unless the line says otherwise.
        #[arg(long, default_value_t = 1)]
        k: usize,
        /// Also match nodes that were already distilled into a new root.
        #[arg(long)]
        include_consolidated: bool,
        #[command(flatten)]
        matrix: cli::query_npy::NpyArgs,
    },
    /// Print every node as one JSON line, in index order.
    Dump {
        bank: PathBuf,
        #[arg(long)]
        tree: Option<String>,
        /// Include the stored (normalised) vectors.
        #[arg(long)]
        embeddings: bool,
        /// Also write the stored (normalised) vectors as a float32 (rows,
        /// dim) .npy matrix: row r is the node printed on output line r,
        /// i.e. the nodes (of --tree, if given) in increasing id order.
        #[arg(long, value_name = "OUT.npy")]
        embeddings_npy: Option<PathBuf>,
    },
    /// Print the chain from a node's top-level root down to it.
    Chain {
        bank: PathBuf,
        /// Node index, or external id (quote it as "\"42\"" if it is all digits).
        id: NodeArg,
        /// Print the chain as prompt text instead of JSON.
        #[arg(long)]
        render: bool,
    },
    /// Count one success hit on a node.
    Hit { bank: PathBuf, id: NodeArg },
    /// Write a distilled root for a node's chain and flag the node.
    Consolidate {
        bank: PathBuf,
        id: NodeArg,
        /// The distilled fields, as a JSON object of strings.
        #[arg(long)]
        payload: String,
    },
    /// List nodes due for consolidation.
    Due {
        bank: PathBuf,
        #[arg(long)]
        tree: Option<String>,
    },
    /// Counts, depth histograms and sizes.
    Stats {
        bank: PathBuf,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Also decompress every payload to measure the compression ratio.
        #[arg(long)]
        deep: bool,
        /// Draw the depth histogram of every tree into this SVG file.
        #[arg(long, value_name = "DEPTH.svg")]
        plot: Option<PathBuf>,
    },
    /// Check every checksum and link of a bank.
    Verify {
        bank: PathBuf,
        /// One JSON object (ok, counts, problems) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Load nodes from the Python world: a reference tree file or a .npy matrix.
    Import(cli::import::ImportArgs),
    /// Write a tree for the Python world (the reference's schema, or JSON Lines).
    Export(cli::export::ExportArgs),
    /// Write a compacted, checkpointed, read-only copy of a bank to OUT.
    Freeze {
        bank: PathBuf,
        out: PathBuf,
        /// Also read the copy's vector columns back from the disk and check
        /// them (they were checked in memory as they were copied; this
        /// roughly doubles the disk time).
        #[arg(long)]
        verify_vectors: bool,
    },
    /// Reclaim dead space in a live bank (crash-safe).
    Compact { bank: PathBuf },
    /// Repair a WAL damaged in the middle (intact records after a damaged
    /// one): without the flag, only report what a repair would drop.
    Repair {
        bank: PathBuf,
        /// Truncate the WAL at the damaged record, dropping the intact
        /// records after it (and the changes they hold).
        #[arg(long)]
        drop_damaged_wal_tail: bool,
    },
    /// Draw one tree as text, Graphviz DOT or SVG.
    Draw {
        bank: PathBuf,
        #[arg(long)]
        tree: String,
        #[arg(long, value_enum, default_value_t = cli::picture::DrawFormat::Text)]
        format: cli::picture::DrawFormat,
        /// Write here instead of stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Longest node label, in characters (from the activation
        /// condition, or the scenario).
        #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u16).range(4..))]
        max_label: u16,
        /// Draw only the subtree under this node (index, or external id).
        #[arg(long, value_name = "ID")]
        root: Option<cli::NodeArg>,
        /// Draw only the top N levels (1: the roots, or --root's node,
        /// alone); a node whose children are cut off says how many.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        depth: Option<u32>,
        /// Refuse, writing nothing, a drawing of more nodes than this.
        #[arg(long, value_name = "N", default_value_t = cli::draw_scope::DEFAULT_MAX_NODES,
              value_parser = clap::value_parser!(u32).range(1..))]
        max_nodes: u32,
    },
    /// Embed a text with the configured ONNX model (feature `agent`).
    Embed(cli::agent::EmbedArgs),
    /// Search both trees for a task and an environment; print the rendered
    /// memory context for the prompt (feature `agent`).
    Retrieve(cli::agent::RetrieveArgs),
    /// Record a finished episode: extract with the LLM, place the nodes,
    /// count hits, consolidate (feature `agent`).
    Record(cli::agent::RecordArgs),
    /// Serve the bank over HTTP/JSON and MCP to many clients (docs/SERVER.md).
    #[cfg(feature = "server")]
    Serve(cli::serve::ServeArgs),
    /// Serve the bank's MCP tools over stdin/stdout; many of these can
    /// share one bank (docs/SERVER.md).
    #[cfg(feature = "server")]
    Mcp(cli::serve::McpArgs),
    /// Walk through the agent loop: a recorded ScienceWorld run replayed
    /// with MiniLM embeddings (feature `agent` and its assets), else a
    /// scripted run with a toy embedder.
    Demo {
        /// Where to create the demo bank (default: a temporary directory).
        dir: Option<PathBuf>,
        /// Keep the temporary bank instead of removing it at the end.
        #[arg(long)]
        keep: bool,
        /// Run the toy demo even when the real one could run.
        #[arg(long)]
        toy: bool,
    },
}

fn run(cli: Cli) -> anyhow::Result<Status> {
    let quiet = cli.quiet;
    cli::set_lock_wait(std::time::Duration::from_millis(cli.lock_wait_ms));
    match cli.command {
        Command::Init {
            bank,
            dim_count,
            trees,
            eps,
            max_depth,
            consolidate_after,
            rows_per_segment,
            precision,
        } => cli::init::run(
            &bank,
            cli::init::InitArgs {
                dim_count,
                trees,
                eps,
                max_depth,
                consolidate_after,
                rows_per_segment,
                precision,
            },
        ),
        Command::Insert { bank, sync } => cli::insert::run(&bank, sync, quiet),
        Command::Query {
            bank,
            k,
            include_consolidated,
            matrix,
        } => cli::query_npy::dispatch(&bank, k, include_consolidated, &matrix, quiet),
        Command::Dump {
            bank,
            tree,
            embeddings,
            embeddings_npy,
        } => cli::inspect::dump(&bank, tree.as_deref(), embeddings, embeddings_npy.as_deref(), quiet),
        Command::Chain { bank, id, render } => cli::inspect::chain(&bank, &id, render),
        Command::Hit { bank, id } => cli::update::hit(&bank, &id),
        Command::Consolidate { bank, id, payload } => cli::update::consolidate(&bank, &id, &payload),
        Command::Due { bank, tree } => cli::inspect::due(&bank, tree.as_deref()),
        Command::Stats { bank, json, deep, plot } => {
            let args = cli::report::StatsArgs {
                json,
                deep,
                plot: plot.as_deref(),
            };
            cli::report::stats(&bank, &args, quiet)
        }
        Command::Verify { bank, json } => cli::report::verify(&bank, json, quiet),
        Command::Import(args) => cli::import::run(&args, quiet),
        Command::Export(args) => cli::export::run(&args, quiet),
        Command::Freeze {
            bank,
            out,
            verify_vectors,
        } => cli::maintain::freeze(&bank, &out, verify_vectors, quiet),
        Command::Compact { bank } => cli::maintain::compact(&bank, quiet),
        Command::Repair {
            bank,
            drop_damaged_wal_tail,
        } => cli::maintain::repair(&bank, drop_damaged_wal_tail),
        Command::Draw {
            bank,
            tree,
            format,
            out,
            max_label,
            root,
            depth,
            max_nodes,
        } => {
            let scope = cli::draw_scope::Scope {
                root: root.as_ref(),
                levels: depth,
                max_nodes,
            };
            cli::picture::run_draw(&bank, &tree, &scope, format, out.as_deref(), usize::from(max_label))
        }
        Command::Embed(args) => cli::agent::embed(&args),
        Command::Retrieve(args) => cli::agent::retrieve(&args),
        Command::Record(args) => cli::agent::record(&args),
        Command::Demo { dir, keep, toy } => cli::demo::run(dir.as_deref(), keep, quiet, toy),
        #[cfg(feature = "server")]
        Command::Serve(args) => cli::serve::serve(args, quiet),
        #[cfg(feature = "server")]
        Command::Mcp(args) => cli::serve::mcp(args),
    }
}

#[global_allocator]
static ALLOCATOR: cli::heap::Counting = cli::heap::Counting;

fn main() -> ExitCode {
    // clap exits by itself with status 2 on usage errors (0 for --help).
    let cli = Cli::parse();
    let result = run(cli);
    cli::heap::report();
    match result {
        Ok(Status::Ok) => ExitCode::SUCCESS,
        Ok(Status::Failed) => ExitCode::from(1),
        Ok(Status::SavedCheckpointFailed) => ExitCode::from(3),
        Err(e) => {
            if !cli::is_broken_pipe(&e) {
                eprintln!("deltamem: {e:#}");
            }
            ExitCode::from(1)
        }
    }
}

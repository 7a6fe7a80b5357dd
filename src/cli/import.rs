//! `deltamem import`: bulk loads from the Python world, either a tree saved
//! by the DeltaMem reference implementation or a NumPy matrix of vectors
//! (see `import_npy.rs`).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::ArgGroup;
use deltamem::Bank;
use deltamem::api::InsertReply;
use deltamem::bank::InsertAck;
use deltamem::interop::reference::{self, ImportOptions};

use super::insert::SyncArg;
use super::progress::Progress;
use super::{Status, write_json_line};

#[derive(Debug, Clone, clap::Args)]
#[command(group(ArgGroup::new("source").required(true).args(["reference_json", "npy"])))]
pub struct ImportArgs {
    pub bank: PathBuf,
    /// The tree the nodes go into.
    #[arg(long)]
    pub tree: String,
    /// A tree file saved by the DeltaMem reference implementation (legacy
    /// or current schema). Ids, links, types, labels, counters and vectors
    /// are kept; the placeholder root is dropped.
    #[arg(long, value_name = "FILE")]
    pub reference_json: Option<PathBuf>,
    /// A float32/float16 (rows, dim) matrix, one node per row, C order.
    #[arg(long, value_name = "VECTORS.npy")]
    pub npy: Option<PathBuf>,
    /// One JSON object per row (line N+1 describes row N), all keys
    /// optional: {"scenario","payload":{..},"label","attach","id"}.
    /// Without it: scenario "row N", label SUCCESS, attach root.
    #[arg(long, value_name = "META.jsonl", conflicts_with = "reference_json")]
    pub meta: Option<PathBuf>,
    /// Nodes per atomic batch. With --npy and 256 or more: one bulk load,
    /// written straight to the data files and durable before its lines are
    /// printed (batches share a checkpoint per 64 MiB of vectors);
    /// otherwise one WAL record.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=65535))]
    pub batch: u32,
    /// When to fsync the WAL (a --npy import with --batch >= 256 bypasses
    /// it). Whatever the choice, the import ends with a checkpoint.
    #[arg(long, value_enum, default_value_t = SyncArg::None)]
    pub sync: SyncArg,
    /// Skip the check of every row before writing: a bad row then rejects
    /// only its batch, and the other batches are stored.
    #[arg(long, conflicts_with = "reference_json")]
    pub keep_going: bool,
}

pub fn run(args: &ImportArgs, quiet: bool) -> anyhow::Result<Status> {
    match (&args.reference_json, &args.npy) {
        (Some(file), _) => run_reference(args, file, quiet),
        (None, Some(file)) => super::import_npy::run(args, file, quiet),
        (None, None) => unreachable!("clap requires one source"),
    }
}

/// Runs `work` on the writer (`super::with_writer`) under the import's
/// sync policy; a failed import still releases the lock and checkpoints
/// what it stored.
pub fn with_writer<T>(
    path: &Path,
    sync: SyncArg,
    work: impl FnOnce(&mut Bank) -> anyhow::Result<T>,
) -> anyhow::Result<(T, Status)> {
    super::with_writer(path, Some(sync.policy()), work)
}

fn run_reference(args: &ImportArgs, file: &Path, quiet: bool) -> anyhow::Result<Status> {
    // Parsed before the bank is opened: a bad file costs no lock.
    let source = reference::read_reference(file)?;
    let progress = Progress::bar(source.nodes.len() as u64, "nodes", quiet);
    let options = ImportOptions {
        sync: None,
        max_batch_nodes: args.batch as usize,
    };
    let ((report, acks), status) = with_writer(&args.bank, args.sync, |bank| {
        let report = reference::import_tree(bank, &args.tree, source, &options, &mut |done, _| progress.set(done))?;
        let mut acks = Vec::with_capacity(report.ids.len());
        for &id in &report.ids {
            let row = bank.row(id).with_context(|| format!("node {id}"))?;
            let ack = InsertAck {
                id,
                tree: args.tree.clone(),
                node_type: row.node_type,
                parent: row.parent(),
                depth: row.depth,
                matched: None,
                lsn: 0,
            };
            acks.push(InsertReply::new(ack, row.external_id_text()));
        }
        Ok((report, acks))
    })?;
    drop(progress);
    let mut out = super::stdout();
    for ack in &acks {
        write_json_line(&mut out, ack)?;
    }
    out.flush().context("cannot write to stdout")?;
    if !quiet {
        for note in &report.notes {
            eprintln!("deltamem: note: {note}");
        }
        eprintln!(
            "deltamem: {} nodes imported into tree {:?} from {} ({} placeholder root dropped)",
            report.ids.len(),
            report.tree,
            report.file,
            report.placeholders_dropped,
        );
    }
    Ok(status)
}

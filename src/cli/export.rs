//! `deltamem export`: a tree in the reference implementation's current
//! schema (so its Python code can load what we wrote), or as JSON Lines.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::scratch::write_atomically;
use anyhow::Context;
use deltamem::interop::InteropError;
use deltamem::interop::reference::{self, ExportOptions, ExportReport};

use super::Status;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// The reference's tree file: {"meta": {...}, "nodes": [...]}, the
    /// placeholder root first, BFS order, json.dump(indent=2) layout.
    ReferenceJson,
    /// One node object per line (reference node schema plus "id" and
    /// "depth"), BFS order, no placeholder.
    Jsonl,
}

#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    pub bank: PathBuf,
    #[arg(long)]
    pub tree: String,
    #[arg(long, value_enum)]
    pub format: ExportFormat,
    /// Write here (through a temporary file renamed into place) instead of
    /// stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

fn write(bank: &deltamem::Bank, args: &ExportArgs, out: &mut impl Write) -> Result<ExportReport, InteropError> {
    match args.format {
        ExportFormat::ReferenceJson => reference::export_tree(bank, &args.tree, out, &ExportOptions::default()),
        ExportFormat::Jsonl => reference::export_jsonl(bank, &args.tree, out),
    }
}

pub fn run(args: &ExportArgs, quiet: bool) -> anyhow::Result<Status> {
    let bank = super::open_read(&args.bank)?;
    // An unknown tree is reported before any output file is created.
    bank.tree_index(&args.tree)?;
    let report = match &args.out {
        Some(path) => export_to_file(&bank, args, path)?,
        None => {
            // Stdout cannot be taken back: a node the export would refuse
            // part-way is refused before the first byte (it left a cut-off
            // document behind).
            reference::check_exportable(&bank, &args.tree)?;
            let mut out = super::stdout();
            let report = write(&bank, args, &mut out).map_err(|e| e.naming_output("stdout"))?;
            out.flush().context("cannot write to stdout")?;
            report
        }
    };
    if !quiet {
        eprintln!(
            "deltamem: exported {} nodes of tree {:?} (max depth {})",
            report.nodes, args.tree, report.max_depth
        );
    }
    Ok(Status::Ok)
}

fn export_to_file(bank: &deltamem::Bank, args: &ExportArgs, path: &Path) -> anyhow::Result<ExportReport> {
    let mut report = None;
    write_atomically(path, |out| {
        report = Some(write(bank, args, out).map_err(|e| e.naming_output(&path.display().to_string()))?);
        Ok(())
    })?;
    report.context("export wrote nothing")
}

//! Read-only views of a bank: `dump`, `chain`, `due`.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use deltamem::api::{ChainReply, DueReply, NodeReply};

use deltamem::interop::npy::{NpyElement, NpyMatrixWriter};

use super::progress::Progress;
use super::{NodeArg, Status, write_json_line};

/// Prints every node (of one tree, if given) as a JSON line, in index
/// order. With `embeddings_npy`, also writes their vectors as a float32
/// matrix whose row r is the node on output line r.
pub fn dump(
    path: &Path,
    tree: Option<&str>,
    embeddings: bool,
    embeddings_npy: Option<&Path>,
    quiet: bool,
) -> anyhow::Result<Status> {
    let bank = super::open_read(path)?;
    let wanted = tree.map(|t| bank.tree_index(t)).transpose()?;
    let mut ids = Vec::new();
    for index in 0..bank.node_count() {
        let row = bank.row(index).with_context(|| format!("node {index}"))?;
        if wanted.is_none_or(|t| t == row.tree) {
            ids.push(index);
        }
    }
    let mut matrix = match embeddings_npy {
        Some(npy) => Some(NpyMatrixWriter::create(
            npy,
            ids.len() as u64,
            bank.dim_count() as usize,
            NpyElement::F32,
        )?),
        None => None,
    };
    // A SIGTERM mid-dump left an 18 MB temporary file behind.
    if let Some(tmp) = matrix.as_ref().and_then(NpyMatrixWriter::temp_path) {
        super::scratch::remove_on_signal(tmp)?;
    }
    let progress = Progress::bar(ids.len() as u64, "nodes", quiet);
    let mut out = super::stdout();
    for &index in &ids {
        let node = NodeReply::read(&bank, index, embeddings).with_context(|| format!("node {index}"))?;
        if let Some(m) = matrix.as_mut() {
            m.write_row(&bank.vector(index).with_context(|| format!("node {index}"))?)?;
        }
        write_json_line(&mut out, &node)?;
        progress.inc(1);
    }
    if let Some(m) = matrix {
        m.finish()?;
    }
    out.flush().context("cannot write to stdout")?;
    Ok(Status::Ok)
}

pub fn chain(path: &Path, id: &NodeArg, render: bool) -> anyhow::Result<Status> {
    let bank = super::open_read(path)?;
    let index = super::resolve(&bank, id, path)?;
    let mut out = super::stdout();
    if render {
        let text = bank
            .render_chain(index)
            .with_context(|| format!("cannot render the chain of node {index}"))?;
        out.write_all(text.as_bytes()).context("cannot write to stdout")?;
    } else {
        let reply = ChainReply::read(&bank, index).with_context(|| format!("cannot walk the chain of node {index}"))?;
        write_json_line(&mut out, &reply)?;
    }
    out.flush().context("cannot write to stdout")?;
    Ok(Status::Ok)
}

pub fn due(path: &Path, tree: Option<&str>) -> anyhow::Result<Status> {
    let bank = super::open_read(path)?;
    let mut out = super::stdout();
    for index in bank.due_for_consolidation(tree)? {
        let due = DueReply::read(&bank, index).with_context(|| format!("node {index}"))?;
        write_json_line(&mut out, &due)?;
    }
    out.flush().context("cannot write to stdout")?;
    Ok(Status::Ok)
}

//! Read-only views of a bank: `dump`, `chain`, `due`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use anyhow::Context;
use deltamem::Bank;
use serde::Serialize;

use deltamem::interop::npy::{NpyElement, NpyMatrixWriter};

use super::progress::Progress;
use super::{NodeArg, Status, write_json_line};

#[derive(Serialize)]
struct DumpOut {
    id: u32,
    tree: String,
    #[serde(rename = "type")]
    node_type: &'static str,
    label: &'static str,
    parent: Option<u32>,
    depth: u8,
    success_hits: u32,
    retrievals: u32,
    consolidated: bool,
    consolidated_root: bool,
    scenario: String,
    payload: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    external_id: Option<String>,
    /// Consolidated node: its distilled root; consolidated root: its source.
    #[serde(skip_serializing_if = "Option::is_none")]
    link: Option<u32>,
    created_unix_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    embedding: Option<Vec<f32>>,
}

fn dump_node(bank: &Bank, index: u32, embeddings: bool) -> anyhow::Result<DumpOut> {
    let node = bank.node(index)?;
    let row = node.row;
    let embedding = match embeddings {
        true => Some(bank.vector(index)?),
        false => None,
    };
    Ok(DumpOut {
        id: index,
        tree: node.tree_name,
        node_type: row.node_type.as_str(),
        label: row.label.as_str(),
        parent: row.parent(),
        depth: row.depth,
        success_hits: row.success_hits,
        retrievals: row.retrievals,
        consolidated: row.is_consolidated(),
        consolidated_root: row.is_consolidated_root(),
        scenario: node.payload.scenario,
        payload: node.payload.fields,
        external_id: row.external_id_text(),
        link: row.link(),
        created_unix_ms: row.created_unix_ms,
        embedding,
    })
}

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
    let progress = Progress::bar(ids.len() as u64, "nodes", quiet);
    let mut out = super::stdout();
    for &index in &ids {
        let node = dump_node(&bank, index, embeddings).with_context(|| format!("node {index}"))?;
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

#[derive(Serialize)]
struct ChainNodeOut {
    id: u32,
    #[serde(rename = "type")]
    node_type: &'static str,
    label: &'static str,
    depth: u8,
    scenario: String,
    payload: BTreeMap<String, String>,
}

#[derive(Serialize)]
struct ChainOut {
    chain: Vec<u32>,
    nodes: Vec<ChainNodeOut>,
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
        let ids = bank
            .chain(index)
            .with_context(|| format!("cannot walk the chain of node {index}"))?;
        let mut nodes = Vec::with_capacity(ids.len());
        for &i in &ids {
            let node = bank.node(i).with_context(|| format!("node {i}"))?;
            nodes.push(ChainNodeOut {
                id: i,
                node_type: node.row.node_type.as_str(),
                label: node.row.label.as_str(),
                depth: node.row.depth,
                scenario: node.payload.scenario,
                payload: node.payload.fields,
            });
        }
        write_json_line(&mut out, &ChainOut { chain: ids, nodes })?;
    }
    out.flush().context("cannot write to stdout")?;
    Ok(Status::Ok)
}

#[derive(Serialize)]
struct DueOut<'a> {
    id: u32,
    tree: &'a str,
    success_hits: u32,
    chain: Vec<u32>,
}

pub fn due(path: &Path, tree: Option<&str>) -> anyhow::Result<Status> {
    let bank = super::open_read(path)?;
    let mut out = super::stdout();
    for index in bank.due_for_consolidation(tree)? {
        let row = bank.row(index).with_context(|| format!("node {index}"))?;
        let due = DueOut {
            id: index,
            tree: bank.tree_name(row.tree),
            success_hits: row.success_hits,
            chain: bank.chain(index).with_context(|| format!("node {index}"))?,
        };
        write_json_line(&mut out, &due)?;
    }
    out.flush().context("cannot write to stdout")?;
    Ok(Status::Ok)
}

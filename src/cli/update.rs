//! Single-node writes: `hit` and `consolidate`.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use super::{NodeArg, Status, input, with_writer, write_json_line};

#[derive(Serialize)]
struct HitOut {
    id: u32,
    success_hits: u32,
    due: bool,
}

#[derive(Serialize)]
struct ConsolidateOut {
    source: u32,
    new_root: u32,
}

fn print(value: &impl Serialize, status: Status) -> anyhow::Result<Status> {
    let mut out = super::stdout();
    write_json_line(&mut out, value)?;
    out.flush().context("cannot write to stdout")?;
    Ok(status)
}

pub fn hit(path: &Path, id: &NodeArg) -> anyhow::Result<Status> {
    let (ack, status) = with_writer(path, None, |bank| {
        let index = super::resolve(bank, id, path)?;
        bank.success_hit(index)
            .with_context(|| format!("cannot record a success hit on node {index}"))
    })?;
    print(
        &HitOut {
            id: ack.id,
            success_hits: ack.success_hits,
            due: ack.due,
        },
        status,
    )
}

pub fn consolidate(path: &Path, id: &NodeArg, payload_json: &str) -> anyhow::Result<Status> {
    // The payload is checked before the bank is opened: a typo in it
    // should not cost a checkpoint.
    let value: serde_json::Value =
        serde_json::from_str(payload_json).map_err(|e| anyhow::anyhow!("--payload is not valid JSON: {e}"))?;
    let fields = input::string_map(&value, "--payload").map_err(anyhow::Error::msg)?;
    let (ack, status) = with_writer(path, None, |bank| {
        let index = super::resolve(bank, id, path)?;
        bank.consolidate(index, fields)
            .with_context(|| format!("cannot consolidate node {index}"))
    })?;
    print(
        &ConsolidateOut {
            source: ack.source,
            new_root: ack.new_root,
        },
        status,
    )
}

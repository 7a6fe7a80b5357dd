//! Single-node writes: `hit` and `consolidate`.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use deltamem::api::{self, ConsolidateReply, Fields, HitReply};
use serde::Serialize;

use super::{NodeArg, Status, with_writer, write_json_line};

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
    print(&HitReply::from(ack), status)
}

pub fn consolidate(path: &Path, id: &NodeArg, payload_json: &str) -> anyhow::Result<Status> {
    // The payload is checked before the bank is opened: a typo in it
    // should not cost a checkpoint.
    let fields = api::parse_object::<Fields>(payload_json)
        .map_err(|e| anyhow::anyhow!("--payload: {e}"))?
        .0;
    let (ack, status) = with_writer(path, None, |bank| {
        let index = super::resolve(bank, id, path)?;
        bank.consolidate(index, fields)
            .with_context(|| format!("cannot consolidate node {index}"))
    })?;
    print(&ConsolidateReply::from(ack), status)
}

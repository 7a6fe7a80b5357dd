//! Single-node writes: `hit` and `consolidate`.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use deltamem::Bank;
use deltamem::api::{self, ConsolidateReply, Fields, HitReply};
use serde::Serialize;

use super::{NodeArg, Status, write_json_line};

/// Opens the writer, runs `change`, and closes the bank whatever
/// happened, so a refused change still releases the lock cleanly.
fn with_writer<T>(path: &Path, change: impl FnOnce(&mut Bank) -> anyhow::Result<T>) -> anyhow::Result<T> {
    let mut bank = super::open_write(path)?;
    let result = change(&mut bank);
    let closed = super::close(bank, path);
    let value = result?;
    closed?;
    Ok(value)
}

fn print(value: &impl Serialize) -> anyhow::Result<Status> {
    let mut out = super::stdout();
    write_json_line(&mut out, value)?;
    out.flush().context("cannot write to stdout")?;
    Ok(Status::Ok)
}

pub fn hit(path: &Path, id: &NodeArg) -> anyhow::Result<Status> {
    let ack = with_writer(path, |bank| {
        let index = super::resolve(bank, id, path)?;
        bank.success_hit(index)
            .with_context(|| format!("cannot record a success hit on node {index}"))
    })?;
    print(&HitReply::from(ack))
}

pub fn consolidate(path: &Path, id: &NodeArg, payload_json: &str) -> anyhow::Result<Status> {
    // The payload is checked before the bank is opened: a typo in it
    // should not cost a checkpoint.
    let fields = api::parse_object::<Fields>(payload_json)
        .map_err(|e| anyhow::anyhow!("--payload: {e}"))?
        .0;
    let ack = with_writer(path, |bank| {
        let index = super::resolve(bank, id, path)?;
        bank.consolidate(index, fields)
            .with_context(|| format!("cannot consolidate node {index}"))
    })?;
    print(&ConsolidateReply::from(ack))
}

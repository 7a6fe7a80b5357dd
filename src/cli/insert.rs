//! `deltamem insert`: one node per stdin line, one ack per stored node.
//!
//! An ack promises durability under the chosen sync policy, so acks wait
//! in a queue until the WAL has been fsynced past their record. stdin is
//! read on its own thread: while the producer is idle the loop still
//! wakes up to honour the batch policy's time bound.

use std::collections::VecDeque;
use std::io::Write;
use std::path::Path;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use anyhow::Context;
use deltamem::bank::InsertAck;
use deltamem::{Attach, Bank, Label, NewNode, Payload, SyncPolicy};
use serde::Serialize;
use serde_json::{Map, Value};

use super::input::{self, Event};
use super::{Status, is_input_error, write_json_line};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SyncArg {
    /// fsync before every ack.
    Always,
    /// fsync every 1000 records or 100 ms, acking each group after it.
    Batch,
    /// Ack at once; fsync only at close.
    None,
}

impl SyncArg {
    pub fn policy(self) -> SyncPolicy {
        match self {
            SyncArg::Always => SyncPolicy::Always,
            SyncArg::Batch => SyncPolicy::Batch {
                records: 1000,
                interval_ms: 100,
            },
            SyncArg::None => SyncPolicy::None,
        }
    }
}

#[derive(Serialize)]
pub struct MatchOut {
    id: u32,
    score: f32,
}

/// The acknowledgement line of a stored node (shared with `import`).
#[derive(Serialize)]
pub struct AckOut {
    id: u32,
    tree: String,
    #[serde(rename = "type")]
    node_type: &'static str,
    parent: Option<u32>,
    depth: u8,
    #[serde(rename = "match")]
    matched: Option<MatchOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    external_id: Option<String>,
}

/// Turns one input object into a node, or says what is wrong with it.
fn parse_node(obj: &Map<String, Value>) -> Result<NewNode, String> {
    let tree = input::string(obj, "tree")?.to_string();
    let attach = match input::required(obj, "attach")? {
        Value::String(s) if s == "auto" => Attach::Auto,
        Value::String(s) if s == "root" => Attach::Root,
        Value::Object(o) if o.len() == 1 && o.contains_key("parent") => {
            Attach::Parent(input::node_ref(&o["parent"], "parent")?)
        }
        _ => return Err(r#""attach" must be "auto", "root" or {"parent": ID}"#.into()),
    };
    let label_text = input::string(obj, "label")?;
    let label = Label::parse(label_text)
        .ok_or_else(|| format!("\"label\" must be \"SUCCESS\" or \"FAILURE\", not {label_text:?}"))?;
    let scenario = input::string(obj, "scenario")?.to_string();
    let fields = input::string_map(input::required(obj, "payload")?, "payload")?;
    let embedding = input::embedding(obj)?;
    let external_id = match obj.get("id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err("\"id\" (the external id) must be a string".into()),
    };
    Ok(NewNode {
        tree,
        attach,
        label,
        payload: Payload { scenario, fields },
        embedding,
        external_id,
    })
}

pub fn ack_json(ack: InsertAck, external_id: Option<String>) -> AckOut {
    AckOut {
        id: ack.id,
        tree: ack.tree,
        node_type: ack.node_type.as_str(),
        parent: ack.parent,
        depth: ack.depth,
        matched: ack.matched.map(|(id, score)| MatchOut { id, score }),
        external_id,
    }
}

/// The insert loop's state: acks waiting for durability, and counts.
struct Session<W: Write> {
    out: W,
    policy: SyncPolicy,
    pending: VecDeque<(u64, AckOut)>,
    stored: u64,
    rejected: u64,
}

impl<W: Write> Session<W> {
    /// Prints, in order, every queued ack whose record is durable.
    fn flush_ready(&mut self, durable_below_lsn: u64) -> anyhow::Result<()> {
        let mut wrote = false;
        while let Some((lsn, _)) = self.pending.front() {
            if self.policy != SyncPolicy::None && *lsn >= durable_below_lsn {
                break;
            }
            if let Some((_, ack)) = self.pending.pop_front() {
                write_json_line(&mut self.out, &ack)?;
                wrote = true;
            }
        }
        if wrote {
            self.out.flush().context("cannot write to stdout")?;
        }
        Ok(())
    }

    /// After a clean close everything is durable.
    fn flush_all(&mut self) -> anyhow::Result<()> {
        self.flush_ready(u64::MAX)
    }

    fn reject(&mut self, number: u64, problem: &str) {
        self.rejected += 1;
        eprintln!("deltamem: line {number}: {problem}");
    }

    /// Handles one line. Errors returned are fatal (the bank or the disk
    /// failed); problems with the line itself are reported and counted.
    fn handle(&mut self, bank: &mut Bank, number: u64, text: &str) -> anyhow::Result<()> {
        if text.trim().is_empty() {
            return Ok(());
        }
        let node = match input::parse_object(text).and_then(|obj| parse_node(&obj)) {
            Ok(node) => node,
            Err(problem) => {
                self.reject(number, &problem);
                return Ok(());
            }
        };
        let external_id = node.external_id.clone();
        match bank.insert(node) {
            Ok(ack) => {
                self.stored += 1;
                self.pending.push_back((ack.lsn, ack_json(ack, external_id)));
                Ok(())
            }
            Err(e) if is_input_error(&e) => {
                self.reject(number, &e.to_string());
                Ok(())
            }
            Err(e) => Err(anyhow::Error::from(e).context(format!("line {number}"))),
        }
    }

    /// Runs until end of input or a fatal error.
    fn run(&mut self, bank: &mut Bank, events: &Receiver<Event>) -> anyhow::Result<()> {
        // Wake-ups while acks wait: a quarter of the batch interval keeps
        // the extra ack latency small without spinning.
        let tick = match self.policy {
            SyncPolicy::Batch { interval_ms, .. } => Duration::from_millis((interval_ms / 4).max(1)),
            _ => Duration::from_millis(100),
        };
        loop {
            let event = if self.pending.is_empty() {
                events.recv().map_err(|_| RecvTimeoutError::Disconnected)
            } else {
                events.recv_timeout(tick)
            };
            match event {
                Ok(Event::Line(line)) => match line.text {
                    Ok(text) => self.handle(bank, line.number, &text)?,
                    Err(problem) => self.reject(line.number, &problem),
                },
                Ok(Event::ReadFailed(e)) => return Err(e).context("cannot read stdin"),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            }
            bank.sync_if_due().context("cannot sync the WAL")?;
            self.flush_ready(bank.durable_below_lsn())?;
        }
    }
}

pub fn run(path: &Path, sync: SyncArg, quiet: bool) -> anyhow::Result<Status> {
    let mut bank = super::open_write(path)?;
    let policy = sync.policy();
    bank.set_sync_policy(policy);
    let events = input::spawn_stdin_reader();
    let mut session = Session {
        out: super::stdout(),
        policy,
        pending: VecDeque::new(),
        stored: 0,
        rejected: 0,
    };
    let outcome = session.run(&mut bank, &events);
    // Close even after a fatal error: if the bank is still healthy this
    // checkpoints every stored line; if it is poisoned, close leaves the
    // disk alone and the acks still queued are never printed.
    let closed = super::close(bank, path);
    outcome?;
    closed?;
    session.flush_all()?;
    if !quiet {
        eprintln!("deltamem: {} stored, {} rejected", session.stored, session.rejected);
    }
    if session.rejected > 0 {
        return Ok(Status::Failed);
    }
    Ok(Status::Ok)
}

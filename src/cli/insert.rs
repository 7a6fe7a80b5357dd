//! `deltamem insert`: one node per stdin line; one output line per input
//! line, the node's ack or `{"line":N,"error":"..."}`.
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
use deltamem::api::{self, InsertReply, InsertRequest, LineError};
use deltamem::{Bank, NewNode, SyncPolicy};

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

/// One output line per input line: an ack or why the line stored nothing.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum OutLine {
    Ack(InsertReply),
    Error(LineError),
}

/// The insert loop's state: acks waiting for durability, and counts.
struct Session<W: Write> {
    out: W,
    policy: SyncPolicy,
    pending: VecDeque<(u64, OutLine)>,
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

    /// Reports a line that stored nothing: on stderr, and in its place
    /// among the acks (after the acks before it, which wait for the sync).
    fn reject(&mut self, number: u64, problem: &str) {
        self.rejected += 1;
        eprintln!("deltamem: line {number}: {problem}");
        let error = LineError {
            line: number,
            error: problem.to_string(),
        };
        self.pending.push_back((0, OutLine::Error(error)));
    }

    /// Handles one line. Errors returned are fatal (the bank or the disk
    /// failed); problems with the line itself are reported and counted.
    fn handle(&mut self, bank: &mut Bank, number: u64, text: &str) -> anyhow::Result<()> {
        let node: NewNode = match api::parse_object::<InsertRequest>(text) {
            Ok(request) => request.into(),
            Err(problem) => {
                self.reject(number, &problem.to_string());
                return Ok(());
            }
        };
        let external_id = node.external_id.clone();
        match bank.insert(node) {
            Ok(ack) => {
                self.stored += 1;
                self.pending
                    .push_back((ack.lsn, OutLine::Ack(InsertReply::new(ack, external_id))));
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
    let policy = sync.policy();
    let mut session = Session {
        out: super::stdout(),
        policy,
        pending: VecDeque::new(),
        stored: 0,
        rejected: 0,
    };
    // After a fatal error the bank is closed (if it is poisoned, close
    // leaves the disk alone and the acks still queued are never printed).
    // Once every stored line was committed, a checkpoint that fails after
    // they are durable does not unsay them: exit 3, "saved, do not
    // repeat", or a caller that retries on failure would store every line
    // twice.
    let ran = super::with_writer(path, Some(policy), |bank| {
        let events = input::spawn_stdin_reader();
        session.run(bank, &events)
    })
    .and_then(|((), closed)| session.flush_all().map(|()| closed));
    let closed = ran.inspect_err(|_| super::report_stored_before_error(session.stored, "nodes"))?;
    if !quiet {
        eprintln!("deltamem: {} stored, {} rejected", session.stored, session.rejected);
    }
    if closed != Status::Ok {
        return Ok(closed);
    }
    if session.rejected > 0 {
        return Ok(Status::Failed);
    }
    Ok(Status::Ok)
}

//! `deltamem query`: one output line per stdin line: the answer, or
//! `{"line":N,"error":"..."}` for a line that cannot be answered.
//!
//! The lines already waiting when one is read (up to a pass's worth,
//! `Bank::pass_queries`) are answered together: queries of one tree with
//! equal options are scored in one pass over the column
//! (`Bank::query_batch`), as `query --npy` scores its rows. Answered one
//! scan each, 100 piped queries on a 1M-node bank took 8x as long as the
//! same queries from a `.npy`. A co-process that sends one query and waits
//! for its answer is answered at once: nothing waits for more lines.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::mpsc::Receiver;

use anyhow::Context;
use deltamem::api::{self, ApiError, LineError, QueryDefaults, QueryReply, QueryRequest, TreeQuery};
use deltamem::{Bank, OptionsKey, QueryOptions};

use super::input::{self, Event, Line};
use super::{Status, write_json_line};

/// One line read: its number and the query on it, or why it has none.
struct Asked {
    number: u64,
    query: Result<(String, TreeQuery), String>,
}

pub fn run(path: &Path, k: usize, include_consolidated: bool) -> anyhow::Result<Status> {
    let bank = super::open_read(path)?;
    let defaults = QueryDefaults {
        k,
        include_consolidated,
    };
    let mut out = super::stdout();
    let events = input::spawn_stdin_reader();
    let mut rejected = 0u64;
    let mut read_failed = None;
    while read_failed.is_none() {
        let (lines, failed) = waiting_lines(&events, bank.pass_queries().max(1));
        read_failed = failed;
        if lines.is_empty() {
            break;
        }
        let asked: Vec<Asked> = lines.into_iter().map(read_query).collect();
        // One output line per input line, in input order, an answer or a
        // `LineError`, so answers line up with their queries.
        for (number, result) in asked.iter().map(|a| a.number).zip(answer_all(&bank, &asked, defaults)) {
            match result {
                Ok(answer) => write_json_line(&mut out, &answer)?,
                Err(error) => {
                    rejected += 1;
                    eprintln!("deltamem: line {number}: {error}");
                    write_json_line(&mut out, &LineError { line: number, error })?;
                }
            }
        }
        // A caller may be waiting for these answers before it sends the
        // next query (a co-process), so do not sit on them.
        std::io::Write::flush(&mut out).context("cannot write to stdout")?;
    }
    // The lines before a failed read are answered first.
    if let Some(e) = read_failed {
        return Err(e).context("cannot read stdin");
    }
    Ok(if rejected > 0 { Status::Failed } else { Status::Ok })
}

/// The next line (waiting for it), and up to `most - 1` more that have
/// already arrived (none at the end of the input), and the read error
/// that came after them, if one did.
fn waiting_lines(events: &Receiver<Event>, most: usize) -> (Vec<Line>, Option<std::io::Error>) {
    let mut lines = Vec::new();
    let mut next = events.recv().ok();
    while let Some(event) = next {
        match event {
            Event::Line(line) => lines.push(line),
            Event::ReadFailed(e) => return (lines, Some(e)),
        }
        next = match lines.len() < most {
            true => events.try_recv().ok(),
            false => None,
        };
    }
    (lines, None)
}

fn read_query(line: Line) -> Asked {
    let query = line.text.and_then(|text| {
        api::parse_object::<QueryRequest>(&text)
            .map(QueryRequest::into_parts)
            .map_err(|e| e.to_string())
    });
    Asked {
        number: line.number,
        query,
    }
}

/// Queries of one tree with equal options, answered in one pass: their
/// lines' positions, and the queries.
struct Group<'a> {
    options: QueryOptions,
    members: Vec<(usize, &'a TreeQuery)>,
}

/// Answers every query of `asked`, in order: those of one tree with equal
/// options in one pass. A pass that fails (one query's embedding is bad)
/// is answered a query at a time, so that the error is that query's own.
/// Every failure concerns its query only (even a corrupt node: other
/// queries may not touch it).
fn answer_all(bank: &Bank, asked: &[Asked], defaults: QueryDefaults) -> Vec<Result<QueryReply, String>> {
    let mut answers: Vec<Option<Result<QueryReply, String>>> = (0..asked.len()).map(|_| None).collect();
    let mut groups: BTreeMap<(&str, OptionsKey), Group> = BTreeMap::new();
    for (i, a) in asked.iter().enumerate() {
        let grouped = a.query.as_ref().map_err(Clone::clone).and_then(|(tree, query)| {
            let options = query.options(defaults).map_err(|e| ApiError::from(e).to_string())?;
            Ok((tree.as_str(), options, query))
        });
        match grouped {
            Ok((tree, options, query)) => {
                let group = groups.entry((tree, options.batch_key())).or_insert_with(|| Group {
                    options,
                    members: Vec::new(),
                });
                group.members.push((i, query));
            }
            Err(e) => answers[i] = Some(Err(e)),
        }
    }
    for ((tree, _), Group { options, members }) in groups {
        let embeddings: Vec<&[f32]> = members.iter().map(|(_, q)| &q.embedding[..]).collect();
        let batched = bank.query_batch(tree, &embeddings, &options).ok();
        match batched {
            Some(found) => members.iter().zip(found).for_each(|(&(i, _), matches)| {
                answers[i] = Some(QueryReply::new(bank, matches).map_err(|e| ApiError::from(e).to_string()));
            }),
            None => members.iter().for_each(|&(i, q)| {
                answers[i] = Some(q.answer(bank, tree, defaults).map_err(|e| e.to_string()));
            }),
        }
    }
    answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Err("not answered".to_string())))
        .collect()
}

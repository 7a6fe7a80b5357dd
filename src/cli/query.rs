//! `deltamem query`: one result line per stdin query line.

use std::io::{self, Write};
use std::path::Path;

use anyhow::Context;
use deltamem::{Bank, Match, QueryOptions};
use serde::Serialize;
use serde_json::{Map, Value};

use super::input::{self, LineReader};
use super::{Status, write_json_line};

#[derive(Serialize)]
pub struct MatchOut {
    pub id: u32,
    pub score: f32,
    pub depth: u8,
    #[serde(rename = "type")]
    pub node_type: &'static str,
    pub label: &'static str,
    pub chain: Vec<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_id: Option<String>,
}

#[derive(Serialize)]
pub struct QueryOut {
    pub matches: Vec<MatchOut>,
}

struct Defaults {
    k: usize,
    include_consolidated: bool,
}

fn parse_query(obj: &Map<String, Value>, defaults: &Defaults) -> Result<(String, Vec<f32>, QueryOptions), String> {
    let tree = input::string(obj, "tree")?.to_string();
    let embedding = input::embedding(obj)?;
    let options = QueryOptions {
        k: input::optional_count(obj, "k")?.unwrap_or(defaults.k),
        tau: input::optional_number(obj, "tau")?,
        eps: input::optional_number(obj, "eps")?,
        include_consolidated: defaults.include_consolidated,
    };
    Ok((tree, embedding, options))
}

/// A match as printed, with the external id when the node has one.
pub fn match_out(bank: &Bank, m: Match) -> Result<MatchOut, deltamem::BankError> {
    let external_id = bank.row(m.id)?.external_id_text();
    Ok(MatchOut {
        id: m.id,
        score: m.score,
        depth: m.depth,
        node_type: m.node_type.as_str(),
        label: m.label.as_str(),
        chain: m.chain,
        external_id,
    })
}

/// Answers one line, or says why it cannot. Every failure here concerns
/// this query only (even a corrupt node: other queries may not touch it).
fn answer(bank: &Bank, text: &str, defaults: &Defaults) -> Result<QueryOut, String> {
    let obj = input::parse_object(text)?;
    let (tree, embedding, options) = parse_query(&obj, defaults)?;
    let found = bank.query(&tree, &embedding, &options).map_err(|e| e.to_string())?;
    let matches = found
        .into_iter()
        .map(|m| match_out(bank, m))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    Ok(QueryOut { matches })
}

pub fn run(path: &Path, k: usize, include_consolidated: bool) -> anyhow::Result<Status> {
    let bank = super::open_read(path)?;
    let defaults = Defaults {
        k,
        include_consolidated,
    };
    let mut out = super::stdout();
    let mut lines = LineReader::new(io::stdin().lock());
    let mut rejected = 0u64;
    while let Some(line) = lines.next_line().context("cannot read stdin")? {
        let result = line.text.and_then(|text| match text.trim().is_empty() {
            true => Ok(None),
            false => answer(&bank, &text, &defaults).map(Some),
        });
        match result {
            Ok(None) => {}
            Ok(Some(answer)) => {
                write_json_line(&mut out, &answer)?;
                // A caller may be waiting for this answer before it sends
                // the next query (a co-process), so do not sit on it.
                out.flush().context("cannot write to stdout")?;
            }
            Err(problem) => {
                rejected += 1;
                eprintln!("deltamem: line {}: {problem}", line.number);
            }
        }
    }
    out.flush().context("cannot write to stdout")?;
    Ok(if rejected > 0 { Status::Failed } else { Status::Ok })
}

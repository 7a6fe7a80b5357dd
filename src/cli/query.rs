//! `deltamem query`: one result line per stdin query line.

use std::io::{self, Write};
use std::path::Path;

use anyhow::Context;
use deltamem::Bank;
use deltamem::api::{self, ApiError, QueryDefaults, QueryReply, QueryRequest};

use super::input::LineReader;
use super::{Status, write_json_line};

/// Answers one line, or says why it cannot. Every failure here concerns
/// this query only (even a corrupt node: other queries may not touch it).
fn answer(bank: &Bank, text: &str, defaults: QueryDefaults) -> Result<QueryReply, ApiError> {
    let (tree, query) = api::parse_object::<QueryRequest>(text)?.into_parts();
    query.answer(bank, &tree, defaults)
}

pub fn run(path: &Path, k: usize, include_consolidated: bool) -> anyhow::Result<Status> {
    let bank = super::open_read(path)?;
    let defaults = QueryDefaults {
        k,
        include_consolidated,
    };
    let mut out = super::stdout();
    let mut lines = LineReader::new(io::stdin().lock());
    let mut rejected = 0u64;
    while let Some(line) = lines.next_line().context("cannot read stdin")? {
        let result = line.text.and_then(|text| match text.trim().is_empty() {
            true => Ok(None),
            false => answer(&bank, &text, defaults).map(Some).map_err(|e| e.to_string()),
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

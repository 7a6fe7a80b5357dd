//! `deltamem query`: one output line per stdin line: the answer, or
//! `{"line":N,"error":"..."}` for a line that cannot be answered.

use std::io::{self, Write};
use std::path::Path;

use anyhow::Context;
use deltamem::Bank;
use deltamem::api::{self, ApiError, LineError, QueryDefaults, QueryReply, QueryRequest};

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
    // One output line per input line, an answer or a `LineError`, so
    // answers line up with their queries.
    while let Some(line) = lines.next_line().context("cannot read stdin")? {
        let result = line
            .text
            .and_then(|text| answer(&bank, &text, defaults).map_err(|e| e.to_string()));
        match result {
            Ok(answer) => write_json_line(&mut out, &answer)?,
            Err(error) => {
                rejected += 1;
                eprintln!("deltamem: line {}: {error}", line.number);
                write_json_line(
                    &mut out,
                    &LineError {
                        line: line.number,
                        error,
                    },
                )?;
            }
        }
        // A caller may be waiting for this answer before it sends the next
        // query (a co-process), so do not sit on it.
        out.flush().context("cannot write to stdout")?;
    }
    out.flush().context("cannot write to stdout")?;
    Ok(if rejected > 0 { Status::Failed } else { Status::Ok })
}

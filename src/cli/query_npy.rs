//! `deltamem query --npy`: every row of a matrix is a query; one answer
//! line per row, in row order, in the same format as stdin queries. Rows
//! are read in blocks; each block is split across `--threads` scoped
//! threads sharing the read-only bank, and printed in order once done.
//! Each thread scores its rows as many at a time as one `query_batch`
//! pass over the column takes (`Bank::pass_queries`: 64 in an f32 bank,
//! 8 in f16 and int8 banks; ~3x the rows per second of one pass per row
//! at 8, more at 64); a row the bank refuses gets an error line of its
//! own.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use deltamem::api::QueryReply;
use deltamem::interop::npy::{NpyRowReader, row_problem};
use deltamem::{Bank, BankError, Match, QueryOptions};
use serde::Serialize;

use super::progress::Progress;
use super::{Status, write_json_line};

/// Rows per thread per block: enough to amortise the thread start-up,
/// small enough that answers stream out steadily.
const ROWS_PER_THREAD: usize = 512;

/// The `query` options for matrix queries.
#[derive(Debug, clap::Args)]
pub struct NpyArgs {
    /// Queries from a float32/float16 (rows, dim) matrix instead of
    /// stdin: one answer line per row, in row order.
    #[arg(long, value_name = "QUERIES.npy", requires = "tree")]
    pub npy: Option<PathBuf>,
    /// The tree the --npy queries search.
    #[arg(long, requires = "npy")]
    pub tree: Option<String>,
    /// Threshold for --npy queries (default: the tree's tau).
    #[arg(long, requires = "npy", allow_negative_numbers = true)]
    pub tau: Option<f32>,
    /// Failure penalty for --npy queries (default: the bank's eps).
    #[arg(long, requires = "npy", allow_negative_numbers = true)]
    pub eps: Option<f32>,
    /// Threads answering --npy queries (they share one read-only bank).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256), requires = "npy")]
    pub threads: u16,
}

/// `deltamem query`: from the matrix if one is given, else from stdin.
pub fn dispatch(
    bank: &Path,
    k: usize,
    include_consolidated: bool,
    args: &NpyArgs,
    quiet: bool,
) -> anyhow::Result<Status> {
    let (Some(npy), Some(tree)) = (&args.npy, &args.tree) else {
        return super::query::run(bank, k, include_consolidated);
    };
    let q = NpyQuery {
        bank,
        tree,
        npy,
        options: QueryOptions {
            k,
            tau: args.tau,
            eps: args.eps,
            include_consolidated,
        },
        threads: usize::from(args.threads),
    };
    run(&q, quiet)
}

pub struct NpyQuery<'a> {
    pub bank: &'a Path,
    pub tree: &'a str,
    pub npy: &'a PathBuf,
    pub options: QueryOptions,
    pub threads: usize,
}

#[derive(Serialize)]
struct RowError {
    row: u64,
    error: String,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Answer {
    Found(QueryReply),
    Failed(RowError),
}

fn answer(bank: &Bank, row: u64, found: Result<Vec<Match>, BankError>) -> Answer {
    let out = found.and_then(|matches| QueryReply::new(bank, matches));
    match out {
        Ok(out) => Answer::Found(out),
        Err(e) => Answer::Failed(RowError {
            row,
            error: e.to_string(),
        }),
    }
}

/// Answers consecutive rows from `first`: the good ones as many per pass
/// over the column as the bank scores together (`Bank::pass_queries`),
/// each refused one (or, if a pass fails, each row of it) by a query of
/// its own, whose error is then that row's.
fn answer_rows(bank: &Bank, q: &NpyQuery, first: u64, values: &[f32], dim: usize) -> Vec<Answer> {
    let rows: Vec<&[f32]> = values.chunks(dim.max(1)).collect();
    let mut answers = Vec::with_capacity(rows.len());
    let per_pass = bank.pass_queries();
    for (b, block) in rows.chunks(per_pass).enumerate() {
        let start = first + (b * per_pass) as u64;
        let batched = if block.iter().any(|r| row_problem(r).is_some()) {
            None
        } else {
            bank.query_batch(q.tree, block, &q.options).ok()
        };
        match batched {
            Some(all) => answers.extend(
                all.into_iter()
                    .enumerate()
                    .map(|(k, found)| answer(bank, start + k as u64, Ok(found))),
            ),
            None => answers.extend(
                block
                    .iter()
                    .enumerate()
                    .map(|(k, r)| answer(bank, start + k as u64, bank.query(q.tree, r, &q.options))),
            ),
        }
    }
    answers
}

/// Answers one block of rows (row `first` onwards) on `threads` threads.
fn answer_block(bank: &Bank, q: &NpyQuery, first: u64, values: &[f32], dim: usize) -> Vec<Answer> {
    let rows = values.len() / dim.max(1);
    let per_thread = rows.div_ceil(q.threads.max(1)).max(1);
    std::thread::scope(|scope| {
        let workers: Vec<_> = values
            .chunks(per_thread * dim)
            .enumerate()
            .map(|(t, chunk)| scope.spawn(move || answer_rows(bank, q, first + (t * per_thread) as u64, chunk, dim)))
            .collect();
        // A worker only panics on a bug; re-raise it rather than hide it.
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

pub fn run(q: &NpyQuery, quiet: bool) -> anyhow::Result<Status> {
    let bank = super::open_read(q.bank)?;
    bank.tree_index(q.tree)?;
    let mut reader = NpyRowReader::open(q.npy)?;
    let dim = reader.info().dim_count;
    if dim != bank.dim_count() as usize {
        anyhow::bail!(
            "{}: rows have {dim} dimensions, the bank {} stores {}",
            q.npy.display(),
            q.bank.display(),
            bank.dim_count()
        );
    }
    let progress = Progress::bar(reader.info().row_count, "queries", quiet);
    let mut out = super::stdout();
    let mut failed = 0u64;
    let mut values = Vec::new();
    loop {
        let first = reader.rows_read();
        values.clear();
        if reader.read_rows(ROWS_PER_THREAD * q.threads.max(1), &mut values)? == 0 {
            break;
        }
        for a in answer_block(&bank, q, first, &values, dim) {
            if let Answer::Failed(e) = &a {
                failed += 1;
                progress.note(&format!("deltamem: {}: row {}: {}", q.npy.display(), e.row, e.error));
            }
            write_json_line(&mut out, &a)?;
        }
        out.flush().context("cannot write to stdout")?;
        progress.set(reader.rows_read());
    }
    Ok(if failed > 0 { Status::Failed } else { Status::Ok })
}

//! `deltamem import --npy`: one node per matrix row, in batches stored by
//! `Bank::load_columns` (each batch atomic and durable when its lines go
//! out, the vectors written once, straight to their segments, not through
//! the WAL; a few batches share one checkpoint, `LOAD_GROUP_BYTES`; below
//! `LOAD_MIN_BATCH_ROWS` rows per batch, one WAL record each instead), one
//! line per row on stdout in row order.
//!
//! What happens to bad rows (NaN or infinite components, all-zero vectors,
//! bad META lines): by default every row is checked before anything is
//! written, and if any is bad the import stops having written nothing,
//! listing every bad row. A bulk load is usually re-run after fixing its
//! input; an all-or-nothing result means the re-run cannot duplicate rows.
//! With `--keep-going` the rows are not checked first: a batch holding a
//! bad row is rejected whole (one WAL record is all or nothing), its rows
//! get an error line instead of an ack, and the other batches are stored.
//! The check runs the bank's own rules on every row (`Bank::check_insert`:
//! vector norm, scenario, payload size, external ids, also against each
//! other); only where a row goes is left to the write (a parent id that
//! does not exist rejects its batch, the others stay). Rows are numbered from 0, as NumPy indexes them; META line N+1
//! describes row N.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;

use anyhow::Context;
use deltamem::api::{self, InsertReply, RowMeta};
use deltamem::interop::npy::{NpyRowReader, read_header, row_problem};
use deltamem::{Bank, BankError, Change, ChangeAck, NewNode, PendingIds, SyncPolicy};
use serde::Serialize;

use super::import::{ImportArgs, with_writer};
use super::input::{LineReader, MAX_LINE_BYTES};
use super::progress::Progress;
use super::{Status, is_input_error, write_json_line};

/// Bad rows listed before the import gives up (the count is always given).
const PROBLEMS_SHOWN: usize = 20;

/// The node of one row from its META line (blank: every default); its
/// embedding travels in the batch's column.
fn row_node(text: &str, tree: &str, row: u64) -> Result<NewNode, String> {
    let meta = match text.trim().is_empty() {
        true => RowMeta::default(),
        false => api::parse_object::<RowMeta>(text).map_err(|e| e.to_string())?,
    };
    meta.into_node(tree, row).map_err(|e| e.to_string())
}

/// The META file, line by line, in step with the rows.
struct MetaLines {
    lines: Option<LineReader<BufReader<File>>>,
}

impl MetaLines {
    fn open(path: Option<&Path>) -> anyhow::Result<MetaLines> {
        let lines = match path {
            None => None,
            Some(p) => {
                let file = File::open(p).with_context(|| format!("cannot open {}", p.display()))?;
                Some(LineReader::new(BufReader::new(file)))
            }
        };
        Ok(MetaLines { lines })
    }

    /// The next line's text, or why it is unusable; "" without META.
    fn next(&mut self, path: &Path) -> anyhow::Result<Result<String, String>> {
        let Some(lines) = self.lines.as_mut() else {
            return Ok(Ok(String::new()));
        };
        let line = lines
            .next_line()
            .with_context(|| format!("cannot read {}", path.display()))?;
        Ok(line.map_or_else(|| Err("META has no line for this row".to_string()), |l| l.text))
    }
}

/// Lines in the META file, so a count mismatch is found before writing.
fn count_lines(path: &Path) -> anyhow::Result<u64> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut lines = LineReader::new(BufReader::new(file));
    let mut count = 0;
    while lines
        .next_line()
        .with_context(|| format!("cannot read {}", path.display()))?
        .is_some()
    {
        count += 1;
    }
    Ok(count)
}

/// One row's problem, as reported.
fn row_message(npy: &Path, meta: Option<&Path>, row: u64, detail: &str) -> String {
    match meta {
        Some(m) => format!(
            "{}: row {row} ({} line {}): {detail}",
            npy.display(),
            m.display(),
            row + 1
        ),
        None => format!("{}: row {row}: {detail}", npy.display()),
    }
}

/// One batch of rows: each row's node (or problem) and the rows' values,
/// row-major (the column `Bank::load_column` takes).
struct Batch {
    nodes: Vec<(u64, Result<NewNode, String>)>,
    column: Vec<f32>,
}

/// Reads one batch into `column` (a recycled buffer: a fresh one costs
/// its page faults again). `check_rows` false skips the row checks (a
/// precheck already made them; the bank checks again anyway).
fn read_batch(
    args: &ImportArgs,
    npy: &Path,
    reader: &mut NpyRowReader,
    metas: &mut MetaLines,
    mut column: Vec<f32>,
    check_rows: bool,
) -> anyhow::Result<Batch> {
    let first = reader.rows_read();
    let count = reader.read_rows_into(args.batch as usize, &mut column)?;
    let dim = reader.info().dim_count;
    let mut nodes = Vec::with_capacity(count);
    for k in 0..count {
        let row = first + k as u64;
        let line = metas.next(args.meta.as_deref().unwrap_or(npy))?;
        let node = match check_rows
            .then(|| row_problem(&column[k * dim..(k + 1) * dim]))
            .flatten()
        {
            Some(problem) => Err(problem),
            None => line.and_then(|text| row_node(&text, &args.tree, row)),
        };
        nodes.push((row, node));
    }
    Ok(Batch { nodes, column })
}

/// Checks every row (and META line) without writing, by the bank's own
/// rules (`Bank::check_insert`, external ids against each other too);
/// returns the problems listed (the first `PROBLEMS_SHOWN`, in row order)
/// and their count.
fn precheck(args: &ImportArgs, npy: &Path, bank: &Bank, progress: &Progress) -> anyhow::Result<(Vec<String>, u64)> {
    match args.meta {
        None => precheck_halves(args, npy, bank, progress),
        Some(_) => precheck_in_order(args, npy, bank, progress),
    }
}

/// Rows a precheck worker reads at a time: 256 KiB of f32, so the rows
/// are still in the core's cache when they are checked.
const PRECHECK_CHUNK_BYTES: usize = 256 << 10;

/// `precheck` without META: each row's node is its defaults and no row
/// carries an external id, so rows can be checked in any order. Two
/// workers (this thread and one more) each read and check half of the
/// matrix. With one reader the precheck took a fifth of a 1M x 768
/// import, bound by copying the matrix out of the page cache.
fn precheck_halves(
    args: &ImportArgs,
    npy: &Path,
    bank: &Bank,
    progress: &Progress,
) -> anyhow::Result<(Vec<String>, u64)> {
    let total = NpyRowReader::open(npy)?.info().row_count;
    let middle = total / 2;
    let done = std::sync::atomic::AtomicU64::new(0);
    let check = |rows: std::ops::Range<u64>| precheck_rows(args, npy, bank, rows, &done, progress);
    let (first, second) = std::thread::scope(|scope| {
        let second = scope.spawn(|| check(middle..total));
        let first = check(0..middle);
        (first, second.join().expect("a precheck worker does not panic"))
    });
    let (mut shown, first_count) = first?;
    let (more, second_count) = second?;
    shown.extend(more);
    shown.truncate(PROBLEMS_SHOWN);
    Ok((shown, first_count + second_count))
}

/// Checks `rows` of the matrix (without META) as `precheck` does; the
/// first `PROBLEMS_SHOWN` problems among them and their count. `done`
/// counts the rows checked by every worker, for the progress bar.
fn precheck_rows(
    args: &ImportArgs,
    npy: &Path,
    bank: &Bank,
    rows: std::ops::Range<u64>,
    done: &std::sync::atomic::AtomicU64,
    progress: &Progress,
) -> anyhow::Result<(Vec<String>, u64)> {
    let mut reader = NpyRowReader::open(npy)?;
    reader.seek_to_row(rows.start)?;
    let dim = reader.info().dim_count;
    let chunk_rows = (PRECHECK_CHUNK_BYTES / (dim * size_of::<f32>()).max(1)).max(1);
    let (mut shown, mut count) = (Vec::new(), 0u64);
    let mut pending = PendingIds::default();
    let mut column = Vec::new();
    let mut row = rows.start;
    while row < rows.end {
        let want = (rows.end - row).min(chunk_rows as u64) as usize;
        let got = reader.read_rows_into(want, &mut column)?;
        anyhow::ensure!(
            got == want,
            "{}: rows end early at row {}",
            npy.display(),
            row + got as u64
        );
        for vector in column.chunks_exact(dim.max(1)) {
            let problem = match row_problem(vector) {
                Some(problem) => Some(problem),
                None => row_node("", &args.tree, row)
                    .and_then(|node| {
                        bank.check_insert(&node, Some(vector), &mut pending)
                            .map_err(|e| e.to_string())
                    })
                    .err(),
            };
            if let Some(problem) = problem {
                count += 1;
                if shown.len() < PROBLEMS_SHOWN {
                    shown.push(row_message(npy, None, row, &problem));
                }
            }
            row += 1;
        }
        let so_far = done.fetch_add(got as u64, std::sync::atomic::Ordering::Relaxed) + got as u64;
        progress.set(so_far);
    }
    Ok((shown, count))
}

/// `precheck` with META: one reader thread reads the rows and their META
/// lines in order while this one runs the bank's rules, external ids
/// against each other too.
fn precheck_in_order(
    args: &ImportArgs,
    npy: &Path,
    bank: &Bank,
    progress: &Progress,
) -> anyhow::Result<(Vec<String>, u64)> {
    let reader = NpyRowReader::open(npy)?;
    let metas = MetaLines::open(args.meta.as_deref())?;
    let (mut shown, mut total) = (Vec::new(), 0u64);
    let mut pending = PendingIds::default();
    let dim = reader.info().dim_count;
    // The reader thread reads rows and checks their values; this one
    // runs the bank's rules on them.
    for_each_batch(args, npy, reader, metas, true, 1, |batch, rows_read| {
        for (k, (row, node)) in batch.nodes.iter().enumerate() {
            let vector = &batch.column[k * dim..(k + 1) * dim];
            let problem = match node {
                Err(problem) => problem.clone(),
                Ok(node) => match bank.check_insert(node, Some(vector), &mut pending) {
                    Ok(()) => continue,
                    Err(e) => e.to_string(),
                },
            };
            total += 1;
            if shown.len() < PROBLEMS_SHOWN {
                shown.push(row_message(npy, args.meta.as_deref(), *row, &problem));
            }
        }
        progress.set(rows_read);
        Ok(vec![batch.column])
    })?;
    Ok((shown, total))
}

/// Runs `store` on every batch of the matrix in order, on this thread,
/// while a second thread reads and decodes the next batch (reading and
/// building nodes is a third of an import's work; two stages on two
/// cores). `store` gets the batch and the rows read so far, and returns
/// the columns it is done with, for reuse: a fresh one costs its page
/// faults again. Up to `queue` batches wait read (so the reader can read
/// a whole group while the last one is stored). `check_rows`: the reader
/// checks each row's values (`row_problem`).
fn for_each_batch(
    args: &ImportArgs,
    npy: &Path,
    mut reader: NpyRowReader,
    mut metas: MetaLines,
    check_rows: bool,
    queue: usize,
    mut store: impl FnMut(Batch, u64) -> anyhow::Result<Vec<Vec<f32>>>,
) -> anyhow::Result<()> {
    std::thread::scope(|scope| {
        let (full_tx, full_rx) = std::sync::mpsc::sync_channel(queue);
        let (empty_tx, empty_rx) = std::sync::mpsc::channel::<Vec<f32>>();
        scope.spawn(move || {
            loop {
                let column = empty_rx.try_recv().unwrap_or_default();
                let batch = read_batch(args, npy, &mut reader, &mut metas, column, check_rows);
                let last = !matches!(&batch, Ok(b) if !b.nodes.is_empty());
                // A closed channel means the consumer stopped on an error.
                if full_tx.send(batch.map(|b| (b, reader.rows_read()))).is_err() || last {
                    return;
                }
            }
        });
        for item in full_rx {
            let (batch, rows_read) = item?;
            if batch.nodes.is_empty() {
                break;
            }
            for column in store(batch, rows_read)? {
                // The reader may have finished: then the column is dropped.
                let _ = empty_tx.send(column);
            }
        }
        Ok(())
    })
}

#[derive(Serialize)]
struct RejectedOut {
    row: u64,
    error: String,
}

#[derive(Serialize)]
#[serde(untagged)]
enum LineOut {
    Ack(InsertReply),
    Rejected(RejectedOut),
}

/// Output lines wait here until the WAL is durable past their record.
struct Session<W: Write> {
    out: W,
    policy: SyncPolicy,
    pending: VecDeque<(u64, LineOut)>,
    stored: u64,
    rejected_rows: u64,
    rejected_batches: u64,
    /// Bulk-load batches waiting for the group's one checkpoint.
    group: Vec<Batch>,
    /// Vector bytes in `group`.
    group_bytes: usize,
}

impl<W: Write> Session<W> {
    fn flush_ready(&mut self, durable_below_lsn: u64) -> anyhow::Result<()> {
        while let Some((lsn, _)) = self.pending.front() {
            if self.policy != SyncPolicy::None && *lsn >= durable_below_lsn {
                break;
            }
            if let Some((_, line)) = self.pending.pop_front() {
                write_json_line(&mut self.out, &line)?;
            }
        }
        self.out.flush().context("cannot write to stdout")
    }

    /// Rejects a whole batch: one error line per row, one message.
    fn reject(&mut self, rows: &[u64], message: &str, progress: &Progress) {
        let (first, last) = (rows[0], rows[rows.len() - 1]);
        let summary = format!("batch of rows {first}..={last} rejected: {message}");
        progress.note(&format!("deltamem: {summary}"));
        self.rejected_rows += rows.len() as u64;
        self.rejected_batches += 1;
        for &row in rows {
            let line = RejectedOut {
                row,
                error: summary.clone(),
            };
            self.pending.push_back((0, LineOut::Rejected(line)));
        }
    }

    /// Takes one batch: stored at once through the WAL, or (a bulk load)
    /// kept until the group holds `LOAD_GROUP_BYTES` of vectors, then
    /// stored with the group. Returns the columns free for reuse. Errors
    /// returned are fatal.
    fn add(&mut self, bank: &mut Bank, batch: Batch, ctx: &Ctx) -> anyhow::Result<Vec<Vec<f32>>> {
        if !ctx.load {
            let (rows, planned) = plan(batch.nodes, ctx);
            let result = planned.map(|changes| {
                let result = store_batch(bank, &changes, &batch.column);
                (changes, result)
            });
            self.settle(rows, result, ctx)?;
            return Ok(vec![batch.column]);
        }
        self.group_bytes += std::mem::size_of_val(batch.column.as_slice());
        self.group.push(batch);
        match self.group_bytes >= LOAD_GROUP_BYTES {
            true => self.store_group(bank, ctx),
            false => Ok(Vec::new()),
        }
    }

    /// Stores the batches waiting in the group by one `Bank::load_columns`
    /// (one checkpoint); rejects those holding a bad row. Returns their
    /// columns.
    fn store_group(&mut self, bank: &mut Bank, ctx: &Ctx) -> anyhow::Result<Vec<Vec<f32>>> {
        let group = std::mem::take(&mut self.group);
        self.group_bytes = 0;
        let (Some(first), Some(last)) = (group.first(), group.last()) else {
            return Ok(Vec::new());
        };
        let span = format!(
            "rows {}..={}",
            first.nodes.first().map_or(0, |n| n.0),
            last.nodes.last().map_or(0, |n| n.0)
        );
        let mut columns = Vec::with_capacity(group.len());
        let mut planned = Vec::with_capacity(group.len());
        for batch in group {
            planned.push(plan(batch.nodes, ctx));
            columns.push(batch.column);
        }
        let loads: Vec<(&[Change], &[f32])> = planned
            .iter()
            .zip(&columns)
            .filter_map(|((_, p), column)| Some((p.as_deref().ok()?, column.as_slice())))
            .collect();
        let mut results = bank
            .load_columns(&loads)
            .map_err(|e| anyhow::Error::from(e).context(span))?
            .into_iter();
        // Every stored batch gets its lines even if one failed fatally:
        // they are durable, and a re-run must not store them twice.
        let mut fatal = None;
        for (rows, planned) in planned {
            let outcome = planned.map(|changes| {
                let result = results.next().expect("one result per batch loaded");
                (changes, result)
            });
            if let Err(e) = self.settle(rows, outcome, ctx) {
                fatal.get_or_insert(e);
            }
        }
        match fatal {
            Some(e) => {
                self.flush_ready(bank.durable_below_lsn())?;
                Err(e)
            }
            None => Ok(columns),
        }
    }

    /// Queues one batch's lines: its acks, or an error line per row when
    /// it was rejected (a bad row, or one the bank refused).
    fn settle(&mut self, rows: Vec<u64>, outcome: Planned, ctx: &Ctx) -> anyhow::Result<()> {
        let (changes, result) = match outcome {
            Ok(stored) => stored,
            Err(message) => {
                self.reject(&rows, &message, ctx.progress);
                return Ok(());
            }
        };
        match result {
            Ok(acks) => {
                for (ack, change) in acks.into_iter().zip(changes) {
                    let (ChangeAck::Inserted(ack), Change::Insert(node)) = (ack, change) else {
                        unreachable!("a load of inserts acks inserts")
                    };
                    self.stored += 1;
                    self.pending
                        .push_back((ack.lsn, LineOut::Ack(InsertReply::new(ack, node.external_id))));
                }
                Ok(())
            }
            Err(BankError::BatchItem { position, error }) if is_input_error(&error) => {
                let message = row_message(ctx.npy, ctx.meta, rows[position], &error.to_string());
                self.reject(&rows, &message, ctx.progress);
                Ok(())
            }
            Err(e) => Err(anyhow::Error::from(e).context(format!("rows {}..={}", rows[0], rows[rows.len() - 1]))),
        }
    }
}

/// A batch's rows, and its changes or, if a row is bad, the message that
/// rejects it.
fn plan(nodes: Vec<(u64, Result<NewNode, String>)>, ctx: &Ctx) -> (Vec<u64>, Result<Vec<Change>, String>) {
    let rows: Vec<u64> = nodes.iter().map(|(r, _)| *r).collect();
    if let Some((row, Err(problem))) = nodes.iter().find(|(_, n)| n.is_err()) {
        return (rows, Err(row_message(ctx.npy, ctx.meta, *row, problem)));
    }
    let changes = nodes
        .into_iter()
        .filter_map(|(_, n)| n.ok().map(Change::Insert))
        .collect();
    (rows, Ok(changes))
}

/// A batch after its store: its changes and the bank's answer, or the
/// message that rejected it unstored.
type Planned = Result<(Vec<Change>, Result<Vec<ChangeAck>, BankError>), String>;

struct Ctx<'a> {
    npy: &'a Path,
    meta: Option<&'a Path>,
    progress: &'a Progress,
    /// Batches go in as bulk loads (else as WAL records).
    load: bool,
}

/// Below this `--batch`, batches go through the WAL: a load costs a whole
/// checkpoint (about five fsyncs) per batch, more than it saves on a few
/// rows.
const LOAD_MIN_BATCH_ROWS: u32 = 256;

/// Bulk-load batches are stored in groups of at least this many vector
/// bytes (6 batches of 4,096 x 768 f32), one checkpoint per group: a
/// checkpoint's fixed cost (about five fsyncs and a manifest) was a third
/// of an import's time at one per batch, and still a quarter at 32 MiB
/// once the vectors were written beside the staging (1M x 768: 3.35-4.88
/// s at 32 MiB, 2.96-3.31 s at 64). Each batch stays atomic, and its
/// lines still go out only once it is durable. The group's columns and
/// half a group read ahead are most of an import's heap (184 MB at 1M x
/// 768).
const LOAD_GROUP_BYTES: usize = 64 << 20;

/// One batch as a WAL transaction of its nodes with their embeddings
/// attached.
fn store_batch(bank: &mut Bank, changes: &[Change], column: &[f32]) -> Result<Vec<ChangeAck>, BankError> {
    let dim = bank.dim_count() as usize;
    let whole: Vec<Change> = changes
        .iter()
        .zip(column.chunks(dim.max(1)))
        .map(|(c, v)| match c {
            Change::Insert(node) => Change::Insert(NewNode {
                embedding: v.to_vec(),
                ..node.clone()
            }),
            other => other.clone(),
        })
        .collect();
    bank.transact(&whole, None)
}

/// Checks the matrix and META against each other and the bank.
fn check_shapes(args: &ImportArgs, npy: &Path, bank: &Bank) -> anyhow::Result<NpyRowReader> {
    let reader = NpyRowReader::open(npy)?;
    let info = reader.info().clone();
    bank.tree_index(&args.tree)?;
    if info.dim_count != bank.dim_count() as usize {
        anyhow::bail!(
            "{}: rows have {} dimensions, the bank {} stores {}",
            npy.display(),
            info.dim_count,
            args.bank.display(),
            bank.dim_count()
        );
    }
    if let Some(meta) = &args.meta {
        let lines = count_lines(meta)?;
        if lines != info.row_count {
            anyhow::bail!(
                "{} has {lines} lines but {} has {} rows: one META line per row is needed",
                meta.display(),
                npy.display(),
                info.row_count
            );
        }
    }
    Ok(reader)
}

type Stdout = std::io::BufWriter<std::io::StdoutLock<'static>>;

/// Imports the rows; on an error, `stored_before_error` is how many were
/// stored before it.
fn import_rows(
    args: &ImportArgs,
    npy: &Path,
    quiet: bool,
    bank: &mut Bank,
    stored_before_error: &mut u64,
) -> anyhow::Result<Session<Stdout>> {
    let reader = check_shapes(args, npy, bank)?;
    let total = reader.info().row_count;
    let mut session = Session {
        out: super::stdout(),
        policy: bank.sync_policy().unwrap_or(SyncPolicy::None),
        pending: VecDeque::new(),
        stored: 0,
        rejected_rows: 0,
        rejected_batches: 0,
        group: Vec::new(),
        group_bytes: 0,
    };
    if !args.keep_going {
        let progress = Progress::bar(total, "rows checked", quiet);
        let (shown, count) = precheck(args, npy, bank, &progress)?;
        drop(progress);
        if count > 0 {
            for line in &shown {
                eprintln!("deltamem: {line}");
            }
            anyhow::bail!(
                "{count} bad row(s) in {}{}; nothing was imported (--keep-going stores the batches without bad rows)",
                npy.display(),
                if count as usize > shown.len() {
                    format!(", the first {} listed", shown.len())
                } else {
                    String::new()
                }
            );
        }
    }
    let progress = Progress::bar(total, "rows", quiet);
    let metas = MetaLines::open(args.meta.as_deref())?;
    let ctx = Ctx {
        npy,
        meta: args.meta.as_deref(),
        progress: &progress,
        load: args.batch >= LOAD_MIN_BATCH_ROWS,
    };
    let batch_bytes = args.batch as usize * reader.info().dim_count * size_of::<f32>();
    // A whole group read ahead, so the next load can start as soon as
    // the last one's checkpoint is done. With half a group each load
    // waited for the reader to read the other half: at 1M x 768 (strace)
    // a load's first write came ~60 ms after the previous checkpoint, in
    // a ~126 ms cycle; now ~20 ms, in ~95. The other half costs
    // LOAD_GROUP_BYTES / 2 more heap (peak 179 -> 219 MB).
    let queue = match ctx.load {
        true => LOAD_GROUP_BYTES.div_ceil(batch_bytes.max(1)),
        false => 1,
    };
    // The precheck checked every row's values already.
    let imported = for_each_batch(args, npy, reader, metas, args.keep_going, queue, |batch, rows_read| {
        let free = session.add(bank, batch, &ctx)?;
        session.flush_ready(bank.durable_below_lsn())?;
        progress.set(rows_read);
        Ok(free)
    })
    .and_then(|()| session.store_group(bank, &ctx))
    .and_then(|_| session.flush_ready(bank.durable_below_lsn()));
    *stored_before_error = session.stored;
    imported.map(|()| session)
}

/// What a streamed input is, for its copy.
#[derive(Clone, Copy)]
enum Stream {
    /// A `.npy` matrix.
    Npy,
    /// META lines for a matrix of `row_count` rows.
    Meta { row_count: u64 },
}

/// A copy of `path` in a temporary file if it is not a regular file (a
/// pipe, `/dev/stdin`, a process substitution), so that it can be read
/// twice; None for a regular file, which is read where it is. The import
/// reads its inputs twice (the check before anything is written, then the
/// rows) and counts the META lines first. The copy is removed when the
/// import ends, by a signal too (`scratch`).
///
/// A stream is checked as it is copied, so that an endless one (a copy of
/// `/dev/zero` would fill the disk) is refused after a bounded read: of a
/// `.npy` stream, its header before anything is copied and then only the
/// data its shape declares; of META, at most one line per row, each within
/// `MAX_LINE_BYTES`. A stream that goes on past that is refused, as a
/// file with bytes past its data is, without being read to its end.
fn rereadable(path: &Path, stream: Stream) -> anyhow::Result<Option<tempfile::TempPath>> {
    let meta = std::fs::metadata(path).with_context(|| format!("cannot open {}", path.display()))?;
    if meta.is_file() {
        return Ok(None);
    }
    let mut input = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    // Messages name the copy: its name says what it is a copy of.
    let name = path.file_name().map_or("input".into(), |n| n.to_string_lossy());
    let mut copy = tempfile::Builder::new()
        .prefix(&format!("deltamem-copy-of-{name}-"))
        .tempfile()
        .context("cannot create a temporary file")?;
    crate::cli::scratch::remove_on_signal(copy.path())?;
    match stream {
        Stream::Npy => copy_npy(path, &mut input, &mut copy)?,
        Stream::Meta { row_count } => copy_meta(path, input, &mut copy, row_count)?,
    }
    Ok(Some(copy.into_temp_path()))
}

/// Copies a `.npy` stream: its header, then the data its shape declares.
fn copy_npy(path: &Path, input: &mut File, copy: &mut impl Write) -> anyhow::Result<()> {
    let read_error = || format!("cannot read {}", path.display());
    let header = read_header(path, input)?;
    copy.write_all(&header.prefix)
        .context("cannot write a temporary file")?;
    let copied_bytes = std::io::copy(&mut input.take(header.data_bytes), copy).with_context(read_error)?;
    // A short stream is left for the reader, which names it truncated.
    let mut one = [0u8; 1];
    if copied_bytes == header.data_bytes && input.read(&mut one).with_context(read_error)? != 0 {
        let info = &header.info;
        anyhow::bail!(
            "{}: invalid: the stream goes on past the {} bytes of data that shape ({}, {}) of {} declares",
            path.display(),
            header.data_bytes,
            info.row_count,
            info.dim_count,
            info.descr
        );
    }
    Ok(())
}

/// Copies META lines from a stream: at most `row_count` lines (a last one
/// may lack its newline), each at most `MAX_LINE_BYTES`.
fn copy_meta(path: &Path, input: File, copy: &mut impl Write, row_count: u64) -> anyhow::Result<()> {
    let mut input = BufReader::with_capacity(1 << 16, input);
    let (mut lines_ended, mut line_bytes) = (0u64, 0usize);
    loop {
        let chunk = input
            .fill_buf()
            .with_context(|| format!("cannot read {}", path.display()))?;
        if chunk.is_empty() {
            return Ok(());
        }
        if lines_ended == row_count {
            anyhow::bail!(
                "{}: invalid: META goes on past the {row_count} lines the matrix's rows need",
                path.display()
            );
        }
        let (take, ended) = match chunk.iter().position(|&b| b == b'\n') {
            Some(at) => (at + 1, true),
            None => (chunk.len(), false),
        };
        line_bytes += take;
        if line_bytes > MAX_LINE_BYTES + 1 {
            anyhow::bail!(
                "{}: invalid: line {} is longer than {MAX_LINE_BYTES} bytes",
                path.display(),
                lines_ended + 1
            );
        }
        copy.write_all(&chunk[..take])
            .context("cannot write a temporary file")?;
        input.consume(take);
        if ended {
            lines_ended += 1;
            line_bytes = 0;
        }
    }
}

pub fn run(args: &ImportArgs, npy: &Path, quiet: bool) -> anyhow::Result<Status> {
    let npy_copy = rereadable(npy, Stream::Npy)?;
    let read_from = npy_copy.as_deref().unwrap_or(npy);
    let meta_copy = match args.meta.as_deref() {
        Some(meta) => {
            let row_count = NpyRowReader::open(read_from)?.info().row_count;
            rereadable(meta, Stream::Meta { row_count })?
        }
        None => None,
    };
    let local;
    let args = match &meta_copy {
        Some(copy) => {
            local = ImportArgs {
                meta: Some(copy.to_path_buf()),
                ..args.clone()
            };
            &local
        }
        None => args,
    };
    let mut stored_before_error = 0;
    let (mut session, status) = with_writer(&args.bank, args.sync, |bank| {
        import_rows(args, read_from, quiet, bank, &mut stored_before_error)
    })
    .inspect_err(|_| super::report_stored_before_error(stored_before_error, "rows"))?;
    // Closed cleanly: everything is checkpointed, every line may go out.
    session
        .flush_ready(u64::MAX)
        .inspect_err(|_| super::report_stored_before_error(session.stored, "rows"))?;
    if !quiet {
        let batches = match session.rejected_batches {
            0 => String::new(),
            1 => " (in 1 batch)".to_string(),
            n => format!(" (in {n} batches)"),
        };
        eprintln!(
            "deltamem: {} rows stored, {} rejected{batches} from {}",
            session.stored,
            session.rejected_rows,
            npy.display()
        );
    }
    Ok(if session.rejected_rows > 0 {
        Status::Failed
    } else {
        status
    })
}

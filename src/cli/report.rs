//! `deltamem stats` and `deltamem verify`.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use deltamem::Bank;
use deltamem::bank::kernels::Level;
use deltamem::bank::{Stats, TreeStats};
use serde::Serialize;

use deltamem::interop::write_atomically;

use super::progress::Progress;
use super::{Status, write_json_line};

/// Widest histogram bar, in characters.
const BAR_MAX_CHARS: u64 = 40;

#[derive(Serialize)]
struct TreeStatsOut<'a> {
    name: &'a str,
    tau: f32,
    nodes: u64,
    roots: u64,
    residuals: u64,
    successes: u64,
    failures: u64,
    consolidated: u64,
    consolidated_roots: u64,
    due_for_consolidation: u64,
    /// `depth_histogram[d - 1]` = nodes at depth d.
    depth_histogram: &'a [u64],
}

#[derive(Serialize)]
struct BytesPerNodeOut {
    vectors: f64,
    table: f64,
    payload: f64,
    total: f64,
}

#[derive(Serialize)]
struct StatsOut<'a> {
    dim: u32,
    /// How the vector column is stored (fixed at init).
    precision: &'static str,
    /// The dot-product kernels this process scans with (CPU-dependent;
    /// `DELTAMEM_KERNEL` can force a lower level).
    kernel: &'static str,
    nodes: u64,
    checkpointed_nodes: u64,
    eps: f32,
    max_depth: u8,
    consolidate_after: u32,
    trees: Vec<TreeStatsOut<'a>>,
    vector_bytes: u64,
    table_bytes: u64,
    payload_bytes: u64,
    /// None for an empty bank.
    bytes_per_node: Option<BytesPerNodeOut>,
    wal_bytes: u64,
    checkpoint_lsn: u64,
    frozen: bool,
    /// Only with `--deep` (every payload is decompressed to measure it).
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_compression: Option<Compression>,
}

/// Payload text bytes against the bytes their records take on disk.
#[derive(Serialize, Clone, Copy)]
pub struct Compression {
    /// Scenario plus every field, uncompressed (`Payload::size_bytes`).
    plain_bytes: u64,
    /// Record bytes in the payload log: 16-byte header + zstd frame.
    record_bytes: u64,
    /// plain / record; None when there are no payloads.
    ratio: Option<f64>,
}

/// Decodes every payload to measure the compression ratio.
fn measure_compression(bank: &Bank, quiet: bool) -> anyhow::Result<Compression> {
    let progress = Progress::bar(u64::from(bank.node_count()), "payloads", quiet);
    let (mut plain_bytes, mut record_bytes) = (0u64, 0u64);
    for index in 0..bank.node_count() {
        let row = bank.row(index).with_context(|| format!("node {index}"))?;
        let payload = bank.payload(index).with_context(|| format!("node {index}"))?;
        plain_bytes += payload.size_bytes() as u64;
        record_bytes += u64::from(row.payload_size_bytes);
        progress.inc(1);
    }
    Ok(Compression {
        plain_bytes,
        record_bytes,
        ratio: (record_bytes > 0).then(|| plain_bytes as f64 / record_bytes as f64),
    })
}

fn tree_out(t: &TreeStats) -> TreeStatsOut<'_> {
    TreeStatsOut {
        name: &t.name,
        tau: t.tau,
        nodes: t.nodes,
        roots: t.roots,
        residuals: t.residuals,
        successes: t.successes,
        failures: t.failures,
        consolidated: t.consolidated,
        consolidated_roots: t.consolidated_roots,
        due_for_consolidation: t.due_for_consolidation,
        depth_histogram: &t.depth_histogram,
    }
}

fn per_node(s: &Stats) -> Option<BytesPerNodeOut> {
    let n = s.nodes as f64;
    (s.nodes > 0).then(|| BytesPerNodeOut {
        vectors: s.vector_bytes as f64 / n,
        table: s.table_bytes as f64 / n,
        payload: s.payload_bytes as f64 / n,
        total: (s.vector_bytes + s.table_bytes + s.payload_bytes) as f64 / n,
    })
}

fn write_tree_text(out: &mut impl Write, t: &TreeStats) -> std::io::Result<()> {
    writeln!(
        out,
        "tree {} (tau {}): {} nodes = {} roots + {} residuals; {} successes, {} failures; \
         {} consolidated, {} consolidated roots, {} due",
        t.name,
        t.tau,
        t.nodes,
        t.roots,
        t.residuals,
        t.successes,
        t.failures,
        t.consolidated,
        t.consolidated_roots,
        t.due_for_consolidation
    )?;
    let widest = t.depth_histogram.iter().copied().max().unwrap_or(0).max(1);
    for (i, count) in t.depth_histogram.iter().enumerate() {
        // Any non-empty depth gets at least one mark, so it stays visible.
        let chars = (count * BAR_MAX_CHARS).div_ceil(widest);
        let bar = "#".repeat(chars as usize);
        writeln!(out, "  depth {:>2} | {bar:<40} {count}", i + 1)?;
    }
    Ok(())
}

/// The human-readable report (also used by the demo).
pub fn write_stats_text(out: &mut impl Write, bank: &Bank) -> anyhow::Result<()> {
    write_stats_text_with(out, bank, None)
}

fn write_stats_text_with(out: &mut impl Write, bank: &Bank, compression: Option<Compression>) -> anyhow::Result<()> {
    let s = bank.stats()?;
    let m = bank.manifest();
    let io = |e| anyhow::Error::new(e).context("cannot write to stdout");
    writeln!(
        out,
        "{} nodes ({} checkpointed), {} dimensions ({}), eps {}, D_max {}, K_cons {}{}",
        s.nodes,
        s.checkpointed_nodes,
        s.dim_count,
        s.precision.as_str(),
        m.eps,
        m.max_depth,
        m.consolidate_after,
        if s.frozen { ", frozen" } else { "" }
    )
    .map_err(io)?;
    for t in &s.trees {
        write_tree_text(out, t).map_err(io)?;
    }
    let sizes = match per_node(&s) {
        Some(p) => format!(
            "bytes per node: vectors {:.0}, table {:.0}, payload {:.1}, total {:.1}",
            p.vectors, p.table, p.payload, p.total
        ),
        None => "bytes per node: no nodes yet".to_string(),
    };
    writeln!(out, "{sizes}").map_err(io)?;
    if let Some(c) = compression {
        let ratio = c.ratio.map_or("n/a".to_string(), |r| format!("{r:.2}x"));
        writeln!(
            out,
            "payloads: {} bytes of text in {} bytes of records: compression {ratio}",
            c.plain_bytes, c.record_bytes
        )
        .map_err(io)?;
    }
    writeln!(out, "WAL: {} bytes; checkpoint LSN {}", s.wal_bytes, s.checkpoint_lsn).map_err(io)?;
    writeln!(out, "scan kernel: {}", Level::active().name()).map_err(io)?;
    Ok(())
}

/// What `stats` was asked for besides the counts.
pub struct StatsArgs<'a> {
    pub json: bool,
    pub deep: bool,
    pub plot: Option<&'a Path>,
}

pub fn stats(path: &Path, args: &StatsArgs, quiet: bool) -> anyhow::Result<Status> {
    let bank = super::open_read(path)?;
    let compression = match args.deep {
        true => Some(measure_compression(&bank, quiet)?),
        false => None,
    };
    if let Some(plot) = args.plot {
        let svg = super::picture::depth_plot_svg(&bank.stats()?);
        write_atomically(plot, |out| {
            out.write_all(svg.as_bytes())
                .map_err(|e| deltamem::interop::InteropError::io("write", plot)(e))
        })?;
    }
    let mut out = super::stdout();
    if args.json {
        let s = bank.stats()?;
        let m = bank.manifest();
        let report = StatsOut {
            dim: s.dim_count,
            precision: s.precision.as_str(),
            kernel: Level::active().name(),
            nodes: s.nodes,
            checkpointed_nodes: s.checkpointed_nodes,
            eps: m.eps,
            max_depth: m.max_depth,
            consolidate_after: m.consolidate_after,
            trees: s.trees.iter().map(tree_out).collect(),
            vector_bytes: s.vector_bytes,
            table_bytes: s.table_bytes,
            payload_bytes: s.payload_bytes,
            bytes_per_node: per_node(&s),
            wal_bytes: s.wal_bytes,
            checkpoint_lsn: s.checkpoint_lsn,
            frozen: s.frozen,
            payload_compression: compression,
        };
        write_json_line(&mut out, &report)?;
    } else {
        write_stats_text_with(&mut out, &bank, compression)?;
    }
    out.flush().context("cannot write to stdout")?;
    Ok(Status::Ok)
}

#[derive(Serialize)]
struct ProblemOut<'a> {
    file: &'a str,
    offset_bytes: u64,
    detail: &'a str,
}

#[derive(Serialize)]
struct VerifyOut<'a> {
    ok: bool,
    nodes_checked: u64,
    wal_records: u64,
    problems: Vec<ProblemOut<'a>>,
}

/// Runs the checks; prints the summary on stdout (unless quiet) or each
/// problem on stderr. Shared with the demo.
pub fn check_bank(bank: &Bank, path: &Path, quiet: bool) -> anyhow::Result<Status> {
    let report = bank.verify()?;
    if report.is_ok() {
        if !quiet {
            super::emit(format!(
                "ok: {} nodes, {} WAL records checked",
                report.nodes_checked, report.wal_records
            ))?;
        }
        return Ok(Status::Ok);
    }
    for p in &report.problems {
        // Problems not tied to one file are about the bank as a whole.
        let file = match p.file.is_empty() {
            true => path.display().to_string(),
            false => p.file.clone(),
        };
        eprintln!("{file} @ {}: {}", p.offset_bytes, p.detail);
    }
    eprintln!(
        "deltamem: {} problem(s) found in {}",
        report.problems.len(),
        path.display()
    );
    Ok(Status::Failed)
}

pub fn verify(path: &Path, json: bool, quiet: bool) -> anyhow::Result<Status> {
    let options = deltamem::OpenOptions {
        read_only: true,
        ..Default::default()
    };
    let bank = match Bank::open_dir(path, options) {
        Ok(bank) => bank,
        // `--json` always answers with one object: a bank that cannot be
        // opened is a failed check with the reason as its problem.
        Err(e) if json => {
            let problem = deltamem::bank::Problem::from_error(&path.display().to_string(), e);
            return print_verify_json(
                path,
                &deltamem::bank::VerifyReport {
                    problems: vec![problem],
                    ..Default::default()
                },
            );
        }
        Err(e) => return Err(anyhow::Error::new(e).context(format!("cannot open {}", path.display()))),
    };
    if !json {
        let progress = Progress::spinner(&format!("verifying {}", path.display()), quiet);
        let status = check_bank(&bank, path, quiet);
        drop(progress);
        return status;
    }
    let progress = Progress::spinner(&format!("verifying {}", path.display()), quiet);
    let report = bank.verify()?;
    drop(progress);
    print_verify_json(path, &report)
}

fn print_verify_json(path: &Path, report: &deltamem::bank::VerifyReport) -> anyhow::Result<Status> {
    let bank_path = path.display().to_string();
    let out = VerifyOut {
        ok: report.is_ok(),
        nodes_checked: report.nodes_checked,
        wal_records: report.wal_records,
        problems: report
            .problems
            .iter()
            .map(|p| ProblemOut {
                file: if p.file.is_empty() { &bank_path } else { &p.file },
                offset_bytes: p.offset_bytes,
                detail: &p.detail,
            })
            .collect(),
    };
    let mut stdout = super::stdout();
    write_json_line(&mut stdout, &out)?;
    stdout.flush().context("cannot write to stdout")?;
    Ok(if report.is_ok() { Status::Ok } else { Status::Failed })
}

//! `deltamem stats` and `deltamem verify`.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use deltamem::Bank;
use deltamem::api::{Compression, StatsReply, TreeStatsReply, VerifyReply};

use super::scratch::write_atomically;

use super::progress::Progress;
use super::{Status, write_json_line};

/// Widest histogram bar, in characters.
const BAR_MAX_CHARS: u64 = 40;

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

fn write_tree_text(out: &mut impl Write, t: &TreeStatsReply) -> std::io::Result<()> {
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
    let r = StatsReply::new(bank.stats()?, bank.manifest(), compression);
    let io = |e| anyhow::Error::new(e).context("cannot write to stdout");
    writeln!(
        out,
        "{} nodes ({} checkpointed), {} dimensions ({}), eps {}, D_max {}, K_cons {}{}",
        r.nodes,
        r.checkpointed_nodes,
        r.dim,
        r.precision,
        r.eps,
        r.max_depth,
        r.consolidate_after,
        if r.frozen { ", frozen" } else { "" }
    )
    .map_err(io)?;
    for t in &r.trees {
        write_tree_text(out, t).map_err(io)?;
    }
    let sizes = match r.bytes_per_node {
        Some(p) => format!(
            "bytes per node: vectors {:.0}, table {:.0}, payload {:.1}, total {:.1}",
            p.vectors, p.table, p.payload, p.total
        ),
        None => "bytes per node: no nodes yet".to_string(),
    };
    writeln!(out, "{sizes}").map_err(io)?;
    if let Some(c) = r.payload_compression {
        let ratio = c.ratio.map_or("n/a".to_string(), |r| format!("{r:.2}x"));
        writeln!(
            out,
            "payloads: {} bytes of text in {} bytes of records: compression {ratio}",
            c.plain_bytes, c.record_bytes
        )
        .map_err(io)?;
    }
    writeln!(out, "WAL: {} bytes; checkpoint LSN {}", r.wal_bytes, r.checkpoint_lsn).map_err(io)?;
    match &r.first_pass {
        Some(pass) => writeln!(out, "scan kernel: {} (batches scored first in {pass})", r.kernel),
        None => writeln!(out, "scan kernel: {}", r.kernel),
    }
    .map_err(io)?;
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
        let report = StatsReply::new(bank.stats()?, bank.manifest(), compression);
        write_json_line(&mut out, &report)?;
    } else {
        write_stats_text_with(&mut out, &bank, compression)?;
    }
    out.flush().context("cannot write to stdout")?;
    Ok(Status::Ok)
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
                deltamem::bank::VerifyReport {
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
    print_verify_json(path, report)
}

fn print_verify_json(path: &Path, report: deltamem::bank::VerifyReport) -> anyhow::Result<Status> {
    let out = VerifyReply::new(report, &path.display().to_string());
    let mut stdout = super::stdout();
    write_json_line(&mut stdout, &out)?;
    stdout.flush().context("cannot write to stdout")?;
    Ok(if out.ok { Status::Ok } else { Status::Failed })
}

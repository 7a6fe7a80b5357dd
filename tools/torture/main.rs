//! deltamem-torture: kill -9 a real writer process at random moments and
//! check that no acknowledged write is ever lost.
//!
//! Each cycle starts `deltamem insert BANK --sync always`, streams nodes
//! into it (each with a unique external id), records every acknowledged id
//! in a ledger, and SIGKILLs the process after a random delay. Then a fresh
//! read-only `deltamem dump` must contain every id in the ledger, and
//! `deltamem verify` must pass. The next cycle's writer recovers the bank.
//!
//! Usage: deltamem-torture [--cycles N] [--seed S] [--max-run-ms MS]
//!                         [--bank DIR] [--deltamem PATH]
//! Prints `cycles C, acked A, lost L` and exits 1 on any loss or failure.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deltamem::storage::sim::Rng;

const DIM: usize = 16;

struct Args {
    cycles: u32,
    seed: u64,
    max_run_ms: u64,
    bank: Option<PathBuf>,
    deltamem: PathBuf,
}

fn parse_args() -> Result<Args, String> {
    let sibling = std::env::current_exe()
        .map_err(|e| e.to_string())?
        .with_file_name("deltamem");
    let mut args = Args {
        cycles: 20,
        seed: 1,
        max_run_ms: 400,
        bank: None,
        deltamem: sibling,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--cycles" => args.cycles = value()?.parse().map_err(|e| format!("--cycles: {e}"))?,
            "--seed" => args.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--max-run-ms" => args.max_run_ms = value()?.parse().map_err(|e| format!("--max-run-ms: {e}"))?,
            "--bank" => args.bank = Some(PathBuf::from(value()?)),
            "--deltamem" => args.deltamem = PathBuf::from(value()?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

fn node_line(cycle: u32, i: u64, rng: &mut Rng) -> String {
    let embedding: Vec<f32> = (0..DIM).map(|_| (rng.next() % 1000) as f32 / 1000.0 + 0.001).collect();
    let attach = if i % 5 == 4 { "\"auto\"" } else { "\"root\"" };
    serde_json::json!({
        "tree": "task",
        "attach": serde_json::from_str::<serde_json::Value>(attach).expect("literal"),
        "label": if i % 7 == 3 { "FAILURE" } else { "SUCCESS" },
        "scenario": format!("cycle {cycle} node {i}"),
        "payload": {"execution_procedure": format!("step {i}").repeat(1 + (i % 40) as usize)},
        "embedding": embedding,
        "id": format!("c{cycle}n{i}"),
    })
    .to_string()
}

/// Streams nodes into a writer until it dies; collects acknowledged ids.
fn run_cycle(args: &Args, bank: &Path, cycle: u32, rng: &mut Rng) -> Result<Vec<String>, String> {
    let mut child: Child = Command::new(&args.deltamem)
        .args(["insert", &bank.display().to_string(), "--sync", "always", "--quiet"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", args.deltamem.display()))?;
    let mut stdin = child.stdin.take().expect("piped");
    let stdout = child.stdout.take().expect("piped");
    let acked = Arc::new(Mutex::new(Vec::new()));
    let reader = {
        let acked = acked.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
                    && let Some(id) = v.get("external_id").and_then(|x| x.as_str())
                {
                    acked.lock().unwrap().push(id.to_string());
                }
            }
        })
    };
    let mut line_rng = Rng(rng.next() | 1);
    let writer = std::thread::spawn(move || {
        // Bounded: the pipe breaks when the writer is killed.
        for i in 0..1_000_000u64 {
            if writeln!(stdin, "{}", node_line(cycle, i, &mut line_rng)).is_err() {
                break;
            }
        }
    });
    std::thread::sleep(Duration::from_millis(5 + rng.next() % args.max_run_ms.max(1)));
    child.kill().map_err(|e| format!("kill: {e}"))?; // SIGKILL on Unix
    child.wait().map_err(|e| format!("wait: {e}"))?;
    writer.join().map_err(|_| "writer thread panicked".to_string())?;
    reader.join().map_err(|_| "reader thread panicked".to_string())?;
    Ok(std::mem::take(&mut *acked.lock().unwrap()))
}

/// External ids present in the bank, as a fresh reader sees them.
fn stored_ids(args: &Args, bank: &Path) -> Result<BTreeSet<String>, String> {
    let out = Command::new(&args.deltamem)
        .args(["dump", &bank.display().to_string()])
        .output()
        .map_err(|e| format!("dump: {e}"))?;
    if !out.status.success() {
        return Err(format!("dump failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let mut ids = BTreeSet::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("dump line: {e}"))?;
        if let Some(id) = v.get("external_id").and_then(|x| x.as_str()) {
            ids.insert(id.to_string());
        }
    }
    Ok(ids)
}

fn verify(args: &Args, bank: &Path) -> Result<(), String> {
    let out = Command::new(&args.deltamem)
        .args(["verify", &bank.display().to_string()])
        .output();
    match out {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!("verify failed: {}", String::from_utf8_lossy(&o.stderr).trim())),
        Err(e) => Err(format!("verify: {e}")),
    }
}

fn torture(args: &Args, bank: &Path) -> Result<(u32, usize, usize), String> {
    let init = Command::new(&args.deltamem)
        .args([
            "init",
            &bank.display().to_string(),
            "--dim",
            &DIM.to_string(),
            "--quiet",
        ])
        .output()
        .map_err(|e| format!("init: {e}"))?;
    if !init.status.success() {
        return Err(format!("init failed: {}", String::from_utf8_lossy(&init.stderr)));
    }
    let mut rng = Rng(args.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut ledger = BTreeSet::new();
    let mut lost = 0;
    for cycle in 0..args.cycles {
        ledger.extend(run_cycle(args, bank, cycle, &mut rng)?);
        let stored = stored_ids(args, bank)?;
        let missing: Vec<&String> = ledger.difference(&stored).collect();
        if !missing.is_empty() {
            eprintln!(
                "cycle {cycle}: {} acknowledged ids lost, first {:?}",
                missing.len(),
                missing.first()
            );
            lost += missing.len();
        }
        verify(args, bank).map_err(|e| format!("cycle {cycle}: {e}"))?;
    }
    Ok((args.cycles, ledger.len(), lost))
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("deltamem-torture: {e}");
            return ExitCode::from(2);
        }
    };
    let temp = std::env::temp_dir().join(format!("deltamem-torture-{}", std::process::id()));
    let bank = args.bank.clone().unwrap_or_else(|| temp.clone());
    let result = torture(&args, &bank);
    if args.bank.is_none() {
        let _ = std::fs::remove_dir_all(&temp);
    }
    match result {
        Ok((cycles, acked, lost)) => {
            println!("cycles {cycles}, acked {acked}, lost {lost}");
            if lost == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("deltamem-torture: {e}");
            ExitCode::FAILURE
        }
    }
}

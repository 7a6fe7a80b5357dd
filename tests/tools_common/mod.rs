//! Helpers shared by the `tools_*` integration tests: running the real
//! binary, the reference fixtures, small .npy files and vector maths done
//! here independently of the library.

#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use deltamem::interop::npy::{NpyElement, NpyMatrixWriter};
use serde_json::Value;

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn lines(&self) -> Vec<Value> {
        self.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", self.stdout))
    }
}

pub fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_deltamem"));
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

pub fn deltamem(args: &[&str], stdin: &str) -> Run {
    let mut child = command(args).stdin(Stdio::piped()).spawn().expect("spawn deltamem");
    let mut input = child.stdin.take().unwrap();
    let text = stdin.to_string();
    // From a thread, ignoring errors: a command may never read stdin.
    std::thread::spawn(move || input.write_all(text.as_bytes()));
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code().expect("exited normally"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

pub fn ok(args: &[&str]) -> Run {
    let run = deltamem(args, "");
    assert_eq!(run.code, 0, "{args:?} failed: {}", run.stderr);
    run
}

pub fn fails(args: &[&str], code: i32) -> Run {
    let run = deltamem(args, "");
    assert_eq!(
        run.code, code,
        "{args:?}: expected exit {code}, stdout {} stderr {}",
        run.stdout, run.stderr
    );
    run
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A fresh bank in a temp dir (kept alive by the returned guard).
pub fn bank(dim: u32, extra: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bank");
    let dim = dim.to_string();
    let mut args = vec!["init", s(&path), "--dim", &dim];
    args.extend_from_slice(extra);
    ok(&args);
    (dir, path)
}

/// The reference implementation's banks, kept in the repository
/// (`tests/fixtures/reference/README.md` gives their origin).
pub fn reference_fixture(name: &str) -> PathBuf {
    let path = local_fixture("reference").join(name);
    assert!(path.exists(), "fixture {} is missing", path.display());
    path
}

pub fn local_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

pub fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Writes rows with the library's writer.
pub fn write_npy(path: &Path, rows: &[Vec<f32>], element: NpyElement) {
    let dim = rows.first().map_or(0, Vec::len);
    let mut w = NpyMatrixWriter::create(path, rows.len() as u64, dim, element).unwrap();
    for r in rows {
        w.write_row(r).unwrap();
    }
    w.finish().unwrap();
}

/// Deterministic pseudo-random rows (an LCG), components in [-1, 1).
pub fn random_rows(count: usize, dim: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..count)
        .map(|_| {
            (0..dim)
                .map(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
                })
                .collect()
        })
        .collect()
}

/// L2-normalised in f64, as SEMANTICS.md asks the bank to store vectors.
pub fn unit(v: &[f32]) -> Vec<f64> {
    let norm = v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
    v.iter().map(|x| f64::from(*x) / norm).collect()
}

pub fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

/// True if `python3` runs here with `module` importable.
pub fn python_with(module: &str) -> bool {
    Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

pub fn python(script: &str, args: &[&str]) -> Run {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Dump lines of a bank (optionally one tree), keyed by position.
pub fn dump(bank: &Path, extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["dump", s(bank)];
    args.extend_from_slice(extra);
    ok(&args).lines()
}

//! `deltamem init`: create a bank and describe it.

use std::path::Path;

use anyhow::Context;
use deltamem::{Bank, BankConfig, TreeSpec};
use serde::Serialize;

use super::{Status, write_json_line};

/// Threshold of a tree given without `:tau=`: the library's default pair
/// uses it too (the reference's ScienceWorld setting).
pub const DEFAULT_TAU: f32 = 0.82;

/// A `--tree NAME[:tau=X]` argument.
#[derive(Debug, Clone, PartialEq)]
pub struct TreeArg {
    pub name: String,
    pub tau: f32,
}

/// Parses `NAME` or `NAME:tau=X`. A bad spec is a usage error (exit 2).
pub fn parse_tree_arg(text: &str) -> Result<TreeArg, String> {
    let (name, rest) = match text.split_once(':') {
        Some((name, rest)) => (name, Some(rest)),
        None => (text, None),
    };
    if name.is_empty() {
        return Err("the tree name is empty".into());
    }
    let tau = match rest {
        None => DEFAULT_TAU,
        Some(option) => {
            let value = option
                .strip_prefix("tau=")
                .ok_or_else(|| format!("expected NAME:tau=X, found option {option:?}"))?;
            let tau: f32 = value.parse().map_err(|_| format!("tau {value:?} is not a number"))?;
            // A threshold on a cosine: outside [-1, 1] it means nothing.
            if !(-1.0..=1.0).contains(&tau) {
                return Err(format!("tau {value} must be between -1 and 1"));
            }
            tau
        }
    };
    Ok(TreeArg {
        name: name.to_string(),
        tau,
    })
}

pub struct InitArgs {
    pub dim_count: u32,
    pub trees: Vec<TreeArg>,
    pub eps: Option<f32>,
    pub max_depth: Option<u8>,
    pub consolidate_after: Option<u32>,
    pub rows_per_segment: Option<u32>,
    pub precision: PrecisionArg,
}

/// How the vector column is stored (fixed at init).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PrecisionArg {
    /// f32 vectors (exact).
    F32,
    /// binary16 vectors: half the size; scores within a small bound of f32's.
    F16,
    /// f32 vectors plus an int8 side column for a fast first pass, then an
    /// exact f32 re-rank (same answers as f32).
    Int8,
}

impl InitArgs {
    /// Starts from the library defaults and applies what was given.
    pub fn config(&self) -> BankConfig {
        let mut config = BankConfig::new(self.dim_count);
        if !self.trees.is_empty() {
            config.trees = self
                .trees
                .iter()
                .map(|t| TreeSpec {
                    name: t.name.clone(),
                    tau: t.tau,
                })
                .collect();
        }
        config.eps = self.eps.unwrap_or(config.eps);
        config.max_depth = self.max_depth.unwrap_or(config.max_depth);
        config.consolidate_after = self.consolidate_after.unwrap_or(config.consolidate_after);
        config.rows_per_segment = self.rows_per_segment.or(config.rows_per_segment);
        config.precision = match self.precision {
            PrecisionArg::F32 => deltamem::format::manifest::Precision::F32,
            PrecisionArg::F16 => deltamem::format::manifest::Precision::F16,
            PrecisionArg::Int8 => deltamem::format::manifest::Precision::Int8,
        };
        config
    }
}

#[derive(Serialize)]
struct TreeOut<'a> {
    name: &'a str,
    tau: f32,
}

#[derive(Serialize)]
struct BankOut<'a> {
    bank: String,
    dim: u32,
    trees: Vec<TreeOut<'a>>,
    eps: f32,
    max_depth: u8,
    consolidate_after: u32,
    rows_per_segment: u32,
    precision: &'static str,
}

/// `init` refuses segments so small that the segment cap
/// (`MAX_SEGMENT_COUNT`) would leave the bank room for few nodes; the
/// library accepts them (tests use many small segments).
fn check_rows_per_segment(args: &InitArgs) -> anyhow::Result<()> {
    use deltamem::format::manifest::MAX_ROWS_PER_SEGMENT;
    use deltamem::format::{INIT_MIN_ROWS_PER_SEGMENT, MAX_SEGMENT_COUNT, node_capacity};
    let range = INIT_MIN_ROWS_PER_SEGMENT..=MAX_ROWS_PER_SEGMENT;
    let Some(rows) = args.rows_per_segment.filter(|r| !range.contains(r)) else {
        return Ok(());
    };
    let mut message = format!("rows per segment {rows} outside {INIT_MIN_ROWS_PER_SEGMENT}..={MAX_ROWS_PER_SEGMENT}");
    if rows < INIT_MIN_ROWS_PER_SEGMENT {
        message += &format!(
            ": below {INIT_MIN_ROWS_PER_SEGMENT}, a bank (at most {MAX_SEGMENT_COUNT} segments: each one maps \
             files, and a process may map only so many) could hold only {} nodes",
            node_capacity(rows)
        );
    }
    anyhow::bail!(message)
}

pub fn run(path: &Path, args: InitArgs) -> anyhow::Result<Status> {
    check_rows_per_segment(&args)?;
    let bank =
        Bank::create_dir(path, args.config()).with_context(|| format!("cannot create a bank in {}", path.display()))?;
    let manifest = bank.manifest().clone();
    super::close(bank, path)?;
    let out = BankOut {
        bank: path.display().to_string(),
        dim: manifest.dim_count,
        trees: manifest
            .trees
            .iter()
            .map(|t| TreeOut {
                name: &t.name,
                tau: t.tau,
            })
            .collect(),
        eps: manifest.eps,
        max_depth: manifest.max_depth,
        consolidate_after: manifest.consolidate_after,
        rows_per_segment: manifest.rows_per_segment,
        precision: match manifest.precision {
            deltamem::format::manifest::Precision::F32 => "f32",
            deltamem::format::manifest::Precision::F16 => "f16",
            deltamem::format::manifest::Precision::Int8 => "int8",
        },
    };
    let mut stdout = super::stdout();
    write_json_line(&mut stdout, &out)?;
    std::io::Write::flush(&mut stdout).context("cannot write to stdout")?;
    Ok(Status::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_specs() {
        assert_eq!(parse_tree_arg("task").unwrap().tau, DEFAULT_TAU);
        let t = parse_tree_arg("insights:tau=0.5").unwrap();
        assert_eq!((t.name.as_str(), t.tau), ("insights", 0.5));
        assert!(parse_tree_arg(":tau=0.5").is_err());
        assert!(parse_tree_arg("x:eps=1").is_err());
        assert!(parse_tree_arg("x:tau=abc").is_err());
        assert!(parse_tree_arg("x:tau=NaN").is_err());
    }
}

//! `deltamem demo`: the agent loop of the paper on a fresh bank, narrated
//! step by step. With the `agent` feature and its assets, the real demo
//! runs (`demo_real.rs`); otherwise, or with `--toy`, this toy one: a
//! scripted run with a toy embedder.
//!
//! Per episode: retrieve from both trees (task text, env text), let the
//! scripted agent act, write one node per tree with the attachment rule,
//! count retrievals on the chains used, and on success count a hit on the
//! nodes matched at the start; a node reaching K_cons is consolidated with
//! a concatenation of its chain standing in for the LLM's distillation.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use deltamem::{Attach, Bank, BankConfig, Label, Match, NewNode, Payload, QueryOptions, TreeSpec};

use super::embed::{TOY_DIM_COUNT, embed};
use super::episodes::{EPISODES, Episode, QUERIES};
use super::{Status, draw, emit, report};

/// The toy embedder only sees shared spelling, so its cosines run lower
/// than a real model's; this threshold separates "same task, more
/// detail" from "different task" for the scripted texts.
const DEMO_TAU: f32 = 0.6;
/// Short chains and quick consolidation, so twelve episodes show both.
const DEMO_MAX_DEPTH: u8 = 3;
const DEMO_CONSOLIDATE_AFTER: u32 = 2;

/// What happened during the run, for the closing summary.
#[derive(Default)]
struct Tally {
    roots: u32,
    residuals: u32,
    siblings: u32,
    failures: u32,
    skips: u32,
    hits: u32,
    consolidations: Vec<(u32, u32)>,
}

struct Demo {
    bank: Bank,
    quiet: bool,
    tally: Tally,
}

fn demo_config() -> BankConfig {
    let mut config = BankConfig::new(TOY_DIM_COUNT as u32);
    config.trees = ["task", "env"]
        .iter()
        .map(|name| TreeSpec {
            name: (*name).to_string(),
            tau: DEMO_TAU,
        })
        .collect();
    config.max_depth = DEMO_MAX_DEPTH;
    config.consolidate_after = DEMO_CONSOLIDATE_AFTER;
    config
}

fn chain_text(chain: &[u32]) -> String {
    let ids: Vec<String> = chain.iter().map(|i| format!("#{i}")).collect();
    ids.join(" > ")
}

fn task_payload(ep: &Episode) -> Payload {
    let mut fields = BTreeMap::new();
    fields.insert("activation_condition".into(), format!("the goal is to {}", ep.task));
    fields.insert("execution_procedure".into(), ep.steps.to_string());
    if ep.success {
        fields.insert("termination_condition".into(), "the goal is reported done".into());
    } else {
        fields.insert("failure_reason".into(), ep.failure_reason.to_string());
    }
    Payload {
        scenario: ep.task.to_string(),
        fields,
    }
}

fn env_payload(ep: &Episode) -> Payload {
    let mut fields = BTreeMap::new();
    fields.insert("activation_condition".into(), format!("the agent is in a {}", ep.env));
    fields.insert("content".into(), ep.facts.to_string());
    Payload {
        scenario: ep.env.to_string(),
        fields,
    }
}

impl Demo {
    fn say(&self, text: impl AsRef<str>) -> anyhow::Result<()> {
        match self.quiet {
            true => Ok(()),
            false => emit(text.as_ref()),
        }
    }

    fn best(&self, tree: &str, vector: &[f32]) -> anyhow::Result<Option<Match>> {
        let found = self.bank.query(tree, vector, &QueryOptions::default())?;
        Ok(found.into_iter().next())
    }

    fn tell_retrieval(&self, tree: &str, found: &Option<Match>) -> anyhow::Result<()> {
        match found {
            Some(m) => self.say(format!(
                "  {tree:<4} retrieve: match #{} (score {:.3}), chain {}",
                m.id,
                m.score,
                chain_text(&m.chain)
            )),
            None => self.say(format!("  {tree:<4} retrieve: no match above tau, nothing to build on")),
        }
    }

    /// Writes one node with the attachment rule and narrates the result.
    fn write(&mut self, tree: &str, payload: Payload, label: Label) -> anyhow::Result<()> {
        let embedding = embed(&payload.scenario);
        let ack = self.bank.insert(NewNode {
            tree: tree.to_string(),
            attach: Attach::Auto,
            label,
            payload,
            embedding,
            external_id: None,
        })?;
        self.tally.failures += u32::from(label == Label::Failure);
        let what = match (ack.parent, ack.matched) {
            (None, _) => {
                self.tally.roots += 1;
                "ROOT".to_string()
            }
            (Some(parent), Some((matched, _))) if parent != matched => {
                self.tally.residuals += 1;
                self.tally.siblings += 1;
                format!("RESIDUAL under #{parent} (beside #{matched}, whose chain is at D_max)")
            }
            (Some(parent), _) => {
                self.tally.residuals += 1;
                format!("RESIDUAL under #{parent}")
            }
        };
        self.say(format!(
            "  {tree:<4} write:    #{} {} {what}, depth {}",
            ack.id,
            label.as_str(),
            ack.depth
        ))?;
        Ok(())
    }

    fn skip(&mut self, tree: &str) -> anyhow::Result<()> {
        self.tally.skips += 1;
        self.say(format!(
            "  {tree:<4} write:    skipped (the extractor found the chain already covers it)"
        ))
    }

    /// The stand-in for the LLM's distillation: the chain's procedures in
    /// order, failures kept as explicit warnings rather than fused in.
    fn distill(&self, index: u32) -> anyhow::Result<BTreeMap<String, String>> {
        let chain = self.bank.chain(index)?;
        let mut steps = Vec::new();
        for (n, i) in chain.iter().enumerate() {
            let node = self.bank.node(*i)?;
            let text = node.payload.fields.get("execution_procedure").cloned();
            let text = text.unwrap_or_else(|| node.payload.fields.get("content").cloned().unwrap_or_default());
            match node.row.label {
                Label::Success => steps.push(format!("{}. {text}", n + 1)),
                Label::Failure => steps.push(format!("{}. AVOID (this failed): {text}", n + 1)),
            }
        }
        let scenario = self.bank.payload(index)?.scenario;
        let mut fields = BTreeMap::new();
        fields.insert("activation_condition".into(), format!("the goal is to {scenario}"));
        fields.insert("execution_procedure".into(), steps.join("\n"));
        fields.insert(
            "provenance".into(),
            format!("distilled from chain {}", chain_text(&chain)),
        );
        Ok(fields)
    }

    fn hit(&mut self, tree: &str, m: &Match) -> anyhow::Result<()> {
        let ack = self.bank.success_hit(m.id)?;
        self.tally.hits += 1;
        self.say(format!(
            "  {tree:<4} success hit on #{}: {} of {}",
            m.id, ack.success_hits, DEMO_CONSOLIDATE_AFTER
        ))?;
        if !ack.due {
            return Ok(());
        }
        let fields = self.distill(m.id)?;
        let done = self.bank.consolidate(m.id, fields)?;
        self.tally.consolidations.push((done.source, done.new_root));
        self.say(format!(
            "  {tree:<4} consolidation: #{} is due; chain {} distilled into new root #{} \
             (concatenated, standing in for the LLM); #{} is flagged consolidated",
            m.id,
            chain_text(&m.chain),
            done.new_root,
            m.id
        ))?;
        Ok(())
    }

    fn episode(&mut self, number: usize, ep: &Episode) -> anyhow::Result<()> {
        let outcome = if ep.success { "SUCCESS" } else { "FAILURE" };
        self.say(format!(
            "episode {number}: \"{}\" in a {} -> {outcome}",
            ep.task, ep.env
        ))?;
        let task_match = self.best("task", &embed(ep.task))?;
        let env_match = self.best("env", &embed(ep.env))?;
        self.tell_retrieval("task", &task_match)?;
        self.tell_retrieval("env", &env_match)?;
        let used: Vec<u32> = [&task_match, &env_match]
            .into_iter()
            .flatten()
            .flat_map(|m| m.chain.iter().copied())
            .collect();
        if !used.is_empty() {
            self.bank.record_retrievals(&used)?;
        }
        let label = if ep.success { Label::Success } else { Label::Failure };
        match ep.skip_task && task_match.is_some() {
            true => self.skip("task")?,
            false => self.write("task", task_payload(ep), label)?,
        }
        // Scene observations are valid whatever the outcome.
        match ep.skip_env && env_match.is_some() {
            true => self.skip("env")?,
            false => self.write("env", env_payload(ep), Label::Success)?,
        }
        if ep.success {
            for (tree, m) in [("task", &task_match), ("env", &env_match)] {
                if let Some(m) = m {
                    self.hit(tree, m)?;
                }
            }
        }
        Ok(())
    }
}

/// A new directory under the system temp dir, unique to this run.
fn fresh_temp_dir() -> anyhow::Result<PathBuf> {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let path = std::env::temp_dir().join(format!("deltamem-demo-{}-{nanos}", std::process::id()));
    std::fs::create_dir(&path).with_context(|| format!("cannot create {}", path.display()))?;
    Ok(path)
}

/// The real demo's embedder, or why it cannot run.
#[cfg(feature = "agent")]
fn real_demo() -> Result<deltamem::agent::OnnxEmbedder, String> {
    super::demo_real::embedder()
}

#[cfg(not(feature = "agent"))]
fn real_demo() -> Result<std::convert::Infallible, String> {
    Err("this deltamem was built without the `agent` feature".into())
}

/// The real demo (recorded ScienceWorld episodes, MiniLM embeddings,
/// replayed LLM answers) when it can run, else the toy one, which says why
/// and how to get the real one; `toy` asks for the toy one.
pub fn run(dir: Option<&Path>, keep: bool, quiet: bool, toy: bool) -> anyhow::Result<Status> {
    let real = if toy { Err(String::new()) } else { real_demo() };
    let (path, temporary) = match dir {
        Some(d) => (d.to_path_buf(), false),
        None => (fresh_temp_dir()?, true),
    };
    #[cfg(feature = "agent")]
    let result = match real {
        Ok(embedder) => super::demo_real::run_in(&path, embedder, quiet),
        Err(why) => run_in(&path, quiet, &why),
    };
    #[cfg(not(feature = "agent"))]
    let result = match real {
        Err(why) => run_in(&path, quiet, &why),
    };
    if temporary && !keep {
        if let Err(e) = std::fs::remove_dir_all(&path) {
            eprintln!("deltamem: could not remove {}: {e}", path.display());
        }
    } else if !quiet {
        emit(format!("the demo bank is kept in {}", path.display()))?;
    }
    result
}

/// The toy demo; `why_not_real` (empty when the toy was asked for) says
/// why the real one is not running.
fn run_in(path: &Path, quiet: bool, why_not_real: &str) -> anyhow::Result<Status> {
    let started = Instant::now();
    let bank = Bank::create_dir(path, demo_config())
        .with_context(|| format!("cannot create the demo bank in {}", path.display()))?;
    let mut demo = Demo {
        bank,
        quiet,
        tally: Tally::default(),
    };
    demo.say(format!(
        "deltamem demo: bank in {}\n\
         NOTE: vectors come from a toy embedder (hashed words and character trigrams, \
         {TOY_DIM_COUNT} dims); it matches spelling, not meaning. Real embeddings are \
         supplied by the caller (or by the `agent` feature).\n\
         trees task and env, tau {DEMO_TAU}, D_max {DEMO_MAX_DEPTH}, K_cons {DEMO_CONSOLIDATE_AFTER}\n",
        path.display()
    ))?;
    if !why_not_real.is_empty() {
        demo.say(format!(
            "This is the toy demo: {why_not_real}. The real one replays a recorded ScienceWorld \
             run with MiniLM embeddings; tools/setup.sh fetches the assets and builds it \
             (cargo build --release --features agent).\n"
        ))?;
    }
    for (i, ep) in EPISODES.iter().enumerate() {
        demo.episode(i + 1, ep).with_context(|| format!("episode {}", i + 1))?;
    }
    let Demo { bank, tally, .. } = demo;
    super::close(bank, path)?;
    // Everything below reads the checkpointed files, as a reader would.
    let bank = super::open_read(path)?;
    answer_queries(&bank, quiet)?;
    let status = show_state(&bank, path, quiet)?;
    summarise(&tally, started)?;
    Ok(status)
}

fn answer_queries(bank: &Bank, quiet: bool) -> anyhow::Result<()> {
    for (tree, text) in QUERIES {
        let found = bank.query(tree, &embed(text), &QueryOptions::default())?;
        if quiet {
            continue;
        }
        emit(format!("\nquery {tree}: \"{text}\""))?;
        match found.first() {
            None => emit("  no match above tau")?,
            Some(m) => {
                emit(format!(
                    "  best: #{} {} {} (score {:.3}), chain {}; as the prompt would show it:",
                    m.id,
                    m.node_type.as_str(),
                    m.label.as_str(),
                    m.score,
                    chain_text(&m.chain)
                ))?;
                for line in bank.render_chain(m.id)?.lines() {
                    emit(format!("  | {line}").trim_end())?;
                }
            }
        }
    }
    Ok(())
}

/// Stats, the integrity check, then both trees drawn.
fn show_state(bank: &Bank, path: &Path, quiet: bool) -> anyhow::Result<Status> {
    if !quiet {
        emit(format!("\nstats of {}:", path.display()))?;
        report::write_stats_text(&mut std::io::stdout().lock(), bank)?;
        emit("")?;
    }
    // The check's verdict is printed even when quiet: it is the result.
    let status = report::check_bank(bank, path, false)?;
    if !quiet {
        for tree in ["task", "env"] {
            emit("")?;
            let selection = super::draw_scope::whole_tree(bank, tree)?;
            emit(draw::draw_tree(bank, &selection)?.trim_end())?;
        }
        emit("")?;
    }
    Ok(status)
}

fn summarise(tally: &Tally, started: Instant) -> anyhow::Result<()> {
    let consolidated: Vec<String> = tally
        .consolidations
        .iter()
        .map(|(source, root)| format!("#{source} -> #{root}"))
        .collect();
    emit(format!(
        "demo done in {} ms: {} episodes, {} roots, {} residuals ({} beside a node at D_max), \
         {} failure records, {} skipped writes, {} success hits, {} consolidation(s) [{}]",
        started.elapsed().as_millis(),
        EPISODES.len(),
        tally.roots,
        tally.residuals,
        tally.siblings,
        tally.failures,
        tally.skips,
        tally.hits,
        tally.consolidations.len(),
        consolidated.join(", ")
    ))
}

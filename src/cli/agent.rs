//! `embed`, `retrieve`, `record`: the paper's memory loop from the command
//! line. They need the `agent` feature (ONNX Runtime, the LLM client);
//! without it they explain how to get it. Configuration comes from the
//! environment (docs/AGENT.md): `DELTAMEM_ASSETS` / `DELTAMEM_EMBED_*` for
//! the embedder, `DELTAMEM_LLM_BASE_URL`, `_MODEL`, `_API_KEY` for the LLM.

use std::path::PathBuf;

use super::Status;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RoleArg {
    /// A retrieval query (E5-style models prepend their query prefix).
    Query,
    /// A stored node's text (E5-style models prepend their passage prefix).
    Passage,
}

#[derive(Debug, clap::Args)]
pub struct EmbedArgs {
    /// The text to embed.
    #[arg(long)]
    text: String,
    #[arg(long, value_enum, default_value_t = RoleArg::Query)]
    role: RoleArg,
}

#[derive(Debug, clap::Args)]
pub struct RetrieveArgs {
    bank: PathBuf,
    /// The task instruction (searched in the task tree).
    #[arg(long)]
    task: String,
    /// The environment description (searched in the env tree).
    #[arg(long)]
    env: String,
    /// Field descriptions and headers: alfworld, scienceworld, webshop, generic.
    #[arg(long, default_value = "scienceworld")]
    profile: String,
    /// Print the whole result as JSON instead of the prompt text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct RecordArgs {
    bank: PathBuf,
    /// The finished episode as JSON: task_text, env_text, trajectory,
    /// success, and the chains retrieved when it started (retrieved_task,
    /// retrieved_env); optional reward, steps, max_steps, id.
    #[arg(long, value_name = "FILE.json")]
    episode: PathBuf,
    /// Field descriptions and prompts: alfworld, scienceworld, webshop, generic.
    #[arg(long, default_value = "scienceworld")]
    profile: String,
    /// Print the whole outcome as JSON instead of a summary.
    #[arg(long)]
    json: bool,
}

#[cfg(not(feature = "agent"))]
mod disabled {
    use super::*;

    fn missing() -> anyhow::Result<Status> {
        anyhow::bail!(
            "this deltamem was built without the `agent` feature; rebuild with \
             `cargo build --release --features agent` after `tools/setup-agent-assets.sh`"
        )
    }

    pub fn embed(_: &EmbedArgs) -> anyhow::Result<Status> {
        missing()
    }
    pub fn retrieve(_: &RetrieveArgs) -> anyhow::Result<Status> {
        missing()
    }
    pub fn record(_: &RecordArgs) -> anyhow::Result<Status> {
        missing()
    }
}

#[cfg(not(feature = "agent"))]
pub use disabled::{embed, record, retrieve};

#[cfg(feature = "agent")]
mod enabled {
    use anyhow::Context;
    use deltamem::agent::{
        AgentConfig, ConsolidationOutcome, ConsolidationStatus, DomainProfile, Episode, HttpChat, MemoryLoop,
        OnnxEmbedder, RecordOutcome, TextRole, TreeWrite, WriteAction, embed_text,
        memory_loop::retrieve as retrieve_chains,
    };

    use super::super::write_json_line;
    use super::*;

    fn profile(name: &str) -> anyhow::Result<DomainProfile> {
        DomainProfile::by_name(name)
            .with_context(|| format!("unknown profile {name:?} (alfworld, scienceworld, webshop, generic)"))
    }

    fn embedder() -> anyhow::Result<OnnxEmbedder> {
        OnnxEmbedder::from_env().context("cannot load the embedding model (run tools/setup-agent-assets.sh?)")
    }

    pub fn embed(args: &EmbedArgs) -> anyhow::Result<Status> {
        let role = match args.role {
            RoleArg::Query => TextRole::Query,
            RoleArg::Passage => TextRole::Passage,
        };
        write_json_line(
            &mut std::io::stdout().lock(),
            &embed_text(&mut embedder()?, &args.text, role)?,
        )?;
        Ok(Status::Ok)
    }

    pub fn retrieve(args: &RetrieveArgs) -> anyhow::Result<Status> {
        for (flag, text) in [("--task", &args.task), ("--env", &args.env)] {
            if text.trim().is_empty() {
                anyhow::bail!("{flag} is empty: there is nothing to search for");
            }
        }
        let config = AgentConfig::new(&args.bank, profile(&args.profile)?);
        let found = retrieve_chains(&config, &mut embedder()?, &args.task, &args.env)
            .with_context(|| format!("retrieve from {}", args.bank.display()))?;
        if args.json {
            write_json_line(&mut std::io::stdout().lock(), &found)?;
        } else {
            print!("{}", found.context);
        }
        Ok(Status::Ok)
    }

    pub fn record(args: &RecordArgs) -> anyhow::Result<Status> {
        let text = std::fs::read_to_string(&args.episode)
            .with_context(|| format!("cannot read {}", args.episode.display()))?;
        // Strict: a misspelt key must not silently drop what it carried.
        let episode: Episode = deltamem::api::parse_object(&text)
            .with_context(|| format!("{} is not an episode", args.episode.display()))?;
        let chat = HttpChat::from_env().context("LLM endpoint (DELTAMEM_LLM_BASE_URL, DELTAMEM_LLM_MODEL)")?;
        let config = AgentConfig {
            lock_wait: super::super::lock_wait(),
            ..AgentConfig::new(&args.bank, profile(&args.profile)?)
        };
        let outcome = MemoryLoop::new(config, embedder()?, chat)
            .record(&episode)
            .with_context(|| format!("record {} into {}", args.episode.display(), args.bank.display()))?;
        if args.json {
            write_json_line(&mut std::io::stdout().lock(), &outcome)?;
        } else {
            super::super::emit(summary(&outcome).trim_end())?;
        }
        Ok(match &outcome.checkpoint_failure {
            None => Status::Ok,
            Some(why) => super::super::saved_checkpoint_failed(&args.bank, why),
        })
    }

    /// "task: residual, node 7, parent 3, depth 3" for one tree's write.
    fn write_line(w: &TreeWrite) -> String {
        let matched = w.matched.map_or(String::new(), |m| format!(" (matched node {m})"));
        match (w.action, w.node) {
            (WriteAction::Skip, _) | (_, None) => format!("{}: skip, nothing written{matched}", w.tree),
            (action, Some(node)) => {
                let parent = w.parent.map_or("no parent".to_string(), |p| format!("parent {p}"));
                let depth = w.depth.map_or(String::new(), |d| format!(", depth {d}"));
                let beside = match (w.beside_match, w.matched) {
                    (true, Some(m)) => format!(" (beside node {m}, which is at the depth limit)"),
                    _ => String::new(),
                };
                let action = if action == WriteAction::Root {
                    "root"
                } else {
                    "residual"
                };
                format!("{}: {action}, node {node}, {parent}{depth}{beside}", w.tree)
            }
        }
    }

    fn consolidation_text(c: &ConsolidationOutcome) -> String {
        match (c.status, c.new_root) {
            (ConsolidationStatus::Done, Some(root)) => format!("{} node {} into new root {root}", c.tree, c.node),
            (status, _) => format!(
                "{} node {} not consolidated ({}: {})",
                c.tree,
                c.node,
                match status {
                    ConsolidationStatus::AlreadyConsolidated => "already consolidated",
                    _ => "failed",
                },
                c.reason.as_deref().unwrap_or("no reason given")
            ),
        }
    }

    /// What `record` prints without `--json`: one line per tree, then the
    /// success hits and the consolidations.
    fn summary(outcome: &RecordOutcome) -> String {
        let hits: Vec<String> = outcome
            .success_hits
            .iter()
            .map(|h| {
                let due = if h.due { ", due for consolidation" } else { "" };
                format!("{} node {} now {}{due}", h.tree, h.node, h.success_hits)
            })
            .collect();
        let consolidations: Vec<String> = outcome.consolidations.iter().map(consolidation_text).collect();
        let or_none = |v: Vec<String>| if v.is_empty() { "none".to_string() } else { v.join("; ") };
        format!(
            "{}\n{}\nsuccess hits: {}\nconsolidations: {}\n",
            write_line(&outcome.task),
            write_line(&outcome.env),
            or_none(hits),
            or_none(consolidations)
        )
    }
}

#[cfg(feature = "agent")]
pub use enabled::{embed, record, retrieve};

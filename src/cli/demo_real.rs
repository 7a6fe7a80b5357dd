//! `deltamem demo` on real data (feature `agent`, assets present): the
//! ScienceWorld run recorded in the reference banks, replayed through the
//! real memory loop.
//!
//! Each recorded episode (task text, room text, outcome, in creation
//! order) is retrieved for with real MiniLM embeddings and recorded with
//! `MemoryLoop::record`; the LLM is a [`ReplayChat`] answering each
//! extraction prompt with what the run's LLM wrote for that episode, so no
//! network or LLM server is involved. The trees that come out are drawn and
//! compared with the tree the reference implementation built from the same
//! episodes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use deltamem::agent::memory_loop::ConsolidationStatus;
use deltamem::agent::{
    AgentConfig, DomainProfile, Embedder, Episode, MemoryLoop, OnnxEmbedder, RecordOutcome, ReplayChat, Retrieval,
    TreeKind, TreeWrite, WriteAction,
};
use deltamem::interop::reference::{ReferenceTree, parse_reference};
use deltamem::{Bank, BankConfig, Label, SyncPolicy, TreeSpec};

use super::picture::{TreePicture, one_line, tree_svg};
use super::{Status, draw, emit, report};

const TASK_FILE: &str = "sciworld_qwen3-8b_dev_task.json";
const ENV_FILE: &str = "sciworld_qwen3-8b_dev_env.json";
/// The recorded run travels inside the binary, so the demo works from any
/// directory.
const TASK_BYTES: &[u8] = include_bytes!("../../tests/fixtures/reference/sciworld_qwen3-8b_dev_task.json");
const ENV_BYTES: &[u8] = include_bytes!("../../tests/fixtures/reference/sciworld_qwen3-8b_dev_env.json");

/// Thresholds chosen for MiniLM on these texts (the reference run used
/// e5-base-v2, whose cosines run higher). Task texts of one task type
/// score 0.67-1.0 against each other, so tau 0.55 groups each type under
/// one root. Room descriptions share one template and any two score
/// 0.57-1.0, so the env tree needs tau 0.75 to keep rooms apart.
const TASK_TAU: f32 = 0.55;
const ENV_TAU: f32 = 0.75;
/// The run has 30 episodes in a handful of task types: D_max 3 makes the
/// longest chains meet the depth limit in both trees.
const MAX_DEPTH: u8 = 3;
/// Only 4 of the 30 episodes succeeded, and only residual nodes are ever
/// consolidated (a root is already self-contained), so a node is
/// consolidated at its first success hit; with 2, none would be due.
const CONSOLIDATE_AFTER: u32 = 1;
/// Trees of `tests/fixtures/reference/` record no trajectories; `record`
/// needs a non-empty one, and the replayed answers stand in for reading it.
const NO_TRAJECTORY: &str =
    "(not recorded in the reference banks; the replayed answers stand in for the LLM that read it)";
/// Scenario characters shown per episode line.
const LINE_TASK_CHARS: usize = 46;
/// Scenario characters per node in the SVG pictures.
const SVG_LABEL_CHARS: usize = 40;

/// One episode of the recorded run.
struct Recorded {
    id: String,
    task_text: String,
    env_text: String,
    success: bool,
}

/// The recorded run: its episodes, and both reference trees for the
/// comparison.
struct Run {
    episodes: Vec<Recorded>,
    task: ReferenceTree,
    env: ReferenceTree,
    /// Per tree, episode index by reference node index.
    task_episode: Vec<usize>,
    env_episode: Vec<usize>,
}

/// The embedder, or why the real demo cannot run.
pub fn embedder() -> Result<OnnxEmbedder, String> {
    OnnxEmbedder::from_env().map_err(|e| format!("the MiniLM assets are not usable ({e})"))
}

/// Node indices of `tree` in creation order.
fn creation_order(tree: &ReferenceTree) -> Vec<usize> {
    let mut order: Vec<usize> = (0..tree.nodes.len()).collect();
    order.sort_by_key(|&i| (tree.nodes[i].created_unix_ms, tree.nodes[i].file_position));
    order
}

/// Pairs the task and env nodes into episodes (the n-th created of each).
fn load_run() -> anyhow::Result<Run> {
    let task = parse_reference(TASK_BYTES, TASK_FILE)?;
    let env = parse_reference(ENV_BYTES, ENV_FILE)?;
    let (task_order, env_order) = (creation_order(&task), creation_order(&env));
    anyhow::ensure!(
        task_order.len() == env_order.len(),
        "{TASK_FILE} has {} episodes but {ENV_FILE} has {}",
        task_order.len(),
        env_order.len()
    );
    let mut episodes = Vec::with_capacity(task_order.len());
    let mut task_episode = vec![0; task.nodes.len()];
    let mut env_episode = vec![0; env.nodes.len()];
    for (n, (&t, &e)) in task_order.iter().zip(&env_order).enumerate() {
        let (tn, en) = (&task.nodes[t], &env.nodes[e]);
        anyhow::ensure!(
            tn.created_unix_ms == en.created_unix_ms && tn.label == en.label,
            "episode {}: task node {} and env node {} differ in time or outcome",
            n + 1,
            tn.node_id,
            en.node_id
        );
        task_episode[t] = n;
        env_episode[e] = n;
        episodes.push(Recorded {
            id: format!("ep{:02}-{}", n + 1, short_id(&tn.node_id)),
            task_text: tn.payload.scenario.clone(),
            env_text: en.payload.scenario.clone(),
            success: tn.label == Label::Success,
        });
    }
    Ok(Run {
        episodes,
        task,
        env,
        task_episode,
        env_episode,
    })
}

fn short_id(uuid: &str) -> &str {
    uuid.get(..8).unwrap_or(uuid)
}

/// The recorded answers: a task node's fields as a skill, an env node's
/// `execution_procedure` (the legacy `content_body`) as `content`.
fn replay_model(run: &Run) -> ReplayChat {
    let mut chat = ReplayChat::new("replay:qwen3-8b (recorded ScienceWorld run)");
    for (tree, kind, by_node) in [
        (&run.task, TreeKind::Task, &run.task_episode),
        (&run.env, TreeKind::Env, &run.env_episode),
    ] {
        for (node, &episode) in tree.nodes.iter().zip(by_node) {
            let field = |k: &str| node.payload.fields.get(k).cloned().unwrap_or_default();
            let mut fields = BTreeMap::from([("activation_condition".to_string(), field("activation_condition"))]);
            match kind {
                TreeKind::Task => {
                    fields.insert("execution_procedure".into(), field("execution_procedure"));
                    fields.insert("termination_condition".into(), field("termination_condition"));
                }
                TreeKind::Env => {
                    fields.insert("content".into(), field("execution_procedure"));
                }
            }
            chat.add(&run.episodes[episode].id, kind, fields);
        }
    }
    chat
}

fn bank_config(dim_count: usize) -> anyhow::Result<BankConfig> {
    let mut config = BankConfig::new(u32::try_from(dim_count).context("embedding dimension")?);
    config.trees = vec![
        TreeSpec {
            name: "task".into(),
            tau: TASK_TAU,
        },
        TreeSpec {
            name: "env".into(),
            tau: ENV_TAU,
        },
    ];
    config.max_depth = MAX_DEPTH;
    config.consolidate_after = CONSOLIDATE_AFTER;
    Ok(config)
}

/// "Your task is to boil water. ..." as "boil water. ...", on one line.
fn task_gist(text: &str) -> String {
    let flat = one_line(text, usize::MAX);
    let gist = flat
        .split_once("Your task is to ")
        .map_or(flat.as_str(), |(_, rest)| rest);
    one_line(gist, LINE_TASK_CHARS)
}

/// The room's name from "This room is called the kitchen. ...".
fn room_gist(text: &str) -> String {
    let flat = one_line(text, usize::MAX);
    let room = flat
        .strip_prefix("This room is called the ")
        .and_then(|rest| rest.split('.').next());
    one_line(room.unwrap_or(&flat), 14)
}

/// "#0>#4 0.731" for a retrieval (chain and score), "no match" for none.
fn retrieved(found: Option<&deltamem::agent::MatchedChain>) -> String {
    match found {
        None => "no match".to_string(),
        Some(m) => {
            let chain: Vec<String> = m.chain.iter().map(|i| format!("#{i}")).collect();
            format!("{} {:.3}", chain.join(">"), m.score)
        }
    }
}

/// "residual #7 d3 (beside #4)" for one tree's write.
fn action(write: &TreeWrite) -> String {
    let node = write.node.map_or(String::new(), |n| format!(" #{n}"));
    let depth = write.depth.map_or(String::new(), |d| format!(" d{d}"));
    let what = match write.action {
        WriteAction::Root => "ROOT",
        WriteAction::Residual => "residual",
        WriteAction::Skip => "skip",
    };
    let beside = match (write.beside_match, write.matched) {
        (true, Some(m)) => format!(" (beside #{m}: D_max)"),
        _ => String::new(),
    };
    format!("{what}{node}{depth}{beside}")
}

fn episode_line(n: usize, ep: &Recorded, found: &Retrieval, out: &RecordOutcome) -> String {
    let mut line = format!(
        "{:>2} {} {:<w$} | task {} -> {} | env {:<14} {} -> {}",
        n + 1,
        if ep.success { "SUCCESS" } else { "FAILURE" },
        task_gist(&ep.task_text),
        retrieved(found.task.as_ref()),
        action(&out.task),
        room_gist(&ep.env_text),
        retrieved(found.env.as_ref()),
        action(&out.env),
        w = LINE_TASK_CHARS
    );
    for c in &out.consolidations {
        let result = match (c.status, c.new_root) {
            (ConsolidationStatus::Done, Some(root)) => format!("new root #{root}"),
            _ => format!("{:?}: {}", c.status, c.reason.clone().unwrap_or_default()),
        };
        line.push_str(&format!(" | consolidated {} #{} -> {result}", c.tree, c.node));
    }
    line
}

/// What the replay produced, per tree: which episode wrote each node.
#[derive(Default)]
struct Written {
    /// Node index -> episode index (consolidated roots are absent).
    episode_of: BTreeMap<u32, usize>,
    /// Per episode: the parent node of its task and env nodes.
    task_parent: Vec<Option<u32>>,
    env_parent: Vec<Option<u32>>,
    consolidations: usize,
}

impl Written {
    fn note(&mut self, n: usize, out: &RecordOutcome) {
        for (write, parents) in [(&out.task, &mut self.task_parent), (&out.env, &mut self.env_parent)] {
            if let Some(node) = write.node {
                self.episode_of.insert(node, n);
            }
            parents.push(write.parent);
        }
        self.consolidations += out
            .consolidations
            .iter()
            .filter(|c| c.status == ConsolidationStatus::Done)
            .count();
    }
}

fn announce(path: &Path, embedder: &OnnxEmbedder, run: &Run) -> anyhow::Result<()> {
    let episodes = run.episodes.len();
    let successes = run.episodes.iter().filter(|e| e.success).count();
    emit(format!(
        "deltamem demo: bank in {}\n\
         Real data: the {episodes} episodes of a ScienceWorld dev run (Qwen3-8B) recorded by the \
         DeltaMem reference implementation (tests/fixtures/reference/), in the order they happened.\n\
         Real embeddings: {} ({} dimensions), computed now for every task and room text.\n\
         REPLAYED LLM: no model is called. Each extraction prompt is answered with the entry the \
         recorded run's LLM wrote for that episode; the run never distilled, so a consolidation \
         prompt is answered by joining the chain's entries unchanged (and the entry says so).\n\
         Demo settings: task tau {TASK_TAU}, env tau {ENV_TAU}, eps 0.05, D_max {MAX_DEPTH}, \
         K_cons {CONSOLIDATE_AFTER} (only {successes} of the {episodes} episodes succeeded).\n\
         Per episode: outcome, task | task tree: retrieved chain and score -> action | env tree: \
         room, retrieved chain and score -> action | consolidations\n",
        path.display(),
        embedder.model_id(),
        embedder.dim()
    ))
}

/// Runs the real demo in `path` (a new directory).
pub fn run_in(path: &Path, embedder: OnnxEmbedder, quiet: bool) -> anyhow::Result<Status> {
    let started = Instant::now();
    let run = load_run()?;
    if !quiet {
        announce(path, &embedder, &run)?;
    }
    Bank::create_dir(path, bank_config(embedder.dim())?)?
        .close()
        .with_context(|| format!("cannot create the demo bank in {}", path.display()))?;
    let mut config = AgentConfig::new(path, DomainProfile::scienceworld());
    config.stored_trajectory_chars = 0;
    // A demo bank is thrown away: no fsync per episode (close still
    // checkpoints durably).
    config.sync = SyncPolicy::None;
    let mut memory = MemoryLoop::new(config, embedder, replay_model(&run));
    let mut written = Written::default();
    for (n, ep) in run.episodes.iter().enumerate() {
        let found = memory
            .retrieve(&ep.task_text, &ep.env_text)
            .with_context(|| format!("episode {}: retrieve", n + 1))?;
        let mut episode = Episode::new(&ep.task_text, &ep.env_text, NO_TRAJECTORY, ep.success).with_retrieval(&found);
        episode.id = Some(ep.id.clone());
        let out = memory
            .record(&episode)
            .with_context(|| format!("episode {}: record", n + 1))?;
        if !quiet {
            emit(episode_line(n, ep, &found, &out))?;
        }
        written.note(n, &out);
    }
    let bank = super::open_read(path)?;
    let status = report::check_bank(&bank, path, false)?;
    if !quiet {
        show_trees(&bank)?;
        compare(&bank, &run, &written)?;
    }
    emit(format!(
        "real demo done in {} ms: {} episodes replayed, {} consolidation(s)",
        started.elapsed().as_millis(),
        run.episodes.len(),
        written.consolidations
    ))?;
    Ok(status)
}

/// Where the SVG pictures go: a fixed folder under the system temp dir,
/// overwritten by each run (the bank itself may be temporary).
fn picture_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join("deltamem-demo-pictures");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

fn show_trees(bank: &Bank) -> anyhow::Result<()> {
    let dir = picture_dir()?;
    for tree in ["task", "env"] {
        emit("")?;
        let selection = super::draw_scope::whole_tree(bank, tree)?;
        emit(draw::draw_tree(bank, &selection)?.trim_end())?;
        let svg = tree_svg(&TreePicture::load(bank, selection, SVG_LABEL_CHARS)?, SVG_LABEL_CHARS);
        let file = dir.join(format!("{tree}.svg"));
        std::fs::write(&file, svg).with_context(|| format!("cannot write {}", file.display()))?;
        emit(format!("(tree {tree} drawn as SVG: {})", file.display()))?;
    }
    Ok(())
}

/// "d1 8, d2 12, d3 10" from per-depth counts.
fn histogram(counts: &[u64]) -> String {
    let parts: Vec<String> = counts
        .iter()
        .enumerate()
        .filter(|(_, c)| **c > 0)
        .map(|(d, c)| format!("d{} {c}", d + 1))
        .collect();
    parts.join(", ")
}

fn reference_histogram(tree: &ReferenceTree) -> Vec<u64> {
    let mut counts = vec![0; tree.max_depth() as usize];
    for n in &tree.nodes {
        counts[n.depth as usize - 1] += 1;
    }
    counts
}

/// Episodes whose node hangs under the same episode's node (or is a root)
/// in both trees.
fn same_parent(reference: &ReferenceTree, by_node: &[usize], ours: &[Option<u32>], written: &Written) -> usize {
    let mut reference_parent = vec![None; ours.len()];
    for (node, &episode) in reference.nodes.iter().zip(by_node) {
        reference_parent[episode] = node.parent.map(|p| by_node[p]);
    }
    ours.iter()
        .zip(&reference_parent)
        .filter(|(mine, theirs)| match mine {
            None => theirs.is_none(),
            Some(p) => written.episode_of.get(p).copied() == **theirs,
        })
        .count()
}

fn compare(bank: &Bank, run: &Run, written: &Written) -> anyhow::Result<()> {
    let stats = bank.stats()?;
    emit("\nthis replay (MiniLM) against the reference implementation's tree (e5-base-v2), same episodes:")?;
    for (name, reference, by_node, parents) in [
        ("task", &run.task, &run.task_episode, &written.task_parent),
        ("env", &run.env, &run.env_episode, &written.env_parent),
    ] {
        let ours = stats
            .trees
            .iter()
            .find(|t| t.name == name)
            .context("demo tree missing")?;
        let reference_roots = reference.nodes.iter().filter(|n| n.parent.is_none()).count();
        emit(format!(
            "  {name:<4} this replay: {} roots ({} from consolidation), {} residuals, depth {} \
             [{}]\n       reference:   {reference_roots} roots, {} residuals, depth {} [{}]\n       \
             same parent episode as the reference: {} of {} episodes",
            ours.roots,
            ours.consolidated_roots,
            ours.residuals,
            ours.depth_histogram.iter().rposition(|c| *c > 0).map_or(0, |d| d + 1),
            histogram(&ours.depth_histogram),
            reference.nodes.len() - reference_roots,
            reference.max_depth(),
            histogram(&reference_histogram(reference)),
            same_parent(reference, by_node, parents, written),
            parents.len()
        ))?;
    }
    Ok(())
}

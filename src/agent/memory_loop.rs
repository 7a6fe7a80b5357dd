//! The online memory loop of the paper: `retrieve` before an episode,
//! `record` after it (SEMANTICS.md "Write decision", "Success hits and
//! consolidation").
//!
//! `record` never holds the bank's writer lock across an LLM call:
//! 1. read-only snapshot: check the chains the episode carries, render them;
//! 2. embed the scenario texts, ask the LLM for one entry per tree; any
//!    failure here returns an error and the bank is untouched;
//! 3. commit: insert the new nodes, both in one WAL record
//!    (`Attach::Parent` of the deepest node of the chain retrieved at the
//!    episode's start, the bank applying the D_max sibling rule, or
//!    `Attach::Root`), count retrievals on every node of each used chain
//!    (one record) and, on success, a hit on each tree's matched node even
//!    if that tree's write was skipped; snapshot every node that just
//!    became due for consolidation;
//! 4. per due node: ask the LLM to distill the snapshot, then commit with
//!    `Bank::consolidate`, which refuses cleanly if the node was
//!    consolidated meanwhile. A failed distillation changes nothing and is
//!    reported in the outcome.
//!
//! The bank steps go through a [`BankStore`]: on a directory (the CLI, the
//! Python binding) the writer lock is taken per commit; on a server's bank
//! (`record_in`) the commits join the server's write queue.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::json;
use thiserror::Error;

use super::embed::{EmbedError, Embedder, TextRole};
use super::llm::{ChatModel, LlmError, PromptPurpose};
use super::prompts::{
    DomainProfile, EpisodeView, PromptKind, TreeKind, distill_messages, extraction_messages, fields_from_reply,
    render_for_distill, shorten_trajectory,
};
use super::reply::ReplyError;
use super::store::{BankStore, DirStore};
use crate::bank::{Attach, Bank, BankError, Change, ChangeAck, InsertAck, NewNode, NodeRef, QueryOptions};
use crate::format::payload::Payload;
use crate::format::row::Label;
use crate::{SyncPolicy, TreeSpec};

#[derive(Debug, Error)]
pub enum AgentError {
    #[error(transparent)]
    Bank(#[from] BankError),
    #[error(transparent)]
    Embed(#[from] EmbedError),
    #[error("{prompt} prompt: {source}")]
    Llm {
        prompt: &'static str,
        #[source]
        source: LlmError,
    },
    #[error("{prompt} prompt: unusable reply: {source}")]
    Reply {
        prompt: &'static str,
        #[source]
        source: ReplyError,
    },
    #[error("bad episode: {0}")]
    BadEpisode(String),
    #[error("configuration: {0}")]
    Config(String),
    /// The bank store refused (a server's write queue full, read-only,
    /// shutting down); the face downcasts it back to its own error.
    #[error("{0}")]
    Store(Box<dyn std::error::Error + Send + Sync>),
}

#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The bank directory (created beforehand with `Bank::create_dir` or
    /// `deltamem init`, with the embedder's dimension).
    pub bank: PathBuf,
    /// Tree holding skills; queried with the task text.
    pub task_tree: String,
    /// Tree holding scene knowledge; queried with the env text.
    pub env_tree: String,
    pub profile: DomainProfile,
    /// Let retrieval match nodes already consolidated (the reference's
    /// behaviour; off by default, see SEMANTICS.md).
    pub include_consolidated: bool,
    /// Trajectory characters shown to the LLM; longer ones keep their
    /// start and end.
    pub prompt_trajectory_chars: usize,
    /// Store the raw trajectory in the node payload (field `trajectory`,
    /// never rendered into prompts), shortened to this many characters;
    /// 0 stores none.
    pub stored_trajectory_chars: usize,
    /// Shown in prompts as "N of at most M steps" when the episode has no
    /// `max_steps` of its own.
    pub max_steps: Option<u32>,
    pub sync: SyncPolicy,
    /// How long to wait for another process's writer lock.
    pub lock_wait: Duration,
    /// Asked between tries for the writer lock; the wait stops (with the
    /// lock's error) once it returns true. The Python binding checks for
    /// Ctrl-C here, so a 30 s wait does not outlast it.
    pub interrupted: Option<fn() -> bool>,
}

impl AgentConfig {
    pub fn new(bank: impl Into<PathBuf>, profile: DomainProfile) -> AgentConfig {
        AgentConfig {
            bank: bank.into(),
            task_tree: "task".into(),
            env_tree: "env".into(),
            profile,
            include_consolidated: false,
            prompt_trajectory_chars: 24_000,
            stored_trajectory_chars: 1_000_000,
            max_steps: None,
            sync: SyncPolicy::Always,
            lock_wait: Duration::from_secs(30),
            interrupted: None,
        }
    }

    /// The paper's two trees (task, env) for a new bank, with the
    /// thresholds of Table 4 for `benchmark` (alfworld, scienceworld,
    /// webshop; anything else gets ScienceWorld's).
    pub fn paper_trees(benchmark: &str) -> (Vec<TreeSpec>, u32) {
        let (task_tau, env_tau, k_cons) = match benchmark.to_ascii_lowercase().as_str() {
            "alfworld" => (0.75, 0.85, 5),
            "webshop" => (0.85, 0.85, 3),
            _ => (0.82, 0.82, 3),
        };
        (
            vec![
                TreeSpec {
                    name: "task".into(),
                    tau: task_tau,
                },
                TreeSpec {
                    name: "env".into(),
                    tau: env_tau,
                },
            ],
            k_cons,
        )
    }
}

/// The best match of one tree and its chain.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MatchedChain {
    pub tree: String,
    /// v*: the best node at or above the tree's threshold.
    pub node: u32,
    pub score: f32,
    pub depth: u8,
    /// "ROOT" or "RESIDUAL".
    pub node_type: String,
    /// "SUCCESS" or "FAILURE".
    pub label: String,
    /// Root first, ending with `node`.
    pub chain: Vec<u32>,
    /// The chain as prompt text.
    pub rendered: String,
}

/// What `retrieve` found.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Retrieval {
    /// Both rendered chains, task first, each under a heading, after the
    /// profile's memory header; empty when neither tree matched.
    pub context: String,
    pub task: Option<MatchedChain>,
    pub env: Option<MatchedChain>,
}

/// One finished episode, as `record` takes it (and as the CLI reads it
/// from JSON).
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Episode {
    /// Caller's id, kept in provenance.
    #[serde(default)]
    pub id: Option<String>,
    /// Not blank (`check_episode`), nor are the two below.
    #[cfg_attr(feature = "schema", schemars(regex(pattern = r"\S")))]
    pub task_text: String,
    #[cfg_attr(feature = "schema", schemars(regex(pattern = r"\S")))]
    pub env_text: String,
    #[cfg_attr(feature = "schema", schemars(regex(pattern = r"\S")))]
    pub trajectory: String,
    pub success: bool,
    #[serde(default)]
    pub reward: Option<f64>,
    #[serde(default)]
    pub steps: Option<u32>,
    #[serde(default)]
    pub max_steps: Option<u32>,
    /// The task chain retrieved when the episode started (node ids, root
    /// first); None or empty when nothing matched.
    #[serde(default)]
    pub retrieved_task: Option<Vec<u32>>,
    #[serde(default)]
    pub retrieved_env: Option<Vec<u32>>,
}

impl Episode {
    pub fn new(
        task_text: impl Into<String>,
        env_text: impl Into<String>,
        trajectory: impl Into<String>,
        success: bool,
    ) -> Episode {
        Episode {
            id: None,
            task_text: task_text.into(),
            env_text: env_text.into(),
            trajectory: trajectory.into(),
            success,
            reward: None,
            steps: None,
            max_steps: None,
            retrieved_task: None,
            retrieved_env: None,
        }
    }

    /// Carries the chains of a retrieval made at the episode's start.
    pub fn with_retrieval(mut self, retrieval: &Retrieval) -> Episode {
        self.retrieved_task = retrieval.task.as_ref().map(|m| m.chain.clone());
        self.retrieved_env = retrieval.env.as_ref().map(|m| m.chain.clone());
        self
    }
}

#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteAction {
    Root,
    Residual,
    Skip,
}

/// What happened to one tree.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TreeWrite {
    pub tree: String,
    pub action: WriteAction,
    /// The prompt kind used (`task-residual-success`, ...).
    pub prompt: String,
    /// The matched node v* the decision was based on.
    pub matched: Option<u32>,
    /// The new node (None on skip).
    pub node: Option<u32>,
    pub parent: Option<u32>,
    pub depth: Option<u8>,
    pub label: Option<String>,
    /// The new node went beside v* (v* sat at the maximum depth).
    pub beside_match: bool,
}

#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HitCount {
    pub tree: String,
    pub node: u32,
    pub success_hits: u32,
    /// The node is (now) due for consolidation.
    pub due: bool,
}

#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConsolidationStatus {
    /// A new consolidated root was written and the node flagged.
    Done,
    /// Someone else consolidated the node while the LLM was distilling:
    /// nothing written.
    AlreadyConsolidated,
    /// The distillation failed (LLM error, unusable reply): nothing
    /// written; `consolidate_due` can retry later.
    Failed,
}

#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConsolidationOutcome {
    pub tree: String,
    pub node: u32,
    pub status: ConsolidationStatus,
    pub new_root: Option<u32>,
    pub reason: Option<String>,
}

/// What `record` did.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordOutcome {
    pub task: TreeWrite,
    pub env: TreeWrite,
    /// Nodes whose `retrievals` went up by one (both chains).
    pub retrievals_counted: Vec<u32>,
    /// Success hits counted (successful episodes only).
    pub success_hits: Vec<HitCount>,
    pub consolidations: Vec<ConsolidationOutcome>,
    /// Set when the checkpoint after the episode's commit failed. The
    /// episode is saved all the same (durable in the WAL, recovered by the
    /// next open): do not record it again. Consolidations were not tried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_failure: Option<String>,
}

/// A vector and what made it, for `deltamem embed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Embedding {
    pub model: String,
    pub dim: usize,
    pub vector: Vec<f32>,
}

/// Embeds one text (the `embed` command's library side).
pub fn embed_text(embedder: &mut dyn Embedder, text: &str, role: TextRole) -> Result<Embedding, AgentError> {
    let vector = embedder.embed(text, role)?;
    Ok(Embedding {
        model: embedder.model_id(),
        dim: vector.len(),
        vector,
    })
}

/// Searches both trees of `config.bank` (opened read-only: works while a
/// writer runs) with the task text and the env text, and renders the
/// matched chains into a prompt context. Needs no LLM; counts nothing
/// (`record` counts the retrievals of the chains an episode used). This is
/// the `retrieve` command's library side.
pub fn retrieve(
    config: &AgentConfig,
    embedder: &mut dyn Embedder,
    task_text: &str,
    env_text: &str,
) -> Result<Retrieval, AgentError> {
    let bank = DirStore::new(config).open_reader()?;
    retrieve_in(&bank, config, embedder, task_text, env_text)
}

/// `retrieve` on a bank the caller has open (the server's own handle);
/// `config.bank` is not used.
pub fn retrieve_in(
    bank: &Bank,
    config: &AgentConfig,
    embedder: &mut dyn Embedder,
    task_text: &str,
    env_text: &str,
) -> Result<Retrieval, AgentError> {
    check_dim(bank, embedder)?;
    let task = best_match(config, embedder, bank, &config.task_tree, task_text)?;
    let env = best_match(config, embedder, bank, &config.env_tree, env_text)?;
    let context = render_context(&config.profile, task.as_ref(), env.as_ref());
    Ok(Retrieval { context, task, env })
}

fn best_match(
    config: &AgentConfig,
    embedder: &mut dyn Embedder,
    bank: &Bank,
    tree: &str,
    text: &str,
) -> Result<Option<MatchedChain>, AgentError> {
    if text.trim().is_empty() {
        return Err(AgentError::Embed(EmbedError::EmptyText { index: 0 }));
    }
    let query = embedder.embed(text, TextRole::Query)?;
    let options = QueryOptions {
        k: 1,
        include_consolidated: config.include_consolidated,
        ..QueryOptions::default()
    };
    let Some(m) = bank.query(tree, &query, &options)?.into_iter().next() else {
        return Ok(None);
    };
    Ok(Some(MatchedChain {
        tree: tree.to_string(),
        node: m.id,
        score: m.score,
        depth: m.depth,
        node_type: m.node_type.as_str().to_string(),
        label: m.label.as_str().to_string(),
        rendered: bank.render_chain(m.id)?,
        chain: m.chain,
    }))
}

/// The memory header, then each matched chain under its heading, task
/// first; empty when neither tree matched.
fn render_context(profile: &DomainProfile, task: Option<&MatchedChain>, env: Option<&MatchedChain>) -> String {
    if task.is_none() && env.is_none() {
        return String::new();
    }
    let mut out = profile.memory_header.trim().to_string();
    out.push_str("\n\n");
    if let Some(t) = task {
        out.push_str("=== Task skill memory ===\n");
        out.push_str(t.rendered.trim_end());
        out.push_str("\n\n");
    }
    if let Some(e) = env {
        out.push_str("=== Environment knowledge memory ===\n");
        out.push_str(e.rendered.trim_end());
        out.push('\n');
    }
    out.trim_end().to_string() + "\n"
}

fn check_dim(bank: &Bank, embedder: &dyn Embedder) -> Result<(), AgentError> {
    let (bank_dim, model_dim) = (bank.dim_count() as usize, embedder.dim());
    if bank_dim != model_dim {
        return Err(AgentError::Config(format!(
            "the bank stores {bank_dim}-dimensional vectors but the embedder ({}) makes {model_dim}",
            embedder.model_id()
        )));
    }
    Ok(())
}

/// One tree's state for `record`, from the read-only snapshot.
struct TreePlan {
    tree: String,
    kind: TreeKind,
    /// The chain retrieved at the episode's start, validated.
    chain: Option<Vec<u32>>,
    rendered: Option<String>,
    scenario: String,
}

impl TreePlan {
    fn matched(&self) -> Option<u32> {
        self.chain.as_ref().and_then(|c| c.last().copied())
    }
}

/// A node due for consolidation, snapshotted under the writer.
struct DueSnapshot {
    tree: String,
    kind: TreeKind,
    node: u32,
    scenario: String,
    chain: Vec<u32>,
    rendered: String,
}

/// The memory loop: a bank, an embedder, an LLM and the configuration.
pub struct MemoryLoop {
    config: AgentConfig,
    embedder: Box<dyn Embedder + Send>,
    llm: Box<dyn ChatModel + Send>,
}

impl std::fmt::Debug for MemoryLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryLoop")
            .field("config", &self.config)
            .field("embedder", &self.embedder.model_id())
            .field("llm", &self.llm.model_id())
            .finish()
    }
}

impl MemoryLoop {
    pub fn new(
        config: AgentConfig,
        embedder: impl Embedder + Send + 'static,
        llm: impl ChatModel + Send + 'static,
    ) -> MemoryLoop {
        MemoryLoop {
            config,
            embedder: Box::new(embedder),
            llm: Box::new(llm),
        }
    }

    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    pub fn config_mut(&mut self) -> &mut AgentConfig {
        &mut self.config
    }

    pub fn embedder_mut(&mut self) -> &mut dyn Embedder {
        &mut *self.embedder
    }

    /// Searches both trees; see [`retrieve`].
    pub fn retrieve(&mut self, task_text: &str, env_text: &str) -> Result<Retrieval, AgentError> {
        retrieve(&self.config, &mut *self.embedder, task_text, env_text)
    }

    /// Records a finished episode into `config.bank`: extraction, write
    /// decision, counters, consolidation (see the module documentation for
    /// the order). An error before the write phase leaves the bank
    /// unchanged.
    pub fn record(&mut self, episode: &Episode) -> Result<RecordOutcome, AgentError> {
        let store = DirStore::new(&self.config);
        self.record_in(&store, episode)
    }

    /// `record` on any [`BankStore`] (a server's own bank); `config.bank`
    /// is not used.
    pub fn record_in(&mut self, store: &impl BankStore, episode: &Episode) -> Result<RecordOutcome, AgentError> {
        // 1. Snapshot.
        let (task_plan, env_plan) = store.read(|bank| {
            self.check_dim(bank)?;
            plan_both(bank, &self.config, episode)
        })?;

        // 2. Embeddings and extraction, no lock held.
        let vectors = self.embedder.embed_checked(
            &[task_plan.scenario.as_str(), env_plan.scenario.as_str()],
            TextRole::Passage,
        )?;
        let prompt_trajectory = shorten_trajectory(&episode.trajectory, self.config.prompt_trajectory_chars);
        let view = EpisodeView {
            task_text: &episode.task_text,
            env_text: &episode.env_text,
            trajectory: &prompt_trajectory,
            success: episode.success,
            steps: episode.steps,
            max_steps: episode.max_steps.or(self.config.max_steps),
            reward: episode.reward,
        };
        let task_kind = PromptKind::for_extraction(TreeKind::Task, task_plan.chain.is_some(), episode.success);
        let env_kind = PromptKind::for_extraction(TreeKind::Env, env_plan.chain.is_some(), episode.success);
        let episode_id = episode.id.as_deref();
        let task_fields = self.extract(task_kind, &view, &task_plan, episode_id)?;
        let env_fields = self.extract(env_kind, &view, &env_plan, episode_id)?;

        // 3. Commit.
        let task_label = if episode.success {
            Label::Success
        } else {
            Label::Failure
        };
        let task_node = self.new_node(&task_plan, task_kind, task_fields, task_label, &vectors[0], episode);
        let env_node = self.new_node(&env_plan, env_kind, env_fields, Label::Success, &vectors[1], episode);
        // The episode was checked already and its trajectory is shortened
        // to the configured length: a payload over the limit is the reply's.
        for (node, kind) in [(&task_node, task_kind), (&env_node, env_kind)] {
            let size_bytes = node.as_ref().map_or(0, |n| n.payload.size_bytes());
            if size_bytes > crate::format::MAX_PAYLOAD_BYTES {
                let limit_bytes = crate::format::MAX_PAYLOAD_BYTES;
                let source = ReplyError::TooLarge {
                    size_bytes,
                    limit_bytes,
                };
                return Err(AgentError::Reply {
                    prompt: kind.id(),
                    source,
                });
            }
        }
        // The whole episode is one WAL record: its new nodes, the retrieval
        // counts of the chains it used and its success hits. After a crash
        // all of it exists or none of it does.
        let mut used: Vec<u32> = Vec::new();
        for plan in [&task_plan, &env_plan] {
            used.extend(plan.chain.iter().flatten().copied());
        }
        let mut changes: Vec<Change> = task_node
            .iter()
            .chain(env_node.iter())
            .cloned()
            .map(Change::Insert)
            .collect();
        changes.push(Change::Retrievals(used.clone()));
        let hit_plans: Vec<&TreePlan> = if episode.success {
            [&task_plan, &env_plan]
                .into_iter()
                .filter(|p| p.matched().is_some())
                .collect()
        } else {
            Vec::new()
        };
        changes.extend(hit_plans.iter().filter_map(|p| p.matched()).map(Change::SuccessHit));
        let committed = store.commit(changes, |bank, acks| count_hits(bank, &hit_plans, acks))?;
        let mut inserted = committed
            .acks
            .iter()
            .filter_map(|a| if let ChangeAck::Inserted(a) = a { Some(a) } else { None });
        let task_ack = task_node.as_ref().and_then(|_| inserted.next());
        let env_ack = env_node.as_ref().and_then(|_| inserted.next());
        let task_write = tree_write(&task_plan, task_kind, task_ack, task_label);
        let env_write = tree_write(&env_plan, env_kind, env_ack, Label::Success);
        let (hits, due) = committed.after;

        // 4. Consolidation, lock released during each LLM call. Not after a
        // failed checkpoint: the disk that refused it would likely refuse
        // the consolidation's too, after a paid LLM call. The nodes stay
        // due, so `consolidate_due` distils them once the bank is healthy.
        let consolidations = match &committed.checkpoint_failure {
            None => due
                .into_iter()
                .map(|snapshot| self.consolidate(store, snapshot))
                .collect(),
            Some(_) => due.into_iter().map(not_attempted).collect(),
        };
        Ok(RecordOutcome {
            task: task_write,
            env: env_write,
            retrievals_counted: dedup(used),
            success_hits: hits,
            consolidations,
            checkpoint_failure: committed.checkpoint_failure,
        })
    }

    /// Distills every node of the two trees that is due for consolidation
    /// (for instance after a failed distillation), oldest first.
    pub fn consolidate_due(&mut self) -> Result<Vec<ConsolidationOutcome>, AgentError> {
        let store = DirStore::new(&self.config);
        let trees = [
            (self.config.task_tree.clone(), TreeKind::Task),
            (self.config.env_tree.clone(), TreeKind::Env),
        ];
        let snapshots = store.read(|bank| {
            let mut snapshots = Vec::new();
            for (tree, kind) in &trees {
                for node in bank.due_for_consolidation(Some(tree))? {
                    snapshots.push(snapshot_due(bank, tree, *kind, node)?);
                }
            }
            Ok(snapshots)
        })?;
        Ok(snapshots.into_iter().map(|s| self.consolidate(&store, s)).collect())
    }

    fn consolidate(&mut self, store: &impl BankStore, snapshot: DueSnapshot) -> ConsolidationOutcome {
        let kind = PromptKind::for_distill(snapshot.kind);
        let failed = |reason: String| ConsolidationOutcome {
            tree: snapshot.tree.clone(),
            node: snapshot.node,
            status: ConsolidationStatus::Failed,
            new_root: None,
            reason: Some(reason),
        };
        let messages = distill_messages(
            snapshot.kind,
            &self.config.profile,
            &snapshot.scenario,
            &snapshot.rendered,
        );
        let purpose = PromptPurpose {
            kind,
            episode: None,
            scenario: &snapshot.scenario,
            chain: Some(&snapshot.rendered),
        };
        let reply = match self.llm.answer(&purpose, &messages) {
            Ok(r) => r,
            Err(e) => return failed(format!("{} prompt: {e}", kind.id())),
        };
        let mut fields = match fields_from_reply(kind, &reply) {
            Ok(Some(f)) => f,
            Ok(None) => return failed(format!("{} prompt: the model answered skip", kind.id())),
            Err(e) => {
                return failed(format!("{} prompt: unusable reply: {e}", kind.id()));
            }
        };
        fields.insert(
            "provenance".into(),
            json!({
                "prompt": kind.id(),
                "extractor": self.llm.model_id(),
                "source": snapshot.node,
                "chain": snapshot.chain,
                "unix_ms": now_unix_ms(),
            })
            .to_string(),
        );
        // The episode is already recorded: a bank failure here is reported
        // in the outcome, not as an error that would invite a re-record.
        let outcome = |status, new_root, reason| ConsolidationOutcome {
            tree: snapshot.tree.clone(),
            node: snapshot.node,
            status,
            new_root,
            reason,
        };
        match store.consolidate(snapshot.node, fields) {
            // Saved: a checkpoint failing afterwards is said, not a failure.
            Ok(done) => outcome(
                ConsolidationStatus::Done,
                Some(done.after),
                done.checkpoint_failure
                    .map(|why| format!("saved; the checkpoint after it failed: {why}")),
            ),
            Err(AgentError::Bank(BankError::AlreadyConsolidated { root, .. })) => outcome(
                ConsolidationStatus::AlreadyConsolidated,
                None,
                Some(format!("consolidated meanwhile into root {root}; nothing written")),
            ),
            Err(e) => failed(format!("commit refused: {e}")),
        }
    }

    fn plan(
        bank: &Bank,
        tree: &str,
        kind: TreeKind,
        chain: Option<&[u32]>,
        scenario: &str,
        what: &str,
    ) -> Result<TreePlan, AgentError> {
        let tree_index = bank.tree_index(tree)?;
        let chain = chain.filter(|c| !c.is_empty());
        let (chain, rendered) = match chain {
            None => (None, None),
            Some(given) => {
                let last = *given.last().expect("non-empty");
                let bad = |detail: String| AgentError::BadEpisode(format!("{what} {given:?}: {detail}"));
                if last >= bank.node_count() {
                    return Err(bad(format!(
                        "node {last} does not exist (the bank has {} nodes)",
                        bank.node_count()
                    )));
                }
                if bank.row(last)?.tree != tree_index {
                    return Err(bad(format!("node {last} is not in tree {tree:?}")));
                }
                let actual = bank.chain(last)?;
                if actual != given {
                    return Err(bad(format!(
                        "not a root-to-node chain of this bank (the chain of {last} is {actual:?})"
                    )));
                }
                (Some(actual), Some(bank.render_chain(last)?))
            }
        };
        Ok(TreePlan {
            tree: tree.to_string(),
            kind,
            chain,
            rendered,
            scenario: scenario.trim().to_string(),
        })
    }

    fn extract(
        &self,
        kind: PromptKind,
        view: &EpisodeView<'_>,
        plan: &TreePlan,
        episode: Option<&str>,
    ) -> Result<Option<BTreeMap<String, String>>, AgentError> {
        let chain = plan.rendered.as_deref();
        let messages = extraction_messages(kind, &self.config.profile, view, chain);
        let purpose = PromptPurpose {
            kind,
            episode,
            scenario: &plan.scenario,
            chain,
        };
        let reply = self.llm.answer(&purpose, &messages).map_err(|source| AgentError::Llm {
            prompt: kind.id(),
            source,
        })?;
        fields_from_reply(kind, &reply).map_err(|source| AgentError::Reply {
            prompt: kind.id(),
            source,
        })
    }

    /// The node to insert for one tree (None on skip), with the raw
    /// trajectory and provenance added to the extracted fields.
    fn new_node(
        &self,
        plan: &TreePlan,
        kind: PromptKind,
        fields: Option<BTreeMap<String, String>>,
        label: Label,
        embedding: &[f32],
        episode: &Episode,
    ) -> Option<NewNode> {
        let mut fields = fields?;
        if self.config.stored_trajectory_chars > 0 {
            fields.insert(
                "trajectory".into(),
                shorten_trajectory(&episode.trajectory, self.config.stored_trajectory_chars),
            );
        }
        fields.insert(
            "provenance".into(),
            json!({
                "episode": episode.id,
                "prompt": kind.id(),
                "extractor": self.llm.model_id(),
                "embedder": self.embedder.model_id(),
                "outcome": if episode.success { "SUCCESS" } else { "FAILURE" },
                "reward": episode.reward,
                "steps": episode.steps,
                "unix_ms": now_unix_ms(),
            })
            .to_string(),
        );
        let attach = match plan.matched() {
            Some(node) => Attach::Parent(NodeRef::Index(node)),
            None => Attach::Root,
        };
        Some(NewNode {
            tree: plan.tree.clone(),
            attach,
            label,
            payload: Payload {
                scenario: plan.scenario.clone(),
                fields,
            },
            embedding: embedding.to_vec(),
            external_id: None,
        })
    }

    fn check_dim(&self, bank: &Bank) -> Result<(), AgentError> {
        check_dim(bank, &*self.embedder)
    }
}

/// The success hits of a commit (acks in `hit_plans` order), and a
/// snapshot of each node the commit made due. Only the hit that makes a
/// node due triggers a distillation; a failed one is not retried on every
/// later success (`consolidate_due` retries on request).
fn count_hits(
    bank: &Bank,
    hit_plans: &[&TreePlan],
    acks: &[ChangeAck],
) -> Result<(Vec<HitCount>, Vec<DueSnapshot>), AgentError> {
    let hit_acks = acks
        .iter()
        .filter_map(|a| if let ChangeAck::Hit(h) = a { Some(h) } else { None });
    let k_cons = bank.manifest().consolidate_after;
    let mut hits = Vec::new();
    let mut due = Vec::new();
    for (plan, ack) in hit_plans.iter().zip(hit_acks) {
        if ack.due && ack.success_hits == k_cons {
            due.push(snapshot_due(bank, &plan.tree, plan.kind, ack.id)?);
        }
        hits.push(HitCount {
            tree: plan.tree.clone(),
            node: ack.id,
            success_hits: ack.success_hits,
            due: ack.due,
        });
    }
    Ok((hits, due))
}

/// What was written to one tree; `ack` is None on skip.
fn tree_write(plan: &TreePlan, kind: PromptKind, ack: Option<&InsertAck>, label: Label) -> TreeWrite {
    let matched = plan.matched();
    TreeWrite {
        tree: plan.tree.clone(),
        action: match (ack, matched) {
            (None, _) => WriteAction::Skip,
            (Some(_), Some(_)) => WriteAction::Residual,
            (Some(_), None) => WriteAction::Root,
        },
        prompt: kind.id().into(),
        matched,
        node: ack.map(|a| a.id),
        parent: ack.and_then(|a| a.parent),
        depth: ack.map(|a| a.depth),
        label: ack.map(|_| label.as_str().into()),
        beside_match: ack.is_some_and(|a| matched.is_some() && a.parent != matched),
    }
}

fn snapshot_due(bank: &Bank, tree: &str, kind: TreeKind, node: u32) -> Result<DueSnapshot, AgentError> {
    let chain = bank.chain(node)?;
    let mut entries = Vec::with_capacity(chain.len());
    for &i in &chain {
        entries.push((bank.row(i)?.label == Label::Failure, bank.payload(i)?));
    }
    let refs: Vec<(bool, &Payload)> = entries.iter().map(|(f, p)| (*f, p)).collect();
    Ok(DueSnapshot {
        tree: tree.to_string(),
        kind,
        node,
        scenario: bank.payload(node)?.scenario,
        rendered: render_for_distill(&refs),
        chain,
    })
}

/// Checks `episode` as `record` does before its first LLM call (its
/// texts, its retrieved chains against `bank`), so a face can refuse bad
/// input before it needs an embedder or an LLM.
pub fn check_episode_input(bank: &Bank, config: &AgentConfig, episode: &Episode) -> Result<(), AgentError> {
    plan_both(bank, config, episode).map(drop)
}

/// Checks `episode` and plans both trees' updates.
fn plan_both(bank: &Bank, config: &AgentConfig, episode: &Episode) -> Result<(TreePlan, TreePlan), AgentError> {
    check_episode(episode)?;
    let task = MemoryLoop::plan(
        bank,
        &config.task_tree,
        TreeKind::Task,
        episode.retrieved_task.as_deref(),
        &episode.task_text,
        "retrieved_task",
    )?;
    let env = MemoryLoop::plan(
        bank,
        &config.env_tree,
        TreeKind::Env,
        episode.retrieved_env.as_deref(),
        &episode.env_text,
        "retrieved_env",
    )?;
    Ok((task, env))
}

fn check_episode(e: &Episode) -> Result<(), AgentError> {
    let bad = |m: &str| Err(AgentError::BadEpisode(m.to_string()));
    if e.task_text.trim().is_empty() {
        return bad("task_text is empty");
    }
    if e.env_text.trim().is_empty() {
        return bad("env_text is empty");
    }
    if e.trajectory.trim().is_empty() {
        return bad("trajectory is empty: there is nothing to learn from");
    }
    if e.reward.is_some_and(|r| !r.is_finite()) {
        return bad("reward is not a finite number");
    }
    Ok(())
}

/// A due node's distillation, left for `consolidate_due`.
fn not_attempted(snapshot: DueSnapshot) -> ConsolidationOutcome {
    ConsolidationOutcome {
        tree: snapshot.tree,
        node: snapshot.node,
        status: ConsolidationStatus::Failed,
        new_root: None,
        reason: Some("not attempted: the checkpoint after the episode failed; run consolidate_due later".into()),
    }
}

fn dedup(mut ids: Vec<u32>) -> Vec<u32> {
    let mut seen = std::collections::BTreeSet::new();
    ids.retain(|i| seen.insert(*i));
    ids
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

//! The extraction and consolidation prompts (SEMANTICS.md "Extraction
//! prompts", paper appendix C for the protocol), in this project's words.
//!
//! Eight prompt kinds: four for the task tree (root or residual, success or
//! failure), two for the env tree (root, residual; the outcome does not
//! matter there) and the consolidation prompt in a task and an env variant.
//! Residual prompts show the retrieved chain and accept `{"skip": true}`.
//! Task replies carry `activation_condition`, `execution_procedure`,
//! `termination_condition`; env replies `activation_condition`, `content`.
//!
//! What is specific to a benchmark (its action syntax, what a good trigger
//! names, how specific scene facts may be) lives in a [`DomainProfile`],
//! plain data: ALFWorld, ScienceWorld and WebShop profiles are built in and
//! others load from JSON.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::{Deserialize, Serialize};

use super::llm::ChatMessage;
use super::reply::{Reply, ReplyError, excerpt, field_text, parse_reply};
use crate::format::payload::Payload;

/// Which prompt, chosen by tree, node type and outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PromptKind {
    TaskRootSuccess,
    TaskRootFailure,
    TaskResidualSuccess,
    TaskResidualFailure,
    EnvRoot,
    EnvResidual,
    DistillTask,
    DistillEnv,
}

/// Which payload a tree's nodes carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TreeKind {
    /// Skills: activation condition, execution procedure, termination condition.
    Task,
    /// Knowledge: activation condition (trigger), content.
    Env,
}

impl PromptKind {
    /// The extraction prompt for one tree after an episode.
    pub fn for_extraction(tree: TreeKind, residual: bool, success: bool) -> PromptKind {
        match (tree, residual, success) {
            (TreeKind::Task, false, true) => PromptKind::TaskRootSuccess,
            (TreeKind::Task, false, false) => PromptKind::TaskRootFailure,
            (TreeKind::Task, true, true) => PromptKind::TaskResidualSuccess,
            (TreeKind::Task, true, false) => PromptKind::TaskResidualFailure,
            (TreeKind::Env, false, _) => PromptKind::EnvRoot,
            (TreeKind::Env, true, _) => PromptKind::EnvResidual,
        }
    }

    pub fn for_distill(tree: TreeKind) -> PromptKind {
        match tree {
            TreeKind::Task => PromptKind::DistillTask,
            TreeKind::Env => PromptKind::DistillEnv,
        }
    }

    /// Stable name, recorded in node provenance.
    pub fn id(self) -> &'static str {
        match self {
            PromptKind::TaskRootSuccess => "task-root-success",
            PromptKind::TaskRootFailure => "task-root-failure",
            PromptKind::TaskResidualSuccess => "task-residual-success",
            PromptKind::TaskResidualFailure => "task-residual-failure",
            PromptKind::EnvRoot => "env-root",
            PromptKind::EnvResidual => "env-residual",
            PromptKind::DistillTask => "distill-task",
            PromptKind::DistillEnv => "distill-env",
        }
    }

    pub fn tree(self) -> TreeKind {
        match self {
            PromptKind::EnvRoot | PromptKind::EnvResidual | PromptKind::DistillEnv => TreeKind::Env,
            _ => TreeKind::Task,
        }
    }

    /// Residual prompts may answer `{"skip": true}`.
    pub fn allows_skip(self) -> bool {
        matches!(
            self,
            PromptKind::TaskResidualSuccess | PromptKind::TaskResidualFailure | PromptKind::EnvResidual
        )
    }

    /// Residual and distill prompts show a chain.
    pub fn needs_chain(self) -> bool {
        self.allows_skip() || matches!(self, PromptKind::DistillTask | PromptKind::DistillEnv)
    }
}

/// How to describe the task-tree fields to the extractor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskGuide {
    /// What a skill's activation condition must say.
    pub activation: String,
    /// How to write a skill's execution procedure.
    pub procedure: String,
    /// What a skill's termination condition names.
    pub termination: String,
    /// What a failure record's activation condition must say.
    pub failure_activation: String,
}

/// How to describe the env-tree fields to the extractor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvGuide {
    /// What a knowledge entry's trigger must say.
    pub activation: String,
    /// What the facts must cover and at which granularity.
    pub content: String,
    /// How specific a new fact in an update may be.
    pub update_granularity: String,
}

/// The domain-specific part of the prompts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainProfile {
    pub name: String,
    /// The world the agent acts in, one phrase.
    pub domain: String,
    /// Heading of the env text in prompts ("Environment", "Product category").
    pub env_label: String,
    /// A remark on how to read the outcome (partial rewards); may be empty.
    pub outcome_note: String,
    /// Put before the retrieved chains in the agent's prompt.
    pub memory_header: String,
    pub task: TaskGuide,
    pub env: EnvGuide,
}

impl DomainProfile {
    /// Names accepted by [`DomainProfile::by_name`].
    pub const BUILT_IN: [&'static str; 4] = ["generic", "alfworld", "scienceworld", "webshop"];

    pub fn by_name(name: &str) -> Option<DomainProfile> {
        match name.to_ascii_lowercase().as_str() {
            "generic" => Some(DomainProfile::generic()),
            "alfworld" => Some(DomainProfile::alfworld()),
            "scienceworld" | "sciworld" => Some(DomainProfile::scienceworld()),
            "webshop" => Some(DomainProfile::webshop()),
            _ => None,
        }
    }

    /// A profile from a JSON file's text (the fields of this struct).
    pub fn from_json(text: &str) -> Result<DomainProfile, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// No benchmark assumptions.
    pub fn generic() -> DomainProfile {
        DomainProfile {
            name: "generic".into(),
            domain: "an interactive text environment".into(),
            env_label: "Environment".into(),
            outcome_note: String::new(),
            memory_header: "Memory from earlier episodes follows: task skills first (a base \
skill, then patches that refine it; failure records are warnings), then knowledge about \
the environment. Conditions in it describe those earlier episodes; your own task is \
stated after the memory."
                .into(),
            task: TaskGuide {
                activation: "In plain words, the type of task this skill serves and what sets \
it apart from similar tasks."
                    .into(),
                procedure: "The actions that solved the task, numbered and in order, one \
action per step, written in the environment's own action syntax. Do not fold several \
actions into one vague step; state any precondition a step relies on."
                    .into(),
                termination: "The observation that shows the task is complete.".into(),
                failure_activation: "The type of task concerned and the mistaken belief or \
move that led to the failure."
                    .into(),
            },
            env: EnvGuide {
                activation: "Starts with \"Applies to environments where\" and names the \
kind of environment and its distinguishing structure."
                    .into(),
                content: "Facts observed about the world: where things are, how objects \
and devices respond to actions, and traps. Write them as observations, not commands."
                    .into(),
                update_granularity: "facts the existing knowledge does not state".into(),
            },
        }
    }

    /// ALFWorld: household tasks; object placement is shuffled per episode,
    /// so scene facts stay at the level of categories.
    pub fn alfworld() -> DomainProfile {
        DomainProfile {
            name: "alfworld".into(),
            domain: "ALFWorld, a text-based household simulator whose rooms contain \
receptacles (cabinets, drawers, countertops, fridge, microwave, sink, ...)"
                .into(),
            env_label: "Environment".into(),
            outcome_note: String::new(),
            memory_header: "Memory retrieved for this task:\n- Task skill memory: how tasks \
of this type were solved before (a base skill, then patches that refine it; failure \
records are warnings, not plans).\n- Environment memory: where kinds of objects tend to \
be and how receptacles and appliances behave.\nConditions such as 'Applies when' describe \
earlier episodes; the task you must solve is stated at the end."
                .into(),
            task: TaskGuide {
                activation: "The type of household task (for example: clean an object and \
put it somewhere, heat or cool then place, look at an object under a lamp, put two of a \
kind somewhere) and what separates it from neighbouring types."
                    .into(),
                procedure: "Numbered ALFWorld actions in order, one per step (go to R, take \
O from R, put O in/on R, open R, close R, toggle O R, clean O with R, heat O with R, cool \
O with R). Name objects and receptacles by type, not by instance number, and say where to \
look first."
                    .into(),
                termination: "The observation showing the goal state has been reached.".into(),
                failure_activation: "The household task type and the wrong assumption \
behind the failure (where an object would be, which appliance to use, a step left out)."
                    .into(),
            },
            env: EnvGuide {
                activation: "Starts with \"Applies to household scenes where\" and names the \
room type and its notable receptacles."
                    .into(),
                content: "Observations at the level of categories: (a) which kinds of \
objects tend to be found in which kinds of receptacles, (b) how receptacle and appliance \
types behave (must be opened first, what toggling does), (c) traps seen. Placement is \
shuffled every episode, so never record an instance such as 'drawer 2 held the key'."
                    .into(),
                update_granularity: "category-level tendencies or appliance rules the \
existing knowledge lacks, never specific instances"
                    .into(),
            },
        }
    }

    /// ScienceWorld: item placement is the same in every episode, so scene
    /// facts name rooms and items specifically.
    pub fn scienceworld() -> DomainProfile {
        DomainProfile {
            name: "scienceworld".into(),
            domain: "ScienceWorld, a text-based science simulator with rooms (kitchen, \
workshop, greenhouse, foundry, bathroom, outside, ...) and devices to operate"
                .into(),
            env_label: "Environment".into(),
            outcome_note: "The reward is the share of the task's sub-goals reached (1.0 is \
full success); a failure with a positive reward completed some of them."
                .into(),
            memory_header: "Memory retrieved for this task:\n- Task skill memory: how this \
type of experiment was carried out (exact action sequence, which room holds each item, \
device syntax, what to watch out for); failure records are warnings, not plans.\n- \
Environment memory: where items are across the rooms and how devices respond.\n\
Conditions such as 'Applies when' describe earlier episodes; the task you must solve is \
stated at the end."
                .into(),
            task: TaskGuide {
                activation: "The type of science task (for example: change a substance's \
state, measure a temperature, grow a plant, test conductivity) and what distinguishes \
it."
                .into(),
                procedure: "The complete numbered action sequence in exact ScienceWorld \
syntax (teleport to LOC, pick up OBJ, move OBJ to OBJ, use OBJ on OBJ, activate OBJ, \
connect OBJ to OBJ, focus on OBJ, pour OBJ into OBJ, mix OBJ, wait), saying which room \
each item was found in and any precondition or trap."
                    .into(),
                termination: "What confirms completion (the score reaches its maximum, the \
target reaches the required state)."
                    .into(),
                failure_activation: "The task type and the wrong assumption or missing \
condition behind the failure; if the reward is positive, which sub-goals were reached."
                    .into(),
            },
            env: EnvGuide {
                activation: "Starts with \"Applies to ScienceWorld episodes where\" and \
names the task context or the rooms involved."
                    .into(),
                content: "Facts: (a) which room holds which item, stated specifically \
(placement is the same in every episode), (b) how devices respond, with exact action \
syntax, (c) a good order in which to search rooms for common items, (d) traps seen."
                    .into(),
                update_granularity: "specific room-to-item facts or device rules the \
existing knowledge lacks"
                    .into(),
            },
        }
    }

    /// WebShop: the env tree holds site behaviour per product category and
    /// a base skill is a worked example to imitate.
    pub fn webshop() -> DomainProfile {
        DomainProfile {
            name: "webshop".into(),
            domain: "WebShop, a simulated online store navigated with search[keywords] \
and click[button] actions"
                .into(),
            env_label: "Product category".into(),
            outcome_note: "The reward (0 to 1) measures how well the purchase met the \
request's attributes, options and price limit."
                .into(),
            memory_header: "How to use the memory below: a [Base Skill] is a successful \
earlier purchase of a similar kind. Treat it as a worked example and imitate its pattern \
(how it built the search keywords, picked a result, the order of option clicks, when it \
bought) with the values of YOUR request, not its own. A skill patch adds advice: use it \
only when its condition fits your request. Failure records describe traps to avoid; \
never carry out their actions."
                .into(),
            task: TaskGuide {
                activation: "A short phrase (at most 30 words) naming the kind of request \
this applies to: the product category and the sort of constraints, not their exact \
values."
                    .into(),
                procedure: "A condensed walk-through to imitate, as lines of Observation / \
Thought / Action: keep every action that contributed (the search, the chosen result, each \
option click, Buy Now), drop dead ends, trim each observation to the lines that justify \
the next action, and give each action a one-line reason."
                    .into(),
                termination: "After click[Buy Now] succeeds with full reward.".into(),
                failure_activation: "The kind of request and the wrong move behind the \
failure (search keywords too broad, a constraint not checked, an option not selected \
before buying)."
                    .into(),
            },
            env: EnvGuide {
                activation: "Starts with \"Applies when shopping for\" the product category \
and adds structural traits seen (for example, which options must be chosen before \
buying)."
                    .into(),
                content: "Facts about the site for this category: (a) which option \
dimensions are offered (size, colour, pack size, ...) and which must be selected for full \
reward, (b) search keyword patterns that worked, as patterns rather than literal strings, \
(c) traps seen (for example buying before selecting an option)."
                    .into(),
                update_granularity: "site facts the existing knowledge lacks (a required \
option, a pagination detail, a default quantity), at most 60 words"
                    .into(),
            },
        }
    }
}

/// What one extraction prompt is about.
#[derive(Debug, Clone, Copy)]
pub struct EpisodeView<'a> {
    pub task_text: &'a str,
    pub env_text: &'a str,
    /// Already shortened to the configured limit.
    pub trajectory: &'a str,
    pub success: bool,
    pub steps: Option<u32>,
    pub max_steps: Option<u32>,
    pub reward: Option<f64>,
}

const SKILL_SHAPE: &str =
    r#"{"activation_condition": "...", "execution_procedure": "...", "termination_condition": "..."}"#;
const FAILURE_SHAPE: &str = r#"{"activation_condition": "...", "execution_procedure": "WHAT FAILED: ...\nNOT TRIED: ...", "termination_condition": ""}"#;
const KNOWLEDGE_SHAPE: &str = r#"{"activation_condition": "...", "content": "..."}"#;
const SKIP_SHAPE: &str = r#"{"skip": true}"#;

fn system_message(profile: &DomainProfile) -> ChatMessage {
    ChatMessage::system(format!(
        "You keep the long-term experience memory of an agent that acts in {}. After an \
episode you turn what happened into one compact memory entry for future agents, who will \
never see this episode's trajectory. Reply with a single JSON object and nothing else: no \
commentary, no code fences. Put line breaks inside strings as \\n.",
        profile.domain
    ))
}

fn outcome_line(e: &EpisodeView<'_>) -> String {
    let mut line = String::from(if e.success { "SUCCESS" } else { "FAILURE" });
    let mut details = Vec::new();
    match (e.steps, e.max_steps) {
        (Some(s), Some(m)) => details.push(format!("{s} of at most {m} steps")),
        (Some(s), None) => details.push(format!("{s} steps")),
        _ => {}
    }
    if let Some(r) = e.reward {
        details.push(format!("reward {r}"));
    }
    if !details.is_empty() {
        let _ = write!(line, " ({})", details.join(", "));
    }
    line
}

fn episode_block(out: &mut String, profile: &DomainProfile, e: &EpisodeView<'_>) {
    let _ = writeln!(out, "## This episode");
    let _ = writeln!(out, "{}: {}", profile.env_label, e.env_text.trim());
    let _ = writeln!(out, "Task: {}", e.task_text.trim());
    let _ = writeln!(out, "Outcome: {}", outcome_line(e));
    if !profile.outcome_note.trim().is_empty() {
        let _ = writeln!(out, "Note: {}", profile.outcome_note.trim());
    }
    let _ = writeln!(out, "\n## Trajectory\n{}\n", e.trajectory.trim_end());
}

fn chain_block(out: &mut String, title: &str, chain: &str) {
    let _ = writeln!(out, "## {title}\n<<<MEMORY\n{}\nMEMORY>>>\n", chain.trim_end());
}

/// The messages of an extraction prompt. `chain` is the rendered retrieved
/// chain (required by residual kinds, ignored by root kinds).
pub fn extraction_messages(
    kind: PromptKind,
    profile: &DomainProfile,
    episode: &EpisodeView<'_>,
    chain: Option<&str>,
) -> Vec<ChatMessage> {
    let mut u = String::new();
    let t = &profile.task;
    let env = &profile.env;
    let chain = chain.unwrap_or("(no stored entries)");
    match kind {
        PromptKind::TaskRootSuccess => {
            let _ = writeln!(
                u,
                "Entry to write: a new BASE SKILL. No stored skill resembles this task.\n"
            );
            episode_block(&mut u, profile, episode);
            let _ = writeln!(
                u,
                "The episode succeeded. Write a base skill that a future agent can follow \
without this trajectory. Keep what carries over to other tasks of the same type; replace \
one-off names and numbers with their role unless the task depends on them.\n\n\
- activation_condition: {}\n- execution_procedure: {}\n- termination_condition: {}\n\n\
Reply with this JSON shape:\n{SKILL_SHAPE}",
                t.activation, t.procedure, t.termination
            );
        }
        PromptKind::TaskRootFailure => {
            let _ = writeln!(
                u,
                "Entry to write: a new FAILURE RECORD. No stored skill resembles this task. \
Future agents will see it as a warning, never as a procedure to carry out.\n"
            );
            episode_block(&mut u, profile, episode);
            let _ = writeln!(
                u,
                "The episode failed. Report only what the trajectory shows; do not make up \
a fix that was never tested.\n\n\
- activation_condition: {}\n\
- execution_procedure: two labelled parts. \"WHAT FAILED:\" the actions that were tried \
and the environment responses showing they did not work. \"NOT TRIED:\" reasonable \
approaches the agent never attempted.\n\
- termination_condition: an empty string.\n\n\
Reply with this JSON shape:\n{FAILURE_SHAPE}",
                t.failure_activation
            );
        }
        PromptKind::TaskResidualSuccess => {
            let _ = writeln!(
                u,
                "Entry to write: a SKILL PATCH, or nothing. A stored skill chain matched \
this task; it is shown first (the base skill, then the patches added since).\n"
            );
            chain_block(&mut u, "Stored skill chain", chain);
            episode_block(&mut u, profile, episode);
            let _ = writeln!(
                u,
                "The episode succeeded. Decide whether it taught something the chain does \
not already say.\n\
Reply {SKIP_SHAPE} only if, for every distinct action in the trajectory, you can point to \
a sentence of the chain that already prescribes it, and no step needed a recovery, a \
different object or a different order than the chain gives. If even one action has no \
such sentence, write a patch.\n\n\
A patch holds only the difference (at most three new points) and never repeats the \
chain:\n\
- activation_condition: the specific circumstance that makes this patch necessary; it \
must differ from the conditions already in the chain.\n\
- execution_procedure: only the new or changed steps, concrete and usable on their own. \
{}\n\
- termination_condition: when the patch's steps are complete.\n\n\
Reply with one of these two JSON shapes:\n{SKIP_SHAPE}\n{SKILL_SHAPE}",
                t.procedure
            );
        }
        PromptKind::TaskResidualFailure => {
            let _ = writeln!(
                u,
                "Entry to write: a FAILURE RECORD patch, or nothing. A stored skill chain \
matched this task; it is shown first. The agent failed even though this chain was \
available.\n"
            );
            chain_block(&mut u, "Stored skill chain", chain);
            episode_block(&mut u, profile, episode);
            let _ = writeln!(
                u,
                "Reply {SKIP_SHAPE} only if a failure record in the chain already describes \
this very failure: the same failed actions met by the same environment responses. Any \
difference calls for a new record.\n\n\
Otherwise write a warning about the gap the chain left open:\n\
- activation_condition: the specific situation the chain did not handle. {}\n\
- execution_procedure: two labelled parts. \"WHAT FAILED:\" what was tried (including any \
chain guidance that was followed) and the responses showing it failed. \"NOT TRIED:\" \
approaches never attempted.\n\
- termination_condition: an empty string.\n\n\
Reply with one of these two JSON shapes:\n{SKIP_SHAPE}\n{FAILURE_SHAPE}",
                t.failure_activation
            );
        }
        PromptKind::EnvRoot => {
            let _ = writeln!(
                u,
                "Entry to write: new BASE ENVIRONMENT KNOWLEDGE. No stored knowledge matched \
this environment.\n"
            );
            episode_block(&mut u, profile, episode);
            let _ = writeln!(
                u,
                "Whatever the outcome, what the agent observed about the world is valid \
knowledge. Write facts, not instructions.\n\n\
- activation_condition: {}\n- content: {}\n\n\
Reply with this JSON shape:\n{KNOWLEDGE_SHAPE}",
                env.activation, env.content
            );
        }
        PromptKind::EnvResidual => {
            let _ = writeln!(
                u,
                "Entry to write: an ENVIRONMENT KNOWLEDGE UPDATE, or nothing. Stored \
knowledge matched this environment; it is shown first.\n"
            );
            chain_block(&mut u, "Stored environment knowledge", chain);
            episode_block(&mut u, profile, episode);
            let _ = writeln!(
                u,
                "Whatever the outcome, what the agent observed about the world is valid \
knowledge.\n\
Reply {SKIP_SHAPE} only if every location and every interaction rule this trajectory \
reveals is already stated explicitly in the stored knowledge. If even one is not, write \
an update.\n\n\
An update holds only the new facts (at most three) and never repeats the stored \
knowledge:\n\
- activation_condition: {} Name the new feature this update is about.\n\
- content: only {}.\n\n\
Reply with one of these two JSON shapes:\n{SKIP_SHAPE}\n{KNOWLEDGE_SHAPE}",
                env.activation, env.update_granularity
            );
        }
        PromptKind::DistillTask | PromptKind::DistillEnv => {
            // Distillation has its own entry point; keep this total.
            return distill_messages(kind.tree(), profile, episode.task_text, chain);
        }
    }
    vec![system_message(profile), ChatMessage::user(u)]
}

/// The consolidation prompt: fuse a chain that keeps leading to success
/// into one self-contained entry. `chain` must mark failure entries (see
/// [`render_for_distill`]).
pub fn distill_messages(tree: TreeKind, profile: &DomainProfile, scenario: &str, chain: &str) -> Vec<ChatMessage> {
    let mut u = String::new();
    match tree {
        TreeKind::Task => {
            let _ = writeln!(
                u,
                "Entry to write: one CONSOLIDATED SKILL replacing the chain below. The chain \
(base entry first, then its patches in the order they were added) has led to success \
repeatedly. A future agent will read only your result.\n"
            );
            chain_block(&mut u, "Chain to consolidate", chain);
            let _ = writeln!(
                u,
                "Scenario of the deepest entry: {}\n\n\
Apply every patch to the base where it belongs (a patch adds steps, narrows a condition \
or replaces a step), keep the actions in a coherent order and drop repetitions. Entries \
marked FAILED are warnings: never turn their actions into steps; keep each lesson only as \
a caution (\"Avoid: ...\") in the procedure.\n\n\
- activation_condition: {}\n- execution_procedure: {}\n- termination_condition: {}\n\n\
Reply with this JSON shape:\n{SKILL_SHAPE}",
                scenario.trim(),
                profile.task.activation,
                profile.task.procedure,
                profile.task.termination
            );
        }
        TreeKind::Env => {
            let _ = writeln!(
                u,
                "Entry to write: one CONSOLIDATED body of ENVIRONMENT KNOWLEDGE replacing the \
chain below (base entry first, then its updates in the order they were added). A future \
agent will read only your result.\n"
            );
            chain_block(&mut u, "Chain to consolidate", chain);
            let _ = writeln!(
                u,
                "Scenario of the deepest entry: {}\n\n\
Merge all entries into one self-contained set of facts, drop repetitions, and where two \
entries disagree keep the later one. Entries marked FAILED report observations from a \
failed episode: keep their facts, never as instructions.\n\n\
- activation_condition: {}\n- content: {}\n\n\
Reply with this JSON shape:\n{KNOWLEDGE_SHAPE}",
                scenario.trim(),
                profile.env.activation,
                profile.env.content
            );
        }
    }
    vec![system_message(profile), ChatMessage::user(u)]
}

/// Renders a chain for the consolidation prompt: every entry numbered,
/// each FAILURE entry marked as a warning whatever the tree, the hidden
/// fields (raw trajectory, provenance) left out.
pub fn render_for_distill(chain: &[(bool, &Payload)]) -> String {
    let mut out = String::new();
    for (position, (failed, payload)) in chain.iter().enumerate() {
        let title = if position == 0 {
            "Base entry".to_string()
        } else {
            format!("Patch {position}")
        };
        if *failed {
            let _ = writeln!(
                out,
                "[{title} - FAILED: a warning from a failed episode, not a procedure]"
            );
        } else {
            let _ = writeln!(out, "[{title}]");
        }
        let _ = writeln!(out, "scenario: {}", payload.scenario.trim());
        for (key, value) in &payload.fields {
            if HIDDEN_FIELDS.contains(&key.as_str()) || value.trim().is_empty() {
                continue;
            }
            let _ = writeln!(out, "{key}: {}", value.trim());
        }
        out.push('\n');
    }
    out
}

/// Payload fields that are never shown to the model.
pub const HIDDEN_FIELDS: [&str; 2] = ["trajectory", "provenance"];

/// Turns a reply to a `kind` prompt into payload fields; `None` is a skip.
/// Task fields: `activation_condition` and `execution_procedure` required,
/// `termination_condition` optional (stored as given, empty if absent).
/// Env fields: `activation_condition` and `content` required
/// (`execution_procedure` is accepted for `content`, as some prompt
/// traditions name it).
pub fn fields_from_reply(kind: PromptKind, reply: &str) -> Result<Option<BTreeMap<String, String>>, ReplyError> {
    let object = match parse_reply(reply)? {
        Reply::Skip if kind.allows_skip() => return Ok(None),
        Reply::Skip => return Err(ReplyError::SkipNotAllowed),
        Reply::Object(o) => o,
    };
    let get = |key: &str| object.get(key).and_then(field_text);
    let missing = |field: &str| ReplyError::MissingField {
        field: field.to_string(),
        excerpt: excerpt(reply.trim()),
    };
    let mut fields = BTreeMap::new();
    let activation = get("activation_condition").ok_or_else(|| missing("activation_condition"))?;
    fields.insert("activation_condition".to_string(), activation);
    match kind.tree() {
        TreeKind::Task => {
            let procedure = get("execution_procedure").ok_or_else(|| missing("execution_procedure"))?;
            fields.insert("execution_procedure".to_string(), procedure);
            fields.insert(
                "termination_condition".to_string(),
                get("termination_condition").unwrap_or_default(),
            );
        }
        TreeKind::Env => {
            let content = get("content")
                .or_else(|| get("execution_procedure"))
                .ok_or_else(|| missing("content"))?;
            fields.insert("content".to_string(), content);
        }
    }
    Ok(Some(fields))
}

/// Shortens a trajectory to at most `max_chars` characters, keeping the
/// first third and the last two thirds (the end usually decides the
/// outcome) around a marker saying how much was cut.
pub fn shorten_trajectory(text: &str, max_chars: usize) -> String {
    let total = text.chars().count();
    if total <= max_chars {
        return text.to_string();
    }
    let head = max_chars / 3;
    let tail = max_chars - head;
    let omitted = total - head - tail;
    let head_text: String = text.chars().take(head).collect();
    let tail_text: String = text.chars().skip(total - tail).collect();
    format!("{head_text}\n[... {omitted} characters omitted ...]\n{tail_text}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn episode() -> EpisodeView<'static> {
        EpisodeView {
            task_text: "put a clean mug in the coffee machine",
            env_text: "a kitchen with a sink and a coffee machine",
            trajectory: "> go to sink 1\nYou see a mug.",
            success: true,
            steps: Some(7),
            max_steps: Some(50),
            reward: Some(1.0),
        }
    }

    #[test]
    fn every_kind_builds_and_states_its_shape() {
        let kinds = [
            PromptKind::TaskRootSuccess,
            PromptKind::TaskRootFailure,
            PromptKind::TaskResidualSuccess,
            PromptKind::TaskResidualFailure,
            PromptKind::EnvRoot,
            PromptKind::EnvResidual,
            PromptKind::DistillTask,
            PromptKind::DistillEnv,
        ];
        for name in DomainProfile::BUILT_IN {
            let profile = DomainProfile::by_name(name).unwrap();
            for kind in kinds {
                let m = extraction_messages(kind, &profile, &episode(), Some("[Base Skill]\nx"));
                assert_eq!(m.len(), 2);
                let user = &m[1].content;
                assert_eq!(user.contains(SKIP_SHAPE), kind.allows_skip(), "{kind:?}");
                match kind.tree() {
                    TreeKind::Task => assert!(user.contains("execution_procedure")),
                    TreeKind::Env => assert!(user.contains("\"content\"")),
                }
                if kind.needs_chain() {
                    assert!(user.contains("[Base Skill]"), "{kind:?}");
                } else {
                    assert!(user.contains("You see a mug."), "{kind:?}");
                }
            }
        }
    }

    #[test]
    fn outcome_line_shapes() {
        assert_eq!(outcome_line(&episode()), "SUCCESS (7 of at most 50 steps, reward 1)");
        let e = EpisodeView {
            success: false,
            steps: None,
            max_steps: None,
            reward: None,
            ..episode()
        };
        assert_eq!(outcome_line(&e), "FAILURE");
    }

    #[test]
    fn reply_fields() {
        let f = fields_from_reply(
            PromptKind::TaskRootSuccess,
            r#"{"activation_condition":"a","execution_procedure":["1. x","2. y"]}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(f["execution_procedure"], "1. x\n2. y");
        assert_eq!(f["termination_condition"], "");
        assert_eq!(
            fields_from_reply(PromptKind::TaskRootSuccess, r#"{"skip":true}"#),
            Err(ReplyError::SkipNotAllowed)
        );
        assert_eq!(fields_from_reply(PromptKind::EnvResidual, r#"{"skip":true}"#), Ok(None));
        let env = fields_from_reply(
            PromptKind::EnvRoot,
            r#"{"activation_condition":"a","execution_procedure":"facts"}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(env["content"], "facts");
        assert!(matches!(
            fields_from_reply(PromptKind::EnvRoot, r#"{"activation_condition":"a"}"#),
            Err(ReplyError::MissingField { .. })
        ));
    }

    #[test]
    fn shorten_keeps_ends() {
        let text: String = ('a'..='z').cycle().take(1000).collect();
        let s = shorten_trajectory(&text, 90);
        assert!(s.starts_with(&text[..30]) && s.ends_with(&text[940..]));
        assert!(s.contains("910 characters omitted"));
        assert_eq!(shorten_trajectory("short", 90), "short");
    }

    #[test]
    fn profiles_roundtrip_as_json() {
        for name in DomainProfile::BUILT_IN {
            let p = DomainProfile::by_name(name).unwrap();
            let text = serde_json::to_string(&p).unwrap();
            assert_eq!(DomainProfile::from_json(&text).unwrap(), p);
        }
    }
}

//! [`ReplayChat`]: a chat model that replays what an LLM wrote during a
//! recorded run, so the real memory loop can be driven offline (the demo
//! replays the ScienceWorld run kept in `tests/fixtures/reference/`).
//!
//! It answers from the prompt's [`PromptPurpose`], never from the prompt
//! text: an extraction prompt gets the entry recorded for that episode and
//! tree; a distillation prompt, which a recorded run may never have issued,
//! gets the chain's entries joined unchanged under a note saying so. It
//! never answers skip, because a recorded entry exists for every write.

use std::collections::BTreeMap;

use super::llm::{ChatMessage, ChatModel, LlmError, PromptPurpose};
use super::prompts::{PromptKind, TreeKind};

/// First line of every joined "distillation", so nobody mistakes it for
/// an LLM's work.
pub const JOINED_NOTE: &str = "[joined by the replay model, not distilled: the recorded run \
issued no consolidation prompt, so the chain's entries follow unchanged, base entry first]";

/// Recorded answers keyed by episode id, one per tree.
#[derive(Debug, Clone, Default)]
pub struct ReplayChat {
    model_id: String,
    task: BTreeMap<String, BTreeMap<String, String>>,
    env: BTreeMap<String, BTreeMap<String, String>>,
}

impl ReplayChat {
    /// `model_id` names the recorded run in provenance (e.g.
    /// `replay:qwen3-8b`).
    pub fn new(model_id: impl Into<String>) -> ReplayChat {
        ReplayChat {
            model_id: model_id.into(),
            ..ReplayChat::default()
        }
    }

    /// Records the reply fields the run's LLM wrote for `episode` in a
    /// tree of kind `tree` (task: `activation_condition`,
    /// `execution_procedure`, `termination_condition`; env:
    /// `activation_condition`, `content`). A second call for the same
    /// episode and tree replaces the first.
    pub fn add(&mut self, episode: &str, tree: TreeKind, fields: BTreeMap<String, String>) {
        let map = match tree {
            TreeKind::Task => &mut self.task,
            TreeKind::Env => &mut self.env,
        };
        map.insert(episode.to_string(), fields);
    }

    /// How many episodes have a recorded answer for `tree`.
    pub fn episode_count(&self, tree: TreeKind) -> usize {
        match tree {
            TreeKind::Task => self.task.len(),
            TreeKind::Env => self.env.len(),
        }
    }

    fn recorded(&self, purpose: &PromptPurpose<'_>) -> Result<String, LlmError> {
        let tree = purpose.kind.tree();
        let Some(episode) = purpose.episode else {
            return Err(LlmError::Config(format!(
                "replay: the {} prompt names no episode, so no recorded answer can be chosen",
                purpose.kind.id()
            )));
        };
        let map = match tree {
            TreeKind::Task => &self.task,
            TreeKind::Env => &self.env,
        };
        let fields = map.get(episode).ok_or_else(|| {
            LlmError::Config(format!(
                "replay: no recorded {tree:?} answer for episode {episode:?} ({} prompt)",
                purpose.kind.id()
            ))
        })?;
        serde_json::to_string(fields).map_err(|e| LlmError::Config(format!("replay: {e}")))
    }
}

/// The stand-in for a distillation: the chain as shown to the model, under
/// [`JOINED_NOTE`], in the fields the tree's payload needs.
fn joined(purpose: &PromptPurpose<'_>) -> Result<String, LlmError> {
    let chain = purpose
        .chain
        .ok_or_else(|| LlmError::Config("replay: a distillation prompt came without its chain".into()))?;
    let body = format!("{JOINED_NOTE}\n\n{}", chain.trim_end());
    let activation = format!("Consolidated entry for: {}", purpose.scenario.trim());
    let reply = match purpose.kind.tree() {
        TreeKind::Task => serde_json::json!({
            "activation_condition": activation,
            "execution_procedure": body,
            "termination_condition": "",
        }),
        TreeKind::Env => serde_json::json!({
            "activation_condition": activation,
            "content": body,
        }),
    };
    Ok(reply.to_string())
}

impl ChatModel for ReplayChat {
    /// Without a purpose there is nothing to replay.
    fn complete(&self, _messages: &[ChatMessage]) -> Result<String, LlmError> {
        Err(LlmError::Config(
            "replay: this model answers only the memory loop's prompts (it needs their purpose)".into(),
        ))
    }

    fn model_id(&self) -> String {
        self.model_id.clone()
    }

    fn answer(&self, purpose: &PromptPurpose<'_>, _messages: &[ChatMessage]) -> Result<String, LlmError> {
        match purpose.kind {
            PromptKind::DistillTask | PromptKind::DistillEnv => joined(purpose),
            _ => self.recorded(purpose),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::prompts::fields_from_reply;

    fn purpose<'a>(kind: PromptKind, episode: Option<&'a str>, chain: Option<&'a str>) -> PromptPurpose<'a> {
        PromptPurpose {
            kind,
            episode,
            scenario: "boil water",
            chain,
        }
    }

    #[test]
    fn answers_each_episode_and_tree_with_its_own_entry() {
        let mut chat = ReplayChat::new("replay:test");
        let task = BTreeMap::from([
            ("activation_condition".to_string(), "when boiling".to_string()),
            ("execution_procedure".to_string(), "1. heat".to_string()),
        ]);
        let env = BTreeMap::from([
            ("activation_condition".to_string(), "in a kitchen".to_string()),
            ("content".to_string(), "the stove is by the sink".to_string()),
        ]);
        chat.add("e1", TreeKind::Task, task);
        chat.add("e1", TreeKind::Env, env);
        let kind = PromptKind::TaskResidualFailure;
        let reply = chat.answer(&purpose(kind, Some("e1"), Some("chain")), &[]).unwrap();
        let fields = fields_from_reply(kind, &reply).unwrap().unwrap();
        assert_eq!(fields["execution_procedure"], "1. heat");
        let reply = chat
            .answer(&purpose(PromptKind::EnvRoot, Some("e1"), None), &[])
            .unwrap();
        let fields = fields_from_reply(PromptKind::EnvRoot, &reply).unwrap().unwrap();
        assert_eq!(fields["content"], "the stove is by the sink");
        for missing in [purpose(kind, Some("e2"), None), purpose(kind, None, None)] {
            assert!(matches!(chat.answer(&missing, &[]), Err(LlmError::Config(_))));
        }
        assert!(chat.complete(&[]).is_err());
    }

    #[test]
    fn distillation_joins_the_chain_and_says_so() {
        let chat = ReplayChat::new("replay:test");
        for kind in [PromptKind::DistillTask, PromptKind::DistillEnv] {
            let reply = chat.answer(&purpose(kind, None, Some("[Base entry]\nA\n\n[Patch 1]\nB\n")), &[]);
            let fields = fields_from_reply(kind, &reply.unwrap()).unwrap().unwrap();
            let body = fields
                .get("execution_procedure")
                .or_else(|| fields.get("content"))
                .unwrap();
            assert!(body.starts_with(JOINED_NOTE), "{body}");
            assert!(body.ends_with("[Base entry]\nA\n\n[Patch 1]\nB"), "{body}");
            assert!(fields["activation_condition"].contains("boil water"));
        }
        assert!(chat.answer(&purpose(PromptKind::DistillTask, None, None), &[]).is_err());
    }
}

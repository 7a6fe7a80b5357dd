//! Turning a chain into prompt text. The structure follows the paper's
//! appendix C (a base entry, then numbered patches, failures as warnings);
//! the wording is this project's own.

use std::fmt::Write;

use crate::format::payload::Payload;
use crate::format::row::Label;

/// How a tree's entries are titled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeStyle {
    /// Skills: when to act, what to do, when it is done.
    Task,
    /// Scene knowledge: a trigger and what is known.
    Env,
    /// Any other tree (CDMem/MCMA-style layouts): neutral titles.
    Generic,
}

impl TreeStyle {
    pub fn for_tree_name(name: &str) -> TreeStyle {
        match name {
            "task" => TreeStyle::Task,
            "env" => TreeStyle::Env,
            _ => TreeStyle::Generic,
        }
    }

    fn title(self, position: usize, label: Label) -> String {
        match (self, position, label) {
            (TreeStyle::Task, 0, Label::Success) => "[Base Skill]".into(),
            (TreeStyle::Task, 0, Label::Failure) => "[Base Failure Record]".into(),
            (TreeStyle::Task, k, Label::Success) => format!("[Skill Patch {k}]"),
            (TreeStyle::Task, k, Label::Failure) => format!("[Failure Record {k}]"),
            (TreeStyle::Env, 0, _) => "[Base Environment Knowledge]".into(),
            (TreeStyle::Env, k, _) => format!("[Environment Knowledge Update {k}]"),
            (TreeStyle::Generic, 0, _) => "[Base Experience]".into(),
            (TreeStyle::Generic, k, _) => format!("[Experience Update {k}]"),
        }
    }
}

/// Fields shown first, in this order, with the heading each gets.
const KNOWN_FIELDS: [(&str, &str); 6] = [
    ("activation_condition", "Applies when"),
    ("execution_procedure", "Steps"),
    ("termination_condition", "Done when"),
    ("content", "Known facts"),
    ("failure_reason", "What went wrong"),
    ("untried_alternatives", "Not yet tried"),
];

/// Fields never put in a prompt: raw material, not advice.
const HIDDEN_FIELDS: [&str; 2] = ["trajectory", "provenance"];

const FAILURE_WARNING: &str =
    "Warning: this attempt FAILED. Do not follow it as a procedure; use it to avoid repeating the mistake.";

/// Renders a chain, root first. Each entry is (label, payload).
pub fn render_chain(style: TreeStyle, chain: &[(Label, &Payload)]) -> String {
    let mut out = String::new();
    for (position, (label, payload)) in chain.iter().enumerate() {
        if position > 0 {
            out.push('\n');
        }
        let _ = writeln!(out, "{}", style.title(position, *label));
        if *label == Label::Failure && style != TreeStyle::Env {
            let _ = writeln!(out, "{FAILURE_WARNING}");
        }
        let _ = writeln!(out, "Scenario: {}", payload.scenario.trim());
        for (key, heading) in KNOWN_FIELDS {
            if let Some(value) = payload.fields.get(key).filter(|v| !v.trim().is_empty()) {
                let _ = writeln!(out, "{heading}: {}", value.trim());
            }
        }
        let known = |k: &str| KNOWN_FIELDS.iter().any(|(f, _)| *f == k) || HIDDEN_FIELDS.contains(&k);
        for (key, value) in payload.fields.iter().filter(|(k, _)| !known(k)) {
            if !value.trim().is_empty() {
                let _ = writeln!(out, "{key}: {}", value.trim());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(scenario: &str, proc_text: &str) -> Payload {
        let mut p = Payload {
            scenario: scenario.into(),
            ..Default::default()
        };
        p.fields.insert("execution_procedure".into(), proc_text.into());
        p.fields.insert("trajectory".into(), "look around\nopen door".into());
        p
    }

    #[test]
    fn task_chain_titles_and_failure_warning() {
        let base = payload("boil water", "heat it");
        let patch = payload("boil water fast", "use the stove");
        let failed = payload("boil water", "used the fridge");
        let text = render_chain(
            TreeStyle::Task,
            &[
                (Label::Success, &base),
                (Label::Success, &patch),
                (Label::Failure, &failed),
            ],
        );
        let base_at = text.find("[Base Skill]").unwrap();
        let patch_at = text.find("[Skill Patch 1]").unwrap();
        let fail_at = text.find("[Failure Record 2]").unwrap();
        assert!(base_at < patch_at && patch_at < fail_at);
        assert_eq!(text.matches("FAILED").count(), 1);
        assert!(text[fail_at..].contains("FAILED"));
        assert!(!text.contains("open door"), "trajectories stay out of prompts");
    }

    #[test]
    fn env_and_generic_titles() {
        let p = payload("kitchen", "stove is on the left");
        let env = render_chain(TreeStyle::Env, &[(Label::Success, &p), (Label::Success, &p)]);
        assert!(env.contains("[Base Environment Knowledge]") && env.contains("[Environment Knowledge Update 1]"));
        let generic = render_chain(TreeStyle::for_tree_name("insights"), &[(Label::Failure, &p)]);
        assert!(generic.starts_with("[Base Experience]") && generic.contains("FAILED"));
    }
}

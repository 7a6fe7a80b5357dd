//! The agent commands through the real binary: `embed` against the
//! library's embedder, then `record` against a scripted chat-completions
//! server on loopback and `retrieve` of what was recorded.
#![cfg(feature = "agent")]

mod common;

use std::path::Path;
use std::process::Command;

use common::llm_server::{Canned, Server, content};
use deltamem::agent::{Embedder, OnnxEmbedder, TextRole};
use serde_json::{Value, json};

fn assets_present() -> bool {
    let present = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("assets/minilm/model.onnx")
        .exists();
    if !present && std::env::var_os("DELTAMEM_REQUIRE_ASSETS").is_none() {
        println!("SKIPPED: assets missing (run tools/setup-agent-assets.sh)");
    }
    assert!(
        present || std::env::var_os("DELTAMEM_REQUIRE_ASSETS").is_none(),
        "assets required but missing"
    );
    present
}

fn deltamem(args: &[&str], server: Option<&Server>) -> Value {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_deltamem"));
    cmd.args(args).current_dir(env!("CARGO_MANIFEST_DIR"));
    if let Some(s) = server {
        cmd.env("DELTAMEM_LLM_BASE_URL", &s.url)
            .env("DELTAMEM_LLM_MODEL", "scripted");
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(text.lines().last().unwrap_or("null")).unwrap()
}

#[test]
fn embed_prints_the_libraries_vector() {
    if !assets_present() {
        return;
    }
    let out = deltamem(&["embed", "--text", "boil water in the kitchen"], None);
    let printed: Vec<f32> = serde_json::from_value(out["vector"].clone()).unwrap();
    std::env::set_current_dir(env!("CARGO_MANIFEST_DIR")).unwrap();
    let mut embedder = OnnxEmbedder::from_env().unwrap();
    let expected = embedder
        .embed_batch(&["boil water in the kitchen"], TextRole::Query)
        .unwrap()
        .remove(0);
    assert_eq!(out["dim"], 384);
    assert_eq!(printed, expected);
}

#[test]
fn record_then_retrieve_through_the_binary() {
    if !assets_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bank = &init_bank(dir.path(), &[]);
    let task_reply = json!({
        "activation_condition": "the water must be boiled",
        "execution_procedure": "1. fill the pot\n2. put it on the stove\n3. turn the stove on",
        "termination_condition": "the water is boiling",
    });
    let env_reply = json!({"activation_condition": "in the kitchen", "content": "the stove is left of the sink"});
    let server = Server::start(vec![content(&task_reply.to_string()), content(&env_reply.to_string())]);
    let episode = dir.path().join("episode.json");
    let text = json!({
        "task_text": "boil water", "env_text": "a kitchen with a stove and a sink",
        "trajectory": "go to kitchen\nfill pot\nactivate stove", "success": true,
    });
    std::fs::write(&episode, text.to_string()).unwrap();
    let outcome = deltamem(
        &["record", bank, "--episode", episode.to_str().unwrap(), "--json"],
        Some(&server),
    );
    assert_eq!(server.requests().len(), 2, "one extraction per tree");
    let task_node = outcome["task"]["node"].as_u64().expect("a task node was written");
    assert_eq!(
        (outcome["task"]["action"].as_str(), outcome["env"]["action"].as_str()),
        (Some("root"), Some("root"))
    );

    let found = deltamem(
        &[
            "retrieve",
            bank,
            "--task",
            "boil water",
            "--env",
            "a kitchen with a stove and a sink",
            "--json",
        ],
        None,
    );
    assert_eq!(found["task"]["node"].as_u64(), Some(task_node));
    let context = found["context"].as_str().unwrap();
    assert!(
        context.contains("turn the stove on") && context.contains("left of the sink"),
        "{context}"
    );
}

/// Runs `record` of `episode` (written to a file in `dir`) with `extra`
/// arguments against the scripted LLM `server`.
fn run_record(bank: &str, episode: &Value, server: &Server, dir: &Path, extra: &[&str]) -> std::process::Output {
    let file = dir.join("episode.json");
    std::fs::write(&file, episode.to_string()).unwrap();
    Command::new(env!("CARGO_BIN_EXE_deltamem"))
        .args(["record", bank, "--episode", file.to_str().unwrap()])
        .args(extra)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("DELTAMEM_LLM_BASE_URL", &server.url)
        .env("DELTAMEM_LLM_MODEL", "scripted")
        .output()
        .unwrap()
}

/// Runs `record` without `--json` and returns its stdout.
fn record_summary(bank: &str, episode: &Value, server: &Server, dir: &Path) -> String {
    let out = run_record(bank, episode, server, dir, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// A bank of MiniLM's dimension in `dir`, made by `init` with `extra`.
fn init_bank(dir: &Path, extra: &[&str]) -> String {
    let bank = dir.join("bank").to_str().unwrap().to_string();
    let mut args = vec!["init", bank.as_str(), "--dim", "384"];
    args.extend_from_slice(extra);
    deltamem(&args, None);
    bank
}

/// The scripted extraction reply for a kitchen episode's task tree.
fn skill() -> Canned {
    content(
        r#"{"activation_condition": "boiling", "execution_procedure": "1. heat", "termination_condition": "it boils"}"#,
    )
}

/// The scripted extraction reply for a kitchen episode's env tree.
fn facts() -> Canned {
    content(r#"{"activation_condition": "a kitchen", "content": "the stove is left of the sink"}"#)
}

/// A kitchen episode that used the given chains.
fn kitchen_episode(success: bool, task: Option<Vec<u32>>, env: Option<Vec<u32>>) -> Value {
    json!({"task_text": "boil water", "env_text": "a kitchen with a stove", "trajectory": "heat the pot",
           "success": success, "retrieved_task": task, "retrieved_env": env})
}

/// A bank with K_cons 1 and D_max 2 after two kitchen episodes: roots 0
/// (task) and 1 (env), then a task residual 2 under 0 and an env skip, so
/// a third, successful episode through node 2 makes it due. Returns the
/// bank and the two `record` summaries.
fn two_kitchen_episodes(dir: &Path) -> (String, String, String) {
    let bank = init_bank(dir, &["--consolidate-after", "1", "--max-depth", "2"]);
    let server = Server::start(vec![skill(), facts()]);
    let first = record_summary(&bank, &kitchen_episode(false, None, None), &server, dir);
    let server = Server::start(vec![skill(), content(r#"{"skip": true}"#)]);
    let second = record_summary(
        &bank,
        &kitchen_episode(false, Some(vec![0]), Some(vec![1])),
        &server,
        dir,
    );
    (bank, first, second)
}

#[test]
fn record_without_json_prints_a_summary() {
    if !assets_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (bank, first, second) = &two_kitchen_episodes(dir.path());
    let episode = kitchen_episode;
    assert_eq!(
        first,
        "task: root, node 0, no parent, depth 1\nenv: root, node 1, no parent, depth 1\n\
         success hits: none\nconsolidations: none\n"
    );
    assert_eq!(
        second,
        "task: residual, node 2, parent 0, depth 2\nenv: skip, nothing written (matched node 1)\n\
         success hits: none\nconsolidations: none\n"
    );
    let distilled = json!({"activation_condition": "boiling", "execution_procedure": "1. heat\n2. wait"});
    let server = Server::start(vec![skill(), facts(), content(&distilled.to_string())]);
    let third = record_summary(
        bank,
        &episode(true, Some(vec![0, 2]), Some(vec![1])),
        &server,
        dir.path(),
    );
    assert_eq!(
        third,
        "task: residual, node 3, parent 0, depth 2 (beside node 2, which is at the depth limit)\n\
         env: residual, node 4, parent 1, depth 2\n\
         success hits: task node 2 now 1, due for consolidation; env node 1 now 1\n\
         consolidations: task node 2 into new root 5\n"
    );
}

/// Issue 11 item 9: an episode with a misspelt, repeated or positional
/// field is refused naming it, before any model or LLM is needed.
#[test]
fn record_refuses_unknown_repeated_and_positional_episodes() {
    let dir = tempfile::tempdir().unwrap();
    let bank = dir.path().join("bank");
    let init = Command::new(env!("CARGO_BIN_EXE_deltamem"))
        .args(["init", bank.to_str().unwrap(), "--dim", "4"])
        .output()
        .unwrap();
    assert!(init.status.success());
    let base = r#""task_text":"t","env_text":"e","trajectory":"x","success":true"#;
    let cases = [
        (
            format!(r#"{{{base},"retreived_task":[0]}}"#),
            "unknown field `retreived_task`",
        ),
        (format!(r#"{{{base},"success":false}}"#), "duplicate field `success`"),
        (
            r#"[null,"t","e","x",true]"#.to_string(),
            "expected a JSON object, got an array",
        ),
    ];
    for (text, words) in cases {
        let episode = dir.path().join("episode.json");
        std::fs::write(&episode, &text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_deltamem"))
            .args(["record", bank.to_str().unwrap(), "--episode", episode.to_str().unwrap()])
            .env_remove("DELTAMEM_LLM_BASE_URL")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(words), "{text}: {stderr}");
    }
}

/// Issue 11: `retrieve --task ''` names the empty flag (it said "text 0
/// is empty"), before any model is loaded.
#[test]
fn retrieve_names_an_empty_task() {
    let dir = tempfile::tempdir().unwrap();
    let bank = dir.path().join("bank");
    let out = Command::new(env!("CARGO_BIN_EXE_deltamem"))
        .args(["retrieve", bank.to_str().unwrap(), "--task", " ", "--env", "kitchen"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--task is empty"), "{stderr}");
}

/// Issue 11 item 2 for `record`: a checkpoint that fails after the
/// episode's commit was made durable (a directory in the way of
/// MANIFEST.tmp) is not an error. `record` printed nothing and exited 1,
/// so a caller recorded the episode again. Now it prints its result, says
/// the episode is saved, exits 3 and tries no consolidation; once the
/// blocker is gone the bank holds the episode exactly once.
#[test]
fn record_saved_before_a_failed_checkpoint_prints_its_result_and_exits_3() {
    if !assets_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bank = &init_bank(dir.path(), &["--consolidate-after", "1"]);
    let path = Path::new(bank);
    let episode = kitchen_episode;
    let server = Server::start(vec![skill(), facts()]);
    record_summary(bank, &episode(false, None, None), &server, dir.path());
    let server = Server::start(vec![skill(), facts()]);
    let second = episode(false, Some(vec![0]), Some(vec![1]));
    record_summary(bank, &second, &server, dir.path());

    let blocker = path.join("MANIFEST.tmp");
    std::fs::create_dir_all(blocker.join("in-the-way")).unwrap();
    // The success hits make residuals 2 and 3 due (K_cons 1); the script
    // has no distillation reply, and none may be asked for.
    let server = Server::start(vec![skill(), facts()]);
    let third = episode(true, Some(vec![0, 2]), Some(vec![1, 3]));
    let out = run_record(bank, &third, &server, dir.path(), &["--json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("saved") && stderr.contains("checkpoint"), "{stderr}");
    let outcome: Value = serde_json::from_slice(&out.stdout).expect("the outcome is printed");
    assert_eq!(
        (outcome["task"]["node"].as_u64(), outcome["env"]["node"].as_u64()),
        (Some(4), Some(5))
    );
    assert!(outcome["checkpoint_failure"].is_string(), "{outcome}");
    let statuses: Vec<&Value> = outcome["consolidations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["status"])
        .collect();
    assert_eq!(statuses, vec![&json!("failed"), &json!("failed")], "{outcome}");
    assert_eq!(
        server.requests().len(),
        2,
        "no distillation after the failed checkpoint"
    );

    std::fs::remove_dir_all(&blocker).unwrap();
    let nodes = dump_nodes(bank);
    assert_eq!(nodes.len(), 6, "two nodes per episode, the third episode once");
    assert_eq!(
        (&nodes[2]["success_hits"], &nodes[3]["success_hits"]),
        (&json!(1), &json!(1))
    );
}

/// A consolidation made durable before the checkpoint after it fails (a
/// directory in the way of MANIFEST.tmp, put there while the distillation
/// reply is on its way) is reported as done, with the failure in its
/// reason, not as failed: a caller told "failed" would distil again and
/// store a second root. After the blocker is gone the bank holds the new
/// root once, recovered from the WAL.
#[test]
fn a_consolidation_saved_before_a_failed_checkpoint_is_reported_done() {
    if !assets_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (bank, _, _) = &two_kitchen_episodes(dir.path());
    let episode = kitchen_episode;

    // The third episode's commit and checkpoint succeed; the blocker
    // appears while the client waits for the distillation of node 2.
    let blocker = Path::new(bank).join("MANIFEST.tmp");
    let in_the_way = blocker.join("in-the-way");
    let distilled = json!({"activation_condition": "boiling", "execution_procedure": "1. heat\n2. wait"});
    let hook = Box::new(move || std::fs::create_dir_all(&in_the_way).unwrap());
    let server = Server::start(vec![
        skill(),
        facts(),
        Canned::Hook(hook, Box::new(content(&distilled.to_string()))),
    ]);
    let third = episode(true, Some(vec![0, 2]), Some(vec![1]));
    let out = run_record(bank, &third, &server, dir.path(), &["--json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let outcome: Value = serde_json::from_slice(&out.stdout).expect("the outcome is printed");
    assert_eq!(server.requests().len(), 3, "the distillation was asked for: {stderr}");
    assert!(
        outcome["checkpoint_failure"].is_null(),
        "the episode's own checkpoint succeeded: {outcome}"
    );
    let consolidation = &outcome["consolidations"][0];
    assert_eq!(consolidation["status"], json!("done"), "{outcome}");
    assert_eq!(consolidation["new_root"], json!(5), "{outcome}");
    let reason = consolidation["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("saved;") && reason.contains("checkpoint"),
        "{outcome}"
    );

    std::fs::remove_dir_all(&blocker).unwrap();
    let nodes = dump_nodes(bank);
    assert_eq!(nodes.len(), 6, "nodes 0-4 and the one new root: {nodes:?}");
    assert_eq!(nodes[5]["consolidated_root"], json!(true), "{}", nodes[5]);
    assert_eq!(nodes[2]["consolidated"], json!(true), "{}", nodes[2]);
}

/// Every node of the bank, as `dump` prints them.
fn dump_nodes(bank: &str) -> Vec<Value> {
    let dump = Command::new(env!("CARGO_BIN_EXE_deltamem"))
        .args(["dump", bank])
        .output()
        .unwrap();
    assert!(dump.status.success(), "{}", String::from_utf8_lossy(&dump.stderr));
    String::from_utf8(dump.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

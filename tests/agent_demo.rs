//! The real demo through the binary: the recorded ScienceWorld run of
//! `tests/fixtures/reference/` replayed through the memory loop with
//! MiniLM. The episodes are read here from the fixture files on their own
//! (not through the library's importer) and every node of the demo bank is
//! traced back to exactly one of them; the printed scores are recomputed
//! with the library's embedder; `verify` must be clean. Needs the agent
//! assets: skipped without them unless DELTAMEM_REQUIRE_ASSETS is set.
//! Also: with the assets pointed elsewhere, the toy demo runs and says how
//! to get the real one.
#![cfg(feature = "agent")]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use deltamem::agent::{Embedder, OnnxEmbedder, TextRole};
use serde_json::Value;

fn assets_present() -> bool {
    let present = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("assets/minilm/model.onnx")
        .exists();
    let required = std::env::var_os("DELTAMEM_REQUIRE_ASSETS").is_some();
    assert!(
        present || !required,
        "DELTAMEM_REQUIRE_ASSETS is set but the assets are missing"
    );
    if !present {
        println!("SKIPPED: assets missing (run tools/setup.sh)");
    }
    present
}

fn deltamem(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_deltamem"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// One recorded episode, straight from the fixture JSON.
struct Recorded {
    task_text: String,
    env_text: String,
    status: String,
    /// What the run's LLM wrote: (memory_description, content_body) per tree.
    task_entry: (String, String),
    env_entry: (String, String),
}

fn fixture_nodes(name: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/reference")
        .join(name);
    let doc: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let mut nodes: Vec<Value> = doc["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| !n["parent_id"].is_null())
        .cloned()
        .collect();
    nodes.sort_by_key(|n| n["meta"]["created_at"].as_f64().unwrap() as u64);
    nodes
}

fn recorded_episodes() -> Vec<Recorded> {
    let task = fixture_nodes("sciworld_qwen3-8b_dev_task.json");
    let env = fixture_nodes("sciworld_qwen3-8b_dev_env.json");
    let text = |n: &Value, key: &str| n["payload"][key].as_str().unwrap().trim().to_string();
    let entry = |n: &Value| (text(n, "memory_description"), text(n, "content_body"));
    task.iter()
        .zip(&env)
        .map(|(t, e)| Recorded {
            task_text: text(t, "scenario_description"),
            env_text: text(e, "scenario_description"),
            status: t["meta"]["result_status"].as_str().unwrap().to_string(),
            task_entry: entry(t),
            env_entry: entry(e),
        })
        .collect()
}

fn provenance(node: &Value) -> Value {
    serde_json::from_str(node["payload"]["provenance"].as_str().expect("provenance")).unwrap()
}

/// Each episode wrote one node per tree, with its own text and its own
/// recorded entry; returns node id -> episode index.
fn trace_episode_nodes(nodes: &[Value], episodes: &[Recorded]) -> BTreeMap<u64, usize> {
    let mut traced = BTreeMap::new();
    for tree in ["task", "env"] {
        let mut seen = vec![0; episodes.len()];
        for node in nodes
            .iter()
            .filter(|n| n["tree"] == tree && n["consolidated_root"] == false)
        {
            let label = provenance(node)["episode"].as_str().unwrap().to_string();
            let n: usize = label[2..4].parse::<usize>().unwrap() - 1;
            let ep = &episodes[n];
            seen[n] += 1;
            let (text, entry, status) = match tree {
                "task" => (&ep.task_text, &ep.task_entry, ep.status.as_str()),
                _ => (&ep.env_text, &ep.env_entry, "SUCCESS"),
            };
            let body = &node["payload"][if tree == "task" {
                "execution_procedure"
            } else {
                "content"
            }];
            assert_eq!(node["scenario"].as_str(), Some(text.as_str()), "{label} {tree}");
            assert_eq!(node["payload"]["activation_condition"].as_str(), Some(entry.0.as_str()));
            assert_eq!(body.as_str(), Some(entry.1.as_str()), "{label} {tree}");
            assert_eq!(node["label"].as_str(), Some(status), "{label} {tree}");
            traced.insert(node["id"].as_u64().unwrap(), n);
        }
        assert!(seen.iter().all(|c| *c == 1), "{tree}: nodes per episode {seen:?}");
    }
    traced
}

/// A consolidated root comes from a flagged node of its tree that traces
/// to an episode, and its text says it was joined, not distilled.
fn check_consolidated_roots(nodes: &[Value], traced: &BTreeMap<u64, usize>) -> usize {
    let by_id: BTreeMap<u64, &Value> = nodes.iter().map(|n| (n["id"].as_u64().unwrap(), n)).collect();
    let mut count = 0;
    for root in nodes.iter().filter(|n| n["consolidated_root"] == true) {
        let source = provenance(root)["source"].as_u64().unwrap();
        assert!(
            traced.contains_key(&source),
            "root {} from untraced #{source}",
            root["id"]
        );
        let source_node = by_id[&source];
        assert_eq!(source_node["consolidated"], true);
        assert_eq!(source_node["tree"], root["tree"]);
        assert_eq!(root["scenario"], source_node["scenario"]);
        let body = root["payload"]["execution_procedure"]
            .as_str()
            .or_else(|| root["payload"]["content"].as_str())
            .unwrap();
        assert!(body.starts_with("[joined by the replay model, not distilled"), "{body}");
        count += 1;
    }
    count
}

/// Depth and parent rules over the dump, D_max 3 as the demo prints.
fn check_shape(nodes: &[Value]) -> (usize, usize) {
    let by_id: BTreeMap<u64, &Value> = nodes.iter().map(|n| (n["id"].as_u64().unwrap(), n)).collect();
    let mut residuals = 0;
    let mut deepest = 0;
    for node in nodes {
        let depth = node["depth"].as_u64().unwrap();
        deepest = deepest.max(depth as usize);
        assert!((1..=3).contains(&depth), "{node}");
        match node["parent"].as_u64() {
            None => assert_eq!((node["type"].as_str(), depth), (Some("ROOT"), 1)),
            Some(p) => {
                residuals += 1;
                assert_eq!(node["type"], "RESIDUAL");
                assert_eq!(by_id[&p]["depth"].as_u64().unwrap() + 1, depth);
                assert_eq!(by_id[&p]["tree"], node["tree"]);
            }
        }
    }
    (residuals, deepest)
}

/// "task #2 0.767 -> ..." of episode `line_no` (1-based): the chain's last
/// node and the score.
fn printed_task_match(stdout: &str, line_no: usize) -> Option<(u64, f32)> {
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{line_no} ")))?;
    let after = line.split("| task ").nth(1)?;
    let mut words = after.split_whitespace();
    let chain = words.next()?;
    let score = words.next()?.parse().ok()?;
    let node = chain.rsplit('#').next()?.parse().ok()?;
    Some((node, score))
}

#[test]
fn replay_traces_every_node_to_one_recorded_episode() {
    if !assets_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bank = dir.path().join("demo");
    let bank = bank.to_str().unwrap();
    let stdout = deltamem(&["demo", bank]);
    assert!(stdout.contains("REPLAYED LLM"), "{stdout}");

    let episodes = recorded_episodes();
    assert_eq!(episodes.len(), 30);
    let nodes: Vec<Value> = deltamem(&["dump", bank])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let traced = trace_episode_nodes(&nodes, &episodes);
    assert_eq!(traced.len(), 60, "one node per episode and tree");
    let consolidated = check_consolidated_roots(&nodes, &traced);
    assert!(consolidated >= 1, "the demo must show a consolidation");
    assert_eq!(nodes.len(), 60 + consolidated);
    let (residuals, deepest) = check_shape(&nodes);
    assert!(
        residuals > 0 && deepest == 3,
        "residuals {residuals}, deepest {deepest}"
    );
    assert!(stdout.contains("D_max)"), "no write met the depth limit:\n{stdout}");
    assert!(deltamem(&["verify", bank]).starts_with("ok: "));

    // A printed score is MiniLM's cosine between the two task texts.
    let mut embedder = {
        std::env::set_current_dir(env!("CARGO_MANIFEST_DIR")).unwrap();
        OnnxEmbedder::from_env().unwrap()
    };
    let (line_no, (node, score)) = (1..=30)
        .filter_map(|n| printed_task_match(&stdout, n).map(|m| (n, m)))
        .find(|(_, (node, _))| traced.contains_key(node))
        .expect("some episode retrieved a task chain");
    let matched = &episodes[traced[&node]];
    let texts = [episodes[line_no - 1].task_text.as_str(), matched.task_text.as_str()];
    let v = embedder.embed_batch(&texts, TextRole::Query).unwrap();
    let cosine: f32 = v[0].iter().zip(&v[1]).map(|(a, b)| a * b).sum();
    let penalty = if matched.status == "FAILURE" { 0.05 } else { 0.0 };
    assert!(
        (cosine - penalty - score).abs() < 0.002,
        "episode {line_no}: printed {score}, MiniLM gives {cosine} - {penalty}"
    );
}

#[test]
fn without_the_assets_the_toy_demo_runs_and_says_how_to_get_the_real_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_deltamem"));
    cmd.args(["demo", dir.path().join("demo").to_str().unwrap()])
        .current_dir(dir.path())
        .env("DELTAMEM_ASSETS", dir.path().join("no-assets-here"));
    for var in [
        "DELTAMEM_ORT_LIB",
        "ORT_DYLIB_PATH",
        "DELTAMEM_EMBED_MODEL",
        "DELTAMEM_EMBED_TOKENIZER",
    ] {
        cmd.env_remove(var);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("toy embedder"), "{stdout}");
    assert!(
        stdout.contains("This is the toy demo: the MiniLM assets are not usable"),
        "{stdout}"
    );
    assert!(stdout.contains("tools/setup.sh"), "{stdout}");
    assert!(!stdout.contains("REPLAYED LLM"), "{stdout}");
}

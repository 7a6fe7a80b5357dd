#![cfg(feature = "agent")]
//! The memory loop end to end, against a real HTTP server on 127.0.0.1
//! that speaks the chat-completions protocol and answers from a script.
//! A table embedder makes the similarities exact, so the expected tree can
//! be written down: cold-start roots, residuals, a skip, a sibling at
//! D_max, a consolidation at K_cons; then timeouts, 5xx, garbage and
//! non-JSON replies, each with a clear error and an unchanged bank.

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use deltamem::agent::{
    AgentConfig, AgentError, ConsolidationStatus, DomainProfile, EmbedError, Embedder, Episode, HttpChat, LlmConfig,
    LlmError, MemoryLoop, ReplyError, TextRole, WriteAction,
};
use deltamem::{Bank, BankConfig, NodeInfo, OpenOptions, TreeSpec};
use serde_json::{Value, json};

mod common;

use common::llm_server::{Canned, Request, Server, content};

// -------------------------------------------------------------- embedder

/// Exact vectors per text, so every similarity in the scenario is known.
struct TableEmbedder {
    table: HashMap<&'static str, Vec<f32>>,
}

const A1: &str = "put a clean mug in the coffee machine";
const A2: &str = "put a clean cup in the coffee machine";
const A3: &str = "put a rinsed cup in the coffee machine";
const A4: &str = "put a rinsed cup in the coffee machine twice";
const K1: &str = "kitchen with a sink and a coffee machine";
const K2: &str = "studio with a sink and a coffee machine";
const DIM: usize = 6;

fn unit(v: [f32; DIM]) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter().map(|x| x / n).collect()
}

impl TableEmbedder {
    fn new() -> TableEmbedder {
        let table = HashMap::from([
            // cos(A1, A2) = 0.894; cos(A2, A3) = 0.949; cos(A3, A4) = 0.978.
            (A1, unit([1.0, 0.0, 0.0, 0.0, 0.0, 0.0])),
            (A2, unit([1.0, 0.5, 0.0, 0.0, 0.0, 0.0])),
            (A3, unit([1.0, 1.0, 0.0, 0.0, 0.0, 0.0])),
            (A4, unit([1.0, 1.0, 0.3, 0.0, 0.0, 0.0])),
            (K1, unit([0.0, 0.0, 0.0, 1.0, 0.0, 0.0])),
            (K2, unit([0.0, 0.0, 0.0, 0.0, 1.0, 0.0])),
        ]);
        TableEmbedder { table }
    }
}

impl Embedder for TableEmbedder {
    fn dim(&self) -> usize {
        DIM
    }
    fn model_id(&self) -> String {
        "table".into()
    }
    fn embed_batch(&mut self, texts: &[&str], _role: TextRole) -> Result<Vec<Vec<f32>>, EmbedError> {
        texts
            .iter()
            .map(|t| {
                self.table
                    .get(t)
                    .cloned()
                    .ok_or_else(|| EmbedError::Inference(format!("no vector for {t:?}")))
            })
            .collect()
    }
}

// ----------------------------------------------------------------- setup

/// A bank with the paper's two trees, tau 0.8, D_max 3, K_cons 2.
fn new_bank(dir: &Path) {
    let config = BankConfig {
        dim_count: DIM as u32,
        trees: vec![
            TreeSpec {
                name: "task".into(),
                tau: 0.8,
            },
            TreeSpec {
                name: "env".into(),
                tau: 0.8,
            },
        ],
        eps: 0.05,
        max_depth: 3,
        consolidate_after: 2,
        rows_per_segment: None,
        ..BankConfig::new(DIM as u32)
    };
    Bank::create_dir(dir, config).unwrap().close().unwrap();
}

fn llm_config(server: &Server) -> LlmConfig {
    let mut c = LlmConfig::new(&server.url, "scripted-model");
    c.api_key = Some("test-key".into());
    c.connect_timeout = Duration::from_secs(2);
    c.read_timeout = Duration::from_secs(5);
    c.max_attempts = 3;
    c.backoff_initial = Duration::from_millis(10);
    c.backoff_max = Duration::from_millis(50);
    c
}

fn memory_loop(dir: &Path, llm: LlmConfig) -> MemoryLoop {
    let config = AgentConfig::new(dir, DomainProfile::alfworld());
    MemoryLoop::new(config, TableEmbedder::new(), HttpChat::new(llm).unwrap())
}

/// Every node with its row (counters, flags) and payload.
fn dump(dir: &Path) -> Vec<NodeInfo> {
    let bank = Bank::open_dir(
        dir,
        OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        },
    )
    .unwrap();
    (0..bank.node_count()).map(|i| bank.node(i).unwrap()).collect()
}

fn skill(tag: &str) -> String {
    json!({
        "activation_condition": format!("when {tag} applies"),
        "execution_procedure": format!("1. step of {tag}\n2. another step of {tag}"),
        "termination_condition": format!("{tag} is done"),
    })
    .to_string()
}

fn knowledge(tag: &str) -> String {
    json!({
        "activation_condition": format!("Applies to household scenes where {tag}"),
        "content": format!("facts about {tag}"),
    })
    .to_string()
}

const SKIP: &str = r#"{"skip": true}"#;

fn trajectory(n: usize) -> String {
    format!(
        "> go to sinkbasin 1\nOn the sinkbasin 1, you see a cup {n}.\n> take cup {n} from sinkbasin 1\nYou pick up the cup."
    )
}

fn episode(ml: &mut MemoryLoop, task: &str, env: &str, success: bool, n: usize) -> Episode {
    let retrieval = ml.retrieve(task, env).unwrap();
    let mut e = Episode::new(task, env, trajectory(n), success).with_retrieval(&retrieval);
    e.id = Some(format!("ep-{n}"));
    e.steps = Some(4);
    e.max_steps = Some(50);
    e.reward = Some(if success { 1.0 } else { 0.0 });
    e
}

/// The replies for episodes 1-4 of the scenario (see `the_expected_tree`),
/// two per episode: task first, then env.
fn scenario_until_due() -> Vec<Canned> {
    vec![
        // 1: cold start, both trees empty.
        content(&format!("Here is the skill:\n```json\n{}\n```\nDone.", skill("A1"))),
        content(&knowledge("K1")),
        // 2: failure near A1; env K1 already covered.
        content(
            "{\"activation_condition\": \"cup tasks\",\n \"execution_procedure\": \"WHAT FAILED: took the mug\nNOT TRIED: the cup\",\n \"termination_condition\": \"\"}",
        ),
        content(SKIP),
        // 3: success near A2 (the failure record); env K2 is new.
        content(&skill("A3")),
        content(&knowledge("K2")),
        // 4: success nearest A3, which sits at D_max; env update under K2.
        content(&skill("A4")),
        content(&knowledge("K2 detail")),
    ]
}

// ----------------------------------------------------------------- tests

#[test]
fn the_expected_tree() {
    let dir = tempfile::tempdir().unwrap();
    new_bank(dir.path());
    let mut script = scenario_until_due();
    // 5: success on A3 again: both chains already cover it (skips); the
    // hit makes node 3 due (K_cons = 2); its chain is distilled.
    script.push(content(SKIP));
    script.push(content("```\n{\"skip\": \"true\"}\n```"));
    script.push(content(&skill("distilled A3")));
    let server = Server::start(script);
    let mut ml = memory_loop(dir.path(), llm_config(&server));

    // Episode 1: cold start: a root in each tree, no hits.
    let e1 = episode(&mut ml, A1, K1, true, 1);
    let r = ml.retrieve(A1, K1).unwrap();
    assert!(r.task.is_none() && r.env.is_none() && r.context.is_empty());
    let out = ml.record(&e1).unwrap();
    assert_eq!(
        (out.task.action, out.task.node, out.task.depth),
        (WriteAction::Root, Some(0), Some(1))
    );
    assert_eq!(
        (out.env.action, out.env.node, out.env.label.as_deref()),
        (WriteAction::Root, Some(1), Some("SUCCESS"))
    );
    assert!(out.success_hits.is_empty() && out.retrievals_counted.is_empty());

    // Episode 2 fails: task residual (FAILURE) under 0; env skip.
    let e2 = episode(&mut ml, A2, K1, false, 2);
    assert_eq!(e2.retrieved_task, Some(vec![0]));
    assert_eq!(e2.retrieved_env, Some(vec![1]));
    let out = ml.record(&e2).unwrap();
    assert_eq!(out.task.action, WriteAction::Residual);
    assert_eq!(
        (out.task.node, out.task.parent, out.task.depth),
        (Some(2), Some(0), Some(2))
    );
    assert_eq!(out.task.label.as_deref(), Some("FAILURE"));
    assert_eq!(out.task.prompt, "task-residual-failure");
    assert_eq!(
        (out.env.action, out.env.node, out.env.matched),
        (WriteAction::Skip, None, Some(1))
    );
    assert!(out.success_hits.is_empty(), "a failure counts no success hit");
    assert_eq!(out.retrievals_counted, vec![0, 1]);

    // Episode 3 succeeds, matching the failure record 2 (0.949 - 0.05
    // beats 0.707): residual at depth 3 = D_max; env K2 is a new root.
    let e3 = episode(&mut ml, A3, K2, true, 3);
    assert_eq!(e3.retrieved_task, Some(vec![0, 2]));
    assert_eq!(e3.retrieved_env, None);
    let out = ml.record(&e3).unwrap();
    assert_eq!(
        (out.task.node, out.task.parent, out.task.depth),
        (Some(3), Some(2), Some(3))
    );
    assert_eq!((out.env.action, out.env.node), (WriteAction::Root, Some(4)));
    assert_eq!(out.success_hits.len(), 1);
    assert_eq!((out.success_hits[0].node, out.success_hits[0].success_hits), (2, 1));

    // Episode 4 matches node 3 at D_max: the new node becomes its sibling.
    let e4 = episode(&mut ml, A4, K2, true, 4);
    assert_eq!(e4.retrieved_task, Some(vec![0, 2, 3]));
    assert_eq!(e4.retrieved_env, Some(vec![4]));
    let out = ml.record(&e4).unwrap();
    assert_eq!(
        (out.task.node, out.task.parent, out.task.depth),
        (Some(5), Some(2), Some(3))
    );
    assert!(out.task.beside_match);
    assert_eq!(
        (out.env.action, out.env.node, out.env.parent),
        (WriteAction::Residual, Some(6), Some(4))
    );
    assert!(out.consolidations.is_empty());

    // Episode 5: A3 again. Skips in both trees, yet the matched nodes get
    // their hits; node 3 reaches K_cons and is consolidated.
    let e5 = episode(&mut ml, A3, K2, true, 5);
    assert_eq!(e5.retrieved_task, Some(vec![0, 2, 3]));
    let out = ml.record(&e5).unwrap();
    assert_eq!(out.task.action, WriteAction::Skip);
    assert_eq!(out.env.action, WriteAction::Skip);
    let hits: Vec<(u32, u32, bool)> = out
        .success_hits
        .iter()
        .map(|h| (h.node, h.success_hits, h.due))
        .collect();
    assert_eq!(hits, vec![(3, 2, true), (4, 2, false)], "roots are never due");
    assert_eq!(out.consolidations.len(), 1);
    let c = &out.consolidations[0];
    assert_eq!((c.node, c.status, c.new_root), (3, ConsolidationStatus::Done, Some(7)));

    // The consolidated node is no longer matched: its distilled root is.
    let r = ml.retrieve(A3, K2).unwrap();
    let task = r.task.as_ref().unwrap();
    assert_eq!(
        (task.node, task.chain.clone(), task.node_type.as_str()),
        (7, vec![7], "ROOT")
    );
    assert!(r.context.contains("distilled A3"));
    let task_at = r.context.find("=== Task skill memory ===").unwrap();
    let env_at = r.context.find("=== Environment knowledge memory ===").unwrap();
    assert!(task_at < env_at, "task chain first");

    // The whole tree, as the rules say.
    let nodes = dump(dir.path());
    type Shape<'a> = (u32, &'a str, &'a str, &'a str, Option<u32>, u8);
    let shape: Vec<Shape> = nodes
        .iter()
        .map(|n| {
            (
                n.row.index,
                n.tree_name.as_str(),
                n.row.node_type.as_str(),
                n.row.label.as_str(),
                n.row.parent(),
                n.row.depth,
            )
        })
        .collect();
    assert_eq!(
        shape,
        vec![
            (0, "task", "ROOT", "SUCCESS", None, 1),
            (1, "env", "ROOT", "SUCCESS", None, 1),
            (2, "task", "RESIDUAL", "FAILURE", Some(0), 2),
            (3, "task", "RESIDUAL", "SUCCESS", Some(2), 3),
            (4, "env", "ROOT", "SUCCESS", None, 1),
            (5, "task", "RESIDUAL", "SUCCESS", Some(2), 3),
            (6, "env", "RESIDUAL", "SUCCESS", Some(4), 2),
            (7, "task", "ROOT", "SUCCESS", None, 1),
        ]
    );
    let counters: Vec<(u32, u32)> = nodes.iter().map(|n| (n.row.success_hits, n.row.retrievals)).collect();
    // retrievals: 0 in chains of episodes 2-5; 2 in 3-5; 3 in 4-5; 1 in 2
    // and 5 (skips count too); 4 in 4-5.
    assert_eq!(
        counters,
        vec![(0, 4), (0, 1), (1, 3), (2, 2), (2, 2), (0, 0), (0, 0), (0, 0)]
    );
    assert!(nodes[3].row.is_consolidated() && nodes[7].row.is_consolidated_root());
    assert_eq!(
        nodes[7].payload.scenario, A3,
        "the distilled root keeps the source's scenario"
    );
    assert_eq!(
        nodes[7].payload.fields["activation_condition"],
        "when distilled A3 applies"
    );
    let bank = Bank::open_dir(
        dir.path(),
        OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        },
    )
    .unwrap();
    assert_eq!(
        bank.vector(7).unwrap(),
        bank.vector(3).unwrap(),
        "same embedding as the source"
    );
    // Payload extras: trajectory kept, provenance recorded, both hidden
    // from the rendered chain.
    assert!(nodes[0].payload.fields["trajectory"].contains("cup 1"));
    let prov: Value = serde_json::from_str(&nodes[0].payload.fields["provenance"]).unwrap();
    assert_eq!(
        (prov["episode"].as_str(), prov["prompt"].as_str()),
        (Some("ep-1"), Some("task-root-success"))
    );
    assert!(!r.context.contains("provenance") && !r.context.contains("sinkbasin"));

    // What the server saw: 11 requests, each a proper chat completion.
    let requests = server.requests();
    assert_eq!(requests.len(), 11);
    for q in &requests {
        assert_eq!(q.path, "/v1/chat/completions");
        assert_eq!(
            q.headers.get("authorization").map(String::as_str),
            Some("Bearer test-key")
        );
        assert_eq!(q.body["model"], "scripted-model");
        assert_eq!(q.body["temperature"], 0.0);
        assert_eq!(q.body["messages"][0]["role"], "system");
    }
    let users: Vec<String> = requests.iter().map(Request::user_text).collect();
    assert!(users[0].contains("new BASE SKILL") && users[0].contains("cup 1"));
    assert!(users[1].contains("BASE ENVIRONMENT KNOWLEDGE"));
    // Residual prompts carry the rendered retrieved chain and offer skip.
    assert!(users[2].contains("FAILURE RECORD patch") && users[2].contains("when A1 applies"));
    assert!(users[3].contains("Facts about K1") || users[3].contains("facts about K1"));
    assert!(users[3].contains(SKIP));
    assert!(users[4].contains("SKILL PATCH") && users[4].contains("[Failure Record 1]"));
    // The distillation input marks the failure record as such.
    let distill = &users[10];
    assert!(distill.contains("CONSOLIDATED SKILL"));
    assert!(distill.contains("[Patch 1 - FAILED: a warning from a failed episode, not a procedure]"));
    assert!(distill.contains("[Patch 2]") && distill.contains("when A3 applies"));
    assert!(
        !distill.contains("sinkbasin"),
        "raw trajectories stay out of the distillation"
    );
}

/// Episodes 1-4 (8 replies) then episode 5 whose distillation fails:
/// nothing is consolidated, the hits stay counted, and `consolidate_due`
/// retries on request.
#[test]
fn failed_distillation_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    new_bank(dir.path());
    let mut script = scenario_until_due();
    script.push(content(SKIP));
    script.push(content(SKIP));
    script.push(content("The chain looks great, nothing to add!"));
    script.push(content(&skill("retried distillation")));
    let server = Server::start(script);
    let mut ml = memory_loop(dir.path(), llm_config(&server));
    for (n, (task, env, ok)) in [(A1, K1, true), (A2, K1, false), (A3, K2, true), (A4, K2, true)]
        .into_iter()
        .enumerate()
    {
        let e = episode(&mut ml, task, env, ok, n + 1);
        ml.record(&e).unwrap();
    }
    let e5 = episode(&mut ml, A3, K2, true, 5);
    let out = ml.record(&e5).unwrap();
    assert_eq!(out.consolidations.len(), 1);
    let c = &out.consolidations[0];
    assert_eq!((c.node, c.status, c.new_root), (3, ConsolidationStatus::Failed, None));
    let reason = c.reason.as_deref().unwrap();
    assert!(
        reason.contains("distill-task") && reason.contains("no JSON object"),
        "{reason}"
    );
    let nodes = dump(dir.path());
    assert_eq!(nodes.len(), 7, "no root written");
    assert!(!nodes[3].row.is_consolidated());
    assert_eq!(nodes[3].row.success_hits, 2, "the hit itself stays counted");

    let retried = ml.consolidate_due().unwrap();
    assert_eq!(retried.len(), 1);
    assert_eq!(
        (retried[0].node, retried[0].status, retried[0].new_root),
        (3, ConsolidationStatus::Done, Some(7))
    );
    assert!(ml.consolidate_due().unwrap().is_empty());
    assert_eq!(server.requests().len(), 12);
}

/// Another process consolidates the node while the LLM is distilling:
/// the loop's commit is refused cleanly and reported, not an error.
#[test]
fn consolidation_race_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    new_bank(dir.path());
    let mut script = scenario_until_due();
    script.push(content(SKIP));
    script.push(content(SKIP));
    let bank_dir = dir.path().to_path_buf();
    let rival = move || {
        // The loop holds no lock during the LLM call, so this succeeds.
        let mut bank = Bank::open_dir(&bank_dir, OpenOptions::default()).expect("writer lock is free");
        let mut fields = std::collections::BTreeMap::new();
        fields.insert("activation_condition".to_string(), "rival".to_string());
        fields.insert("execution_procedure".to_string(), "rival steps".to_string());
        bank.consolidate(3, fields).unwrap();
        bank.close().unwrap();
    };
    script.push(Canned::Hook(Box::new(rival), Box::new(content(&skill("late")))));
    let server = Server::start(script);
    let mut ml = memory_loop(dir.path(), llm_config(&server));
    for (n, (task, env, ok)) in [(A1, K1, true), (A2, K1, false), (A3, K2, true), (A4, K2, true)]
        .into_iter()
        .enumerate()
    {
        let e = episode(&mut ml, task, env, ok, n + 1);
        ml.record(&e).unwrap();
    }
    let e5 = episode(&mut ml, A3, K2, true, 5);
    let out = ml.record(&e5).unwrap();
    let c = &out.consolidations[0];
    assert_eq!(
        (c.node, c.status, c.new_root),
        (3, ConsolidationStatus::AlreadyConsolidated, None)
    );
    let nodes = dump(dir.path());
    assert_eq!(nodes.len(), 8, "only the rival's root");
    assert_eq!(nodes[7].payload.fields["activation_condition"], "rival");
    drop(server);
}

/// A bank with one episode recorded (roots 0 and 1), and its dump.
fn seeded(dir: &Path) -> Vec<NodeInfo> {
    new_bank(dir);
    let server = Server::start(vec![content(&skill("A1")), content(&knowledge("K1"))]);
    let mut ml = memory_loop(dir, llm_config(&server));
    let e = episode(&mut ml, A1, K1, true, 1);
    ml.record(&e).unwrap();
    dump(dir)
}

/// Records episode 2 (near A1 / K1: residual prompts) against `script`
/// and returns the error; asserts the bank did not change.
fn failing_record(script: Vec<Canned>, llm: impl FnOnce(&Server) -> LlmConfig) -> (AgentError, Vec<Request>, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let before = seeded(dir.path());
    let server = Server::start(script);
    let mut ml = memory_loop(dir.path(), llm(&server));
    let e = episode(&mut ml, A2, K1, true, 2);
    let start = Instant::now();
    let err = ml.record(&e).expect_err("record must fail");
    let took = start.elapsed();
    assert_eq!(dump(dir.path()), before, "the bank changed after: {err}");
    let requests = server.requests();
    drop(server);
    (err, requests, took)
}

#[test]
fn timeout_is_a_clear_error() {
    let slow = || Canned::Slow(Duration::from_millis(1500), Box::new(content(&skill("late"))));
    let (err, _, took) = failing_record(vec![slow(), slow()], |s| {
        let mut c = llm_config(s);
        c.read_timeout = Duration::from_millis(300);
        c.max_attempts = 2;
        c
    });
    match &err {
        AgentError::Llm {
            prompt: "task-residual-success",
            source: LlmError::Timeout { attempts: 2, .. },
        } => {}
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("timed out"), "{err}");
    assert!(took < Duration::from_millis(1400), "gave up after {took:?}");
}

#[test]
fn server_errors_then_success_are_retried() {
    let dir = tempfile::tempdir().unwrap();
    seeded(dir.path());
    let server = Server::start(vec![
        Canned::Status(500, "{\"error\":\"boom\"}".into()),
        Canned::RetryAfter(429, 0),
        content(&skill("A2")),
        Canned::Status(503, "busy".into()),
        content(SKIP),
    ]);
    let mut ml = memory_loop(dir.path(), llm_config(&server));
    let e = episode(&mut ml, A2, K1, true, 2);
    let out = ml.record(&e).unwrap();
    assert_eq!((out.task.action, out.task.parent), (WriteAction::Residual, Some(0)));
    assert_eq!(out.env.action, WriteAction::Skip);
    assert_eq!(server.requests().len(), 5);
}

#[test]
fn persistent_server_errors_give_up() {
    let five_hundred = || Canned::Status(500, "{\"error\":{\"message\":\"model crashed\"}}".into());
    let (err, requests, _) = failing_record(vec![five_hundred(), five_hundred(), five_hundred()], llm_config);
    match &err {
        AgentError::Llm {
            source:
                LlmError::Status {
                    status: 500,
                    attempts: 3,
                    body,
                    ..
                },
            ..
        } => assert!(body.contains("model crashed")),
        other => panic!("{other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains("HTTP 500") && text.contains("3 attempt"), "{text}");
    assert_eq!(requests.len(), 3, "bounded attempts");
    // A 4xx other than 408/409/429 is not retried.
    let (err, requests, _) = failing_record(vec![Canned::Status(401, "bad key".into())], llm_config);
    assert!(matches!(
        err,
        AgentError::Llm {
            source: LlmError::Status {
                status: 401,
                attempts: 1,
                ..
            },
            ..
        }
    ));
    assert_eq!(requests.len(), 1);
}

#[test]
fn unreachable_server_is_a_connection_error() {
    let dir = tempfile::tempdir().unwrap();
    let before = seeded(dir.path());
    // A port that was just free: nothing listens there.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut c = LlmConfig::new(format!("http://127.0.0.1:{port}/v1"), "m");
    c.max_attempts = 2;
    c.backoff_initial = Duration::from_millis(10);
    let mut ml = MemoryLoop::new(
        AgentConfig::new(dir.path(), DomainProfile::generic()),
        TableEmbedder::new(),
        HttpChat::new(c).unwrap(),
    );
    let e = episode(&mut ml, A2, K1, true, 2);
    let err = ml.record(&e).unwrap_err();
    assert!(
        matches!(
            err,
            AgentError::Llm {
                source: LlmError::Connection { attempts: 2, .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(dump(dir.path()), before);
}

#[test]
fn garbage_replies_are_clear_errors_and_change_nothing() {
    type Check = fn(&AgentError) -> bool;
    let cases: Vec<(Vec<Canned>, Check)> = vec![
        // Prose without JSON.
        (vec![content("I think the episode went well overall.")], |e| {
            matches!(
                e,
                AgentError::Reply {
                    source: ReplyError::NoObject { .. },
                    ..
                }
            )
        }),
        // JSON, but an array.
        (vec![content("[\"step 1\", \"step 2\"]")], |e| {
            matches!(
                e,
                AgentError::Reply {
                    source: ReplyError::NotAnObject { .. },
                    ..
                }
            )
        }),
        // A truncated object.
        (vec![content("{\"activation_condition\": \"when")], |e| {
            matches!(
                e,
                AgentError::Reply {
                    source: ReplyError::Malformed { .. },
                    ..
                }
            )
        }),
        // An object without the procedure.
        (
            vec![content("{\"activation_condition\": \"x\"}")],
            |e| matches!(e, AgentError::Reply { source: ReplyError::MissingField { field, .. }, .. } if field == "execution_procedure"),
        ),
        // An empty reply.
        (vec![content("")], |e| {
            matches!(
                e,
                AgentError::Reply {
                    source: ReplyError::Empty,
                    ..
                }
            )
        }),
        // The HTTP body is not JSON at all.
        (vec![Canned::Body("<html>502 Bad Gateway</html>".into())], |e| {
            matches!(
                e,
                AgentError::Llm {
                    source: LlmError::BadResponse { .. },
                    ..
                }
            )
        }),
        // JSON, but not a chat completion.
        (vec![Canned::Body("{\"result\": \"ok\"}".into())], |e| {
            matches!(
                e,
                AgentError::Llm {
                    source: LlmError::BadResponse { .. },
                    ..
                }
            )
        }),
        // A reply too large to store: the reply's fault (a 502 on the
        // server), not the episode's (it was a 400 naming `payload`).
        (
            vec![
                content(&format!(
                    "{{\"activation_condition\": \"x\", \"execution_procedure\": \"{}\"}}",
                    "y".repeat(5 << 20)
                )),
                content(&knowledge("K2")),
            ],
            |e| {
                matches!(
                    e,
                    AgentError::Reply {
                        source: ReplyError::TooLarge { .. },
                        ..
                    }
                )
            },
        ),
        // The task reply is fine, the env reply is garbage: still nothing written.
        (vec![content(&skill("A2")), content("no idea")], |e| {
            matches!(
                e,
                AgentError::Reply {
                    prompt: "env-residual",
                    ..
                }
            )
        }),
    ];
    for (i, (script, check)) in cases.into_iter().enumerate() {
        let (err, _, _) = failing_record(script, llm_config);
        assert!(check(&err), "case {i}: {err:?}");
        assert!(!err.to_string().is_empty());
    }
}

#[test]
fn skip_on_a_root_prompt_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    new_bank(dir.path());
    let server = Server::start(vec![content(SKIP)]);
    let mut ml = memory_loop(dir.path(), llm_config(&server));
    let e = episode(&mut ml, A1, K1, true, 1);
    let err = ml.record(&e).unwrap_err();
    assert!(
        matches!(
            err,
            AgentError::Reply {
                prompt: "task-root-success",
                source: ReplyError::SkipNotAllowed
            }
        ),
        "{err:?}"
    );
    assert!(dump(dir.path()).is_empty());
}

#[test]
fn bad_episodes_are_refused_before_any_call() {
    let dir = tempfile::tempdir().unwrap();
    let before = seeded(dir.path());
    let server = Server::start(vec![]);
    let mut ml = memory_loop(dir.path(), llm_config(&server));
    let mut e = Episode::new(A2, K1, trajectory(2), true);
    e.retrieved_task = Some(vec![1]); // an env node
    assert!(matches!(ml.record(&e), Err(AgentError::BadEpisode(m)) if m.contains("not in tree")));
    e.retrieved_task = Some(vec![9]);
    assert!(matches!(ml.record(&e), Err(AgentError::BadEpisode(m)) if m.contains("does not exist")));
    e.retrieved_task = Some(vec![1, 0]);
    assert!(matches!(ml.record(&e), Err(AgentError::BadEpisode(_))));
    e.retrieved_task = None;
    e.trajectory = "  ".into();
    assert!(matches!(ml.record(&e), Err(AgentError::BadEpisode(_))));
    assert!(server.requests().is_empty(), "no LLM call for a bad episode");
    assert_eq!(dump(dir.path()), before);
}

#[test]
fn results_serialise_for_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    new_bank(dir.path());
    let server = Server::start(vec![content(&skill("A1")), content(&knowledge("K1"))]);
    let mut ml = memory_loop(dir.path(), llm_config(&server));
    let r = ml.retrieve(A1, K1).unwrap();
    let text = serde_json::to_string(&r).unwrap();
    assert_eq!(serde_json::from_str::<deltamem::agent::Retrieval>(&text).unwrap(), r);
    // An episode file as the CLI reads it: optional fields may be absent.
    let e: Episode = serde_json::from_value(json!({
        "task_text": A1, "env_text": K1, "trajectory": trajectory(1), "success": true
    }))
    .unwrap();
    let out = ml.record(&e).unwrap();
    let v = serde_json::to_value(&out).unwrap();
    assert_eq!(v["task"]["action"], "root");
    assert_eq!(v["env"]["node"], 1);
    let emb = deltamem::agent::embed_text(ml.embedder_mut(), A1, TextRole::Query).unwrap();
    assert_eq!(serde_json::to_value(&emb).unwrap()["dim"], DIM);
}

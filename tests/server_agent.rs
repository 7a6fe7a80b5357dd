//! `POST /v1/record` and `POST /v1/retrieve` of a real `deltamem serve`
//! (feature `agent`) on 127.0.0.1, with a scripted chat-completions server
//! on loopback standing in for the LLM: what a record writes is found by
//! query and retrieve, every error status, writes that go on while a
//! record waits for its LLM, concurrent records.
#![cfg(feature = "agent")]

mod common;
mod server_common;

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use common::llm_server::{Canned, Server as Llm, content};
use deltamem::agent::{Embedder, OnnxEmbedder, TextRole};
use serde_json::{Value, json};
use server_common::{Server, bank, node, vector};

const DIM: u32 = 384;

fn assets_present() -> bool {
    let present = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("assets/minilm/model.onnx")
        .exists();
    if !present {
        assert!(
            std::env::var_os("DELTAMEM_REQUIRE_ASSETS").is_none(),
            "assets required (DELTAMEM_REQUIRE_ASSETS) but assets/minilm is missing"
        );
        println!("SKIPPED: assets missing (run tools/setup-agent-assets.sh)");
    }
    present
}

fn with_llm(bank: &Path, llm: &Llm, extra: &[&str]) -> Server {
    Server::start_with_env(
        bank,
        extra,
        &[("DELTAMEM_LLM_BASE_URL", &llm.url), ("DELTAMEM_LLM_MODEL", "scripted")],
    )
}

fn skill(procedure: &str) -> Canned {
    content(
        &json!({"activation_condition": "water must boil", "execution_procedure": procedure,
                "termination_condition": "it boils"})
        .to_string(),
    )
}

fn facts(text: &str) -> Canned {
    content(&json!({"activation_condition": "in a kitchen", "content": text}).to_string())
}

/// One reply that serves either tree's extraction prompt.
fn either() -> Canned {
    content(
        r#"{"activation_condition": "any", "execution_procedure": "1. act", "termination_condition": "done",
            "content": "a fact"}"#,
    )
}

fn episode(task: &str, success: bool, chains: Option<(&Value, &Value)>) -> Value {
    let mut e = json!({"task_text": task, "env_text": "a kitchen with a stove and a sink",
                       "trajectory": "go to kitchen\nfill pot\nactivate stove", "success": success});
    if let Some((t, v)) = chains {
        e["retrieved_task"] = t.clone();
        e["retrieved_env"] = v.clone();
    }
    e
}

fn query_vector(text: &str) -> Vec<f32> {
    std::env::set_current_dir(env!("CARGO_MANIFEST_DIR")).unwrap();
    OnnxEmbedder::from_env().unwrap().embed(text, TextRole::Query).unwrap()
}

#[test]
fn a_recorded_episode_is_found_by_query_and_retrieve() {
    if !assets_present() {
        return;
    }
    let (_dir, path) = bank(DIM);
    let llm = Llm::start(vec![
        skill("1. fill the pot\n2. turn the stove on"),
        facts("the stove is left of the sink"),
        skill("1. use the kettle instead"),
        facts("the kettle is by the window"),
    ]);
    let server = with_llm(&path, &llm, &[]);
    let first = server.post("/v1/record?profile=scienceworld", &episode("boil water", true, None));
    assert_eq!(
        (first["task"]["action"].as_str(), first["env"]["action"].as_str()),
        (Some("root"), Some("root")),
        "{first}"
    );
    let task_node = first["task"]["node"].as_u64().unwrap();
    let env_node = first["env"]["node"].as_u64().unwrap();
    assert_eq!(llm.requests().len(), 2, "one extraction per tree");

    // The stored node carries what the LLM extracted, and a text query finds it.
    let stored = server.get(&format!("/v1/nodes/{task_node}"));
    assert_eq!(stored["scenario"], "boil water");
    assert_eq!(
        stored["payload"]["execution_procedure"],
        "1. fill the pot\n2. turn the stove on"
    );
    let found = server.post(
        "/v1/trees/task/query",
        &json!({"embedding": query_vector("boil water"), "k": 1}),
    );
    assert_eq!(found["matches"][0]["id"].as_u64(), Some(task_node), "{found}");

    let retrieved = server.post(
        "/v1/retrieve",
        &json!({"task": "boil water", "env": "a kitchen with a stove and a sink"}),
    );
    assert_eq!(retrieved["task"]["node"].as_u64(), Some(task_node));
    assert_eq!(retrieved["env"]["node"].as_u64(), Some(env_node));
    let context = retrieved["context"].as_str().unwrap();
    assert!(
        context.contains("turn the stove on") && context.contains("left of the sink"),
        "{context}"
    );

    // A second, successful episode that used those chains: residuals under
    // them, their retrievals and success hits counted in the same commit.
    let chains = (&retrieved["task"]["chain"], &retrieved["env"]["chain"]);
    let second = server.post("/v1/record", &episode("boil water", true, Some(chains)));
    assert_eq!(second["task"]["action"], "residual", "{second}");
    assert_eq!(second["task"]["parent"].as_u64(), Some(task_node));
    assert_eq!(second["env"]["parent"].as_u64(), Some(env_node));
    let matched = server.get(&format!("/v1/nodes/{task_node}"));
    assert_eq!(
        (matched["success_hits"].as_u64(), matched["retrievals"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(server.get("/v1/bank")["node_count"], 4);
    assert_eq!(server.get("/v1/verify")["ok"], true);
    assert_eq!(server.terminate(), 0);
}

/// Bad input to /v1/record is a 400 naming the field even on a server
/// with no LLM (it was the 503 for the missing LLM), and a good episode
/// then gets that 503. Needs no model assets.
#[test]
fn record_refuses_bad_input_before_asking_for_an_llm() {
    let (_dir, path) = bank(DIM);
    let server = Server::start(&path, &[]);
    let mut blank = episode("boil water", true, None);
    blank["task_text"] = json!(" ");
    let mut missing_node = episode("boil water", true, None);
    missing_node["retrieved_task"] = json!([u32::MAX]);
    for (body, field) in [(blank, "task_text"), (missing_node, "retrieved_task")] {
        let refused = server.fails("POST", "/v1/record", Some(&body.to_string()), 400);
        assert_eq!(refused["field"], field, "{refused}");
    }
    let good = episode("boil water", true, None).to_string();
    server.fails("POST", "/v1/record", Some(&good), 503);
    assert_eq!(server.get("/v1/bank")["node_count"], 0);
    assert_eq!(server.terminate(), 0);
}

#[test]
fn record_errors_have_their_statuses_and_write_nothing() {
    if !assets_present() {
        return;
    }
    let (_dir, path) = bank(DIM);
    {
        let unconfigured = Server::start(&path, &[]);
        let refused = unconfigured.fails(
            "POST",
            "/v1/record",
            Some(&episode("boil water", true, None).to_string()),
            503,
        );
        let message = refused["error"].as_str().unwrap();
        assert!(message.contains("DELTAMEM_LLM_BASE_URL"), "{message}");
        assert_eq!(unconfigured.terminate(), 0);
    }
    let llm = Llm::start(vec![content("I would rather not answer in JSON.")]);
    let server = with_llm(&path, &llm, &[]);
    let post = |body: &str, status: u16| server.fails("POST", "/v1/record", Some(body), status);
    assert!(post("{\"task_text\": ", 400)["error"].as_str().is_some());
    let mut unknown = episode("boil water", true, None);
    unknown["sucess"] = json!(true);
    let refused = post(&unknown.to_string(), 400);
    assert!(refused["error"].as_str().unwrap().contains("sucess"), "{refused}");
    let mut missing = episode("boil water", true, None);
    missing.as_object_mut().unwrap().remove("trajectory");
    assert!(
        post(&missing.to_string(), 400)["error"]
            .as_str()
            .unwrap()
            .contains("trajectory")
    );
    let mut empty = episode("boil water", true, None);
    empty["trajectory"] = json!("  ");
    assert_eq!(post(&empty.to_string(), 400)["field"], "trajectory");
    let unknown_chain = episode("boil water", true, Some((&json!([7]), &json!(null))));
    assert_eq!(post(&unknown_chain.to_string(), 400)["field"], "retrieved_task");
    let refused = server.fails(
        "POST",
        "/v1/record?profile=chess",
        Some(&episode("boil water", true, None).to_string()),
        400,
    );
    assert_eq!(refused["field"], "profile");
    assert!(llm.requests().is_empty(), "bad input is refused before any LLM call");

    // An LLM that answers nonsense: 502, nothing written.
    let refused = post(&episode("boil water", true, None).to_string(), 502);
    assert!(refused["error"].as_str().unwrap().contains("prompt"), "{refused}");
    assert_eq!(llm.requests().len(), 1);
    assert_eq!(server.get("/v1/bank")["node_count"], 0);
    assert_eq!(server.terminate(), 0);

    let read_only = with_llm(&path, &llm, &["--read-only"]);
    read_only.fails(
        "POST",
        "/v1/record",
        Some(&episode("boil water", true, None).to_string()),
        405,
    );
    assert_eq!(llm.requests().len(), 1, "a read-only server asks no LLM");
}

/// While a record waits for its LLM, other clients insert and query: the
/// LLM call holds no bank lock. The LLM stub itself makes those calls
/// before it answers, so a record holding the writer would deadlock them
/// (the client gives up after 10 s and the test fails).
#[test]
fn writes_and_queries_go_on_while_a_record_waits_for_its_llm() {
    if !assets_present() {
        return;
    }
    let (_dir, path) = bank(DIM);
    let (base_tx, base_rx) = mpsc::channel::<String>();
    let (done_tx, done_rx) = mpsc::channel::<Result<u64, String>>();
    let meanwhile = move || {
        let base = base_rx.recv().unwrap();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        let post = |path: &str, body: Value| -> Result<Value, String> {
            let mut answer = agent
                .post(&format!("{base}{path}"))
                .header("content-type", "application/json")
                .send(body.to_string())
                .map_err(|e| format!("{path}: {e}"))?;
            let text = answer.body_mut().read_to_string().map_err(|e| e.to_string())?;
            serde_json::from_str(&text).map_err(|e| format!("{path}: {e}: {text}"))
        };
        let insert = post(
            "/v1/nodes",
            node("task", json!("root"), "meanwhile", &vector(DIM as usize, 1)),
        );
        let query = post("/v1/trees/task/query", json!({"embedding": vector(DIM as usize, 1)}));
        let _ = done_tx.send(insert.and_then(|ack| {
            query?;
            ack["id"].as_u64().ok_or_else(|| format!("no id in {ack}"))
        }));
    };
    let llm = Llm::start(vec![Canned::Hook(Box::new(meanwhile), Box::new(either())), either()]);
    let server = with_llm(&path, &llm, &[]);
    base_tx.send(server.base.clone()).unwrap();
    let outcome = server.post("/v1/record", &episode("boil water", false, None));
    let meanwhile_id = done_rx.recv_timeout(Duration::from_secs(30)).unwrap().unwrap();
    assert_eq!(
        meanwhile_id, 0,
        "the insert made during the LLM call was committed first"
    );
    assert_eq!(outcome["task"]["node"].as_u64(), Some(1), "{outcome}");
    assert_eq!(outcome["task"]["label"], "FAILURE");
    assert_eq!(server.get("/v1/bank")["node_count"], 3);
    assert_eq!(server.terminate(), 0);
}

/// Records from many clients at once: every acknowledged node is stored
/// with its episode's text, none twice, and the bank verifies.
#[test]
fn concurrent_records_are_all_stored() {
    if !assets_present() {
        return;
    }
    const CLIENTS: usize = 6;
    let (_dir, path) = bank(DIM);
    let llm = Llm::start((0..2 * CLIENTS).map(|_| either()).collect());
    let server = with_llm(&path, &llm, &[]);
    let acked: Vec<(String, u64, u64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let server = &server;
                scope.spawn(move || {
                    let task = format!("task number {i}");
                    let outcome = server.post("/v1/record", &episode(&task, true, None));
                    let id = |tree: &str| outcome[tree]["node"].as_u64().expect("a node per tree");
                    (task, id("task"), id("env"))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut ids: Vec<u64> = acked.iter().flat_map(|(_, t, e)| [*t, *e]).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 2 * CLIENTS, "no node acknowledged twice");
    for (task, task_node, _) in &acked {
        assert_eq!(server.get(&format!("/v1/nodes/{task_node}"))["scenario"], task.as_str());
    }
    assert_eq!(server.get("/v1/bank")["node_count"], 2 * CLIENTS as u64);
    assert_eq!(server.get("/v1/verify")["ok"], true);
    assert_eq!(server.terminate(), 0);
}

#[test]
fn openapi_describes_record_and_retrieve() {
    let (_dir, path) = bank(8);
    let server = Server::start(&path, &[]);
    let doc = server.get("/openapi.json");
    let record = &doc["paths"]["/v1/record"]["post"];
    assert!(record["responses"]["502"].is_object(), "{record}");
    let schema_ref = record["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        .as_str()
        .unwrap();
    let name = schema_ref.rsplit('/').next().unwrap();
    let episode = &doc["components"]["schemas"][name];
    for field in ["task_text", "env_text", "trajectory", "success"] {
        assert!(
            episode["required"].as_array().unwrap().contains(&json!(field)),
            "{episode}"
        );
    }
    assert_eq!(episode["additionalProperties"], false);
    assert!(doc["paths"]["/v1/retrieve"]["post"]["requestBody"].is_object());
    // What the server refuses, the document excludes: blank texts, other
    // profiles, step counts past u32.
    for field in ["task_text", "env_text", "trajectory"] {
        assert_eq!(episode["properties"][field]["pattern"], "\\S", "{field}");
    }
    assert_eq!(episode["properties"]["max_steps"]["maximum"], u64::from(u32::MAX));
    let profile = &record["parameters"][0];
    assert_eq!(profile["name"], "profile");
    let names = profile["schema"]["enum"].as_array().unwrap();
    assert!(names.contains(&json!("alfworld")) && names.len() == 4, "{profile}");
    let retrieve = &doc["components"]["schemas"]["RetrieveRequest"]["properties"];
    assert_eq!(retrieve["task"]["pattern"], "\\S");
    assert!(retrieve["profile"]["enum"].as_array().unwrap().contains(&json!(null)));
    let episode = json!({"task_text": "t", "env_text": "e", "trajectory": "x", "success": true});
    server.fails("POST", "/v1/record?profile=nosuch", Some(&episode.to_string()), 400);
    let blank = json!({"task": " ", "env": "e"}).to_string();
    server.fails("POST", "/v1/retrieve", Some(&blank), 400);
}

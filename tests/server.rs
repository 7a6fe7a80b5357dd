//! `deltamem serve` as a real process on 127.0.0.1: every endpoint, every
//! error status, authentication, limits, group commit, concurrent writers
//! checked against a sequential model, slow clients, SIGTERM.

mod server_common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use server_common::{Server, bank, node, vector};

const DIM: usize = 8;

fn one_hot(i: usize) -> Vec<f32> {
    let mut v = vec![0.0; DIM];
    v[i % DIM] = 1.0;
    v
}

#[test]
fn every_endpoint_answers_as_documented() {
    let (_dir, path) = bank(DIM as u32);
    let server = Server::start(&path, &[]);
    assert_eq!(server.get("/healthz"), json!({"ok": true}));
    let info = server.get("/v1/bank");
    assert_eq!((info["dim"].as_u64(), info["node_count"].as_u64()), (Some(8), Some(0)));
    assert_eq!(info["trees"][0]["name"], "task");

    let root = server.post("/v1/nodes", &node("task", json!("root"), "boil water", &one_hot(0)));
    assert_eq!((root["id"].as_u64(), root["type"].as_str()), (Some(0), Some("ROOT")));
    let mut near = one_hot(0);
    near[1] = 0.1;
    let mut child = node("task", json!("auto"), "boil water faster", &near);
    child["id"] = json!("doc-1");
    let child = server.post("/v1/nodes", &child);
    assert_eq!(
        (child["parent"].as_u64(), child["match"]["id"].as_u64()),
        (Some(0), Some(0))
    );
    let batch = server.post(
        "/v1/nodes/batch",
        &json!({"nodes": [node("env", json!("root"), "kitchen", &one_hot(2)),
                          node("task", json!({"parent": "doc-1"}), "boil water at altitude", &one_hot(0))]}),
    );
    assert_eq!(batch["acks"].as_array().unwrap().len(), 2);
    assert_eq!(batch["acks"][1]["parent"], 1);

    let found = server.post("/v1/trees/task/query", &json!({"embedding": one_hot(0), "k": 3}));
    let ids: Vec<u64> = found["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids[0], 0, "{found}");
    assert_eq!(ids.len(), 3);
    let answers = server.post(
        "/v1/trees/task/query_batch",
        &json!({"embeddings": [one_hot(0), near], "k": 1}),
    );
    assert_eq!(answers["answers"][0]["matches"][0]["id"], 0);
    assert_eq!(answers["answers"][1]["matches"][0]["id"], 1);

    let by_id = server.get("/v1/nodes/doc-1");
    assert_eq!((by_id["id"].as_u64(), by_id["children"].clone()), (Some(1), json!([3])));
    assert_eq!(server.get("/v1/nodes/1")["scenario"], "boil water faster");
    let chain = server.get("/v1/nodes/3/chain");
    assert_eq!(chain["chain"], json!([0, 1, 3]));
    let rendered = server.get("/v1/nodes/3/chain?render=true");
    assert!(
        rendered["text"].as_str().unwrap().contains("boil water at altitude"),
        "{rendered}"
    );
    assert_eq!(server.get("/v1/nodes/0/children")["children"][0]["id"], 1);
    let page = server.get("/v1/trees/task/nodes?offset=1&limit=1");
    assert_eq!(
        (page["total"].as_u64(), page["nodes"][0]["id"].as_u64()),
        (Some(3), Some(1))
    );
    assert_eq!(page["nodes"][0]["title"], "boil water faster");
    let search = server.get("/v1/search?q=ALTITUDE");
    assert_eq!(search["nodes"][0]["id"], 3);
    assert_eq!(server.get("/v1/search?q=doc-1")["nodes"][0]["id"], 1);

    let (status, dump) = server.call("GET", "/v1/trees/task/dump", None);
    assert_eq!(status, 200);
    let lines: Vec<Value> = dump.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(
        lines.iter().map(|l| l["id"].as_u64().unwrap()).collect::<Vec<_>>(),
        vec![0, 1, 3]
    );

    for expected in 1..=3 {
        let hit = server.post("/v1/nodes/doc-1/hit", &json!(null));
        assert_eq!(hit["success_hits"], expected);
    }
    assert_eq!(server.get("/v1/due?tree=task")["due"][0]["id"], 1);
    assert_eq!(
        server.post("/v1/retrievals", &json!({"ids": [0, "doc-1", 0]}))["nodes"],
        2
    );
    assert_eq!(server.get("/v1/nodes/0")["retrievals"], 1);
    let done = server.post(
        "/v1/nodes/1/consolidate",
        &json!({"payload": {"execution_procedure": "one pot"}}),
    );
    assert_eq!(done["source"], 1);
    assert_eq!(server.get("/v1/due")["due"], json!([]));

    let stats = server.get("/v1/stats");
    assert_eq!(
        (stats["nodes"].as_u64(), stats["trees"][0]["consolidated"].as_u64()),
        (Some(5), Some(1))
    );
    assert_eq!(server.get("/v1/verify")["ok"], true);
    let (status, metrics) = server.call("GET", "/metrics", None);
    assert_eq!(status, 200);
    assert!(metrics.contains("deltamem_nodes{tree=\"task\"} 4"), "{metrics}");
    assert!(
        metrics.contains("deltamem_http_requests_total{route=\"/v1/nodes\",status=\"200\"} 2"),
        "{metrics}"
    );
    let openapi = server.get("/openapi.json");
    assert!(openapi["paths"]["/v1/trees/{tree}/query"]["post"]["requestBody"].is_object());
    assert!(
        openapi["components"]["schemas"]["InsertRequest"].is_object(),
        "{}",
        openapi["components"]
    );
    let (status, page) = server.call("GET", "/", None);
    assert_eq!(status, 200);
    assert!(page.contains("<html"), "{page}");
    assert_eq!(server.terminate(), 0);
}

/// The document states this bank's dimension and trees and this server's
/// batch limit, and the server holds to them: what the bounds allow
/// succeeds, one past them is refused.
#[test]
fn the_openapi_document_states_the_banks_bounds() {
    let (_dir, path) = bank(DIM as u32);
    let server = Server::start(&path, &["--max-batch", "2"]);
    let doc = server.get("/openapi.json");
    // No token: a request may go with or without one.
    assert_eq!(doc["security"], json!([{}, {"bearer": []}]));
    let schemas = &doc["components"]["schemas"];
    let spellings = &schemas["InsertRequest"]["properties"]["embedding"]["anyOf"];
    let embedding = &spellings[0];
    // 8 f32 values are 32 bytes: 44 characters of padded base64.
    assert_eq!(
        (spellings[1]["minLength"].as_u64(), spellings[1]["maxLength"].as_u64()),
        (Some(44), Some(44))
    );
    assert_eq!(
        (embedding["minItems"].as_u64(), embedding["maxItems"].as_u64()),
        (Some(8), Some(8))
    );
    let trees = schemas["InsertRequest"]["properties"]["tree"]["enum"].clone();
    assert_eq!(trees, json!(["task", "env"]));
    let batch = &schemas["QueryBatchRequest"]["properties"]["embeddings"];
    assert_eq!(batch["maxItems"], 2);
    assert_eq!(batch["items"]["anyOf"][0]["maxItems"], 8);
    assert_eq!(
        schemas["TreeQuery"]["properties"]["embedding"]["anyOf"][0]["minItems"],
        8
    );
    assert_eq!(embedding["items"]["maximum"].as_f64().map(|m| m as f32), Some(f32::MAX));
    assert_eq!(schemas["TreeQuery"]["properties"]["tau"]["maximum"], 1.0);
    assert_eq!(schemas["QueryBatchRequest"]["properties"]["eps"]["minimum"], 0.0);
    assert_eq!(schemas["TreeQuery"]["properties"]["k"]["maximum"], 1000);
    assert_eq!(schemas["QueryBatchRequest"]["properties"]["k"]["minimum"], 1);
    assert_eq!(schemas["InsertBatchRequest"]["properties"]["nodes"]["maxItems"], 2);
    assert_eq!(schemas["RetrievalsRequest"]["properties"]["ids"]["maxItems"], 2);
    let query = &doc["paths"]["/v1/trees/{tree}/query"]["post"]["parameters"][0];
    assert_eq!((&query["name"], &query["schema"]["enum"]), (&json!("tree"), &trees));

    let limit = embedding["maxItems"].as_u64().unwrap() as usize;
    server.post("/v1/nodes", &node("env", json!("root"), "a", &one_hot(limit - 1)));
    let mut long = one_hot(0);
    long.push(1.0);
    server.fails(
        "POST",
        "/v1/nodes",
        Some(&node("env", json!("root"), "b", &long).to_string()),
        400,
    );
    assert_eq!(schemas["InsertRequest"]["properties"]["scenario"]["pattern"], "\\S");
    server.fails(
        "POST",
        "/v1/nodes",
        Some(&node("env", json!("root"), " \t", &one_hot(0)).to_string()),
        400,
    );
    let query = json!({"embeddings": [one_hot(0), one_hot(1)]});
    server.post("/v1/trees/env/query_batch", &query);
    let three = json!({"embeddings": [one_hot(0), one_hot(1), one_hot(2)]}).to_string();
    server.fails("POST", "/v1/trees/env/query_batch", Some(&three), 400);
    server.fails(
        "POST",
        "/v1/trees/other/query",
        Some(&json!({"embedding": one_hot(0)}).to_string()),
        404,
    );
    let k = json!({"embedding": one_hot(0), "k": 1001}).to_string();
    server.fails("POST", "/v1/trees/env/query", Some(&k), 400);
    // No matches asked for is refused by name, on both query routes.
    let none = json!({"embedding": one_hot(0), "k": 0}).to_string();
    let refused = server.fails("POST", "/v1/trees/env/query", Some(&none), 400);
    assert_eq!(refused["field"], "k", "{refused}");
    let none = json!({"embeddings": [one_hot(0)], "k": 0}).to_string();
    let refused = server.fails("POST", "/v1/trees/env/query_batch", Some(&none), 400);
    assert_eq!(refused["field"], "k", "{refused}");
    let huge = json!({"embedding": one_hot(0)})
        .to_string()
        .replacen("0.0", "3.5e38", 1);
    server.fails("POST", "/v1/trees/env/query", Some(&huge), 400);
    // Query parameters and eps carry the bounds the server holds to.
    let search = &doc["paths"]["/v1/search"]["get"]["parameters"];
    let limit = search
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "limit")
        .unwrap();
    assert_eq!(
        (&limit["schema"]["minimum"], &limit["schema"]["maximum"]),
        (&json!(1), &json!(1000))
    );
    server.fails("GET", "/v1/search?q=a&limit=1001", None, 400);
    // Each integer parameter's range is where the server stops refusing:
    // the bounds themselves are served, one past either is a 400.
    let range = |path: &str, name: &str| {
        let params = doc["paths"][path]["get"]["parameters"].as_array().unwrap();
        let schema = &params.iter().find(|p| p["name"] == name).unwrap()["schema"];
        (schema["minimum"].as_u64().unwrap(), schema["maximum"].as_u64().unwrap())
    };
    for (path, name) in [
        ("/v1/trees/{tree}/nodes", "limit"),
        ("/v1/trees/{tree}/outline", "limit"),
        ("/v1/trees/{tree}/history", "points"),
        ("/v1/trees/{tree}/history", "top"),
        ("/v1/search", "limit"),
    ] {
        let (low, high) = range(path, name);
        let search = if path == "/v1/search" { "q=a&" } else { "" };
        let url = |value: i64| format!("{}?{search}{name}={value}", path.replace("{tree}", "env"));
        server.get(&url(low as i64));
        server.get(&url(high as i64));
        assert_eq!(server.fails("GET", &url(low as i64 - 1), None, 400)["field"], name);
        assert_eq!(server.fails("GET", &url(high as i64 + 1), None, 400)["field"], name);
    }
    let eps_max = schemas["TreeQuery"]["properties"]["eps"]["maximum"].as_f64();
    assert_eq!(eps_max.map(|m| m as f32), Some(f32::MAX));
    assert!(doc["paths"]["/v1/nodes"]["post"]["responses"]["415"].is_object());
    // A node index is a u32: the document says so, and one past it is refused.
    assert_eq!(schemas["NodeRefJson"]["anyOf"][0]["maximum"], u64::from(u32::MAX));
    let past = json!({"ids": [u64::from(u32::MAX) + 1]}).to_string();
    server.fails("POST", "/v1/retrievals", Some(&past), 400);
    assert_eq!(server.terminate(), 0);
}

#[test]
fn embeddings_may_travel_as_base64() {
    let (_dir, path) = bank(DIM as u32);
    let server = Server::start(&path, &[]);
    let b64 = deltamem::api::embedding::encode_base64_f32;
    // The same vectors inserted in each spelling are stored bit for bit alike.
    let mut ids = Vec::new();
    for i in 0..4u64 {
        let v = vector(DIM, i);
        let as_array = server.post("/v1/nodes", &node("task", json!("root"), "array", &v));
        let mut body = node("task", json!("root"), "base64", &v);
        body["embedding"] = json!(b64(&v));
        let as_base64 = server.post("/v1/nodes", &body);
        ids.push((as_array["id"].as_u64().unwrap(), as_base64["id"].as_u64().unwrap()));
    }
    for &(a, b) in &ids {
        let stored = |id: u64| server.get(&format!("/v1/nodes/{id}?embedding=true"))["embedding"].clone();
        assert!(stored(a).is_array());
        assert_eq!(stored(a), stored(b), "nodes {a} and {b}");
    }
    // A query and a batch answer alike in either spelling.
    let q = vector(DIM, 2);
    let by_array = server.post("/v1/trees/task/query", &json!({"embedding": q, "k": 8, "tau": -1}));
    let by_base64 = server.post(
        "/v1/trees/task/query",
        &json!({"embedding": b64(&q), "k": 8, "tau": -1}),
    );
    assert_eq!(by_array, by_base64);
    assert_eq!(by_array["matches"].as_array().unwrap().len(), 8);
    let mixed = server.post(
        "/v1/trees/task/query_batch",
        &json!({"embeddings": [b64(&q), q], "k": 8, "tau": -1}),
    );
    assert_eq!(mixed["answers"][0], by_array);
    assert_eq!(mixed["answers"][1], by_array);
    // A wrong length or broken base64 is a 400 naming the field.
    let e = server.fails(
        "POST",
        "/v1/trees/task/query",
        Some(&json!({"embedding": b64(&q[..3])}).to_string()),
        400,
    );
    assert_eq!(e["field"], "embedding", "{e}");
    let e = server.fails("POST", "/v1/trees/task/query", Some(r#"{"embedding": "AAA*"}"#), 400);
    assert!(e["error"].as_str().unwrap().contains("base64"), "{e}");
    // A NaN can travel only as base64 (an infinity also as a decimal too
    // large for f32): refused, with the index.
    for (at, bad) in [(5, f32::NAN), (DIM - 1, f32::INFINITY)] {
        let mut v = vector(DIM, 9);
        v[at] = bad;
        let mut body = node("task", json!("root"), "nan", &v);
        body["embedding"] = json!(b64(&v));
        let e = server.fails("POST", "/v1/nodes", Some(&body.to_string()), 400);
        assert_eq!(e["error"], format!("embedding[{at}] is not a finite f32"), "{e}");
    }
    let mut zeros = node("task", json!("root"), "zeros", &[0.0; DIM]);
    zeros["embedding"] = json!(b64(&[0.0; DIM]));
    let e = server.fails("POST", "/v1/nodes", Some(&zeros.to_string()), 400);
    assert!(e["error"].as_str().unwrap().contains("all zeros"), "{e}");
    assert_eq!(server.get("/v1/bank")["node_count"], 8);
}

#[test]
fn every_error_status_names_the_problem() {
    let (_dir, path) = bank(DIM as u32);
    let server = Server::start(&path, &["--max-body-bytes", "4096", "--max-batch", "2"]);
    server.post("/v1/nodes", &node("task", json!("root"), "a", &one_hot(0)));
    let insert = |patch: Value| {
        let mut n = node("task", json!("root"), "b", &one_hot(1));
        n.as_object_mut().unwrap().extend(patch.as_object().unwrap().clone());
        n.to_string()
    };
    let e = server.fails("POST", "/v1/nodes", Some(&insert(json!({"embedding": [1, 2]}))), 400);
    assert_eq!(e["field"], "embedding", "{e}");
    let e = server.fails("POST", "/v1/nodes", Some(&insert(json!({"colour": "red"}))), 400);
    assert!(
        e["error"].as_str().unwrap().contains("colour") && e["field"] == "colour",
        "{e}"
    );
    // A missing field is named as a field too (it had no `field`).
    let mut missing = node("task", json!("root"), "b", &one_hot(1));
    missing.as_object_mut().unwrap().remove("payload");
    let e = server.fails("POST", "/v1/nodes", Some(&missing.to_string()), 400);
    assert_eq!(e["field"], "payload", "{e}");
    let e = server.fails("GET", "/v1/trees/task/nodes?limit=many", None, 400);
    assert_eq!(e["field"], "limit", "{e}");
    let e = server.fails("POST", "/v1/nodes", Some(&insert(json!({"scenario": ""}))), 400);
    assert_eq!(e["field"], "scenario", "{e}");
    let e = server.fails("POST", "/v1/nodes", Some(&insert(json!({"label": "MAYBE"}))), 400);
    assert_eq!(e["field"], "label", "{e}");
    // Well-formed JSON of the wrong type is named as such, not as broken.
    let e = server.fails("POST", "/v1/nodes", Some(&insert(json!({"attach": 5}))), 400);
    let message = e["error"].as_str().unwrap();
    assert!(
        e["field"] == "attach" && message.contains("integer `5`") && !message.contains("malformed"),
        "{e}"
    );
    server.fails("POST", "/v1/nodes", Some("{\"tree\": "), 400);
    server.fails("POST", "/v1/nodes", Some("[1]"), 400);
    let deep = format!("{}{}", "[".repeat(40), "]".repeat(40));
    let e = server.fails(
        "POST",
        "/v1/trees/task/query",
        Some(&format!("{{\"embedding\": {deep}}}")),
        400,
    );
    assert!(e["error"].as_str().unwrap().contains("nested"), "{e}");
    let e = server.fails(
        "POST",
        "/v1/trees/task/query",
        Some(&json!({"embedding": one_hot(0), "tau": 7}).to_string()),
        400,
    );
    assert!(e["error"].as_str().unwrap().contains("tau"), "{e}");
    let e = server.fails(
        "POST",
        "/v1/trees/task/query",
        Some(&json!({"embedding": vec![0.0; DIM]}).to_string()),
        400,
    );
    assert_eq!(e["field"], "embedding");
    let three = json!({"embeddings": [one_hot(0), one_hot(1), one_hot(2)]}).to_string();
    let e = server.fails("POST", "/v1/trees/task/query_batch", Some(&three), 400);
    assert_eq!(e["field"], "embeddings");
    let big = json!({"embedding": vec![0.123_456_79_f32; 600]}).to_string();
    server.fails("POST", "/v1/trees/task/query", Some(&big), 413);

    server.fails(
        "POST",
        "/v1/trees/nope/query",
        Some(&json!({"embedding": one_hot(0)}).to_string()),
        404,
    );
    server.fails("GET", "/v1/nodes/99", None, 404);
    server.fails("GET", "/v1/nodes/no-such-id", None, 404);
    server.fails("POST", "/v1/nodes/99/hit", Some(""), 404);
    // An index past u32 is as unknown as any other, and names the field.
    for id in ["4294967295", "4294967296"] {
        let e = server.fails("GET", &format!("/v1/nodes/{id}"), None, 404);
        assert_eq!(
            (e["field"].as_str(), e["error"].as_str()),
            (Some("id"), Some(&*format!("unknown node {id}"))),
            "{e}"
        );
    }
    server.fails("GET", "/v1/trees/nope/nodes", None, 404);
    // Two items of one batch with one external id: the earlier one is
    // named, not a node index nothing was stored at.
    let twice = |text: &str| {
        let mut n = node("task", json!("root"), text, &one_hot(2));
        n["id"] = json!("dup");
        n
    };
    let e = server.fails(
        "POST",
        "/v1/nodes/batch",
        Some(&json!({"nodes": [twice("a"), twice("b")]}).to_string()),
        400,
    );
    assert_eq!(e["field"], "nodes[1].id", "{e}");
    assert!(
        e["error"].as_str().unwrap().contains("twice in one write: item 0"),
        "{e}"
    );
    // An insert's unknown parent or tree names its field, in a batch too.
    let orphan = node("task", json!({"parent": 999}), "o", &one_hot(0));
    let nowhere = node("nope", json!("root"), "n", &one_hot(0));
    for (body, path, field) in [
        (orphan.clone(), "/v1/nodes", "attach"),
        (nowhere.clone(), "/v1/nodes", "tree"),
        (json!({"nodes": [orphan]}), "/v1/nodes/batch", "nodes[0].attach"),
        (
            json!({"nodes": [node("task", json!("root"), "r", &one_hot(1)), nowhere]}),
            "/v1/nodes/batch",
            "nodes[1].tree",
        ),
    ] {
        let e = server.fails("POST", path, Some(&body.to_string()), 404);
        assert_eq!(e["field"], field, "{path}: {e}");
    }
    let (status, _) = server.call("GET", "/v1/no/such/route", None);
    assert_eq!(status, 404);
    let (status, _) = server.call("GET", "/v1/nodes/batch", None);
    assert_eq!(status, 405);
    let (status, _) = server.call("POST", "/v1/stats", Some("{}"));
    assert_eq!(status, 405);

    let mut child = node("task", json!({"parent": 0}), "c", &one_hot(0));
    child["id"] = json!("kid");
    server.post("/v1/nodes", &child);
    let e = server.fails("POST", "/v1/nodes", Some(&child.to_string()), 409);
    assert_eq!(e["field"], "id", "{e}");
    let fields = json!({"payload": {"execution_procedure": "x"}}).to_string();
    server.post("/v1/nodes/kid/consolidate", &serde_json::from_str(&fields).unwrap());
    // The node in the path is to blame, not the payload.
    let e = server.fails("POST", "/v1/nodes/kid/consolidate", Some(&fields), 409);
    assert_eq!(e["field"], "id", "{e}");
    let e = server.fails("POST", "/v1/nodes/0/consolidate", Some(&fields), 400);
    assert_eq!(e["field"], "id", "{e}");
    // Nothing refused was stored.
    assert_eq!(server.get("/v1/bank")["node_count"], 3);
    assert_eq!(server.get("/v1/verify")["ok"], true);
}

/// A body is a JSON object: serde would otherwise take a struct from a
/// positional array (`["task","root",..]`), so a client's mistake (or a
/// document in another shape) would be stored as if it were well formed.
#[test]
fn a_body_that_is_not_an_object_is_refused() {
    let (_dir, path) = bank(DIM as u32);
    let server = Server::start(&path, &[]);
    server.post("/v1/nodes", &node("task", json!("root"), "a", &one_hot(0)));
    let positional = json!(["task", "root", "SUCCESS", "b", {}, one_hot(1)]).to_string();
    let e = server.fails("POST", "/v1/nodes", Some(&positional), 400);
    assert!(e["error"].as_str().unwrap().contains("object"), "{e}");
    let batch = json!({"nodes": [["task", "root", "SUCCESS", "b", {}, one_hot(1)]]}).to_string();
    let e = server.fails("POST", "/v1/nodes/batch", Some(&batch), 400);
    assert_eq!(e["field"], "nodes[0]", "{e}");
    let query = json!([one_hot(0), 3]).to_string();
    server.fails("POST", "/v1/trees/task/query", Some(&query), 400);
    let queries = json!([[one_hot(0)], 3]).to_string();
    server.fails("POST", "/v1/trees/task/query_batch", Some(&queries), 400);
    server.fails("POST", "/v1/retrievals", Some("[[0]]"), 400);
    server.fails("POST", "/v1/nodes/0/consolidate", Some("[{}]"), 400);
    // Nothing refused was stored or counted.
    assert_eq!(server.get("/v1/bank")["node_count"], 1);
    assert_eq!(server.get("/v1/nodes/0")["retrievals"], 0);
    assert_eq!(server.terminate(), 0);
}

/// A compressed body is refused by name (415) and an unknown parent is a
/// 404 that names `attach`; neither stores anything.
#[test]
fn a_compressed_body_and_an_unknown_parent_are_named() {
    let (_dir, path) = bank(DIM as u32);
    let server = Server::start(&path, &[]);
    let address = server.address();
    let body = node("task", json!("root"), "a", &one_hot(0)).to_string();
    let head = format!(
        "POST /v1/nodes HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let answer = raw_exchange(&address, &head, body.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 415"), "{answer}");
    assert!(answer.contains("gzip"), "{answer}");
    // A second Content-Encoding, or a transfer coding hyper does not undo,
    // is refused the same way (it was read as malformed or plain JSON).
    let codings = [
        (
            "Content-Encoding: identity\r\nContent-Encoding: gzip",
            "Content-Encoding",
        ),
        ("Transfer-Encoding: gzip, chunked", "Transfer-Encoding"),
    ];
    for (headers, named) in codings {
        let head = format!(
            "POST /v1/nodes HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n{headers}\r\nConnection: close\r\n\r\n"
        );
        let chunked = format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len());
        let sent = if headers.contains("chunked") {
            chunked.as_str()
        } else {
            body.as_str()
        };
        let answer = raw_exchange(&address, &head, sent.as_bytes());
        let refused = answer.starts_with("HTTP/1.1 415") && answer.contains(named) && answer.contains("gzip");
        assert!(refused, "{headers}: {answer}");
    }
    // A declared length over the limit is refused before any body is read,
    // not invited with 100 Continue and answered after the time limit.
    let head = format!(
        "POST /v1/nodes HTTP/1.1\r\nHost: {address}\r\nExpect: 100-continue\r\nContent-Length: 1000000000\r\n\r\n"
    );
    let answer = raw_exchange(&address, &head, b"");
    assert!(
        answer.starts_with("HTTP/1.1 413") && answer.contains("1000000000 bytes"),
        "{answer}"
    );
    let orphan = node("task", json!({"parent": 7}), "b", &one_hot(1)).to_string();
    let e = server.fails("POST", "/v1/nodes", Some(&orphan), 404);
    assert_eq!(e["field"], "attach", "{e}");
    assert_eq!(server.get("/v1/bank")["node_count"], 0);
    assert_eq!(server.terminate(), 0);
}

#[test]
fn a_token_guards_every_request() {
    let (dir, path) = bank(DIM as u32);
    let token_file = dir.path().join("token");
    let token = "a-long-enough-secret-token";
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let mut server = Server::start(&path, &["--token-file", token_file.to_str().unwrap()]);
    for (method, route) in [
        ("GET", "/healthz"),
        ("GET", "/v1/bank"),
        ("GET", "/"),
        ("POST", "/v1/nodes"),
    ] {
        let (status, _) = server.call_with(method, route, Some("{}"), None);
        assert_eq!(status, 401, "{route} without a token");
        let (status, _) = server.call_with(method, route, Some("{}"), Some("a-long-enough-secret-tokeN"));
        assert_eq!(status, 401, "{route} with a wrong token");
    }
    // The scheme's name in any case (RFC 9110); it was refused 401.
    let address = server.address();
    let head = format!(
        "GET /healthz HTTP/1.1\r\nHost: {address}\r\nAuthorization: bearer {token}\r\nConnection: close\r\n\r\n"
    );
    assert!(raw_exchange(&address, &head, b"").starts_with("HTTP/1.1 200"));
    server.token = Some(token.into());
    assert_eq!(server.get("/healthz")["ok"], true);
    // The document says the token is required (it said optional), and
    // lists 403 (a foreign Host or Origin) among the error answers.
    let doc = server.get("/openapi.json");
    assert_eq!(doc["security"], json!([{"bearer": []}]));
    assert!(doc["paths"]["/v1/nodes"]["post"]["responses"]["403"].is_object());
    server.post("/v1/nodes", &node("task", json!("root"), "a", &one_hot(0)));

    // Beyond loopback, no token: refuses to start.
    let out = Command::new(env!("CARGO_BIN_EXE_deltamem"))
        .args(["serve", path.to_str().unwrap(), "--listen", "0.0.0.0:0"])
        .env_remove("DELTAMEM_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("token"));

    // Tokens no client could send, or blanks meant as one, are refused at
    // the start (they served 401 to every request, or no auth at all).
    let refused = |file_text: Option<&str>, env: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_deltamem"));
        command
            .args(["serve", path.to_str().unwrap()])
            .env_remove("DELTAMEM_TOKEN");
        if let Some(text) = file_text {
            std::fs::write(&token_file, text).unwrap();
            command.args(["--token-file", token_file.to_str().unwrap()]);
        }
        if let Some(value) = env {
            command.env("DELTAMEM_TOKEN", value);
        }
        let out = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        (out.status.code(), stderr)
    };
    for (file_text, env, words) in [
        (Some("a-long-enough-secret\nsecond-line-token\n"), None, "'\\n'"),
        (Some("a-long-enough-secret with-a-space"), None, "' '"),
        (Some("a-long-enough-secrét-token"), None, "'é'"),
        (None, Some("    "), "at least 16"),
        (None, Some("a-long-enough-secret\ttoken"), "'\\t'"),
    ] {
        let (code, stderr) = refused(file_text, env);
        assert_eq!(code, Some(1), "{file_text:?} {env:?}: {stderr}");
        assert!(stderr.contains(words), "{file_text:?} {env:?}: {stderr}");
    }
}

/// A loopback server without a token answers only requests addressed to
/// it: a page elsewhere could write to the bank with a `text/plain` POST
/// (no CORS preflight), or read it after rebinding its DNS name to
/// 127.0.0.1. Both stored and read before; only `/mcp` checked `Host`.
#[test]
fn requests_addressed_from_another_site_are_refused() {
    let (_dir, path) = bank(DIM as u32);
    let server = Server::start(&path, &[]);
    let address = server.address();
    let port = address.rsplit_once(':').unwrap().1.to_string();
    let body = node("task", json!("root"), "planted", &one_hot(0)).to_string();
    let post = |host: &str, origin: Option<&str>| {
        let origin = origin.map_or(String::new(), |o| format!("Origin: {o}\r\n"));
        let head = format!(
            "POST /v1/nodes HTTP/1.1\r\nHost: {host}\r\n{origin}Content-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        raw_exchange(&address, &head, body.as_bytes())
    };
    let refused = [
        ("rebind.attacker.example".to_string(), None),
        (format!("rebind.attacker.example:{port}"), None),
        (address.clone(), Some("http://attacker.example")),
        (address.clone(), Some("null")),
        (address.clone(), Some("http://127.0.0.1.attacker.example")),
        // Not authorities of a local name, though they begin like one.
        ("[::1]attacker.example".to_string(), None),
        (format!("[::1].attacker.example:{port}"), None),
        ("localhost:attacker".to_string(), None),
        (address.clone(), Some("http://[::1]x.attacker.example")),
    ];
    for (host, origin) in &refused {
        let answer = post(host, *origin);
        assert!(
            answer.starts_with("HTTP/1.1 403") && answer.contains("\"error\""),
            "{host} {origin:?}: {answer}"
        );
    }
    let head = format!("GET /v1/trees/task/dump HTTP/1.1\r\nHost: evil.example:{port}\r\nConnection: close\r\n\r\n");
    assert!(raw_exchange(&address, &head, b"").starts_with("HTTP/1.1 403"));
    // A second Host or Origin after a local one, and an absolute-form
    // target naming another host (it overrides Host).
    for extra in [
        "Host: evil.example\r\n",
        "Origin: http://localhost\r\nOrigin: http://evil.example\r\n",
    ] {
        let head = format!("GET /v1/trees/task/dump HTTP/1.1\r\nHost: {address}\r\n{extra}Connection: close\r\n\r\n");
        let answer = raw_exchange(&address, &head, b"");
        assert!(answer.starts_with("HTTP/1.1 403"), "{extra}: {answer}");
    }
    let head =
        format!("GET http://evil.example/v1/trees/task/dump HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    let answer = raw_exchange(&address, &head, b"");
    assert!(answer.starts_with("HTTP/1.1 403"), "absolute form: {answer}");
    // HTTP/1.1 without a Host is malformed (RFC 9112 §3.2); HTTP/1.0 had
    // no Host, and only its Origin is looked at.
    let answer = raw_exchange(&address, "GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n", b"");
    assert!(
        answer.starts_with("HTTP/1.1 400") && answer.contains("Host"),
        "no Host: {answer}"
    );
    let answer = raw_exchange(&address, "GET /healthz HTTP/1.0\r\n\r\n", b"");
    assert!(
        answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"),
        "1.0: {answer}"
    );
    assert_eq!(
        server.get("/v1/bank")["node_count"],
        0,
        "a refused request stored nothing"
    );
    // Its own names, and its own pages' origin, are answered.
    for (host, origin) in [
        (format!("localhost:{port}"), None),
        (format!("[::1]:{port}"), None),
        (address.clone(), Some(format!("http://127.0.0.1:{port}"))),
        (format!("LOCALHOST:{port}"), Some(format!("http://localhost:{port}"))),
        (address.clone(), Some(format!("HTTP://LOCALHOST:{port}"))),
    ] {
        let answer = post(&host, origin.as_deref());
        assert!(answer.starts_with("HTTP/1.1 200"), "{host} {origin:?}: {answer}");
    }
    assert_eq!(server.get("/v1/bank")["node_count"], 5);
    assert_eq!(server.terminate(), 0);
}

/// Writers on many threads, readers beside them: every acknowledged node
/// is there with its content, every counter equals the acknowledged hits,
/// and the writes shared fsyncs.
#[test]
fn concurrent_writers_match_a_sequential_model() {
    const THREADS: u64 = 8;
    const NODES_PER_THREAD: u64 = 25;
    let (_dir, path) = bank(DIM as u32);
    let server = Server::start(&path, &[]);
    let target = server.post("/v1/nodes", &node("env", json!("root"), "shared", &one_hot(7)))["id"]
        .as_u64()
        .unwrap();
    let acked: Vec<Vec<(u64, String, Vec<f32>)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let server = &server;
                scope.spawn(move || {
                    let mut mine = Vec::new();
                    for i in 0..NODES_PER_THREAD {
                        let v = vector(DIM, t * 1000 + i);
                        let scenario = format!("thread {t} node {i}");
                        let ack = server.post("/v1/nodes", &node("task", json!("root"), &scenario, &v));
                        mine.push((ack["id"].as_u64().unwrap(), scenario, v));
                        server.post(&format!("/v1/nodes/{target}/hit"), &json!(null));
                        let q = server.post("/v1/trees/task/query", &json!({"embedding": mine.last().unwrap().2}));
                        assert!(q["matches"].as_array().is_some_and(|m| !m.is_empty()));
                    }
                    mine
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut model = BTreeMap::new();
    for (id, scenario, v) in acked.into_iter().flatten() {
        assert!(model.insert(id, (scenario, v)).is_none(), "id {id} acknowledged twice");
    }
    assert_eq!(model.len() as u64, THREADS * NODES_PER_THREAD);
    for (id, (scenario, v)) in &model {
        assert_eq!(server.get(&format!("/v1/nodes/{id}"))["scenario"], scenario.as_str());
        let best = server.post("/v1/trees/task/query", &json!({"embedding": v}));
        assert_eq!(best["matches"][0]["id"].as_u64(), Some(*id), "query by its own vector");
    }
    let hits = server.get(&format!("/v1/nodes/{target}"))["success_hits"]
        .as_u64()
        .unwrap();
    assert_eq!(hits, THREADS * NODES_PER_THREAD);
    let (_, metrics) = server.call("GET", "/metrics", None);
    let syncs = metric(&metrics, "deltamem_wal_syncs_total");
    let writes = metric(&metrics, "deltamem_writes_total");
    assert_eq!(writes, 1 + 2 * THREADS * NODES_PER_THREAD);
    assert!(
        syncs < writes,
        "group commit shares fsyncs: {syncs} syncs for {writes} writes"
    );
    assert_eq!(server.terminate(), 0);
    let out = Command::new(env!("CARGO_BIN_EXE_deltamem"))
        .args(["verify", path.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or_else(|| panic!("{name} not in {text}"))
}

/// Sends `head` and `body` on a new connection, then reads the answer
/// until the server closes the connection or the answer's JSON body has
/// ended (after a refused body the server may keep the connection), or
/// 20 s pass.
fn raw_exchange(address: &str, head: &str, body: &[u8]) -> String {
    let mut client = TcpStream::connect(address).unwrap();
    client.write_all(head.as_bytes()).unwrap();
    client.write_all(body).unwrap();
    client.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    while let Ok(n @ 1..) = client.read(&mut chunk) {
        answer.extend_from_slice(&chunk[..n]);
        if answer.windows(4).any(|w| w == b"\r\n\r\n") && answer.ends_with(b"}") {
            break;
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// A request head that never completes (a byte of it, or nothing at all)
/// is closed by the server within the time limit, and cannot keep a
/// SIGTERM from ending the server: before, both waited for the client.
#[test]
fn a_stalled_request_head_is_closed_and_cannot_hold_shutdown() {
    let (_dir, path) = bank(DIM as u32);
    let server = Server::start(&path, &["--request-timeout-ms", "1000"]);
    let address = server.address();
    let mut partial = TcpStream::connect(&address).unwrap();
    partial.write_all(b"G").unwrap();
    let mut silent = TcpStream::connect(&address).unwrap();
    for stalled in [&mut partial, &mut silent] {
        stalled.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let started = std::time::Instant::now();
        let mut rest = Vec::new();
        // EOF or a reset, not the read timeout.
        match stalled.read_to_end(&mut rest) {
            Ok(_) => {}
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    }
    assert_eq!(server.get("/v1/bank")["node_count"], 0);
    let mut holding = TcpStream::connect(&address).unwrap();
    holding.write_all(b"POST /v1/nodes HTTP/1.1\r\nHost").unwrap();
    // `terminate` fails the test after 60 s.
    assert_eq!(server.terminate(), 0);
    drop(holding);
}

/// An MCP `initialize` request.
const MCP_INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

/// POSTs `body` to /mcp on a new connection, as an MCP client would; the
/// whole answer.
fn mcp_post(address: &str, body: &str) -> String {
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    raw_exchange(address, &head, body.as_bytes())
}

/// A POST to /mcp that is not JSON, is a batch or nests too deep gets a
/// 400 whose body is a JSON-RPC error with the request's id as sent (null
/// when there is none to tell); rmcp answered 415 in plain text. One over
/// the body limit is a 413 before rmcp reads it. A good message still
/// reaches rmcp.
#[test]
fn a_malformed_mcp_message_gets_a_json_rpc_error() {
    let (_dir, path) = bank(DIM as u32);
    let server = Server::start(&path, &["--max-body-bytes", "4096"]);
    let address = server.address();
    let post = |body: &str| {
        let answer = mcp_post(&address, body);
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        (head.lines().next().unwrap().to_string(), body.to_string())
    };
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":"d","params":{}1{}}}"#,
        "[".repeat(40),
        "]".repeat(40)
    );
    for (body, code, id, said) in [
        (r#"{"jsonrpc":"2.0","id":7,"method""#, -32700, "7", "not JSON"),
        (
            r#"{"jsonrpc":"2.0","id":1.5e3,"method":"ping""#,
            -32700,
            "1.5e3",
            "not JSON",
        ),
        ("garbage", -32700, "null", "not JSON"),
        (r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#, -32600, "null", "batch"),
        (deep.as_str(), -32600, r#""d""#, "deeper than"),
        (
            r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":5}}"#,
            -32602,
            "8",
            "bad params for tools/call",
        ),
    ] {
        let (status, answer) = post(body);
        assert!(status.contains(" 400 "), "{body}: {status} {answer}");
        assert!(answer.contains(&format!(r#""id":{id},"#)), "{body}: {answer}");
        let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(answer["error"]["code"], code, "{body}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains(said), "{answer}");
    }
    let (status, _) = post(&format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"ping","params":{{"x":"{}"}}}}"#,
        "x".repeat(5000)
    ));
    assert!(status.contains(" 413 "), "{status}");
    let (status, answer) = post(MCP_INITIALIZE);
    assert!(
        status.contains(" 200 ") && answer.contains("deltamem"),
        "{status} {answer}"
    );
    assert_eq!(server.terminate(), 0);

    // Under the default limit (16 MiB) a 5 MiB message reaches rmcp, whose
    // own limit (4 MiB) answered 413 to what the JSON API took.
    let server = Server::start(&path, &[]);
    let padded = MCP_INITIALIZE.replace(
        r#""capabilities":{}"#,
        &format!(
            r#""capabilities":{{"experimental":{{"pad":{{"x":"{}"}}}}}}"#,
            "x".repeat(5 << 20)
        ),
    );
    let answer = mcp_post(&server.address(), &padded);
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.contains("deltamem"),
        "{}",
        &answer[..answer.len().min(300)]
    );
    assert_eq!(server.terminate(), 0);
}

/// MCP sessions over HTTP are capped (rmcp keeps each until it is closed
/// or idle for 5 minutes): past the cap an initialize gets a 503 naming
/// the way out, and closing one session makes room for the next.
#[test]
fn mcp_sessions_are_capped() {
    let (_dir, path) = bank(DIM as u32);
    let server = Server::start(&path, &[]);
    let address = server.address();
    let open = || mcp_post(&address, MCP_INITIALIZE);
    let session_of = |answer: &str| {
        answer.lines().find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("mcp-session-id: ")
                .map(str::to_string)
        })
    };
    let first = session_of(&open()).expect("a session id");
    for _ in 1..1024 {
        assert!(session_of(&open()).is_some());
    }
    let refused = open();
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.contains("1024 MCP sessions are open"), "{refused}");
    let head =
        format!("DELETE /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nMcp-Session-Id: {first}\r\nConnection: close\r\n\r\n");
    let closed = raw_exchange(&address, &head, b"");
    assert!(closed.starts_with("HTTP/1.1 2"), "{closed}");
    assert!(session_of(&open()).is_some(), "room for one more");
    assert_eq!(server.terminate(), 0);
}

/// A path no route serves and a method a route does not take are JSON
/// errors like the rest (they were empty bodies).
#[test]
fn unknown_routes_and_methods_answer_json() {
    let (_dir, path) = bank(DIM as u32);
    let server = Server::start(&path, &[]);
    for (method, route, status) in [
        ("GET", "/nope", 404),
        ("GET", "/v1/bank/", 404),
        ("POST", "/v1/trees/task//query", 404),
        ("DELETE", "/v1/nodes/0", 405),
        ("POST", "/v1/bank", 405),
    ] {
        let e = server.fails(method, route, Some("{}").filter(|_| method == "POST"), status);
        let said = e["error"].as_str().unwrap();
        assert!(said.contains(method) && said.contains(route), "{method} {route}: {e}");
    }
}

/// A client that sends half a body and stalls gets 408 after the time
/// limit; others are served meanwhile; the bank is untouched.
#[test]
fn a_slow_client_blocks_no_one() {
    let (_dir, path) = bank(DIM as u32);
    let server = Server::start(&path, &["--request-timeout-ms", "1500"]);
    let address = server.address();
    let mut slow = TcpStream::connect(&address).unwrap();
    let body = node("task", json!("root"), "slow", &one_hot(0)).to_string();
    let head = format!(
        "POST /v1/nodes HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    slow.write_all(head.as_bytes()).unwrap();
    slow.write_all(&body.as_bytes()[..body.len() / 2]).unwrap();
    for i in 0..5 {
        server.post(
            "/v1/nodes",
            &node("task", json!("root"), &format!("fast {i}"), &one_hot(i + 1)),
        );
    }
    slow.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut answer = String::new();
    let _ = slow.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert_eq!(server.get("/v1/bank")["node_count"], 5);
}

/// A client that asks for a dump of 40 MB and does not read it: once a
/// write makes no progress for the time limit, the server ends the
/// connection (it held the answer's buffers and the connection for as long
/// as the client liked), and other clients are answered meanwhile. While
/// `--max-dumps` such dumps are being sent, one more is refused (503), and
/// answered again once they are cut off.
#[test]
fn a_client_that_stops_reading_is_cut_off() {
    let (_dir, path) = bank(DIM as u32);
    let server = Server::start(&path, &["--request-timeout-ms", "1000", "--max-dumps", "2"]);
    let text = "a fairly long procedure step. ".repeat(400_000 / 30);
    for i in 0..100 {
        let mut n = node("task", json!("root"), &format!("big {i}"), &one_hot(i));
        n["payload"] = json!({"execution_procedure": text});
        server.post("/v1/nodes", &n);
    }
    let address = server.address();
    let head = format!("GET /v1/trees/task/dump HTTP/1.1\r\nHost: {address}\r\n\r\n");
    let mut stalled = TcpStream::connect(&address).unwrap();
    stalled.write_all(head.as_bytes()).unwrap();
    let mut second = TcpStream::connect(&address).unwrap();
    second.write_all(head.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let e = server.fails("GET", "/v1/trees/task/dump", None, 503);
    assert!(e["error"].as_str().unwrap().contains("--max-dumps"), "{e}");
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(server.get("/v1/bank")["node_count"], 100, "others are answered");
    // The stalled two were cut off: a whole dump is sent again.
    let mut reader = TcpStream::connect(&address).unwrap();
    let closing = format!("GET /v1/trees/task/dump HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    reader.write_all(closing.as_bytes()).unwrap();
    let mut whole = Vec::new();
    reader.read_to_end(&mut whole).unwrap();
    assert!(
        whole.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&whole[..200])
    );
    assert!(whole.len() > 100 * text.len(), "{} bytes", whole.len());
    drop(second);
    stalled.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut received = Vec::new();
    let ended = stalled.read_to_end(&mut received);
    let whole_bytes = 100 * text.len();
    assert!(
        received.len() < whole_bytes,
        "the whole dump ({} bytes) was sent to a client that did not read: {ended:?}",
        received.len()
    );
}

#[test]
fn sigterm_checkpoints_and_exits_zero() {
    let (_dir, path) = bank(DIM as u32);
    let server = Server::start(&path, &[]);
    for i in 0..10 {
        server.post(
            "/v1/nodes",
            &node("task", json!("auto"), &format!("n{i}"), &vector(DIM, i)),
        );
    }
    assert_eq!(server.terminate(), 0);
    let out = Command::new(env!("CARGO_BIN_EXE_deltamem"))
        .args(["stats", path.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    let stats: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (stats["nodes"].as_u64(), stats["checkpointed_nodes"].as_u64()),
        (Some(10), Some(10))
    );
}

/// An open event stream (an explorer tab) does not hold up shutdown, and
/// it announces commits.
#[test]
fn sigterm_ends_event_streams() {
    let (_dir, path) = bank(DIM as u32);
    let server = Server::start(&path, &[]);
    let address = server.address();
    let mut events = TcpStream::connect(&address).unwrap();
    write!(events, "GET /v1/events HTTP/1.1\r\nHost: {address}\r\n\r\n").unwrap();
    events.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut head = [0u8; 64];
    let n = events.read(&mut head).unwrap();
    assert!(String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"));
    server.post("/v1/nodes", &node("task", json!("root"), "a", &one_hot(0)));
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("node_count") {
        let n = events.read(&mut buf).unwrap();
        assert!(n > 0, "stream closed early");
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&seen).contains("\"node_count\":1"));
    assert_eq!(server.terminate(), 0);
}

/// `--checkpoint-wal-mib` sets when the server checkpoints: 3,000 nodes of
/// 1 KiB vectors (~3.5 MiB of WAL) make a server with `2` checkpoint, with
/// vectors written ahead of it (1 MiB pieces), and one with the default
/// (64) not. Every node reads back whole after a restart.
#[test]
fn the_checkpoint_threshold_is_an_option() {
    const WIDE: usize = 256;
    let checkpoints = |extra: &[&str]| {
        let (dir, path) = bank(WIDE as u32);
        let server = Server::start(&path, extra);
        for batch in 0..30u64 {
            let nodes: Vec<Value> = (0..100u64)
                .map(|i| {
                    node(
                        "task",
                        json!("root"),
                        &format!("n{batch}-{i}"),
                        &vector(WIDE, batch * 100 + i),
                    )
                })
                .collect();
            server.post("/v1/nodes/batch", &json!({ "nodes": nodes }));
        }
        let metrics = server.call("GET", "/metrics", None).1;
        assert_eq!(server.terminate(), 0);
        (dir, path, metric(&metrics, "deltamem_checkpoints_total"))
    };
    let (_default_dir, _, by_default) = checkpoints(&[]);
    assert_eq!(by_default, 0);
    let (_dir, path, with_option) = checkpoints(&["--checkpoint-wal-mib", "2"]);
    assert!(with_option >= 1, "{with_option} checkpoints");
    let server = Server::start(&path, &[]);
    assert_eq!(server.get("/v1/bank")["node_count"], 3000);
    for i in [0u64, 1023, 1024, 2047, 2999] {
        let found = server.post("/v1/trees/task/query", &json!({"embedding": vector(WIDE, i), "k": 1}));
        assert_eq!(found["matches"][0]["id"], i, "{found}");
    }
    assert_eq!(server.terminate(), 0);
    let out = Command::new(env!("CARGO_BIN_EXE_deltamem"))
        .args(["verify", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `serve --listen unix:PATH`, then one request on a new connection to the
/// socket; the answer's (status line, body).
fn unix_exchange(socket: &Path, request: &str) -> (String, String) {
    let mut client = std::os::unix::net::UnixStream::connect(socket).unwrap();
    client.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    client.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    client.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

fn spawn_unix(bank: &Path, socket: &Path) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_deltamem"))
        .args(["serve", bank.to_str().unwrap(), "--threads", "2", "--listen"])
        .arg(format!("unix:{}", socket.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The first stderr line of a starting server (the rest is drained, so
/// the server never blocks or fails writing to it).
fn first_line(child: &mut std::process::Child) -> String {
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    line
}

/// All that a server which refused to start wrote to stderr.
fn refusal(mut child: std::process::Child) -> String {
    let mut said = String::new();
    child.stderr.take().unwrap().read_to_string(&mut said).unwrap();
    assert!(!child.wait().unwrap().success(), "{said}");
    said
}

/// A Unix socket: served without a token, owner-only; a second server on
/// it, or a path that is not a socket, is refused and left as it was; a
/// socket left by a killed server is replaced; SIGTERM removes it.
#[test]
fn serves_on_an_owner_only_unix_socket() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let (dir, path) = bank(DIM as u32);
    let socket = dir.path().join("d.sock");
    let mut server = spawn_unix(&path, &socket);
    let said = first_line(&mut server);
    assert!(said.contains(&format!("on unix:{}", socket.display())), "{said}");
    let meta = std::fs::symlink_metadata(&socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);

    let body = node("task", json!("root"), "over a socket", &one_hot(1)).to_string();
    let post = format!(
        "POST /v1/nodes HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, ack) = unix_exchange(&socket, &post);
    assert!(status.contains(" 200 "), "{status} {ack}");
    let get = "GET /v1/nodes/0 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let (_, stored) = unix_exchange(&socket, get);
    assert!(stored.contains("over a socket"), "{stored}");

    // Another bank, so the second server is not held up by the first's lock.
    let (_other_dir, other) = bank(DIM as u32);
    let said = refusal(spawn_unix(&other, &socket));
    assert!(said.contains("another server is listening"), "{said}");
    let (status, _) = unix_exchange(&socket, get);
    assert!(status.contains(" 200 "), "the first server still answers: {status}");

    server.kill().unwrap(); // kill -9: the socket file stays behind
    server.wait().unwrap();
    assert!(socket.exists());
    let mut restarted = spawn_unix(&path, &socket);
    let said = first_line(&mut restarted);
    assert!(said.contains("on unix:"), "the stale socket is replaced: {said}");
    let (_, stored) = unix_exchange(&socket, get);
    assert!(stored.contains("over a socket"), "{stored}");
    let pid = restarted.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    assert!(restarted.wait().unwrap().success());
    assert!(!socket.exists(), "a clean stop removes the socket");

    std::fs::write(&socket, "not a socket").unwrap();
    let said = refusal(spawn_unix(&path, &socket));
    assert!(said.contains("is not a socket"), "{said}");
    assert_eq!(std::fs::read_to_string(&socket).unwrap(), "not a socket");
}

/// A read-only server follows the bank's writer in another process: a
/// record the writer made durable (still only in its WAL), then its
/// checkpoint, then more. It kept the view it opened with, and answered
/// 404 for acknowledged nodes however long it ran.
#[test]
fn a_read_only_server_follows_the_writer() {
    use deltamem::{Attach, Bank, Label, NewNode, OpenOptions, Payload};
    let (_dir, path) = bank(DIM as u32);
    let server = Server::start(&path, &["--read-only"]);
    let mut writer = Bank::open_dir(&path, OpenOptions::default()).unwrap();
    let insert = |writer: &mut Bank, i: usize| {
        let node = NewNode {
            tree: "task".into(),
            attach: Attach::Root,
            label: Label::Success,
            payload: Payload {
                scenario: format!("written {i}"),
                fields: BTreeMap::new(),
            },
            embedding: one_hot(i),
            external_id: Some(format!("w{i}")),
        };
        writer.insert(node).unwrap();
    };
    // Polls (bounded) until the server shows `count` nodes.
    let shows = |count: u64| {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while server.get("/v1/bank")["node_count"] != count {
            assert!(
                std::time::Instant::now() < deadline,
                "the read-only server never showed {count} nodes"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    insert(&mut writer, 0);
    shows(1);
    assert_eq!(server.get("/v1/nodes/w0")["scenario"], "written 0");
    writer.checkpoint().unwrap();
    insert(&mut writer, 1);
    shows(2);
    writer.close().unwrap();
    let mut writer = Bank::open_dir(&path, OpenOptions::default()).unwrap();
    insert(&mut writer, 2);
    shows(3);
    assert_eq!(server.get("/v1/nodes/w2")["scenario"], "written 2");
    drop(writer);
}

/// A bank directory replaced by another bank at the same manifest
/// sequence (two banks with the same history of checkpoints) is noticed
/// by a read-only server: its salt and creation time differ. It used to
/// go on serving the old bank's view.
#[test]
fn a_read_only_server_notices_its_bank_replaced() {
    use deltamem::{Attach, Bank, Label, NewNode, OpenOptions, Payload};
    let fill = |path: &Path, count: usize| {
        let mut writer = Bank::open_dir(path, OpenOptions::default()).unwrap();
        for i in 0..count {
            let payload = Payload {
                scenario: format!("bank of {count}, node {i}"),
                fields: BTreeMap::new(),
            };
            let node = NewNode {
                tree: "task".into(),
                attach: Attach::Root,
                label: Label::Success,
                payload,
                embedding: one_hot(i),
                external_id: None,
            };
            writer.insert(node).unwrap();
        }
        writer.close().unwrap();
        let reader = OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        };
        Bank::open_dir(path, reader).unwrap().manifest().sequence
    };
    let (_first_dir, first) = bank(DIM as u32);
    std::thread::sleep(Duration::from_millis(5));
    let (_second_dir, second) = bank(DIM as u32);
    let sequences = (fill(&first, 1), fill(&second, 2));
    assert_eq!(sequences.0, sequences.1, "the case needs equal sequences");
    let server = Server::start(&first, &["--read-only"]);
    assert_eq!(server.get("/v1/bank")["node_count"], 1);
    assert_eq!(server.get("/v1/trees/task/nodes")["total"], 1);
    std::fs::rename(&first, first.with_extension("old")).unwrap();
    std::fs::rename(&second, &first).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while server.get("/v1/bank")["node_count"] != 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the replaced bank was never noticed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let page = server.get("/v1/trees/task/nodes");
    assert_eq!(page["total"], 2, "{page}");
    assert_eq!(page["nodes"][1]["title"], "bank of 2, node 1");
    assert_eq!(server.get("/v1/nodes/0")["scenario"], "bank of 2, node 0");
    assert_eq!(server.terminate(), 0);
}

/// A batch query's answer is built whole before it is sent, so the
/// matches it may ask for (embeddings times `k`) are bounded: 1,024
/// queries at k = 1,000 would otherwise make a ~90 MB answer from a small
/// request. The limit is on what is asked, not on what the bank holds.
#[test]
fn a_batch_query_asking_for_too_many_matches_is_refused_by_k() {
    let (_dir, path) = bank(DIM as u32);
    let server = Server::start(&path, &[]);
    server.post("/v1/nodes", &node("task", json!("root"), "a", &one_hot(0)));
    let at_limit = json!({"embeddings": vec![one_hot(0); 100], "k": 1000});
    let answers = server.post("/v1/trees/task/query_batch", &at_limit)["answers"].clone();
    assert_eq!(answers.as_array().unwrap().len(), 100);
    assert_eq!(answers[99]["matches"][0]["id"], 0);
    let over = json!({"embeddings": vec![one_hot(0); 101], "k": 1000}).to_string();
    let e = server.fails("POST", "/v1/trees/task/query_batch", Some(&over), 400);
    assert_eq!(e["field"], "k", "{e}");
    assert!(e["error"].as_str().unwrap().contains("101000 matches"), "{e}");
    assert_eq!(server.terminate(), 0);
}

/// Two unsigned fields of each object of a JSON array.
fn pairs(items: &Value, a: &str, b: &str) -> Vec<(u64, u64)> {
    let field = |item: &Value, name: &str| item[name].as_u64().unwrap_or_else(|| panic!("{name} in {item}"));
    items
        .as_array()
        .unwrap()
        .iter()
        .map(|item| (field(item, a), field(item, b)))
        .collect()
}

/// A tree's history, aggregated by the server, against a model built from
/// its dump: the growth curve counts every node created up to each sample
/// (thinned or not), the consolidations and the most-hit nodes are those
/// of the dump, and bad parameters are named.
#[test]
fn a_trees_history_matches_its_dump() {
    let (_dir, path) = bank(DIM as u32);
    let server = Server::start(&path, &[]);
    let mut seed = 7u64;
    let mut next = |below: u64| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) % below
    };
    let mut ids: Vec<u64> = Vec::new();
    // Bursts a few ms apart: distinct creation times, and many nodes
    // sharing each.
    for burst in 0..7 {
        for _ in 0..5 + next(12) {
            let attach = match ids.is_empty() || next(3) == 0 {
                true => json!("root"),
                false => json!({"parent": ids[next(ids.len() as u64) as usize]}),
            };
            let i = ids.len() as u64;
            let ack = server.post("/v1/nodes", &node("task", attach, &format!("n{i}"), &vector(DIM, i)));
            ids.push(ack["id"].as_u64().unwrap());
        }
        server.post(
            "/v1/nodes",
            &node("env", json!("root"), "kitchen", &vector(DIM, 1000 + burst)),
        );
        std::thread::sleep(Duration::from_millis(15));
    }
    for _ in 0..40 {
        server.post(
            &format!("/v1/nodes/{}/hit", ids[next(ids.len() as u64) as usize]),
            &json!(null),
        );
    }
    let residuals: Vec<u64> = {
        let page = server.get("/v1/trees/task/nodes?limit=1000");
        let nodes = page["nodes"].as_array().unwrap().clone();
        nodes
            .iter()
            .filter(|n| n["parent"].is_u64())
            .map(|n| n["id"].as_u64().unwrap())
            .collect()
    };
    for id in residuals.iter().take(2) {
        std::thread::sleep(Duration::from_millis(5));
        let done = server.post(
            &format!("/v1/nodes/{id}/consolidate"),
            &json!({"payload": {"execution_procedure": "x"}}),
        );
        assert_eq!(done["source"].as_u64(), Some(*id), "{done}");
    }

    let (_, dump) = server.call("GET", "/v1/trees/task/dump", None);
    let model: Vec<Value> = dump.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let times: Vec<u64> = model.iter().map(|n| n["created_unix_ms"].as_u64().unwrap()).collect();
    let mut distinct = times.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(
        distinct.len() >= 7,
        "the bursts share {} creation times",
        distinct.len()
    );
    let count_to = |t: u64| times.iter().filter(|&&x| x <= t).count() as u64;
    for points in [1, 2, 5, 1000] {
        let history = server.get(&format!("/v1/trees/task/history?points={points}&top=3"));
        assert_eq!(history["nodes"].as_u64(), Some(model.len() as u64));
        assert_eq!(history["undated"], 0);
        let growth = pairs(&history["growth"], "t_ms", "nodes");
        assert_eq!(growth.len(), points.min(distinct.len()), "{history}");
        assert!(growth.windows(2).all(|w| w[0].0 < w[1].0), "{history}");
        assert!(growth.iter().all(|&(t, n)| n == count_to(t)), "{history}");
        assert_eq!(growth.last().unwrap().0, *distinct.last().unwrap());
        if points > 1 {
            assert_eq!(growth[0].0, distinct[0]);
        }
        if points >= distinct.len() {
            assert_eq!(growth.iter().map(|p| p.0).collect::<Vec<_>>(), distinct);
        }
    }

    let mut roots: Vec<(u64, u64)> = model
        .iter()
        .filter(|n| n["consolidated_root"] == true)
        .map(|n| (n["created_unix_ms"].as_u64().unwrap(), n["id"].as_u64().unwrap()))
        .collect();
    roots.sort_unstable();
    assert_eq!(roots.len(), 2);
    let newest = server.get("/v1/trees/task/history?points=1");
    assert_eq!(newest["consolidations"], 2);
    let marks = newest["consolidation_marks"].as_array().unwrap();
    assert_eq!(
        (marks.len(), marks[0]["id"].as_u64(), marks[0]["created_at_ms"].as_u64()),
        (1, Some(roots[1].1), Some(roots[1].0))
    );
    let mut hit = pairs(&json!(model), "success_hits", "id");
    hit.retain(|&(hits, _)| hits > 0);
    hit.sort_unstable_by_key(|&(hits, id)| (std::cmp::Reverse(hits), id));
    for top in [0, 3, 1000] {
        let history = server.get(&format!("/v1/trees/task/history?top={top}"));
        let shown = pairs(&history["top_hits"], "success_hits", "id");
        assert_eq!(shown, hit.iter().copied().take(top).collect::<Vec<_>>());
    }
    let env = server.get("/v1/trees/env/history");
    assert_eq!(
        (env["nodes"].as_u64(), env["consolidations"].as_u64()),
        (Some(7), Some(0))
    );

    for (query, field) in [
        ("points=0", "points"),
        ("points=1001", "points"),
        ("top=1001", "top"),
        ("points=x", "points"),
    ] {
        let e = server.fails("GET", &format!("/v1/trees/task/history?{query}"), None, 400);
        assert_eq!(e["field"], field, "{query}: {e}");
    }
    server.fails("GET", "/v1/trees/task/history?since=1", None, 400);
    server.fails("GET", "/v1/trees/kitchen/history", None, 404);
    assert!(server.get("/openapi.json")["paths"]["/v1/trees/{tree}/history"]["get"].is_object());
    assert_eq!(server.terminate(), 0);
}

/// A tree's outline, read in pages of every size, is its dump's shape
/// (ids, parents, depths, hits, kinds) in the same order; summaries of
/// named nodes are the listing's; bad requests are named.
#[test]
fn a_trees_outline_and_chosen_summaries_match_the_dump() {
    let (_dir, path) = bank(DIM as u32);
    let server = Server::start(&path, &[]);
    let mut ids = Vec::new();
    for i in 0..23u64 {
        let attach = match i % 4 {
            0 => json!("root"),
            _ => json!({"parent": ids[(i as usize * 7) % ids.len()]}),
        };
        let mut body = node("task", attach, &format!("node {i}"), &vector(DIM, i));
        if i % 5 == 2 {
            body["label"] = json!("FAILURE");
        }
        ids.push(server.post("/v1/nodes", &body)["id"].as_u64().unwrap());
        if i % 6 == 0 {
            server.post(
                "/v1/nodes",
                &node("env", json!("root"), "elsewhere", &vector(DIM, 100 + i)),
            );
        }
    }
    for i in [1, 1, 2, 5, 5, 5] {
        server.post(&format!("/v1/nodes/{}/hit", ids[i]), &json!(null));
    }
    server.post(
        &format!("/v1/nodes/{}/consolidate", ids[5]),
        &json!({"payload": {"a": "b"}}),
    );

    let (_, dump) = server.call("GET", "/v1/trees/task/dump", None);
    let model: Vec<Value> = dump.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let shape = |n: &Value| {
        let kind = u64::from(n["type"] == "RESIDUAL")
            | u64::from(n["label"] == "FAILURE") << 1
            | u64::from(n["consolidated"] == true) << 2
            | u64::from(n["consolidated_root"] == true) << 3;
        json!([n["id"], n["parent"], n["depth"], n["success_hits"], kind])
    };
    let expected: Vec<Value> = model.iter().map(shape).collect();
    assert!(expected.iter().any(|s| s[4] == 1) && expected.iter().any(|s| s[4].as_u64().unwrap() >= 8));
    for limit in [1, 4, 100_000] {
        let mut shown = Vec::new();
        let mut offset = 0;
        loop {
            let page = server.get(&format!("/v1/trees/task/outline?offset={offset}&limit={limit}"));
            assert_eq!(page["total"].as_u64(), Some(model.len() as u64));
            assert_eq!(page["offset"], offset);
            let count = page["ids"].as_array().unwrap().len();
            for i in 0..count {
                let column = |name: &str| page[name][i].clone();
                shown.push(json!([
                    column("ids"),
                    column("parents"),
                    column("depths"),
                    column("success_hits"),
                    column("kinds")
                ]));
            }
            offset += count;
            if count == 0 || offset >= model.len() {
                break;
            }
        }
        assert_eq!(shown, expected, "limit {limit}");
    }
    let past = server.get("/v1/trees/task/outline?offset=4000000000");
    assert_eq!(
        (past["offset"].as_u64(), past["ids"].clone()),
        (Some(model.len() as u64), json!([]))
    );

    let listing = server.get("/v1/trees/task/nodes?limit=1000")["nodes"].clone();
    let chosen = json!([ids[3], ids[0], ids[22]]);
    let summaries = server.post("/v1/summaries", &json!({"ids": chosen}))["nodes"].clone();
    let by_id = |id: &Value| {
        listing
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["id"] == *id)
            .unwrap()
            .clone()
    };
    assert_eq!(
        summaries,
        json!([by_id(&chosen[0]), by_id(&chosen[1]), by_id(&chosen[2])])
    );

    for (path, field) in [("limit=0", "limit"), ("limit=100001", "limit"), ("offset=-1", "offset")] {
        let e = server.fails("GET", &format!("/v1/trees/task/outline?{path}"), None, 400);
        assert_eq!(e["field"], field, "{path}: {e}");
    }
    server.fails("GET", "/v1/trees/kitchen/outline", None, 404);
    let e = server.fails("POST", "/v1/summaries", Some(r#"{"ids":[0,999]}"#), 404);
    assert_eq!(e["field"], "ids", "{e}");
    let many = json!({"ids": vec![0; 1025]}).to_string();
    assert_eq!(server.fails("POST", "/v1/summaries", Some(&many), 400)["field"], "ids");
    // Past the cap of any batch, ids are refused while they are parsed.
    for path in ["/v1/summaries", "/v1/retrievals"] {
        let over_cap = json!({"ids": vec![0; 65_537]}).to_string();
        let e = server.fails("POST", path, Some(&over_cap), 400);
        assert_eq!(e["field"], "ids", "{e}");
        assert!(e["error"].as_str().unwrap().contains("more than 65536 ids"), "{e}");
    }
    let too_large = Command::new(env!("CARGO_BIN_EXE_deltamem"))
        .args(["serve", path.to_str().unwrap(), "--max-batch", "65537"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(refusal(too_large).contains("--max-batch"));
    server.fails("POST", "/v1/summaries", Some(r#"{"ids":[0],"title":true}"#), 400);
    assert_eq!(server.terminate(), 0);
}

/// A dump whose first chunk meets damage answers with an error naming the
/// file and offset (it once began a 200 and cut the connection, or sent
/// nothing, and logged nothing), and the rest of the server still answers.
#[test]
fn a_dump_that_meets_damage_first_is_an_error_answer() {
    let (_dir, path) = bank(DIM as u32);
    let server = Server::start(&path, &[]);
    for i in 0..3 {
        server.post("/v1/nodes", &node("task", json!("root"), &format!("n{i}"), &one_hot(i)));
    }
    assert_eq!(server.terminate(), 0); // checkpointed: the payloads are in payloads.log
    let log = path.join("payloads.log");
    let mut bytes = std::fs::read(&log).unwrap();
    let last = bytes.len() - 2; // inside the last node's record
    bytes[last] ^= 0x10;
    std::fs::write(&log, bytes).unwrap();
    let server = Server::start(&path, &["--read-only"]);
    let e = server.fails("GET", "/v1/trees/task/dump", None, 500);
    let message = e["error"].as_str().unwrap();
    assert!(message.contains("payloads.log") && message.contains("offset"), "{e}");
    assert_eq!(server.get("/v1/bank")["node_count"], 3);
}

/// Large answers a client does not read are held within `--max-answer-mib`:
/// past it, one more is a 503 naming the limit (24 clients that read no
/// 13 MB batch answer took the server to 495 MiB), a write's large answer
/// is sent all the same, and once the stalled client is cut off at the
/// time limit, answers are sent again. (Here a batch answer is ~8.6 MB,
/// 9 of the 10 MiB.)
#[test]
fn large_answers_left_unread_are_bounded() {
    let (_dir, path) = bank(DIM as u32);
    let server = Server::start(
        &path,
        &[
            "--request-timeout-ms",
            "3000",
            "--max-answer-mib",
            "10",
            "--max-batch",
            "40000",
        ],
    );
    let nodes: Vec<Value> = (0..1000)
        .map(|i| node("task", json!("root"), &format!("n{i}"), &vector(DIM, i)))
        .collect();
    server.post("/v1/nodes/batch", &json!({ "nodes": nodes }));
    let queries: Vec<Vec<f32>> = (0..100).map(|i| vector(DIM, 5000 + i)).collect();
    let body = json!({"embeddings": queries, "k": 1000, "tau": -1}).to_string();
    let address = server.address();
    let head = format!(
        "POST /v1/trees/task/query_batch HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let more: Vec<Value> = (0..40_000)
        .map(|i| node("env", json!("root"), &format!("m{i}"), &vector(DIM, 100_000 + i)))
        .collect();
    let mut stalled = TcpStream::connect(&address).unwrap();
    stalled.write_all(head.as_bytes()).unwrap();
    stalled.write_all(body.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(300)); // its answer is built and held
    let e = server.fails("POST", "/v1/trees/task/query_batch", Some(&body), 503);
    assert!(e["error"].as_str().unwrap().contains("MiB"), "{e}");
    assert_eq!(server.get("/v1/bank")["node_count"], 1000, "small answers go on");
    // A write's answer is never held back: the write is made by then (a
    // 503 would have the client make it twice). 40,000 acks are ~3 MB,
    // more than the 1 MiB left.
    let acks = server.post("/v1/nodes/batch", &json!({ "nodes": more }));
    assert!(acks.to_string().len() > 1 << 20, "the acks are a large answer");
    assert_eq!(server.get("/v1/bank")["node_count"], 41_000);
    std::thread::sleep(Duration::from_secs(5)); // the stalled client is cut off
    let (status, text) = server.call("POST", "/v1/trees/task/query_batch", Some(&body));
    assert_eq!(status, 200);
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        answer["answers"].as_array().map(Vec::len),
        Some(100),
        "{}",
        &text[..200]
    );
    drop(stalled);
}

//! `deltamem import --reference-json` and `deltamem export`, through the
//! real binary, against the reference implementation's own files. Every
//! expectation is computed here from the fixture JSON, parsed with
//! serde_json independently of the library.

mod tools_common;

use std::collections::HashMap;
use std::path::Path;

use serde_json::{Value, json};
use tools_common::*;

const TASK: &str = "sciworld_qwen3-8b_dev_task.json";
const ENV: &str = "sciworld_qwen3-8b_dev_env.json";

/// The fixture's nodes by id, its placeholder ids, and each node's depth
/// (placeholder 0), worked out from the parent links.
struct Fixture {
    doc: Value,
    by_id: HashMap<String, Value>,
    placeholders: Vec<String>,
    depth: HashMap<String, u64>,
}

impl Fixture {
    fn load(path: &Path) -> Fixture {
        let doc = read_json(path);
        let nodes = doc["nodes"].as_array().unwrap().clone();
        let by_id: HashMap<String, Value> = nodes
            .iter()
            .map(|n| (n["node_id"].as_str().unwrap().to_string(), n.clone()))
            .collect();
        let placeholders = nodes
            .iter()
            .filter(|n| n["parent_id"].is_null())
            .map(|n| n["node_id"].as_str().unwrap().to_string())
            .collect();
        let mut depth = HashMap::new();
        for id in by_id.keys() {
            let (mut d, mut at) = (0, id.clone());
            while let Some(p) = by_id[&at]["parent_id"].as_str() {
                d += 1;
                at = p.to_string();
            }
            depth.insert(id.clone(), d);
        }
        Fixture {
            doc,
            by_id,
            placeholders,
            depth,
        }
    }

    /// Real nodes in file order.
    fn real(&self) -> Vec<&Value> {
        self.doc["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| !n["parent_id"].is_null())
            .collect()
    }
}

/// Dump lines of one tree keyed by external id, plus bank id -> external id.
fn dump_by_external_id(bank: &Path, tree: &str) -> (HashMap<String, Value>, HashMap<u64, String>) {
    let lines = dump(bank, &["--tree", tree, "--embeddings"]);
    let mut by_ext = HashMap::new();
    let mut ext_of = HashMap::new();
    for l in lines {
        let ext = l["external_id"]
            .as_str()
            .expect("imported nodes keep their ids")
            .to_string();
        ext_of.insert(l["id"].as_u64().unwrap(), ext.clone());
        by_ext.insert(ext, l);
    }
    (by_ext, ext_of)
}

#[test]
fn sciworld_fixtures_import_with_every_field_kept() {
    let (_dir, bank) = bank(768, &[]);
    for (tree, name) in [("task", TASK), ("env", ENV)] {
        let file = reference_fixture(name);
        let fx = Fixture::load(&file);
        assert_eq!(fx.placeholders.len(), 1);
        assert_eq!(
            fx.real().len(),
            30,
            "the fixture README says 31 nodes with one placeholder"
        );
        let acks = ok(&["import", s(&bank), "--tree", tree, "--reference-json", s(&file)]).lines();
        let acked: Vec<&str> = acks.iter().map(|a| a["external_id"].as_str().unwrap()).collect();
        let in_file: Vec<&str> = fx.real().iter().map(|n| n["node_id"].as_str().unwrap()).collect();
        assert_eq!(
            acked, in_file,
            "one ack per node, parents first (the file is in BFS order)"
        );
        let (dumped, ext_of) = dump_by_external_id(&bank, tree);
        assert_eq!(dumped.len(), 30);
        for n in fx.real() {
            let id = n["node_id"].as_str().unwrap();
            let d = &dumped[id];
            let parent = n["parent_id"].as_str().unwrap();
            if fx.placeholders.iter().any(|p| p == parent) {
                assert!(d["parent"].is_null(), "{id}: children of the placeholder are top-level");
                assert_eq!(d["type"], "ROOT");
            } else {
                assert_eq!(ext_of[&d["parent"].as_u64().unwrap()], parent, "{id}: parent link");
                assert_eq!(d["type"], "RESIDUAL");
            }
            assert_eq!(
                d["type"], n["meta"]["node_type"],
                "{id}: the fixture's types match positions"
            );
            assert_eq!(d["depth"].as_u64().unwrap(), fx.depth[id], "{id}: depth");
            assert_eq!(d["label"], n["meta"]["result_status"], "{id}: label");
            assert_eq!(d["scenario"], n["payload"]["scenario_description"]);
            assert_eq!(
                d["payload"]["activation_condition"], n["payload"]["memory_description"],
                "{id}: legacy key"
            );
            assert_eq!(
                d["payload"]["execution_procedure"], n["payload"]["content_body"],
                "{id}: legacy key"
            );
            assert_eq!(
                d["retrievals"], n["meta"]["usage_count"],
                "{id}: legacy retrieval counter"
            );
            assert_eq!(d["success_hits"], 0);
            assert_eq!(d["consolidated"], false);
            let created_s = n["meta"]["created_at"].as_u64().unwrap();
            assert_eq!(
                d["created_unix_ms"].as_u64(),
                Some(created_s * 1000),
                "{id}: creation time kept"
            );
            // Everything the legacy meta holds has a column now (usage_count
            // equals the retrievals it seeded), so nothing is left over.
            assert!(d["payload"].get("reference_meta").is_none(), "{id}: {}", d["payload"]);
            // The fixture vectors are unit length to 1e-7; stored ones are
            // renormalised, so they agree to a few float32 ulps.
            let diff = max_abs_diff(&floats(&d["embedding"]), &floats(&n["index"]["embedding"]));
            assert!(diff < 1e-6, "{id}: vector differs by {diff}");
        }
    }
    let stats = ok(&["stats", s(&bank), "--json"]).json();
    assert_eq!(stats["nodes"], 60);
}

#[test]
fn mind2web_empty_files_import_no_nodes() {
    let (_dir, bank) = bank(768, &[]);
    for (tree, name) in [("task", "mind2web_empty_task.json"), ("env", "mind2web_empty_env.json")] {
        let file = reference_fixture(name);
        let fx = Fixture::load(&file);
        assert_eq!(fx.doc["nodes"].as_array().unwrap().len(), fx.placeholders.len());
        let run = ok(&["import", s(&bank), "--tree", tree, "--reference-json", s(&file)]);
        assert_eq!(run.stdout, "", "no node, no ack");
        assert!(run.stderr.contains("0 nodes imported"), "{}", run.stderr);
    }
    assert_eq!(ok(&["stats", s(&bank), "--json"]).json()["nodes"], 0);
}

/// Sets what legitimately differs between two exports of equal trees (the
/// placeholder is synthetic, the timestamp is the export's time).
fn normalised(mut doc: Value) -> Value {
    doc["meta"]["timestamp"] = json!(0);
    let placeholder = doc["nodes"][0]["node_id"].as_str().unwrap().to_string();
    doc["nodes"][0]["node_id"] = json!("P");
    doc["nodes"][0]["meta"]["created_at"] = json!(0);
    for n in doc["nodes"].as_array_mut().unwrap() {
        if n["parent_id"] == json!(placeholder) {
            n["parent_id"] = json!("P");
        }
    }
    doc
}

fn export(bank: &Path, tree: &str, out: &Path) -> Value {
    ok(&[
        "export",
        s(bank),
        "--tree",
        tree,
        "--format",
        "reference-json",
        "--out",
        s(out),
    ]);
    read_json(out)
}

#[test]
fn fixture_to_bank_to_json_to_bank_preserves_everything() {
    let (dir, first) = bank(768, &[]);
    let second = dir.path().join("second");
    ok(&["init", s(&second), "--dim", "768"]);
    for (tree, name) in [("task", TASK), ("env", ENV)] {
        let file = reference_fixture(name);
        ok(&["import", s(&first), "--tree", tree, "--reference-json", s(&file)]);
        let exported = dir.path().join(format!("{tree}.json"));
        let doc_a = export(&first, tree, &exported);
        ok(&["import", s(&second), "--tree", tree, "--reference-json", s(&exported)]);
        let (a, a_ext) = dump_by_external_id(&first, tree);
        let (b, b_ext) = dump_by_external_id(&second, tree);
        let fixture_ids: Vec<String> = Fixture::load(&file)
            .real()
            .iter()
            .map(|n| n["node_id"].as_str().unwrap().to_string())
            .collect();
        let mut ids: Vec<&String> = b.keys().collect();
        ids.sort();
        let mut want: Vec<&String> = fixture_ids.iter().collect();
        want.sort();
        assert_eq!(ids, want, "ids survive both trips");
        for (id, na) in &a {
            let nb = &b[id];
            for key in [
                "type",
                "label",
                "depth",
                "success_hits",
                "retrievals",
                "consolidated",
                "consolidated_root",
                "scenario",
                "payload",
            ] {
                assert_eq!(na[key], nb[key], "{id}: {key}");
            }
            let parent = |n: &Value, ext: &HashMap<u64, String>| n["parent"].as_u64().map(|p| ext[&p].clone());
            assert_eq!(parent(na, &a_ext), parent(nb, &b_ext), "{id}: parent");
            // serde_json prints an f32 in its shortest exact form, so equal
            // text means equal bits.
            assert_eq!(na["embedding"], nb["embedding"], "{id}: vectors must be f32-exact");
        }
        let doc_b = export(&second, tree, &dir.path().join(format!("{tree}-again.json")));
        assert_eq!(
            normalised(doc_a),
            normalised(doc_b),
            "{tree}: a second trip changes nothing"
        );
    }
}

const SCHEMA_CHECK: &str = r#"
import json, sys
path, tree, dim = sys.argv[1], sys.argv[2], int(sys.argv[3])
text = open(path, encoding="utf-8").read()
doc = json.loads(text)
assert json.dumps(doc, indent=2) == text, "not json.dumps(indent=2) output"
assert list(doc) == ["meta", "nodes"], list(doc)
meta = doc["meta"]
assert list(meta) == ["tree_name", "timestamp", "stats"], list(meta)
assert meta["tree_name"] == tree and isinstance(meta["timestamp"], int)
nodes = doc["nodes"]
assert meta["stats"] == {"total_nodes": len(nodes), "max_depth": meta["stats"]["max_depth"]}
ph = nodes[0]
assert ph["parent_id"] is None
assert ph["payload"]["scenario_description"] == "GLOBAL_ROOT_PLACEHOLDER_" + tree.upper()
assert ph["index"]["embedding"] == [0.0] * dim
assert sum(1 for n in nodes if n["parent_id"] is None) == 1
META = ["node_type", "result_status", "created_at", "usage_count", "hit_count", "success_count",
        "is_consolidated", "episode_idx", "is_consolidated_root"]
PAYLOAD = ["scenario_description", "activation_condition", "execution_procedure",
           "termination_condition", "trajectory"]
by_id = {n["node_id"]: n for n in nodes}
assert len(by_id) == len(nodes), "duplicate ids"
depth = {ph["node_id"]: 0}
for n in nodes:
    assert list(n) == ["node_id", "parent_id", "children_ids", "meta", "index", "payload"], list(n)
    assert list(n["meta"])[:9] == META, list(n["meta"])
    assert list(n["payload"])[:5] == PAYLOAD, list(n["payload"])
    m = n["meta"]
    assert m["node_type"] in ("ROOT", "RESIDUAL") and m["result_status"] in ("SUCCESS", "FAILURE")
    assert isinstance(m["created_at"], (int, float))
    for k in ("usage_count", "hit_count", "success_count"):
        assert isinstance(m[k], int) and not isinstance(m[k], bool) and m[k] >= 0, k
    assert isinstance(m["is_consolidated"], bool) and isinstance(m["is_consolidated_root"], bool)
    emb = n["index"]["embedding"]
    assert len(emb) == dim and all(isinstance(x, float) for x in emb)
    if n is not ph:
        assert n["parent_id"] in depth, "parent after child: not BFS"
        depth[n["node_id"]] = depth[n["parent_id"]] + 1
        assert n["node_id"] in by_id[n["parent_id"]]["children_ids"]
        assert abs(sum(x * x for x in emb) - 1.0) < 1e-5
    for c in n["children_ids"]:
        assert by_id[c]["parent_id"] == n["node_id"], "children_ids disagree with parent_id"
assert meta["stats"]["max_depth"] == max(depth.values())
# BFS: the queue walk from the placeholder visits nodes in file order.
order, queue = [], [ph["node_id"]]
while queue:
    i = queue.pop(0); order.append(i); queue.extend(by_id[i]["children_ids"])
assert order == [n["node_id"] for n in nodes], "not in BFS order"
print(len(nodes))
"#;

#[test]
fn python_json_loads_our_export_and_the_schema_holds() {
    if !python_with("json") {
        eprintln!("SKIPPED: python3 is not installed, the export is not checked with Python's json module");
        return;
    }
    let (dir, bank) = bank(768, &[]);
    for (tree, name) in [("task", TASK), ("env", ENV)] {
        ok(&[
            "import",
            s(&bank),
            "--tree",
            tree,
            "--reference-json",
            s(&reference_fixture(name)),
        ]);
        let out = dir.path().join(format!("{tree}.json"));
        ok(&[
            "export",
            s(&bank),
            "--tree",
            tree,
            "--format",
            "reference-json",
            "--out",
            s(&out),
        ]);
        let run = python(SCHEMA_CHECK, &[s(&out), tree, "768"]);
        assert_eq!(run.code, 0, "{tree}: {}", run.stderr);
        assert_eq!(run.stdout.trim(), "31");
    }
    // An empty tree exports as the placeholder alone.
    let out = dir.path().join("empty.json");
    let (_d2, empty) = tools_common::bank(8, &["--tree", "insights"]);
    ok(&[
        "export",
        s(&empty),
        "--tree",
        "insights",
        "--format",
        "reference-json",
        "--out",
        s(&out),
    ]);
    let run = python(SCHEMA_CHECK, &[s(&out), "insights", "8"]);
    assert_eq!((run.code, run.stdout.trim()), (0, "1"), "{}", run.stderr);
}

#[test]
fn dimension_mismatch_names_the_file_and_the_node() {
    let (_dir, bank) = bank(4, &[]);
    let file = reference_fixture(TASK);
    let run = fails(&["import", s(&bank), "--tree", "task", "--reference-json", s(&file)], 1);
    let first_real = Fixture::load(&file).real()[0]["node_id"].as_str().unwrap().to_string();
    for needle in [file.to_str().unwrap(), first_real.as_str(), "768", "4"] {
        assert!(run.stderr.contains(needle), "missing {needle:?} in {}", run.stderr);
    }
    assert_eq!(ok(&["stats", s(&bank), "--json"]).json()["nodes"], 0, "nothing written");
}

#[test]
fn too_deep_for_the_bank_names_the_node_and_writes_nothing() {
    let (_dir, bank) = bank(768, &["--max-depth", "3"]);
    let file = reference_fixture(TASK);
    let run = fails(&["import", s(&bank), "--tree", "task", "--reference-json", s(&file)], 1);
    let fx = Fixture::load(&file);
    let named = fx
        .by_id
        .keys()
        .find(|id| run.stderr.contains(id.as_str()))
        .expect("a node id in the message");
    assert!(fx.depth[named] > 3, "{named} is at depth {}", fx.depth[named]);
    assert!(run.stderr.contains("D_max 3"), "{}", run.stderr);
    assert_eq!(ok(&["stats", s(&bank), "--json"]).json()["nodes"], 0);
}

#[test]
fn importing_the_same_file_twice_is_refused() {
    let (_dir, bank) = bank(768, &[]);
    let file = reference_fixture(ENV);
    ok(&["import", s(&bank), "--tree", "env", "--reference-json", s(&file)]);
    let run = fails(&["import", s(&bank), "--tree", "env", "--reference-json", s(&file)], 1);
    assert!(run.stderr.contains("already used by node"), "{}", run.stderr);
    assert_eq!(ok(&["stats", s(&bank), "--json"]).json()["nodes"], 30);
}

const P: &str = "aaaaaaaa-0000-4000-8000-000000000000";
const A: &str = "11111111-1111-4111-8111-111111111111";
const C: &str = "33333333-3333-4333-8333-333333333333";

/// A small file with what real files may hold beyond the fixtures: the
/// current schema, counters, flags, unknown keys, non-string values, a
/// text id, and types that disagree with positions.
fn odd_document() -> Value {
    json!({"meta": {"tree_name": "task", "timestamp": 1, "stats": {"total_nodes": 4, "max_depth": 2}},
    "nodes": [
      {"node_id": P, "parent_id": null, "children_ids": [A, "short-id-b"],
       "meta": {"node_type": "ROOT", "result_status": "SUCCESS", "created_at": 1700000000, "usage_count": 0},
       "index": {"embedding": [0.0, 0.0, 0.0, 0.0]},
       "payload": {"scenario_description": "GLOBAL_ROOT_PLACEHOLDER_TASK", "memory_description": "root", "content_body": "base"}},
      {"node_id": A, "parent_id": P, "children_ids": [C],
       "meta": {"node_type": "ROOT", "result_status": "SUCCESS", "created_at": 1700000001, "usage_count": 5,
                "hit_count": 3, "success_count": 2, "is_consolidated": false, "episode_idx": 7,
                "is_consolidated_root": true, "custom_score": 0.5, "tags": ["x", "y"]},
       "index": {"embedding": [1.0, 0.0, 0.0, 0.0]},
       "payload": {"scenario_description": "boil water", "activation_condition": "stove off <&>",
                   "execution_procedure": "1. heat\n2. wait", "termination_condition": "bubbles",
                   "trajectory": ["look", "open"], "notes": "keep me \u{e9}", "extra_number": 42, "nothing": null}},
      {"node_id": "short-id-b", "parent_id": P, "children_ids": [],
       "meta": {"node_type": "RESIDUAL", "result_status": "FAILURE", "created_at": 1700000002.5, "usage_count": 1},
       "index": {"embedding": [0.0, 1.0, 0.0, 0.0]},
       "payload": {"scenario_description": "legacy node", "memory_description": "legacy activation", "content_body": "legacy steps"}},
      {"node_id": C, "parent_id": A, "children_ids": [],
       "meta": {"node_type": "ROOT", "result_status": "SUCCESS", "created_at": 1700000003, "hit_count": 1,
                "success_count": 4, "is_consolidated": true},
       "index": {"embedding": [0.0, 0.0, 1.0, 0.5]},
       "payload": {"scenario_description": "both keys", "activation_condition": "current activation",
                   "memory_description": "old activation", "execution_procedure": null, "content_body": "old steps"}}
    ]})
}

#[test]
fn counters_flags_and_unknown_keys_survive_import_and_export() {
    let (dir, bank) = bank(4, &[]);
    let file = dir.path().join("odd.json");
    let original = odd_document();
    std::fs::write(&file, serde_json::to_vec_pretty(&original).unwrap()).unwrap();
    let run = ok(&["import", s(&bank), "--tree", "task", "--reference-json", s(&file)]);
    assert!(run.stderr.contains("short-id-b is typed RESIDUAL"), "{}", run.stderr);
    assert!(run.stderr.contains(&format!("{C} is typed ROOT")), "{}", run.stderr);
    let (dumped, ext_of) = dump_by_external_id(&bank, "task");
    let a = &dumped[A];
    assert_eq!(
        (a["type"].as_str(), a["success_hits"].as_u64(), a["retrievals"].as_u64()),
        (Some("ROOT"), Some(2), Some(3))
    );
    assert_eq!(a["payload"]["notes"], "keep me \u{e9}");
    let b = &dumped["short-id-b"];
    assert_eq!(
        (b["type"].as_str(), b["label"].as_str(), b["retrievals"].as_u64()),
        (Some("ROOT"), Some("FAILURE"), Some(1))
    );
    assert_eq!(b["payload"]["activation_condition"], "legacy activation");
    let c = &dumped[C];
    assert_eq!(
        (c["type"].as_str(), c["depth"].as_u64(), c["success_hits"].as_u64()),
        (Some("RESIDUAL"), Some(2), Some(4))
    );
    assert_eq!(ext_of[&c["parent"].as_u64().unwrap()], A);
    assert_eq!(c["payload"]["activation_condition"], "current activation");
    assert_eq!(
        c["payload"]["memory_description"], "old activation",
        "a legacy key beside its current one is kept"
    );
    assert_eq!(c["payload"]["execution_procedure"], "old steps");

    let exported = export(&bank, "task", &dir.path().join("out.json"));
    assert_export_restores(&original, &exported);
    // And the export imports again into the same tree shape.
    let (_d2, again) = tools_common::bank(4, &[]);
    ok(&[
        "import",
        s(&again),
        "--tree",
        "task",
        "--reference-json",
        s(&dir.path().join("out.json")),
    ]);
    let second = export(&again, "task", &dir.path().join("out2.json"));
    assert_eq!(normalised(exported), normalised(second));
}

/// Every meta and payload entry of `original` comes back in `exported`
/// (legacy payload keys under their current names).
fn assert_export_restores(original: &Value, exported: &Value) {
    let out_by_id: HashMap<&str, &Value> = exported["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["node_id"].as_str().unwrap(), n))
        .collect();
    for n in original["nodes"].as_array().unwrap().iter().skip(1) {
        let id = n["node_id"].as_str().unwrap();
        let out = out_by_id[id];
        for (key, v) in n["meta"].as_object().unwrap() {
            assert_eq!(&out["meta"][key], v, "{id}: meta.{key} must come back as written");
        }
        for (key, v) in n["payload"].as_object().unwrap() {
            let current = match key.as_str() {
                "memory_description" => "activation_condition",
                "content_body" => "execution_procedure",
                k => k,
            };
            let replaced = current != key && !n["payload"].get(current).is_none_or(Value::is_null);
            match (v.is_null() && current != "nothing", replaced) {
                (true, _) => {}
                (false, false) => assert_eq!(&out["payload"][current], v, "{id}: payload.{key}"),
                (false, true) => assert_eq!(&out["payload"][key.as_str()], v, "{id}: payload.{key} kept by name"),
            }
        }
        assert_eq!(out["children_ids"], n["children_ids"], "{id}: children");
    }
}

fn import_doc(doc: &str) -> Run {
    let (dir, bank) = bank(4, &[]);
    let file = dir.path().join("bad.json");
    std::fs::write(&file, doc).unwrap();
    let run = deltamem(
        &["import", s(&bank), "--tree", "task", "--reference-json", s(&file)],
        "",
    );
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stderr.contains(s(&file)), "the file is named: {}", run.stderr);
    assert_eq!(ok(&["stats", s(&bank), "--json"]).json()["nodes"], 0, "nothing written");
    run
}

/// A node without `children_ids` (optional: when given, they must agree
/// with the `parent_id`s).
fn node(id: &str, parent: Option<&str>, emb: [f32; 4]) -> Value {
    json!({"node_id": id, "parent_id": parent, "meta": {"result_status": "SUCCESS"},
           "index": {"embedding": emb}, "payload": {"scenario_description": format!("scenario {id}")}})
}

#[test]
fn broken_files_are_refused_with_file_and_node_named() {
    let run = import_doc("{\n  \"nodes\": [\n    {oops\n");
    assert!(run.stderr.contains("line 3"), "{}", run.stderr);
    // A key given twice: JSON parsers keep the last, and a second
    // "nodes": [] imported nothing, exit 0.
    let whole = json!({"nodes": [node("x", None, [1.0, 0.0, 0.0, 0.0])]}).to_string();
    let run = import_doc(&format!("{}, \"nodes\": []}}", whole.trim_end_matches('}')));
    assert!(run.stderr.contains("\"nodes\" is given twice"), "{}", run.stderr);
    let run = import_doc(&whole.replace("\"embedding\":[", "\"embedding\":[0,1,0,0],\"embedding\":["));
    assert!(run.stderr.contains("\"embedding\" is given twice"), "{}", run.stderr);
    let e = [1.0, 0.0, 0.0, 0.0];
    let cases: Vec<(Value, &str, &str)> = vec![
        (
            json!({"nodes": [node("x", Some("y"), e), node("y", Some("x"), e)]}),
            "x",
            "loop",
        ),
        (
            json!({"nodes": [node("x", Some("ghost"), e)]}),
            "ghost",
            "not in the file",
        ),
        (json!({"nodes": [node("x", None, e), node("x", None, e)]}), "x", "twice"),
        (json!({"nodes": [node("x", None, [0.0; 4])]}), "x", "all zeros"),
        (
            json!({"nodes": [node("x", None, e)]}).tap(|d| d["nodes"][0]["meta"]["result_status"] = json!("MAYBE")),
            "x",
            "result_status",
        ),
        (
            json!({"nodes": [node("x", None, e)]}).tap(|d| d["nodes"][0]["meta"]["success_count"] = json!(-2)),
            "x",
            "success_count",
        ),
        (
            json!({"nodes": [node("x", None, e)]})
                .tap(|d| d["nodes"][0]["payload"]["scenario_description"] = json!(" ")),
            "x",
            "scenario",
        ),
        (
            json!({"nodes": [node("x", None, e), node("0123456789abcdefXYZ", Some("x"), e)]}),
            "0123456789abcdefXYZ",
            // The bank's own rule, run on the whole file before writing.
            "bad external id",
        ),
        // Keys the import would drop, and a file that contradicts itself.
        (
            json!({"nodes": [node("x", None, e)]}).tap(|d| d["nodes"][0]["extra"] = json!(1)),
            "x",
            "unknown key \"extra\"",
        ),
        (
            json!({"nodes": [node("x", None, e)]}).tap(|d| d["nodes"][0]["index"]["model"] = json!("m")),
            "x",
            "unknown key \"index.model\"",
        ),
        (
            json!({"nodes": [node("x", None, e)], "version": 2}),
            "version",
            "unknown top-level key",
        ),
        (
            json!({"nodes": [node("x", None, e), node("y", Some("x"), e)]})
                .tap(|d| d["nodes"][0]["children_ids"] = json!([])),
            "\"y\"",
            "leaves it out",
        ),
        (
            json!({"nodes": [node("x", None, e), node("y", None, e)]})
                .tap(|d| d["nodes"][0]["children_ids"] = json!(["y"])),
            "\"y\"",
            "whose parent_id is not this node",
        ),
    ];
    for (doc, id, why) in cases {
        let run = import_doc(&doc.to_string());
        assert!(
            run.stderr.contains(id) && run.stderr.contains(why),
            "{id}/{why}: {}",
            run.stderr
        );
    }
}

trait Tap {
    fn tap(self, f: impl FnOnce(&mut Self)) -> Self;
}

impl Tap for Value {
    fn tap(mut self, f: impl FnOnce(&mut Value)) -> Value {
        f(&mut self);
        self
    }
}

#[test]
fn jsonl_export_has_one_node_per_line() {
    let (_dir, bank) = bank(768, &[]);
    let file = reference_fixture(ENV);
    ok(&["import", s(&bank), "--tree", "env", "--reference-json", s(&file)]);
    let lines = ok(&["export", s(&bank), "--tree", "env", "--format", "jsonl"]).lines();
    let dumped = dump(&bank, &["--tree", "env"]);
    assert_eq!(lines.len(), dumped.len());
    let fx = Fixture::load(&file);
    for l in &lines {
        let id = l["node_id"].as_str().unwrap();
        let d = dumped.iter().find(|d| d["id"] == l["id"]).unwrap();
        assert_eq!(d["external_id"], l["node_id"]);
        assert_eq!(l["depth"].as_u64().unwrap(), fx.depth[id]);
        let parent = fx.by_id[id]["parent_id"].as_str().unwrap();
        let want_parent = if fx.placeholders.iter().any(|p| p == parent) {
            Value::Null
        } else {
            json!(parent)
        };
        assert_eq!(l["parent_id"], want_parent, "{id}");
        assert_eq!(l["children_ids"], fx.by_id[id]["children_ids"], "{id}");
    }
}

#[test]
fn export_of_an_unknown_tree_fails_and_creates_nothing() {
    let (dir, bank) = bank(4, &[]);
    let out = dir.path().join("x.json");
    let run = fails(
        &[
            "export",
            s(&bank),
            "--tree",
            "nope",
            "--format",
            "reference-json",
            "--out",
            s(&out),
        ],
        1,
    );
    assert!(run.stderr.contains("nope"), "{}", run.stderr);
    assert!(!out.exists());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no temporary file left behind"
    );
}

/// Payload fields the reference schema cannot carry back as they are: a
/// field named like the scenario's key was dropped, and a legacy key on
/// its own came back renamed. Export refuses them by node and field and
/// writes nothing; a legacy key beside its current key round-trips.
#[test]
fn fields_the_reference_schema_cannot_keep_are_refused_by_name() {
    let cases = [
        (
            json!({"scenario_description": "mine"}),
            Some("\"scenario_description\""),
        ),
        (json!({"memory_description": "when x"}), Some("\"memory_description\"")),
        (json!({"content_body": "do y"}), Some("\"content_body\"")),
        (
            json!({"memory_description": "old", "activation_condition": "new"}),
            None,
        ),
        // The reserved fields, as an insert may fill them: a key held
        // twice lost one value, a flag came back set on the row, and a
        // node_type or created_at the import refuses made a file that
        // its own import could not read.
        (json!({"foo": "a", "reference_payload": "{\"foo\":1}"}), Some("\"foo\"")),
        (
            json!({"reference_meta": "{\"is_consolidated\":true}"}),
            Some("\"is_consolidated\""),
        ),
        (json!({"reference_meta": "{\"node_type\":\"LEAF\"}"}), Some("LEAF")),
        (
            json!({"reference_meta": "{\"created_at\":\"yesterday\"}"}),
            Some("\"created_at\""),
        ),
        (
            json!({"reference_meta": "{\"episode_idx\":4,\"mine\":[1]}", "reference_payload": "{\"n\":2}"}),
            None,
        ),
    ];
    for (payload, refused) in cases {
        let (dir, bank) = bank(4, &[]);
        let line = json!({"tree": "task", "attach": "root", "label": "SUCCESS", "scenario": "s",
                          "payload": payload, "embedding": [1.0, 0.0, 0.0, 0.0], "id": "n1"});
        let run = deltamem(&["insert", s(&bank)], &format!("{line}\n"));
        assert_eq!(run.code, 0, "{}", run.stderr);
        let out = dir.path().join("x.json");
        let args = [
            "export",
            s(&bank),
            "--tree",
            "task",
            "--format",
            "reference-json",
            "--out",
            s(&out),
        ];
        match refused {
            Some(field) => {
                let run = fails(&args, 1);
                assert!(
                    run.stderr.contains(field) && run.stderr.contains("n1"),
                    "{}",
                    run.stderr
                );
                assert!(!out.exists(), "{payload}: a refused export left {out:?}");
                // To stdout (which cannot be taken back) nothing is
                // written: it held a cut-off document.
                for format in ["reference-json", "jsonl"] {
                    let run = fails(
                        &args[..6]
                            .iter()
                            .map(|a| if *a == "reference-json" { format } else { a })
                            .collect::<Vec<_>>(),
                        1,
                    );
                    assert!(
                        run.stdout.is_empty() && run.stderr.contains("n1"),
                        "{format}: {}",
                        run.stdout
                    );
                }
            }
            None => {
                ok(&args);
                let (_dir2, again) = self::bank(4, &[]);
                ok(&["import", s(&again), "--tree", "task", "--reference-json", s(&out)]);
                let (by_id, _) = dump_by_external_id(&again, "task");
                assert_eq!(by_id["n1"]["payload"], payload, "{payload}");
            }
        }
    }
}

/// A payload key named like a reserved field, which an import keeps in
/// `reference_payload` (the fields themselves are the engine's), exports
/// and imports back as it was: the check that refuses what an insert put
/// in the reserved fields refused it.
#[test]
fn a_payload_key_named_like_a_reserved_field_round_trips() {
    let (dir, bank) = bank(4, &[]);
    let mut doc = json!({"nodes": [node("x", None, [1.0, 0.0, 0.0, 0.0])]});
    doc["nodes"][0]["payload"]["reference_payload"] = json!({"a": 1});
    doc["nodes"][0]["payload"]["reference_meta"] = json!("kept");
    doc["nodes"][0]["meta"]["episode_idx"] = json!(3);
    let file = dir.path().join("in.json");
    std::fs::write(&file, doc.to_string()).unwrap();
    ok(&["import", s(&bank), "--tree", "task", "--reference-json", s(&file)]);
    let out = dir.path().join("out.json");
    ok(&[
        "export",
        s(&bank),
        "--tree",
        "task",
        "--format",
        "reference-json",
        "--out",
        s(&out),
    ]);
    let back: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let x = back["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node_id"] == "x")
        .unwrap();
    assert_eq!(x["payload"]["reference_payload"], json!({"a": 1}));
    assert_eq!(x["payload"]["reference_meta"], json!("kept"));
    assert_eq!(x["meta"]["episode_idx"], json!(3));
}

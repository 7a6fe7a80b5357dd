//! Issue 11's protocol and input defects, through the real binary: one
//! output line per input line, strict keys, unambiguous node references,
//! query ranges, all-or-nothing imports checked by the bank's own rules,
//! inputs read once (pipes), and text that cannot drive the terminal.

mod tools_common;

use std::path::Path;
use std::process::Command;

use deltamem::interop::npy::NpyElement;
use serde_json::{Value, json};
use tools_common::{bank, deltamem, ok, s, write_npy};

fn node(scenario: &str, embedding: &[f32]) -> Value {
    json!({"tree": "task", "attach": "root", "label": "SUCCESS", "scenario": scenario,
           "payload": {}, "embedding": embedding})
}

fn node_count(bank: &Path) -> u64 {
    ok(&["stats", s(bank), "--json"]).json()["nodes"].as_u64().unwrap()
}

/// `deltamem import BANK --tree task` with `flags`.
fn import(bank: &Path, flags: &[&str]) -> tools_common::Run {
    let mut args = vec!["import", s(bank), "--tree", "task"];
    args.extend_from_slice(flags);
    deltamem(&args, "")
}

fn lines_of(values: &[Value]) -> String {
    values.iter().map(Value::to_string).collect::<Vec<_>>().join("\n")
}

/// Item 8: three queries, the middle one bad, and an empty line: four
/// output lines, each in its input's place.
#[test]
fn query_answers_every_line_in_order() {
    let (_dir, b) = bank(4, &[]);
    deltamem(&["insert", s(&b)], &node("one", &[1.0, 0.0, 0.0, 0.0]).to_string());
    let good = json!({"tree": "task", "embedding": [1, 0, 0, 0], "tau": -1});
    let short = json!({"tree": "task", "embedding": [1, 0, 0]});
    let input = format!("{good}\n{short}\n\n{good}\n");
    let run = deltamem(&["query", s(&b)], &input);
    assert_eq!(run.code, 1);
    let lines = run.lines();
    assert_eq!(lines.len(), 4, "{}", run.stdout);
    assert_eq!(lines[0]["matches"][0]["id"], 0);
    assert_eq!(lines[1]["line"], 2);
    assert!(
        lines[1]["error"].as_str().unwrap().contains("3 dimensions"),
        "{}",
        lines[1]
    );
    assert_eq!(lines[2]["line"], 3);
    assert!(
        lines[2]["error"].as_str().unwrap().contains("empty line"),
        "{}",
        lines[2]
    );
    assert_eq!(lines[3]["matches"][0]["id"], 0);
}

/// Item 8: insert acks line up with their input lines too.
#[test]
fn insert_answers_every_line_in_order() {
    let (_dir, b) = bank(4, &[]);
    let input = format!(
        "{}\nnot json\n\n{}",
        node("a", &[1.0, 0.0, 0.0, 0.0]),
        node("b", &[0.0, 1.0, 0.0, 0.0])
    );
    let run = deltamem(&["insert", s(&b), "--sync", "always"], &input);
    let lines = run.lines();
    assert_eq!(lines.len(), 4, "{}", run.stdout);
    assert_eq!((lines[0]["id"].clone(), lines[3]["id"].clone()), (json!(0), json!(1)));
    assert_eq!(
        (lines[1]["line"].clone(), lines[2]["line"].clone()),
        (json!(2), json!(3))
    );
}

/// Item 9: a misspelt key, a repeated key or a repeated payload key is
/// refused naming the key, and stores nothing.
#[test]
fn unknown_and_duplicate_keys_are_refused_by_name() {
    let (_dir, b) = bank(4, &[]);
    let base = r#""tree":"task","attach":"root","scenario":"s","embedding":[1,0,0,0]"#;
    let cases = [
        (
            format!(r#"{{{base},"label":"SUCCESS","payload":{{}},"ID":"myid"}}"#),
            "unknown field `ID`",
        ),
        (
            format!(r#"{{{base},"label":"SUCCESS","label":"FAILURE","payload":{{}}}}"#),
            "duplicate field `label`",
        ),
        (
            format!(r#"{{{base},"label":"SUCCESS","payload":{{"k":"1","k":"2"}}}}"#),
            "duplicate key \"k\"",
        ),
        (
            r#"["task","root","SUCCESS","s",{},[1,0,0,0]]"#.to_string(),
            "expected a JSON object",
        ),
    ];
    for (line, words) in cases {
        let run = deltamem(&["insert", s(&b)], &line);
        assert_eq!(run.code, 1, "{line}");
        let out = run.lines();
        assert!(out[0]["error"].as_str().unwrap().contains(words), "{line}: {}", out[0]);
    }
    assert_eq!(node_count(&b), 0);
    let query = r#"{"tree":"task","embedding":[1,0,0,0],"tua":0.5}"#;
    let run = deltamem(&["query", s(&b)], query);
    assert!(
        run.lines()[0]["error"]
            .as_str()
            .unwrap()
            .contains("unknown field `tua`")
    );
}

/// Item 10: an external id of digits only is refused on every write path,
/// so `hit 1` can only mean index 1.
#[test]
fn all_digit_external_ids_are_refused() {
    let (dir, b) = bank(4, &[]);
    let mut with_id = node("a", &[1.0, 0.0, 0.0, 0.0]);
    with_id["id"] = json!("1");
    let run = deltamem(&["insert", s(&b)], &with_id.to_string());
    assert_eq!(run.code, 1);
    let error = run.lines()[0]["error"].as_str().unwrap().to_string();
    assert!(error.contains("\"1\"") && error.contains("all digits"), "{error}");
    with_id["id"] = json!("n1");
    ok_insert(&b, &with_id);
    let npy = dir.path().join("v.npy");
    let meta = dir.path().join("m.jsonl");
    write_npy(&npy, &[vec![0.0, 1.0, 0.0, 0.0]], NpyElement::F32);
    std::fs::write(&meta, "{\"id\":\"42\"}\n").unwrap();
    let run = import(&b, &["--npy", s(&npy), "--meta", s(&meta)]);
    assert!(run.code == 1 && run.stderr.contains("all digits"), "{}", run.stderr);
    assert_eq!(node_count(&b), 1);
}

fn ok_insert(bank: &Path, node: &Value) {
    let run = deltamem(&["insert", s(bank)], &node.to_string());
    assert_eq!(run.code, 0, "{}", run.stderr);
}

/// Item 11: tau outside [-1, 1] and eps below 0 are refused with init's
/// ranges, from stdin and from --npy alike.
#[test]
fn query_ranges_are_inits() {
    let (dir, b) = bank(4, &[]);
    ok_insert(&b, &node("a", &[1.0, 0.0, 0.0, 0.0]));
    let queries = [
        (
            json!({"tree": "task", "embedding": [1, 0, 0, 0], "tau": 1.5}),
            "tau 1.5 outside -1..=1",
        ),
        (
            json!({"tree": "task", "embedding": [1, 0, 0, 0], "tau": 1e39}),
            "outside -1..=1",
        ),
        (
            json!({"tree": "task", "embedding": [1, 0, 0, 0], "eps": -0.5}),
            "eps -0.5 must be finite and >= 0",
        ),
        (
            json!({"tree": "task", "embedding": [1, 0, 0, 0], "k": 0}),
            "k must be at least 1",
        ),
    ];
    let input = lines_of(&queries.iter().map(|(q, _)| q.clone()).collect::<Vec<_>>());
    let run = deltamem(&["query", s(&b)], &input);
    for (out, (_, words)) in run.lines().iter().zip(&queries) {
        assert!(out["error"].as_str().unwrap().contains(words), "{out}");
    }
    let npy = dir.path().join("q.npy");
    write_npy(&npy, &[vec![1.0, 0.0, 0.0, 0.0]], NpyElement::F32);
    let run = deltamem(&["query", s(&b), "--npy", s(&npy), "--tree", "task", "--eps", "-1"], "");
    assert!(
        run.code == 1 && run.stdout.contains("eps -1 must be finite and >= 0"),
        "{}",
        run.stdout
    );
    let run = deltamem(&["query", s(&b), "--npy", s(&npy), "--tree", "task", "--k", "0"], "");
    assert!(
        run.code == 1 && run.stdout.contains("k must be at least 1"),
        "{}",
        run.stdout
    );
}

/// A reference file of two nodes, the second with `meta_patch` applied.
fn reference_file(dir: &Path, second: Value) -> std::path::PathBuf {
    // The file agrees with itself: x lists its child, if y is one.
    let children = if second["parent_id"] == "x" {
        json!(["y"])
    } else {
        json!([])
    };
    let first = json!({"node_id": "x", "parent_id": null, "children_ids": children,
        "meta": {"result_status": "SUCCESS"}, "index": {"embedding": [1.0, 0.0, 0.0, 0.0]},
        "payload": {"scenario_description": "first"}});
    let path = dir.join("ref.json");
    std::fs::write(&path, json!({"nodes": [first, second]}).to_string()).unwrap();
    path
}

/// Item 3: what only the bank checks (a vector too short to normalise, a
/// consolidated root that is a residual) refuses the whole file, written
/// in batches of one node; once fixed the same file imports.
#[test]
fn reference_import_is_checked_whole_by_the_banks_rules() {
    let (dir, b) = bank(4, &[]);
    let tiny = json!({"node_id": "y", "parent_id": null, "children_ids": [],
        "meta": {"result_status": "SUCCESS"}, "index": {"embedding": [1e-45, 0.0, 0.0, 0.0]},
        "payload": {"scenario_description": "tiny"}});
    let residual_root = json!({"node_id": "y", "parent_id": "x", "children_ids": [],
        "meta": {"result_status": "SUCCESS", "is_consolidated_root": true},
        "index": {"embedding": [0.0, 1.0, 0.0, 0.0]}, "payload": {"scenario_description": "child"}});
    for (second, words) in [(tiny, "norm"), (residual_root, "consolidated root")] {
        let file = reference_file(dir.path(), second);
        let run = import(&b, &["--reference-json", s(&file), "--batch", "1"]);
        assert!(run.code == 1 && run.stderr.contains(words), "{}", run.stderr);
        assert!(run.stderr.contains("node y"), "{}", run.stderr);
        assert_eq!(node_count(&b), 0, "nothing written");
    }
    let fixed = json!({"node_id": "y", "parent_id": "x", "children_ids": [],
        "meta": {"result_status": "SUCCESS"}, "index": {"embedding": [0.0, 1.0, 0.0, 0.0]},
        "payload": {"scenario_description": "child"}});
    let file = reference_file(dir.path(), fixed);
    let run = import(&b, &["--reference-json", s(&file), "--batch", "1"]);
    assert_eq!((run.code, node_count(&b)), (0, 2), "{}", run.stderr);
}

/// Item 4: rows the CLI's own checks pass but the bank refuses stop the
/// import before anything is written, whichever batch they are in.
#[test]
fn npy_import_is_checked_whole_by_the_banks_rules() {
    let (dir, b) = bank(4, &[]);
    let npy = dir.path().join("v.npy");
    let mut rows: Vec<Vec<f32>> = (0..6).map(|i| vec![1.0, i as f32, 0.0, 0.0]).collect();
    let long = "x".repeat(4 * 1024 * 1024 + 1);
    let cases: Vec<(usize, Value, &str)> = vec![
        (4, json!({}), "norm"),
        (4, json!({"scenario": ""}), "scenario"),
        (4, json!({"id": "seventeen-bytes-x"}), "external id"),
        (4, json!({"id": "twice"}), "given twice in one write: item 0"),
        (4, json!({"payload": {"big": long}}), "limit"),
    ];
    for (bad_row, line, words) in cases {
        rows[bad_row] = if words == "norm" {
            vec![1e-45, 0.0, 0.0, 0.0]
        } else {
            vec![1.0, 4.0, 0.0, 0.0]
        };
        write_npy(&npy, &rows, NpyElement::F32);
        let mut meta: Vec<Value> = vec![json!({}); rows.len()];
        meta[bad_row] = line;
        if words.starts_with("given twice") {
            meta[0] = json!({"id": "twice"});
        }
        let meta_path = dir.path().join("m.jsonl");
        std::fs::write(&meta_path, lines_of(&meta) + "\n").unwrap();
        let run = import(&b, &["--npy", s(&npy), "--meta", s(&meta_path), "--batch", "2"]);
        assert!(run.code == 1 && run.stderr.contains(words), "{words}: {}", run.stderr);
        assert!(run.stderr.contains("row 4"), "{}", run.stderr);
        assert_eq!(node_count(&b), 0, "{words}: nothing written");
    }
}

/// Item 12: the matrix and META may come from a pipe or a process
/// substitution (read once), for import and for queries.
#[test]
fn npy_and_meta_can_be_pipes() {
    let (dir, b) = bank(4, &[]);
    let npy = dir.path().join("v.npy");
    write_npy(
        &npy,
        &[vec![1.0, 0.0, 0.0, 0.0], vec![0.0, 1.0, 0.0, 0.0]],
        NpyElement::F32,
    );
    let meta = dir.path().join("m.jsonl");
    std::fs::write(&meta, "{\"scenario\":\"first\"}\n{\"scenario\":\"second\"}\n").unwrap();
    let bin = env!("CARGO_BIN_EXE_deltamem");
    let script = format!(
        "cat '{npy}' | '{bin}' import '{bank}' --tree task --npy /dev/stdin --meta <(cat '{meta}') && \
         cat '{npy}' | '{bin}' query '{bank}' --tree task --npy /dev/stdin --tau -1",
        npy = s(&npy),
        bank = s(&b),
        meta = s(&meta)
    );
    let out = Command::new("bash").args(["-c", &script]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    assert_eq!(
        (
            lines[2]["matches"][0]["id"].clone(),
            lines[3]["matches"][0]["id"].clone()
        ),
        (json!(0), json!(1))
    );
    let scenarios: Vec<Value> = tools_common::dump(&b, &[])
        .iter()
        .map(|n| n["scenario"].clone())
        .collect();
    assert_eq!(scenarios, [json!("first"), json!("second")]);
}

/// Smaller defects: no "(in 0 batches)" in a clean import's summary, and
/// `draw --format text` escapes control characters from stored text.
#[test]
fn summaries_and_drawings_say_what_they_mean() {
    let (dir, b) = bank(4, &[]);
    let npy = dir.path().join("v.npy");
    write_npy(&npy, &[vec![1.0, 0.0, 0.0, 0.0]], NpyElement::F32);
    let run = import(&b, &["--npy", s(&npy)]);
    assert!(run.code == 0 && !run.stderr.contains("0 batches"), "{}", run.stderr);
    ok_insert(&b, &node("red\u{1b}[31m\r\nnext", &[0.0, 1.0, 0.0, 0.0]));
    let text = ok(&["draw", s(&b), "--tree", "task", "--format", "text"]).stdout;
    // No ESC or CR reaches the terminal, and the node stays on one line
    // (tree name, first root, this node).
    assert!(!text.contains('\u{1b}') && !text.contains('\r'), "{text:?}");
    assert!(text.contains("red") && text.contains("next"), "{text}");
    assert_eq!(text.lines().count(), 3, "{text}");
}

//! The bank tools through the real binary: the build-then-freeze pipeline
//! (with two processes querying the frozen bank at once), compact, stats,
//! pictures, verify --json, progress bars and usage errors.

mod tools_common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Stdio;

use deltamem::interop::npy::NpyElement;
use serde_json::{Value, json};
use tools_common::*;

fn node_line(tree: &str, attach: Value, label: &str, scenario: &str, fields: Value, embedding: &[f32]) -> String {
    json!({"tree": tree, "attach": attach, "label": label, "scenario": scenario, "payload": fields, "embedding": embedding})
        .to_string()
}

fn insert(bank: &Path, lines: &[String]) -> Vec<Value> {
    let run = deltamem(&["insert", s(bank)], &(lines.join("\n") + "\n"));
    assert_eq!(run.code, 0, "{}", run.stderr);
    run.lines()
}

/// The best stored row for each query by cosine, computed here.
fn brute_force_best(stored: &[Vec<f32>], query: &[f32]) -> usize {
    let q = unit(query);
    let score = |v: &Vec<f32>| unit(v).iter().zip(&q).map(|(a, b)| a * b).sum::<f64>();
    (0..stored.len())
        .max_by(|&a, &b| score(&stored[a]).total_cmp(&score(&stored[b])))
        .unwrap()
}

/// Imports 300 rows with META into `bank` and freezes it into `dir`;
/// returns the rows and the frozen bank.
fn build_and_freeze(dir: &Path, bank: &Path) -> (Vec<Vec<f32>>, std::path::PathBuf) {
    let rows = random_rows(300, 16, 99);
    let (npy, meta) = (dir.join("vectors.npy"), dir.join("meta.jsonl"));
    write_npy(&npy, &rows, NpyElement::F32);
    let meta_text: String = (0..rows.len())
        .map(|r| {
            format!(
                "{}\n",
                json!({"scenario": format!("doc {r}"), "id": format!("doc-{r}")})
            )
        })
        .collect();
    std::fs::write(&meta, meta_text).unwrap();
    ok(&[
        "import",
        s(bank),
        "--tree",
        "task",
        "--npy",
        s(&npy),
        "--meta",
        s(&meta),
    ]);
    let frozen = dir.join("frozen");
    let report = ok(&["freeze", s(bank), s(&frozen)]).json();
    assert_eq!(
        (
            report["nodes"].as_u64(),
            report["verified"].as_bool(),
            report["vectors_verified"].as_bool()
        ),
        (Some(300), Some(true), Some(false))
    );
    let stats = ok(&["stats", s(&frozen), "--json"]).json();
    assert_eq!(
        (stats["frozen"].as_bool(), stats["nodes"].as_u64()),
        (Some(true), Some(300))
    );
    let write = deltamem(&["hit", s(&frozen), "0"], "");
    assert!(
        write.code == 1 && write.stderr.contains("frozen"),
        "writes are refused: {}",
        write.stderr
    );
    (rows, frozen)
}

#[test]
fn build_then_freeze_then_two_processes_query_the_frozen_bank_at_once() {
    let (dir, bank) = bank(16, &["--tree", "task:tau=0.5"]);
    let (rows, frozen) = build_and_freeze(dir.path(), &bank);
    // Queries: stored rows nudged a little, so the answer is known.
    let queries: Vec<Vec<f32>> = rows
        .iter()
        .take(120)
        .map(|r| r.iter().map(|x| x * 0.98 + 0.01).collect())
        .collect();
    let q = dir.path().join("queries.npy");
    write_npy(&q, &queries, NpyElement::F32);
    let spawn = || {
        command(&["query", s(&frozen), "--tree", "task", "--npy", s(&q), "--threads", "2"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap()
    };
    let (first, second) = (spawn(), spawn()); // both running before either is awaited
    let outputs = [first.wait_with_output().unwrap(), second.wait_with_output().unwrap()];
    for out in &outputs {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), queries.len());
        for (r, line) in lines.iter().enumerate() {
            let best = &line["matches"][0];
            assert_eq!(best["id"], brute_force_best(&rows, &queries[r]) as u64, "query {r}");
            assert_eq!(best["external_id"], format!("doc-{}", best["id"]));
        }
    }
    assert_eq!(outputs[0].stdout, outputs[1].stdout);
    assert_eq!(ok(&["verify", s(&frozen), "--json"]).json()["ok"], true);
    let again = deltamem(&["freeze", s(&bank), s(&frozen)], "");
    assert!(again.code == 1 && again.stderr.contains(s(&frozen)), "{}", again.stderr);
    let full = dir.path().join("frozen-full");
    let report = ok(&["freeze", s(&bank), s(&full), "--verify-vectors"]).json();
    assert_eq!(report["vectors_verified"].as_bool(), Some(true), "{report}");
}

/// A bank with a known shape: task R <- C1 (FAILURE) <- C2, env E; C2 hit
/// three times (so due for consolidation).
fn shaped_bank() -> (tempfile::TempDir, std::path::PathBuf, Vec<(String, Value)>) {
    let (dir, bank) = bank(4, &[]);
    let payloads = vec![
        (
            "boil water".to_string(),
            json!({"activation_condition": "kettle <cold> & \"off\"", "execution_procedure": "heat it"}),
        ),
        (
            "boil water fast".to_string(),
            json!({"activation_condition": "no kettle\u{1}\nat all"}),
        ),
        (
            "boil with stove".to_string(),
            json!({"execution_procedure": "use the stove"}),
        ),
        ("kitchen".to_string(), json!({"content": "stove on the left"})),
    ];
    let lines = vec![
        node_line(
            "task",
            json!("root"),
            "SUCCESS",
            &payloads[0].0,
            payloads[0].1.clone(),
            &[1.0, 0.0, 0.0, 0.0],
        ),
        node_line(
            "task",
            json!({"parent": 0}),
            "FAILURE",
            &payloads[1].0,
            payloads[1].1.clone(),
            &[0.9, 0.1, 0.0, 0.0],
        ),
        node_line(
            "task",
            json!({"parent": 1}),
            "SUCCESS",
            &payloads[2].0,
            payloads[2].1.clone(),
            &[0.8, 0.2, 0.0, 0.0],
        ),
        node_line(
            "env",
            json!("root"),
            "SUCCESS",
            &payloads[3].0,
            payloads[3].1.clone(),
            &[0.0, 0.0, 1.0, 0.0],
        ),
    ];
    insert(&bank, &lines);
    for _ in 0..3 {
        ok(&["hit", s(&bank), "2"]);
    }
    (dir, bank, payloads)
}

#[test]
fn stats_json_counts_trees_depths_sizes_and_compression() {
    let (_dir, bank, payloads) = shaped_bank();
    let stats = ok(&["stats", s(&bank), "--json", "--deep"]).json();
    let trees: BTreeMap<&str, &Value> = stats["trees"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap(), t))
        .collect();
    let task = trees["task"];
    for (key, want) in [
        ("nodes", 3),
        ("roots", 1),
        ("residuals", 2),
        ("successes", 2),
        ("failures", 1),
        ("due_for_consolidation", 1),
    ] {
        assert_eq!(task[key], want, "task {key}");
    }
    assert_eq!(task["depth_histogram"], json!([1, 1, 1, 0, 0]));
    assert_eq!(trees["env"]["depth_histogram"], json!([1, 0, 0, 0, 0]));
    // 4 dims of f32 padded to the 64-byte row stride, 128-byte table rows.
    let per = &stats["bytes_per_node"];
    assert_eq!(
        (per["vectors"].as_f64(), per["table"].as_f64()),
        (Some(64.0), Some(128.0))
    );
    let total = per["vectors"].as_f64().unwrap() + per["table"].as_f64().unwrap() + per["payload"].as_f64().unwrap();
    assert!((per["total"].as_f64().unwrap() - total).abs() < 1e-9);
    let plain: u64 = payloads
        .iter()
        .map(|(scenario, fields)| {
            let f = fields.as_object().unwrap();
            (scenario.len()
                + f.iter()
                    .map(|(k, v)| k.len() + v.as_str().unwrap().len())
                    .sum::<usize>()) as u64
        })
        .sum();
    let c = &stats["payload_compression"];
    assert_eq!(c["plain_bytes"], plain);
    let ratio = plain as f64 / c["record_bytes"].as_f64().unwrap();
    assert!((c["ratio"].as_f64().unwrap() - ratio).abs() < 1e-9);
    assert!(stats["wal_bytes"].is_u64() && stats["checkpoint_lsn"].as_u64().unwrap() >= 1);
    assert!(ok(&["stats", s(&bank)]).stdout.contains("WAL"));
    assert!(ok(&["stats", s(&bank), "--deep"]).stdout.contains("compression"));
    assert!(
        ok(&["stats", s(&bank), "--json"])
            .json()
            .get("payload_compression")
            .is_none(),
        "only with --deep"
    );
}

#[test]
fn stats_plot_draws_the_depth_histogram_of_every_tree() {
    let (dir, bank, _) = shaped_bank();
    let plot = dir.path().join("depth.svg");
    ok(&["stats", s(&bank), "--json", "--plot", s(&plot)]);
    let stats = ok(&["stats", s(&bank), "--json"]).json();
    let text = std::fs::read_to_string(&plot).unwrap();
    let svg = roxmltree::Document::parse(&text).expect("well-formed SVG");
    let mut drawn: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for panel in svg.descendants().filter(|n| n.attribute("class") == Some("panel")) {
        let bars: Vec<u64> = panel
            .descendants()
            .filter(|n| n.attribute("class") == Some("bar"))
            .map(|b| b.attribute("data-count").unwrap().parse().unwrap())
            .collect();
        drawn.insert(panel.attribute("data-tree").unwrap().to_string(), bars);
    }
    for t in stats["trees"].as_array().unwrap() {
        let want: Vec<u64> = t["depth_histogram"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_u64().unwrap())
            .collect();
        assert_eq!(drawn[t["name"].as_str().unwrap()], want);
    }
}

fn classes(node: &roxmltree::Node) -> BTreeSet<String> {
    node.attribute("class")
        .unwrap_or("")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

fn svg_nodes(text: &str) -> Vec<(u64, BTreeSet<String>, Vec<String>)> {
    let svg = roxmltree::Document::parse(text).expect("well-formed SVG");
    svg.descendants()
        .filter(|n| classes(n).contains("node"))
        .map(|n| {
            let id = n.attribute("id").unwrap().trim_start_matches("node-").parse().unwrap();
            let texts = n
                .descendants()
                .filter(|t| t.has_tag_name("text"))
                .map(|t| t.text().unwrap_or("").to_string())
                .collect();
            (id, classes(&n), texts)
        })
        .collect()
}

#[test]
fn svg_drawing_of_a_real_tree_has_one_element_per_node() {
    let (dir, bank) = bank(768, &[]);
    ok(&[
        "import",
        s(&bank),
        "--tree",
        "task",
        "--reference-json",
        s(&reference_fixture("sciworld_qwen3-8b_dev_task.json")),
    ]);
    let out = dir.path().join("task.svg");
    ok(&["draw", s(&bank), "--tree", "task", "--format", "svg", "--out", s(&out)]);
    let drawn = svg_nodes(&std::fs::read_to_string(&out).unwrap());
    let dumped = dump(&bank, &["--tree", "task"]);
    assert_eq!(drawn.len(), dumped.len(), "exactly one node element per node");
    for (id, class, _) in &drawn {
        let d = dumped.iter().find(|d| d["id"] == *id).expect("a drawn id is a bank id");
        assert_eq!(class.contains("root"), d["type"] == "ROOT", "node {id}");
        assert_eq!(class.contains("failure"), d["label"] == "FAILURE", "node {id}");
    }
}

/// The ids a text drawing shows, and the "+K not drawn" it gives each.
fn text_ids(text: &str) -> BTreeMap<u64, usize> {
    text.lines()
        .skip(1)
        .map(|line| {
            let at = line.find('#').expect("a node line has #id");
            let id: u64 = line[at + 1..].split(' ').next().unwrap().parse().unwrap();
            let hidden = line
                .rsplit_once("[+")
                .map_or(0, |(_, rest)| rest.split(' ').next().unwrap().parse().unwrap());
            (id, hidden)
        })
        .collect()
}

/// `draw --root`, `--depth` and `--max-nodes` against a model of the tree
/// built from `dump`'s parent links: the subtree and the top levels hold
/// exactly the model's nodes, a cut node counts its children, and a
/// drawing over the budget is refused with nothing written.
#[test]
fn a_drawing_can_be_narrowed_and_is_refused_over_its_budget() {
    let (dir, bank) = bank(768, &[]);
    let fixture = reference_fixture("sciworld_qwen3-8b_dev_task.json");
    ok(&["import", s(&bank), "--tree", "task", "--reference-json", s(&fixture)]);
    let nodes = dump(&bank, &["--tree", "task"]);
    let mut kids: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for n in &nodes {
        if let Some(p) = n["parent"].as_u64() {
            kids.entry(p).or_default().push(n["id"].as_u64().unwrap());
        }
    }
    let under = |top: u64| {
        let (mut all, mut todo) = (BTreeSet::new(), vec![top]);
        while let Some(n) = todo.pop() {
            all.insert(n);
            todo.extend(kids.get(&n).into_iter().flatten());
        }
        all
    };
    // The root with the most descendants, and a residual with children.
    let root = nodes
        .iter()
        .filter(|n| n["parent"].is_null())
        .map(|n| n["id"].as_u64().unwrap())
        .max_by_key(|&r| under(r).len())
        .unwrap();
    let inner = *kids[&root]
        .iter()
        .find(|k| kids.contains_key(k))
        .expect("a residual with children");
    assert!(under(root).len() > 2 && under(inner).len() >= 2 && under(inner).len() < under(root).len());

    let out = dir.path().join("sub.svg");
    let id = inner.to_string();
    ok(&[
        "draw",
        s(&bank),
        "--tree",
        "task",
        "--root",
        &id,
        "--format",
        "svg",
        "--out",
        s(&out),
    ]);
    let drawn: BTreeSet<u64> = svg_nodes(&std::fs::read_to_string(&out).unwrap())
        .into_iter()
        .map(|n| n.0)
        .collect();
    assert_eq!(drawn, under(inner), "the SVG holds the subtree, nothing else");

    let text = ok(&["draw", s(&bank), "--tree", "task", "--depth", "2"]).stdout;
    let want: BTreeMap<u64, usize> = nodes
        .iter()
        .filter(|n| n["depth"].as_u64().unwrap() <= 2)
        .map(|n| {
            let id = n["id"].as_u64().unwrap();
            let cut = if n["depth"] == 2 {
                kids.get(&id).map_or(0, Vec::len)
            } else {
                0
            };
            (id, cut)
        })
        .collect();
    assert_eq!(text_ids(&text), want, "{text}");
    let text = ok(&["draw", s(&bank), "--tree", "task", "--root", &id, "--depth", "1"]).stdout;
    assert_eq!(text_ids(&text), BTreeMap::from([(inner, kids[&inner].len())]), "{text}");

    let whole = nodes.len().to_string();
    let fewer = (nodes.len() - 1).to_string();
    let refused_out = dir.path().join("refused.svg");
    let run = deltamem(
        &[
            "draw",
            s(&bank),
            "--tree",
            "task",
            "--format",
            "svg",
            "--max-nodes",
            &fewer,
            "--out",
            s(&refused_out),
        ],
        "",
    );
    assert_ne!(run.code, 0);
    assert!(
        run.stderr.contains(&format!("would hold {whole} nodes")) && run.stderr.contains("--root"),
        "{}",
        run.stderr
    );
    assert!(!refused_out.exists(), "a refused drawing writes nothing");
    let text = ok(&["draw", s(&bank), "--tree", "task", "--max-nodes", &whole]).stdout;
    assert_eq!(text_ids(&text).len(), nodes.len());
    let wrong_tree = deltamem(&["draw", s(&bank), "--tree", "env", "--root", &id], "");
    assert!(
        wrong_tree.code != 0 && wrong_tree.stderr.contains("is in tree task, not env"),
        "{}",
        wrong_tree.stderr
    );
    // With --root given, the refusal does not suggest it again.
    let run = deltamem(
        &["draw", s(&bank), "--tree", "task", "--root", &id, "--max-nodes", "1"],
        "",
    );
    assert!(
        run.code != 0 && run.stderr.contains("--depth N") && !run.stderr.contains("--root ID"),
        "{}",
        run.stderr
    );
}

#[test]
fn pictures_escape_text_and_mark_failures_and_consolidation() {
    let (dir, bank, _) = shaped_bank();
    ok(&[
        "consolidate",
        s(&bank),
        "2",
        "--payload",
        r#"{"execution_procedure": "distilled"}"#,
    ]);
    let out = dir.path().join("t.svg");
    ok(&[
        "draw",
        s(&bank),
        "--tree",
        "task",
        "--format",
        "svg",
        "--out",
        s(&out),
        "--max-label",
        "12",
    ]);
    let drawn = svg_nodes(&std::fs::read_to_string(&out).unwrap());
    let by_id: BTreeMap<u64, (BTreeSet<String>, Vec<String>)> =
        drawn.into_iter().map(|(i, c, t)| (i, (c, t))).collect();
    assert_eq!(
        by_id.keys().copied().collect::<Vec<_>>(),
        vec![0, 1, 2, 4],
        "task nodes only"
    );
    assert!(by_id[&1].0.contains("failure"));
    assert!(by_id[&2].0.contains("consolidated"));
    assert!(by_id[&4].0.contains("consolidated-root") && by_id[&4].0.contains("root"));
    let label = &by_id[&0].1[1];
    assert!(label.starts_with("kettle <col"), "entities decode back: {label}");
    assert!(label.chars().count() <= 12, "{label}");
    assert!(
        by_id[&1].1[1].starts_with("no kettle a"),
        "control characters and newlines flattened"
    );

    let text = ok(&["draw", s(&bank), "--tree", "task"]).stdout;
    assert!(text.starts_with("task\n"), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.contains(" d=")).count(),
        4,
        "one text line per node: {text}"
    );
    let dot = ok(&["draw", s(&bank), "--tree", "task", "--format", "dot"]).stdout;
    let statements: Vec<&str> = dot
        .lines()
        .filter(|l| l.trim_start().starts_with('n') && l.contains(" [label="))
        .collect();
    assert_eq!(statements.len(), 4);
    assert_eq!(
        dot.lines().filter(|l| l.contains(" -> ")).count(),
        4,
        "one incoming edge per node"
    );
    let line = |id: u32| {
        statements
            .iter()
            .find(|l| l.trim_start().starts_with(&format!("n{id} ")))
            .unwrap()
            .to_string()
    };
    assert!(
        line(0).contains(r#"\"off\""#) || line(0).contains("kettle <cold>"),
        "{}",
        line(0)
    );
    assert!(line(1).contains("#c0392b"), "failure in red");
    assert!(line(2).contains("dashed"), "consolidated dashed");
    assert!(line(4).contains("peripheries=2"), "consolidated root double-bordered");
    assert!(line(0).contains("bold") && !line(1).contains("bold"), "roots bold");
}

#[test]
fn compact_keeps_every_node_and_answer() {
    let (dir, bank, _) = shaped_bank();
    let npy = dir.path().join("v.npy");
    write_npy(&npy, &random_rows(40, 4, 8), NpyElement::F32);
    ok(&["import", s(&bank), "--tree", "env", "--npy", s(&npy)]);
    ok(&[
        "consolidate",
        s(&bank),
        "2",
        "--payload",
        r#"{"execution_procedure": "distilled"}"#,
    ]);
    let before = dump(&bank, &["--embeddings"]);
    let queries = dir.path().join("q.npy");
    write_npy(&queries, &random_rows(10, 4, 9), NpyElement::F32);
    let answers = ok(&[
        "query",
        s(&bank),
        "--tree",
        "env",
        "--npy",
        s(&queries),
        "--k",
        "3",
        "--tau",
        "0",
    ])
    .stdout;
    let report = ok(&["compact", s(&bank)]).json();
    assert_eq!(report["nodes"], before.len());
    assert_eq!(dump(&bank, &["--embeddings"]), before);
    assert_eq!(
        ok(&[
            "query",
            s(&bank),
            "--tree",
            "env",
            "--npy",
            s(&queries),
            "--k",
            "3",
            "--tau",
            "0"
        ])
        .stdout,
        answers
    );
    assert_eq!(ok(&["verify", s(&bank), "--json"]).json()["ok"], true);
}

#[test]
fn verify_json_reports_each_problem_with_its_file() {
    let (_dir, bank, _) = shaped_bank();
    let good = ok(&["verify", s(&bank), "--json"]).json();
    assert_eq!(
        (good["ok"].as_bool(), good["nodes_checked"].as_u64()),
        (Some(true), Some(4))
    );
    let table = std::fs::read_dir(&bank)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("nodes-"))
        .expect("a node table segment");
    let mut bytes = std::fs::read(&table).unwrap();
    bytes[128 + 20] ^= 0x40; // node 1's retrievals: under its CRC
    std::fs::write(&table, bytes).unwrap();
    let run = fails(&["verify", s(&bank), "--json"], 1);
    let report = run.json();
    assert_eq!(report["ok"], false);
    let problems = report["problems"].as_array().unwrap();
    assert!(!problems.is_empty());
    let name = table.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        problems.iter().any(|p| p["file"].as_str().unwrap().contains(&name)),
        "{problems:?}"
    );
}

#[test]
fn progress_bars_never_reach_pipes_and_only_draw_on_a_terminal() {
    let (dir, bank) = bank(8, &[]);
    let npy = dir.path().join("v.npy");
    write_npy(&npy, &random_rows(3000, 8, 4), NpyElement::F32);
    let run = ok(&["import", s(&bank), "--tree", "task", "--npy", s(&npy), "--batch", "100"]);
    for (name, text) in [("stdout", &run.stdout), ("stderr", &run.stderr)] {
        assert!(
            !text.contains('\r') && !text.contains("\u{1b}["),
            "{name} got terminal codes"
        );
    }
    // Under a pseudo-terminal (util-linux `script`), the bar shows on
    // stderr unless --quiet.
    let has_script = std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_script {
        eprintln!("SKIPPED: `script` is not installed, the terminal case is not checked");
        return;
    }
    let on_tty = |extra: &str| {
        let cmd = format!(
            "{} dump {} --embeddings-npy {} {extra} > /dev/null",
            env!("CARGO_BIN_EXE_deltamem"),
            s(&bank),
            s(&dir.path().join("d.npy"))
        );
        let out = std::process::Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(on_tty("").contains("nodes"), "a bar on a terminal");
    assert!(!on_tty("--quiet").contains("nodes"), "no bar with --quiet");
}

#[test]
fn usage_errors_exit_2() {
    let (dir, bank) = bank(4, &[]);
    let npy = dir.path().join("v.npy");
    write_npy(&npy, &random_rows(2, 4, 1), NpyElement::F32);
    let cases: Vec<Vec<&str>> = vec![
        vec!["import", s(&bank), "--tree", "task"],
        vec![
            "import",
            s(&bank),
            "--tree",
            "task",
            "--npy",
            s(&npy),
            "--reference-json",
            s(&npy),
        ],
        vec!["import", s(&bank), "--tree", "task", "--npy", s(&npy), "--batch", "0"],
        vec![
            "import",
            s(&bank),
            "--tree",
            "task",
            "--reference-json",
            s(&npy),
            "--meta",
            s(&npy),
        ],
        vec![
            "import",
            s(&bank),
            "--tree",
            "task",
            "--reference-json",
            s(&npy),
            "--keep-going",
        ],
        vec!["query", s(&bank), "--npy", s(&npy)],
        vec!["query", s(&bank), "--tree", "task", "--npy", s(&npy), "--threads", "0"],
        vec!["export", s(&bank), "--tree", "task", "--format", "yaml"],
        vec!["draw", s(&bank), "--tree", "task", "--format", "png"],
        vec!["draw", s(&bank), "--tree", "task", "--max-label", "2"],
        vec!["freeze", s(&bank)],
    ];
    for args in cases {
        fails(&args, 2);
    }
    let missing = dir.path().join("missing");
    for args in [
        vec!["freeze", s(&missing), s(&bank)],
        vec!["compact", s(&missing)],
        vec!["draw", s(&missing), "--tree", "task"],
    ] {
        let run = fails(&args, 1);
        assert!(run.stderr.contains(s(&missing)), "{}", run.stderr);
    }
}

/// A bank of 4,000 rows of 64 floats (1 MB of vectors), imported.
fn bank_of_4000_rows(seed: u64) -> (tempfile::TempDir, std::path::PathBuf) {
    let (dir, bank) = bank(64, &[]);
    let npy = dir.path().join("v.npy");
    write_npy(&npy, &random_rows(4000, 64, seed), NpyElement::F32);
    ok(&["import", s(&bank), "--tree", "task", "--npy", s(&npy)]);
    (dir, bank)
}

/// `deltamem ARGS` with files capped at 256 KiB (SIGXFSZ ignored, so a
/// write past the cap fails as a full disk would make it fail).
fn under_file_limit(args: &[&str]) -> std::process::Output {
    std::process::Command::new("bash")
        .args([
            "-c",
            "trap '' XFSZ; ulimit -f 256; exec \"$0\" \"$@\"",
            env!("CARGO_BIN_EXE_deltamem"),
        ])
        .args(args)
        .stdout(std::process::Stdio::null())
        .output()
        .unwrap()
}

/// A write that fails part-way (here the file size limit, as a full disk
/// would) names the file the user asked for: an export said "export
/// output", and `dump --embeddings-npy` named its temporary sibling. No
/// temporary file is left.
#[test]
fn a_write_that_fails_part_way_names_the_file_asked_for() {
    let (dir, bank) = bank_of_4000_rows(6);
    let outs = dir.path().join("outs");
    std::fs::create_dir(&outs).unwrap();
    let out = outs.join("big.out");
    // 256 KiB per file: each output is several MB, past export's 1 MiB buffer.
    let cases: [&[&str]; 3] = [
        &[
            "export",
            s(&bank),
            "--tree",
            "task",
            "--format",
            "jsonl",
            "--out",
            s(&out),
        ],
        &[
            "export",
            s(&bank),
            "--tree",
            "task",
            "--format",
            "reference-json",
            "--out",
            s(&out),
        ],
        &["dump", s(&bank), "--tree", "task", "--embeddings-npy", s(&out)],
    ];
    for args in cases {
        let limited = under_file_limit(args);
        let stderr = String::from_utf8_lossy(&limited.stderr);
        assert_eq!(limited.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!("{}: cannot write", out.display())),
            "{args:?}: {stderr}"
        );
        assert!(
            !stderr.contains(".tmp-") && !stderr.contains("export output"),
            "{args:?}: {stderr}"
        );
        assert_eq!(
            std::fs::read_dir(&outs).unwrap().count(),
            0,
            "{args:?}: a file was left"
        );
    }
}

/// A freeze that fails part-way (here the file size limit, as a full disk
/// would) removes its work directory `OUT.freezing`: it was left holding
/// what it had copied until the next freeze to the same OUT. A freeze to
/// the same OUT afterwards succeeds.
#[test]
fn a_failed_freeze_leaves_no_work_directory() {
    let (dir, bank) = bank_of_4000_rows(5);
    let out = dir.path().join("frozen");
    // The vectors (1 MB) cannot be written.
    let limited = under_file_limit(&["freeze", s(&bank), s(&out)]);
    let stderr = String::from_utf8_lossy(&limited.stderr);
    assert_eq!(limited.status.code(), Some(1), "{stderr}");
    assert!(!out.exists(), "{stderr}");
    let work = dir.path().join("frozen.freezing");
    assert!(!work.exists(), "the work directory was left: {stderr}");
    ok(&["freeze", s(&bank), s(&out)]);
    assert_eq!(ok(&["stats", s(&out), "--json"]).json()["nodes"], 4000);
}

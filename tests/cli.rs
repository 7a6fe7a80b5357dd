//! End-to-end tests of the `deltamem` binary: each runs the real program
//! in a temporary directory, feeds stdin and checks the JSON it prints
//! against values worked out here.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use serde_json::{Value, json};

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn lines(&self) -> Vec<Value> {
        self.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }
}

fn deltamem(args: &[&str], stdin: &str) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_deltamem"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn deltamem");
    // Fed from a thread so a large output cannot block the input, and
    // ignoring errors: a command may exit without reading stdin at all.
    let mut input = child.stdin.take().unwrap();
    let text = stdin.to_string();
    std::thread::spawn(move || input.write_all(text.as_bytes()));
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code().expect("exited normally"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

fn ok(args: &[&str], stdin: &str) -> Run {
    let run = deltamem(args, stdin);
    assert_eq!(run.code, 0, "{args:?} failed: {}", run.stderr);
    run
}

/// A fresh bank; returns the temp dir (kept alive) and the bank path.
fn bank(extra: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bank");
    let mut args = vec!["init", path.to_str().unwrap(), "--dim", "4"];
    args.extend_from_slice(extra);
    ok(&args, "");
    (dir, path)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn node(tree: &str, attach: Value, label: &str, scenario: &str, embedding: &[f32]) -> String {
    json!({"tree": tree, "attach": attach, "label": label, "scenario": scenario,
           "payload": {"execution_procedure": format!("do {scenario}")},
           "embedding": embedding})
    .to_string()
}

fn task(attach: Value, scenario: &str, embedding: &[f32]) -> String {
    node("task", attach, "SUCCESS", scenario, embedding)
}

fn insert(bank: &Path, lines: &[String]) -> Vec<Value> {
    ok(&["insert", s(bank)], &(lines.join("\n") + "\n")).lines()
}

/// Starts `deltamem insert` with stdin held open. Acks arrive on the
/// channel as they are printed, so a test can wait for one with a timeout.
fn start_insert(bank: &Path, sync: &str) -> (Child, ChildStdin, Receiver<Value>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_deltamem"))
        .args(["insert", s(bank), "--sync", sync])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let reader = BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in reader.lines().map_while(Result::ok) {
            let _ = tx.send(serde_json::from_str(&line).unwrap_or(Value::Null));
        }
    });
    (child, stdin, rx)
}

fn send(mut stdin: &ChildStdin, line: &str) {
    writeln!(stdin, "{line}").unwrap();
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x * y)).sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(x * x)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

fn close_to(v: &Value, expected: f64) -> bool {
    v.as_f64().is_some_and(|x| (x - expected).abs() < 1e-5)
}

fn pluck(items: &[Value], key: &str) -> Vec<Value> {
    items.iter().map(|v| v[key].clone()).collect()
}

fn ids(matches: &Value) -> Vec<u64> {
    let list = matches["matches"].as_array().expect("matches array");
    list.iter().map(|m| m["id"].as_u64().unwrap()).collect()
}

#[test]
fn init_defaults_and_custom_trees() {
    let dir = tempfile::tempdir().unwrap();
    let default = dir.path().join("default");
    let out = &ok(&["init", s(&default), "--dim", "4"], "").lines()[0];
    let lib = deltamem::BankConfig::new(4);
    assert_eq!(out["dim"], 4);
    let trees = out["trees"].as_array().unwrap();
    assert_eq!(trees.len(), lib.trees.len());
    for (got, want) in trees.iter().zip(&lib.trees) {
        assert_eq!(got["name"], want.name.as_str());
        assert!(close_to(&got["tau"], f64::from(want.tau)));
    }
    assert!(close_to(&out["eps"], f64::from(lib.eps)));
    assert_eq!(out["max_depth"], lib.max_depth);
    assert_eq!(out["consolidate_after"], lib.consolidate_after);

    let custom = dir.path().join("custom");
    let line = format!(
        "init {} --dim 8 --tree insights:tau=0.5 --tree raw --eps 0.1 --max-depth 3 \
         --consolidate-after 2",
        s(&custom)
    );
    let args: Vec<&str> = line.split_whitespace().collect();
    ok(&args, "");
    // Read back from disk through another command, not from init's echo.
    let stats = &ok(&["stats", s(&custom), "--json"], "").lines()[0];
    let names = pluck(stats["trees"].as_array().unwrap(), "name");
    assert_eq!(names, ["insights", "raw"]);
    assert!(close_to(&stats["trees"][0]["tau"], 0.5));
    assert!(close_to(&stats["trees"][1]["tau"], 0.82));
    assert_eq!((stats["dim"].as_u64(), stats["max_depth"].as_u64()), (Some(8), Some(3)));
    assert!(close_to(&stats["eps"], 0.1));
    assert_eq!(stats["consolidate_after"], 2);
    // A second init on the same directory is refused.
    assert_eq!(deltamem(&args, "").code, 1);
}

#[test]
fn insert_acks_for_auto_root_and_parent() {
    let (_dir, b) = bank(&[]);
    let v0 = [1.0, 0.0, 0.0, 0.0];
    let v1 = [1.0, 0.5, 0.0, 0.0];
    let lines = [
        task(json!("auto"), "first", &v0),
        task(json!("auto"), "close to first", &v1),
        json!({"tree": "task", "attach": "root", "label": "FAILURE", "scenario": "forced root",
               "payload": {}, "embedding": v0, "id": "ext-3"})
        .to_string(),
        task(json!({"parent": "ext-3"}), "under ext-3", &[0.0, 0.0, 1.0, 0.0]),
        task(json!({"parent": 3}), "under 3", &[0.0, 0.0, 0.0, 1.0]),
    ];
    let acks = insert(&b, &lines);
    assert_eq!(acks.len(), 5);
    assert_eq!(pluck(&acks, "id"), [0, 1, 2, 3, 4]);
    assert_eq!(
        (acks[0]["type"].as_str(), acks[0]["depth"].as_u64()),
        (Some("ROOT"), Some(1))
    );
    assert!(acks[0]["parent"].is_null() && acks[0]["match"].is_null());
    assert_eq!(acks[1]["type"], "RESIDUAL");
    assert_eq!(
        (acks[1]["parent"].as_u64(), acks[1]["depth"].as_u64()),
        (Some(0), Some(2))
    );
    assert_eq!(acks[1]["match"]["id"], 0);
    assert!(close_to(&acks[1]["match"]["score"], cosine(&v0, &v1)));
    // Root attach never scans, even though v0 would match node 0 exactly.
    assert!(acks[2]["match"].is_null() && acks[2]["parent"].is_null());
    assert_eq!(acks[2]["external_id"], "ext-3");
    assert!(acks[0].get("external_id").is_none());
    assert_eq!(
        (acks[3]["parent"].as_u64(), acks[3]["depth"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(
        (acks[4]["parent"].as_u64(), acks[4]["depth"].as_u64()),
        (Some(3), Some(3))
    );
    assert!(acks.iter().all(|a| a["tree"] == "task"));
}

#[test]
fn batch_and_none_ack_every_line_in_order() {
    for sync in ["batch", "none", "always"] {
        let (_dir, b) = bank(&[]);
        let count = 40;
        let lines: Vec<String> = (0..count)
            .map(|i| task(json!("root"), &format!("n{i}"), &[1.0, i as f32, 0.0, 0.0]))
            .collect();
        let run = ok(&["insert", s(&b), "--sync", sync], &lines.join("\n"));
        let acks = run.lines();
        assert_eq!(pluck(&acks, "id"), (0..count).collect::<Vec<_>>(), "sync {sync}");
        let dumped = ok(&["dump", s(&b)], "").lines();
        assert_eq!(dumped.len(), count, "sync {sync}");
        assert_eq!(dumped[7]["scenario"], "n7");
    }
}

/// The checkpoint at the end of `insert` fails (a directory in the way of
/// MANIFEST.tmp) after every line was made durable: the acks are printed
/// and the exit status is 3, "saved, do not repeat". It was 1, and a
/// caller that retries on failure stored every line twice.
#[test]
fn insert_saved_before_a_failed_checkpoint_exits_3_with_every_ack() {
    for sync in ["always", "batch", "none"] {
        let (_dir, b) = bank(&[]);
        let blocker = b.join("MANIFEST.tmp");
        std::fs::create_dir_all(blocker.join("in-the-way")).unwrap();
        let lines: Vec<String> = (0..5)
            .map(|i| task(json!("root"), &format!("n{i}"), &[1.0, i as f32, 0.0, 0.0]))
            .collect();
        let run = deltamem(&["insert", s(&b), "--sync", sync], &lines.join("\n"));
        assert_eq!(run.code, 3, "sync {sync}: {}", run.stderr);
        assert!(run.stderr.contains("do not repeat"), "{}", run.stderr);
        assert_eq!(pluck(&run.lines(), "id"), (0..5).collect::<Vec<_>>(), "sync {sync}");
        std::fs::remove_dir_all(&blocker).unwrap();
        assert_eq!(ok(&["dump", s(&b)], "").lines().len(), 5, "sync {sync}");
    }
}

/// A bank file replaced by a FIFO is refused by name: opening it to read
/// waited for a writer forever, and every command hung.
#[test]
fn a_fifo_in_place_of_a_bank_file_is_refused_not_waited_on() {
    for file in ["nodes-000000.seg", "wal.log", "MANIFEST", "payloads.log"] {
        let (_dir, b) = bank(&[]);
        insert(&b, &[task(json!("root"), "a", &[1.0, 0.0, 0.0, 0.0])]);
        std::fs::remove_file(b.join(file)).unwrap();
        let made = Command::new("mkfifo").arg(b.join(file)).status().unwrap();
        assert!(made.success());
        for command in ["verify", "dump"] {
            let mut child = Command::new(env!("CARGO_BIN_EXE_deltamem"))
                .args([command, s(&b)])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let started = std::time::Instant::now();
            while child.try_wait().unwrap().is_none() {
                if started.elapsed() > std::time::Duration::from_secs(20) {
                    child.kill().unwrap();
                    panic!("{command} waits on a FIFO at {file}");
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let out = child.wait_with_output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{command} with a FIFO at {file}");
            assert!(
                stderr.contains(file) && stderr.contains("not a regular file"),
                "{command}, {file}: {stderr}"
            );
        }
    }
}

/// A read-only command's output file inside the bank directory is refused
/// before anything is written: `dump --embeddings-npy BANK/MANIFEST` left
/// a bank that no longer opened.
#[test]
fn an_output_file_inside_the_bank_is_refused() {
    let (_dir, b) = bank(&[]);
    insert(&b, &[task(json!("root"), "a", &[1.0, 0.0, 0.0, 0.0])]);
    let before: Vec<(String, Vec<u8>)> = ["MANIFEST", "wal.log"]
        .iter()
        .map(|f| (f.to_string(), std::fs::read(b.join(f)).unwrap()))
        .collect();
    let through_parent = b.join("..").join("bank").join("MANIFEST");
    let link = b.parent().unwrap().join("manifest-link");
    std::os::unix::fs::symlink(b.join("MANIFEST"), &link).unwrap();
    let cases: [Vec<&str>; 6] = [
        vec!["dump", s(&b), "--embeddings-npy", s(&through_parent)],
        vec!["stats", s(&b), "--plot", s(&through_parent)],
        vec!["draw", s(&b), "--tree", "task", "--out", "MANIFEST"],
        vec![
            "export",
            s(&b),
            "--tree",
            "task",
            "--format",
            "jsonl",
            "--out",
            "wal.log",
        ],
        vec!["dump", s(&b), "--embeddings-npy", "new.npy"],
        // A link from elsewhere to one of the bank's files.
        vec![
            "export",
            s(&b),
            "--tree",
            "task",
            "--format",
            "jsonl",
            "--out",
            s(&link),
        ],
    ];
    for args in cases {
        // Relative names are resolved from the bank directory itself.
        let out = Command::new(env!("CARGO_BIN_EXE_deltamem"))
            .args(&args)
            .current_dir(&b)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("is inside the bank directory"),
            "{args:?}: {stderr}"
        );
    }
    for (file, bytes) in before {
        assert_eq!(std::fs::read(b.join(&file)).unwrap(), bytes, "{file} changed");
    }
    assert!(!b.join("new.npy").exists());
    ok(&["verify", s(&b)], "");
}

/// An output file that cannot be written is named as the user gave it, not
/// by the temporary sibling it is written through (`.NAME.tmp-PID`).
#[test]
fn an_unwritable_output_file_is_named_as_given() {
    let (dir, b) = bank(&[]);
    insert(&b, &[task(json!("root"), "a", &[1.0, 0.0, 0.0, 0.0])]);
    let out = dir.path().join("no-such-dir").join("out.file");
    let cases: [Vec<&str>; 3] = [
        vec!["export", s(&b), "--tree", "task", "--format", "jsonl", "--out", s(&out)],
        vec!["draw", s(&b), "--tree", "task", "--out", s(&out)],
        vec!["stats", s(&b), "--plot", s(&out)],
    ];
    for args in cases {
        let run = Command::new(env!("CARGO_BIN_EXE_deltamem"))
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success(), "{args:?}");
        assert!(
            stderr.contains(&format!("{}: cannot create", out.display())) && !stderr.contains(".tmp-"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn batch_acks_arrive_while_stdin_is_idle() {
    let (_dir, b) = bank(&[]);
    let (mut child, stdin, acks) = start_insert(&b, "batch");
    for i in 0..3 {
        send(
            &stdin,
            &task(json!("root"), &format!("n{i}"), &[1.0, i as f32, 0.0, 0.0]),
        );
    }
    // No more input and no EOF: only the 100 ms batch timer can release them.
    for i in 0..3 {
        let ack = acks.recv_timeout(Duration::from_secs(10)).expect("ack while idle");
        assert_eq!(ack["id"], i);
    }
    drop(stdin);
    assert!(child.wait().unwrap().success());
    assert!(acks.recv_timeout(Duration::from_secs(1)).is_err(), "one ack per line");
}

#[test]
fn query_honours_k_tau_and_depth_ties() {
    let (_dir, b) = bank(&[]);
    let v = [1.0, 0.0, 0.0, 0.0];
    let u = [1.0, 1.0, 0.0, 0.0];
    insert(
        &b,
        &[
            task(json!("root"), "other", &[0.0, 0.0, 1.0, 0.0]),
            task(json!({"parent": 0}), "deep twin", &v),
            task(json!("root"), "shallow twin", &v),
            task(json!("root"), "diagonal", &u),
        ],
    );
    let q = |extra: Value| {
        let mut line = json!({"tree": "task", "embedding": v});
        line.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        line.to_string()
    };
    let input = [q(json!({"k": 5})), q(json!({"k": 5, "tau": 0.7})), q(json!({}))].join("\n");
    let answers = ok(&["query", s(&b)], &input).lines();
    // Equal scores: the shallower node wins although it is younger.
    assert_eq!(ids(&answers[0]), [2, 1]);
    assert_eq!(answers[0]["matches"][1]["chain"], json!([0, 1]));
    assert_eq!(answers[0]["matches"][0]["depth"], 1);
    assert_eq!(ids(&answers[1]), [2, 1, 3]);
    assert!(close_to(&answers[1]["matches"][2]["score"], cosine(&v, &u)));
    assert_eq!(ids(&answers[2]), [2], "default k is 1");
    let flag_k = ok(&["query", s(&b), "--k", "2"], &q(json!({"tau": 0.0}))).lines();
    assert_eq!(ids(&flag_k[0]), [2, 1]);
}

#[test]
fn dump_fields_filter_and_embeddings() {
    let (_dir, b) = bank(&[]);
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let e = [3.0, 4.0, 0.0, 0.0];
    insert(
        &b,
        &[
            task(json!("auto"), "t0", &e),
            node("env", json!("auto"), "SUCCESS", "e1", &[0.0, 1.0, 0.0, 0.0]),
            json!({"tree": "task", "attach": {"parent": 0}, "label": "FAILURE", "scenario": "t2",
               "payload": {"failure_reason": "too hot"}, "embedding": e, "id": "x-2"})
            .to_string(),
        ],
    );
    let all = ok(&["dump", s(&b)], "").lines();
    assert_eq!(all.len(), 3);
    let mut n = all[2].clone();
    let created = n.as_object_mut().unwrap().remove("created_unix_ms");
    let created = created.and_then(|c| c.as_u64()).expect("created_unix_ms");
    assert!(created >= before && created < before + 60_000);
    let expected = json!({"id": 2, "tree": "task", "type": "RESIDUAL", "label": "FAILURE",
        "parent": 0, "depth": 2, "success_hits": 0, "retrievals": 0, "consolidated": false,
        "consolidated_root": false, "scenario": "t2", "payload": {"failure_reason": "too hot"},
        "external_id": "x-2"});
    assert_eq!(n, expected);
    assert!(all[0].get("external_id").is_none() && all[0].get("link").is_none());

    let env = ok(&["dump", s(&b), "--tree", "env"], "").lines();
    assert_eq!(env.len(), 1);
    assert_eq!(
        (env[0]["id"].as_u64(), env[0]["scenario"].as_str()),
        (Some(1), Some("e1"))
    );
    let with = ok(&["dump", s(&b), "--tree", "task", "--embeddings"], "").lines();
    assert_eq!(with.len(), 2);
    let stored: Vec<f64> = with[0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let expected = [0.6, 0.8, 0.0, 0.0]; // (3, 4) / 5
    assert!(
        stored.iter().zip(expected).all(|(a, b)| (a - b).abs() < 1e-6),
        "{stored:?}"
    );
    assert_eq!(deltamem(&["dump", s(&b), "--tree", "nope"], "").code, 1);
}

#[test]
fn chain_json_and_render() {
    let (_dir, b) = bank(&[]);
    insert(
        &b,
        &[
            task(json!("root"), "boil water", &[1.0, 0.0, 0.0, 0.0]),
            task(json!({"parent": 0}), "boil water faster", &[1.0, 0.1, 0.0, 0.0]),
        ],
    );
    let out = &ok(&["chain", s(&b), "1"], "").lines()[0];
    assert_eq!(out["chain"], json!([0, 1]));
    assert_eq!(out["nodes"][0]["scenario"], "boil water");
    assert_eq!(out["nodes"][1]["type"], "RESIDUAL");
    assert_eq!(
        out["nodes"][1]["payload"]["execution_procedure"],
        "do boil water faster"
    );
    let text = ok(&["chain", s(&b), "1", "--render"], "").stdout;
    let base = text.find("[Base Skill]").expect("base title");
    let patch = text.find("[Skill Patch 1]").expect("patch title");
    assert!(base < patch && text.contains("do boil water faster"), "{text}");
    let missing = deltamem(&["chain", s(&b), "7"], "");
    assert_eq!(missing.code, 1);
    assert!(missing.stderr.contains('7'), "{}", missing.stderr);
}

#[test]
fn hit_due_consolidate_then_query_skips_source() {
    let (_dir, b) = bank(&["--consolidate-after", "2"]);
    let leaf = [0.0, 1.0, 0.0, 0.0];
    insert(
        &b,
        &[
            task(json!("root"), "base", &[1.0, 0.0, 0.0, 0.0]),
            task(json!({"parent": 0}), "leaf", &leaf),
        ],
    );
    let first = &ok(&["hit", s(&b), "1"], "").lines()[0];
    assert_eq!(*first, json!({"id": 1, "success_hits": 1, "due": false}));
    assert!(ok(&["due", s(&b)], "").stdout.is_empty());
    let second = &ok(&["hit", s(&b), "1"], "").lines()[0];
    assert_eq!(
        (second["success_hits"].as_u64(), second["due"].as_bool()),
        (Some(2), Some(true))
    );
    let due = ok(&["due", s(&b)], "").lines();
    assert_eq!(
        due,
        [json!({"id": 1, "tree": "task", "success_hits": 2, "chain": [0, 1]})]
    );
    assert!(ok(&["due", s(&b), "--tree", "env"], "").stdout.is_empty());

    let payload = r#"{"execution_procedure":"everything at once"}"#;
    let done = &ok(&["consolidate", s(&b), "1", "--payload", payload], "").lines()[0];
    assert_eq!(*done, json!({"source": 1, "new_root": 2}));
    let query = json!({"tree": "task", "embedding": leaf, "k": 5}).to_string();
    let answer = &ok(&["query", s(&b)], &query).lines()[0];
    assert_eq!(ids(answer), [2], "the distilled root replaces its source");
    assert!(close_to(&answer["matches"][0]["score"], 1.0));
    let all = &ok(&["query", s(&b), "--include-consolidated"], &query).lines()[0];
    assert!(ids(all).contains(&1));
    let root = &ok(&["dump", s(&b)], "").lines()[2];
    assert_eq!(
        (root["consolidated_root"].as_bool(), root["link"].as_u64()),
        (Some(true), Some(1))
    );
    assert_eq!(root["payload"]["execution_procedure"], "everything at once");
    assert!(ok(&["due", s(&b)], "").stdout.is_empty());

    let again = deltamem(&["consolidate", s(&b), "1", "--payload", payload], "");
    assert_eq!(again.code, 1);
    assert!(again.stderr.contains("already consolidated"), "{}", again.stderr);
    assert_eq!(ok(&["dump", s(&b)], "").lines().len(), 3, "no second root");
}

#[test]
fn malformed_middle_line_is_reported_and_skipped() {
    let (_dir, b) = bank(&[]);
    let input = [
        task(json!("root"), "one", &[1.0, 0.0, 0.0, 0.0]),
        r#"{"tree": "task", "attach": "root", oops"#.to_string(),
        task(json!("root"), "three", &[0.0, 1.0, 0.0, 0.0]),
    ]
    .join("\n");
    let run = deltamem(&["insert", s(&b)], &input);
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("line 2"), "{}", run.stderr);
    assert!(!run.stderr.contains("line 1") && !run.stderr.contains("line 3"));
    // One output line per input line: the bad one gets an error line.
    let lines = run.lines();
    assert_eq!(lines.len(), 3);
    assert_eq!((lines[0]["id"].clone(), lines[2]["id"].clone()), (json!(0), json!(1)));
    assert_eq!(lines[1]["line"], 2);
    assert!(
        lines[1]["error"].as_str().unwrap().contains("malformed JSON"),
        "{}",
        lines[1]
    );
    let scenarios = pluck(&ok(&["dump", s(&b)], "").lines(), "scenario");
    assert_eq!(scenarios, ["one", "three"]);
}

#[test]
fn bad_lines_name_line_and_problem() {
    let (_dir, b) = bank(&[]);
    let good = [1.0, 0.0, 0.0, 0.0];
    let input = [
        task(json!("root"), "short", &[1.0, 0.0, 0.0]),
        node("nope", json!("root"), "SUCCESS", "x", &good),
        task(json!({"parent": 9}), "orphan", &good),
        task(json!("root"), "", &good),
        node("task", json!("root"), "MAYBE", "x", &good),
        r#"{"tree":"task","attach":"root","label":"SUCCESS","scenario":"x","payload":{"a":1},"embedding":[1,0,0,0]}"#
            .into(),
        r#"{"tree":"task","attach":"root","label":"SUCCESS","scenario":"x","payload":{},"embedding":[NaN,0,0,0]}"#
            .into(),
        task(json!("root"), "zero", &[0.0; 4]),
    ];
    let run = deltamem(&["insert", s(&b)], &input.join("\n"));
    assert_eq!(run.code, 1);
    let err = &run.stderr;
    let expect = [
        (1, "3 dimensions"),
        (2, "unknown tree"),
        (3, "unknown node"),
        (4, "scenario"),
        (5, "label"),
        (6, "payload"),
        (7, "NaN"),
        (8, "norm"),
    ];
    for (line, words) in expect {
        let found = err.lines().find(|l| l.contains(&format!("line {line}:")));
        let text = found.unwrap_or_else(|| panic!("no error for line {line}: {err}"));
        assert!(text.contains(words), "line {line}: {text}");
    }
    // Each bad line has its error line on stdout too, in order.
    let lines = run.lines();
    assert_eq!(lines.len(), expect.len());
    for (out, (line, words)) in lines.iter().zip(expect) {
        assert_eq!(out["line"], line);
        assert!(out["error"].as_str().unwrap().contains(words), "{out}");
    }
    assert!(ok(&["dump", s(&b)], "").stdout.is_empty());
}

#[test]
fn second_writer_is_refused_while_first_runs() {
    let (_dir, b) = bank(&[]);
    let (mut first, stdin, acks) = start_insert(&b, "always");
    send(&stdin, &task(json!("root"), "held", &[1.0, 0.0, 0.0, 0.0]));
    let ack = acks.recv_timeout(Duration::from_secs(10)).expect("an ack");
    assert_eq!(ack["id"], 0);

    let other = task(json!("root"), "other", &[0.0, 1.0, 0.0, 0.0]);
    let second = deltamem(&["insert", s(&b), "--lock-wait-ms", "300"], &other);
    assert_eq!(second.code, 1);
    let refusal = &second.stderr;
    assert!(
        refusal.contains("locked by another process") && refusal.contains("gave up after waiting"),
        "{refusal}"
    );
    // Readers take no lock and already see the acknowledged node.
    assert_eq!(ok(&["dump", s(&b)], "").lines().len(), 1);

    drop(stdin);
    assert!(first.wait().unwrap().success());
    let nodes = ok(&["dump", s(&b)], "").lines();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0]["scenario"], "held");
}

/// A write command waits (bounded) for a writer lock another process
/// holds briefly, as `deltamem mcp` processes do, instead of failing.
#[test]
fn a_writer_waits_for_the_lock_to_be_released() {
    let (_dir, b) = bank(&[]);
    let (mut first, stdin, acks) = start_insert(&b, "always");
    send(&stdin, &task(json!("root"), "held", &[1.0, 0.0, 0.0, 0.0]));
    acks.recv_timeout(Duration::from_secs(10)).expect("an ack");
    let path = b.clone();
    let second = std::thread::spawn(move || deltamem(&["hit", s(&path), "0"], ""));
    // The second command is waiting by now; the first one exits.
    std::thread::sleep(Duration::from_millis(700));
    drop(stdin);
    assert!(first.wait().unwrap().success());
    let second = second.join().unwrap();
    assert_eq!(second.code, 0, "{}", second.stderr);
    assert_eq!(ok(&["dump", s(&b)], "").lines()[0]["success_hits"], 1);
}

#[test]
fn serve_says_it_waits_for_a_held_lock_then_starts() {
    let (_dir, b) = bank(&[]);
    let (mut first, stdin, acks) = start_insert(&b, "always");
    send(&stdin, &task(json!("root"), "held", &[1.0, 0.0, 0.0, 0.0]));
    acks.recv_timeout(Duration::from_secs(10)).expect("an ack");
    let mut server = Command::new(env!("CARGO_BIN_EXE_deltamem"))
        .args(["serve", s(&b), "--listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
    // Without the notice the first line would come after the 10 s wait,
    // and be the lock error.
    let waiting = lines.next().unwrap().unwrap();
    assert!(
        waiting.contains("is locked by another writer; waiting up to 10000 ms for it"),
        "{waiting}"
    );
    drop(stdin);
    assert!(first.wait().unwrap().success());
    let serving = lines.next().unwrap().unwrap();
    assert!(
        serving.contains("serving") && serving.contains("on http://127.0.0.1:"),
        "{serving}"
    );
    let pid = server.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    assert!(server.wait().unwrap().success());
    assert_eq!(ok(&["dump", s(&b)], "").lines().len(), 1);
}

#[test]
fn verify_passes_then_reports_a_flipped_byte() {
    let (_dir, b) = bank(&[]);
    insert(
        &b,
        &[
            task(json!("root"), "a", &[1.0, 0.0, 0.0, 0.0]),
            task(json!("root"), "b", &[0.0, 1.0, 0.0, 0.0]),
        ],
    );
    let good = ok(&["verify", s(&b)], "");
    assert!(good.stdout.starts_with("ok: 2 nodes"), "{}", good.stdout);

    // insert closed the bank, so both rows are in the checkpointed table.
    let row_bytes = 128u64;
    let flip_at = row_bytes + 20; // inside row 1
    let seg = b.join("nodes-000000.seg");
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[flip_at as usize] ^= 0x01;
    std::fs::write(&seg, bytes).unwrap();

    let bad = deltamem(&["verify", s(&b)], "");
    assert_eq!(bad.code, 1);
    let line = bad
        .stderr
        .lines()
        .find(|l| l.contains("nodes-000000.seg @ "))
        .unwrap_or_else(|| panic!("{}", bad.stderr));
    let offset: u64 = line
        .split(" @ ")
        .nth(1)
        .and_then(|r| r.split(':').next())
        .and_then(|o| o.parse().ok())
        .unwrap();
    assert!((row_bytes..2 * row_bytes).contains(&offset), "{line}");
}

#[test]
fn demo_runs_and_consolidates() {
    let run = ok(&["demo", "--toy"], "");
    assert!(run.stdout.contains("consolidation"), "{}", run.stdout);
    assert!(run.stdout.contains("toy embedder"));
    assert!(run.stdout.contains("└─"));
    let header = run.stdout.lines().next().unwrap();
    let temp = header.rsplit("bank in ").next().unwrap();
    assert!(!Path::new(temp).exists(), "temporary bank {temp} left behind");

    let dir = tempfile::tempdir().unwrap();
    let kept = dir.path().join("demo");
    ok(&["demo", s(&kept), "--quiet", "--toy"], "");
    let checked = ok(&["verify", s(&kept)], "");
    assert!(checked.stdout.starts_with("ok: "));
    let consolidated = ok(&["dump", s(&kept)], "")
        .lines()
        .iter()
        .filter(|n| n["consolidated_root"] == true)
        .count();
    assert!(consolidated >= 1);
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(deltamem(&["init"], "").code, 2);
    assert_eq!(deltamem(&["frobnicate"], "").code, 2);
    assert_eq!(deltamem(&["insert", "x", "--sync", "sometimes"], "").code, 2);
    assert_eq!(
        deltamem(&["init", "x", "--dim", "4", "--tree", "t:tau=hot"], "").code,
        2
    );
    let missing = deltamem(&["dump", "/nonexistent/deltamem-bank"], "");
    assert_eq!(missing.code, 1);
    assert!(missing.stderr.starts_with("deltamem: "), "{}", missing.stderr);
}

#[test]
fn every_precision_answers_like_f32() {
    let vectors: [[f32; 4]; 4] = [
        [1.0, 0.1, 0.0, 0.0],
        [0.9, 0.3, 0.1, 0.0],
        [0.0, 1.0, 0.2, 0.0],
        [0.5, 0.5, 0.5, 0.5],
    ];
    let lines: Vec<String> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| task(json!("root"), &format!("s{i}"), v))
        .collect();
    let query = json!({"tree": "task", "embedding": [1.0, 0.2, 0.05, 0.0], "k": 4, "tau": -1.0}).to_string();
    let mut answers = Vec::new();
    // Bytes per node at dim 4: one 64-byte row; int8 adds its side column.
    for (precision, row_bytes) in [("f32", 64.0), ("f16", 64.0), ("int8", 128.0)] {
        let (_dir, path) = bank(&["--precision", precision]);
        insert(&path, &lines);
        let out = ok(&["query", s(&path)], &query);
        answers.push(ids(&serde_json::from_str::<Value>(out.stdout.trim()).unwrap()));
        ok(&["verify", s(&path)], "");
        let stats: Value = serde_json::from_str(ok(&["stats", s(&path), "--json"], "").stdout.trim()).unwrap();
        let vector_bytes = stats["bytes_per_node"]["vectors"].as_f64().unwrap();
        assert_eq!(vector_bytes, row_bytes, "{precision}");
        assert_eq!(stats["precision"], precision);
        assert!(
            ok(&["stats", s(&path)], "")
                .stdout
                .contains(&format!("dimensions ({precision})"))
        );
    }
    // The ranking is clear-cut here (gaps far above the f16 bound).
    assert_eq!(answers[0], vec![0, 1, 3, 2]);
    assert_eq!(answers[1], answers[0]);
    assert_eq!(answers[2], answers[0]);
}

/// `stats` names the scan kernel in use: the best this CPU runs, or the
/// level `DELTAMEM_KERNEL` forces; and the approximate first pass of wide
/// batches, which the portable level lacks and the AVX2 level runs in
/// 16-bit integers unless `DELTAMEM_FIXED16=off`.
#[test]
fn stats_names_the_scan_kernel() {
    let (_dir, path) = bank(&[]);
    let stats_with = |env: &[(&str, &str)]| -> Value {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_deltamem"));
        cmd.args(["stats", s(&path), "--json"]);
        cmd.env_remove("DELTAMEM_KERNEL").env_remove("DELTAMEM_FIXED16");
        cmd.envs(env.iter().copied());
        let out = cmd.output().unwrap();
        assert!(out.status.success());
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let kernel_of = |forced: Option<&str>| -> Value {
        let env: Vec<(&str, &str)> = forced.map(|level| ("DELTAMEM_KERNEL", level)).into_iter().collect();
        stats_with(&env)["kernel"].clone()
    };
    let best = deltamem::bank::kernels::Level::all_supported().last().unwrap().name();
    assert_eq!(kernel_of(None), best);
    assert_eq!(kernel_of(Some("portable")), "portable");
    assert_eq!(
        stats_with(&[("DELTAMEM_KERNEL", "portable")])["first_pass"],
        Value::Null
    );
    if deltamem::bank::kernels::Level::Avx2.is_supported() {
        let avx2 = stats_with(&[("DELTAMEM_KERNEL", "avx2")]);
        assert_eq!(
            (&avx2["kernel"], &avx2["first_pass"]),
            (&json!("avx2"), &json!("16-bit integer"))
        );
        let off = stats_with(&[("DELTAMEM_KERNEL", "avx2"), ("DELTAMEM_FIXED16", "off")]);
        assert_eq!(off["first_pass"], Value::Null);
    }
    assert!(
        ok(&["stats", s(&path)], "")
            .stdout
            .contains(&format!("scan kernel: {best}"))
    );
}

/// Issue 11, item 1, from the command line: a flipped byte in the first of
/// five acknowledged WAL records. `dump` must fail naming the file, the
/// record and the records after it (it used to print 0 nodes and exit 0),
/// an insert must refuse rather than truncate, `repair` without its flag
/// must change nothing, and with it must drop exactly records 2..=5.
#[test]
fn damaged_wal_record_is_reported_and_dropped_only_by_repair() {
    use deltamem::{Attach, Bank, BankConfig, NewNode, Payload};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bank");
    let mut bank = Bank::create_dir(&path, BankConfig::new(4)).unwrap();
    for k in 0..5 {
        let payload = Payload {
            scenario: format!("node {k}"),
            fields: Default::default(),
        };
        let node = NewNode {
            tree: "task".into(),
            attach: Attach::Root,
            label: deltamem::Label::Success,
            payload,
            embedding: vec![1.0, k as f32, 0.0, 0.0],
            external_id: None,
        };
        bank.insert(node).unwrap();
    }
    drop(bank); // as after kill -9: no checkpoint, five records in the WAL
    let wal_path = path.join("wal.log");
    let mut wal = std::fs::read(&wal_path).unwrap();
    wal[150] ^= 0xff; // inside record 1 (the header is 64 bytes)
    std::fs::write(&wal_path, &wal).unwrap();

    let dump = deltamem(&["dump", s(&path)], "");
    assert_eq!(dump.code, 1, "{}", dump.stdout);
    assert!(dump.stdout.is_empty());
    for needle in ["wal.log", "record 1 is damaged", "records 2..=5", "repair"] {
        assert!(dump.stderr.contains(needle), "{needle:?} missing: {}", dump.stderr);
    }
    let insert = deltamem(
        &["insert", s(&path)],
        &task(json!("root"), "new", &[0.0, 1.0, 0.0, 0.0]),
    );
    assert_eq!(insert.code, 1);
    assert!(insert.stderr.contains("records 2..=5"), "{}", insert.stderr);
    let dry = deltamem(&["repair", s(&path)], "");
    assert_eq!(dry.code, 1);
    assert!(dry.stderr.contains("--drop-damaged-wal-tail"), "{}", dry.stderr);
    assert_eq!(std::fs::read(&wal_path).unwrap(), wal, "refusals changed the WAL");

    let repaired = ok(&["repair", s(&path), "--drop-damaged-wal-tail"], "").lines();
    assert_eq!(repaired[0]["repaired"], json!(true));
    assert_eq!(repaired[0]["damaged_lsn"], json!(1));
    assert_eq!(repaired[0]["dropped_lsns"], json!([2, 5]));
    assert_eq!(ok(&["dump", s(&path)], "").lines().len(), 0);
    ok(&["verify", s(&path)], "");
    let again = ok(&["repair", s(&path)], "").lines();
    assert_eq!(again[0]["repaired"], json!(false));
}

/// A manifest naming a generation whose files are missing (another
/// generation's files beside it): the writer's open, so a repair, refuses.
/// The dry run (`repair` without its flag) said "repaired: false" and
/// exit 0, as for a sound bank; it must say what the repair would.
#[test]
fn repair_dry_run_reports_what_the_repair_would_refuse() {
    let (_dir, path) = bank(&[]);
    ok(
        &["insert", s(&path)],
        &task(json!("root"), "one", &[1.0, 0.0, 0.0, 0.0]),
    );
    ok(&["compact", s(&path)], "");
    // Generation 1's files renamed as generation 0's: the manifest names
    // files that are gone.
    for entry in std::fs::read_dir(&path).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.contains(".g1.") {
            std::fs::rename(path.join(&name), path.join(name.replace(".g1.", "."))).unwrap();
        }
    }
    let before = dir_bytes(&path);
    for args in [
        vec!["repair", s(&path)],
        vec!["repair", s(&path), "--drop-damaged-wal-tail"],
    ] {
        let run = deltamem(&args, "");
        assert_eq!(run.code, 1, "{args:?}: {}", run.stdout);
        assert!(run.stdout.is_empty(), "{args:?}: {}", run.stdout);
        for needle in ["cannot repair", "MANIFEST", "payloads.g1.log", "missing"] {
            assert!(
                run.stderr.contains(needle),
                "{args:?}: {needle:?} missing: {}",
                run.stderr
            );
        }
    }
    assert_eq!(dir_bytes(&path), before, "a refusal changed the bank");
    // A frozen bank: the repair refuses it, so the dry run says so too.
    let (dir, b) = bank(&[]);
    ok(&["insert", s(&b)], &task(json!("root"), "one", &[1.0, 0.0, 0.0, 0.0]));
    let frozen = dir.path().join("frozen");
    ok(&["freeze", s(&b), s(&frozen)], "");
    for args in [
        vec!["repair", s(&frozen)],
        vec!["repair", s(&frozen), "--drop-damaged-wal-tail"],
    ] {
        let run = deltamem(&args, "");
        assert_eq!(run.code, 1, "{args:?}: {}", run.stdout);
        assert!(run.stderr.contains("frozen"), "{args:?}: {}", run.stderr);
    }
}

fn dir_bytes(path: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(path)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name() != "LOCK")
        .map(|e| (e.file_name().into_string().unwrap(), std::fs::read(e.path()).unwrap()))
        .collect()
}

/// `--out` through a symbolic link writes the file it names (the link
/// stays), into a FIFO writes to its reader (it was renamed over: the
/// FIFO became a regular file and the reader got nothing; as root a
/// device such as /dev/null became one too); a dangling link or a
/// directory is refused and left as it was.
#[test]
fn export_writes_through_links_and_fifos_and_replaces_neither() {
    use std::os::unix::fs::FileTypeExt;
    let (dir, b) = bank(&[]);
    ok(&["insert", s(&b)], &task(json!("root"), "one", &[1.0, 0.0, 0.0, 0.0]));
    let export = |out: &Path| {
        deltamem(
            &["export", s(&b), "--tree", "task", "--format", "jsonl", "--out", s(out)],
            "",
        )
    };
    let expected = {
        let plain = dir.path().join("plain.jsonl");
        assert_eq!(export(&plain).code, 0);
        std::fs::read(&plain).unwrap()
    };
    assert!(!expected.is_empty());
    let (target, link) = (dir.path().join("target.jsonl"), dir.path().join("link.jsonl"));
    std::fs::write(&target, b"old").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink(&target, &link).unwrap();
    assert_eq!(export(&link).code, 0);
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read(&target).unwrap(), expected);
    // The file replaced keeps its permissions (it became 0644).
    let mode = std::fs::metadata(&target).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    let fifo = dir.path().join("fifo");
    let c_path = std::ffi::CString::new(s(&fifo)).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates a file.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    assert_eq!(export(&fifo).code, 0);
    // Had the export not opened the FIFO, its reader would wait for a
    // writer for ever: this open (which fails when no reader waits) lets
    // it see an empty stream instead, and the test fail.
    use std::os::unix::fs::OpenOptionsExt;
    drop(
        std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo),
    );
    assert_eq!(reader.join().unwrap(), expected);
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());

    // `--out /dev/stdout` with stdout appended to a file (`>>`): the file
    // keeps what it held and gains the export after it (the file was
    // replaced, or written over from its start).
    let log = dir.path().join("log.txt");
    std::fs::write(&log, b"before\n").unwrap();
    let appended = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_deltamem"))
        .args([
            "export",
            s(&b),
            "--tree",
            "task",
            "--format",
            "jsonl",
            "--out",
            "/dev/stdout",
        ])
        .stdout(appended)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let mut want = b"before\n".to_vec();
    want.extend_from_slice(&expected);
    assert_eq!(std::fs::read(&log).unwrap(), want);

    let dangling = dir.path().join("dangling.jsonl");
    std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
    let run = export(&dangling);
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("does not exist"), "{}", run.stderr);
    assert!(std::fs::symlink_metadata(&dangling).unwrap().file_type().is_symlink());
    let run = export(dir.path());
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("is a directory"), "{}", run.stderr);
}

/// A node the export cannot write is named by its index, which `dump`
/// shows (the error named only the id the file would have given it, made
/// up for a node without an external id and found nowhere), and nothing
/// is written.
#[test]
fn export_names_a_refused_node_by_its_index() {
    let (dir, b) = bank(&[]);
    ok(&["insert", s(&b)], &task(json!("root"), "one", &[1.0, 0.0, 0.0, 0.0]));
    let bad = json!({"tree": "task", "attach": "root", "label": "SUCCESS", "scenario": "two",
        "payload": {"reference_meta": "not json"}, "embedding": [0.0, 1.0, 0.0, 0.0]});
    ok(&["insert", s(&b)], &format!("{bad}\n"));
    let out = dir.path().join("out.jsonl");
    let run = deltamem(
        &["export", s(&b), "--tree", "task", "--format", "jsonl", "--out", s(&out)],
        "",
    );
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("node 1 (exported as "), "{}", run.stderr);
    assert!(
        run.stderr.contains("reference_meta is not a JSON object"),
        "{}",
        run.stderr
    );
    assert!(!out.exists());
}

/// `serve` on an address in use says so once (the OS's reason was
/// printed twice: in the message and again as its source).
#[test]
fn serve_on_a_port_in_use_says_why_once() {
    let (_dir, b) = bank(&[]);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let run = deltamem(&["serve", s(&b), "--listen", &addr, "--quiet"], "");
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains(&format!("cannot listen on {addr}")),
        "{}",
        run.stderr
    );
    assert_eq!(run.stderr.matches("(os error").count(), 1, "{}", run.stderr);
}

/// Issue 11, item 2, from the command line: `hit` commits (durable in the
/// WAL), then the checkpoint at close fails (MANIFEST.tmp cannot be
/// created, as on a full disk). The result line must still be printed,
/// stderr must say the change is saved, the exit status is 3, and the hit
/// must be there once, not lost and not to be retried.
#[test]
fn hit_saved_before_a_failed_checkpoint_prints_its_result_and_exits_3() {
    let (_dir, path) = bank(&[]);
    insert(&path, &[task(json!("root"), "a", &[1.0, 0.0, 0.0, 0.0])]);
    let blocker = path.join("MANIFEST.tmp");
    std::fs::create_dir_all(blocker.join("in-the-way")).unwrap();
    let run = deltamem(&["hit", s(&path), "0"], "");
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert_eq!(run.lines(), vec![json!({"id": 0, "success_hits": 1, "due": false})]);
    assert!(
        run.stderr.contains("saved") && run.stderr.contains("checkpoint"),
        "{}",
        run.stderr
    );
    std::fs::remove_dir_all(&blocker).unwrap();
    let dump = ok(&["dump", s(&path)], "").lines();
    assert_eq!(dump[0]["success_hits"], json!(1));
}

/// Issue 11: `init` errors name the real allowed range. `--max-depth 256`
/// said "not in 0..=255" although 0 is refused too, and a rows-per-segment
/// value too large was printed as `Some(1048577)`. All of `init`'s rules
/// now live in one place (`format::manifest::Settings`).
#[test]
fn init_errors_name_the_real_range() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bank");
    for (flag, value, want) in [
        ("--max-depth", "256", "1..=255"),
        ("--max-depth", "0", "1..=255"),
        (
            "--rows-per-segment",
            "1048577",
            "rows per segment 1048577 outside 1024..=1048576",
        ),
        ("--rows-per-segment", "0", "rows per segment 0 outside 1024..=1048576"),
        ("--eps=-1", "", "eps -1 must be finite and >= 0"),
        ("--consolidate-after", "0", "consolidate-after 0 must be at least 1"),
    ] {
        let mut args = vec!["init", s(&path), "--dim", "4", flag];
        args.extend([value].iter().filter(|v| !v.is_empty()));
        let run = deltamem(&args, "");
        assert_ne!(run.code, 0, "{flag} {value} accepted");
        assert!(
            run.stderr.contains(want),
            "{flag} {value}: {:?} lacks {want:?}",
            run.stderr
        );
        assert!(!run.stderr.contains("Some("), "{}", run.stderr);
        assert!(!path.join("MANIFEST").exists(), "{flag} {value} left a bank behind");
    }
}

/// `verify --json` answers with one JSON object whatever the damage: a
/// damaged vector is listed with its file, offset and node, and a MANIFEST
/// that stops the bank from opening is a failed check naming MANIFEST.
#[test]
fn verify_json_is_always_one_object() {
    let (_dir, b) = bank(&[]);
    insert(
        &b,
        &[
            task(json!("root"), "a", &[1.0, 0.0, 0.0, 0.0]),
            task(json!("root"), "b", &[0.0, 1.0, 0.0, 0.0]),
        ],
    );
    let vectors = b.join("vectors-000000.seg");
    let mut bytes = std::fs::read(&vectors).unwrap();
    bytes[64 + 3] ^= 0x20; // node 1's vector (stride 64 at dim 4)
    std::fs::write(&vectors, bytes).unwrap();
    let run = deltamem(&["verify", s(&b), "--json"], "");
    assert_eq!(run.code, 1, "{}", run.stderr);
    let report = &run.lines()[0];
    assert_eq!(report["ok"], false);
    let problems = report["problems"].as_array().unwrap();
    assert!(
        problems
            .iter()
            .any(|p| p["file"].as_str().unwrap().ends_with("vectors-000000.seg")
                && p["offset_bytes"] == 64
                && p["detail"].as_str().unwrap().contains("node 1")),
        "{report}"
    );
    // Only node 1's reads fail: node 0's vector is fine, stats still works.
    ok(&["stats", s(&b)], "");

    let manifest = b.join("MANIFEST");
    let mut bytes = std::fs::read(&manifest).unwrap();
    bytes[40] ^= 0x01;
    std::fs::write(&manifest, bytes).unwrap();
    let run = deltamem(&["verify", s(&b), "--json"], "");
    assert_eq!(run.code, 1, "{}", run.stderr);
    let lines = run.lines();
    assert_eq!(lines.len(), 1, "{}", run.stdout);
    assert_eq!(lines[0]["ok"], false);
    let problem = &lines[0]["problems"][0];
    assert!(problem["file"].as_str().unwrap().ends_with("MANIFEST"), "{}", lines[0]);
}

/// `--rows-per-segment` below the minimum is refused at init with the
/// capacity it would give: with at most 4,096 segments, one row each made
/// a bank that either stops at 4,096 nodes or needs a map per node.
#[test]
fn init_refuses_segments_too_small_for_the_map_limit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bank");
    let run = deltamem(&["init", s(&path), "--dim", "4", "--rows-per-segment", "1"], "");
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.contains("below 1024") && run.stderr.contains("4096 nodes"),
        "{}",
        run.stderr
    );
    assert!(!path.exists());
    ok(&["init", s(&path), "--dim", "4", "--rows-per-segment", "1024"], "");
}

/// A bank whose MANIFEST is lost still holds its WAL, payloads and
/// segments: `init` there must not truncate them into a fresh bank, and
/// opening it must say the manifest is missing, not that this is no bank.
#[test]
fn init_refuses_to_overwrite_a_bank_that_lost_its_manifest() {
    let (_dir, b) = bank(&[]);
    insert(&b, &[task(json!("root"), "kept", &[1.0, 0.0, 0.0, 0.0])]);
    std::fs::remove_file(b.join("MANIFEST")).unwrap();
    let before: Vec<(String, Vec<u8>)> = ["wal.log", "payloads.log", "nodes-000000.seg"]
        .iter()
        .map(|f| (f.to_string(), std::fs::read(b.join(f)).unwrap()))
        .collect();
    let run = deltamem(&["init", s(&b), "--dim", "4"], "");
    assert_ne!(run.code, 0, "init over a bank's data files succeeded");
    assert!(
        run.stderr.contains("MANIFEST") && run.stderr.contains("payloads.log"),
        "{}",
        run.stderr
    );
    for (file, bytes) in &before {
        assert_eq!(&std::fs::read(b.join(file)).unwrap(), bytes, "{file} changed");
    }
    assert!(!b.join("MANIFEST").exists());
    let run = deltamem(&["dump", s(&b)], "");
    assert_ne!(run.code, 0);
    assert!(run.stderr.contains("MANIFEST is missing"), "{}", run.stderr);
    let run = deltamem(&["verify", s(&b), "--json"], "");
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["ok"], false);
    assert_eq!(report["problems"][0]["file"], format!("{}/MANIFEST", s(&b)), "{report}");
}

/// `export --out` pointed into the bank it reads would replace one of the
/// bank's own files (its MANIFEST, its WAL) with the export.
#[test]
fn export_refuses_to_write_into_the_bank_directory() {
    let (_dir, b) = bank(&[]);
    insert(&b, &[task(json!("root"), "kept", &[1.0, 0.0, 0.0, 0.0])]);
    for file in ["MANIFEST", "wal.log"] {
        let out = b.join(file);
        let before = std::fs::read(&out).unwrap();
        let run = deltamem(
            &["export", s(&b), "--tree", "task", "--format", "jsonl", "--out", s(&out)],
            "",
        );
        assert_ne!(run.code, 0, "export over {file} succeeded");
        assert!(run.stderr.contains("bank directory"), "{}", run.stderr);
        assert_eq!(std::fs::read(&out).unwrap(), before, "{file} changed");
    }
    ok(&["verify", s(&b)], "");
}

/// Queries piped in together are scored in shared passes (grouped by tree
/// and options): every answer, and every error, must be what the same
/// line gets when it is the only one (a process each), in input order.
/// The bank holds residual chains, failures and a consolidated node.
#[test]
fn piped_queries_answer_as_each_line_alone() {
    let (_dir, b) = bank(&["--consolidate-after", "1"]);
    let mut state = 7u64;
    let mut unit = || -> Vec<f32> {
        (0..4)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect()
    };
    let mut nodes = Vec::new();
    let mut last_task = None;
    for i in 0..60 {
        let label = if i % 4 == 0 { "FAILURE" } else { "SUCCESS" };
        if i % 5 == 0 {
            nodes.push(node("env", json!("root"), label, &format!("n{i}"), &unit()));
            continue;
        }
        let attach = match last_task {
            Some(parent) if i % 3 != 0 => json!({ "parent": parent }),
            _ => json!("root"),
        };
        nodes.push(node("task", attach, label, &format!("n{i}"), &unit()));
        last_task = Some(i);
    }
    let acks = insert(&b, &nodes);
    let residual = acks.iter().position(|a| a["type"] == "RESIDUAL").unwrap();
    ok(&["hit", s(&b), &residual.to_string()], "");
    ok(
        &[
            "consolidate",
            s(&b),
            &residual.to_string(),
            "--payload",
            "{\"execution_procedure\":\"all\"}",
        ],
        "",
    );
    let mut lines = Vec::new();
    for i in 0..48 {
        let mut q = json!({"tree": if i % 6 == 0 { "env" } else { "task" }, "embedding": unit()});
        match i % 8 {
            1 => q["k"] = json!(3),
            2 => q["tau"] = json!(-1.0),
            3 => q["eps"] = json!(0.5),
            4 => q["include_consolidated"] = json!(true),
            5 => q["embedding"] = json!([0.0, 0.0, 0.0, 0.0]),
            6 => q["tree"] = json!("nope"),
            _ => {}
        }
        lines.push(if i == 13 {
            "{not json".to_string()
        } else {
            q.to_string()
        });
    }
    let together = deltamem(&["query", s(&b), "--k", "2"], &(lines.join("\n") + "\n"));
    let answers: Vec<&str> = together.stdout.lines().collect();
    assert_eq!(answers.len(), lines.len());
    for (i, line) in lines.iter().enumerate() {
        let alone = deltamem(&["query", s(&b), "--k", "2"], &format!("{line}\n"));
        let want = alone
            .stdout
            .trim_end()
            .replace("\"line\":1,", &format!("\"line\":{},", i + 1));
        assert_eq!(answers[i], want, "line {}: {line}", i + 1);
    }
    assert!(answers.iter().filter(|a| a.contains("\"error\"")).count() >= 12);
}

//! NumPy interop through the real binary: `import --npy`, `query --npy`
//! and `dump --embeddings-npy`, with matrices written by the library's
//! writer and by NumPy itself (the files in tests/fixtures/npy, and NumPy
//! live when it is installed).

mod tools_common;

use std::path::Path;

use deltamem::interop::npy::{NpyElement, NpyRowReader};
use serde_json::{Value, json};
use tools_common::*;

fn read_matrix(path: &Path) -> (u64, usize, Vec<f32>) {
    let mut r = NpyRowReader::open(path).unwrap();
    let (rows, dim) = (r.info().row_count, r.info().dim_count);
    let mut values = Vec::new();
    r.read_rows(rows as usize, &mut values).unwrap();
    (rows, dim, values)
}

/// The values every fixture in tests/fixtures/npy holds (see its README).
fn fixture_rows() -> Vec<Vec<f32>> {
    (0..3)
        .map(|i| {
            (0..4)
                .map(|j| (i as f32 + 1.0) * 0.25 - j as f32 * 0.125 + 0.0625)
                .collect()
        })
        .collect()
}

fn import_npy(bank: &Path, npy: &Path, extra: &[&str]) -> Run {
    let mut args = vec!["import", s(bank), "--tree", "task", "--npy", s(npy)];
    args.extend_from_slice(extra);
    deltamem(&args, "")
}

#[test]
fn f32_rows_import_query_and_dump_round_trip() {
    let (dir, bank) = bank(8, &[]);
    let rows = random_rows(50, 8, 7);
    let npy = dir.path().join("v.npy");
    write_npy(&npy, &rows, NpyElement::F32);
    let run = import_npy(&bank, &npy, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let acks = run.lines();
    assert_eq!(acks.len(), 50, "one ack per row");
    for (row, ack) in acks.iter().enumerate() {
        assert_eq!(ack["id"], row as u64, "row order");
        assert_eq!((ack["type"].as_str(), ack["depth"].as_u64()), (Some("ROOT"), Some(1)));
        assert!(ack["parent"].is_null());
    }
    let dumped = dump(&bank, &[]);
    assert_eq!(dumped[7]["scenario"], "row 7", "default scenario");
    assert_eq!(dumped[7]["label"], "SUCCESS");
    // Each row's best match is its own node.
    let answers = ok(&["query", s(&bank), "--tree", "task", "--npy", s(&npy), "--k", "2"]).lines();
    assert_eq!(answers.len(), 50);
    for (row, a) in answers.iter().enumerate() {
        let best = &a["matches"][0];
        assert_eq!(best["id"], row as u64);
        assert!((best["score"].as_f64().unwrap() - 1.0).abs() < 1e-5);
        assert_eq!(best["chain"], json!([row]));
    }
    let out = dir.path().join("dump.npy");
    let lines = ok(&["dump", s(&bank), "--embeddings-npy", s(&out)]).lines();
    let (count, dim, values) = read_matrix(&out);
    assert_eq!((count, dim), (50, 8));
    for (r, row) in rows.iter().enumerate() {
        assert_eq!(lines[r]["id"], r as u64, "matrix row r is output line r");
        let got: Vec<f64> = values[r * 8..(r + 1) * 8].iter().map(|x| f64::from(*x)).collect();
        assert!(max_abs_diff(&got, &unit(row)) < 1e-6, "row {r}");
    }
}

#[test]
fn f16_rows_import_as_their_exact_values() {
    let (dir, bank) = bank(4, &[]);
    let rows = fixture_rows();
    let npy = dir.path().join("h.npy");
    write_npy(&npy, &rows, NpyElement::F16);
    assert_eq!(NpyRowReader::open(&npy).unwrap().info().descr, "<f2");
    let run = import_npy(&bank, &npy, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let dumped = dump(&bank, &["--embeddings"]);
    for (r, row) in rows.iter().enumerate() {
        assert!(max_abs_diff(&floats(&dumped[r]["embedding"]), &unit(row)) < 1e-6);
    }
    let answers = ok(&[
        "query",
        s(&bank),
        "--tree",
        "task",
        "--npy",
        s(&npy),
        "--tau",
        "-1",
        "--k",
        "3",
    ])
    .lines();
    for (r, a) in answers.iter().enumerate() {
        for m in a["matches"].as_array().unwrap() {
            let other = &rows[m["id"].as_u64().unwrap() as usize];
            let cos: f64 = unit(&rows[r]).iter().zip(unit(other)).map(|(x, y)| x * y).sum();
            assert!((m["score"].as_f64().unwrap() - cos).abs() < 1e-5);
        }
    }
}

#[test]
fn files_written_by_numpy_are_read_or_refused_by_name() {
    let (_dir, bank) = bank(4, &[]);
    let want: Vec<Vec<f64>> = fixture_rows().iter().map(|r| unit(r)).collect();
    let mut expected_ids = 0;
    for name in [
        "numpy_f32_3x4.npy",
        "numpy_f16_3x4.npy",
        "numpy_f32be_3x4.npy",
        "numpy_v2_f32_3x4.npy",
        "numpy_f32_row_4.npy",
    ] {
        let run = import_npy(&bank, &local_fixture(&format!("npy/{name}")), &[]);
        assert_eq!(run.code, 0, "{name}: {}", run.stderr);
        let first = expected_ids;
        expected_ids += run.lines().len();
        let dumped = dump(&bank, &["--embeddings"]);
        for (k, node) in dumped[first..expected_ids].iter().enumerate() {
            assert!(
                max_abs_diff(&floats(&node["embedding"]), &want[k]) < 1e-6,
                "{name} row {k}"
            );
        }
    }
    assert_eq!(expected_ids, 4 * 3 + 1);
    for (name, why) in [("numpy_f64_3x4.npy", "float32"), ("numpy_fortran_3x4.npy", "Fortran")] {
        let path = local_fixture(&format!("npy/{name}"));
        let run = import_npy(&bank, &path, &[]);
        assert_eq!(run.code, 1);
        assert!(
            run.stderr.contains(s(&path)) && run.stderr.contains(why),
            "{name}: {}",
            run.stderr
        );
    }
}

#[test]
fn our_writer_writes_what_numpy_writes() {
    let dir = tempfile::tempdir().unwrap();
    for (element, name) in [
        (NpyElement::F32, "numpy_f32_3x4.npy"),
        (NpyElement::F16, "numpy_f16_3x4.npy"),
    ] {
        let ours = dir.path().join(name);
        write_npy(&ours, &fixture_rows(), element);
        let theirs = std::fs::read(local_fixture(&format!("npy/{name}"))).unwrap();
        let ours = std::fs::read(&ours).unwrap();
        // Same length (both pad the header to 64 bytes) and the same data;
        // the header text may differ in spacing ("(3, 4)" vs "(3, 4, )").
        assert_eq!(ours.len(), theirs.len(), "{name}");
        let data_bytes = 12 * element.size_bytes() as usize;
        assert_eq!(
            ours[ours.len() - data_bytes..],
            theirs[theirs.len() - data_bytes..],
            "{name}: data"
        );
    }
}

const NUMPY_CHECK: &str = r#"
import sys, numpy as np
raw = np.array([[(i + 1) * 0.25 - j * 0.125 + 0.0625 for j in range(4)] for i in range(3)])
a = np.load(sys.argv[1])
want = raw / np.linalg.norm(raw, axis=1, keepdims=True)
assert a.dtype == np.float32 and a.shape == (3, 4) and a.flags["C_CONTIGUOUS"], (a.dtype, a.shape)
assert np.abs(a - want).max() < 1e-6, np.abs(a - want).max()
b = np.load(sys.argv[2])
assert b.dtype == np.float16 and b.shape == (3, 4), (b.dtype, b.shape)
assert np.array_equal(b.astype(np.float64), raw), "float16 values are exact"
print("ok")
"#;

#[test]
fn numpy_loads_what_we_write() {
    if !python_with("numpy") {
        if std::env::var("DELTAMEM_REQUIRE_NUMPY").as_deref() == Ok("1") {
            panic!("DELTAMEM_REQUIRE_NUMPY=1 but python3 cannot import numpy");
        }
        eprintln!("SKIPPED: numpy is not installed; our .npy files are not checked with NumPy itself");
        return;
    }
    let (dir, bank) = bank(4, &[]);
    let (raw, half) = (dir.path().join("raw.npy"), dir.path().join("half.npy"));
    write_npy(&raw, &fixture_rows(), NpyElement::F32);
    write_npy(&half, &fixture_rows(), NpyElement::F16);
    assert_eq!(import_npy(&bank, &raw, &[]).code, 0);
    let dumped = dir.path().join("dump.npy");
    ok(&["dump", s(&bank), "--embeddings-npy", s(&dumped)]);
    let run = python(NUMPY_CHECK, &[s(&dumped), s(&half)]);
    assert_eq!((run.code, run.stdout.trim()), (0, "ok"), "{}", run.stderr);
}

#[test]
fn meta_lines_give_scenario_payload_label_attach_and_id() {
    let (dir, bank) = bank(4, &[]);
    let npy = dir.path().join("v.npy");
    write_npy(&npy, &random_rows(4, 4, 3), NpyElement::F32);
    let meta = dir.path().join("meta.jsonl");
    let lines = [
        json!({"scenario": "boil water", "payload": {"execution_procedure": "heat"}, "id": "first-row"}),
        json!({"label": "FAILURE", "attach": {"parent": "first-row"}, "id": "second-row"}),
        json!({}),
        json!({"attach": {"parent": 1}, "tree": "task"}),
    ];
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&meta, text).unwrap();
    let run = import_npy(&bank, &npy, &["--meta", s(&meta)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let acks = run.lines();
    assert_eq!(acks[0]["external_id"], "first-row");
    assert_eq!(
        (acks[1]["parent"].as_u64(), acks[1]["type"].as_str()),
        (Some(0), Some("RESIDUAL"))
    );
    assert_eq!(acks[3]["parent"], 1);
    let d = dump(&bank, &[]);
    assert_eq!(d[0]["scenario"], "boil water");
    assert_eq!(d[0]["payload"]["execution_procedure"], "heat");
    assert_eq!(d[1]["label"], "FAILURE");
    assert_eq!(d[1]["external_id"], "second-row");
    assert_eq!(d[2]["scenario"], "row 2", "empty META object: defaults");
    assert_eq!(d[3]["depth"], 3);
}

fn bad_rows(count: usize, dim: usize, bad: &[(usize, f32)]) -> Vec<Vec<f32>> {
    let mut rows = random_rows(count, dim, 11);
    for &(r, x) in bad {
        rows[r] = if x == 0.0 { vec![0.0; dim] } else { vec![x; dim] };
    }
    rows
}

#[test]
fn bad_rows_stop_the_import_before_anything_is_written() {
    let (dir, bank) = bank(4, &[]);
    let npy = dir.path().join("v.npy");
    write_npy(&npy, &bad_rows(10, 4, &[(3, f32::NAN), (7, 0.0)]), NpyElement::F32);
    let run = import_npy(&bank, &npy, &["--batch", "4"]);
    assert_eq!(run.code, 1);
    assert_eq!(run.stdout, "");
    for needle in [
        format!("{}: row 3: component 0 is NaN", s(&npy)),
        format!("{}: row 7:", s(&npy)),
        "2 bad row(s)".into(),
    ] {
        assert!(run.stderr.contains(&needle), "missing {needle:?} in {}", run.stderr);
    }
    assert_eq!(ok(&["stats", s(&bank), "--json"]).json()["nodes"], 0);
}

/// The check before writing splits the rows between two workers. Bad
/// rows in both halves, more than are listed: the first 20 in row order
/// are listed, all are counted, and a row refused only by the bank's own
/// rule (finite, not zero, but too small a norm to normalise) is among
/// them.
#[test]
fn every_bad_row_is_counted_and_the_first_listed_in_order() {
    let (dir, bank) = bank(4, &[]);
    let npy = dir.path().join("v.npy");
    let mut bad: Vec<(usize, f32)> = (0..25).map(|k| (k * 3 + 1, f32::NAN)).collect();
    bad[19] = (58, 1e-30);
    write_npy(&npy, &bad_rows(80, 4, &bad), NpyElement::F32);
    let run = import_npy(&bank, &npy, &["--batch", "4"]);
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("25 bad row(s)"), "{}", run.stderr);
    let listed: Vec<u64> = run
        .stderr
        .lines()
        .filter_map(|l| l.split(": row ").nth(1)?.split(':').next()?.parse().ok())
        .collect();
    let want: Vec<u64> = bad.iter().take(20).map(|&(r, _)| r as u64).collect();
    assert_eq!(listed, want, "{}", run.stderr);
    assert!(
        run.stderr.contains("row 58: bad embedding: vector norm is"),
        "{}",
        run.stderr
    );
    assert_eq!(ok(&["stats", s(&bank), "--json"]).json()["nodes"], 0);
}

#[test]
fn keep_going_rejects_only_the_batch_holding_a_bad_row() {
    let (dir, bank) = bank(4, &[]);
    let npy = dir.path().join("v.npy");
    write_npy(&npy, &bad_rows(10, 4, &[(5, f32::INFINITY)]), NpyElement::F32);
    let run = import_npy(&bank, &npy, &["--batch", "4", "--keep-going"]);
    assert_eq!(run.code, 1, "a rejected row fails the command");
    let lines = run.lines();
    assert_eq!(lines.len(), 10, "one line per row, rejected or not");
    for (row, line) in lines.iter().enumerate() {
        if (4..8).contains(&row) {
            assert_eq!(line["row"], row as u64);
            assert!(line["error"].as_str().unwrap().contains("row 5"), "{line}");
        } else {
            assert!(line["id"].is_u64(), "row {row} stored: {line}");
        }
    }
    assert!(run.stderr.contains("rows 4..=7 rejected"), "{}", run.stderr);
    let stored: Vec<Value> = dump(&bank, &[]).iter().map(|d| d["scenario"].clone()).collect();
    let want: Vec<Value> = [0, 1, 2, 3, 8, 9].iter().map(|r| json!(format!("row {r}"))).collect();
    assert_eq!(stored, want);
}

/// Bulk-load batches (256 rows and more) share checkpoints; a batch
/// holding a bad row is still rejected alone, between stored ones, and
/// the lines stay in row order.
#[test]
fn keep_going_rejects_only_its_batch_of_a_bulk_load() {
    let (dir, bank) = bank(4, &[]);
    let npy = dir.path().join("v.npy");
    write_npy(&npy, &bad_rows(1000, 4, &[(300, f32::NAN)]), NpyElement::F32);
    let run = import_npy(&bank, &npy, &["--batch", "256", "--keep-going"]);
    assert_eq!(run.code, 1, "a rejected row fails the command");
    let lines = run.lines();
    assert_eq!(lines.len(), 1000, "one line per row, rejected or not");
    let mut next_id = 0;
    for (row, line) in lines.iter().enumerate() {
        if (256..512).contains(&row) {
            assert_eq!(line["row"], row as u64);
            assert!(line["error"].as_str().unwrap().contains("row 300"), "{line}");
        } else {
            assert_eq!(line["id"], next_id, "row {row} stored in order: {line}");
            next_id += 1;
        }
    }
    assert!(run.stderr.contains("rows 256..=511 rejected"), "{}", run.stderr);
    assert_eq!(ok(&["stats", s(&bank), "--json"]).json()["nodes"], 744);
}

#[test]
fn a_batch_the_bank_refuses_is_rejected_whole() {
    let (dir, bank) = bank(4, &[]);
    let npy = dir.path().join("v.npy");
    write_npy(&npy, &random_rows(4, 4, 5), NpyElement::F32);
    let meta = dir.path().join("meta.jsonl");
    // Row 3 names a parent that does not exist: only the bank can tell.
    std::fs::write(&meta, "{}\n{}\n{}\n{\"attach\": {\"parent\": \"nobody\"}}\n").unwrap();
    let run = import_npy(&bank, &npy, &["--meta", s(&meta), "--batch", "2"]);
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.contains(&format!("row 3 ({} line 4)", s(&meta))),
        "{}",
        run.stderr
    );
    let lines = run.lines();
    assert!(lines[0]["id"].is_u64() && lines[1]["id"].is_u64());
    assert_eq!((lines[2]["row"].as_u64(), lines[3]["row"].as_u64()), (Some(2), Some(3)));
    assert_eq!(dump(&bank, &[]).len(), 2);
}

#[test]
fn mismatched_inputs_are_refused_before_writing() {
    let (dir, bank) = bank(4, &[]);
    let npy = dir.path().join("v.npy");
    write_npy(&npy, &random_rows(3, 4, 1), NpyElement::F32);
    let meta = dir.path().join("meta.jsonl");
    std::fs::write(&meta, "{}\n{}\n").unwrap();
    let run = import_npy(&bank, &npy, &["--meta", s(&meta)]);
    assert!(
        run.code == 1 && run.stderr.contains("2 lines") && run.stderr.contains("3 rows"),
        "{}",
        run.stderr
    );
    std::fs::write(&meta, "{}\n{\"senario\": \"typo\"}\n{}\n").unwrap();
    let run = import_npy(&bank, &npy, &["--meta", s(&meta)]);
    assert!(
        run.code == 1 && run.stderr.contains("line 2") && run.stderr.contains("senario"),
        "{}",
        run.stderr
    );
    let wide = dir.path().join("wide.npy");
    write_npy(&wide, &random_rows(2, 6, 1), NpyElement::F32);
    let run = import_npy(&bank, &wide, &[]);
    assert!(
        run.code == 1 && run.stderr.contains(s(&wide)) && run.stderr.contains("6 dimensions"),
        "{}",
        run.stderr
    );
    let cut = dir.path().join("cut.npy");
    let bytes = std::fs::read(&npy).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() - 5]).unwrap();
    let run = import_npy(&bank, &cut, &[]);
    assert!(
        run.code == 1 && run.stderr.contains(s(&cut)) && run.stderr.contains("truncated"),
        "{}",
        run.stderr
    );
    let junk = dir.path().join("junk.npy");
    std::fs::write(
        &junk,
        b"\x93NUMPY\x01\x00\x20\x00{'descr': '<f4', 'shape': (99999999999, 99999999999), }",
    )
    .unwrap();
    let run = import_npy(&bank, &junk, &[]);
    assert!(run.code == 1 && run.stderr.contains(s(&junk)), "{}", run.stderr);
    // A shape written as a list, whose byte count wraps around u64: it got
    // past the size check and failed later as "read failed".
    let wraps = dir.path().join("wraps.npy");
    let mut bytes = npy_v1_header("{'descr': '<f4', 'fortran_order': False, 'shape': [4611686018427387905, 8], }");
    bytes.extend_from_slice(&[0u8; 32]);
    std::fs::write(&wraps, bytes).unwrap();
    let run = import_npy(&bank, &wraps, &[]);
    assert!(
        run.code == 1 && run.stderr.contains(s(&wraps)) && run.stderr.contains("impossibly large"),
        "{}",
        run.stderr
    );
    // A header with an extra key nested 12 deep: npyz's parser takes time
    // exponential in the depth (20 deep: 19 s, under the writer lock).
    let nested = dir.path().join("nested.npy");
    let deep = format!("{}1{}", "[".repeat(12), "]".repeat(12));
    let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': (1, 8), 'x': {deep}, }}");
    let mut bytes = npy_v1_header(&dict);
    bytes.extend_from_slice(&[0u8; 32]);
    std::fs::write(&nested, bytes).unwrap();
    let run = import_npy(&bank, &nested, &[]);
    assert!(
        run.code == 1 && run.stderr.contains(s(&nested)) && run.stderr.contains("nested deeper than 3"),
        "{}",
        run.stderr
    );
    assert_eq!(ok(&["stats", s(&bank), "--json"]).json()["nodes"], 0);
}

/// A version 1.0 `.npy` header holding `dict`, padded as NumPy pads it.
fn npy_v1_header(dict: &str) -> Vec<u8> {
    let mut header = String::from(dict);
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes
}

/// Runs `import --npy /dev/stdin` with `head` and then up to 64 MiB of
/// `fill` bytes on stdin; returns the exit code, stderr and the MiB of
/// fill written before the import stopped reading.
fn import_from_endless_stdin(bank: &Path, head: &[u8], fill: u8) -> (Option<i32>, String, usize) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_deltamem"))
        .args(["import", s(bank), "--tree", "task", "--npy", "/dev/stdin"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let head = head.to_vec();
    let writer = std::thread::spawn(move || {
        let block = vec![fill; 1 << 20];
        if std::io::Write::write_all(&mut input, &head).is_err() {
            return 0;
        }
        (0..64)
            .take_while(|_| std::io::Write::write_all(&mut input, &block).is_ok())
            .count()
    });
    let out = child.wait_with_output().unwrap();
    let blocks_written = writer.join().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        blocks_written,
    )
}

/// A stream that is not a .npy file is refused from its first bytes: the
/// import copied the whole stream to a temporary file first, so
/// `--npy /dev/zero` filled the disk before it said "no magic".
#[test]
fn a_stream_without_the_npy_magic_is_refused_before_it_is_copied() {
    let (_dir, bank) = bank(4, &[]);
    let (code, stderr, blocks_written) = import_from_endless_stdin(&bank, b"", 0);
    assert!(code == Some(1) && stderr.contains("NUMPY magic"), "{stderr}");
    assert!(blocks_written < 64, "the whole stream was read ({blocks_written} MiB)");
    assert_eq!(ok(&["stats", s(&bank), "--json"]).json()["nodes"], 0);
}

/// A stream with a valid header for 2 x 4 float32 rows (32 bytes) and
/// then endless data: only the declared bytes are copied, and the rest is
/// refused as a file with bytes past its data is, without reading it all.
#[test]
fn a_stream_longer_than_its_shape_is_refused_without_being_copied_whole() {
    let (_dir, bank) = bank(4, &[]);
    let head = npy_v1_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), }");
    // 0x3e bytes are the float 0.18..., finite: valid rows if they were read.
    let (code, stderr, blocks_written) = import_from_endless_stdin(&bank, &head, 0x3e);
    assert!(
        code == Some(1) && stderr.contains("goes on past the 32 bytes of data"),
        "{code:?} {stderr}"
    );
    assert!(blocks_written < 64, "the whole stream was read ({blocks_written} MiB)");
    assert_eq!(ok(&["stats", s(&bank), "--json"]).json()["nodes"], 0);
}

#[test]
fn npy_queries_answer_like_stdin_queries_on_any_thread_count() {
    let (dir, bank) = bank(8, &[]);
    let stored = dir.path().join("stored.npy");
    write_npy(&stored, &random_rows(200, 8, 21), NpyElement::F32);
    assert_eq!(import_npy(&bank, &stored, &[]).code, 0);
    let queries = random_rows(300, 8, 22);
    let q = dir.path().join("q.npy");
    write_npy(&q, &queries, NpyElement::F32);
    let one = ok(&[
        "query",
        s(&bank),
        "--tree",
        "task",
        "--npy",
        s(&q),
        "--k",
        "3",
        "--tau",
        "0",
    ]);
    let four = ok(&[
        "query",
        s(&bank),
        "--tree",
        "task",
        "--npy",
        s(&q),
        "--k",
        "3",
        "--tau",
        "0",
        "--threads",
        "4",
    ]);
    assert_eq!(one.stdout, four.stdout, "threads change nothing but speed");
    let stdin: String = queries
        .iter()
        .map(|v| format!("{}\n", json!({"tree": "task", "embedding": v, "k": 3, "tau": 0.0})))
        .collect();
    let via_stdin = deltamem(&["query", s(&bank)], &stdin);
    assert_eq!(via_stdin.code, 0, "{}", via_stdin.stderr);
    assert_eq!(one.stdout, via_stdin.stdout, "same lines as stdin queries");
    assert_eq!(one.lines().len(), 300);
}

#[test]
fn a_bad_query_row_gets_an_error_line_in_its_place() {
    let (dir, bank) = bank(4, &[]);
    let stored = dir.path().join("s.npy");
    write_npy(&stored, &random_rows(5, 4, 2), NpyElement::F32);
    assert_eq!(import_npy(&bank, &stored, &[]).code, 0);
    let q = dir.path().join("q.npy");
    write_npy(&q, &bad_rows(3, 4, &[(1, 0.0)]), NpyElement::F32);
    let run = deltamem(
        &["query", s(&bank), "--tree", "task", "--npy", s(&q), "--threads", "2"],
        "",
    );
    assert_eq!(run.code, 1);
    let lines = run.lines();
    assert_eq!(lines.len(), 3);
    assert!(lines[0]["matches"].is_array() && lines[2]["matches"].is_array());
    assert_eq!(lines[1]["row"], 1);
    assert!(run.stderr.contains(&format!("{}: row 1", s(&q))), "{}", run.stderr);
}

/// Big-endian twins of our little-endian files (header descr flipped,
/// every element byte-swapped) read as the same values, in any batching.
#[test]
fn big_endian_rows_read_as_their_little_endian_twins() {
    let dir = tempfile::tempdir().unwrap();
    let rows = random_rows(37, 5, 11);
    for (element, size) in [(NpyElement::F32, 4usize), (NpyElement::F16, 2)] {
        let le = dir.path().join(format!("le{size}.npy"));
        write_npy(&le, &rows, element);
        let mut bytes = std::fs::read(&le).unwrap();
        let data_start = bytes.len() - 37 * 5 * size;
        let descr = format!("<f{size}").into_bytes();
        let at = bytes[..data_start]
            .windows(3)
            .position(|w| w == descr)
            .expect("descr in the header");
        bytes[at] = b'>';
        bytes[data_start..].chunks_exact_mut(size).for_each(|e| e.reverse());
        let be = dir.path().join(format!("be{size}.npy"));
        std::fs::write(&be, &bytes).unwrap();
        assert_eq!(NpyRowReader::open(&be).unwrap().info().descr, format!(">f{size}"));
        let (_, _, want) = read_matrix(&le);
        for batch in [1, 4, 37, 100] {
            let mut reader = NpyRowReader::open(&be).unwrap();
            let mut got = Vec::new();
            while reader.read_rows(batch, &mut got).unwrap() > 0 {}
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "f{size} in batches of {batch}");
        }
    }
}

/// A file cut short after it was opened (its size was checked then): the
/// read that meets the end fails, leaves the output as it was, and every
/// later read fails too instead of reading from a shifted position.
#[test]
fn a_file_cut_short_after_open_fails_every_later_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.npy");
    write_npy(&path, &random_rows(10, 4, 3), NpyElement::F32);
    let mut reader = NpyRowReader::open(&path).unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(len - 4 * 4 * 4 - 8).unwrap(); // rows 8 and 9 gone, row 7 torn
    let mut out = Vec::new();
    assert_eq!(reader.read_rows(4, &mut out).unwrap(), 4);
    assert_eq!(out.len(), 16);
    let err = reader.read_rows(4, &mut out).unwrap_err().to_string();
    assert!(err.contains("row 4") && err.contains(s(&path)), "{err}");
    assert_eq!(out.len(), 16, "a failed read appends nothing");
    assert!(reader.read_rows(1, &mut out).is_err(), "no read after a failed one");
    assert_eq!((reader.rows_read(), out.len()), (4, 16));
}

/// META read from a stream is copied (to be read twice) only as far as
/// the matrix needs: one line per row, each within the line limit. A copy
/// of `/dev/zero` as META grew by ~400 MB a second until the disk filled,
/// and so did an endless stream of valid lines.
#[test]
fn meta_from_an_endless_stream_is_refused_after_a_bounded_read() {
    let (dir, bank) = bank(4, &[]);
    let npy = dir.path().join("m.npy");
    write_npy(&npy, &random_rows(3, 4, 1), NpyElement::F32);
    let scratch = tempfile::tempdir().unwrap();
    // Files are capped at 100 MiB (ulimit -f), so that a regression fails
    // here instead of filling the disk.
    let import_meta = |meta: &str| {
        let script = format!("ulimit -f 102400; exec \"$0\" import \"$1\" --tree task --npy \"$2\" --meta {meta}");
        let out = std::process::Command::new("bash")
            .args(["-c", &script, env!("CARGO_BIN_EXE_deltamem"), s(&bank), s(&npy)])
            .env("TMPDIR", scratch.path())
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, stderr) = import_meta("/dev/zero");
    assert!(code == Some(1) && stderr.contains("line 1 is longer than"), "{stderr}");
    let (code, stderr) = import_meta("<(yes '{\"scenario\":\"x\"}')");
    assert!(code == Some(1) && stderr.contains("past the 3 lines"), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(scratch.path()).unwrap().collect();
    assert!(left.is_empty(), "temporary copies left: {left:?}");
    assert_eq!(ok(&["stats", s(&bank), "--json"]).json()["nodes"], 0);
}

/// Waits (at most 30 s, else fails) until the import has made its
/// temporary copy in `dir`.
fn wait_for_a_temporary_copy(dir: &Path) {
    let copying = (0..3000).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(10));
        std::fs::read_dir(dir).unwrap().next().is_some()
    });
    assert!(copying, "no temporary copy was made");
}

/// SIGINT, SIGTERM or SIGHUP while a `.npy` stream is being copied: the
/// process still ends by the signal, and its temporary copy goes with it
/// (it was left in the temporary directory).
#[test]
fn a_signal_during_an_import_from_a_pipe_leaves_no_copy_behind() {
    let (_dir, bank) = bank(4, &[]);
    let mut head = npy_v1_header("{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 4), }");
    head.extend_from_slice(&[0x3e; 64]);
    for (name, signal) in [("INT", 2), ("TERM", 15), ("HUP", 1)] {
        let scratch = tempfile::tempdir().unwrap();
        // With the signals at their defaults whatever this test inherited
        // (a background job or nohup starts with SIGINT or SIGHUP ignored,
        // and an ignored signal rightly stays ignored).
        let mut child = std::process::Command::new("env")
            .args(["--default-signal=INT,TERM,HUP", env!("CARGO_BIN_EXE_deltamem")])
            .args(["import", s(&bank), "--tree", "task", "--npy", "/dev/stdin"])
            .env("TMPDIR", scratch.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        std::io::Write::write_all(&mut input, &head).unwrap();
        wait_for_a_temporary_copy(scratch.path());
        // The child is not yet waited for, so its pid is still its own.
        let sent = std::process::Command::new("kill")
            .args(["-s", name, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        // Bounded: the child ends within 30 s, or the test fails.
        let status = (0..3000).find_map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            child.try_wait().unwrap()
        });
        drop(input);
        let _ = child.kill();
        let status = status.unwrap_or_else(|| panic!("signal {signal}: the import did not end"));
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(signal),
            "{status:?}"
        );
        let left: Vec<_> = std::fs::read_dir(scratch.path()).unwrap().collect();
        assert!(left.is_empty(), "signal {signal}: temporary copy left: {left:?}");
    }
    assert_eq!(ok(&["stats", s(&bank), "--json"]).json()["nodes"], 0);
}

/// A writing command whose stdout fails (a full disk here; a closed pipe
/// the same) stops, and says on stderr how much it had stored: before, an
/// import that had stored every row said only that stdout failed, and an
/// insert into `| head -1` said nothing at all.
#[test]
fn stores_made_before_stdout_failed_are_reported() {
    let (dir, bank) = bank(4, &[]);
    let npy = dir.path().join("r.npy");
    write_npy(&npy, &random_rows(300, 4, 3), NpyElement::F32);
    let full = |args: &[&str], stdin: &[u8]| {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_deltamem"))
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::fs::File::create("/dev/full").unwrap())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        let stdin = stdin.to_vec();
        std::thread::spawn(move || std::io::Write::write_all(&mut input, &stdin));
        let out = child.wait_with_output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, stderr) = full(&["import", s(&bank), "--tree", "task", "--npy", s(&npy)], b"");
    assert!(
        code == Some(1) && stderr.contains("300 rows had been stored"),
        "{stderr}"
    );
    let lines: String = (0..50)
        .map(|i| {
            format!(
                "{{\"tree\":\"task\",\"attach\":\"root\",\"label\":\"SUCCESS\",\"scenario\":\"s{i}\",\"payload\":{{}},\"embedding\":[1,{i},0,1]}}\n"
            )
        })
        .collect();
    let (code, stderr) = full(&["insert", s(&bank), "--sync", "none"], lines.as_bytes());
    let stored = ok(&["stats", s(&bank), "--json"]).json()["nodes"].as_u64().unwrap() - 300;
    assert!(
        code == Some(1) && stored > 0 && stderr.contains(&format!("{stored} nodes had been stored")),
        "{stored}: {stderr}"
    );
}

/// A signal the import was started ignoring (`nohup`: SIGHUP) stays
/// ignored although the import watches for signals to remove its copy:
/// the import goes on and finishes its work.
#[test]
fn a_signal_ignored_at_start_stays_ignored() {
    let (_dir, bank) = bank(4, &[]);
    let mut bytes = npy_v1_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), }");
    let head_bytes = bytes.len() + 8;
    for x in [1.0f32, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0] {
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    let scratch = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new("bash")
        .args([
            "-c",
            "trap '' HUP; exec \"$0\" import \"$1\" --tree task --npy /dev/stdin",
            env!("CARGO_BIN_EXE_deltamem"),
            s(&bank),
        ])
        .env("TMPDIR", scratch.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    std::io::Write::write_all(&mut input, &bytes[..head_bytes]).unwrap();
    wait_for_a_temporary_copy(scratch.path());
    let sent = std::process::Command::new("kill")
        .args(["-s", "HUP", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    std::thread::sleep(std::time::Duration::from_millis(200));
    std::io::Write::write_all(&mut input, &bytes[head_bytes..]).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(ok(&["stats", s(&bank), "--json"]).json()["nodes"], 2);
}

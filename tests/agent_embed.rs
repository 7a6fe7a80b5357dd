#![cfg(feature = "agent")]
//! The ONNX embedder against an independent Python reference: the same
//! model and tokenizer run by Python's onnxruntime, tokenized by the
//! Python `tokenizers` package and mean-pooled with numpy. Needs the files
//! of `tools/setup-agent-assets.sh`; without them the tests say so and
//! pass, unless DELTAMEM_REQUIRE_ASSETS is set (CI sets it), in which case
//! they fail.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use deltamem::agent::{EmbedError, Embedder, OnnxConfig, OnnxEmbedder, TextRole};

const REFERENCE_SCRIPT: &str = r#"
import json, sys
import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

model, tokenizer_path, max_length = sys.argv[1], sys.argv[2], int(sys.argv[3])
texts = json.load(sys.stdin)
tok = Tokenizer.from_file(tokenizer_path)
tok.enable_truncation(max_length=max_length)
tok.no_padding()
encodings = tok.encode_batch(texts)
longest = max(len(e.ids) for e in encodings)
ids = np.zeros((len(texts), longest), dtype=np.int64)
mask = np.zeros_like(ids)
types = np.zeros_like(ids)
for i, e in enumerate(encodings):
    n = len(e.ids)
    ids[i, :n] = e.ids
    mask[i, :n] = e.attention_mask
    types[i, :n] = e.type_ids
session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
names = {i.name for i in session.get_inputs()}
feed = {"input_ids": ids}
if "attention_mask" in names:
    feed["attention_mask"] = mask
if "token_type_ids" in names:
    feed["token_type_ids"] = types
hidden = session.run(["last_hidden_state"], feed)[0].astype(np.float64)
m = mask[..., None].astype(np.float64)
pooled = (hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)
pooled = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
json.dump({"ids": [e.ids for e in encodings], "vectors": pooled.tolist()}, sys.stdout)
"#;

struct Assets {
    dir: PathBuf,
    python: PathBuf,
}

/// The assets, or None (after saying why) when they are missing and not
/// required. Panics when they are required and missing.
fn assets() -> Option<Assets> {
    let dir = std::env::var_os("DELTAMEM_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets"));
    let needed = [
        dir.join("minilm/model.onnx"),
        dir.join("minilm/tokenizer.json"),
        dir.join("onnxruntime/libonnxruntime.so.1.31.1"),
        dir.join("venv/bin/python"),
    ];
    let missing: Vec<String> = needed
        .iter()
        .filter(|p| !p.exists())
        .map(|p| p.display().to_string())
        .collect();
    if missing.is_empty() {
        return Some(Assets {
            python: dir.join("venv/bin/python"),
            dir,
        });
    }
    let message = format!(
        "agent assets missing ({}); run tools/setup-agent-assets.sh",
        missing.join(", ")
    );
    if std::env::var_os("DELTAMEM_REQUIRE_ASSETS").is_some() {
        panic!("DELTAMEM_REQUIRE_ASSETS is set but {message}");
    }
    eprintln!("SKIPPED: {message}");
    None
}

fn texts() -> Vec<String> {
    let long = "The agent walked to the kitchen, opened every cabinet in turn, \
looked inside the fridge, took the apple from the countertop and heated it in the \
microwave before putting it on the dining table. "
        .repeat(12);
    vec![
        "put a clean mug in the coffee machine".into(),
        "Boil water: teleport to the kitchen, pick up the pot, activate the stove.".into(),
        ".".into(),
        "   ok   ".into(),
        "Café naïve résumé, 東京 and emoji 🙂 in one line".into(),
        long,
        "a kitchen with a sink, a stove, three cabinets and a fridge".into(),
        "WebShop: buy a 2-pack of lavender soy candles under $30".into(),
    ]
}

fn reference(assets: &Assets, texts: &[String], max_length: usize) -> serde_json::Value {
    let script = tempfile::Builder::new().suffix(".py").tempfile().expect("temp file");
    std::fs::write(script.path(), REFERENCE_SCRIPT).unwrap();
    let mut child = Command::new(&assets.python)
        .arg(script.path())
        .arg(assets.dir.join("minilm/model.onnx"))
        .arg(assets.dir.join("minilm/tokenizer.json"))
        .arg(max_length.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the Python reference");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(texts).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "Python reference failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("reference output is JSON")
}

fn embedder(assets: &Assets, batch_size: usize) -> OnnxEmbedder {
    let mut config = OnnxConfig::minilm(&assets.dir);
    config.batch_size = batch_size;
    OnnxEmbedder::new(config).expect("load MiniLM")
}

#[test]
fn matches_python_onnxruntime() {
    let Some(assets) = assets() else { return };
    let texts = texts();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let mut e = embedder(&assets, 32);
    assert_eq!(e.dim(), 384);
    assert_eq!(e.config().max_length, 256);
    let ours = e.embed_batch(&refs, TextRole::Passage).unwrap();
    let theirs = reference(&assets, &texts, 256);

    // Same tokens, exactly; the long text is cut at 256, not at the 128
    // that tokenizer.json pins.
    let our_ids: Vec<Vec<u32>> = e
        .tokenize(&refs, TextRole::Passage)
        .unwrap()
        .iter()
        .map(|enc| enc.get_ids().to_vec())
        .collect();
    let their_ids: Vec<Vec<u32>> = serde_json::from_value(theirs["ids"].clone()).unwrap();
    assert_eq!(our_ids, their_ids);
    assert_eq!(our_ids[5].len(), 256, "the long text must be truncated");
    assert_eq!(our_ids[2].len(), 3, "'.' is [CLS] . [SEP]");

    let their_vectors: Vec<Vec<f64>> = serde_json::from_value(theirs["vectors"].clone()).unwrap();
    let mut worst = 0f64;
    for (i, (a, b)) in ours.iter().zip(&their_vectors).enumerate() {
        assert_eq!(a.len(), 384);
        assert_eq!(b.len(), 384);
        let norm: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "text {i} norm {norm}");
        for (x, y) in a.iter().zip(b) {
            worst = worst.max((f64::from(*x) - y).abs());
        }
    }
    println!("max abs diff against Python onnxruntime: {worst:.3e}");
    assert!(worst <= 1e-5, "max abs diff {worst} > 1e-5");
}

#[test]
fn batching_does_not_change_vectors() {
    let Some(assets) = assets() else { return };
    let texts = texts();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let batched = embedder(&assets, 32).embed_batch(&refs, TextRole::Query).unwrap();
    let mut single = embedder(&assets, 1);
    for (i, text) in refs.iter().enumerate() {
        let alone = single.embed(text, TextRole::Query).unwrap();
        let diff = alone
            .iter()
            .zip(&batched[i])
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff <= 1e-5, "text {i}: {diff}");
    }
}

#[test]
fn meaning_prefixes_and_errors() {
    let Some(assets) = assets() else { return };
    let mut e = embedder(&assets, 32);
    let v = e
        .embed_batch(
            &[
                "heat the apple in the microwave",
                "warm an apple using the microwave oven",
                "buy lavender candles online",
            ],
            TextRole::Passage,
        )
        .unwrap();
    let cos = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    assert!(cos(&v[0], &v[1]) > cos(&v[0], &v[2]) + 0.3);

    for bad in ["", "   \n\t "] {
        match e.embed(bad, TextRole::Query) {
            Err(EmbedError::EmptyText { index: 0 }) => {}
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    match e.embed_batch(&["fine", ""], TextRole::Query) {
        Err(EmbedError::EmptyText { index: 1 }) => {}
        other => panic!("{other:?}"),
    }

    // Prefixes (E5 style) change what is embedded, per role.
    let mut config = OnnxConfig::minilm(&assets.dir);
    config.query_prefix = "query: ".into();
    config.passage_prefix = "passage: ".into();
    let mut prefixed = OnnxEmbedder::new(config).unwrap();
    let ids = prefixed.tokenize(&["x"], TextRole::Query).unwrap();
    assert_eq!(ids[0].get_tokens(), ["[CLS]", "query", ":", "x", "[SEP]"]);
    let q = prefixed.embed("heat the apple", TextRole::Query).unwrap();
    let p = prefixed.embed("heat the apple", TextRole::Passage).unwrap();
    assert!(cos(&q, &p) < 0.9999);
    // A runtime path that is not ONNX Runtime is an error, never a panic
    // (a load error, or a mismatch once the real library is loaded).
    let mut config = OnnxConfig::minilm(&assets.dir);
    config.runtime = Some(assets.dir.join("minilm/tokenizer.json"));
    match OnnxEmbedder::new(config) {
        Err(EmbedError::RuntimeLoad { .. } | EmbedError::RuntimeMismatch { .. }) => {}
        other => panic!("{other:?}"),
    }
    // CLS pooling is available (and differs from mean pooling).
    let mut config = OnnxConfig::minilm(&assets.dir);
    config.pooling = deltamem::agent::Pooling::Cls;
    let cls = OnnxEmbedder::new(config)
        .unwrap()
        .embed("heat the apple", TextRole::Query)
        .unwrap();
    let mean = e.embed("heat the apple", TextRole::Query).unwrap();
    assert!(cos(&cls, &mean) < 0.9999);
}

/// Prints the throughput at batch 32; run with
/// `cargo test --release --features agent --test agent_embed -- --ignored --nocapture speed`.
#[test]
#[ignore]
fn speed_at_batch_32() {
    let Some(assets) = assets() else { return };
    let mut e = embedder(&assets, 32);
    let sentences: Vec<String> = (0..256)
        .map(|i| {
            format!(
                "episode {i}: go to countertop {}, take the mug, clean it with the sink, put it in the coffee machine",
                i % 7
            )
        })
        .collect();
    let refs: Vec<&str> = sentences.iter().map(String::as_str).collect();
    e.embed_batch(&refs[..32], TextRole::Passage).unwrap(); // warm-up
    let start = Instant::now();
    let rounds = 3;
    for _ in 0..rounds {
        e.embed_batch(&refs, TextRole::Passage).unwrap();
    }
    let per = start.elapsed().as_secs_f64() * 1000.0 / (rounds * refs.len()) as f64;
    let tokens = e.tokenize(&refs[..1], TextRole::Passage).unwrap()[0].len();
    println!("MiniLM int8, batch 32, {tokens} tokens per sentence: {per:.3} ms per sentence");
}

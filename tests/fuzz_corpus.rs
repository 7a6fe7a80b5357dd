//! Replays the committed fuzz seed corpus (fuzz/corpus/<target>/*) through
//! the same bodies the fuzz targets run, so every normal test run covers
//! them. `cargo test --test fuzz_corpus -- --ignored` rewrites the seeds.

mod common;

use std::path::{Path, PathBuf};

use common::fuzz_bodies;

type Body = fn(&[u8]);

const TARGETS: [(&str, Body); 5] = [
    ("decode_manifest", fuzz_bodies::decode_manifest),
    ("decode_row", fuzz_bodies::decode_row),
    ("decode_payload", fuzz_bodies::decode_payload),
    ("decode_wal", fuzz_bodies::decode_wal),
    ("ops", fuzz_bodies::ops_with_faults),
];

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target)
}

#[test]
fn every_seed_of_every_target_replays() {
    for (target, body) in TARGETS {
        let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir(target))
            .unwrap_or_else(|e| panic!("{target}: no corpus: {e}"))
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        assert!(files.len() >= 4, "{target}: only {} seeds", files.len());
        for file in &files {
            body(&std::fs::read(file).unwrap());
        }
        println!("{target}: {} seeds replayed", files.len());
    }
}

/// Valid structures, their truncations and single-bit flips.
fn seeds(target: &str) -> Vec<Vec<u8>> {
    use deltamem::format::manifest::{Manifest, Precision, TreeSpec};
    use deltamem::format::payload::{Payload, encode_record};
    use deltamem::format::row::{Label, NodeType, Row};
    use deltamem::format::wal::{WalHeader, WalOp, encode_ops, encode_record as wal_record};
    let manifest = Manifest {
        version: deltamem::format::FORMAT_VERSION,
        sequence: 3,
        flags: 0,
        dim_count: 4,
        row_stride_bytes: 64,
        rows_per_segment: 4,
        precision: Precision::F32,
        eps: 0.05,
        max_depth: 5,
        consolidate_after: 3,
        generation: 0,
        checkpoint_lsn: 9,
        node_count: 2,
        payload_end_bytes: 100,
        wal_salt: 77,
        created_unix_ms: 1,
        trees: vec![TreeSpec {
            name: "task".into(),
            tau: 0.8,
        }],
    };
    let row = Row {
        index: 1,
        parent: 0,
        tree: 0,
        node_type: NodeType::Residual,
        label: Label::Failure,
        depth: 2,
        flags: 0,
        success_hits: 2,
        retrievals: 5,
        link: u32::MAX,
        vector_crc32: 7,
        payload_offset_bytes: 40,
        payload_size_bytes: 60,
        created_unix_ms: 3,
        external_id: [0; 16],
        vector_sum32: 0,
        qvector_sum32: 0,
    };
    let payload = Payload {
        scenario: "boil water".into(),
        fields: [("content".to_string(), "x".repeat(300))].into(),
    };
    let base = match target {
        "decode_manifest" => manifest.encode().to_vec(),
        "decode_row" => [1u32.to_le_bytes().to_vec(), row.encode().to_vec()].concat(),
        "decode_payload" => encode_record(1, &payload),
        "decode_wal" => {
            let header = WalHeader { salt: 5, start_lsn: 1 };
            let body = encode_ops(&[WalOp::PutRow { row: row.clone() }]);
            let (r1, c1) = wal_record(header.chain_seed(), 1, 1, &body);
            let (r2, _) = wal_record(c1, 2, 1, &body);
            [header.encode().to_vec(), r1, r2].concat()
        }
        _ => (0..200u32).map(|i| (i * 37 % 251) as u8).collect(),
    };
    let mut out = vec![base.clone(), base[..base.len() / 2].to_vec()];
    for at in [0, base.len() / 3, base.len() - 1] {
        let mut flipped = base.clone();
        flipped[at] ^= 0x04;
        out.push(flipped);
    }
    if target == "decode_row" {
        // CRC-valid rows a reader must refuse: tree past the count, depth
        // past D_max, a parent at the row itself.
        let forged = [
            Row { tree: 2, ..row.clone() },
            Row {
                depth: 6,
                ..row.clone()
            },
            Row {
                parent: 1,
                ..row.clone()
            },
        ];
        for r in forged {
            out.push([1u32.to_le_bytes().to_vec(), r.encode().to_vec(), vec![2, 5]].concat());
        }
    }
    out
}

#[test]
#[ignore = "rewrites fuzz/corpus; run by hand when the formats change"]
fn regenerate_seed_corpus() {
    for (target, _) in TARGETS {
        let dir = corpus_dir(target);
        std::fs::create_dir_all(&dir).unwrap();
        for (i, seed) in seeds(target).into_iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i:02}")), seed).unwrap();
        }
    }
}

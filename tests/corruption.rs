//! Single-bit corruption of a checkpointed bank: every bit of every byte
//! that carries state is flipped in turn. `verify` must report a problem
//! naming the file and the damaged structure's offset, and every read
//! (open, queries, rows, payloads, vectors, chains) must either fail with
//! an error or give exactly the undamaged bank's answers. Never a panic,
//! never a wrong answer.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use deltamem::format::manifest::Precision;
use deltamem::format::row::ROW_SIZE_BYTES;
use deltamem::storage::MemStorage;
use deltamem::{
    Attach, Bank, BankConfig, Label, NewNode, NodeRef, OpenOptions, Payload, Problem, QueryOptions, VerifyScope,
};

const DIM: usize = 8;

fn build() -> (MemStorage, Vec<Vec<f32>>) {
    build_in(Precision::F32)
}

fn build_in(precision: Precision) -> (MemStorage, Vec<Vec<f32>>) {
    let storage = MemStorage::new();
    let mut config = BankConfig::new(DIM as u32);
    config.precision = precision;
    config.rows_per_segment = Some(4);
    config.consolidate_after = 1;
    let mut bank = Bank::create(Arc::new(storage.clone()), config).unwrap();
    let mut queries = Vec::new();
    for i in 0..11usize {
        let mut embedding = vec![0.05f32; DIM];
        embedding[i % 3] = 1.0;
        embedding[3 + i % 4] += 0.3;
        queries.push(embedding.clone());
        let mut fields = BTreeMap::new();
        fields.insert("execution_procedure".to_string(), format!("do thing {i} carefully"));
        let attach = if i % 3 == 0 {
            Attach::Root
        } else {
            Attach::Parent(NodeRef::Index((i - i % 3) as u32))
        };
        let node = NewNode {
            tree: if i < 9 { "task" } else { "env" }.into(),
            attach: if i >= 9 { Attach::Root } else { attach },
            label: if i % 4 == 2 { Label::Failure } else { Label::Success },
            payload: Payload {
                scenario: format!("scenario {i}"),
                fields,
            },
            embedding,
            external_id: Some(format!("ext-{i}")),
        };
        bank.insert(node).unwrap();
    }
    bank.success_hit(4).unwrap();
    bank.consolidate(
        4,
        BTreeMap::from([("execution_procedure".to_string(), "distilled".to_string())]),
    )
    .unwrap();
    bank.close().unwrap();
    (storage, queries)
}

/// Every read a user can make, each answered on its own (an error in one
/// must not hide a wrong answer in another).
fn answers(bank: &Bank, queries: &[Vec<f32>]) -> Vec<Result<String, String>> {
    let mut out = Vec::new();
    for q in queries {
        for tree in ["task", "env"] {
            let m = bank.query(
                tree,
                q,
                &QueryOptions {
                    k: 3,
                    tau: Some(-1.0),
                    ..Default::default()
                },
            );
            out.push(m.map(|m| format!("{m:?}")).map_err(|e| e.to_string()));
        }
    }
    for i in 0..bank.node_count() {
        out.push(bank.node(i).map(|n| format!("{n:?}")).map_err(|e| e.to_string()));
        out.push(bank.vector(i).map(|v| format!("{v:?}")).map_err(|e| e.to_string()));
        out.push(bank.chain(i).map(|c| format!("{c:?}")).map_err(|e| e.to_string()));
    }
    out
}

/// The byte range of the structure holding `offset` in `file`, for
/// checking that a reported offset points at the damage.
fn structure(file: &str, offset: usize, payload_ranges: &[Range<usize>]) -> Range<usize> {
    if file.starts_with("nodes-") {
        let start = offset / ROW_SIZE_BYTES * ROW_SIZE_BYTES;
        return start..start + ROW_SIZE_BYTES;
    }
    if file.starts_with("vectors-") {
        return offset / 64 * 64..offset / 64 * 64 + 64;
    }
    if file == "payloads.log" {
        return payload_ranges.iter().find(|r| r.contains(&offset)).cloned().unwrap();
    }
    0..usize::MAX // MANIFEST and WAL: open itself must fail
}

#[test]
fn every_flipped_bit_is_reported_and_never_answered_wrongly() {
    let (storage, queries) = build();
    let read_only = OpenOptions {
        read_only: true,
        ..Default::default()
    };
    let good = Bank::open(Arc::new(storage.clone()), read_only.clone()).unwrap();
    let expected: Vec<String> = answers(&good, &queries).into_iter().map(Result::unwrap).collect();
    let count = good.node_count() as usize;
    let payload_ranges: Vec<Range<usize>> = (0..count as u32)
        .map(|i| good.row(i).unwrap())
        .map(|r| r.payload_offset_bytes as usize..(r.payload_offset_bytes + u64::from(r.payload_size_bytes)) as usize)
        .collect();
    let stride = 64usize;
    drop(good);

    let (mut flips, mut open_refused, mut reads_refused) = (0u64, 0u64, 0u64);
    for name in storage.file_names() {
        let original = storage.file_bytes(&name).unwrap();
        // Bytes that carry state: rows and vectors of existing nodes, the
        // payload records, all of MANIFEST and the WAL.
        let segment_rows = |seg: usize| count.saturating_sub(seg * 4).min(4);
        let live = match name.as_str() {
            n if n.starts_with("nodes-") => segment_rows(n[6..12].parse().unwrap()) * ROW_SIZE_BYTES,
            n if n.starts_with("vectors-") => segment_rows(n[8..14].parse().unwrap()) * stride,
            "payloads.log" => payload_ranges.last().unwrap().end,
            "MANIFEST" | "wal.log" => original.len(),
            _ => 0,
        };
        for offset in 0..live {
            for bit in 0..8 {
                flips += 1;
                let mut damaged = original.clone();
                damaged[offset] ^= 1 << bit;
                storage.set_file_bytes(&name, damaged);
                let at = format!("{name} byte {offset} bit {bit}");
                match Bank::open(Arc::new(storage.clone()), read_only.clone()) {
                    Err(e) => {
                        open_refused += 1;
                        assert!(
                            e.to_string().contains(&name),
                            "{at}: open error does not name the file: {e}"
                        );
                    }
                    Ok(bank) => {
                        let report = bank.verify().unwrap();
                        let want = structure(&name, offset, &payload_ranges);
                        let points_at_it = |problems: &[Problem]| {
                            problems
                                .iter()
                                .any(|p| p.file.ends_with(&name) && want.contains(&(p.offset_bytes as usize)))
                        };
                        assert!(
                            points_at_it(&report.problems),
                            "{at}: verify did not point at it: {:?}",
                            report.problems
                        );
                        // What `freeze` checks of its copy: all but the
                        // vector column, so every other flip must show.
                        if !name.starts_with("vectors-") {
                            let rows_only = bank.verify_scope(VerifyScope::SkipVectorColumns).unwrap();
                            assert!(
                                points_at_it(&rows_only.problems),
                                "{at}: verify without the vector column did not point at it: {:?}",
                                rows_only.problems
                            );
                        }
                        let got = answers(&bank, &queries);
                        assert_eq!(got.len(), expected.len(), "{at}: node count changed");
                        for (n, (got, want)) in got.iter().zip(&expected).enumerate() {
                            match got {
                                Err(_) => reads_refused += 1,
                                Ok(got) => assert_eq!(got, want, "{at}: read {n} gave a wrong answer"),
                            }
                        }
                    }
                }
            }
        }
        storage.set_file_bytes(&name, original);
    }
    println!(
        "bit flips {flips}: open refused {open_refused}, single reads refused {reads_refused}, all reported by verify"
    );
    assert!(flips > 20_000);
}

/// Issue 11: a MANIFEST with bytes appended after its 1,024 still opened
/// and verified ok. The manifest is exactly 1,024 bytes: anything longer
/// is corruption naming the file and offset 1024.
#[test]
fn manifest_longer_than_1024_bytes_is_refused() {
    let (storage, _) = build();
    let mut bytes = storage.file_bytes("MANIFEST").unwrap();
    bytes.push(0);
    storage.set_file_bytes("MANIFEST", bytes);
    let read_only = OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    };
    let err = Bank::open(Arc::new(storage.clone()), read_only)
        .err()
        .expect("opened a 1,025-byte MANIFEST");
    let text = err.to_string();
    assert!(text.contains("MANIFEST") && text.contains("offset 1024"), "{text}");
}

/// Rewrites row `index` of a bank built by `build` (4 rows per segment)
/// through `forge`, with a fresh checksum: well-formed bytes that
/// contradict the bank.
fn forge_row(storage: &MemStorage, index: u32, forge: impl Fn(&mut deltamem::format::row::Row)) -> (String, usize) {
    use deltamem::format::row::Row;
    let name = format!("nodes-{:06}.seg", index / 4);
    let mut bytes = storage.file_bytes(&name).unwrap();
    let at = (index % 4) as usize * ROW_SIZE_BYTES;
    let mut row = Row::decode(&bytes[at..at + ROW_SIZE_BYTES], index).unwrap();
    forge(&mut row);
    bytes[at..at + ROW_SIZE_BYTES].copy_from_slice(&row.encode());
    storage.set_file_bytes(&name, bytes);
    (name, at)
}

#[test]
fn a_crc_valid_row_with_an_out_of_range_field_is_corrupt_never_a_panic() {
    use deltamem::format::row::Row;
    type Forge = fn(&mut Row);
    // Node 5 is a residual at depth 2 under node 3, in tree 0 of 2; D_max 5.
    // Its external id is "ext-5".
    let forges: [(&str, Forge); 9] = [
        ("tree past tree_count", |r| r.tree = 2),
        ("depth 0", |r| r.depth = 0),
        ("depth past D_max", |r| r.depth = 6),
        ("parent is itself", |r| r.parent = r.index),
        ("parent after itself", |r| r.parent = r.index + 3),
        ("external id not UTF-8", |r| {
            r.external_id[..2].copy_from_slice(b"\xff\xfe")
        }),
        ("external id with a NUL inside", |r| r.external_id[1] = 0),
        ("external id bytes without the flag", |r| {
            r.flags &= !deltamem::format::row::FLAG_HAS_EXTERNAL_ID
        }),
        ("empty external id", |r| r.external_id = [0; 16]),
    ];
    let read_only = OpenOptions {
        read_only: true,
        ..Default::default()
    };
    for (what, forge) in forges {
        let (storage, queries) = build();
        let good = Bank::open(Arc::new(storage.clone()), read_only.clone()).unwrap();
        let expected: Vec<String> = answers(&good, &queries).into_iter().map(Result::unwrap).collect();
        drop(good);
        let (name, at) = forge_row(&storage, 5, forge);
        let bank = Bank::open(Arc::new(storage.clone()), read_only.clone()).unwrap();
        let row_error = bank.row(5).expect_err(what).to_string();
        assert!(
            row_error.contains(&name) && row_error.contains("row 5"),
            "{what}: {row_error}"
        );
        let stats_error = bank.stats().expect_err(what).to_string();
        assert!(stats_error.contains(&name), "{what}: stats said {stats_error}");
        let report = bank.verify().unwrap();
        let row_bytes = at as u64..(at + ROW_SIZE_BYTES) as u64;
        assert!(
            report
                .problems
                .iter()
                .any(|p| p.file.ends_with(&name) && row_bytes.contains(&p.offset_bytes)),
            "{what}: verify did not point at row 5: {:?}",
            report.problems
        );
        for (n, (got, want)) in answers(&bank, &queries).iter().zip(&expected).enumerate() {
            if let Ok(got) = got {
                assert_eq!(got, want, "{what}: read {n} gave a wrong answer");
            }
        }
        // The writer refuses it too, instead of indexing with it.
        let writer = Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap();
        assert!(writer.stats().is_err(), "{what}");
    }
}

#[test]
fn a_damaged_vector_fails_only_the_reads_of_it_and_never_the_open() {
    let (storage, queries) = build();
    // Uncheckpointed WAL records whose replay reads rows of the damaged
    // vector's segment: a residual under node 0 and a hit on node 1.
    let mut writer = Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap();
    let mut fields = BTreeMap::new();
    fields.insert("execution_procedure".to_string(), "later".to_string());
    writer
        .insert(NewNode {
            tree: "task".into(),
            attach: Attach::Parent(NodeRef::Index(0)),
            label: Label::Success,
            payload: Payload {
                scenario: "later".into(),
                fields,
            },
            embedding: queries[0].clone(),
            external_id: None,
        })
        .unwrap();
    writer.success_hit(1).unwrap();
    drop(writer); // no checkpoint: both stay in the WAL
    let name = "vectors-000000.seg";
    let mut bytes = storage.file_bytes(name).unwrap();
    bytes[64 + 4] ^= 0x10; // node 1's vector
    storage.set_file_bytes(name, bytes);
    for read_only in [true, false] {
        let bank = Bank::open(
            Arc::new(storage.clone()),
            OpenOptions {
                read_only,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(bank.node_count(), 13);
        assert_eq!(bank.stats().unwrap().nodes, 13);
        assert!(bank.vector(0).is_ok() && bank.chain(12).unwrap() == vec![0, 12]);
        let e = bank.vector(1).unwrap_err().to_string();
        assert!(e.contains(name) && e.contains("node 1"), "{e}");
        let options = QueryOptions {
            k: 3,
            tau: Some(-1.0),
            ..Default::default()
        };
        // Tree "task" reads node 1's vector; tree "env" (segment 2) does not.
        let e = bank.query("task", &queries[1], &options).unwrap_err().to_string();
        assert!(e.contains(name) && e.contains("node 1"), "{e}");
        assert!(bank.query("env", &queries[1], &options).is_ok());
        let report = bank.verify().unwrap();
        assert!(
            report
                .problems
                .iter()
                .any(|p| p.file.ends_with(name) && p.offset_bytes == 64),
            "{:?}",
            report.problems
        );
    }
}

/// Two rows with one external id (each row well-formed, with a fresh
/// checksum): `verify` names the later row's id field once, and a lookup
/// by id is an error, not a guess between the two nodes.
#[test]
fn a_duplicated_external_id_is_reported_and_never_resolved() {
    let (storage, _) = build();
    let (name, at) = forge_row(&storage, 5, |r| r.external_id[4] = b'4'); // "ext-5" -> "ext-4"
    for read_only in [true, false] {
        let options = OpenOptions {
            read_only,
            ..Default::default()
        };
        let bank = Bank::open(Arc::new(storage.clone()), options).unwrap();
        let report = bank.verify().unwrap();
        let id_field = (at + deltamem::format::row::ROW_EXTERNAL_ID_OFFSET) as u64;
        assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
        let problem = &report.problems[0];
        assert!(
            problem.file.ends_with(&name) && problem.offset_bytes == id_field,
            "{problem:?}"
        );
        assert!(
            problem.detail.contains("node 5") && problem.detail.contains("node 4"),
            "{problem:?}"
        );
        let e = bank
            .resolve(&NodeRef::External("ext-4".into()))
            .unwrap_err()
            .to_string();
        assert!(e.contains(&name) && e.contains("ext-4"), "{e}");
        assert_eq!(bank.row(4).unwrap().external_id_text().as_deref(), Some("ext-4"));
    }
}

/// A row whose checksum fails is one problem, not also a "payload not
/// contiguous" complaint about the row after it (in its segment or the
/// next). Rows 5 (mid-segment), 7 (a segment's last) and 8 (a segment's
/// first) have no children and no links pointing at them.
#[test]
fn a_torn_row_is_reported_once() {
    // A flip in the payload offset, and one in the external id (the
    // latter was listed twice: once by the row's read, once by the
    // mapping of its segment).
    let fields = [
        deltamem::format::row::ROW_PAYLOAD_OFFSET_OFFSET,
        deltamem::format::row::ROW_EXTERNAL_ID_OFFSET + 4,
    ];
    for (index, field) in (0u32..11).flat_map(|i| fields.map(|f| (i, f))) {
        let (storage, _) = build();
        let name = format!("nodes-{:06}.seg", index / 4);
        let mut bytes = storage.file_bytes(&name).unwrap();
        let at = (index % 4) as usize * ROW_SIZE_BYTES;
        bytes[at + field] ^= 0x01; // checksum left stale
        storage.set_file_bytes(&name, bytes);
        let options = OpenOptions {
            read_only: true,
            ..Default::default()
        };
        let report = Bank::open(Arc::new(storage.clone()), options)
            .unwrap()
            .verify()
            .unwrap();
        assert_eq!(
            report.problems.len(),
            1,
            "row {index} byte {field}: {:?}",
            report.problems
        );
        assert!(report.problems[0].file.ends_with(&name), "{:?}", report.problems);
    }
}

/// A vector's bytes with `bad` as its first component, and the CRC and
/// lane sum that make its row's checksum fields agree with it (a forgery:
/// only the check of the norm can tell).
fn forged_vector(vector: &[f32], bad: f32) -> (Vec<f32>, u32, u32) {
    let mut forged = vector.to_vec();
    forged[0] = bad;
    let bytes: Vec<u8> = forged.iter().flat_map(|x| x.to_le_bytes()).collect();
    (
        forged,
        deltamem::format::crc32(&bytes),
        deltamem::format::lane_sum32(&bytes),
    )
}

/// A vector in a segment that passes its checksums but is not a unit
/// vector (a NaN, an infinite or a too-long component): `verify` names it.
/// (A NaN once passed: its norm compared false both ways.)
#[test]
fn verify_reports_a_forged_vector_off_the_unit_sphere() {
    for bad in [f32::NAN, f32::INFINITY, 2.0] {
        let (storage, _) = build();
        let stride = deltamem::format::vector_stride_bytes(DIM as u32) as usize;
        let mut bytes = storage.file_bytes("vectors-000000.seg").unwrap();
        let at = stride; // node 1
        let stored: Vec<f32> = bytes[at..at + DIM * 4]
            .chunks_exact(4)
            .map(|w| f32::from_le_bytes(w.try_into().unwrap()))
            .collect();
        let (forged, crc, sum) = forged_vector(&stored, bad);
        let forged_bytes: Vec<u8> = forged.iter().flat_map(|x| x.to_le_bytes()).collect();
        bytes[at..at + DIM * 4].copy_from_slice(&forged_bytes);
        storage.set_file_bytes("vectors-000000.seg", bytes);
        forge_row(&storage, 1, |r| {
            r.vector_crc32 = crc;
            r.vector_sum32 = sum;
        });
        let bank = Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap();
        let problems = bank.verify().unwrap().problems;
        assert!(
            problems.iter().any(|p: &Problem| p.file.ends_with("vectors-000000.seg")
                && p.offset_bytes == at as u64
                && p.detail.contains("node 1 has norm")),
            "{bad}: {problems:?}"
        );
    }
}

/// A manifest forged (its CRC recomputed) to name the next generation,
/// whose files do not exist: a writer open refuses it and deletes
/// nothing (it deleted every data file of the real generation, the
/// bank's only data, as a crashed compact's leftovers).
/// With a WAL node whose parent is checkpointed too: replay reads that
/// row, and the error named the missing segment instead.
#[test]
fn a_manifest_naming_a_generation_without_files_deletes_nothing() {
    use deltamem::format::manifest::Manifest;
    for wal_node in [false, true] {
        let (storage, _) = build();
        if wal_node {
            let mut bank = Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap();
            let mut embedding = vec![0.0; DIM];
            embedding[2] = 1.0;
            let node = NewNode {
                tree: "task".into(),
                attach: Attach::Parent(NodeRef::Index(0)),
                label: Label::Success,
                payload: Payload {
                    scenario: "a child in the WAL".into(),
                    fields: BTreeMap::new(),
                },
                embedding,
                external_id: None,
            };
            bank.insert(node).unwrap();
            drop(bank);
        }
        let mut manifest = Manifest::decode(&storage.file_bytes("MANIFEST").unwrap()).unwrap();
        manifest.generation += 1;
        storage.set_file_bytes("MANIFEST", manifest.encode().to_vec());
        let before = all_files(&storage);
        let e = Bank::open(Arc::new(storage.clone()), OpenOptions::default())
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("MANIFEST") && e.contains("generation 1") && e.contains("nothing was deleted"),
            "{wal_node}: {e}"
        );
        assert_eq!(all_files(&storage), before);
    }
}

/// A WAL update that sets a link with no consolidation flag is refused at
/// replay like a new node's (it was applied, and a checkpoint then wrote
/// it into the segment, where no repair reaches).
#[test]
fn a_wal_update_with_a_stray_link_is_refused() {
    use deltamem::format::wal::WalOp;
    let (storage, id) = with_a_node_in_the_wal();
    let mut bank = Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap();
    bank.success_hit(id).unwrap();
    drop(bank);
    let at = rewrite_the_last_wal_record(&storage, |op| {
        if let WalOp::PutRow { row } = op {
            row.link = 0;
        }
    });
    let e = Bank::open(Arc::new(storage.clone()), OpenOptions::default())
        .err()
        .unwrap()
        .to_string();
    let named = [
        "wal.log",
        &format!("offset {at}"),
        "link 0 without a consolidation flag",
    ];
    assert!(named.iter().all(|n| e.contains(n)), "{e}");
}

/// Damages a bank; says which file and what `verify` will say of it.
type Damage = dyn Fn(&MemStorage) -> (&'static str, &'static str);

/// A stray link forged into a checkpointed row is the segment's damage:
/// an update (a hit) that only carries it over is replayed, not refused
/// (a repair would have dropped that record and every later one, leaving
/// the row as it was), and `verify` names the segment.
#[test]
fn a_stray_link_carried_over_by_an_update_is_blamed_on_the_segment() {
    let (storage, _) = build();
    let (file, _) = forge_row(&storage, 5, |r| r.link = 0);
    let mut bank = Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap();
    let hits = bank.row(5).unwrap().success_hits;
    bank.success_hit(5).unwrap();
    drop(bank);
    let bank = Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap();
    assert_eq!(bank.row(5).unwrap().success_hits, hits + 1);
    let problems = bank.verify().unwrap().problems;
    assert!(
        problems
            .iter()
            .any(|p| p.file.ends_with(&file) && p.detail.contains("node 5: link 0 without")),
        "{problems:?}"
    );
}

/// Every file of `storage` with its bytes.
fn all_files(storage: &MemStorage) -> BTreeMap<String, Vec<u8>> {
    let names = storage.file_names();
    names
        .into_iter()
        .map(|n| (n.clone(), storage.file_bytes(&n).unwrap()))
        .collect()
}

/// `compact` and `freeze` refuse a bank that `verify` finds damaged,
/// naming the first problem, and change nothing: they copied a forged
/// vector (and a dangling link, a wrong depth...) into files with fresh
/// checksums that verified clean, and the checkpoint that compact starts
/// with (or the one at close) wrote over a segment of the wrong size.
#[test]
fn compact_and_freeze_refuse_a_damaged_bank_and_change_nothing() {
    let forge_off_sphere = |storage: &MemStorage| {
        let mut bytes = storage.file_bytes("vectors-000000.seg").unwrap();
        let stored: Vec<f32> = bytes[..DIM * 4]
            .chunks_exact(4)
            .map(|w| f32::from_le_bytes(w.try_into().unwrap()))
            .collect();
        let (forged, crc, sum) = forged_vector(&stored, 2.0);
        let forged_bytes: Vec<u8> = forged.iter().flat_map(|x| x.to_le_bytes()).collect();
        bytes[..DIM * 4].copy_from_slice(&forged_bytes);
        storage.set_file_bytes("vectors-000000.seg", bytes);
        forge_row(storage, 0, |r| (r.vector_crc32, r.vector_sum32) = (crc, sum));
        ("vectors-000000.seg", "node 0 has norm")
    };
    let one_byte_longer = |storage: &MemStorage| {
        let mut bytes = storage.file_bytes("vectors-000001.seg").unwrap();
        bytes.push(0);
        storage.set_file_bytes("vectors-000001.seg", bytes);
        ("vectors-000001.seg", "bytes, expected")
    };
    let damages: [&Damage; 2] = [&forge_off_sphere, &one_byte_longer];
    for damage in damages {
        let (storage, _) = with_a_node_in_the_wal();
        let (file, said) = damage(&storage);
        let before = all_files(&storage);
        let mut bank = Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap();
        let target = MemStorage::new();
        let e = bank.freeze_into(&target).unwrap_err().to_string();
        assert!(
            e.contains(file) && e.contains(said) && e.contains("freeze refuses"),
            "{e}"
        );
        assert!(target.file_names().is_empty(), "{:?}", target.file_names());
        let e = bank.compact().unwrap_err().to_string();
        assert!(
            e.contains(file) && e.contains(said) && e.contains("compact refuses"),
            "{e}"
        );
        // Closing does not checkpoint over the damage either.
        assert!(bank.close().is_err());
        assert_eq!(all_files(&storage), before, "{file}");
    }
}

/// The same forgery in a WAL record is refused when the record is
/// replayed (at every open), naming the WAL and the record, rather than
/// put into the bank to be dumped and exported as NaN.
#[test]
fn a_wal_record_with_a_forged_vector_off_the_unit_sphere_is_refused_at_open() {
    use deltamem::format::wal::WalOp;
    for bad in [f32::NAN, f32::INFINITY, 2.0] {
        let (storage, _) = with_a_node_in_the_wal();
        let at = rewrite_the_wal_record(&storage, |op| {
            if let WalOp::PutNode { row, vector, .. } = op {
                let (forged, crc, sum) = forged_vector(vector, bad);
                (*vector, row.vector_crc32, row.vector_sum32) = (forged, crc, sum);
            }
        });
        let e = Bank::open(Arc::new(storage.clone()), OpenOptions::default())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("wal.log") && e.contains(&format!("offset {at}")) && e.contains("norm"),
            "{bad}: {e}"
        );
    }
}

/// A record refused at replay is damage like a record that fails its
/// checksum: open names it and `repair`, and `repair` drops it and what
/// follows, keeping the records before it (it could not drop it: the bank
/// stayed unopenable for good).
#[test]
fn a_refused_wal_record_is_damage_that_repair_drops() {
    use deltamem::format::wal::WalOp;
    let (storage, first) = with_a_node_in_the_wal();
    let mut bank = Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap();
    let mut embedding = vec![0.0; DIM];
    embedding[1] = 1.0;
    let node = NewNode {
        tree: "task".into(),
        attach: Attach::Root,
        label: Label::Success,
        payload: Payload {
            scenario: "the second WAL record".into(),
            fields: BTreeMap::new(),
        },
        embedding,
        external_id: None,
    };
    let second = bank.insert(node.clone()).unwrap().id;
    drop(bank);
    let at = rewrite_the_last_wal_record(&storage, |op| {
        if let WalOp::PutNode { row, vector, .. } = op {
            let (forged, crc, sum) = forged_vector(vector, 2.0);
            (*vector, row.vector_crc32, row.vector_sum32) = (forged, crc, sum);
        }
    });
    for e in open_errors(&storage) {
        let named = ["wal.log", &format!("offset {at}"), "norm", "--drop-damaged-wal-tail"];
        assert!(named.iter().all(|n| e.contains(n)), "{e}");
    }
    let damage = Bank::repair(Arc::new(storage.clone()))
        .unwrap()
        .expect("a record dropped");
    assert_eq!(damage.offset_bytes, at as u64);
    assert_eq!(damage.dropped_lsns.start(), damage.dropped_lsns.end());
    let mut bank = Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap();
    assert_eq!(bank.node_count(), second);
    assert_eq!(
        bank.payload(first).unwrap().scenario,
        "in the WAL only, long enough to forge"
    );
    assert!(bank.verify().unwrap().problems.is_empty());
    assert_eq!(bank.insert(node).unwrap().id, second);
}

/// The bank of `build` with one more node that lives only in its WAL (the
/// writer dropped as after a crash), and that node's id.
fn with_a_node_in_the_wal() -> (MemStorage, u32) {
    let (storage, queries) = build();
    let mut bank = Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap();
    let node = NewNode {
        tree: "env".into(),
        attach: Attach::Root,
        label: Label::Success,
        payload: Payload {
            scenario: "in the WAL only, long enough to forge".into(),
            fields: BTreeMap::new(),
        },
        embedding: queries[0].clone(),
        external_id: None,
    };
    let id = bank.insert(node).unwrap().id;
    drop(bank);
    (storage, id)
}

/// Rewrites each op of the WAL's one record with `change`, the record
/// framed again (a forgery that passes every checksum); its offset.
fn rewrite_the_wal_record(storage: &MemStorage, change: impl Fn(&mut deltamem::format::wal::WalOp)) -> usize {
    let scan = deltamem::storage::wal::scan(storage).unwrap();
    assert_eq!(scan.records.len(), 1);
    rewrite_the_last_wal_record(storage, change)
}

/// `rewrite_the_wal_record` for the last of the WAL's records, chained
/// from the one before it.
fn rewrite_the_last_wal_record(storage: &MemStorage, change: impl Fn(&mut deltamem::format::wal::WalOp)) -> usize {
    use deltamem::format::wal::{decode_ops, decode_record_header, encode_ops, encode_record};
    let scan = deltamem::storage::wal::scan(storage).unwrap();
    let record = scan.records.last().unwrap().clone();
    let mut ops = decode_ops(scan.body(&record), record.op_count, DIM as u32).unwrap();
    ops.iter_mut().for_each(change);
    let mut wal = storage.file_bytes("wal.log").unwrap();
    let prev_crc = match scan.records.len() {
        1 => scan.header.chain_seed(),
        n => {
            decode_record_header(&wal[scan.records[n - 2].offset_bytes as usize..])
                .unwrap()
                .crc
        }
    };
    let (framed, _) = encode_record(prev_crc, record.lsn, record.op_count, &encode_ops(&ops));
    let at = record.offset_bytes as usize;
    assert_eq!(framed.len(), scan.body(&record).len() + 24, "same size");
    wal[at..at + framed.len()].copy_from_slice(&framed);
    storage.set_file_bytes("wal.log", wal);
    at
}

/// A WAL node's payload record whose framing and CRC hold over bytes that
/// do not decode: `verify` reports it (it said ok) and a read of it names
/// the WAL (it named a "WAL overlay" that is no file).
#[test]
fn a_wal_payload_that_does_not_decode_is_reported_by_verify_and_named_by_reads() {
    use deltamem::format::payload::{PAY_CRC_OFFSET, PAYLOAD_HEADER_SIZE_BYTES};
    use deltamem::format::wal::WalOp;
    let (storage, id) = with_a_node_in_the_wal();
    rewrite_the_wal_record(&storage, |op| {
        if let WalOp::PutNode { payload_record, .. } = op {
            payload_record[PAYLOAD_HEADER_SIZE_BYTES..].fill(0xff);
            let mut covered = payload_record[..PAY_CRC_OFFSET].to_vec();
            covered.extend_from_slice(&payload_record[PAYLOAD_HEADER_SIZE_BYTES..]);
            let crc = deltamem::format::crc32(&covered);
            payload_record[PAY_CRC_OFFSET..PAY_CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
        }
    });
    let bank = Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap();
    let e = bank.payload(id).unwrap_err().to_string();
    assert!(e.contains("wal.log") && e.contains(&format!("node {id}")), "{e}");
    let problems = bank.verify().unwrap().problems;
    assert!(
        problems
            .iter()
            .any(|p| p.file.ends_with("wal.log") && p.detail.contains(&format!("node {id}"))),
        "{problems:?}"
    );
}

/// A data file the manifest names that is gone is one problem naming that
/// file in a reader's verify: not a failed verify (the payload log's
/// absence was an error, and the server answered its `/v1/verify` with a
/// 500), and not one problem per node. The rest of the bank is still
/// checked: nothing else is reported. A writer's open is refused naming
/// the file, and changes nothing (a writer recreated a missing segment
/// with zeros, and putting the file back then lost the new rows).
#[test]
fn a_missing_data_file_is_one_problem_naming_it() {
    let (storage, _) = build();
    let data_files: Vec<String> = storage
        .file_names()
        .into_iter()
        .filter(|n| n.starts_with("payloads") || n.ends_with(".seg"))
        .collect();
    assert!(data_files.len() >= 7, "{data_files:?}");
    let read_only = OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    };
    for name in data_files {
        let (storage, _) = build();
        let bytes = storage.file_bytes(&name).unwrap();
        deltamem::storage::Storage::remove(&storage, &name).unwrap();
        let before = all_files(&storage);
        let e = Bank::open(Arc::new(storage.clone()), OpenOptions::default())
            .err()
            .unwrap_or_else(|| panic!("{name}: a writer opened"))
            .to_string();
        assert!(
            e.contains(&name) && e.contains("missing") && e.contains("MANIFEST"),
            "{name}: {e}"
        );
        assert_eq!(all_files(&storage), before, "{name}");
        let bank = Bank::open(Arc::new(storage.clone()), read_only.clone()).unwrap();
        let report = bank.verify().unwrap_or_else(|e| panic!("{name}: verify failed: {e}"));
        assert_eq!(report.problems.len(), 1, "{name}: {:?}", report.problems);
        let Problem { file, detail, .. } = &report.problems[0];
        assert!(
            file.ends_with(&name) && detail.contains(&name),
            "{name}: {file}: {detail}"
        );
        drop(bank);
        storage.set_file_bytes(&name, bytes);
        let bank = Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap();
        assert!(bank.verify().unwrap().is_ok(), "{name}: put back");
    }
}

/// Damage only in the int8 side column (derived from the f32 vectors) is
/// reported by verify, and compact and freeze go ahead: their copy derives
/// every int8 row afresh from the checked f32 vector, so it verifies clean
/// and answers as the undamaged bank did. Damage in the f32 column beside
/// it is still refused.
#[test]
fn compact_and_freeze_rederive_a_damaged_int8_column() {
    let damage_int8 = |storage: &MemStorage| {
        let mut bytes = storage.file_bytes("qvectors-000000.seg").unwrap();
        bytes[1] ^= 0x40;
        storage.set_file_bytes("qvectors-000000.seg", bytes);
    };
    for compact in [true, false] {
        let (storage, queries) = build_in(Precision::Int8);
        let expected = answers(
            &Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap(),
            &queries,
        );
        damage_int8(&storage);
        let mut bank = Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap();
        let problems = bank.verify().unwrap().problems;
        assert!(
            !problems.is_empty() && problems.iter().all(|p| p.file.ends_with("qvectors-000000.seg")),
            "{problems:?}"
        );
        let copy = if compact {
            bank.compact().unwrap();
            bank
        } else {
            let target = MemStorage::new();
            bank.freeze_into(&target).unwrap();
            let read_only = OpenOptions {
                read_only: true,
                ..OpenOptions::default()
            };
            Bank::open(Arc::new(target), read_only).unwrap()
        };
        assert!(copy.verify().unwrap().is_ok(), "compact {compact}");
        // Compared by a digest: a mismatch of ~80 answers is unreadable.
        assert!(
            answers(&copy, &queries) == expected,
            "compact {compact}: answers differ"
        );
    }
    // An int8 file one byte short fails its segment's mapping, which
    // hides the f32 checks of that segment: refused, not mended.
    let (storage, _) = build_in(Precision::Int8);
    let mut bytes = storage.file_bytes("qvectors-000000.seg").unwrap();
    bytes.pop();
    storage.set_file_bytes("qvectors-000000.seg", bytes);
    let mut bank = Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap();
    let e = bank.compact().unwrap_err().to_string();
    assert!(
        e.contains("qvectors-000000.seg") && e.contains("compact refuses"),
        "{e}"
    );
    // With the f32 column damaged as well, both are refused.
    let (storage, _) = build_in(Precision::Int8);
    damage_int8(&storage);
    let mut bytes = storage.file_bytes("vectors-000001.seg").unwrap();
    bytes[3] ^= 0x01;
    storage.set_file_bytes("vectors-000001.seg", bytes);
    let before = all_files(&storage);
    let mut bank = Bank::open(Arc::new(storage.clone()), OpenOptions::default()).unwrap();
    let e = bank.freeze_into(&MemStorage::new()).unwrap_err().to_string();
    assert!(e.contains("vectors-000001.seg") && e.contains("freeze refuses"), "{e}");
    let e = bank.compact().unwrap_err().to_string();
    assert!(e.contains("vectors-000001.seg") && e.contains("compact refuses"), "{e}");
    drop(bank);
    assert_eq!(all_files(&storage), before);
}

/// A MANIFEST whose WAL salt no longer matches a WAL that holds a record
/// past its checkpoint (a forged or damaged salt: no crash leaves one,
/// since a checkpoint's WAL ends at its LSN). The WAL was taken for the
/// stale one a checkpoint replaced: its acknowledged node vanished, verify
/// said ok, and the next writer put a new WAL over it. Every open refuses,
/// naming the WAL and the LSNs, and nothing is changed.
#[test]
fn a_wal_with_records_past_the_checkpoint_is_never_taken_for_a_stale_one() {
    use deltamem::format::manifest::Manifest;
    let (storage, _) = with_a_node_in_the_wal();
    let mut manifest = Manifest::decode(&storage.file_bytes("MANIFEST").unwrap()).unwrap();
    manifest.wal_salt ^= 1;
    storage.set_file_bytes("MANIFEST", manifest.encode().to_vec());
    let before = all_files(&storage);
    for e in open_errors(&storage) {
        assert!(e.contains("wal.log") && e.contains("past the checkpoint"), "{e}");
    }
    assert_eq!(all_files(&storage), before);
}

/// The errors of a writer's and a reader's open of `storage`, each of
/// which must fail.
fn open_errors(storage: &MemStorage) -> Vec<String> {
    [false, true]
        .map(|read_only| {
            let options = OpenOptions {
                read_only,
                ..OpenOptions::default()
            };
            match Bank::open(Arc::new(storage.clone()), options) {
                Ok(_) => panic!("opened (read_only {read_only})"),
                Err(e) => e.to_string(),
            }
        })
        .to_vec()
}

//! Checks `format-spec/FORMAT.md` against the constants in `src/format/`.
//!
//! Every `### Table: <name>` section of the spec is parsed. For each table
//! the rows must tile the structure exactly (contiguous, starting at 0,
//! ending at the structure's size constant), each row's declared type must
//! match its size, and every `*_OFFSET` constant of the format modules must
//! equal the offset the spec gives for the corresponding field. The list of
//! offset constants is itself checked against the source, so adding a
//! constant without documenting it fails this test.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use deltamem::format::{self, manifest, payload, row, wal};

#[derive(Debug, Clone)]
struct SpecRow {
    offset: usize,
    size: usize,
    field: String,
    constraint: String,
    line: usize,
}

fn spec_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("format-spec")
        .join("FORMAT.md")
}

fn spec_text() -> String {
    let path = spec_path();
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn strip_ticks(cell: &str) -> String {
    cell.trim().trim_matches('`').trim().to_string()
}

fn cells(line: &str) -> Vec<String> {
    let inner = line.trim();
    let inner = inner.strip_prefix('|').unwrap_or(inner);
    let inner = inner.strip_suffix('|').unwrap_or(inner);
    // The last column (Constraint) may contain escaped pipes; keep it whole.
    inner.splitn(4, '|').map(|c| c.trim().to_string()).collect()
}

/// Parses every `### Table: <name>` section into its rows.
fn parse_tables(text: &str) -> BTreeMap<String, Vec<SpecRow>> {
    let lines: Vec<&str> = text.lines().collect();
    let mut tables = BTreeMap::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(name) = lines[i].strip_prefix("### Table:") else {
            i += 1;
            continue;
        };
        let name = name.trim().to_string();
        let heading_line = i + 1;
        i += 1;
        // Find the first table line of the section.
        while i < lines.len() && !lines[i].trim_start().starts_with('|') {
            assert!(
                !lines[i].starts_with('#'),
                "FORMAT.md:{heading_line}: section `{name}` has no table before the next heading"
            );
            i += 1;
        }
        assert!(
            i < lines.len(),
            "FORMAT.md:{heading_line}: section `{name}` has no table"
        );
        let header = cells(lines[i]);
        assert_eq!(
            header,
            ["Offset", "Size", "Field", "Constraint"],
            "FORMAT.md:{}: table `{name}` must have columns | Offset | Size | Field | Constraint |",
            i + 1
        );
        i += 1;
        let separator = cells(lines.get(i).copied().unwrap_or(""));
        assert!(
            separator.len() == 4
                && separator
                    .iter()
                    .all(|c| !c.is_empty() && c.chars().all(|ch| "-: ".contains(ch))),
            "FORMAT.md:{}: table `{name}`: expected a separator row",
            i + 1
        );
        i += 1;
        let mut rows = Vec::new();
        while i < lines.len() && lines[i].trim_start().starts_with('|') {
            let c = cells(lines[i]);
            assert_eq!(
                c.len(),
                4,
                "FORMAT.md:{}: table `{name}`: expected 4 cells, got {c:?}",
                i + 1
            );
            let number = |cell: &str, what: &str| -> usize {
                strip_ticks(cell).parse().unwrap_or_else(|_| {
                    panic!(
                        "FORMAT.md:{}: table `{name}`: {what} {cell:?} is not a decimal number",
                        i + 1
                    )
                })
            };
            rows.push(SpecRow {
                offset: number(&c[0], "offset"),
                size: number(&c[1], "size"),
                field: strip_ticks(&c[2]),
                constraint: c[3].clone(),
                line: i + 1,
            });
            i += 1;
        }
        assert!(!rows.is_empty(), "FORMAT.md:{heading_line}: table `{name}` has no rows");
        assert!(
            tables.insert(name.clone(), rows).is_none(),
            "FORMAT.md:{heading_line}: table `{name}` appears twice"
        );
    }
    tables
}

/// The structures the spec must describe, with the code's size for each.
fn expected_sizes() -> Vec<(&'static str, usize)> {
    vec![
        ("Manifest", manifest::MANIFEST_SIZE_BYTES),
        ("Tree entry", manifest::TREE_ENTRY_SIZE_BYTES),
        ("Node row", row::ROW_SIZE_BYTES),
        ("Payload record header", payload::PAYLOAD_HEADER_SIZE_BYTES),
        ("WAL header", wal::WAL_HEADER_SIZE_BYTES),
        ("WAL record header", wal::RECORD_HEADER_SIZE_BYTES),
        ("WAL op header", wal::OP_HEADER_SIZE_BYTES),
    ]
}

/// (table, field as written in the spec, constant name, constant value) for
/// every `*_OFFSET` constant of the format modules.
macro_rules! offsets {
    ($( ($table:expr, $field:expr, $module:ident :: $constant:ident) ),* $(,)?) => {
        vec![$( ($table, $field, stringify!($constant), $module::$constant) ),*]
    };
}

fn offset_constants() -> Vec<(&'static str, &'static str, &'static str, usize)> {
    offsets![
        ("Manifest", "magic", manifest::MAN_MAGIC_OFFSET),
        ("Manifest", "version", manifest::MAN_VERSION_OFFSET),
        ("Manifest", "size_bytes", manifest::MAN_SIZE_OFFSET),
        ("Manifest", "sequence", manifest::MAN_SEQUENCE_OFFSET),
        ("Manifest", "flags", manifest::MAN_FLAGS_OFFSET),
        ("Manifest", "dim_count", manifest::MAN_DIM_OFFSET),
        ("Manifest", "row_stride_bytes", manifest::MAN_STRIDE_OFFSET),
        ("Manifest", "rows_per_segment", manifest::MAN_ROWS_PER_SEGMENT_OFFSET),
        ("Manifest", "eps", manifest::MAN_EPS_OFFSET),
        ("Manifest", "max_depth", manifest::MAN_MAX_DEPTH_OFFSET),
        ("Manifest", "tree_count", manifest::MAN_TREE_COUNT_OFFSET),
        ("Manifest", "precision", manifest::MAN_PRECISION_OFFSET),
        ("Manifest", "consolidate_after", manifest::MAN_CONSOLIDATE_AFTER_OFFSET),
        ("Manifest", "generation", manifest::MAN_GENERATION_OFFSET),
        ("Manifest", "checkpoint_lsn", manifest::MAN_CHECKPOINT_LSN_OFFSET),
        ("Manifest", "node_count", manifest::MAN_NODE_COUNT_OFFSET),
        ("Manifest", "payload_end_bytes", manifest::MAN_PAYLOAD_END_OFFSET),
        ("Manifest", "wal_salt", manifest::MAN_WAL_SALT_OFFSET),
        ("Manifest", "created_unix_ms", manifest::MAN_CREATED_OFFSET),
        ("Manifest", "trees", manifest::MAN_TREES_OFFSET),
        ("Manifest", "crc32", manifest::MAN_CRC_OFFSET),
        ("Tree entry", "tau", manifest::TREE_TAU_OFFSET),
        ("Node row", "index", row::ROW_INDEX_OFFSET),
        ("Node row", "parent", row::ROW_PARENT_OFFSET),
        ("Node row", "tree", row::ROW_TREE_OFFSET),
        ("Node row", "node_type", row::ROW_TYPE_OFFSET),
        ("Node row", "label", row::ROW_LABEL_OFFSET),
        ("Node row", "depth", row::ROW_DEPTH_OFFSET),
        ("Node row", "flags", row::ROW_FLAGS_OFFSET),
        ("Node row", "success_hits", row::ROW_SUCCESS_HITS_OFFSET),
        ("Node row", "retrievals", row::ROW_RETRIEVALS_OFFSET),
        ("Node row", "link", row::ROW_LINK_OFFSET),
        ("Node row", "vector_crc32", row::ROW_VECTOR_CRC_OFFSET),
        ("Node row", "payload_offset_bytes", row::ROW_PAYLOAD_OFFSET_OFFSET),
        ("Node row", "payload_size_bytes", row::ROW_PAYLOAD_SIZE_OFFSET),
        ("Node row", "vector_sum32", row::ROW_VECTOR_SUM_OFFSET),
        ("Node row", "created_unix_ms", row::ROW_CREATED_OFFSET),
        ("Node row", "external_id", row::ROW_EXTERNAL_ID_OFFSET),
        ("Node row", "qvector_sum32", row::ROW_QVECTOR_SUM_OFFSET),
        ("Node row", "crc32", row::ROW_CRC_OFFSET),
        ("Payload record header", "magic", payload::PAY_MAGIC_OFFSET),
        ("Payload record header", "body_size", payload::PAY_BODY_SIZE_OFFSET),
        ("Payload record header", "node_index", payload::PAY_NODE_INDEX_OFFSET),
        ("Payload record header", "crc32", payload::PAY_CRC_OFFSET),
        ("WAL header", "magic", wal::WALH_MAGIC_OFFSET),
        ("WAL header", "version", wal::WALH_VERSION_OFFSET),
        ("WAL header", "salt", wal::WALH_SALT_OFFSET),
        ("WAL header", "start_lsn", wal::WALH_START_LSN_OFFSET),
        ("WAL header", "crc32", wal::WALH_CRC_OFFSET),
        ("WAL record header", "body_size", wal::REC_BODY_SIZE_OFFSET),
        ("WAL record header", "crc32", wal::REC_CRC_OFFSET),
        ("WAL record header", "lsn", wal::REC_LSN_OFFSET),
        ("WAL record header", "kind", wal::REC_KIND_OFFSET),
        ("WAL record header", "op_count", wal::REC_OP_COUNT_OFFSET),
    ]
}

/// Field sizes the code fixes through constants other than offsets.
fn size_constants() -> Vec<(&'static str, &'static str, usize)> {
    vec![
        ("Manifest", "magic", manifest::MANIFEST_MAGIC.len()),
        (
            "Manifest",
            "trees",
            manifest::MAX_TREES * manifest::TREE_ENTRY_SIZE_BYTES,
        ),
        (
            "Manifest",
            "crc32",
            manifest::MANIFEST_SIZE_BYTES - manifest::MAN_CRC_OFFSET,
        ),
        ("Tree entry", "name", manifest::TREE_NAME_MAX_BYTES),
        ("Node row", "external_id", row::EXTERNAL_ID_MAX_BYTES),
        ("Node row", "crc32", row::ROW_SIZE_BYTES - row::ROW_CRC_OFFSET),
        ("Payload record header", "magic", payload::PAYLOAD_MAGIC.len()),
        (
            "Payload record header",
            "crc32",
            payload::PAYLOAD_HEADER_SIZE_BYTES - payload::PAY_CRC_OFFSET,
        ),
        ("WAL header", "magic", wal::WAL_MAGIC.len()),
        ("WAL header", "crc32", wal::WAL_HEADER_SIZE_BYTES - wal::WALH_CRC_OFFSET),
    ]
}

fn field<'a>(tables: &'a BTreeMap<String, Vec<SpecRow>>, table: &str, name: &str) -> &'a SpecRow {
    let rows = tables
        .get(table)
        .unwrap_or_else(|| panic!("FORMAT.md has no `### Table: {table}`"));
    let mut hits = rows.iter().filter(|r| r.field == name);
    let hit = hits
        .next()
        .unwrap_or_else(|| panic!("FORMAT.md: table `{table}` has no field `{name}`"));
    assert!(
        hits.next().is_none(),
        "FORMAT.md: table `{table}` has field `{name}` twice"
    );
    hit
}

/// Size implied by the type at the start of a Constraint cell, if any.
fn declared_size(constraint: &str) -> Option<usize> {
    let start = constraint.find('`')? + 1;
    let len = constraint[start..].find('`')?;
    let ty = &constraint[start..start + len];
    let scalar = |t: &str| match t {
        "u8" => Some(1),
        "u16" => Some(2),
        "u32" | "f32" => Some(4),
        "u64" => Some(8),
        "TreeEntry" => Some(manifest::TREE_ENTRY_SIZE_BYTES),
        _ => None,
    };
    if let Some(n) = scalar(ty) {
        return Some(n);
    }
    let inner = ty.strip_prefix('[')?.strip_suffix(']')?;
    let (elem, count) = inner.split_once(';')?;
    Some(scalar(elem.trim())? * count.trim().parse::<usize>().ok()?)
}

#[test]
fn tables_tile_their_structures() {
    let tables = parse_tables(&spec_text());
    let expected = expected_sizes();
    let expected_names: BTreeSet<&str> = expected.iter().map(|(n, _)| *n).collect();
    for name in tables.keys() {
        assert!(
            expected_names.contains(name.as_str()),
            "FORMAT.md: unexpected table `{name}` (not checked by this test)"
        );
    }
    for (name, size_bytes) in expected {
        let rows = tables
            .get(name)
            .unwrap_or_else(|| panic!("FORMAT.md has no `### Table: {name}`"));
        let mut at = 0usize;
        for r in rows {
            assert!(r.size > 0, "FORMAT.md:{}: `{name}`.`{}` has size 0", r.line, r.field);
            assert_eq!(
                r.offset, at,
                "FORMAT.md:{}: `{name}`.`{}` starts at {} but the previous row ends at {at}",
                r.line, r.field, r.offset
            );
            at = r.offset + r.size;
        }
        assert_eq!(
            at, size_bytes,
            "FORMAT.md: table `{name}` ends at {at}, the code's size is {size_bytes}"
        );
    }
}

#[test]
fn field_names_are_unique_and_typed() {
    let tables = parse_tables(&spec_text());
    for (name, rows) in &tables {
        let mut seen = BTreeSet::new();
        for r in rows {
            assert!(
                !r.field.is_empty()
                    && r.field
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "FORMAT.md:{}: `{name}`: field {:?} is not a snake_case identifier",
                r.line,
                r.field
            );
            if r.field != "reserved" {
                assert!(
                    seen.insert(r.field.clone()),
                    "FORMAT.md:{}: `{name}`: field `{}` appears twice",
                    r.line,
                    r.field
                );
            } else {
                assert!(
                    r.constraint.contains("zero"),
                    "FORMAT.md:{}: `{name}`: reserved bytes must be documented as zero",
                    r.line
                );
            }
            let declared = declared_size(&r.constraint).unwrap_or_else(|| {
                panic!(
                    "FORMAT.md:{}: `{name}`.`{}`: Constraint must start with a type in backticks",
                    r.line, r.field
                )
            });
            assert_eq!(
                declared, r.size,
                "FORMAT.md:{}: `{name}`.`{}`: type in Constraint is {declared} bytes, Size column says {}",
                r.line, r.field, r.size
            );
        }
    }
}

#[test]
fn offsets_match_code_constants() {
    let tables = parse_tables(&spec_text());
    for (table, name, constant, value) in offset_constants() {
        let r = field(&tables, table, name);
        assert_eq!(
            r.offset, value,
            "FORMAT.md:{}: `{table}`.`{name}` is at offset {} but {constant} = {value}",
            r.line, r.offset
        );
    }
    for (table, name, size) in size_constants() {
        let r = field(&tables, table, name);
        assert_eq!(
            r.size, size,
            "FORMAT.md:{}: `{table}`.`{name}` has size {} but the code uses {size}",
            r.line, r.size
        );
    }
    // Fields at fixed offsets without a dedicated constant.
    assert_eq!(field(&tables, "Tree entry", "name").offset, 0);
    assert_eq!(field(&tables, "WAL op header", "op_kind").offset, 0);
}

/// Every `pub const *_OFFSET` in `src/format/` must be in `offset_constants`.
#[test]
fn every_offset_constant_is_documented() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src").join("format");
    let mut in_source = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for line in text.lines() {
            let Some(rest) = line.trim_start().strip_prefix("pub const ") else {
                continue;
            };
            let ident: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if ident.ends_with("_OFFSET") {
                in_source.insert(ident);
            }
        }
    }
    let listed: BTreeSet<String> = offset_constants().iter().map(|(_, _, c, _)| c.to_string()).collect();
    let missing: Vec<_> = in_source.difference(&listed).collect();
    assert!(
        missing.is_empty(),
        "offset constants not checked against FORMAT.md (add them to offset_constants): {missing:?}"
    );
    let stale: Vec<_> = listed.difference(&in_source).collect();
    assert!(
        stale.is_empty(),
        "offset_constants lists constants not found in src/format: {stale:?}"
    );
}

fn escaped(magic: &[u8]) -> String {
    magic
        .iter()
        .map(|&b| {
            if b == 0 {
                "\\0".to_string()
            } else {
                (b as char).to_string()
            }
        })
        .collect()
}

#[test]
fn magics_and_version_are_documented() {
    let text = spec_text();
    let tables = parse_tables(&text);
    for (table, magic) in [
        ("Manifest", &manifest::MANIFEST_MAGIC[..]),
        ("WAL header", &wal::WAL_MAGIC[..]),
        ("Payload record header", &payload::PAYLOAD_MAGIC[..]),
    ] {
        let shown = escaped(magic);
        assert!(
            text.contains(&format!("`{shown}`")),
            "FORMAT.md does not mention magic `{shown}`"
        );
        let r = field(&tables, table, "magic");
        assert!(
            r.constraint.contains(&shown),
            "FORMAT.md:{}: `{table}`.`magic` should be `{shown}`",
            r.line
        );
        let hex: Vec<String> = magic.iter().map(|b| format!("{b:02X}")).collect();
        assert!(
            text.contains(&hex.join(" ")),
            "FORMAT.md does not give the bytes of magic `{shown}` ({})",
            hex.join(" ")
        );
    }
    let r = field(&tables, "Manifest", "version");
    assert!(
        r.constraint.contains(&format!(
            "{} or {}",
            format::OLDEST_FORMAT_VERSION,
            format::FORMAT_VERSION
        )),
        "FORMAT.md:{}: `Manifest`.`version` should be {} or {}",
        r.line,
        format::OLDEST_FORMAT_VERSION,
        format::FORMAT_VERSION
    );
    let r = field(&tables, "WAL header", "version");
    assert!(
        r.constraint.contains(&format!("= {}", format::WAL_FORMAT_VERSION)),
        "FORMAT.md:{}: `WAL header`.`version` should be = {}",
        r.line,
        format::WAL_FORMAT_VERSION
    );
    let r = field(&tables, "Manifest", "size_bytes");
    assert!(
        r.constraint.contains(&format!("= {}", manifest::MANIFEST_SIZE_BYTES)),
        "FORMAT.md:{}",
        r.line
    );
}

#[test]
fn documented_constants_hold() {
    let text = spec_text();
    // CRC-32/ISO-HDLC check value, as the spec states.
    assert!(text.contains("0xCBF43926"));
    assert_eq!(format::crc32(b"123456789"), 0xCBF4_3926);
    assert_eq!(format::NODE_NONE, 0xFFFF_FFFF);
    assert!(text.contains("0xFFFFFFFF"));
    assert_eq!(format::MAX_DIM_COUNT, 16_384);
    assert!(text.contains("1..=16384"));
    assert_eq!(format::MAX_PAYLOAD_BYTES, 4 * 1024 * 1024);
    assert_eq!(manifest::MAX_TREES, 16);
    assert_eq!(manifest::TREE_NAME_MAX_BYTES, 40);
    assert_eq!(wal::MAX_RECORD_BODY_BYTES, 67_108_864);
    assert!(text.contains("67,108,864"));
    assert_eq!((wal::RECORD_KIND_TXN, wal::OP_PUT_NODE, wal::OP_PUT_ROW), (1, 1, 2));
    assert_eq!(payload::ZSTD_LEVEL, 3);
    // Row flag bits as listed in the flags table.
    assert_eq!(
        [
            row::FLAG_CONSOLIDATED,
            row::FLAG_CONSOLIDATED_ROOT,
            row::FLAG_HAS_EXTERNAL_ID,
            row::FLAG_EXTERNAL_ID_UUID
        ],
        [1, 2, 4, 8]
    );
    assert_eq!(manifest::MANIFEST_FLAG_FROZEN, 1);
    // Vector stride and default segment geometry.
    assert_eq!(format::VECTOR_ALIGN_BYTES, 64);
    assert_eq!(format::vector_stride_bytes(17), 128);
    // Rows of `row_stride_bytes` each, so f16 segments hold twice the rows.
    assert_eq!(format::default_rows_per_segment(64), 65_536);
    assert_eq!(format::default_rows_per_segment(65_536), 1024);
    assert_eq!(format::default_rows_per_segment(3072), 16_384); // f32, dim 768
    assert_eq!(format::default_rows_per_segment(1536), 32_768); // f16, dim 768
    // Segment cap and the smallest segment init accepts (§10).
    assert_eq!(format::MAX_SEGMENT_COUNT, 4096);
    assert_eq!(format::INIT_MIN_ROWS_PER_SEGMENT, 1024);
}

/// Every `reserved` row of a table is a range the decoder checks for
/// zeros, and the decoder checks no other range: the code's named ranges
/// equal the spec's reserved rows (issue 11: the WAL header's 12..16 and
/// 32..60 were documented but never checked).
#[test]
fn reserved_ranges_match_code_constants() {
    use std::ops::Range;
    let tables = parse_tables(&spec_text());
    let cases: Vec<(&str, Vec<Range<usize>>)> = vec![
        ("Manifest", manifest::MANIFEST_RESERVED.to_vec()),
        ("Tree entry", manifest::TREE_ENTRY_RESERVED.to_vec()),
        ("Node row", row::ROW_RESERVED.to_vec()),
        ("WAL header", wal::WAL_HEADER_RESERVED.to_vec()),
        ("WAL record header", wal::RECORD_RESERVED.to_vec()),
        ("WAL op header", wal::OP_HEADER_RESERVED.to_vec()),
    ];
    for (table, code) in cases {
        let rows = tables
            .get(table)
            .unwrap_or_else(|| panic!("FORMAT.md has no `### Table: {table}`"));
        let spec: Vec<Range<usize>> = rows
            .iter()
            .filter(|r| r.field == "reserved")
            .map(|r| r.offset..r.offset + r.size)
            .collect();
        assert_eq!(
            spec, code,
            "FORMAT.md `{table}` reserved rows vs the code's reserved ranges"
        );
    }
}

//! Writing a bank tree in the reference's current schema, byte-compatible
//! with what its `save_tree` writes (`json.dump(indent=2)`, BFS order, the
//! placeholder root first).

use std::collections::BTreeMap;
use std::io::Write;

use serde_json::{Map, Value};

use super::{
    LEGACY_PAYLOAD_KEYS, META_KEYS, PAYLOAD_KEYS, REFERENCE_META_FIELD, REFERENCE_PAYLOAD_FIELD, placeholder_scenario,
};
use crate::Bank;
use crate::format::payload::Payload;
use crate::format::row::Row;
use crate::interop::InteropError;
use crate::interop::pyjson::{Layout, PyValue, write_value};

#[derive(Debug, Clone, Default)]
pub struct ExportOptions {
    /// `meta.timestamp`; None writes the current time (as the reference).
    pub timestamp_s: Option<i64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ExportReport {
    /// Nodes written, without the placeholder.
    pub nodes: u64,
    pub max_depth: u32,
}

/// A stable, UUID-shaped id (version 4 layout) for a node that has no
/// external id: the same bank gives the same id on every export.
pub fn synthetic_uuid(seed: u64, index: u32) -> String {
    let mix = |mut x: u64| {
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    };
    let hi = mix(seed ^ u64::from(index).rotate_left(32));
    let lo = mix(hi ^ u64::from(index) ^ 0x5bd1_e995);
    let hi = (hi & !0xF000) | 0x4000; // version 4
    let lo = (lo & !(0xC << 60)) | (0x8 << 60); // RFC 4122 variant
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&hi.to_be_bytes());
    bytes[8..].copy_from_slice(&lo.to_be_bytes());
    crate::format::row::format_uuid(&bytes)
}

/// The nodes of one tree in the order the reference saves them.
struct TreeView {
    rows: BTreeMap<u32, Row>,
    children: BTreeMap<u32, Vec<u32>>,
    roots: Vec<u32>,
    bfs: Vec<u32>,
    seed: u64,
}

impl TreeView {
    fn load(bank: &Bank, tree_name: &str) -> Result<TreeView, InteropError> {
        let tree = bank.tree_index(tree_name)?;
        let mut view = TreeView {
            rows: BTreeMap::new(),
            children: BTreeMap::new(),
            roots: Vec::new(),
            bfs: Vec::new(),
            seed: bank.manifest().created_unix_ms,
        };
        for index in 0..bank.node_count() {
            let row = bank.row(index)?;
            if row.tree != tree {
                continue;
            }
            match row.parent() {
                Some(p) => view.children.entry(p).or_default().push(index),
                None => view.roots.push(index),
            }
            view.rows.insert(index, row);
        }
        let mut queue: std::collections::VecDeque<u32> = view.roots.iter().copied().collect();
        while let Some(i) = queue.pop_front() {
            view.bfs.push(i);
            queue.extend(view.children.get(&i).into_iter().flatten());
        }
        Ok(view)
    }

    fn node_id(&self, index: u32) -> String {
        self.rows[&index]
            .external_id_text()
            .unwrap_or_else(|| synthetic_uuid(self.seed, index))
    }

    fn child_ids(&self, index: u32) -> PyValue {
        let kids = self.children.get(&index).map_or(&[][..], Vec::as_slice);
        PyValue::List(kids.iter().map(|&k| PyValue::Str(self.node_id(k))).collect())
    }

    fn max_depth(&self) -> u32 {
        self.rows.values().map(|r| u32::from(r.depth)).max().unwrap_or(0)
    }
}

/// Writes tree `tree` as a reference file.
pub fn export_tree(
    bank: &Bank,
    tree: &str,
    out: &mut impl Write,
    options: &ExportOptions,
) -> Result<ExportReport, InteropError> {
    let view = TreeView::load(bank, tree)?;
    let timestamp = options.timestamp_s.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64)
    });
    let header = PyValue::Dict(vec![
        ("tree_name".into(), PyValue::str(tree)),
        ("timestamp".into(), PyValue::Int(timestamp)),
        (
            "stats".into(),
            PyValue::Dict(vec![
                ("total_nodes".into(), PyValue::UInt(view.rows.len() as u64 + 1)),
                ("max_depth".into(), PyValue::UInt(u64::from(view.max_depth()))),
            ]),
        ),
    ]);
    let layout = Layout { indent: Some(2) };
    out.write_all(b"{\n  \"meta\": ").map_err(output_error)?;
    write_value(out, &header, layout, 1).map_err(output_error)?;
    out.write_all(b",\n  \"nodes\": [\n    ").map_err(output_error)?;
    write_value(out, &placeholder(bank, tree, &view), layout, 2).map_err(output_error)?;
    for &index in &view.bfs {
        out.write_all(b",\n    ").map_err(output_error)?;
        write_value(out, &node_value(bank, &view, index, true)?, layout, 2).map_err(output_error)?;
    }
    out.write_all(b"\n  ]\n}").map_err(output_error)?;
    Ok(ExportReport {
        nodes: view.bfs.len() as u64,
        max_depth: view.max_depth(),
    })
}

/// A failed write to the stream an export was given (its caller names
/// the stream: `InteropError::naming_output`).
fn output_error(source: std::io::Error) -> InteropError {
    InteropError::Io {
        op: "write",
        file: crate::interop::UNNAMED_OUTPUT.into(),
        source,
    }
}

/// Writes tree `tree` as JSON Lines: one node object per line (the
/// reference's node schema plus the bank `id` and `depth` first), BFS
/// order, no placeholder (top-level roots have `parent_id: null`).
pub fn export_jsonl(bank: &Bank, tree: &str, out: &mut impl Write) -> Result<ExportReport, InteropError> {
    let view = TreeView::load(bank, tree)?;
    for &index in &view.bfs {
        let PyValue::Dict(fields) = node_value(bank, &view, index, false)? else {
            unreachable!("node_value builds a dict");
        };
        let mut line = vec![
            ("id".to_string(), PyValue::UInt(u64::from(index))),
            ("depth".to_string(), PyValue::UInt(u64::from(view.rows[&index].depth))),
        ];
        line.extend(fields);
        write_value(out, &PyValue::Dict(line), Layout { indent: None }, 0).map_err(output_error)?;
        out.write_all(b"\n").map_err(output_error)?;
    }
    Ok(ExportReport {
        nodes: view.bfs.len() as u64,
        max_depth: view.max_depth(),
    })
}

fn placeholder(bank: &Bank, tree: &str, view: &TreeView) -> PyValue {
    let created_s = bank.manifest().created_unix_ms / 1000;
    let meta = vec![
        ("node_type", PyValue::str("ROOT")),
        ("result_status", PyValue::str("SUCCESS")),
        ("created_at", PyValue::UInt(created_s)),
        ("usage_count", PyValue::UInt(0)),
        ("hit_count", PyValue::UInt(0)),
        ("success_count", PyValue::UInt(0)),
        ("is_consolidated", PyValue::Bool(false)),
        ("episode_idx", PyValue::Null),
        ("is_consolidated_root", PyValue::Bool(false)),
    ];
    let mut payload = vec![(
        "scenario_description".to_string(),
        PyValue::Str(placeholder_scenario(tree)),
    )];
    payload.extend(PAYLOAD_KEYS[1..].iter().map(|k| (k.to_string(), PyValue::Null)));
    let zeros = vec![PyValue::Float(0.0); bank.dim_count() as usize];
    PyValue::Dict(vec![
        ("node_id".into(), PyValue::Str(placeholder_id(view, tree))),
        ("parent_id".into(), PyValue::Null),
        (
            "children_ids".into(),
            PyValue::List(view.roots.iter().map(|&r| PyValue::Str(view.node_id(r))).collect()),
        ),
        (
            "meta".into(),
            PyValue::Dict(meta.into_iter().map(|(k, v)| (k.into(), v)).collect()),
        ),
        (
            "index".into(),
            PyValue::Dict(vec![("embedding".into(), PyValue::List(zeros))]),
        ),
        ("payload".into(), PyValue::Dict(payload)),
    ])
}

/// Why a node's payload fields cannot be written in the reference schema
/// and read back as they are, if so: a field named like the scenario's key
/// would be dropped (the file has one such key), a legacy key whose
/// current key is absent would be read back under the current key, and
/// the reserved fields (`reference_payload`, `reference_meta`) must hold
/// only what an import puts there (`reserved_field_problem`).
fn unrepresentable_field(
    fields: &BTreeMap<String, String>,
    kept: &Map<String, Value>,
    kept_meta: &Map<String, Value>,
) -> Option<String> {
    // Only a field stored by an insert can meet any case: an import
    // keeps none (its non-string values, in `kept`, read back as they
    // were read the first time).
    let has = |key: &str| fields.contains_key(key) || kept.get(key).is_some_and(|v| !v.is_null());
    if let Some(problem) = reserved_field_problem(fields, kept, kept_meta) {
        return Some(problem);
    }
    if fields.contains_key(PAYLOAD_KEYS[0]) {
        return Some(format!(
            "payload field {:?} would collide with the scenario, which the reference file keeps under that key",
            PAYLOAD_KEYS[0]
        ));
    }
    LEGACY_PAYLOAD_KEYS
        .iter()
        .find(|(legacy, current)| fields.contains_key(*legacy) && !has(current))
        .map(|(legacy, current)| {
            format!(
                "payload field {legacy:?} without a field {current:?} would be read back as {current:?} \
             (the reference's legacy name for it)"
            )
        })
}

/// Meta keys an import reads into the bank's columns and so never keeps
/// in `reference_meta`: kept there (by an insert), export would write the
/// column's value over them, or set a flag the row does not have.
const META_KEYS_NEVER_KEPT: [&str; 6] = [
    "result_status",
    "created_at",
    "hit_count",
    "success_count",
    "is_consolidated",
    "is_consolidated_root",
];

/// What in the reserved fields an import could not have put there: a
/// `reference_payload` key that is also a field of its own (the file would
/// hold the key twice and one value would be lost) or the scenario's key,
/// and in `reference_meta` a key in `META_KEYS_NEVER_KEPT` or a
/// `node_type` an import refuses.
fn reserved_field_problem(
    fields: &BTreeMap<String, String>,
    kept: &Map<String, Value>,
    kept_meta: &Map<String, Value>,
) -> Option<String> {
    // An import keeps a payload key named like a reserved field in
    // `reference_payload` (the reserved fields themselves are not written
    // as fields), so only the others can collide.
    let internal = [REFERENCE_META_FIELD, REFERENCE_PAYLOAD_FIELD];
    let collides = |k: &String| (fields.contains_key(k) && !internal.contains(&k.as_str())) || k == PAYLOAD_KEYS[0];
    if let Some(key) = kept.keys().find(|k| collides(k)) {
        return Some(format!(
            "payload field {REFERENCE_PAYLOAD_FIELD} holds key {key:?}, which the node's payload has already: \
             the file cannot hold both"
        ));
    }
    if let Some(key) = kept_meta.keys().find(|k| META_KEYS_NEVER_KEPT.contains(&k.as_str())) {
        return Some(format!(
            "payload field {REFERENCE_META_FIELD} holds meta key {key:?}, which the file takes from the bank's \
             own column: its value would be lost"
        ));
    }
    match kept_meta.get("node_type") {
        Some(Value::String(t)) if t == "ROOT" || t == "RESIDUAL" => None,
        None => None,
        Some(other) => Some(format!(
            "payload field {REFERENCE_META_FIELD} holds node_type {other}, which an import refuses \
             (\"ROOT\" or \"RESIDUAL\")"
        )),
    }
}

/// A JSON-object payload field, or an error naming the node.
fn json_field(fields: &BTreeMap<String, String>, key: &str, node_id: &str) -> Result<Map<String, Value>, InteropError> {
    let Some(text) = fields.get(key) else {
        return Ok(Map::new());
    };
    match serde_json::from_str(text) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(InteropError::Node {
            file: "the bank".into(),
            node_id: node_id.to_string(),
            detail: format!("payload field {key} is not a JSON object"),
        }),
    }
}

/// A node's payload with its reserved fields read: (payload,
/// `reference_meta`, `reference_payload`).
type ReadPayload = (Payload, Map<String, Value>, Map<String, Value>);

/// A node's payload with its reserved fields read, or why the reference
/// schema cannot carry it back as it is (naming the node).
fn exportable_payload(bank: &Bank, index: u32, node_id: &str) -> Result<ReadPayload, InteropError> {
    let payload = bank.payload(index)?;
    // Named by its index, which `dump` shows, as well as by the id the
    // file would give it (made up for a node without an external id).
    let named = format!("{index} (exported as {node_id})");
    let ref_meta = json_field(&payload.fields, REFERENCE_META_FIELD, &named)?;
    let ref_payload = json_field(&payload.fields, REFERENCE_PAYLOAD_FIELD, &named)?;
    if let Some(detail) = unrepresentable_field(&payload.fields, &ref_payload, &ref_meta) {
        return Err(InteropError::Node {
            file: "the bank".into(),
            node_id: named,
            detail,
        });
    }
    Ok((payload, ref_meta, ref_payload))
}

/// Refuses, as an export would part-way, a tree with a node the export
/// cannot write: run before writing where a refused export cannot be
/// taken back (stdout), so that it writes all or nothing. Reads every
/// payload once (~1 s a million nodes).
pub fn check_exportable(bank: &Bank, tree: &str) -> Result<(), InteropError> {
    let view = TreeView::load(bank, tree)?;
    for &index in &view.bfs {
        exportable_payload(bank, index, &view.node_id(index))?;
    }
    Ok(())
}

fn node_value(bank: &Bank, view: &TreeView, index: u32, with_placeholder: bool) -> Result<PyValue, InteropError> {
    let row = &view.rows[&index];
    let node_id = view.node_id(index);
    let (payload, ref_meta, ref_payload) = exportable_payload(bank, index, &node_id)?;
    let parent_id = match row.parent() {
        Some(p) => PyValue::Str(view.node_id(p)),
        None if with_placeholder => PyValue::Str(placeholder_id(view, bank.tree_name(row.tree))),
        None => PyValue::Null,
    };
    let embedding = bank
        .vector(index)?
        .into_iter()
        .map(|x| PyValue::Float(f64::from(x)))
        .collect();
    Ok(PyValue::Dict(vec![
        ("node_id".into(), PyValue::Str(node_id)),
        ("parent_id".into(), parent_id),
        ("children_ids".into(), view.child_ids(index)),
        ("meta".into(), meta_value(row, &ref_meta)),
        (
            "index".into(),
            PyValue::Dict(vec![("embedding".into(), PyValue::List(embedding))]),
        ),
        (
            "payload".into(),
            payload_value(&payload.scenario, &payload.fields, &ref_payload),
        ),
    ]))
}

/// The placeholder's id: synthetic, but stable per bank and tree.
fn placeholder_id(view: &TreeView, tree_name: &str) -> String {
    let tree_seed = crate::format::crc32(tree_name.as_bytes());
    synthetic_uuid(view.seed ^ u64::from(tree_seed), u32::MAX)
}

fn seconds(unix_ms: u64) -> PyValue {
    if unix_ms.is_multiple_of(1000) {
        PyValue::UInt(unix_ms / 1000)
    } else {
        PyValue::Float(unix_ms as f64 / 1000.0)
    }
}

/// The meta object: bank columns, with what `reference_meta` kept from the
/// imported file where the bank has no column for it (the keys it may
/// hold: `reserved_field_problem`).
fn meta_value(row: &Row, kept: &Map<String, Value>) -> PyValue {
    let kept_or = |key: &str, fallback: PyValue| kept.get(key).map_or(fallback, PyValue::from);
    let mut meta = vec![
        (
            "node_type".to_string(),
            kept_or("node_type", PyValue::str(row.node_type.as_str())),
        ),
        ("result_status".into(), PyValue::str(row.label.as_str())),
        ("created_at".into(), seconds(row.created_unix_ms)),
        (
            "usage_count".into(),
            kept_or("usage_count", PyValue::UInt(u64::from(row.retrievals))),
        ),
        ("hit_count".into(), PyValue::UInt(u64::from(row.retrievals))),
        ("success_count".into(), PyValue::UInt(u64::from(row.success_hits))),
        ("is_consolidated".into(), PyValue::Bool(row.is_consolidated())),
        ("episode_idx".into(), kept_or("episode_idx", PyValue::Null)),
        ("is_consolidated_root".into(), PyValue::Bool(row.is_consolidated_root())),
    ];
    for (key, v) in kept.iter().filter(|(k, _)| !META_KEYS.contains(&k.as_str())) {
        meta.push((key.clone(), PyValue::from(v)));
    }
    PyValue::Dict(meta)
}

fn payload_value(scenario: &str, fields: &BTreeMap<String, String>, kept: &Map<String, Value>) -> PyValue {
    let mut out = vec![("scenario_description".to_string(), PyValue::str(scenario))];
    for key in &PAYLOAD_KEYS[1..] {
        let value = kept
            .get(*key)
            .map_or_else(|| PyValue::opt_str(fields.get(*key)), PyValue::from);
        out.push((key.to_string(), value));
    }
    let internal = [REFERENCE_META_FIELD, REFERENCE_PAYLOAD_FIELD];
    for (key, text) in fields {
        if !PAYLOAD_KEYS.contains(&key.as_str()) && !internal.contains(&key.as_str()) {
            out.push((key.clone(), PyValue::str(text.as_str())));
        }
    }
    for (key, v) in kept.iter().filter(|(k, _)| !PAYLOAD_KEYS.contains(&k.as_str())) {
        out.push((key.clone(), PyValue::from(v)));
    }
    PyValue::Dict(out)
}

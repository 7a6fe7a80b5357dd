//! Reading a reference tree file into checked, parent-first nodes. Nothing
//! here touches a bank: every problem a file can have is found before the
//! import writes anything.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::Read;
use std::path::Path;

use serde_json::{Map, Value};

use super::keys;
use super::{LEGACY_PAYLOAD_KEYS, PAYLOAD_KEYS, PLACEHOLDER_MARKER, REFERENCE_META_FIELD, REFERENCE_PAYLOAD_FIELD};
use crate::format::payload::Payload;
use crate::format::row::{Label, NodeType};
use crate::interop::InteropError;

/// One node of a reference tree, with the placeholder already dropped.
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceNode {
    pub node_id: String,
    /// Index of this node in the file's `nodes` array (for messages).
    pub file_position: usize,
    /// Parent as an index into [`ReferenceTree::nodes`]; None for a
    /// top-level root.
    pub parent: Option<usize>,
    /// 1 for a top-level root (the placeholder would be 0).
    pub depth: u32,
    /// The type its position gives it (what the bank will store).
    pub node_type: NodeType,
    /// `meta.node_type` as written, if it disagrees with `node_type`.
    pub file_node_type: Option<String>,
    pub label: Label,
    pub created_unix_ms: Option<u64>,
    pub success_hits: u32,
    pub retrievals: u32,
    pub consolidated: bool,
    pub consolidated_root: bool,
    /// Scenario and string fields (plus `reference_payload` if needed).
    pub payload: Payload,
    /// Meta entries the bank has no column for, as written.
    pub extra_meta: BTreeMap<String, Value>,
    pub embedding: Vec<f32>,
}

/// A parsed reference file.
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceTree {
    pub file: String,
    pub tree_name: Option<String>,
    /// Ids of the placeholder roots that were dropped.
    pub placeholder_ids: Vec<String>,
    /// Embedding length of the placeholders (they have no other use).
    pub placeholder_dim_counts: Vec<usize>,
    /// Parent-first (breadth-first) order; siblings keep their file order.
    pub nodes: Vec<ReferenceNode>,
    /// True if any node uses the legacy payload keys.
    pub legacy_schema: bool,
    /// Things worth telling the user that are not errors.
    pub notes: Vec<String>,
}

impl ReferenceTree {
    pub fn max_depth(&self) -> u32 {
        self.nodes.iter().map(|n| n.depth).max().unwrap_or(0)
    }
}

/// Reads and checks a reference file, parsed as it is read: the file's
/// bytes are never all in memory, nor its embeddings as JSON values (a
/// 351 MB file peaked at 1.16 GB of heap when both were).
pub fn read_reference(path: &Path) -> Result<ReferenceTree, InteropError> {
    let file = std::fs::File::open(path).map_err(InteropError::io("read", path))?;
    let read_bytes = Cell::new(0u64);
    let counted = Counted {
        file,
        read_bytes: &read_bytes,
    };
    let mut de = serde_json::Deserializer::from_reader(std::io::BufReader::with_capacity(1 << 20, counted));
    let name = path.display().to_string();
    match keys::parse_document(&mut de) {
        Ok(doc) => build(doc, &name),
        Err(e) if e.is_io() => Err(InteropError::io("read", path)(std::io::Error::other(e))),
        Err(e) => Err(placed_as_in_memory(path, read_bytes.get(), &name).unwrap_or_else(|| json_error(e, &name))),
    }
}

/// A file that counts the bytes read from it.
struct Counted<'a> {
    file: std::fs::File,
    read_bytes: &'a Cell<u64>,
}

impl Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        self.read_bytes.set(self.read_bytes.get() + n as u64);
        Ok(n)
    }
}

/// Largest prefix of a file parsed again to place its error.
const REPARSE_MAX_BYTES: u64 = 256 << 20;

/// serde_json places two errors one byte later when it reads a stream
/// than when it reads memory: a repeated key (at the `:` after it, not at
/// its closing quote) and a number out of range (past the byte after it:
/// the next line, when the number ends one). On this failure path only,
/// the bytes read up to the error are parsed again from memory (a regular
/// file, at most `REPARSE_MAX_BYTES`), so an error reads the same however
/// the file was parsed. None if that parse finds no error but the end of
/// its bytes.
fn placed_as_in_memory(path: &Path, read_bytes: u64, name: &str) -> Option<InteropError> {
    let regular = std::fs::metadata(path).ok()?.is_file();
    if !regular || read_bytes > REPARSE_MAX_BYTES {
        return None;
    }
    let mut prefix = Vec::with_capacity(read_bytes as usize);
    let file = std::fs::File::open(path).ok()?;
    file.take(read_bytes).read_to_end(&mut prefix).ok()?;
    let e = keys::parse_document(&mut serde_json::Deserializer::from_slice(&prefix)).err()?;
    (!e.is_eof()).then(|| json_error(e, name))
}

/// Parses a reference document; `file` names it in messages.
pub fn parse_reference(bytes: &[u8], file: &str) -> Result<ReferenceTree, InteropError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let doc = keys::parse_document(&mut de).map_err(|e| json_error(e, file))?;
    build(doc, file)
}

fn json_error(e: serde_json::Error, file: &str) -> InteropError {
    InteropError::Json {
        file: file.to_string(),
        line: e.line(),
        column: e.column(),
        detail: e.to_string().split(" at line ").next().unwrap_or_default().to_string(),
    }
}

fn build(doc: keys::Document, file: &str) -> Result<ReferenceTree, InteropError> {
    let ctx = Ctx {
        file,
        embeddings: RefCell::new(doc.embeddings),
    };
    let top = doc
        .value
        .as_object()
        .ok_or_else(|| ctx.invalid("the document is not a JSON object"))?;
    if let Some(key) = keys::unknown_key(top, &keys::TOP_KEYS) {
        return Err(ctx.invalid(format!(
            "unknown top-level key {key:?} (a reference file holds \"meta\" and \"nodes\")"
        )));
    }
    let raw_nodes = match top.get("nodes") {
        Some(Value::Array(items)) => items,
        _ => return Err(ctx.invalid("missing \"nodes\" array")),
    };
    let tree_name = top
        .get("meta")
        .and_then(|m| m.get("tree_name"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let skeleton = ctx.skeleton(raw_nodes)?;
    let order = ctx.parent_first_order(&skeleton)?;
    let mut tree = ReferenceTree {
        file: file.to_string(),
        tree_name,
        placeholder_ids: Vec::new(),
        placeholder_dim_counts: Vec::new(),
        nodes: Vec::with_capacity(order.len()),
        legacy_schema: false,
        notes: Vec::new(),
    };
    for &p in &skeleton.placeholders {
        let s = &skeleton.entries[p];
        tree.placeholder_ids.push(s.id.clone());
        tree.placeholder_dim_counts
            .push(ctx.embeddings.borrow().get(&p).map_or(0, |e| e.len));
    }
    let mut new_position = HashMap::new();
    for (depth, position) in order {
        let entry = &skeleton.entries[position];
        let parent = entry.parent.and_then(|p| new_position.get(&p).copied());
        let node = ctx.node(entry, position, parent, depth, &mut tree)?;
        new_position.insert(position, tree.nodes.len());
        tree.nodes.push(node);
    }
    Ok(tree)
}

struct Ctx<'a> {
    file: &'a str,
    /// Each node's embedding by file position, taken as its node is built.
    embeddings: RefCell<HashMap<usize, keys::Embedding>>,
}

/// The links of one node, before its content is looked at.
struct Entry<'a> {
    id: String,
    obj: &'a Map<String, Value>,
    /// File position of the parent (None: no parent, or a placeholder).
    parent: Option<usize>,
    parent_is_placeholder: bool,
}

struct Skeleton<'a> {
    entries: Vec<Entry<'a>>,
    placeholders: Vec<usize>,
    children: HashMap<usize, Vec<usize>>,
}

fn scenario_of(obj: &Map<String, Value>) -> &str {
    obj.get("payload")
        .and_then(|p| p.get("scenario_description"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

impl Ctx<'_> {
    fn invalid(&self, detail: impl Into<String>) -> InteropError {
        InteropError::Invalid {
            file: self.file.to_string(),
            detail: detail.into(),
        }
    }

    fn node_error(&self, node_id: &str, detail: impl Into<String>) -> InteropError {
        InteropError::Node {
            file: self.file.to_string(),
            node_id: node_id.to_string(),
            detail: detail.into(),
        }
    }

    /// Refuses a key a node does not hold (in the node or its `index`):
    /// the import would drop it.
    fn known_keys(&self, id: &str, obj: &Map<String, Value>) -> Result<(), InteropError> {
        let index = obj.get("index").and_then(Value::as_object);
        let unknown = keys::unknown_key(obj, &keys::NODE_KEYS)
            .map(str::to_string)
            .or_else(|| {
                index
                    .and_then(|i| keys::unknown_key(i, &keys::INDEX_KEYS))
                    .map(|k| format!("index.{k}"))
            });
        match unknown {
            Some(key) => Err(self.node_error(
                id,
                format!("unknown key {key:?} (a node holds {})", keys::NODE_KEYS.join(", ")),
            )),
            None => Ok(()),
        }
    }

    /// Refuses a node whose `children_ids` (when given) are not the nodes
    /// that name it as their parent: the file contradicts itself, and the
    /// import, which follows `parent_id`, would build another tree than
    /// a reader of `children_ids` sees.
    fn children_agree(&self, objs: &[(&str, &Map<String, Value>)]) -> Result<(), InteropError> {
        let mut children: HashMap<&str, Vec<&str>> = HashMap::new();
        for (id, obj) in objs {
            if let Some(Value::String(parent)) = obj.get("parent_id") {
                children.entry(parent.as_str()).or_default().push(id);
            }
        }
        for (id, obj) in objs {
            let listed = match obj.get("children_ids") {
                None | Some(Value::Null) => continue,
                Some(Value::Array(items)) => items.iter().map(Value::as_str).collect::<Option<Vec<&str>>>(),
                Some(_) => None,
            };
            let mut listed = listed.ok_or_else(|| self.node_error(id, "\"children_ids\" must be a list of ids"))?;
            let mut named = children.remove(id).unwrap_or_default();
            listed.sort_unstable();
            named.sort_unstable();
            if listed != named {
                let extra = listed.iter().find(|c| !named.contains(c));
                let missing = named.iter().find(|c| !listed.contains(c));
                let detail = match (extra, missing) {
                    (Some(x), _) => format!("\"children_ids\" lists {x:?}, whose parent_id is not this node"),
                    (None, Some(m)) => format!("node {m:?} names it as its parent, but \"children_ids\" leaves it out"),
                    (None, None) => "\"children_ids\" lists a child twice".to_string(),
                };
                return Err(self.node_error(id, detail));
            }
        }
        Ok(())
    }

    /// Ids, parent links and placeholders of every node.
    fn skeleton<'v>(&self, raw: &'v [Value]) -> Result<Skeleton<'v>, InteropError> {
        let mut ids: HashMap<&str, usize> = HashMap::new();
        let mut objs = Vec::with_capacity(raw.len());
        for (i, v) in raw.iter().enumerate() {
            let obj = v
                .as_object()
                .ok_or_else(|| self.invalid(format!("nodes[{i}] is not a JSON object")))?;
            let id = match obj.get("node_id") {
                Some(Value::String(s)) if !s.is_empty() => s.as_str(),
                _ => return Err(self.invalid(format!("nodes[{i}] has no \"node_id\" string"))),
            };
            if let Some(first) = ids.insert(id, i) {
                return Err(self.node_error(id, format!("appears twice (nodes[{first}] and nodes[{i}])")));
            }
            self.known_keys(id, obj)?;
            objs.push((id, obj));
        }
        self.children_agree(&objs)?;
        let is_placeholder = |obj: &Map<String, Value>| {
            matches!(obj.get("parent_id"), None | Some(Value::Null)) && scenario_of(obj).contains(PLACEHOLDER_MARKER)
        };
        let mut skeleton = Skeleton {
            entries: Vec::with_capacity(objs.len()),
            placeholders: Vec::new(),
            children: HashMap::new(),
        };
        for (i, (id, obj)) in objs.iter().enumerate() {
            let parent = match obj.get("parent_id") {
                None | Some(Value::Null) => None,
                Some(Value::String(p)) => Some(
                    *ids.get(p.as_str())
                        .ok_or_else(|| self.node_error(id, format!("its parent {p:?} is not in the file")))?,
                ),
                Some(_) => return Err(self.node_error(id, "\"parent_id\" must be a string or null")),
            };
            if is_placeholder(obj) {
                skeleton.placeholders.push(i);
            }
            let parent_is_placeholder = parent.is_some_and(|p| is_placeholder(objs[p].1));
            if let Some(p) = parent.filter(|_| !parent_is_placeholder) {
                skeleton.children.entry(p).or_default().push(i);
            }
            skeleton.entries.push(Entry {
                id: id.to_string(),
                obj,
                parent: parent.filter(|_| !parent_is_placeholder),
                parent_is_placeholder,
            });
        }
        Ok(skeleton)
    }

    /// (depth, file position) of every non-placeholder node, parents first.
    fn parent_first_order(&self, s: &Skeleton) -> Result<Vec<(u32, usize)>, InteropError> {
        let mut queue: VecDeque<(u32, usize)> = (0..s.entries.len())
            .filter(|&i| !s.placeholders.contains(&i))
            .filter(|&i| s.entries[i].parent.is_none())
            .map(|i| (1, i))
            .collect();
        let mut order = Vec::with_capacity(s.entries.len());
        while let Some((depth, i)) = queue.pop_front() {
            order.push((depth, i));
            for &child in s.children.get(&i).map_or(&[][..], Vec::as_slice) {
                queue.push_back((depth + 1, child));
            }
        }
        if order.len() + s.placeholders.len() != s.entries.len() {
            let reached: std::collections::HashSet<usize> = order.iter().map(|(_, i)| *i).collect();
            let lost = (0..s.entries.len())
                .find(|i| !reached.contains(i) && !s.placeholders.contains(i))
                .unwrap_or(0);
            return Err(self.node_error(
                &s.entries[lost].id,
                "is not connected to any root (its parent links form a loop)",
            ));
        }
        Ok(order)
    }

    fn node(
        &self,
        entry: &Entry,
        file_position: usize,
        parent: Option<usize>,
        depth: u32,
        tree: &mut ReferenceTree,
    ) -> Result<ReferenceNode, InteropError> {
        let id = entry.id.as_str();
        let empty = Map::new();
        let meta = match entry.obj.get("meta") {
            None | Some(Value::Null) => &empty,
            Some(Value::Object(m)) => m,
            Some(_) => return Err(self.node_error(id, "\"meta\" must be an object")),
        };
        let node_type = if parent.is_none() {
            NodeType::Root
        } else {
            NodeType::Residual
        };
        let mut node = ReferenceNode {
            node_id: id.to_string(),
            file_position,
            parent,
            depth,
            node_type,
            file_node_type: None,
            label: Label::Success,
            created_unix_ms: None,
            success_hits: 0,
            retrievals: 0,
            consolidated: false,
            consolidated_root: false,
            payload: Payload::default(),
            extra_meta: BTreeMap::new(),
            embedding: self.embedding(id, file_position)?,
        };
        self.read_meta(meta, &mut node)?;
        if node.file_node_type.is_some() {
            let why = if entry.parent_is_placeholder || parent.is_none() {
                "hangs from the root"
            } else {
                "has a parent node"
            };
            tree.notes.push(format!(
                "node {id} is typed {} in the file but {why}: stored as {}, the file's type kept for export",
                node.file_node_type.as_deref().unwrap_or(""),
                node.node_type.as_str()
            ));
        }
        tree.legacy_schema |= self.read_payload(id, entry.obj, &mut node.payload)?;
        Ok(node)
    }

    /// The node's embedding, narrowed to f32 as the file was parsed.
    fn embedding(&self, id: &str, file_position: usize) -> Result<Vec<f32>, InteropError> {
        let Some(read) = self.embeddings.borrow_mut().remove(&file_position) else {
            return Err(self.node_error(id, "missing \"index\".\"embedding\" array"));
        };
        if let Some((k, v)) = read.first_bad {
            return Err(self.node_error(id, format!("embedding[{k}] is {v}, not a finite float32")));
        }
        let out = read.values;
        if out.iter().all(|x| *x == 0.0) {
            return Err(self.node_error(
                id,
                "embedding is all zeros (the reference writes that for empty text); it cannot be searched",
            ));
        }
        Ok(out)
    }
}

/// A meta or payload value that must be a non-negative count.
fn count(v: &Value) -> Option<u32> {
    match v {
        Value::Null => Some(0),
        Value::Number(n) => n
            .as_u64()
            .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0).map(|f| f as u64))
            .and_then(|c| u32::try_from(c).ok()),
        _ => None,
    }
}

fn flag(v: &Value) -> Option<bool> {
    match v {
        Value::Null => Some(false),
        Value::Bool(b) => Some(*b),
        _ => None,
    }
}

impl Ctx<'_> {
    fn read_meta(&self, meta: &Map<String, Value>, node: &mut ReferenceNode) -> Result<(), InteropError> {
        let id = node.node_id.clone();
        let bad =
            |key: &str, want: &str, v: &Value| self.node_error(&id, format!("meta.{key} is {v}, expected {want}"));
        for (key, v) in meta {
            match key.as_str() {
                "node_type" => match v.as_str() {
                    Some(t @ ("ROOT" | "RESIDUAL")) if t == node.node_type.as_str() => {}
                    Some(t @ ("ROOT" | "RESIDUAL")) => node.file_node_type = Some(t.to_string()),
                    _ => return Err(bad(key, "\"ROOT\" or \"RESIDUAL\"", v)),
                },
                "result_status" => {
                    node.label = v
                        .as_str()
                        .and_then(Label::parse)
                        .ok_or_else(|| bad(key, "\"SUCCESS\" or \"FAILURE\"", v))?
                }
                "created_at" => node.created_unix_ms = self.created(&id, v)?,
                "hit_count" => node.retrievals = count(v).ok_or_else(|| bad(key, "a count", v))?,
                "success_count" => node.success_hits = count(v).ok_or_else(|| bad(key, "a count", v))?,
                "is_consolidated" => node.consolidated = flag(v).ok_or_else(|| bad(key, "a boolean", v))?,
                "is_consolidated_root" => node.consolidated_root = flag(v).ok_or_else(|| bad(key, "a boolean", v))?,
                _ => {
                    node.extra_meta.insert(key.clone(), v.clone());
                }
            }
        }
        if let Some(t) = &node.file_node_type {
            node.extra_meta.insert("node_type".into(), Value::String(t.clone()));
        }
        // Legacy files count retrievals in usage_count (no hit_count yet).
        if !meta.contains_key("hit_count")
            && let Some(usage) = meta.get("usage_count")
        {
            node.retrievals = count(usage).ok_or_else(|| bad("usage_count", "a count", usage))?;
        }
        // Values export would write anyway carry nothing: not keeping them
        // makes file -> bank -> file -> bank leave the payload unchanged.
        if node.extra_meta.get("usage_count").and_then(count) == Some(node.retrievals) {
            node.extra_meta.remove("usage_count");
        }
        if node.extra_meta.get("episode_idx").is_some_and(Value::is_null) {
            node.extra_meta.remove("episode_idx");
        }
        Ok(())
    }

    fn created(&self, id: &str, v: &Value) -> Result<Option<u64>, InteropError> {
        match v {
            Value::Null => Ok(None),
            Value::Number(n) => match n.as_f64() {
                Some(s) if (0.0..1e13).contains(&s) => Ok(Some((s * 1000.0).round() as u64)),
                _ => Err(self.node_error(id, format!("meta.created_at {n} is not a time in seconds"))),
            },
            _ => Err(self.node_error(id, format!("meta.created_at is {v}, expected seconds"))),
        }
    }

    /// Fills the payload; returns true if legacy keys were used.
    fn read_payload(&self, id: &str, obj: &Map<String, Value>, out: &mut Payload) -> Result<bool, InteropError> {
        let empty = Map::new();
        let payload = match obj.get("payload") {
            None | Some(Value::Null) => &empty,
            Some(Value::Object(p)) => p,
            Some(_) => return Err(self.node_error(id, "\"payload\" must be an object")),
        };
        out.scenario = match payload.get("scenario_description") {
            Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
            _ => {
                return Err(self.node_error(
                    id,
                    "payload.scenario_description is missing or empty (the bank needs the text the embedding was computed from)",
                ));
            }
        };
        let mut odd = Map::new();
        let mut legacy = false;
        for (key, v) in payload.iter().filter(|(k, _)| k.as_str() != "scenario_description") {
            let stands_for = LEGACY_PAYLOAD_KEYS
                .iter()
                .find(|(old, _)| old == key)
                .map(|(_, new)| *new);
            let target = match stands_for {
                Some(new) if payload.get(new).is_none_or(Value::is_null) => {
                    legacy |= !v.is_null();
                    new
                }
                _ => key.as_str(),
            };
            let known = PAYLOAD_KEYS.contains(&target) || stands_for.is_some();
            let reserved = [REFERENCE_META_FIELD, REFERENCE_PAYLOAD_FIELD].contains(&target);
            match v {
                Value::String(s) if !reserved => {
                    out.fields.insert(target.to_string(), s.clone());
                }
                Value::Null if known => {}
                other => {
                    odd.insert(key.clone(), other.clone());
                }
            }
        }
        if !odd.is_empty() {
            out.fields
                .insert(REFERENCE_PAYLOAD_FIELD.into(), Value::Object(odd).to_string());
        }
        Ok(legacy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file's error reads as the same document's in memory, for the two
    /// errors serde_json places differently when it reads a stream.
    #[test]
    fn a_files_error_is_placed_as_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tree.json");
        let name = path.display().to_string();
        for text in [
            r#"{"a":1,"a":2}"#,
            "{\"a\":1,\"a\"\n:2}",
            "{\"nodes\":[{\"index\":{\"embedding\":[1],\"embedding\":[2]}}]}",
            "{\"nodes\":[{\"index\":{\"embedding\":[\n  0.5,\n  1e400\n]}}]}",
            "[1e400]",
            "{\"nodes\": [1,",
        ] {
            std::fs::write(&path, text).unwrap();
            let from_file = read_reference(&path).unwrap_err().to_string();
            let in_memory = parse_reference(text.as_bytes(), &name).unwrap_err().to_string();
            assert_eq!(from_file, in_memory, "{text}");
        }
    }
}

//! Trees saved by the DeltaMem reference implementation (Python,
//! `memory/prtree/`): `{"meta": {...}, "nodes": [...]}` with one node object
//! per tree node, a placeholder root first.
//!
//! # Mapping (read: [`read_reference`] + [`import_tree`]; write: [`export_tree`])
//!
//! | reference | bank |
//! |---|---|
//! | `node_id` (UUID text) | external id (kept exactly) |
//! | `parent_id` | parent; children of the placeholder become top-level ROOTs |
//! | `meta.node_type` | type, decided by position (see below) |
//! | `meta.result_status` | label (missing: SUCCESS, the reference's default) |
//! | `meta.hit_count` | `retrievals` |
//! | `meta.success_count` | `success_hits` |
//! | `meta.usage_count` | seeds `retrievals` when `hit_count` is absent (legacy files, where it was the retrieval counter); kept verbatim in `reference_meta` when it differs from `retrievals` (export writes `retrievals` otherwise) |
//! | `meta.is_consolidated`, `meta.is_consolidated_root` | row flags (no link: the file does not say which root) |
//! | `meta.created_at` (seconds) | creation time (kept to the millisecond) |
//! | `meta.episode_idx` (unless null), unknown meta keys | payload field `reference_meta` (JSON object text) |
//! | `payload.scenario_description` | payload scenario |
//! | `payload.activation_condition` (legacy `memory_description`) | field `activation_condition` |
//! | `payload.execution_procedure` (legacy `content_body`) | field `execution_procedure` |
//! | `payload.termination_condition`, `payload.trajectory` | fields of the same name |
//! | unknown payload keys with string values | fields of the same name |
//! | payload values that are not strings (unknown keys, or known keys holding lists/numbers) | field `reference_payload` (JSON object text) |
//! | `index.embedding` | the vector (checked, normalised) |
//!
//! A legacy key is used only when its current counterpart is absent or
//! null; if both are present the legacy one is kept as a field of its own
//! name. Null values of known keys carry nothing and are not stored.
//! Export refuses, naming the node and field, a field it could not write
//! back as it is: one named `scenario_description`, or a legacy key stored
//! without its current counterpart (an insert can store either).
//!
//! **Type by position.** The bank's rule is that a node is a ROOT exactly
//! when it hangs from the virtual root. The real fixtures obey it (every
//! child of the placeholder is ROOT, every other node RESIDUAL), but a file
//! that does not is still imported: position wins, and the type the file
//! gave is kept under `node_type` in `reference_meta`, so export writes the
//! file's value back. A node with `parent_id: null` whose scenario is not a
//! placeholder is taken as a top-level root of a file saved without one.
//!
//! **Depth.** The placeholder has depth 0, its children depth 1, as in the
//! bank. A file deeper than the bank's D_max is refused (naming the node)
//! rather than re-parented, because re-parenting would change the chains.

mod export;
mod import;
mod keys;
mod parse;

pub use export::{ExportOptions, ExportReport, check_exportable, export_jsonl, export_tree, synthetic_uuid};
pub use import::{ImportOptions, ImportReport, import_tree};
pub use parse::{ReferenceNode, ReferenceTree, parse_reference, read_reference};

/// Text the reference puts in its placeholder root's scenario.
pub const PLACEHOLDER_MARKER: &str = "GLOBAL_ROOT_PLACEHOLDER";

/// Payload field holding, as JSON object text, the reference meta keys the
/// bank has no column for, so export can restore them.
pub const REFERENCE_META_FIELD: &str = "reference_meta";

/// Payload field holding, as JSON object text, payload entries whose values
/// are not strings.
pub const REFERENCE_PAYLOAD_FIELD: &str = "reference_payload";

/// Payload keys of the reference's current schema, in its order (the
/// scenario is the first; the bank keeps it apart from the fields).
pub const PAYLOAD_KEYS: [&str; 5] = [
    "scenario_description",
    "activation_condition",
    "execution_procedure",
    "termination_condition",
    "trajectory",
];

/// Meta keys of the reference's current schema, in its order.
pub const META_KEYS: [&str; 9] = [
    "node_type",
    "result_status",
    "created_at",
    "usage_count",
    "hit_count",
    "success_count",
    "is_consolidated",
    "episode_idx",
    "is_consolidated_root",
];

/// Legacy payload keys and the current keys they stand for.
pub const LEGACY_PAYLOAD_KEYS: [(&str, &str); 2] = [
    ("memory_description", "activation_condition"),
    ("content_body", "execution_procedure"),
];

/// The placeholder's scenario for a tree, as the reference names it.
pub fn placeholder_scenario(tree_name: &str) -> String {
    format!("{PLACEHOLDER_MARKER}_{}", tree_name.to_uppercase())
}

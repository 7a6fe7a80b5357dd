//! Python arguments as bank types: node references, attach choices,
//! labels, sync policies, payload dicts. Refusals are InvalidInputError
//! (a ValueError) naming the argument.

use std::collections::BTreeMap;

use deltamem::{Attach, Label, NewNode, NodeRef, Payload, SyncPolicy};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyString};

use crate::errors;

/// Whether `obj` is an integer: an int or anything with `__index__` (the
/// NumPy integers the binding itself returns ids as), but not a bool.
fn is_integer(obj: &Bound<'_, PyAny>) -> bool {
    !obj.is_instance_of::<PyBool>() && (obj.is_instance_of::<PyInt>() || obj.hasattr("__index__").unwrap_or(false))
}

/// A node named by its index (an int) or its external id (a str).
pub fn node_ref(obj: &Bound<'_, PyAny>) -> PyResult<NodeRef> {
    let py = obj.py();
    if obj.is_instance_of::<PyBool>() {
        return Err(errors::invalid(py, format!("node id {obj} is a bool, not an index")));
    }
    if is_integer(obj) {
        let index = obj.call_method0("__index__").and_then(|i| i.extract::<u32>());
        return match index {
            Ok(i) => Ok(NodeRef::Index(i)),
            Err(_) => Err(errors::invalid(py, format!("node id {obj} is not an index (0..2^32)"))),
        };
    }
    if let Ok(text) = obj.cast::<PyString>() {
        return Ok(NodeRef::External(text.to_cow()?.into_owned()));
    }
    Err(errors::invalid(
        py,
        format!(
            "a node is named by an int (its index) or a str (its external id), not {}",
            obj.get_type().name()?
        ),
    ))
}

/// "auto", "root", or a parent (int index or str external id).
pub fn attach(obj: &Bound<'_, PyAny>) -> PyResult<Attach> {
    if let Ok(text) = obj.cast::<PyString>() {
        match &*text.to_cow()? {
            "auto" => return Ok(Attach::Auto),
            "root" => return Ok(Attach::Root),
            _ => {}
        }
    }
    Ok(Attach::Parent(node_ref(obj)?))
}

pub fn label(py: Python<'_>, text: &str) -> PyResult<Label> {
    Label::parse(&text.to_ascii_uppercase())
        .ok_or_else(|| errors::invalid(py, format!("label {text:?} is not \"SUCCESS\" or \"FAILURE\"")))
}

pub fn sync(py: Python<'_>, text: &str) -> PyResult<SyncPolicy> {
    SyncPolicy::parse(text)
        .ok_or_else(|| errors::invalid(py, format!("sync {text:?} is not \"always\", \"batch\" or \"none\"")))
}

pub fn opt_sync(py: Python<'_>, text: Option<&str>) -> PyResult<Option<SyncPolicy>> {
    text.map(|t| sync(py, t)).transpose()
}

/// A payload dict: str keys to str values.
pub fn fields(obj: Option<&Bound<'_, PyAny>>) -> PyResult<BTreeMap<String, String>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(BTreeMap::new());
    };
    let py = obj.py();
    let dict = obj
        .cast::<PyDict>()
        .map_err(|_| errors::invalid(py, "payload must be a dict of str to str"))?;
    let mut out = BTreeMap::new();
    for (key, value) in dict.iter() {
        let key: String = key
            .extract()
            .map_err(|_| errors::invalid(py, format!("payload key {key} is not a str")))?;
        let value: String = value.extract().map_err(|_| {
            errors::invalid(
                py,
                format!(
                    "payload[{key:?}] is a {}, not a str",
                    value.get_type().name().map_or("?".into(), |n| n.to_string())
                ),
            )
        })?;
        out.insert(key, value);
    }
    Ok(out)
}

/// One per-row argument of a batch: absent, one value for every row, or a
/// list of `rows` values.
pub fn per_row<'py>(
    obj: Option<&Bound<'py, PyAny>>,
    rows: usize,
    name: &str,
    is_single: impl Fn(&Bound<'py, PyAny>) -> bool,
) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(vec![None; rows]);
    };
    if is_single(obj) {
        return Ok(vec![Some(obj.clone()); rows]);
    }
    let py = obj.py();
    let items: Vec<Bound<'py, PyAny>> = obj
        .try_iter()
        .map_err(|_| errors::invalid(py, format!("{name} must be a list of {rows} items")))?
        .collect::<PyResult<_>>()?;
    if items.len() != rows {
        return Err(errors::invalid(
            py,
            format!("{name} has {} items for {rows} embeddings", items.len()),
        ));
    }
    Ok(items.into_iter().map(Some).collect())
}

/// The rows of an `insert_many` or `load`, everything but the vectors.
pub struct RowArgs<'a, 'py> {
    pub tree: &'a str,
    pub rows: usize,
    pub scenarios: Option<&'a Bound<'py, PyAny>>,
    pub payloads: Option<&'a Bound<'py, PyAny>>,
    pub labels: Option<&'a Bound<'py, PyAny>>,
    pub attach: Option<&'a Bound<'py, PyAny>>,
    pub external_ids: Option<&'a Bound<'py, PyAny>>,
    /// Attach when `attach` is None.
    pub default_attach: Attach,
    /// Scenarios may be omitted ("row N"), as `deltamem import --npy` does.
    pub default_scenarios: bool,
}

/// New nodes with empty embeddings (the caller adds them or loads a
/// column).
pub fn new_nodes(py: Python<'_>, a: &RowArgs<'_, '_>) -> PyResult<Vec<NewNode>> {
    let is_str = |o: &Bound<'_, PyAny>| o.is_instance_of::<PyString>();
    if a.scenarios.is_none_or(|s| s.is_none()) && !a.default_scenarios {
        return Err(errors::invalid(py, "scenarios are required"));
    }
    let scenarios = per_row(a.scenarios, a.rows, "scenarios", is_str)?;
    let payloads = per_row(a.payloads, a.rows, "payloads", |o| o.is_instance_of::<PyDict>())?;
    let labels = per_row(a.labels, a.rows, "labels", is_str)?;
    let attaches = per_row(a.attach, a.rows, "attach", |o| is_str(o) || is_integer(o))?;
    if a.external_ids.is_some_and(is_str) {
        // Iterated, a str would give each row one of its characters.
        return Err(errors::invalid(
            py,
            format!("external_ids must be a list of {} str (or None), not one str", a.rows),
        ));
    }
    let ids = per_row(a.external_ids, a.rows, "external_ids", |_| false)?;
    let mut out = Vec::with_capacity(a.rows);
    for row in 0..a.rows {
        let scenario = match &scenarios[row] {
            Some(s) => s
                .extract::<String>()
                .map_err(|_| errors::invalid(py, format!("scenarios[{row}] is not a str")))?,
            None => format!("row {row}"),
        };
        let label = match &labels[row] {
            Some(l) => label(
                py,
                &l.extract::<String>()
                    .map_err(|_| errors::invalid(py, format!("labels[{row}] is not a str")))?,
            )?,
            None => Label::Success,
        };
        let attach = match &attaches[row] {
            Some(x) => attach(x)?,
            None => a.default_attach.clone(),
        };
        let external_id = match &ids[row] {
            Some(x) if !x.is_none() => Some(
                x.extract::<String>()
                    .map_err(|_| errors::invalid(py, format!("external_ids[{row}] is not a str")))?,
            ),
            _ => None,
        };
        out.push(NewNode {
            tree: a.tree.to_string(),
            attach,
            label,
            payload: Payload {
                scenario,
                fields: fields(payloads[row].as_ref())?,
            },
            embedding: Vec::new(),
            external_id,
        });
    }
    Ok(out)
}

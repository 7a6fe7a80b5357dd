//! Reference JSON and `.npy` in and out, through `deltamem::interop`.

use std::path::Path;

use deltamem::SyncPolicy;
use deltamem::interop::npy::{NpyElement, NpyMatrixWriter};
use deltamem::interop::reference::{self, ExportOptions, ImportOptions};
use deltamem::interop::write_atomically;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::bank::{Fail, PyBank};
use crate::errors;

pub fn import_reference(
    bank: &PyBank,
    py: Python<'_>,
    tree: &str,
    path: &Path,
    batch: usize,
    sync: Option<SyncPolicy>,
) -> PyResult<Vec<u32>> {
    if batch == 0 {
        return Err(errors::invalid(py, "batch must be at least 1"));
    }
    // Parsed before the write lock is taken: a bad file blocks no writer.
    let source = py
        .detach(|| reference::read_reference(path))
        .map_err(|e| errors::interop(py, e))?;
    let options = ImportOptions {
        sync,
        max_batch_nodes: batch,
    };
    bank.write(py, |b| {
        let report = reference::import_tree(b, tree, source, &options, &mut |_, _| {})?;
        Ok(report.ids)
    })
}

pub fn export_reference(bank: &PyBank, py: Python<'_>, tree: &str, path: &Path, format: &str) -> PyResult<u64> {
    let jsonl = match format {
        "reference-json" => false,
        "jsonl" => true,
        other => {
            return Err(errors::invalid(
                py,
                format!("format {other:?} is not \"reference-json\" or \"jsonl\""),
            ));
        }
    };
    bank.read(py, |b| {
        // An unknown tree is reported before any file is created.
        b.tree_index(tree)?;
        let mut nodes = 0;
        write_atomically(path, |out| {
            let report = if jsonl {
                reference::export_jsonl(b, tree, out)
            } else {
                reference::export_tree(b, tree, out, &ExportOptions::default())
            }
            .map_err(|e| e.naming_output(&path.display().to_string()))?;
            nodes = report.nodes;
            Ok(())
        })?;
        Ok(nodes)
    })
}

/// A `.npy` file as a read-only memory-mapped NumPy array.
pub fn read_npy<'py>(py: Python<'py>, path: &Path) -> PyResult<Bound<'py, PyAny>> {
    let kwargs = PyDict::new(py);
    kwargs.set_item("mmap_mode", "r")?;
    py.import("numpy")?
        .call_method("load", (path,), Some(&kwargs))
        .map_err(|e| {
            let message = format!("{}: cannot read as .npy: {e}", path.display());
            if e.is_instance_of::<pyo3::exceptions::PyOSError>(py) {
                let errno = e.value(py).getattr("errno").ok().and_then(|n| n.extract::<i32>().ok());
                let details = errors::Details {
                    file: Some(path.display().to_string()),
                    errno,
                    ..errors::Details::default()
                };
                errors::make(py, errors::Kind::Io, message, &details)
            } else {
                errors::invalid(py, message)
            }
        })
}

pub fn export_npy(bank: &PyBank, py: Python<'_>, tree: &str, path: &Path) -> PyResult<Vec<i64>> {
    bank.read(py, |b| {
        let t = b.tree_index(tree)?;
        let mut ids = Vec::new();
        for index in 0..b.node_count() {
            if b.row(index)?.tree == t {
                ids.push(index);
            }
        }
        let dim = b.dim_count() as usize;
        let mut writer = NpyMatrixWriter::create(path, ids.len() as u64, dim, NpyElement::F32)?;
        for &index in &ids {
            writer.write_row(&b.vector(index)?)?;
        }
        writer.finish()?;
        Ok::<_, Fail>(ids.into_iter().map(i64::from).collect())
    })
}

//! The native part of the `deltamem` Python package: a thin layer over the
//! bank API (`bank`) and the agent loop (`agent`). Exceptions live in the
//! pure Python module `deltamem.errors`; `errors` maps the library's error
//! enums onto them.

mod agent;
mod args;
mod arrays;
mod bank;
mod errors;
mod interop;
mod values;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<bank::PyBank>()?;
    m.add_class::<bank::NodeIter>()?;
    m.add_class::<agent::PyMemoryLoop>()?;
    m.add_class::<values::PyInsertAck>()?;
    m.add_class::<values::PyMatch>()?;
    m.add_class::<values::PyNode>()?;
    m.add_class::<values::PyHitAck>()?;
    m.add_class::<values::PyConsolidateAck>()?;
    m.add_class::<values::PyProblem>()?;
    m.add_class::<values::PyVerifyReport>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

//! NumPy in and out. A float32 C-contiguous array is read in place (no
//! copy); other float dtypes and strided arrays are converted once by
//! NumPy; anything else is refused with a ValueError naming its shape and
//! dtype.

use numpy::{
    PyArray1, PyArray2, PyArrayDescrMethods, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::errors;

/// Rows of `dim` floats, row-major, borrowed from a NumPy array.
pub struct Matrix<'py> {
    array: PyReadonlyArray2<'py, f32>,
}

impl Matrix<'_> {
    pub fn rows(&self) -> usize {
        self.array.shape()[0]
    }

    pub fn values(&self) -> &[f32] {
        self.array.as_slice().expect("made C-contiguous by `matrix`")
    }
}

/// One vector: borrowed from a 1-D array, or built from a list.
pub enum Vector<'py> {
    Array(PyReadonlyArray1<'py, f32>),
    List(Vec<f32>),
}

impl Vector<'_> {
    pub fn values(&self) -> &[f32] {
        match self {
            Vector::Array(a) => a.as_slice().expect("made C-contiguous by `vector`"),
            Vector::List(v) => v,
        }
    }
}

fn describe(array: &Bound<'_, PyUntypedArray>) -> String {
    let dtype = array
        .dtype()
        .str()
        .map(|s| s.to_string())
        .unwrap_or_else(|_| "?".into());
    format!("shape {:?}, dtype {dtype}", array.shape())
}

/// `array` as float32, C-contiguous and aligned: itself when it already
/// is, else a converted copy (float dtypes only). `ascontiguousarray`
/// alone would pass an unaligned array (a buffer at an odd offset, a field
/// of a packed record) through, which cannot be read as `&[f32]`.
fn as_f32<'py>(array: &Bound<'py, PyUntypedArray>, what: &str) -> PyResult<Bound<'py, PyUntypedArray>> {
    let py = array.py();
    let dtype = array.dtype();
    if dtype.kind() != b'f' {
        return Err(errors::invalid(
            py,
            format!(
                "{what}: {}: expected floats (float32, float64 or float16)",
                describe(array)
            ),
        ));
    }
    let is_f32 = dtype.is_equiv_to(&numpy::dtype::<f32>(py));
    if is_f32 && array.is_c_contiguous() && array.is_aligned() {
        return Ok(array.clone());
    }
    let numpy = py.import("numpy")?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("dtype", numpy.getattr("float32")?)?;
    kwargs.set_item("requirements", "CA")?;
    let converted = numpy.call_method("require", (array,), Some(&kwargs))?;
    Ok(converted.cast_into::<PyUntypedArray>()?)
}

/// Any array-like (ndarray, list of rows) as a NumPy array.
fn as_array<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Bound<'py, PyUntypedArray>> {
    if let Ok(array) = obj.cast::<PyUntypedArray>() {
        return Ok(array.clone());
    }
    let py = obj.py();
    if !(obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>()) {
        let type_name = obj.get_type().name()?;
        return Err(errors::invalid(
            py,
            format!("{what}: expected a NumPy array or a list, not {type_name}"),
        ));
    }
    let numpy = py.import("numpy")?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("dtype", numpy.getattr("float32")?)?;
    match numpy.call_method("asarray", (obj,), Some(&kwargs)) {
        Ok(a) => Ok(a.cast_into::<PyUntypedArray>()?),
        Err(e) => Err(errors::invalid(py, format!("{what}: not a list of numbers: {e}"))),
    }
}

/// An `[n, dim]` matrix of embeddings.
pub fn matrix<'py>(obj: &Bound<'py, PyAny>, dim: u32, what: &str) -> PyResult<Matrix<'py>> {
    let py = obj.py();
    let array = as_array(obj, what)?;
    if array.ndim() != 2 || array.shape()[1] != dim as usize {
        return Err(errors::invalid(
            py,
            format!("{what}: {}: expected shape (n, {dim})", describe(&array)),
        ));
    }
    let array = as_f32(&array, what)?.cast_into::<PyArray2<f32>>()?;
    Ok(Matrix {
        array: array.readonly(),
    })
}

/// One embedding of `dim` floats: a 1-D array or a list of numbers.
pub fn vector<'py>(obj: &Bound<'py, PyAny>, dim: u32, what: &str) -> PyResult<Vector<'py>> {
    let py = obj.py();
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        return match obj.extract::<Vec<f32>>() {
            Ok(v) if v.len() == dim as usize => Ok(Vector::List(v)),
            Ok(v) => Err(errors::invalid(
                py,
                format!("{what}: a list of {} numbers, the bank stores {dim}", v.len()),
            )),
            Err(_) => Err(errors::invalid(py, format!("{what}: a list that is not all numbers"))),
        };
    }
    let array = as_array(obj, what)?;
    if array.ndim() != 1 || array.shape()[0] != dim as usize {
        return Err(errors::invalid(
            py,
            format!("{what}: {}: expected shape ({dim},)", describe(&array)),
        ));
    }
    let array = as_f32(&array, what)?.cast_into::<PyArray1<f32>>()?;
    Ok(Vector::Array(array.readonly()))
}

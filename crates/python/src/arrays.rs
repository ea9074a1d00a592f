//! numpy arrays in and out. Outputs move the host copy of a tensor into numpy (no further
//! copy); inputs accept anything `numpy.asarray` does (numpy arrays, CPU torch tensors, lists).

use hookscope::burn::tensor::{DType, TensorData};
use hookscope::hooks::Operand;
use numpy::{PyArray1, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::errors::InputError;

/// A tensor's host data as a numpy array of its shape (f32, or i64 for token ids).
pub fn to_numpy<'py>(py: Python<'py>, data: TensorData) -> PyResult<Bound<'py, PyAny>> {
    let shape = data.shape().to_vec();
    let array = match data.dtype() {
        DType::I64 => {
            let values = data
                .try_into_vec::<i64>()
                .map_err(|e| InputError::new_err(format!("{e:?}")))?;
            PyArray1::from_vec(py, values).reshape(shape)?.into_any()
        }
        _ => {
            let values = data
                .convert::<f32>()
                .try_into_vec::<f32>()
                .map_err(|e| InputError::new_err(format!("{e:?}")))?;
            PyArray1::from_vec(py, values).reshape(shape)?.into_any()
        }
    };
    Ok(array)
}

/// Rows `[B][T]` of token ids or mask flags as an int64 numpy array.
pub fn rows_to_numpy<'py, T: Copy + Into<i64>>(
    py: Python<'py>,
    rows: &[Vec<T>],
) -> PyResult<Bound<'py, PyAny>> {
    let width = rows.first().map_or(0, Vec::len);
    let flat: Vec<i64> = rows.iter().flatten().map(|v| (*v).into()).collect();
    Ok(PyArray1::from_vec(py, flat)
        .reshape([rows.len(), width])?
        .into_any())
}

/// Any array-like as f32 values with their shape.
pub fn operand(value: &Bound<'_, PyAny>, what: &str) -> PyResult<Operand> {
    let numpy = value.py().import("numpy")?;
    let float32 = numpy.getattr("float32")?;
    let array = numpy
        .call_method1("ascontiguousarray", (value, float32))
        .map_err(|e| InputError::new_err(format!("{what}: not an array of numbers ({e})")))?;
    let array: PyReadonlyArrayDyn<'_, f32> = array.extract()?;
    let values = array
        .as_slice()
        .map_err(|e| InputError::new_err(format!("{what}: {e}")))?
        .to_vec();
    Ok(Operand {
        values,
        shape: array.shape().to_vec(),
    })
}

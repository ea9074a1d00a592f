//! Copies of device values into host memory.

use burn::tensor::TensorData;

use crate::error::Result;

/// `data`'s values as f32, row-major, whatever its element type: the one way the engine, the
/// analyses and the front ends read a tensor's values on the host (a failure is
/// [`crate::Error::Backend`], with the backend's error as its source).
pub fn f32_values(data: TensorData) -> Result<Vec<f32>> {
    Ok(data.convert::<f32>().try_into_vec::<f32>()?)
}

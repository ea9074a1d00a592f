//! Writing saved values to a safetensors file.

use std::path::Path;

use burn::tensor::{DType, TensorData};
use safetensors::tensor::{Dtype, TensorView};

use crate::error::{Error, Result};

/// Writes named tensors (f32, i64, i32 or bool data) to a safetensors file.
pub fn write_safetensors(path: &Path, tensors: &[(String, TensorData)]) -> Result<()> {
    let error = |message: String| Error::Output {
        path: path.to_path_buf(),
        message,
    };
    let views = tensors
        .iter()
        .map(|(name, data)| {
            let dtype = match data.dtype() {
                DType::F32 => Dtype::F32,
                DType::I64 => Dtype::I64,
                DType::I32 => Dtype::I32,
                DType::Bool(_) => Dtype::BOOL,
                other => return Err(error(format!("`{name}`: cannot write dtype {other:?}"))),
            };
            let view = TensorView::new(dtype, data.shape().to_vec(), data.as_bytes())
                .map_err(|e| error(format!("`{name}`: {e}")))?;
            Ok((name.as_str(), view))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize_to_file(views, None, path).map_err(|e| error(e.to_string()))
}

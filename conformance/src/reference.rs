//! Reading reference values written by `scripts/make_fixtures.py`.

use std::path::{Path, PathBuf};

use hookscope::burn::tensor::TensorData;
use safetensors::SafeTensors;
use safetensors::tensor::Dtype;
use serde::Deserialize;

/// Why a fixture could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReferenceError {
    /// Reading a file failed.
    #[error("cannot read {}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file does not parse.
    #[error("malformed {}: {message}", .path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// The cause.
        message: String,
    },
}

/// `reference.json`: the prompts the reference was made from.
#[derive(Debug, Clone, Deserialize)]
pub struct ReferencePrompts {
    /// Token ids of each prompt.
    pub prompts: Vec<Vec<u32>>,
    /// Tokens generated greedily after each prompt.
    pub new_tokens: usize,
    /// The intervention run (keys under `zero0/`).
    pub zero: ZeroRun,
}

/// A greedy generation of one prompt with one site zeroed at one step.
#[derive(Debug, Clone, Deserialize)]
pub struct ZeroRun {
    /// Index of the prompt.
    pub prompt: usize,
    /// The zeroed site.
    pub site: String,
    /// The step at which it is zeroed.
    pub step: usize,
}

/// A fixture's reference values: `prompt{k}/{site}@{step}` → tensor.
pub struct Reference {
    path: PathBuf,
    bytes: Vec<u8>,
    /// The prompts.
    pub prompts: ReferencePrompts,
}

/// One reference tensor as f64 values (integers converted), with its shape.
#[derive(Debug, Clone, PartialEq)]
pub struct RefTensor {
    /// Shape.
    pub shape: Vec<usize>,
    /// Row-major values.
    pub values: Vec<f64>,
}

impl Reference {
    /// Opens `reference.safetensors` and `reference.json` in a fixture directory.
    pub fn open(dir: &Path) -> Result<Reference, ReferenceError> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path).map_err(|source| ReferenceError::Io { path, source })
        };
        let json_path = dir.join("reference.json");
        let prompts = serde_json::from_slice(&read("reference.json")?).map_err(|e| {
            ReferenceError::Malformed {
                path: json_path,
                message: e.to_string(),
            }
        })?;
        let path = dir.join("reference.safetensors");
        let bytes = read("reference.safetensors")?;
        SafeTensors::deserialize(&bytes).map_err(|e| ReferenceError::Malformed {
            path: path.clone(),
            message: e.to_string(),
        })?;
        Ok(Reference {
            path,
            bytes,
            prompts,
        })
    }

    /// The reference tensor `key`, if stored.
    pub fn get(&self, key: &str) -> Result<Option<RefTensor>, ReferenceError> {
        let malformed = |message: String| ReferenceError::Malformed {
            path: self.path.clone(),
            message,
        };
        let tensors =
            SafeTensors::deserialize(&self.bytes).map_err(|e| malformed(e.to_string()))?;
        let Ok(view) = tensors.tensor(key) else {
            return Ok(None);
        };
        let data = view.data();
        let values = match view.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                .collect(),
            Dtype::I64 => data
                .chunks_exact(8)
                .map(|b| {
                    i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f64
                })
                .collect(),
            other => return Err(malformed(format!("`{key}` has unexpected dtype {other:?}"))),
        };
        Ok(Some(RefTensor {
            shape: view.shape().to_vec(),
            values,
        }))
    }
}

impl RefTensor {
    /// Converts hookscope's value (f32 activations or i64 ids) for comparison.
    pub fn from_data(data: &TensorData) -> Result<RefTensor, String> {
        let values = data
            .clone()
            .convert::<f64>()
            .try_into_vec::<f64>()
            .map_err(|e| format!("{e:?}"))?;
        Ok(RefTensor {
            shape: data.shape().to_vec(),
            values,
        })
    }

    /// The largest absolute difference to `other` (infinite where one side is `-inf` and the
    /// other is not; equal infinities count as 0), or `None` if the shapes differ.
    pub fn max_abs_diff(&self, other: &RefTensor) -> Option<(f64, usize)> {
        if self.shape != other.shape || self.values.len() != other.values.len() {
            return None;
        }
        let mut worst = (0.0, 0);
        for (index, (a, b)) in self.values.iter().zip(&other.values).enumerate() {
            let diff = if a == b { 0.0 } else { (a - b).abs() };
            let diff = if diff.is_nan() { f64::INFINITY } else { diff };
            if diff > worst.0 {
                worst = (diff, index);
            }
        }
        Some(worst)
    }
}

//! A model's `config.json`: read (with the non-finite floats Python writes), handed to the
//! adapter that claims it, and parsed into the adapter's own serde type with every oversized
//! integer named by its key path.

mod heads;
mod json;
mod layer_types;

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_json::Value;

pub use heads::{AttentionHeads, HeadDim, HeadKeys};
pub use json::ConfigFloat;
pub use layer_types::{layer_windows, sliding_layers};

use crate::error::{Error, Result};

/// Reads and parses a JSON file.
pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_json(path, &text)
}

/// Parses JSON text (with Python's bare non-finite floats) read from `path`.
pub(crate) fn parse_json(path: &Path, text: &str) -> Result<Value> {
    serde_json::from_str(&json::normalise_non_finite(text)).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// A model's `config.json`, handed to the adapter that claims it.
#[derive(Debug, Clone)]
pub struct ArchConfig {
    /// Where it came from (for messages).
    pub path: PathBuf,
    /// Its contents.
    pub json: Value,
}

impl ArchConfig {
    /// `model_type`, if present.
    pub fn model_type(&self) -> Option<&str> {
        self.json.get("model_type").and_then(Value::as_str)
    }

    /// `architectures`, if present.
    pub fn architectures(&self) -> Vec<String> {
        self.json
            .get("architectures")
            .and_then(Value::as_array)
            .map(|names| {
                names
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The language model's config of a multimodal (`*ForConditionalGeneration`) checkpoint,
    /// its `text_config` object, if this config has one.
    pub fn text_config(&self) -> Option<ArchConfig> {
        let text = self.json.get("text_config").filter(|t| t.is_object())?;
        Some(ArchConfig {
            path: self.path.clone(),
            json: text.clone(),
        })
    }

    /// Deserialises the config into an adapter's own config type, after refusing any integer
    /// beyond [`MAX_CONFIG_INTEGER`] (so that products of two config sizes cannot overflow).
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T> {
        if let Some((key, value)) = oversized_integer(&self.json, String::new()) {
            return Err(self.unsupported(format!(
                "`{key}` is {value}, beyond any size a model can have (at most \
                 {MAX_CONFIG_INTEGER})"
            )));
        }
        serde_path_to_error::deserialize(&self.json).map_err(|error| Error::ConfigValue {
            path: self.path.clone(),
            key: error.path().to_string(),
            source: error.into_inner(),
        })
    }

    /// An "unsupported configuration" error about this config.
    pub fn unsupported(&self, message: impl Into<String>) -> Error {
        Error::UnsupportedConfig {
            path: self.path.clone(),
            message: message.into(),
        }
    }
}

/// The largest integer a `config.json` may hold: 2^31 - 1, far beyond any real model size or
/// token id, small enough that the product of two such sizes fits in 64 bits.
pub const MAX_CONFIG_INTEGER: u64 = i32::MAX as u64;

/// The first integer in `json` whose magnitude exceeds [`MAX_CONFIG_INTEGER`], with its key
/// path (`rope_scaling.factor`, `layer_types[3]`).
fn oversized_integer(json: &Value, path: String) -> Option<(String, String)> {
    let join = |key: &str| match path.is_empty() {
        true => key.to_string(),
        false => format!("{path}.{key}"),
    };
    match json {
        Value::Number(n) => {
            let too_big = match (n.as_u64(), n.as_i64()) {
                (Some(value), _) => value > MAX_CONFIG_INTEGER,
                (None, Some(value)) => value.unsigned_abs() > MAX_CONFIG_INTEGER,
                (None, None) => false,
            };
            too_big.then(|| (path, n.to_string()))
        }
        Value::Object(fields) => fields
            .iter()
            .find_map(|(key, value)| oversized_integer(value, join(key))),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, value)| oversized_integer(value, format!("{path}[{i}]"))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversized_integers_are_named_by_their_key_path() {
        let config = ArchConfig {
            path: PathBuf::from("config.json"),
            json: serde_json::json!({"n_embd": 32, "rope": {"sizes": [1, 4000000000u64]}}),
        };
        let error = config.parse::<Value>().unwrap_err().to_string();
        assert!(error.contains("`rope.sizes[1]` is 4000000000"), "{error}");
        let fine = ArchConfig {
            path: PathBuf::from("config.json"),
            json: serde_json::json!({"n_embd": 32, "eps": 1e30}),
        };
        assert!(fine.parse::<Value>().is_ok());
    }
}

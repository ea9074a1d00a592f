//! Finding a model's files: a local Hugging Face directory, a hub id (cached or downloaded), or
//! a model compiled into the binary.

mod checkpoint;
mod dtype;
mod hub;
mod json;

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_json::Value;

pub use checkpoint::{Checkpoint, LoadReport, WeightLoader};
pub(crate) use checkpoint::{Matrix, Orientation};
pub use dtype::{MatmulPrecision, WeightDtype, parse_dtype_choice};
pub use json::ConfigFloat;

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

/// A model compiled into a binary (the CLI's default model), laid out like a model directory.
#[derive(Debug)]
pub struct EmbeddedModel {
    /// A name for messages (`<embedded:NAME>` stands in for its directory).
    pub name: &'static str,
    /// `config.json`.
    pub config_json: &'static str,
    /// `generation_config.json`, if any.
    pub generation_config_json: Option<&'static str>,
    /// `tokenizer.json`, if any.
    pub tokenizer_json: Option<&'static [u8]>,
    /// `model.safetensors`.
    pub weights: &'static [u8],
}

/// Where a model's files are.
#[derive(Debug, Clone)]
pub enum ModelSource {
    /// A directory in Hugging Face layout.
    Directory(PathBuf),
    /// A model compiled into the binary.
    Embedded(&'static EmbeddedModel),
}

impl ModelSource {
    /// Resolves a local directory, or else a hub id (`owner/name`) through the Hugging Face hub
    /// cache (`HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`): cached files
    /// are used as they are; missing ones are downloaded (endpoint `HF_ENDPOINT`), unless
    /// `HF_HUB_OFFLINE` is set, in which case only the cache is consulted.
    pub fn resolve(spec: &str) -> Result<ModelSource> {
        ModelSource::resolve_in(spec, &hub_cache_dir(), hub_offline())
    }

    /// [`ModelSource::resolve`] with an explicit hub cache directory and offline switch.
    pub fn resolve_in(spec: &str, cache_dir: &Path, offline: bool) -> Result<ModelSource> {
        let path = Path::new(spec);
        if path.is_dir() {
            return Ok(ModelSource::Directory(path.to_path_buf()));
        }
        if path.exists() {
            return Err(Error::ModelNotFound {
                spec: spec.to_string(),
                reason: "it is a file; give the model's directory".into(),
            });
        }
        let looks_like_hub_id = spec.split('/').count() == 2 && !spec.starts_with(['.', '/']);
        if !looks_like_hub_id {
            return Err(Error::ModelNotFound {
                spec: spec.to_string(),
                reason: "no such directory".into(),
            });
        }
        if offline {
            let cache = hf_hub::Cache::new(cache_dir.to_path_buf());
            return match cache.model(spec.to_string()).get("config.json") {
                Some(config) => Ok(ModelSource::Directory(snapshot_dir(&config))),
                None => Err(Error::ModelNotFound {
                    spec: spec.to_string(),
                    reason: format!(
                        "not in the Hugging Face cache at {} and HF_HUB_OFFLINE is set; unset it \
                         to download, or point HF_HUB_CACHE at a cache that has it",
                        cache_dir.display()
                    ),
                }),
            };
        }
        hub::fetch(spec, cache_dir).map(ModelSource::Directory)
    }

    /// How this source is named in messages.
    pub fn origin(&self) -> PathBuf {
        match self {
            ModelSource::Directory(dir) => dir.clone(),
            ModelSource::Embedded(model) => PathBuf::from(format!("<embedded:{}>", model.name)),
        }
    }

    /// `config.json`, parsed.
    pub fn config(&self) -> Result<ArchConfig> {
        let path = self.origin().join("config.json");
        let json = match self {
            ModelSource::Directory(_) => read_json(&path)?,
            ModelSource::Embedded(model) => parse_json(&path, model.config_json)?,
        };
        Ok(ArchConfig { path, json })
    }

    /// `generation_config.json`, parsed, if the model has one.
    pub fn generation_config(&self) -> Result<Option<Value>> {
        let path = self.origin().join("generation_config.json");
        match self {
            ModelSource::Directory(_) if path.is_file() => read_json(&path).map(Some),
            ModelSource::Directory(_) => Ok(None),
            ModelSource::Embedded(model) => model
                .generation_config_json
                .map(|text| parse_json(&path, text))
                .transpose(),
        }
    }

    /// `tokenizer.json`, loaded, if the model has one.
    pub fn tokenizer(&self) -> Result<Option<Tokenizer>> {
        let path = self.origin().join("tokenizer.json");
        match self {
            ModelSource::Directory(_) if path.is_file() => Tokenizer::from_file(&path).map(Some),
            ModelSource::Directory(_) => Ok(None),
            ModelSource::Embedded(model) => model
                .tokenizer_json
                .map(|bytes| Tokenizer::from_bytes(&path, bytes))
                .transpose(),
        }
    }

    /// The weights.
    pub fn checkpoint(&self) -> Result<Checkpoint> {
        match self {
            ModelSource::Directory(dir) => Checkpoint::open_dir(dir),
            ModelSource::Embedded(model) => Checkpoint::from_static(&self.origin(), model.weights),
        }
    }
}

/// The snapshot directory holding a cached file.
fn snapshot_dir(file: &Path) -> PathBuf {
    file.parent().unwrap_or(Path::new(".")).to_path_buf()
}

/// `HF_HUB_OFFLINE` set to a true value (`1`, `true`, `yes`, `on`), as `huggingface_hub` reads it.
fn hub_offline() -> bool {
    std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

fn hub_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HF_HUB_CACHE") {
        return PathBuf::from(dir);
    }
    if let Some(home) = std::env::var_os("HF_HOME") {
        return PathBuf::from(home).join("hub");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cache").join("huggingface").join("hub")
}

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

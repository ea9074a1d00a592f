//! Finding a model's files: a local Hugging Face directory, a hub id (cached or downloaded), or
//! a model compiled into the binary.

mod hub;

use std::path::{Path, PathBuf};

use serde_json::Value;

use burn::tensor::Device;

use crate::checkpoint::Checkpoint;
use crate::config::{ArchConfig, parse_json, read_json};
use crate::dictionary::Dictionary;
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

    /// Resolves a feature dictionary: a local folder or file, or else a hub path
    /// `owner/repo/folder/...` (a dictionary folder in a hub repository, e.g.
    /// `google/gemma-scope-2b-pt-res/layer_20/width_16k/average_l0_71`, or a circuit-tracer
    /// set's folder with its `layer_L.safetensors`), fetched through the hub cache as models
    /// are ([`ModelSource::resolve`]); returns the local path to load.
    pub fn resolve_dictionary(spec: &str) -> Result<PathBuf> {
        ModelSource::resolve_dictionary_in(spec, &hub_cache_dir(), hub_offline())
    }

    /// [`ModelSource::resolve_dictionary`] with an explicit hub cache directory and offline
    /// switch.
    pub fn resolve_dictionary_in(spec: &str, cache_dir: &Path, offline: bool) -> Result<PathBuf> {
        let path = Path::new(spec);
        let parts: Vec<&str> = spec.splitn(3, '/').collect();
        let hub_path = parts.len() == 3
            && !spec.starts_with(['.', '/'])
            && parts.iter().all(|part| !part.is_empty());
        if path.exists() || !hub_path {
            return Ok(path.to_path_buf());
        }
        let repo = format!("{}/{}", parts[0], parts[1]);
        hub::fetch_dictionary(&repo, parts[2].trim_end_matches('/'), cache_dir, offline)
    }

    /// Loads every dictionary `spec` names ([`ModelSource::resolve_dictionary`], then
    /// [`Dictionary::load_all_with`]): one, or a circuit-tracer set's one per layer, with the
    /// set's `hf://` files taken from the hub cache (downloaded unless `HF_HUB_OFFLINE`).
    pub fn load_dictionaries(spec: &str, device: &Device) -> Result<Vec<Dictionary>> {
        ModelSource::load_dictionaries_in(spec, device, &hub_cache_dir(), hub_offline())
    }

    /// [`ModelSource::load_dictionaries`] with an explicit hub cache directory and offline
    /// switch.
    pub fn load_dictionaries_in(
        spec: &str,
        device: &Device,
        cache_dir: &Path,
        offline: bool,
    ) -> Result<Vec<Dictionary>> {
        let path = ModelSource::resolve_dictionary_in(spec, cache_dir, offline)?;
        let hub_file = |uri: &str| hub::fetch_uri(uri, cache_dir, offline);
        Dictionary::load_all_with(&path, device, &hub_file)
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

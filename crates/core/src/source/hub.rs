//! Fetching a model's files from the Hugging Face hub into the local hub cache (`hf-hub`): each
//! file is taken from the cache when present and downloaded otherwise.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Files every model needs; the weights come as one file or as the shards an index names.
const REQUIRED: &str = "config.json";
const SINGLE_WEIGHTS: &str = "model.safetensors";
const SHARD_INDEX: &str = "model.safetensors.index.json";
const OPTIONAL: [&str; 2] = ["tokenizer.json", "generation_config.json"];

/// Makes `spec`'s files present in the cache at `cache_dir`; returns their snapshot directory.
pub(super) fn fetch(spec: &str, cache_dir: &Path) -> Result<PathBuf> {
    let failed = |what: &str, e: hf_hub::api::sync::ApiError| Error::ModelNotFound {
        spec: spec.to_string(),
        reason: format!(
            "{what} is not in the Hugging Face cache at {} and could not be downloaded: {e} \
             (offline? fetch it elsewhere into that cache, or set HF_HUB_OFFLINE=1 to use \
             only the cache)",
            cache_dir.display()
        ),
    };
    let api = hf_hub::api::sync::ApiBuilder::from_env()
        .with_cache_dir(cache_dir.to_path_buf())
        .with_progress(false)
        .build()
        .map_err(|e| failed("the hub client", e))?;
    let repo = api.model(spec.to_string());
    let config = repo.get(REQUIRED).map_err(|e| failed(REQUIRED, e))?;
    if repo.get(SINGLE_WEIGHTS).is_err() {
        let index = repo.get(SHARD_INDEX).map_err(|e| failed(SHARD_INDEX, e))?;
        for shard in shard_files(&index)? {
            repo.get(&shard).map_err(|e| failed(&shard, e))?;
        }
    }
    for optional in OPTIONAL {
        // Absent from some repositories; loading reports what it needs.
        let _ = repo.get(optional);
    }
    Ok(super::snapshot_dir(&config))
}

/// The distinct shard files a `model.safetensors.index.json` names.
fn shard_files(index: &Path) -> Result<Vec<String>> {
    let json = crate::config::read_json(index)?;
    let mut files: Vec<String> = json
        .get("weight_map")
        .and_then(|map| map.as_object())
        .map(|map| {
            map.values()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files.dedup();
    Ok(files)
}

/// A feature dictionary's files in a hub repository: SAELens' pair, else Gemma Scope's one,
/// else a circuit-tracer set's config (whose layer files are fetched after it).
const DICTIONARY_LAYOUTS: [&[&str]; 3] = [
    &["cfg.json", "sae_weights.safetensors"],
    &["params.npz"],
    &["config.yaml"],
];

/// Most `layer_L.safetensors` files fetched beside a transcoder set's config.
const MAX_SET_LAYERS: usize = 4096;

/// Makes the dictionary folder `folder` of hub repository `repo` present in the cache at
/// `cache_dir` (only the cache when `offline`); returns that folder in its snapshot.
pub(super) fn fetch_dictionary(
    repo: &str,
    folder: &str,
    cache_dir: &Path,
    offline: bool,
) -> Result<PathBuf> {
    let spec = format!("{repo}/{folder}");
    let not_found = |reason: String| Error::Dictionary {
        path: PathBuf::from(&spec),
        message: reason,
    };
    let cache = hf_hub::Cache::new(cache_dir.to_path_buf()).model(repo.to_string());
    let api = match offline {
        true => None,
        false => Some(
            hf_hub::api::sync::ApiBuilder::from_env()
                .with_cache_dir(cache_dir.to_path_buf())
                .with_progress(false)
                .build()
                .map_err(|e| not_found(format!("the hub client: {e}")))?
                .model(repo.to_string()),
        ),
    };
    let get = |file: &str| -> Option<PathBuf> {
        let name = format!("{folder}/{file}");
        cache
            .get(&name)
            .or_else(|| api.as_ref().and_then(|api| api.get(&name).ok()))
    };
    for layout in DICTIONARY_LAYOUTS {
        let files: Option<Vec<PathBuf>> = layout.iter().map(|file| get(file)).collect();
        if let Some(first) = files.and_then(|files| files.into_iter().next()) {
            if layout == ["config.yaml"] {
                // A set that lists no files reads the layer files beside its config: fetch
                // them, layer 0 up to the first absent (as circuit-tracer counts them).
                let _ = (0..MAX_SET_LAYERS)
                    .take_while(|layer| get(&format!("layer_{layer}.safetensors")).is_some())
                    .count();
            }
            return Ok(super::snapshot_dir(&first));
        }
    }
    Err(not_found(format!(
        "neither {folder}/cfg.json with {folder}/sae_weights.safetensors (SAELens), \
         {folder}/params.npz (Gemma Scope) nor {folder}/config.yaml (circuit-tracer) is in the \
         Hugging Face cache at {}{}",
        cache_dir.display(),
        match offline {
            true => " and HF_HUB_OFFLINE is set",
            false => " or could be downloaded",
        }
    )))
}

/// The local copy of the hub file an `hf://owner/repo/path/in/repo[?revision=R]` reference
/// names (a circuit-tracer set's layer file), from the cache at `cache_dir` or, unless
/// `offline`, downloaded into it.
pub(super) fn fetch_uri(uri: &str, cache_dir: &Path, offline: bool) -> Result<PathBuf> {
    let error = |message: String| Error::Dictionary {
        path: PathBuf::from(uri),
        message,
    };
    let rest = uri
        .strip_prefix("hf://")
        .ok_or_else(|| error("expected an hf://owner/repo/file reference".into()))?;
    let (path, revision) = match rest.split_once('?') {
        Some((path, query)) => {
            let revision = query
                .split('&')
                .find_map(|pair| pair.strip_prefix("revision="))
                .filter(|r| !r.is_empty());
            (path, revision)
        }
        None => (rest, None),
    };
    let parts: Vec<&str> = path.splitn(3, '/').collect();
    let [owner, name, file] = parts[..] else {
        return Err(error("expected an hf://owner/repo/file reference".into()));
    };
    if [owner, name, file].iter().any(|part| part.is_empty()) {
        return Err(error("expected an hf://owner/repo/file reference".into()));
    }
    let repo = match revision {
        Some(revision) => hf_hub::Repo::with_revision(
            format!("{owner}/{name}"),
            hf_hub::RepoType::Model,
            revision.to_string(),
        ),
        None => hf_hub::Repo::model(format!("{owner}/{name}")),
    };
    if let Some(cached) = hf_hub::Cache::new(cache_dir.to_path_buf())
        .repo(repo.clone())
        .get(file)
    {
        return Ok(cached);
    }
    if offline {
        return Err(error(format!(
            "not in the Hugging Face cache at {} and HF_HUB_OFFLINE is set",
            cache_dir.display()
        )));
    }
    hf_hub::api::sync::ApiBuilder::from_env()
        .with_cache_dir(cache_dir.to_path_buf())
        .with_progress(false)
        .build()
        .and_then(|api| api.repo(repo).get(file))
        .map_err(|e| {
            error(format!(
                "not in the Hugging Face cache at {} and could not be downloaded: {e}",
                cache_dir.display()
            ))
        })
}

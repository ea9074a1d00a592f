//! Gemma Scope's `params.npz`: a JumpReLU dictionary as numpy arrays `W_enc [d_in, F]`,
//! `W_dec [F, d_in]`, `b_enc [F]`, `b_dec [d_in]` and `threshold [F]`, with no config.

use std::path::Path;

use burn::tensor::Device;
use npyz::npz::NpzArchive;

use super::{Dictionary, DictionaryConfig, SAE_LENS};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};

/// How many times its compressed size an array may claim to be (deflate's limit is ~1032):
/// a header claiming more is refused before anything is allocated from it.
const MAX_EXPANSION: u64 = 1100;

/// Loads a Gemma Scope `params.npz` (a sparse autoencoder).
pub(super) fn load(path: &Path, device: &Device) -> Result<Dictionary> {
    let (checkpoint, d_in, features) = read(path)?;
    let config = DictionaryConfig::gemma_scope(path, d_in, features)?;
    Dictionary::from_checkpoint(config, &checkpoint, SAE_LENS, device)
}

/// Loads a Gemma Scope transcoder's `params.npz` (a layer of a circuit-tracer set), reading
/// hook `input` and writing hook `output`.
pub(super) fn load_transcoder(
    path: &Path,
    input: String,
    output: String,
    device: &Device,
) -> Result<Dictionary> {
    let (checkpoint, d_in, features) = read(path)?;
    let config = DictionaryConfig::gemma_scope(path, d_in, features)?.transcoder(input, output);
    Dictionary::from_checkpoint(config, &checkpoint, SAE_LENS, device)
}

/// The arrays of a `params.npz` as a checkpoint, with `W_enc`'s `[d_in, features]`.
fn read(path: &Path) -> Result<(Checkpoint, usize, usize)> {
    let error = |message: String| Error::Dictionary {
        path: path.to_path_buf(),
        message,
    };
    let file_len = std::fs::metadata(path)
        .map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?
        .len();
    let mut archive =
        NpzArchive::open(path).map_err(|e| error(format!("not a readable .npz archive: {e}")))?;
    let names: Vec<String> = archive.array_names().map(str::to_string).collect();
    let mut tensors = Vec::with_capacity(names.len());
    for name in &names {
        let array = archive
            .by_name(name)
            .map_err(|e| error(format!("array `{name}`: {e}")))?
            .ok_or_else(|| error(format!("array `{name}` is listed but absent")))?;
        let shape: Vec<usize> = array
            .shape()
            .iter()
            .map(|&d| usize::try_from(d).ok())
            .collect::<Option<_>>()
            .ok_or_else(|| {
                error(format!(
                    "array `{name}` has an axis too long for this machine"
                ))
            })?;
        let elements = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d as u64));
        if elements.is_none_or(|n| n.saturating_mul(4) > file_len.saturating_mul(MAX_EXPANSION)) {
            return Err(error(format!(
                "array `{name}` claims shape {shape:?}, more than a {file_len}-byte archive can hold"
            )));
        }
        let dtype = array.dtype();
        let values: Vec<f32> = array.into_vec().map_err(|e| {
            error(format!(
                "array `{name}` ({}) does not read as float32: {e}",
                dtype.descr()
            ))
        })?;
        tensors.push((name.clone(), shape, values));
    }
    let encoder_shape = tensors
        .iter()
        .find(|(name, ..)| name == "W_enc")
        .map(|(_, shape, _)| shape.clone())
        .ok_or_else(|| error(format!("no array `W_enc` (it holds {})", names.join(", "))))?;
    let [d_in, features] = encoder_shape[..] else {
        return Err(error(format!(
            "array `W_enc` has shape {encoder_shape:?}; expected [d_in, features]"
        )));
    };
    Ok((Checkpoint::from_f32_tensors(path, tensors)?, d_in, features))
}

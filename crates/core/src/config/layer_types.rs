//! `layer_types`: the per-layer attention kind of configs with sliding-window layers (Gemma 2
//! and 3, Qwen2 and 3, Mistral's successors), and each layer's window, read once for every
//! adapter.

use super::ArchConfig;
use crate::error::Result;

/// Which of `layers` layers `types` (the config's `layer_types`) makes sliding-window layers:
/// `sliding_attention` is one, `full_attention` is not; an error naming the key for another
/// length or name.
pub fn sliding_layers(config: &ArchConfig, types: &[String], layers: usize) -> Result<Vec<bool>> {
    if types.len() != layers {
        return Err(config.unsupported(format!(
            "layer_types has {} entries for {layers} layers",
            types.len()
        )));
    }
    types
        .iter()
        .map(|kind| match kind.as_str() {
            "sliding_attention" => Ok(true),
            "full_attention" => Ok(false),
            other => Err(config.unsupported(format!(
                "layer_types names `{other}` (sliding_attention or full_attention)"
            ))),
        })
        .collect()
}

/// Each layer's window, from which layers slide (`sliding`, e.g. [`sliding_layers`]) and the
/// config's `sliding_window`: `None` on full-attention layers. An error naming the key where a
/// sliding layer would have no window or a window of 0.
pub fn layer_windows(
    config: &ArchConfig,
    sliding: &[bool],
    window: Option<usize>,
) -> Result<Vec<Option<usize>>> {
    if !sliding.contains(&true) {
        return Ok(vec![None; sliding.len()]);
    }
    match window {
        Some(0) => Err(config.unsupported("sliding_window is 0")),
        None => Err(config
            .unsupported("layer_types names sliding_attention layers but sliding_window is null")),
        Some(window) => Ok(sliding.iter().map(|s| s.then_some(window)).collect()),
    }
}

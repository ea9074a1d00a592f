//! `layer_types`: the per-layer attention kind of configs with sliding-window layers (Gemma 2
//! and 3, Qwen2, Mistral's successors), read once for every adapter.

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

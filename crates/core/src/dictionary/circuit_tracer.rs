//! circuit-tracer's per-layer transcoder sets (Ameisen et al. 2025, "Circuit Tracing"; the
//! `circuit-tracer` library): one transcoder (Dunefsky et al. 2024) for each layer `0..L`,
//! described by a `config.yaml`:
//!
//! ```yaml
//! model_kind: transcoder_set
//! feature_input_hook: mlp.hook_in      # a TransformerLens hook name, without `blocks.L.`
//! feature_output_hook: mlp.hook_out
//! transcoders:                         # optional; else layer_{L}.safetensors beside it
//!   - hf://owner/repo/layer_0.safetensors?revision=main
//!   - layer_1.safetensors              # relative to the config's folder
//! ```
//!
//! (older configs list `{id, layer, filepath}` mappings). A layer's file holds `W_enc [F, d]`
//! (applied as `x W_encᵀ + b_enc`), `W_dec [F, d]`, `b_enc [F]`, `b_dec [d]`, and optionally
//! `activation_function.threshold [F]` (JumpReLU; ReLU without it) and `W_skip [d, d]`
//! (`x W_skipᵀ` added to the output). A Gemma Scope `params.npz` in the list is read in Gemma
//! Scope's layout. Nothing is subtracted from the input and nothing is normalised.

use std::path::{Path, PathBuf};

use burn::tensor::Device;
use serde_json::Value;

use super::{Activation, Dictionary, DictionaryConfig, HubFiles, TensorNames, npz};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};

/// The file that makes a folder a transcoder set.
pub(super) const CONFIG: &str = "config.yaml";

/// Most layers a set may list, before anything is read from its files.
const MAX_LAYERS: usize = 4096;

/// circuit-tracer's tensor names.
const NAMES: TensorNames = TensorNames {
    encoder_out_in: true,
    threshold: "activation_function.threshold",
};

/// A set's `config.yaml`, read.
struct SetConfig {
    path: PathBuf,
    /// The hook every layer's transcoder reads, without `blocks.L.`.
    input_hook: String,
    /// The hook it writes.
    output_hook: String,
    /// Each layer's file as the config names it (a path or an `hf://` reference), if it
    /// lists them.
    listed: Option<Vec<(usize, String)>>,
}

impl SetConfig {
    fn read(path: &Path) -> Result<SetConfig> {
        let error = |message: String| Error::Dictionary {
            path: path.to_path_buf(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let yaml: Value = serde_saphyr::from_str(&text)
            .map_err(|e| error(format!("not readable as YAML: {e}")))?;
        let string = |key: &str| match yaml.get(key) {
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(other) => Err(error(format!("`{key}` is {other}; expected a hook name"))),
            None => Err(error(format!("`{key}` is missing"))),
        };
        match yaml.get("model_kind") {
            None => {}
            Some(Value::String(kind)) if kind == "transcoder_set" => {}
            Some(other) => {
                return Err(error(format!(
                    "`model_kind` is {other}; hookscope reads per-layer transcoder sets \
                     (`transcoder_set`), not cross-layer transcoders"
                )));
            }
        }
        let listed = match yaml.get("transcoders") {
            None | Some(Value::Null) => None,
            Some(Value::Array(entries)) => Some(listed_files(entries).map_err(error)?),
            Some(other) => {
                return Err(error(format!(
                    "`transcoders` is {other}; expected a list of files"
                )));
            }
        };
        Ok(SetConfig {
            path: path.to_path_buf(),
            input_hook: string("feature_input_hook")?,
            output_hook: string("feature_output_hook")?,
            listed,
        })
    }

    fn folder(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    /// Layer `layer`'s dictionary, loaded from `file`.
    fn load_layer(&self, layer: usize, file: &Path, device: &Device) -> Result<Dictionary> {
        let input = format!("blocks.{layer}.{}", self.input_hook);
        let output = format!("blocks.{layer}.{}", self.output_hook);
        if file.extension().is_some_and(|e| e == "npz") {
            return npz::load_transcoder(file, input, output, device);
        }
        let checkpoint = Checkpoint::open_file(file)?;
        let error = |message: String| Error::Dictionary {
            path: file.to_path_buf(),
            message,
        };
        let width = |key: &str| match checkpoint.shape(key).as_deref() {
            Some(&[n]) => Ok(n),
            Some(other) => Err(error(format!(
                "`{key}` has shape {other:?}; expected one axis"
            ))),
            None => Err(error(format!(
                "no tensor `{key}` (a circuit-tracer layer holds W_enc, W_dec, b_enc, b_dec)"
            ))),
        };
        let (features, d_model) = (width("b_enc")?, width("b_dec")?);
        let activation = match checkpoint.contains(NAMES.threshold) {
            true => Activation::JumpRelu,
            false => Activation::Relu,
        };
        let config = DictionaryConfig {
            skip: checkpoint.contains("W_skip"),
            ..DictionaryConfig::plain(file, activation, d_model, features)?
                .transcoder(input, output)
        };
        if activation == Activation::JumpRelu {
            // circuit-tracer's JumpReLU is `x · (x > θ)`, SAELens' (which hookscope runs)
            // `relu(x) · (x > θ)`: the same wherever no threshold is negative.
            let (thresholds, _) = checkpoint.tensor_f32(NAMES.threshold)?;
            if let Some(at) = thresholds.iter().position(|&t| t < 0.0) {
                return Err(error(format!(
                    "`{}` holds a negative threshold ({} at feature {at}), which lets \
                     negative pre-activations through in circuit-tracer; hookscope runs \
                     thresholds >= 0",
                    NAMES.threshold, thresholds[at]
                )));
            }
        }
        Dictionary::from_checkpoint(config, &checkpoint, NAMES, device)
    }

    /// Where a file the config names is: a hub reference resolved by `hub`, else a path
    /// relative to the config's folder.
    fn locate(&self, named: &str, hub: HubFiles<'_>) -> Result<PathBuf> {
        match named.starts_with("hf://") {
            true => hub(named),
            false => Ok(self.folder().join(named)),
        }
    }

    /// Every layer's file, in layer order.
    fn files(&self, hub: HubFiles<'_>) -> Result<Vec<PathBuf>> {
        let error = |message: String| Error::Dictionary {
            path: self.path.clone(),
            message,
        };
        let mut layers: Vec<(usize, PathBuf)> = match &self.listed {
            Some(listed) => listed
                .iter()
                .map(|(layer, named)| Ok((*layer, self.locate(named, hub)?)))
                .collect::<Result<_>>()?,
            None => layer_files(self.folder())?,
        };
        if layers.is_empty() {
            return Err(error(format!(
                "names no transcoders, and {} holds no layer_L.safetensors",
                self.folder().display()
            )));
        }
        layers.sort_by_key(|(layer, _)| *layer);
        for (expected, (layer, _)) in layers.iter().enumerate() {
            if *layer != expected {
                return Err(error(format!(
                    "has no transcoder for layer {expected} (a set covers layers 0 to its \
                     last, each once; found layer {layer} there)"
                )));
            }
        }
        Ok(layers.into_iter().map(|(_, file)| file).collect())
    }
}

/// The `(layer, file)` entries of a `transcoders` list: plain strings (the layer is the
/// position) or `{layer, filepath}` mappings.
fn listed_files(entries: &[Value]) -> std::result::Result<Vec<(usize, String)>, String> {
    if entries.len() > MAX_LAYERS {
        return Err(format!(
            "`transcoders` lists {} files; at most {MAX_LAYERS} layers are read",
            entries.len()
        ));
    }
    entries
        .iter()
        .enumerate()
        .map(|(index, entry)| match entry {
            Value::String(file) => Ok((index, file.clone())),
            Value::Object(fields) => {
                let layer = fields.get("layer").and_then(Value::as_u64);
                let file = fields.get("filepath").and_then(Value::as_str);
                match (layer, file) {
                    (Some(layer), Some(file)) if layer < MAX_LAYERS as u64 => {
                        Ok((layer as usize, file.to_string()))
                    }
                    _ => Err(format!(
                        "`transcoders[{index}]` is {entry}; expected a file, or `layer` \
                         (below {MAX_LAYERS}) and `filepath`"
                    )),
                }
            }
            other => Err(format!(
                "`transcoders[{index}]` is {other}; expected a file"
            )),
        })
        .collect()
}

/// The layer a file named `layer_{L}.safetensors` is for.
fn layer_of(file: &Path) -> Option<usize> {
    let name = file.file_name()?.to_str()?;
    let digits = name.strip_prefix("layer_")?.strip_suffix(".safetensors")?;
    match digits.bytes().all(|b| b.is_ascii_digit()) {
        true => digits.parse().ok().filter(|&layer| layer < MAX_LAYERS),
        false => None,
    }
}

/// The `layer_{L}.safetensors` files of `folder`.
fn layer_files(folder: &Path) -> Result<Vec<(usize, PathBuf)>> {
    let io = |source| Error::Io {
        path: folder.to_path_buf(),
        source,
    };
    let mut found = Vec::new();
    for entry in std::fs::read_dir(folder).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if let Some(layer) = layer_of(&path) {
            found.push((layer, path));
        }
    }
    Ok(found)
}

/// The `config.yaml` of the set a dictionary file belongs to: in the file's folder (a layer
/// file beside it) or the one above (a Gemma Scope `layer_L/params.npz` the config lists).
pub(super) fn set_holding(file: &Path) -> Option<PathBuf> {
    file.ancestors()
        .skip(1)
        .take(2)
        .map(|folder| folder.join(CONFIG))
        .find(|config| config.is_file())
}

/// Loads every layer of the set `config` (a `config.yaml`) describes.
pub(super) fn load_set(
    config: &Path,
    device: &Device,
    hub: HubFiles<'_>,
) -> Result<Vec<Dictionary>> {
    let set = SetConfig::read(config)?;
    let files = set.files(hub)?;
    files
        .iter()
        .enumerate()
        .map(|(layer, file)| set.load_layer(layer, file, device))
        .collect()
}

/// Loads one layer's `file` of the set `config` describes: the layer its entry in the
/// config's list gives, else the one its name (`layer_{L}.safetensors`) gives.
pub(super) fn load_layer_file(config: &Path, file: &Path, device: &Device) -> Result<Dictionary> {
    let set = SetConfig::read(config)?;
    let same = |named: &str| {
        let path = set.folder().join(named);
        path == file || path.canonicalize().ok() == file.canonicalize().ok()
    };
    let listed = set.listed.as_ref().and_then(|listed| {
        listed
            .iter()
            .find(|(_, named)| !named.starts_with("hf://") && same(named))
            .map(|(layer, _)| *layer)
    });
    let layer = listed
        .or_else(|| layer_of(file))
        .ok_or_else(|| Error::Dictionary {
            path: file.to_path_buf(),
            message: format!(
                "is neither listed in {} nor named layer_L.safetensors, so its layer is unknown",
                config.display()
            ),
        })?;
    set.load_layer(layer, file, device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_numbers_come_from_file_names() {
        assert_eq!(layer_of(Path::new("a/layer_12.safetensors")), Some(12));
        assert_eq!(layer_of(Path::new("layer_0.safetensors")), Some(0));
        for name in [
            "layer_.safetensors",
            "layer_x.safetensors",
            "layer_1.npz",
            "l_1.safetensors",
        ] {
            assert_eq!(layer_of(Path::new(name)), None, "{name}");
        }
        assert_eq!(
            layer_of(Path::new("layer_99999999999999999999.safetensors")),
            None
        );
    }

    #[test]
    fn both_list_layouts_and_their_errors() {
        let strings = [
            Value::from("a.safetensors"),
            Value::from("hf://o/r/b.safetensors"),
        ];
        assert_eq!(
            listed_files(&strings).unwrap(),
            vec![
                (0, "a.safetensors".to_string()),
                (1, "hf://o/r/b.safetensors".to_string())
            ]
        );
        let mapping: Value = serde_json::json!({"id": "x", "layer": 3, "filepath": "c.npz"});
        assert_eq!(
            listed_files(&[mapping]).unwrap(),
            vec![(3, "c.npz".to_string())]
        );
        let bad: Value = serde_json::json!({"layer": -1, "filepath": "c.npz"});
        assert!(listed_files(&[bad]).unwrap_err().contains("transcoders[0]"));
        assert!(
            listed_files(&[Value::from(7)])
                .unwrap_err()
                .contains("transcoders[0]")
        );
    }

    fn config(text: &str) -> Result<SetConfig> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CONFIG);
        std::fs::write(&path, text).unwrap();
        SetConfig::read(&path)
    }

    #[test]
    fn configs_are_read_or_refused_naming_the_key() {
        let set = config(
            "model_kind: transcoder_set\nfeature_input_hook: mlp.hook_in\n\
             feature_output_hook: mlp.hook_out\ntranscoders:\n  - layer_0.safetensors\n",
        )
        .unwrap();
        assert_eq!(
            (set.input_hook.as_str(), set.output_hook.as_str()),
            ("mlp.hook_in", "mlp.hook_out")
        );
        assert_eq!(set.listed.unwrap().len(), 1);
        for (text, says) in [
            ("model_kind: cross_layer_transcoder\n", "cross-layer"),
            (
                "feature_output_hook: hook_mlp_out\n",
                "`feature_input_hook` is missing",
            ),
            (
                "feature_input_hook: 3\nfeature_output_hook: x\n",
                "`feature_input_hook` is 3",
            ),
            (
                "feature_input_hook: a\nfeature_output_hook: b\ntranscoders: 5\n",
                "`transcoders` is 5",
            ),
            ("feature_input_hook: [unclosed\n", "YAML"),
        ] {
            let message = config(text).err().unwrap().to_string();
            assert!(
                message.contains(says) && message.contains(CONFIG),
                "{message}"
            );
        }
    }
}

//! A dictionary's settings, read from SAELens' `cfg.json` (both its current layout, with the hook
//! under `metadata`, and the flat layout of releases before 6.0), or given for a Gemma Scope
//! `params.npz`, which ships without one.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};

/// How the features are computed from the encoder's pre-activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `relu(pre)` (SAELens' `standard` and `transcoder`).
    Relu,
    /// The `k` largest pre-activations, through a ReLU; the rest zero (`topk`).
    TopK {
        /// Features kept per token.
        k: usize,
    },
    /// `relu(pre)` where `pre > threshold`, else zero (`jumprelu`, Gemma Scope).
    JumpRelu,
    /// A gate path chooses the features and a magnitude path sizes them (`gated`).
    Gated,
}

/// How the input is normalised before encoding (and the reconstruction un-normalised).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Normalization {
    /// None (also SAELens' `expected_average_only_in`, which runs as none at inference).
    None,
    /// Each row scaled to norm `sqrt(d_in)`, the reconstruction scaled back.
    ConstantNormRescale,
    /// Each row standardised (mean 0, unbiased std 1, `eps = 1e-5` added to the std), the
    /// reconstruction mapped back.
    LayerNorm,
}

/// A dictionary's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct DictionaryConfig {
    /// The file the settings came from (for messages).
    pub path: PathBuf,
    /// The activation.
    pub activation: Activation,
    /// Whether it is a transcoder (reads one site, writes another).
    pub transcoder: bool,
    /// Whether a transcoder has a skip connection `W_skip`.
    pub skip: bool,
    /// Input width.
    pub d_in: usize,
    /// Output width (`d_in` for a sparse autoencoder).
    pub d_out: usize,
    /// Number of features.
    pub features: usize,
    /// Whether `b_dec` is subtracted from the input before encoding.
    pub apply_b_dec_to_input: bool,
    /// Input normalisation.
    pub normalization: Normalization,
    /// TopK: whether pre-activations are scaled by the decoder rows' norms (and the features
    /// divided by them before decoding).
    pub rescale_by_decoder_norm: bool,
    /// The site it was trained on, as the file names it (a TransformerLens hook name or a
    /// hookscope site), if it names one.
    pub hook: Option<String>,
    /// A transcoder's output site, as the file names it.
    pub hook_out: Option<String>,
    /// The one head of a per-head site it reads (`hook_head_index`).
    pub head: Option<usize>,
}

/// Largest dictionary width accepted, before any allocation: far above any released
/// dictionary (Gemma Scope's largest has 2^20 features).
const MAX_FEATURES: usize = 1 << 24;
/// Largest input or output width accepted.
const MAX_WIDTH: usize = 1 << 20;

impl DictionaryConfig {
    /// Reads SAELens' `cfg.json`.
    pub fn from_sae_lens(path: &Path) -> Result<Self> {
        let json = crate::config::read_json(path)?;
        let fields = Fields { path, json: &json };
        let architecture = fields.string("architecture")?.unwrap_or("standard".into());
        let activation_fn = fields.string("activation_fn_str")?;
        let (activation, transcoder, skip) = match architecture.as_str() {
            "standard" if activation_fn.as_deref() == Some("topk") => {
                let k = fields
                    .nested_usize(&["activation_fn_kwargs", "k"])?
                    .ok_or_else(|| {
                        fields.error(
                            "`activation_fn_str` is topk but `activation_fn_kwargs.k` is missing",
                        )
                    })?;
                (Activation::TopK { k }, false, false)
            }
            "standard" => (Activation::Relu, false, false),
            "topk" | "batchtopk" => {
                let k = fields
                    .usize("k")?
                    .ok_or_else(|| fields.error("`architecture` is topk but `k` is missing"))?;
                (Activation::TopK { k }, false, false)
            }
            "jumprelu" => (Activation::JumpRelu, false, false),
            "gated" => (Activation::Gated, false, false),
            "transcoder" => (Activation::Relu, true, false),
            "skip_transcoder" => (Activation::Relu, true, true),
            "jumprelu_transcoder" => (Activation::JumpRelu, true, false),
            "jumprelu_skip_transcoder" => (Activation::JumpRelu, true, true),
            other => {
                return Err(fields.error(&format!(
                    "`architecture` is `{other}`; hookscope runs standard, topk, batchtopk, \
                     jumprelu, gated, transcoder, skip_transcoder, jumprelu_transcoder and \
                     jumprelu_skip_transcoder"
                )));
            }
        };
        if let Some(other) = activation_fn.as_deref()
            && !matches!(other, "relu" | "topk")
        {
            return Err(fields.error(&format!(
                "`activation_fn_str` is `{other}`; hookscope runs relu and topk"
            )));
        }
        let d_in = fields.required_usize("d_in")?;
        let features = fields.required_usize("d_sae")?;
        let d_out = match transcoder {
            true => fields.required_usize("d_out")?,
            false => d_in,
        };
        let normalization = match fields.string("normalize_activations")?.as_deref() {
            None | Some("none") | Some("expected_average_only_in") => Normalization::None,
            Some("constant_norm_rescale") => Normalization::ConstantNormRescale,
            Some("layer_norm") => Normalization::LayerNorm,
            Some(other) => {
                return Err(fields.error(&format!(
                    "`normalize_activations` is `{other}`; hookscope runs none, \
                     expected_average_only_in, constant_norm_rescale and layer_norm"
                )));
            }
        };
        if transcoder && normalization != Normalization::None {
            return Err(fields.error(
                "a transcoder with `normalize_activations` other than none has no defined \
                 output scale (SAELens does not undo it either)",
            ));
        }
        let apply_b_dec_to_input = fields.bool("apply_b_dec_to_input")?.unwrap_or(!transcoder);
        if transcoder && apply_b_dec_to_input {
            return Err(fields.error(
                "`apply_b_dec_to_input` is true for a transcoder, whose b_dec is sized by its \
                 output, not its input",
            ));
        }
        let reshape = fields.string("reshape_activations")?;
        if let Some(other) = reshape.as_deref()
            && !matches!(other, "none" | "hook_z")
        {
            return Err(fields.error(&format!(
                "`reshape_activations` is `{other}`; hookscope runs none and hook_z"
            )));
        }
        let config = DictionaryConfig {
            path: path.to_path_buf(),
            activation,
            transcoder,
            skip,
            d_in,
            d_out,
            features,
            apply_b_dec_to_input,
            normalization,
            rescale_by_decoder_norm: fields
                .bool("rescale_acts_by_decoder_norm")?
                .unwrap_or(false),
            hook: fields.metadata_string("hook_name")?,
            hook_out: fields.metadata_string("hook_name_out")?,
            head: fields.metadata_usize("hook_head_index")?,
        };
        config.check_sizes()?;
        Ok(config)
    }

    /// The settings of a Gemma Scope `params.npz` (JumpReLU, no input normalisation, `b_dec`
    /// not subtracted from the input), sized by its stored matrices.
    pub fn gemma_scope(path: &Path, d_in: usize, features: usize) -> Result<Self> {
        DictionaryConfig::plain(path, Activation::JumpRelu, d_in, features)
    }

    /// A sparse autoencoder of `activation` with no input normalisation and no `b_dec`
    /// subtracted from its input (Gemma Scope's and circuit-tracer's files, which carry no
    /// such settings).
    pub fn plain(
        path: &Path,
        activation: Activation,
        d_in: usize,
        features: usize,
    ) -> Result<Self> {
        let config = DictionaryConfig {
            path: path.to_path_buf(),
            activation,
            transcoder: false,
            skip: false,
            d_in,
            d_out: d_in,
            features,
            apply_b_dec_to_input: false,
            normalization: Normalization::None,
            rescale_by_decoder_norm: false,
            hook: None,
            hook_out: None,
            head: None,
        };
        config.check_sizes()?;
        Ok(config)
    }

    /// The same settings as a transcoder (no `b_dec` subtracted from its input) from hook
    /// `input` to hook `output`: a layer of a circuit-tracer set.
    pub fn transcoder(self, input: String, output: String) -> Self {
        DictionaryConfig {
            transcoder: true,
            apply_b_dec_to_input: false,
            hook: Some(input),
            hook_out: Some(output),
            ..self
        }
    }

    /// Refuses widths no dictionary has, before anything is allocated from them.
    fn check_sizes(&self) -> Result<()> {
        let error = |message: String| Error::Dictionary {
            path: self.path.clone(),
            message,
        };
        for (key, value, max) in [
            ("d_in", self.d_in, MAX_WIDTH),
            ("d_out", self.d_out, MAX_WIDTH),
            ("d_sae", self.features, MAX_FEATURES),
        ] {
            if value == 0 || value > max {
                return Err(error(format!("`{key}` is {value}; expected 1..={max}")));
            }
        }
        if let Activation::TopK { k } = self.activation
            && (k == 0 || k > self.features)
        {
            return Err(error(format!(
                "`k` is {k}; expected 1..={} (the number of features)",
                self.features
            )));
        }
        Ok(())
    }
}

/// Typed reads of one `cfg.json`, with errors naming the file and key.
struct Fields<'a> {
    path: &'a Path,
    json: &'a Value,
}

impl Fields<'_> {
    fn error(&self, message: &str) -> Error {
        Error::Dictionary {
            path: self.path.to_path_buf(),
            message: message.to_string(),
        }
    }

    fn wrong(&self, key: &str, expected: &str, got: &Value) -> Error {
        self.error(&format!("`{key}` is {got}; expected {expected}"))
    }

    /// `key` at the top level, or (SAELens 6 moved the hook there) under `metadata`.
    fn lookup(&self, key: &str) -> Option<&Value> {
        self.json
            .get(key)
            .filter(|v| !v.is_null())
            .or_else(|| self.json.get("metadata")?.get(key))
            .filter(|v| !v.is_null())
    }

    fn string(&self, key: &str) -> Result<Option<String>> {
        match self.json.get(key).filter(|v| !v.is_null()) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.wrong(key, "a string", other)),
        }
    }

    fn metadata_string(&self, key: &str) -> Result<Option<String>> {
        match self.lookup(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.wrong(key, "a string", other)),
        }
    }

    fn as_usize(&self, key: &str, value: &Value) -> Result<usize> {
        value
            .as_u64()
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| self.wrong(key, "a non-negative integer", value))
    }

    fn usize(&self, key: &str) -> Result<Option<usize>> {
        self.json
            .get(key)
            .filter(|v| !v.is_null())
            .map(|v| self.as_usize(key, v))
            .transpose()
    }

    fn metadata_usize(&self, key: &str) -> Result<Option<usize>> {
        self.lookup(key).map(|v| self.as_usize(key, v)).transpose()
    }

    fn nested_usize(&self, keys: &[&str]) -> Result<Option<usize>> {
        let value = keys
            .iter()
            .try_fold(self.json, |value, key| value.get(key))
            .filter(|v| !v.is_null());
        value.map(|v| self.as_usize(&keys.join("."), v)).transpose()
    }

    fn required_usize(&self, key: &str) -> Result<usize> {
        self.usize(key)?
            .ok_or_else(|| self.error(&format!("`{key}` is missing")))
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.json.get(key).filter(|v| !v.is_null()) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.wrong(key, "true or false", other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<DictionaryConfig> {
        let dir = std::env::temp_dir().join(format!(
            "hookscope-dictionary-config-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cfg.json");
        std::fs::write(&path, json).unwrap();
        let config = DictionaryConfig::from_sae_lens(&path);
        std::fs::remove_dir_all(&dir).unwrap();
        config
    }

    #[test]
    fn both_cfg_layouts_name_the_hook() {
        let current = parse(
            r#"{"architecture": "topk", "k": 3, "d_in": 8, "d_sae": 16,
                "metadata": {"hook_name": "blocks.1.attn.hook_z", "hook_head_index": 2}}"#,
        )
        .unwrap();
        assert_eq!(current.activation, Activation::TopK { k: 3 });
        assert_eq!(current.hook.as_deref(), Some("blocks.1.attn.hook_z"));
        assert_eq!(current.head, Some(2));
        assert!(current.apply_b_dec_to_input);
        let flat = parse(
            r#"{"architecture": "standard", "activation_fn_str": "topk",
                "activation_fn_kwargs": {"k": 5}, "d_in": 8, "d_sae": 16,
                "hook_name": "blocks.0.hook_resid_pre", "hook_head_index": null}"#,
        )
        .unwrap();
        assert_eq!(flat.activation, Activation::TopK { k: 5 });
        assert_eq!(flat.hook.as_deref(), Some("blocks.0.hook_resid_pre"));
        assert_eq!(flat.head, None);
    }

    #[test]
    fn every_architecture_maps_to_its_activation_and_kind() {
        for (architecture, activation, transcoder, skip) in [
            ("standard", Activation::Relu, false, false),
            ("batchtopk", Activation::TopK { k: 2 }, false, false),
            ("jumprelu", Activation::JumpRelu, false, false),
            ("gated", Activation::Gated, false, false),
            ("transcoder", Activation::Relu, true, false),
            ("skip_transcoder", Activation::Relu, true, true),
            ("jumprelu_transcoder", Activation::JumpRelu, true, false),
            ("jumprelu_skip_transcoder", Activation::JumpRelu, true, true),
        ] {
            let json = format!(
                r#"{{"architecture": "{architecture}", "k": 2, "d_in": 8, "d_sae": 16,
                    "d_out": 6, "apply_b_dec_to_input": false,
                    "normalize_activations": "expected_average_only_in"}}"#
            );
            let config = parse(&json).unwrap();
            assert_eq!(
                (config.activation, config.transcoder, config.skip),
                (activation, transcoder, skip),
                "{architecture}"
            );
            assert_eq!(
                config.d_out,
                if transcoder { 6 } else { 8 },
                "{architecture}"
            );
            assert_eq!(config.normalization, Normalization::None);
        }
    }

    #[test]
    fn bad_settings_name_the_file_and_key() {
        for (json, says) in [
            (
                r#"{"architecture": "mystery", "d_in": 8, "d_sae": 16}"#,
                "`architecture` is `mystery`",
            ),
            (r#"{"d_in": 8}"#, "`d_sae` is missing"),
            (r#"{"d_in": -8, "d_sae": 16}"#, "`d_in` is -8"),
            (r#"{"d_in": 0, "d_sae": 16}"#, "`d_in` is 0"),
            (
                r#"{"architecture": "topk", "k": 17, "d_in": 8, "d_sae": 16}"#,
                "`k` is 17",
            ),
            (
                r#"{"d_in": 8, "d_sae": 16, "normalize_activations": "covariance_whitening"}"#,
                "covariance_whitening",
            ),
            (
                r#"{"architecture": "transcoder", "d_in": 8, "d_sae": 16, "d_out": 8, "apply_b_dec_to_input": true}"#,
                "apply_b_dec_to_input",
            ),
            (
                r#"{"d_in": 8, "d_sae": 99999999999}"#,
                "`d_sae` is 99999999999",
            ),
        ] {
            let message = parse(json).unwrap_err().to_string();
            assert!(
                message.contains("cfg.json") && message.contains(says),
                "{message}"
            );
        }
    }
}

//! `config.json` of Gemma checkpoints, read as transformers 5.24 reads each generation's, with
//! its defaults where a key is absent.

use hookscope_core::config::{AttentionHeads, HeadDim, HeadKeys, layer_windows, sliding_layers};
use hookscope_core::nn::{Activation, Rope, RopeParameters, RopeRules, RotaryFraction};
use hookscope_core::{ArchConfig, Result};
use serde::Deserialize;
use serde_json::Value;

/// The Gemma generation a checkpoint belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Generation {
    /// `gemma`: Llama's layer with `(1 + w)` norms, a scaled embedding and GeGLU.
    Gemma,
    /// `gemma2`: sandwich norms, alternating sliding-window layers, soft-capped scores and
    /// logits, `query_pre_attn_scalar`.
    Gemma2,
    /// `gemma3_text` (and `gemma3`'s language model): Gemma 2 without the soft-caps, with
    /// per-head q/k norms and a rotary per layer type.
    Gemma3,
}

impl Generation {
    /// The generation of a language-model config's `model_type`.
    pub fn of(model_type: Option<&str>) -> Option<Generation> {
        match model_type? {
            "gemma" => Some(Generation::Gemma),
            "gemma2" => Some(Generation::Gemma2),
            "gemma3_text" | "gemma3" => Some(Generation::Gemma3),
            _ => None,
        }
    }
}

/// The fields the forward pass depends on; absent ones take the generation's default.
#[derive(Debug, Clone, Deserialize)]
pub struct GemmaConfig {
    /// `gemma`, `gemma2` or `gemma3_text`.
    #[serde(default)]
    pub model_type: Option<String>,
    /// Vocabulary size (Gemma 3's default: 262208; Gemma-3-4B's `text_config` leaves it out).
    #[serde(default)]
    pub vocab_size: Option<usize>,
    /// Hidden size.
    pub hidden_size: usize,
    /// MLP inner size.
    pub intermediate_size: usize,
    /// Blocks.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads; defaults to the query heads.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Head dimension (independent of hidden / heads); 256 by default.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Longest sequence (for the `dynamic` rotary).
    #[serde(default)]
    pub max_position_embeddings: Option<usize>,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// Gemma 1's MLP activation.
    #[serde(default)]
    pub hidden_act: Option<String>,
    /// Gemma 2's and 3's MLP activation.
    #[serde(default)]
    pub hidden_activation: Option<String>,
    /// Biases on q/k/v/o.
    #[serde(default)]
    pub attention_bias: bool,
    /// Whether the head shares the embedding table (true by default).
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    /// The scores are scaled by `query_pre_attn_scalar^-0.5` (Gemma 2 and 3; 256 by default).
    #[serde(default)]
    pub query_pre_attn_scalar: Option<f64>,
    /// The window of the sliding-attention layers (4096 by default).
    #[serde(default = "default_window")]
    pub sliding_window: Option<usize>,
    /// `sliding_attention` or `full_attention` per layer.
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// The hub's older form of `layer_types` (Gemma 3): every `n`-th layer is full.
    #[serde(default)]
    pub sliding_window_pattern: Option<usize>,
    /// Soft-cap of the logits (absent: Gemma 2's default 30, Gemma 3's none).
    #[serde(default)]
    pub final_logit_softcapping: Cap,
    /// Soft-cap of the attention scores (absent: Gemma 2's default 50, Gemma 3's none).
    #[serde(default)]
    pub attn_logit_softcapping: Cap,
    /// Bidirectional attention (unsupported).
    #[serde(default)]
    pub use_bidirectional_attention: Option<bool>,
    /// Old-style rotary base (Gemma 3: the full-attention layers').
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// Gemma 3's old-style base of the sliding-attention layers.
    #[serde(default)]
    pub rope_local_base_freq: Option<f64>,
    /// Rotary parameters: one object, or (Gemma 3) one per layer type.
    #[serde(default)]
    pub rope_parameters: Option<Value>,
    /// Old-style rotary scaling (Gemma 3: the full-attention layers').
    #[serde(default)]
    pub rope_scaling: Option<RopeParameters>,
}

fn default_eps() -> f64 {
    1e-6
}
fn default_window() -> Option<usize> {
    Some(4096)
}

/// A soft-cap key, whose absence means the generation's default and whose `null` means no cap.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum Cap {
    /// The key is absent.
    #[default]
    Absent,
    /// The key holds this value (`null`: none).
    Set(Option<f64>),
}

impl<'de> Deserialize<'de> for Cap {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Option::<f64>::deserialize(deserializer).map(Cap::Set)
    }
}

impl Cap {
    /// The cap, `default` where the key is absent.
    fn or(self, default: Option<f64>) -> Option<f64> {
        match self {
            Cap::Absent => default,
            Cap::Set(cap) => cap,
        }
    }
}

/// Gemma 3's default bases: the full-attention layers' and the sliding ones'.
const GEMMA3_THETA: (f64, f64) = (1_000_000.0, 10_000.0);

impl GemmaConfig {
    /// The vocabulary size, or the generation's default.
    pub fn vocab_size(&self, generation: Generation) -> usize {
        self.vocab_size.unwrap_or(match generation {
            Generation::Gemma | Generation::Gemma2 => 256_000,
            Generation::Gemma3 => 262_208,
        })
    }

    /// The attention heads; refuses what this adapter would get wrong, with the reason.
    pub fn heads(&self, config: &ArchConfig) -> Result<AttentionHeads> {
        if self.use_bidirectional_attention == Some(true) {
            return Err(config.unsupported("use_bidirectional_attention"));
        }
        AttentionHeads::check(
            config,
            HeadKeys::LLAMA,
            (
                self.hidden_size,
                self.num_attention_heads,
                self.num_key_value_heads,
            ),
            HeadDim::Declared(Some(self.head_dim.unwrap_or(256))),
        )
    }

    /// The MLP's activation: Gemma 1's `hidden_act`, the others' `hidden_activation`.
    pub fn activation(&self, config: &ArchConfig, generation: Generation) -> Result<Activation> {
        let (key, name) = match generation {
            Generation::Gemma => ("hidden_act", &self.hidden_act),
            Generation::Gemma2 | Generation::Gemma3 => {
                ("hidden_activation", &self.hidden_activation)
            }
        };
        Activation::from_config(config, key, name.as_deref().unwrap_or("gelu_pytorch_tanh"))
    }

    /// The factor on `Q Kᵀ`: Gemma 1's `1/sqrt(head_dim)`, the others'
    /// `query_pre_attn_scalar^-0.5`.
    pub fn score_scale(
        &self,
        config: &ArchConfig,
        generation: Generation,
        head_dim: usize,
    ) -> Result<f64> {
        let scalar = match generation {
            Generation::Gemma => head_dim as f64,
            Generation::Gemma2 | Generation::Gemma3 => self.query_pre_attn_scalar.unwrap_or(256.0),
        };
        if !(scalar > 0.0 && scalar.is_finite()) {
            return Err(config.unsupported(format!(
                "query_pre_attn_scalar must be positive, got {scalar}"
            )));
        }
        Ok(scalar.powf(-0.5))
    }

    /// Each layer's sliding window (`None`: the layer attends to the whole context): Gemma 1
    /// has none; Gemma 2's and 3's `sliding_attention` layers of `layer_types`, by default
    /// every layer but each second (Gemma 2) or each `sliding_window_pattern`-th (Gemma 3, 6).
    pub fn windows(
        &self,
        config: &ArchConfig,
        generation: Generation,
    ) -> Result<Vec<Option<usize>>> {
        let layers = self.num_hidden_layers;
        let pattern = match generation {
            Generation::Gemma => return Ok(vec![None; layers]),
            Generation::Gemma2 => 2,
            Generation::Gemma3 => self.sliding_window_pattern.unwrap_or(6),
        };
        let sliding: Vec<bool> = match &self.layer_types {
            Some(types) => sliding_layers(config, types, layers)?,
            None if pattern == 0 => {
                return Err(config.unsupported("sliding_window_pattern is 0"));
            }
            None => (0..layers).map(|i| (i + 1) % pattern != 0).collect(),
        };
        layer_windows(config, &sliding, self.sliding_window)
    }

    /// The score soft-cap: Gemma 2's (50 by default). Gemma 3's `attn_logit_softcapping` is
    /// never applied by transformers 5.24 (its attention does not pass it on), so neither is it
    /// here; the second value says whether the config sets one that is ignored so.
    pub fn score_softcap(&self, generation: Generation) -> (Option<f64>, bool) {
        let cap = self.attn_logit_softcapping;
        match generation {
            Generation::Gemma2 => (cap.or(Some(50.0)), false),
            Generation::Gemma => (None, false),
            Generation::Gemma3 => (None, cap.or(None).is_some()),
        }
    }

    /// The logit soft-cap of a causal LM (Gemma 2: 30 by default; Gemma 3: none by default).
    /// `multimodal`: Gemma3ForConditionalGeneration's head, which transformers 5.24 never caps;
    /// the second value says whether the config sets a cap that is ignored so.
    pub fn logit_softcap(&self, generation: Generation, multimodal: bool) -> (Option<f64>, bool) {
        let cap = self.final_logit_softcapping;
        match (generation, multimodal) {
            (Generation::Gemma, _) => (None, false),
            (Generation::Gemma2, _) => (cap.or(Some(30.0)), false),
            (Generation::Gemma3, false) => (cap.or(None), false),
            (Generation::Gemma3, true) => (None, cap.or(None).is_some()),
        }
    }

    /// The rotary of the full-attention layers and, for Gemma 3, the sliding ones' own.
    pub fn ropes(
        &self,
        config: &ArchConfig,
        generation: Generation,
    ) -> Result<(Rope, Option<Rope>)> {
        let max_positions = self.max_position_embeddings.unwrap_or(match generation {
            Generation::Gemma | Generation::Gemma2 => 8192,
            Generation::Gemma3 => 131_072,
        });
        let rules = |theta| RopeRules {
            scaled: Some(max_positions),
            original_max_positions: None,
            theta,
            fraction: RotaryFraction::Full,
        };
        let per_type = |key: &str| -> Result<Option<RopeParameters>> {
            let params = self.rope_parameters.as_ref().and_then(|p| p.get(key));
            match params {
                None | Some(Value::Null) => Ok(None),
                Some(params) => serde_json::from_value(params.clone())
                    .map(Some)
                    .map_err(|e| config.unsupported(format!("rope_parameters.{key}: {e}"))),
            }
        };
        match generation {
            Generation::Gemma | Generation::Gemma2 => {
                let params: Option<RopeParameters> = match &self.rope_parameters {
                    None | Some(Value::Null) => self.rope_scaling.clone(),
                    Some(params) => Some(
                        serde_json::from_value(params.clone())
                            .map_err(|e| config.unsupported(format!("rope_parameters: {e}")))?,
                    ),
                };
                let rope = Rope::parse(config, params.as_ref(), rules(self.rope_theta))?;
                Ok((rope, None))
            }
            Generation::Gemma3 => {
                let (global_theta, local_theta) = GEMMA3_THETA;
                let full = per_type("full_attention")?.or_else(|| self.rope_scaling.clone());
                let full_theta = self.rope_theta.unwrap_or(global_theta);
                let full = Rope::parse(config, full.as_ref(), rules(Some(full_theta)))?;
                let sliding = per_type("sliding_attention")?;
                let local_theta = self.rope_local_base_freq.unwrap_or(local_theta);
                let sliding = Rope::parse(config, sliding.as_ref(), rules(Some(local_theta)))?;
                Ok((full, Some(sliding)))
            }
        }
    }
}

//! `config.json` of Llama-family checkpoints, and what of it this adapter can run.

use hookscope_core::config::{AttentionHeads, HeadDim, HeadKeys, layer_windows, sliding_layers};
use hookscope_core::nn::{QkNorm, Rope, RopeParameters, RopeRules, RotaryFraction};
use hookscope_core::{ArchConfig, Result};
use serde::Deserialize;

/// The fields the forward pass depends on.
#[derive(Debug, Clone, Deserialize)]
pub struct LlamaConfig {
    /// `llama`, `mistral`, `qwen2` or `qwen3`.
    pub model_type: String,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden size.
    pub hidden_size: usize,
    /// MLP inner size.
    pub intermediate_size: usize,
    /// Blocks.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention); defaults to the query heads.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Head dimension; defaults to `hidden_size / num_attention_heads` (Qwen3: 128).
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Longest sequence.
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// MLP activation.
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Biases on q/k/v/o (Llama's `attention_bias`; Qwen2 always has q/k/v biases).
    #[serde(default)]
    pub attention_bias: bool,
    /// Biases on the MLP projections.
    #[serde(default)]
    pub mlp_bias: bool,
    /// Whether the head shares the embedding table.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// The sliding window (Mistral: every layer's; Qwen2: the layers `layer_types` or
    /// `max_window_layers` name, when `use_sliding_window`).
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// Qwen2's switch for its sliding window.
    #[serde(default)]
    pub use_sliding_window: bool,
    /// Qwen2/3: the layers below this index attend to the whole context.
    #[serde(default)]
    pub max_window_layers: Option<usize>,
    /// Qwen2/3: `sliding_attention` or `full_attention` per layer.
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// Old-style rotary base.
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// New-style rotary parameters.
    #[serde(default)]
    pub rope_parameters: Option<RopeParameters>,
    /// Old-style rotary scaling.
    #[serde(default)]
    pub rope_scaling: Option<RopeParameters>,
    /// Llama 2's tensor-parallel pretraining split (unsupported when > 1).
    #[serde(default)]
    pub pretraining_tp: Option<usize>,
}

fn default_eps() -> f64 {
    1e-6
}
fn default_act() -> String {
    "silu".into()
}

impl LlamaConfig {
    /// Per-head RMSNorm of queries and keys (Qwen3's `q_norm`/`k_norm`), if the model has it.
    pub fn qk_norm(&self) -> Option<QkNorm> {
        (self.model_type == "qwen3").then_some(QkNorm {
            eps: self.rms_norm_eps,
            unit_offset: false,
        })
    }

    /// Whether q/k/v carry biases, and whether o does.
    pub fn attention_biases(&self) -> (bool, bool) {
        match self.model_type.as_str() {
            "qwen2" => (true, false),
            // Qwen3's `attention_bias` covers q/k/v/o, as Llama's does.
            _ => (self.attention_bias, self.attention_bias),
        }
    }

    /// The attention heads; refuses what this adapter would get wrong, with the reason.
    pub fn check(&self, config: &ArchConfig) -> Result<AttentionHeads> {
        let heads = AttentionHeads::check(
            config,
            HeadKeys::LLAMA,
            (
                self.hidden_size,
                self.num_attention_heads,
                self.num_key_value_heads,
            ),
            HeadDim::Declared(match self.model_type.as_str() {
                "qwen3" => Some(self.head_dim.unwrap_or(128)),
                _ => self.head_dim,
            }),
        )?;
        if self.pretraining_tp.unwrap_or(1) > 1 {
            return Err(config.unsupported("pretraining_tp > 1"));
        }
        Ok(heads)
    }

    /// Each layer's sliding window, as transformers' Mistral and Qwen2/3 decide it: Mistral's
    /// window on every layer; Qwen2's and Qwen3's, when `use_sliding_window`, on the `sliding_attention`
    /// layers of `layer_types` (by default those from `max_window_layers` on); Llama has none.
    pub fn windows(&self, config: &ArchConfig) -> Result<Vec<Option<usize>>> {
        let layers = self.num_hidden_layers;
        let window = self.sliding_window;
        let sliding = match self.model_type.as_str() {
            "mistral" => vec![window.is_some(); layers],
            "qwen2" | "qwen3" if self.use_sliding_window && window.is_some() => {
                match &self.layer_types {
                    Some(types) => sliding_layers(config, types, layers)?,
                    None => {
                        let from = self.max_window_layers.unwrap_or(28);
                        (0..layers).map(|i| i >= from).collect()
                    }
                }
            }
            _ => vec![false; layers],
        };
        layer_windows(config, &sliding, window)
    }

    /// The rotary embedding, from `rope_parameters` or the older `rope_theta` and
    /// `rope_scaling`.
    pub fn rope(&self, config: &ArchConfig) -> Result<Rope> {
        let rules = RopeRules {
            scaled: Some(self.max_position_embeddings),
            theta: self.rope_theta,
            fraction: RotaryFraction::Full,
        };
        let params = self.rope_parameters.as_ref().or(self.rope_scaling.as_ref());
        Rope::parse(config, params, rules)
    }
}

//! `config.json` of Llama-family checkpoints, and what of it this adapter can run.

use hookscope_core::nn::RopeScaling;
use hookscope_core::{ArchConfig, Result};
use serde::Deserialize;
use serde_json::Value;

/// The fields the forward pass depends on.
#[derive(Debug, Clone, Deserialize)]
pub struct LlamaConfig {
    /// `llama`, `mistral` or `qwen2`.
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
    /// Head dimension; defaults to `hidden_size / num_attention_heads`.
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
    /// Mistral's sliding window (unsupported when it is shorter than the context).
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// Qwen2's switch for its sliding window.
    #[serde(default)]
    pub use_sliding_window: bool,
    /// Old-style rotary base.
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// New-style rotary parameters.
    #[serde(default)]
    pub rope_parameters: Option<Value>,
    /// Old-style rotary scaling.
    #[serde(default)]
    pub rope_scaling: Option<Value>,
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
    /// Key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Head dimension.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Whether q/k/v carry biases, and whether o does.
    pub fn attention_biases(&self) -> (bool, bool) {
        match self.model_type.as_str() {
            "qwen2" => (true, false),
            _ => (self.attention_bias, self.attention_bias),
        }
    }

    /// Refuses what this adapter would get wrong, with the reason.
    pub fn check(&self, config: &ArchConfig) -> Result<()> {
        let heads = self.num_attention_heads;
        if heads == 0 || self.kv_heads() == 0 || !heads.is_multiple_of(self.kv_heads()) {
            return Err(config.unsupported(format!(
                "num_attention_heads {heads} is not a multiple of num_key_value_heads {}",
                self.kv_heads()
            )));
        }
        if self.pretraining_tp.unwrap_or(1) > 1 {
            return Err(config.unsupported("pretraining_tp > 1"));
        }
        let window_limits_context =
            |window: Option<usize>| window.is_some_and(|w| w < self.max_position_embeddings);
        let sliding = match self.model_type.as_str() {
            "qwen2" => self.use_sliding_window && window_limits_context(self.sliding_window),
            _ => window_limits_context(self.sliding_window),
        };
        if sliding {
            return Err(config.unsupported(format!(
                "sliding-window attention (sliding_window {:?} < max_position_embeddings {})",
                self.sliding_window, self.max_position_embeddings
            )));
        }
        Ok(())
    }

    /// The rotary base and scaling, from `rope_parameters` or the older `rope_theta` and
    /// `rope_scaling`.
    pub fn rope(&self, config: &ArchConfig) -> Result<(f64, RopeScaling)> {
        let params = self
            .rope_parameters
            .as_ref()
            .or(self.rope_scaling.as_ref())
            .filter(|v| !v.is_null());
        let number = |key: &str| params.and_then(|p| p.get(key)).and_then(Value::as_f64);
        let theta = number("rope_theta").or(self.rope_theta).unwrap_or(10_000.0);
        let kind = params
            .and_then(|p| p.get("rope_type").or_else(|| p.get("type")))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let require = |key: &str| {
            number(key)
                .ok_or_else(|| config.unsupported(format!("rope type `{kind}` needs `{key}`")))
        };
        // What transformers' rope validation checks, in its words.
        if let Some(factor) = number("factor").filter(|f| f.is_nan() || *f < 1.0) {
            return Err(config.unsupported(format!(
                "`rope_parameters`'s factor field must be a float >= 1, got {factor}"
            )));
        }
        if !(theta > 0.0 && theta.is_finite()) {
            return Err(config.unsupported(format!("rope_theta must be positive, got {theta}")));
        }
        if let (Some(low), Some(high)) = (number("low_freq_factor"), number("high_freq_factor"))
            && high <= low
        {
            return Err(config.unsupported(format!(
                "`rope_parameters`'s high_freq_factor field must be greater than \
                 low_freq_factor, got high_freq_factor={high} and low_freq_factor={low}"
            )));
        }
        if number("partial_rotary_factor").is_some_and(|f| f != 1.0) {
            return Err(config.unsupported("partial_rotary_factor != 1"));
        }
        let scaling = match kind {
            "default" => RopeScaling::Default,
            "linear" => RopeScaling::Linear {
                factor: require("factor")?,
            },
            "dynamic" => RopeScaling::Dynamic {
                factor: require("factor")?,
                max_positions: self.max_position_embeddings,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: require("factor")?,
                low_freq_factor: require("low_freq_factor")?,
                high_freq_factor: require("high_freq_factor")?,
                original_max_positions: require("original_max_position_embeddings")?,
            },
            other => {
                return Err(config.unsupported(format!(
                    "rope type `{other}` (supported: default, linear, dynamic, llama3)"
                )));
            }
        };
        Ok((theta, scaling))
    }
}

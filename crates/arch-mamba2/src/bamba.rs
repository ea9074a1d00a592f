//! `BambaForCausalLM` as `transformers` 5.x stores it: Mamba-2 mixers and softmax attention in
//! one model. Layer `i` is attention when `attn_layer_indices` lists it, else a Mamba-2 mixer
//! (`model.layers.{i}.mamba`); every layer is followed by a gated MLP (`feed_forward`). Attention
//! layers rotate half of each head (`partial_rotary_factor` 0.5, which transformers fixes).
//!
//! Mamba-2 layers serve the Mamba-2 sites, attention layers the softmax-attention sites, every
//! layer `mlp_output`; each kind carries its own state (a key/value cache, or a convolution
//! window and SSM state) in the one model cache.

use hookscope_core::config::{AttentionHeads, ConfigFloat, HeadDim, HeadKeys};
use hookscope_core::nn::{
    Activation, DecoderLayer, DecoderOptions, DecoderParts, Embedding, GatedMlp, GatedMlpSpec,
    HybridDecoder, LayerMixer, Linear, LmHead, ProjectedAttention, ProjectedAttentionSpec, RmsNorm,
    Rope, RopeParameters, RopeRules, RotaryFraction,
};
use hookscope_core::{ArchConfig, Result, WeightLoader};
use serde::Deserialize;
use serde_json::Value;

use crate::mamba2::dt_limit;
use crate::mixer::{Mamba2Mixer, MixerSpec};

/// The share of each attention head that rotates: transformers' `BambaConfig` fixes it.
const PARTIAL_ROTARY_FACTOR: f64 = 0.5;

/// `config.json` of a Bamba checkpoint (the fields the forward pass depends on; defaults as
/// `transformers`' `BambaConfig`).
#[derive(Debug, Clone, Deserialize)]
pub struct BambaConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden size.
    pub hidden_size: usize,
    /// MLP inner size.
    pub intermediate_size: usize,
    /// Layers.
    pub num_hidden_layers: usize,
    /// Attention query heads.
    pub num_attention_heads: usize,
    /// Attention key/value heads (default: the query heads).
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Activation of the MLP and of the Mamba-2 convolution.
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Epsilon of every RMSNorm.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// The attention layers; every other layer is a Mamba-2 mixer.
    #[serde(default)]
    pub attn_layer_indices: Option<Vec<usize>>,
    /// Mamba-2 heads (`NH`).
    #[serde(default = "default_mamba_heads")]
    pub mamba_n_heads: usize,
    /// Mamba-2 head dimension (`P`), or `"auto"`: `mamba_expand * hidden_size / mamba_n_heads`.
    #[serde(default)]
    pub mamba_d_head: Option<Value>,
    /// Groups sharing `B` and `C`.
    #[serde(default = "default_one")]
    pub mamba_n_groups: usize,
    /// State size (`N`).
    #[serde(default = "default_mamba_state")]
    pub mamba_d_state: usize,
    /// Convolution width.
    #[serde(default = "default_kernel")]
    pub mamba_d_conv: usize,
    /// Inner size factor.
    #[serde(default = "default_expand")]
    pub mamba_expand: usize,
    /// Chunk length of the prompt call's scan.
    #[serde(default = "default_chunk")]
    pub mamba_chunk_size: usize,
    /// Bias on the convolution.
    #[serde(default = "default_true")]
    pub mamba_conv_bias: bool,
    /// Biases on `in_proj` and `out_proj`.
    #[serde(default)]
    pub mamba_proj_bias: bool,
    /// Bounds of `dt`.
    #[serde(default)]
    pub time_step_limit: Option<(ConfigFloat, ConfigFloat)>,
    /// Biases on q/k/v/o.
    #[serde(default)]
    pub attention_bias: bool,
    /// Biases on the MLP projections.
    #[serde(default)]
    pub mlp_bias: bool,
    /// Rotary parameters (new style).
    #[serde(default)]
    pub rope_parameters: Option<RopeParameters>,
    /// Rotary base (old style).
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// Whether the head shares the embedding table.
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

fn default_act() -> String {
    "silu".into()
}
fn default_eps() -> f64 {
    1e-5
}
fn default_mamba_heads() -> usize {
    128
}
fn default_one() -> usize {
    1
}
fn default_mamba_state() -> usize {
    256
}
fn default_kernel() -> usize {
    4
}
fn default_expand() -> usize {
    2
}
fn default_chunk() -> usize {
    256
}
fn default_true() -> bool {
    true
}

impl BambaConfig {
    fn mamba_head_dim(&self, config: &ArchConfig) -> Result<usize> {
        let auto = || {
            (self.mamba_expand * self.hidden_size)
                .checked_div(self.mamba_n_heads)
                .ok_or_else(|| config.unsupported("mamba_n_heads is 0"))
        };
        match &self.mamba_d_head {
            None => auto(),
            Some(Value::String(text)) if text == "auto" => auto(),
            Some(Value::Number(n)) => n
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| config.unsupported(format!("mamba_d_head {n}"))),
            Some(other) => Err(config.unsupported(format!("mamba_d_head {other}"))),
        }
    }

    fn rope(&self, config: &ArchConfig) -> Result<Rope> {
        let rules = RopeRules {
            scaled: None,
            original_max_positions: None,
            theta: self.rope_theta,
            fraction: RotaryFraction::Fixed(PARTIAL_ROTARY_FACTOR),
        };
        Rope::parse(config, self.rope_parameters.as_ref(), rules)
    }
}

/// A loaded Bamba.
pub type Bamba = HybridDecoder<Mamba2Mixer, GatedMlp>;

/// Builds the model from its config and weights.
pub fn load(arch_config: &ArchConfig, loader: &mut WeightLoader<'_>) -> Result<Bamba> {
    let config: BambaConfig = arch_config.parse()?;
    let activation = Activation::from_config(arch_config, "hidden_act", &config.hidden_act)?;
    let (h, eps) = (config.hidden_size, config.rms_norm_eps);
    let attention = AttentionHeads::check(
        arch_config,
        HeadKeys::LLAMA,
        (h, config.num_attention_heads, config.num_key_value_heads),
        HeadDim::Split,
    )?;
    let mamba = MixerSpec {
        hidden: h,
        heads: config.mamba_n_heads,
        head_dim: config.mamba_head_dim(arch_config)?,
        groups: config.mamba_n_groups,
        state: config.mamba_d_state,
        conv_kernel: config.mamba_d_conv,
        chunk: config.mamba_chunk_size,
        proj_bias: config.mamba_proj_bias,
        conv_bias: config.mamba_conv_bias,
        activation,
        eps,
        dt_limit: dt_limit(config.time_step_limit),
    };
    mamba.check(arch_config, config.mamba_expand)?;
    let attention_layers = config.attn_layer_indices.clone().unwrap_or_default();
    if let Some(bad) = attention_layers
        .iter()
        .find(|i| **i >= config.num_hidden_layers)
    {
        return Err(arch_config.unsupported(format!(
            "attn_layer_indices names layer {bad} of {}",
            config.num_hidden_layers
        )));
    }
    let mlp = GatedMlpSpec {
        hidden: h,
        inner: config.intermediate_size,
        bias: config.mlp_bias,
        activation,
    };
    let mut model = loader.pp("model");
    let embed_tokens = Embedding::load(model.pp("embed_tokens"), config.vocab_size, h)?;
    let layers = (0..config.num_hidden_layers)
        .map(|i| {
            let mut layer = model.pp(format!("layers.{i}"));
            let mixer = if attention_layers.contains(&i) {
                let spec = ProjectedAttentionSpec {
                    qkv_bias: config.attention_bias,
                    o_bias: config.attention_bias,
                    ..ProjectedAttentionSpec::new(i, h, attention)
                };
                let attention = ProjectedAttention::load(layer.pp("self_attn"), &spec)?;
                LayerMixer::Attention(Box::new(attention))
            } else {
                let mixer = Mamba2Mixer::load(layer.pp("mamba"), i, mamba)?;
                LayerMixer::Other(Box::new(mixer))
            };
            Ok(DecoderLayer {
                input_norm: Some(RmsNorm::load(layer.pp("input_layernorm"), h, eps)?),
                mixer,
                post_norm: Some(RmsNorm::load(layer.pp("pre_ff_layernorm"), h, eps)?),
                feed_forward: GatedMlp::load(layer.pp("feed_forward"), &mlp)?,
                output_norms: None,
            })
        })
        .collect::<Result<_>>()?;
    let final_norm = RmsNorm::load(model.pp("final_layernorm"), h, eps)?;
    let tied = config.tie_word_embeddings;
    let lm_head = Linear::head(loader.pp("lm_head"), &embed_tokens, tied)?;
    Ok(HybridDecoder::new(DecoderParts {
        embed_tokens,
        rotary: config
            .rope(arch_config)?
            .rotary(arch_config, attention.head_dim)?,
        layers,
        head: LmHead::new(final_norm, lm_head),
        options: DecoderOptions::default(),
    }))
}

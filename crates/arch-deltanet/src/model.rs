//! The decoder shared by the three model types: `layer_types` mixes Gated DeltaNet layers
//! (`linear_attn`) and gated full-attention layers (`self_attn`: the query projection also
//! yields a gate, per-head `q_norm`/`k_norm`, partial rotary); each is followed by a dense gated
//! MLP or a sparse mixture of experts; every norm outside the DeltaNet mixer is the
//! zero-centred `(1 + w)` RMSNorm.
//!
//! - `qwen3_next` (`Qwen3NextForCausalLM`): grouped `in_proj_qkvz`/`in_proj_ba`; MoE on layers
//!   with `(i + 1) % decoder_sparse_step == 0` not in `mlp_only_layers` (when `num_experts > 0`),
//!   top-k renormalised if `norm_topk_prob`.
//! - `qwen3_5` (`Qwen3_5ForCausalLM`, text config `qwen3_5_text`): separate projections, dense
//!   MLP everywhere.
//! - `qwen3_5_moe` (`Qwen3_5MoeForCausalLM`, `qwen3_5_moe_text`): separate projections, MoE
//!   everywhere, top-k always renormalised.
//!
//! Qwen3.5's multimodal rotary takes 3-D position ids; for text all three rows are equal and it
//! is plain RoPE on the rotary dimensions, which is what runs here. Given a
//! `*ForConditionalGeneration` checkpoint, the language model is loaded (`text_config`,
//! weights under `model.language_model.`) and the vision tower is ignored, with a note.

use hookscope_core::config::{AttentionHeads, HeadDim, HeadKeys};
use hookscope_core::nn::{
    Activation, DecoderLayer, DecoderOptions, DecoderParts, Embedding, GatedMlp, GatedMlpSpec,
    HybridDecoder, LayerMixer, Linear, LmHead, Mlp, MoeSpec, ProjectedAttention,
    ProjectedAttentionSpec, QkNorm, QkNormSpan, RmsNorm, SparseMoe, is_sparse_layer,
};
use hookscope_core::nn::{Rope, RopeParameters, RopeRules, RotaryFraction};
use hookscope_core::{ArchConfig, Result, WeightLoader};
use serde::Deserialize;
use serde_json::Value;

use crate::mixer::{DeltaNetSpec, GatedDeltaNet, ProjectionLayout};

/// Which of the three model types a checkpoint is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `qwen3_next`.
    Qwen3Next,
    /// `qwen3_5` (dense).
    Qwen35,
    /// `qwen3_5_moe`.
    Qwen35Moe,
}

/// The text model's `config.json` fields the forward pass depends on (defaults as
/// transformers' configs).
#[derive(Debug, Clone, Deserialize)]
pub struct HybridConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden size.
    pub hidden_size: usize,
    /// Layers.
    pub num_hidden_layers: usize,
    /// Attention query heads.
    pub num_attention_heads: usize,
    /// Attention key/value heads (default: the query heads).
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Attention head dimension (default `hidden_size / num_attention_heads`).
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Dense MLP inner size.
    #[serde(default)]
    pub intermediate_size: Option<usize>,
    /// Activation of the MLPs and of the DeltaNet convolution.
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Epsilon of every RMSNorm.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// Biases on the attention projections.
    #[serde(default)]
    pub attention_bias: bool,
    /// Whether the head shares the embedding table.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Convolution width of the DeltaNet mixer.
    #[serde(default = "default_kernel")]
    pub linear_conv_kernel_dim: usize,
    /// DeltaNet key head dimension.
    #[serde(default = "default_linear_dim")]
    pub linear_key_head_dim: usize,
    /// DeltaNet value head dimension.
    #[serde(default = "default_linear_dim")]
    pub linear_value_head_dim: usize,
    /// DeltaNet key heads.
    #[serde(default = "default_key_heads")]
    pub linear_num_key_heads: usize,
    /// DeltaNet value heads.
    #[serde(default = "default_value_heads")]
    pub linear_num_value_heads: usize,
    /// `linear_attention` or `full_attention` per layer.
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// Every this many layers one is full attention, when `layer_types` is absent.
    #[serde(default = "default_interval")]
    pub full_attention_interval: usize,
    /// Experts.
    #[serde(default)]
    pub num_experts: usize,
    /// Experts per token.
    #[serde(default)]
    pub num_experts_per_tok: usize,
    /// Whether top-k weights are renormalised (Qwen3-Next).
    #[serde(default = "default_true")]
    pub norm_topk_prob: bool,
    /// Each expert's inner size.
    #[serde(default)]
    pub moe_intermediate_size: usize,
    /// The shared expert's inner size (0: none).
    #[serde(default)]
    pub shared_expert_intermediate_size: usize,
    /// Every this many layers one is sparse (Qwen3-Next).
    #[serde(default = "default_one")]
    pub decoder_sparse_step: usize,
    /// Layers with a dense MLP (Qwen3-Next).
    #[serde(default)]
    pub mlp_only_layers: Vec<usize>,
    /// Rotary parameters (new style).
    #[serde(default)]
    pub rope_parameters: Option<RopeParameters>,
    /// Rotary base (old style).
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// Rotated share of each head (old style).
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
}

fn default_act() -> String {
    "silu".into()
}
fn default_eps() -> f64 {
    1e-6
}
fn default_kernel() -> usize {
    4
}
fn default_linear_dim() -> usize {
    128
}
fn default_key_heads() -> usize {
    16
}
fn default_value_heads() -> usize {
    32
}
fn default_interval() -> usize {
    4
}
fn default_true() -> bool {
    true
}
fn default_one() -> usize {
    1
}

impl HybridConfig {
    /// Whether layer `i` is full attention.
    fn is_attention(&self, config: &ArchConfig, i: usize) -> Result<bool> {
        match &self.layer_types {
            Some(types) => match types.get(i).map(String::as_str) {
                Some("full_attention") => Ok(true),
                Some("linear_attention") => Ok(false),
                Some(other) => Err(config.unsupported(format!("layer_types[{i}] `{other}`"))),
                None => Err(config.unsupported(format!(
                    "layer_types has {} entries for {} layers",
                    types.len(),
                    self.num_hidden_layers
                ))),
            },
            None if self.full_attention_interval == 0 => {
                Err(config.unsupported("full_attention_interval 0"))
            }
            None => Ok((i + 1).is_multiple_of(self.full_attention_interval)),
        }
    }

    /// The rotary embedding of the attention layers.
    fn rope(&self, config: &ArchConfig) -> Result<Rope> {
        let rules = RopeRules {
            scaled: None,
            original_max_positions: None,
            theta: self.rope_theta,
            fraction: RotaryFraction::Configured {
                legacy: self.partial_rotary_factor,
                default: 0.25,
            },
        };
        Rope::parse(config, self.rope_parameters.as_ref(), rules)
    }

    /// The MoE block of layer `i`, if it has one.
    fn moe(&self, family: Family, i: usize, activation: Activation) -> Option<MoeSpec> {
        let sparse = match family {
            Family::Qwen35 => false,
            Family::Qwen35Moe => true,
            Family::Qwen3Next => is_sparse_layer(
                i,
                self.num_experts,
                self.decoder_sparse_step,
                &self.mlp_only_layers,
            ),
        };
        sparse.then_some(MoeSpec {
            hidden: self.hidden_size,
            experts: self.num_experts,
            top_k: self.num_experts_per_tok,
            inner: self.moe_intermediate_size,
            shared_inner: (self.shared_expert_intermediate_size > 0)
                .then_some(self.shared_expert_intermediate_size),
            renormalise: family == Family::Qwen35Moe || self.norm_topk_prob,
            activation,
        })
    }
}

/// A loaded Gated DeltaNet hybrid.
pub type Hybrid = HybridDecoder<GatedDeltaNet, Mlp>;

/// Builds a model of `family` from its config (a text config, or a conditional-generation
/// config holding one under `text_config`) and weights.
pub fn load(
    arch_config: &ArchConfig,
    loader: &mut WeightLoader<'_>,
    family: Family,
) -> Result<Hybrid> {
    let config: HybridConfig = match arch_config.text_config() {
        Some(text) => {
            loader.note(
                "this checkpoint is multimodal: its language model is loaded, the vision \
                     tower is ignored",
            );
            text.parse()?
        }
        None => arch_config.parse()?,
    };
    let tied_at_top = arch_config
        .json
        .get("tie_word_embeddings")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let activation = Activation::from_config(arch_config, "hidden_act", &config.hidden_act)?;
    let (h, eps) = (config.hidden_size, config.rms_norm_eps);
    let attention = AttentionHeads::check(
        arch_config,
        HeadKeys::LLAMA,
        (h, config.num_attention_heads, config.num_key_value_heads),
        HeadDim::Declared(config.head_dim),
    )?;
    let delta = DeltaNetSpec {
        hidden: h,
        key_heads: config.linear_num_key_heads,
        value_heads: config.linear_num_value_heads,
        key_head_dim: config.linear_key_head_dim,
        value_head_dim: config.linear_value_head_dim,
        conv_kernel: config.linear_conv_kernel_dim,
        activation,
        eps,
    };
    delta.check(arch_config)?;
    let projections = match family {
        Family::Qwen3Next => ProjectionLayout::Grouped,
        Family::Qwen35 | Family::Qwen35Moe => ProjectionLayout::Separate,
    };
    let rotary = config
        .rope(arch_config)?
        .rotary(arch_config, attention.head_dim)?;
    let dense = match (family, config.intermediate_size) {
        (Family::Qwen35Moe, _) => None,
        (_, Some(inner)) => Some(GatedMlpSpec {
            hidden: h,
            inner,
            bias: false,
            activation,
        }),
        (_, None) => None,
    };
    let mut model = loader.pp_stored(&["model.language_model", "model"]);
    let embed_tokens = Embedding::load(model.pp("embed_tokens"), config.vocab_size, h)?;
    let mut layers = Vec::new();
    for i in 0..config.num_hidden_layers {
        let mut layer = model.pp(format!("layers.{i}"));
        let mixer = if config.is_attention(arch_config, i)? {
            let spec = ProjectedAttentionSpec {
                qkv_bias: config.attention_bias,
                o_bias: config.attention_bias,
                qk_norm: Some(QkNorm {
                    eps,
                    unit_offset: true,
                    span: QkNormSpan::PerHead,
                }),
                output_gate: true,
                ..ProjectedAttentionSpec::new(i, h, attention)
            };
            let attention = ProjectedAttention::load(layer.pp("self_attn"), &spec)?;
            LayerMixer::Attention(Box::new(attention))
        } else {
            let mixer = GatedDeltaNet::load(layer.pp("linear_attn"), (i, projections), delta)?;
            LayerMixer::Other(Box::new(mixer))
        };
        let mlp = match (config.moe(family, i, activation), dense) {
            (Some(moe), _) => Mlp::Sparse(Box::new(SparseMoe::load(layer.pp("mlp"), &moe)?)),
            (None, Some(dense)) => Mlp::Dense(Box::new(GatedMlp::load(layer.pp("mlp"), &dense)?)),
            (None, None) => {
                return Err(arch_config.unsupported(format!(
                    "layer {i} has a dense MLP but the config has no intermediate_size"
                )));
            }
        };
        layers.push(DecoderLayer {
            input_norm: Some(RmsNorm::load_unit_offset(
                layer.pp("input_layernorm"),
                h,
                eps,
            )?),
            mixer,
            post_norm: Some(RmsNorm::load_unit_offset(
                layer.pp("post_attention_layernorm"),
                h,
                eps,
            )?),
            feed_forward: mlp,
            output_norms: None,
        });
    }
    let norm = RmsNorm::load_unit_offset(model.pp("norm"), h, eps)?;
    let tied = config.tie_word_embeddings || tied_at_top || !loader.contains("lm_head.weight");
    let lm_head = Linear::head(loader.pp("lm_head"), &embed_tokens, tied)?;
    Ok(HybridDecoder::new(DecoderParts {
        embed_tokens,
        rotary,
        layers,
        head: LmHead::new(norm, lm_head),
        options: DecoderOptions::default(),
    }))
}

//! # GPT-NeoX
//!
//! "GPT-NeoX-20B: An Open-Source Autoregressive Language Model" (Black et al., 2022), the
//! architecture of the Pythia suite ("Pythia: A Suite for Analyzing Large Language Models
//! Across Training and Scaling", Biderman et al., 2023): LayerNorm, a fused per-head
//! `query_key_value` (split into queries, keys and values at load), partial rotary positions
//! (`rotary_pct` / `partial_rotary_factor`, rotate-half pairing), a GELU MLP, a parallel
//! residual (`use_parallel_residual`: both parts read the block's input, as
//! `attention_output` and `mlp_output` then do) or a sequential one, and an untied
//! `embed_out` head.
//!
//! `GPTNeoXForCausalLM` as `transformers` 5.x stores it: `gpt_neox.embed_in`,
//! `gpt_neox.layers.{i}`, `gpt_neox.final_layer_norm`, `embed_out`.

use hookscope_core::burn::tensor::Tensor;
use hookscope_core::config::{AttentionHeads, HeadDim, HeadKeys};
use hookscope_core::nn::{
    Activation, Embedding, FusedLayout, LayerNorm, Linear, LmHead, PlainMlp, ProjectedAttention,
    ProjectedAttentionSpec, QkvWeights, Rope, RopeParameters, RopeRules, Rotary, RotaryFraction,
    parallel_residual_block, residual_block,
};
use hookscope_core::schema::{FeedForwardKind, LayerSpec};
use hookscope_core::{
    ArchConfig, Architecture, Call, CausalLm, FeedForwardNorms, ModelLayout, OutputHead, Result,
    Site, WeightLoader,
};
use serde::Deserialize;

/// `config.json` of a GPT-NeoX checkpoint (the fields the forward pass depends on).
#[derive(Debug, Clone, Deserialize)]
pub struct GptNeoxConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden size.
    pub hidden_size: usize,
    /// MLP inner size.
    pub intermediate_size: usize,
    /// Blocks.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Longest sequence (the scaled rotary types' reference).
    #[serde(default = "default_positions")]
    pub max_position_embeddings: usize,
    /// LayerNorm epsilon.
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    /// MLP activation.
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// `h + attn(ln1 h) + mlp(ln2 h)` (true) or sequential.
    #[serde(default = "default_true")]
    pub use_parallel_residual: bool,
    /// Bias on the attention projections.
    #[serde(default = "default_true")]
    pub attention_bias: bool,
    /// Whether the head shares the embedding table.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Rotary parameters (new style).
    #[serde(default)]
    pub rope_parameters: Option<RopeParameters>,
    /// Rotary scaling (old style).
    #[serde(default)]
    pub rope_scaling: Option<RopeParameters>,
    /// Rotated fraction of each head (old style).
    #[serde(default)]
    pub rotary_pct: Option<f64>,
    /// Rotary base (old style).
    #[serde(default)]
    pub rotary_emb_base: Option<f64>,
}

fn default_positions() -> usize {
    2048
}
fn default_eps() -> f64 {
    1e-5
}
fn default_act() -> String {
    "gelu".into()
}
fn default_true() -> bool {
    true
}

impl GptNeoxConfig {
    fn rope(&self, config: &ArchConfig) -> Result<Rope> {
        let rules = RopeRules {
            scaled: Some(self.max_position_embeddings),
            original_max_positions: None,
            theta: self.rotary_emb_base,
            fraction: RotaryFraction::Configured {
                legacy: self.rotary_pct,
                default: 0.25,
            },
        };
        let params = self.rope_parameters.as_ref().or(self.rope_scaling.as_ref());
        Rope::parse(config, params, rules)
    }
}

struct Block {
    input_norm: LayerNorm,
    attention: ProjectedAttention,
    post_attention_norm: LayerNorm,
    mlp: PlainMlp,
}

/// A loaded GPT-NeoX.
pub struct GptNeox {
    layout: ModelLayout,
    parallel: bool,
    rotary: Rotary,
    embed_in: Embedding,
    blocks: Vec<Block>,
    head: LmHead,
}

impl GptNeox {
    /// Builds the model from its config and weights.
    pub fn load(arch_config: &ArchConfig, loader: &mut WeightLoader<'_>) -> Result<Self> {
        let config: GptNeoxConfig = arch_config.parse()?;
        let activation = Activation::from_config(arch_config, "hidden_act", &config.hidden_act)?;
        let h = config.hidden_size;
        let heads = AttentionHeads::check(
            arch_config,
            HeadKeys::LLAMA,
            (h, config.num_attention_heads, None),
            HeadDim::Split,
        )?;
        let rotary = config
            .rope(arch_config)?
            .rotary(arch_config, heads.head_dim)?;
        let eps = config.layer_norm_eps;
        let bias = config.attention_bias;
        let inner = config.intermediate_size;
        let mut gpt_neox = loader.pp("gpt_neox");
        let embed_in = Embedding::load(gpt_neox.pp("embed_in"), config.vocab_size, h)?;
        let blocks = (0..config.num_hidden_layers)
            .map(|i| {
                let mut layer = gpt_neox.pp(format!("layers.{i}"));
                let attention = ProjectedAttentionSpec {
                    qkv: QkvWeights::Fused("query_key_value", FusedLayout::PerHead(heads.heads)),
                    output: "dense",
                    qkv_bias: bias,
                    o_bias: bias,
                    ..ProjectedAttentionSpec::new(i, h, heads)
                };
                Ok(Block {
                    input_norm: LayerNorm::load(layer.pp("input_layernorm"), h, eps)?,
                    attention: ProjectedAttention::load(layer.pp("attention"), &attention)?,
                    post_attention_norm: LayerNorm::load(
                        layer.pp("post_attention_layernorm"),
                        h,
                        eps,
                    )?,
                    mlp: PlainMlp::new(
                        Linear::load_torch(layer.pp("mlp.dense_h_to_4h"), h, inner, true)?,
                        Linear::load_torch(layer.pp("mlp.dense_4h_to_h"), inner, h, true)?,
                        activation,
                    ),
                })
            })
            .collect::<Result<_>>()?;
        let final_norm = LayerNorm::load(gpt_neox.pp("final_layer_norm"), h, eps)?;
        let tied = config.tie_word_embeddings;
        let embed_out = Linear::head(loader.pp("embed_out"), &embed_in, tied)?;
        let feed_forward = FeedForwardKind::Plain { inner };
        let layer = LayerSpec::attention(heads.heads, heads.kv_heads, heads.head_dim, feed_forward);
        let layer = match config.use_parallel_residual {
            true => layer.parallel(),
            false => layer,
        };
        Ok(GptNeox {
            layout: ModelLayout::uniform(h, config.vocab_size, layer, config.num_hidden_layers),
            parallel: config.use_parallel_residual,
            rotary,
            embed_in,
            blocks,
            head: LmHead::new(final_norm, embed_out),
        })
    }
}

impl CausalLm for GptNeox {
    fn layout(&self) -> &ModelLayout {
        &self.layout
    }

    fn forward(&self, call: &mut Call<'_>) -> Result<Tensor<3>> {
        let embeddings = self.embed_in.forward(call.input_ids());
        let mut hidden = call.visit(Site::TokenEmbeddings, embeddings)?;
        let cos_sin = self.rotary.cos_sin(&call.position_ids());
        for (layer, block) in self.blocks.iter().enumerate() {
            let mixer = |hidden: Tensor<3>, call: &mut Call<'_>| {
                let x = block.input_norm.forward(hidden);
                block.attention.forward(x, &cos_sin, call)
            };
            let mlp = |x: Tensor<3>, call: &mut Call<'_>| {
                let x = block.post_attention_norm.forward(x);
                block.mlp.serve(layer, x, call)
            };
            hidden = match self.parallel {
                true => parallel_residual_block(layer, hidden, call, mixer, mlp)?,
                false => residual_block(layer, hidden, call, mixer, Some(mlp))?,
            };
        }
        Ok(hidden)
    }

    fn output_head(&self) -> &dyn OutputHead {
        &self.head
    }

    fn feed_forward_norms(&self, layer: usize) -> Option<FeedForwardNorms> {
        Some(FeedForwardNorms {
            input: Some(self.blocks.get(layer)?.post_attention_norm.plain()),
            output_norm: false,
        })
    }
}

/// GPT-NeoX, as the registry lists it.
pub static ARCHITECTURE: Architecture = Architecture {
    name: "gpt_neox",
    model_types: &["gpt_neox"],
    architectures: &["GPTNeoXForCausalLM"],
    load: |config, loader| Ok(Box::new(GptNeox::load(config, loader)?)),
    tiny_config: r#"{"model_type": "gpt_neox", "vocab_size": 61, "hidden_size": 16,
        "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "rotary_pct": 0.5, "eos_token_id": 60}"#,
};

//! # GPT-2
//!
//! "Language Models are Unsupervised Multitask Learners" (Radford et al., 2019): a pre-norm
//! decoder with learned absolute positions, fused `c_attn` query/key/value projection, a GELU MLP
//! and a head tied to the token embeddings.
//!
//! Checkpoints as `transformers` 5.x stores them: keys with or without the `transformer.` prefix,
//! `Conv1D` weights laid out `[in, out]`, `lm_head.weight` stored only when untied.

use hookscope_core::burn::tensor::Tensor;
use hookscope_core::config::{AttentionHeads, HeadDim, HeadKeys};
use hookscope_core::nn::{
    Activation, Embedding, LayerNorm, Linear, LmHead, PlainMlp, ScoreRules, SoftmaxAttention,
    project_heads, residual_block,
};
use hookscope_core::schema::{FeedForwardKind, LayerSpec};
use hookscope_core::{
    ArchConfig, Architecture, Call, CausalLm, FeedForwardNorms, ModelLayout, OutputHead, Result,
    Site, WeightLoader,
};
use serde::Deserialize;

/// `config.json` of a GPT-2 checkpoint (the fields the forward pass depends on).
#[derive(Debug, Clone, Deserialize)]
pub struct Gpt2Config {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Learned positions.
    pub n_positions: usize,
    /// Hidden size.
    pub n_embd: usize,
    /// Blocks.
    pub n_layer: usize,
    /// Attention heads.
    pub n_head: usize,
    /// MLP inner size (default `4 * n_embd`).
    #[serde(default)]
    pub n_inner: Option<usize>,
    /// MLP activation.
    #[serde(default = "default_activation")]
    pub activation_function: String,
    /// LayerNorm epsilon.
    #[serde(default = "default_eps")]
    pub layer_norm_epsilon: f64,
    /// Scale scores by `1/sqrt(head_dim)`.
    #[serde(default = "default_true")]
    pub scale_attn_weights: bool,
    /// Also scale scores by `1/(layer + 1)`.
    #[serde(default)]
    pub scale_attn_by_inverse_layer_idx: bool,
    /// Whether the head shares the token embedding table.
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    /// Cross-attention blocks (encoder-decoder use): not supported.
    #[serde(default)]
    pub add_cross_attention: bool,
}

fn default_activation() -> String {
    "gelu_new".into()
}
fn default_eps() -> f64 {
    1e-5
}
fn default_true() -> bool {
    true
}

struct Block {
    ln_1: LayerNorm,
    c_attn: Linear,
    attention: SoftmaxAttention,
    c_proj: Linear,
    ln_2: LayerNorm,
    mlp: PlainMlp,
}

/// A loaded GPT-2.
pub struct Gpt2 {
    layout: ModelLayout,
    config: Gpt2Config,
    wte: Embedding,
    wpe: Embedding,
    blocks: Vec<Block>,
    head: LmHead,
}

impl Gpt2 {
    /// Builds the model from its config and weights.
    pub fn load(arch_config: &ArchConfig, loader: &mut WeightLoader<'_>) -> Result<Self> {
        let config: Gpt2Config = arch_config.parse()?;
        let activation = Activation::from_config(
            arch_config,
            "activation_function",
            &config.activation_function,
        )?;
        if config.add_cross_attention {
            return Err(arch_config.unsupported("add_cross_attention (encoder-decoder GPT-2)"));
        }
        let h = config.n_embd;
        let keys = HeadKeys {
            hidden: "n_embd",
            heads: "n_head",
            kv_heads: "n_head",
        };
        let attention_heads =
            AttentionHeads::check(arch_config, keys, (h, config.n_head, None), HeadDim::Split)?;
        let AttentionHeads {
            heads, head_dim, ..
        } = attention_heads;
        let inner = config.n_inner.unwrap_or(4 * h);
        let mut transformer = loader.pp_stored(&["transformer", ""]);
        let wte = Embedding::load(transformer.pp("wte"), config.vocab_size, h)?;
        let wpe = Embedding::load(transformer.pp("wpe"), config.n_positions, h)?;
        let blocks = (0..config.n_layer)
            .map(|i| {
                let mut block = transformer.pp(format!("h.{i}"));
                let mut scale = if config.scale_attn_weights {
                    (head_dim as f64).powf(-0.5)
                } else {
                    1.0
                };
                if config.scale_attn_by_inverse_layer_idx {
                    scale /= (i + 1) as f64;
                }
                let eps = config.layer_norm_epsilon;
                Ok(Block {
                    ln_1: LayerNorm::load(block.pp("ln_1"), h, eps)?,
                    c_attn: Linear::load_conv1d(block.pp("attn.c_attn"), h, 3 * h)?,
                    attention: SoftmaxAttention::new(
                        i,
                        attention_heads,
                        ScoreRules {
                            scale: Some(scale),
                            ..ScoreRules::default()
                        },
                    ),
                    c_proj: Linear::load_conv1d(block.pp("attn.c_proj"), h, h)?,
                    ln_2: LayerNorm::load(block.pp("ln_2"), h, eps)?,
                    mlp: PlainMlp::new(
                        Linear::load_conv1d(block.pp("mlp.c_fc"), h, inner)?,
                        Linear::load_conv1d(block.pp("mlp.c_proj"), inner, h)?,
                        activation,
                    ),
                })
            })
            .collect::<Result<_>>()?;
        let ln_f = LayerNorm::load(transformer.pp("ln_f"), h, config.layer_norm_epsilon)?;
        let lm_head = Linear::head(loader.pp("lm_head"), &wte, config.tie_word_embeddings)?;
        let layer = LayerSpec::attention(heads, heads, head_dim, FeedForwardKind::Plain { inner });
        Ok(Gpt2 {
            layout: ModelLayout::uniform(h, config.vocab_size, layer, config.n_layer),
            config,
            wte,
            wpe,
            blocks,
            head: LmHead::new(ln_f, lm_head),
        })
    }
}

impl CausalLm for Gpt2 {
    fn layout(&self) -> &ModelLayout {
        &self.layout
    }

    fn max_positions(&self) -> Option<usize> {
        Some(self.config.n_positions)
    }

    fn forward(&self, call: &mut Call<'_>) -> Result<Tensor<3>> {
        let [batch, tokens] = call.dims();
        let embeddings = self.wte.forward(call.input_ids());
        let embeddings = call.visit(Site::TokenEmbeddings, embeddings)?;
        let mut hidden = embeddings + self.wpe.forward(call.position_ids());
        let split_heads = |x: Tensor<3>, heads: usize| -> Tensor<4> {
            x.reshape([batch, tokens, heads, self.config.n_embd / heads])
                .swap_dims(1, 2)
        };
        for (layer, block) in self.blocks.iter().enumerate() {
            hidden = residual_block(
                layer,
                hidden,
                call,
                |hidden, call| {
                    let qkv = block.c_attn.forward(block.ln_1.forward(hidden));
                    let h = self.config.n_embd;
                    let heads = block.attention.heads().heads;
                    let q = split_heads(qkv.clone().slice_dim(2, 0..h), heads);
                    let k = split_heads(qkv.clone().slice_dim(2, h..2 * h), heads);
                    let v = split_heads(qkv.slice_dim(2, 2 * h..3 * h), heads);
                    let mixed = block.attention.forward(q, k, v, call)?;
                    project_heads(layer, heads, mixed, &block.c_proj, call)
                },
                Some(|hidden, call: &mut Call<'_>| {
                    block.mlp.serve(layer, block.ln_2.forward(hidden), call)
                }),
            )?;
        }
        Ok(hidden)
    }

    fn output_head(&self) -> &dyn OutputHead {
        &self.head
    }

    fn feed_forward_norms(&self, layer: usize) -> Option<FeedForwardNorms> {
        Some(FeedForwardNorms {
            input: Some(self.blocks.get(layer)?.ln_2.plain()),
            output_norm: false,
        })
    }
}

/// GPT-2, as the registry lists it.
pub static ARCHITECTURE: Architecture = hookscope_core::architecture!(
    Gpt2,
    name: "gpt2",
    model_types: ["gpt2"],
    architectures: ["GPT2LMHeadModel", "GPT2Model"],
    tiny_config: r#"{"model_type": "gpt2", "vocab_size": 61, "n_positions": 32, "n_embd": 16,
        "n_layer": 2, "n_head": 2, "eos_token_id": 60}"#,
);

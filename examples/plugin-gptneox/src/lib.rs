//! # GPT-NeoX, as a hookscope plugin
//!
//! "GPT-NeoX-20B: An Open-Source Autoregressive Language Model" (Black et al., 2022), the
//! architecture of the Pythia suite: LayerNorm, a fused per-head `query_key_value`, partial
//! rotary positions (`rotary_pct` / `partial_rotary_factor`), a GELU MLP, a parallel residual
//! (`use_parallel_residual`) and an untied `embed_out` head.
//!
//! Built as a `cdylib` and loaded at run time: `hookscope --plugin
//! target/debug/libhookscope_plugin_gptneox.so conformance`. It uses only hookscope-core's
//! public API, as an out-of-tree adapter would.

use hookscope_core::burn::tensor::Tensor;
use hookscope_core::config::{AttentionHeads, HeadDim, HeadKeys};
use hookscope_core::nn::{
    Activation, Embedding, LayerNorm, Linear, Rotary, ScoreRules, SoftmaxAttention,
    parallel_residual_block, residual_block,
};
use hookscope_core::nn::{Rope, RopeParameters, RopeRules, RotaryFraction};
use hookscope_core::schema::LayerSpec;
use hookscope_core::{ArchConfig, Call, CausalLm, ModelLayout, Result, Site, WeightLoader};
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
    /// Rotated fraction of each head (old style).
    #[serde(default)]
    pub rotary_pct: Option<f64>,
    /// Rotary base (old style).
    #[serde(default)]
    pub rotary_emb_base: Option<f64>,
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
            scaled: None,
            theta: self.rotary_emb_base,
            fraction: RotaryFraction::Configured {
                legacy: self.rotary_pct,
                default: 0.25,
            },
        };
        Rope::parse(config, self.rope_parameters.as_ref(), rules)
    }
}

struct Block {
    input_norm: LayerNorm,
    qkv: Linear,
    dense: Linear,
    attention: SoftmaxAttention,
    post_attention_norm: LayerNorm,
    up: Linear,
    down: Linear,
}

/// A loaded GPT-NeoX.
pub struct GptNeox {
    layout: ModelLayout,
    config: GptNeoxConfig,
    activation: Activation,
    rotary: Rotary,
    embed_in: Embedding,
    blocks: Vec<Block>,
    final_norm: LayerNorm,
    embed_out: Linear,
}

impl GptNeox {
    /// Builds the model from its config and weights.
    pub fn load(arch_config: &ArchConfig, loader: &mut WeightLoader<'_>) -> Result<Self> {
        let config: GptNeoxConfig = arch_config.parse()?;
        let activation = Activation::from_config(arch_config, "hidden_act", &config.hidden_act)?;
        let h = config.hidden_size;
        let attention_heads = AttentionHeads::check(
            arch_config,
            HeadKeys::LLAMA,
            (h, config.num_attention_heads, None),
            HeadDim::Split,
        )?;
        let AttentionHeads {
            heads, head_dim, ..
        } = attention_heads;
        let rotary = config.rope(arch_config)?.rotary(head_dim);
        let eps = config.layer_norm_eps;
        let bias = config.attention_bias;
        let mut gpt_neox = loader.pp("gpt_neox");
        let embed_in = Embedding::load(gpt_neox.pp("embed_in"), config.vocab_size, h)?;
        let blocks = (0..config.num_hidden_layers)
            .map(|i| {
                let mut layer = gpt_neox.pp(format!("layers.{i}"));
                Ok(Block {
                    input_norm: LayerNorm::load(layer.pp("input_layernorm"), h, eps)?,
                    qkv: Linear::load_torch(layer.pp("attention.query_key_value"), h, 3 * h, bias)?,
                    dense: Linear::load_torch(layer.pp("attention.dense"), h, h, bias)?,
                    attention: SoftmaxAttention::new(i, attention_heads, ScoreRules::default()),
                    post_attention_norm: LayerNorm::load(
                        layer.pp("post_attention_layernorm"),
                        h,
                        eps,
                    )?,
                    up: Linear::load_torch(
                        layer.pp("mlp.dense_h_to_4h"),
                        h,
                        config.intermediate_size,
                        true,
                    )?,
                    down: Linear::load_torch(
                        layer.pp("mlp.dense_4h_to_h"),
                        config.intermediate_size,
                        h,
                        true,
                    )?,
                })
            })
            .collect::<Result<_>>()?;
        let final_norm = LayerNorm::load(gpt_neox.pp("final_layer_norm"), h, eps)?;
        let tied = config.tie_word_embeddings;
        let embed_out = Linear::head(loader.pp("embed_out"), &embed_in, tied)?;
        let layer = LayerSpec::attention(heads, heads, head_dim);
        Ok(GptNeox {
            layout: ModelLayout::uniform(h, config.vocab_size, layer, config.num_hidden_layers),
            rotary,
            config,
            activation,
            embed_in,
            blocks,
            final_norm,
            embed_out,
        })
    }
}

impl CausalLm for GptNeox {
    fn layout(&self) -> &ModelLayout {
        &self.layout
    }

    fn forward(&self, call: &mut Call<'_>) -> Result<Tensor<3>> {
        let [batch, tokens] = call.dims();
        let embeddings = self.embed_in.forward(call.input_ids());
        let mut hidden = call.visit(Site::TokenEmbeddings, embeddings)?;
        let (cos, sin) = self.rotary.cos_sin(&call.position_ids());
        for (layer, block) in self.blocks.iter().enumerate() {
            let attention = &block.attention;
            let AttentionHeads {
                heads, head_dim, ..
            } = attention.heads();
            let mixer = |hidden: Tensor<3>, call: &mut Call<'_>| {
                // Per head, the fused projection holds [q | k | v], each `head_dim` wide.
                let qkv = block
                    .qkv
                    .forward(block.input_norm.forward(hidden))
                    .reshape([batch, tokens, heads, 3 * head_dim])
                    .swap_dims(1, 2);
                let part = |i: usize| qkv.clone().slice_dim(3, i * head_dim..(i + 1) * head_dim);
                let q = Rotary::apply(part(0), &cos, &sin);
                let k = Rotary::apply(part(1), &cos, &sin);
                let mixed = attention.forward(q, k, part(2), call)?;
                Ok(block.dense.forward(mixed))
            };
            let mlp = |x: Tensor<3>| {
                let inner = block.up.forward(block.post_attention_norm.forward(x));
                Ok(block.down.forward(self.activation.forward(inner)))
            };
            hidden = if self.config.use_parallel_residual {
                parallel_residual_block(layer, hidden, call, mixer, mlp)?
            } else {
                residual_block(layer, hidden, call, mixer, Some(mlp))?
            };
        }
        Ok(self.unembed(hidden))
    }

    fn unembed(&self, hidden: Tensor<3>) -> Tensor<3> {
        self.embed_out.forward(self.final_norm.forward(hidden))
    }
}

hookscope_core::export_plugin!(
    GptNeox,
    name: "gpt_neox",
    model_types: ["gpt_neox"],
    architectures: ["GPTNeoXForCausalLM"],
    tiny_config: r#"{"model_type": "gpt_neox", "vocab_size": 61, "hidden_size": 16,
        "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "rotary_pct": 0.5, "eos_token_id": 60}"#,
);

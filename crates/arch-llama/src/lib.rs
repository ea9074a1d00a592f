//! # Llama
//!
//! "LLaMA: Open and Efficient Foundation Language Models" (Touvron et al., 2023) and its
//! successors: pre-norm decoder with RMSNorm, rotary positions (with the `linear`, `dynamic`
//! and `llama3` scalings), grouped-query attention and a SwiGLU MLP.
//!
//! `LlamaForCausalLM` as `transformers` 5.x stores it (`model.embed_tokens`, `model.layers.{i}`,
//! `model.norm`, `lm_head` unless tied), and the checkpoints that run the same code path under
//! other `model_type`s: `mistral` without a sliding window shorter than the context, and `qwen2`
//! (q/k/v biases). Anything else of theirs is refused with the reason.

mod config;

use hookscope_core::burn::tensor::Tensor;
use hookscope_core::nn::{
    Activation, Embedding, GatedMlp, GatedMlpSpec, Linear, ProjectedAttention,
    ProjectedAttentionSpec, RmsNorm, Rotary, residual_block,
};
use hookscope_core::schema::LayerSpec;
use hookscope_core::{
    ArchConfig, Architecture, Call, CausalLm, ModelLayout, Result, Site, WeightLoader,
};

pub use config::LlamaConfig;

struct Block {
    input_norm: RmsNorm,
    attention: ProjectedAttention,
    post_attention_norm: RmsNorm,
    mlp: GatedMlp,
}

/// A loaded Llama-family model.
pub struct Llama {
    layout: ModelLayout,
    rotary: Rotary,
    embed_tokens: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
}

impl Llama {
    /// Builds the model from its config and weights.
    pub fn load(arch_config: &ArchConfig, loader: &mut WeightLoader<'_>) -> Result<Self> {
        let config: LlamaConfig = arch_config.parse()?;
        config.check(arch_config)?;
        let activation = Activation::from_config(arch_config, "hidden_act", &config.hidden_act)?;
        let (theta, scaling) = config.rope(arch_config)?;
        let (h, heads, kv_heads, head_dim) = (
            config.hidden_size,
            config.num_attention_heads,
            config.kv_heads(),
            config.head_dim(),
        );
        let (qkv_bias, o_bias) = config.attention_biases();
        let eps = config.rms_norm_eps;
        let mlp = GatedMlpSpec {
            hidden: h,
            inner: config.intermediate_size,
            bias: config.mlp_bias,
            activation,
        };
        let embed_tokens =
            Embedding::load(loader, "model.embed_tokens.weight", config.vocab_size, h);
        let blocks = (0..config.num_hidden_layers)
            .map(|i| {
                let name = |rest: &str| format!("model.layers.{i}.{rest}");
                let attention = ProjectedAttentionSpec {
                    layer: i,
                    hidden: h,
                    heads,
                    kv_heads,
                    head_dim,
                    qkv_bias,
                    o_bias,
                    qk_norm: None,
                    output_gate: false,
                };
                Block {
                    input_norm: RmsNorm::load(loader, &name("input_layernorm"), h, eps),
                    attention: ProjectedAttention::load(loader, &name("self_attn"), &attention),
                    post_attention_norm: RmsNorm::load(
                        loader,
                        &name("post_attention_layernorm"),
                        h,
                        eps,
                    ),
                    mlp: GatedMlp::load(loader, &name("mlp"), &mlp),
                }
            })
            .collect();
        let norm = RmsNorm::load(loader, "model.norm", h, eps);
        let lm_head = Linear::head(loader, "lm_head", &embed_tokens, config.tie_word_embeddings);
        let layer = LayerSpec::attention(heads, kv_heads, head_dim);
        Ok(Llama {
            layout: ModelLayout::uniform(h, config.vocab_size, layer, config.num_hidden_layers),
            rotary: Rotary::new(head_dim, theta, scaling),
            embed_tokens,
            blocks,
            norm,
            lm_head,
        })
    }
}

impl CausalLm for Llama {
    fn layout(&self) -> &ModelLayout {
        &self.layout
    }

    fn forward(&self, call: &mut Call<'_>) -> Result<Tensor<3>> {
        let embeddings = self.embed_tokens.forward(call.input_ids());
        let mut hidden = call.visit(Site::TokenEmbeddings, embeddings)?;
        let rotary = self.rotary.cos_sin(&call.position_ids());
        for (layer, block) in self.blocks.iter().enumerate() {
            hidden = residual_block(
                layer,
                hidden,
                call,
                |hidden, call| {
                    let x = block.input_norm.forward(hidden);
                    block.attention.forward(x, &rotary, call)
                },
                Some(|hidden| Ok(block.mlp.forward(block.post_attention_norm.forward(hidden)))),
            )?;
        }
        Ok(self.lm_head.forward(self.norm.forward(hidden)))
    }
}

/// Llama (and the Mistral and Qwen2 checkpoints that run the same code path), as the registry
/// lists it.
pub static ARCHITECTURE: Architecture = hookscope_core::architecture!(
    Llama,
    name: "llama",
    model_types: ["llama", "mistral", "qwen2"],
    architectures: ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"],
    tiny_config: r#"{"model_type": "llama", "vocab_size": 61, "hidden_size": 16,
        "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 64, "eos_token_id": 60}"#,
);

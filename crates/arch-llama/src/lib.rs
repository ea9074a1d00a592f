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
    Activation, DecoderLayer, Embedding, GatedMlp, GatedMlpSpec, HybridDecoder, LayerMixer, Linear,
    NoOtherMixer, ProjectedAttention, ProjectedAttentionSpec, RmsNorm, Rotary,
};
use hookscope_core::schema::LayerSpec;
use hookscope_core::{ArchConfig, Architecture, Call, CausalLm, ModelLayout, Result, WeightLoader};

pub use config::LlamaConfig;

/// A loaded Llama-family model.
pub struct Llama {
    layout: ModelLayout,
    decoder: HybridDecoder<NoOtherMixer, GatedMlp>,
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
            Embedding::load(loader, "model.embed_tokens.weight", config.vocab_size, h)?;
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
                Ok(DecoderLayer {
                    input_norm: RmsNorm::load(loader, &name("input_layernorm"), h, eps)?,
                    mixer: LayerMixer::Attention(Box::new(ProjectedAttention::load(
                        loader,
                        &name("self_attn"),
                        &attention,
                    )?)),
                    post_norm: RmsNorm::load(loader, &name("post_attention_layernorm"), h, eps)?,
                    feed_forward: GatedMlp::load(loader, &name("mlp"), &mlp)?,
                })
            })
            .collect::<Result<_>>()?;
        let norm = RmsNorm::load(loader, "model.norm", h, eps)?;
        let tied = config.tie_word_embeddings;
        let lm_head = Linear::head(loader, "lm_head", &embed_tokens, tied)?;
        let layer = LayerSpec::attention(heads, kv_heads, head_dim);
        Ok(Llama {
            layout: ModelLayout::uniform(h, config.vocab_size, layer, config.num_hidden_layers),
            decoder: HybridDecoder {
                embed_tokens,
                rotary: Rotary::new(head_dim, theta, scaling),
                layers: blocks,
                norm,
                lm_head,
            },
        })
    }
}

impl CausalLm for Llama {
    fn layout(&self) -> &ModelLayout {
        &self.layout
    }

    fn forward(&self, call: &mut Call<'_>) -> Result<Tensor<3>> {
        self.decoder.forward(call)
    }

    fn unembed(&self, hidden: Tensor<3>) -> Tensor<3> {
        self.decoder.unembed(hidden)
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

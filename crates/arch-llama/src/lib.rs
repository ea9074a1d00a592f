//! # Llama and the decoders built like it
//!
//! "LLaMA: Open and Efficient Foundation Language Models" (Touvron et al., 2023) and its
//! successors: pre-norm decoder with RMSNorm, rotary positions (`linear`, `dynamic`, `llama3`,
//! `yarn` and `longrope` scalings), grouped-query attention and a SwiGLU MLP.
//!
//! `LlamaForCausalLM` as `transformers` 5.x stores it (`model.embed_tokens`, `model.layers.{i}`,
//! `model.norm`, `lm_head` unless tied), and the checkpoints that run the same code path under
//! other `model_type`s, registered as four architectures:
//! - [`ARCHITECTURE`]: `mistral` (a sliding window on every layer), `qwen2` (q/k/v biases, a
//!   sliding window on the layers its config names) and `qwen3` (Qwen2's windows, per-head q/k
//!   RMSNorm, a head size of its own).
//! - [`MOE`]: "Mixtral of Experts" (Jiang et al., 2024) and Qwen's mixtures: `mixtral` (top-2 of 8
//!   experts in every layer, the hub's `block_sparse_moe.experts.{e}.w1/w3/w2` or transformers'
//!   fused experts), `qwen2_moe` (a sigmoid-gated shared expert) and `qwen3_moe`, dense where
//!   `decoder_sparse_step` and `mlp_only_layers` say so.
//! - [`OLMO2`]: "2 OLMo 2 Furious" (OLMo et al., 2024): RMSNorms after attention and MLP
//!   instead of before (their outputs are what the layer adds: `attention_output`,
//!   `mlp_output`), q/k RMSNorm over the whole projections.
//! - [`PHI3`]: "Phi-3 Technical Report" (Abdin et al., 2024): fused `qkv_proj` and
//!   `gate_up_proj` split at load, a partial rotary, LongRoPE, a window on every layer.
//!
//! Anything else of theirs is refused with the reason.

mod config;

use hookscope_core::nn::{
    Activation, DecoderLayer, DecoderOptions, DecoderParts, Embedding, FusedLayout, GatedMlp,
    GatedMlpSpec, HybridDecoder, LayerMixer, Linear, LmHead, Mlp, NoOtherMixer, OutputNorms,
    ProjectedAttention, ProjectedAttentionSpec, QkvWeights, RmsNorm, ScoreRules, SparseMoe,
};
use hookscope_core::weights::WeightScope;
use hookscope_core::{ArchConfig, Architecture, CausalLm, Result, WeightLoader};

pub use config::{LlamaConfig, Variant};

/// A loaded Llama-family model: a decoder whose every layer is attention, followed by a dense
/// MLP or a mixture of experts.
pub type Llama = HybridDecoder<NoOtherMixer, Mlp>;

/// Builds the model from its config and weights.
pub fn load(arch_config: &ArchConfig, loader: &mut WeightLoader<'_>) -> Result<Llama> {
    let config: LlamaConfig = arch_config.parse()?;
    let variant = config.variant(arch_config)?;
    let heads = config.check(arch_config, variant)?;
    let windows = config.windows(arch_config, variant)?;
    let activation = Activation::from_config(arch_config, "hidden_act", &config.hidden_act)?;
    let rotary = config
        .rope(arch_config, variant)?
        .rotary(arch_config, heads.head_dim)?;
    let h = config.hidden_size;
    let (qkv_bias, o_bias) = config.attention_biases(variant);
    let eps = config.eps(variant);
    let dense = GatedMlpSpec {
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
            let attention = ProjectedAttentionSpec {
                qkv: match variant.fused() {
                    true => QkvWeights::Fused("qkv_proj", FusedLayout::Blocks),
                    false => QkvWeights::Separate,
                },
                qkv_bias,
                o_bias,
                qk_norm: config.qk_norm(variant),
                scores: ScoreRules {
                    window: windows[i],
                    ..ScoreRules::default()
                },
                ..ProjectedAttentionSpec::new(i, h, heads)
            };
            let mixer = ProjectedAttention::load(layer.pp("self_attn"), &attention)?;
            let feed_forward = match config.moe(variant, i, activation) {
                Some(moe) => Mlp::Sparse(Box::new(SparseMoe::load(moe_scope(&mut layer), &moe)?)),
                None if variant.fused() => {
                    Mlp::Dense(Box::new(GatedMlp::load_fused(layer.pp("mlp"), &dense)?))
                }
                None => Mlp::Dense(Box::new(GatedMlp::load(layer.pp("mlp"), &dense)?)),
            };
            let mut norm = |name: &str| RmsNorm::load(layer.pp(name), h, eps);
            let (input_norm, post_norm, output_norms) = match variant.post_norms() {
                true => (
                    None,
                    None,
                    Some(OutputNorms {
                        mixer: norm("post_attention_layernorm")?,
                        feed_forward: norm("post_feedforward_layernorm")?,
                    }),
                ),
                false => (
                    Some(norm("input_layernorm")?),
                    Some(norm("post_attention_layernorm")?),
                    None,
                ),
            };
            Ok(DecoderLayer {
                input_norm,
                mixer: LayerMixer::Attention(Box::new(mixer)),
                post_norm,
                feed_forward,
                output_norms,
            })
        })
        .collect::<Result<_>>()?;
    let norm = RmsNorm::load(model.pp("norm"), h, eps)?;
    let tied = config.tie_word_embeddings;
    let lm_head = Linear::head(loader.pp("lm_head"), &embed_tokens, tied)?;
    Ok(HybridDecoder::new(DecoderParts {
        embed_tokens,
        rotary,
        layers,
        head: LmHead::new(norm, lm_head),
        options: DecoderOptions {
            recompute_beyond: config.recompute_beyond(variant),
            ..DecoderOptions::default()
        },
    }))
}

/// Where a layer's mixture of experts is stored: the hub's Mixtral checkpoints keep it under
/// `block_sparse_moe`, transformers 5.x under `mlp`.
fn moe_scope<'l, 'a>(layer: &'l mut WeightScope<'_, 'a>) -> WeightScope<'l, 'a> {
    match layer.contains("block_sparse_moe.gate.weight") {
        true => layer.pp("block_sparse_moe"),
        false => layer.pp("mlp"),
    }
}

fn load_boxed(config: &ArchConfig, loader: &mut WeightLoader<'_>) -> Result<Box<dyn CausalLm>> {
    Ok(Box::new(load(config, loader)?))
}

/// Llama (and the Mistral, Qwen2 and Qwen3 checkpoints that run the same code path), as the
/// registry lists it.
pub static ARCHITECTURE: Architecture = Architecture {
    name: "llama",
    model_types: &["llama", "mistral", "qwen2", "qwen3"],
    architectures: &[
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
    ],
    load: load_boxed,
    tiny_config: r#"{"model_type": "llama", "vocab_size": 61, "hidden_size": 16,
        "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 64, "eos_token_id": 60}"#,
};

/// The mixtures of experts of the family: Mixtral, Qwen2-MoE and Qwen3-MoE.
pub static MOE: Architecture = Architecture {
    name: "mixtral",
    model_types: &["mixtral", "qwen2_moe", "qwen3_moe"],
    architectures: &[
        "MixtralForCausalLM",
        "Qwen2MoeForCausalLM",
        "Qwen3MoeForCausalLM",
    ],
    load: load_boxed,
    tiny_config: r#"{"model_type": "qwen2_moe", "vocab_size": 61, "hidden_size": 16,
        "intermediate_size": 24, "moe_intermediate_size": 8,
        "shared_expert_intermediate_size": 12, "num_experts": 4, "num_experts_per_tok": 2,
        "mlp_only_layers": [1], "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 64, "eos_token_id": 60}"#,
};

/// OLMo-2, as the registry lists it.
pub static OLMO2: Architecture = Architecture {
    name: "olmo2",
    model_types: &["olmo2"],
    architectures: &["Olmo2ForCausalLM"],
    load: load_boxed,
    tiny_config: r#"{"model_type": "olmo2", "vocab_size": 61, "hidden_size": 16,
        "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 64, "eos_token_id": 60}"#,
};

/// Phi-3 (and Phi-3.5, Phi-4-mini), as the registry lists it.
pub static PHI3: Architecture = Architecture {
    name: "phi3",
    model_types: &["phi3"],
    architectures: &["Phi3ForCausalLM"],
    load: load_boxed,
    tiny_config: r#"{"model_type": "phi3", "vocab_size": 61, "hidden_size": 16,
        "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "partial_rotary_factor": 0.5, "sliding_window": 3,
        "max_position_embeddings": 64, "eos_token_id": 60}"#,
};

//! # Llama
//!
//! "LLaMA: Open and Efficient Foundation Language Models" (Touvron et al., 2023) and its
//! successors: pre-norm decoder with RMSNorm, rotary positions (with the `linear`, `dynamic`
//! and `llama3` scalings), grouped-query attention and a SwiGLU MLP.
//!
//! `LlamaForCausalLM` as `transformers` 5.x stores it (`model.embed_tokens`, `model.layers.{i}`,
//! `model.norm`, `lm_head` unless tied), and the checkpoints that run the same code path under
//! other `model_type`s: `mistral` (a sliding window on every layer), `qwen2` (q/k/v biases, a
//! sliding window on the layers its config names) and `qwen3` (Qwen2's windows, per-head q/k
//! RMSNorm, a head size of its own). Anything else of theirs is refused with the reason.

mod config;

use hookscope_core::nn::{
    Activation, DecoderLayer, DecoderOptions, DecoderParts, Embedding, GatedMlp, GatedMlpSpec,
    HybridDecoder, LayerMixer, Linear, NoOtherMixer, ProjectedAttention, ProjectedAttentionSpec,
    RmsNorm, ScoreRules,
};
use hookscope_core::{ArchConfig, Architecture, Result, WeightLoader};

pub use config::LlamaConfig;

/// A loaded Llama-family model: a decoder whose every layer is attention.
pub type Llama = HybridDecoder<NoOtherMixer, GatedMlp>;

/// Builds the model from its config and weights.
pub fn load(arch_config: &ArchConfig, loader: &mut WeightLoader<'_>) -> Result<Llama> {
    let config: LlamaConfig = arch_config.parse()?;
    let heads = config.check(arch_config)?;
    let windows = config.windows(arch_config)?;
    let activation = Activation::from_config(arch_config, "hidden_act", &config.hidden_act)?;
    let rope = config.rope(arch_config)?;
    let h = config.hidden_size;
    let (qkv_bias, o_bias) = config.attention_biases();
    let eps = config.rms_norm_eps;
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
            let attention = ProjectedAttentionSpec {
                qkv_bias,
                o_bias,
                qk_norm: config.qk_norm(),
                scores: ScoreRules {
                    window: windows[i],
                    ..ScoreRules::default()
                },
                ..ProjectedAttentionSpec::new(i, h, heads)
            };
            Ok(DecoderLayer {
                input_norm: RmsNorm::load(layer.pp("input_layernorm"), h, eps)?,
                mixer: LayerMixer::Attention(Box::new(ProjectedAttention::load(
                    layer.pp("self_attn"),
                    &attention,
                )?)),
                post_norm: RmsNorm::load(layer.pp("post_attention_layernorm"), h, eps)?,
                feed_forward: GatedMlp::load(layer.pp("mlp"), &mlp)?,
                output_norms: None,
            })
        })
        .collect::<Result<_>>()?;
    let norm = RmsNorm::load(model.pp("norm"), h, eps)?;
    let tied = config.tie_word_embeddings;
    let lm_head = Linear::head(loader.pp("lm_head"), &embed_tokens, tied)?;
    Ok(HybridDecoder::new(DecoderParts {
        embed_tokens,
        rotary: rope.rotary(heads.head_dim),
        layers,
        norm,
        lm_head,
        options: DecoderOptions::default(),
    }))
}

/// Llama (and the Mistral, Qwen2 and Qwen3 checkpoints that run the same code path), as the registry
/// lists it.
pub static ARCHITECTURE: Architecture = Architecture {
    name: "llama",
    model_types: &["llama", "mistral", "qwen2", "qwen3"],
    architectures: &[
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
    ],
    load: |config, loader| Ok(Box::new(load(config, loader)?)),
    tiny_config: r#"{"model_type": "llama", "vocab_size": 61, "hidden_size": 16,
        "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 64, "eos_token_id": 60}"#,
};

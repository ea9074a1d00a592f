//! # Gemma
//!
//! "Gemma: Open Models Based on Gemini Research and Technology" (Gemma Team, 2024), "Gemma 2:
//! Improving Open Language Models at a Practical Size" (2024) and the Gemma 3 Technical Report
//! (2025): Llama's decoder with `(1 + w)` RMSNorms, an embedding scaled by `sqrt(hidden)`, a
//! GeGLU MLP and a head size of its own; from Gemma 2 on, norms after attention and MLP as well
//! as before ("sandwich" norms), sliding-window attention on alternate layers and scores scaled
//! by `query_pre_attn_scalar^-0.5`; Gemma 2 soft-caps scores and logits; Gemma 3 adds per-head
//! q/k norms and a rotary base per layer type.
//!
//! `GemmaForCausalLM`, `Gemma2ForCausalLM` and `Gemma3ForCausalLM` as `transformers` 5.24
//! stores them (`model.embed_tokens`, `model.layers.{i}`, `model.norm`, `lm_head` unless tied),
//! and the language model of `Gemma3ForConditionalGeneration` checkpoints (`text_config`,
//! weights under `model.language_model` or the hub's older `language_model.model`; the vision
//! tower is ignored, with a note).

mod config;

use hookscope_core::nn::{
    DecoderLayer, DecoderOptions, DecoderParts, Embedding, GatedMlp, GatedMlpSpec, HybridDecoder,
    LayerMixer, Linear, LmHead, NoOtherMixer, OutputNorms, ProjectedAttention,
    ProjectedAttentionSpec, QkNorm, QkNormSpan, RmsNorm, ScoreRules,
};
use hookscope_core::{ArchConfig, Architecture, Result, WeightLoader};

pub use config::{Cap, GemmaConfig, Generation};

/// A loaded Gemma model: a decoder whose every layer is attention.
pub type Gemma = HybridDecoder<NoOtherMixer, GatedMlp>;

/// Builds the model from its config (a Gemma config, or a `gemma3` one holding it under
/// `text_config`) and weights.
pub fn load(arch_config: &ArchConfig, loader: &mut WeightLoader<'_>) -> Result<Gemma> {
    let text = arch_config.text_config();
    if text.is_some() {
        loader.note(
            "this checkpoint is multimodal: its language model is loaded, the vision tower is \
             ignored",
        );
    }
    let text_config = text.as_ref().unwrap_or(arch_config);
    let config: GemmaConfig = text_config.parse()?;
    let model_type = config.model_type.as_deref().or(arch_config.model_type());
    let generation = Generation::of(model_type).ok_or_else(|| {
        text_config.unsupported(format!(
            "model_type {model_type:?} is not a Gemma model type"
        ))
    })?;
    let heads = config.heads(text_config)?;
    let windows = config.windows(text_config, generation)?;
    let (rope, sliding_rope) = config.ropes(text_config, generation)?;
    let (score_softcap, score_softcap_ignored) = config.score_softcap(generation);
    if score_softcap_ignored {
        loader.note(
            "attn_logit_softcapping is ignored: transformers' Gemma 3 attention does not apply it",
        );
    }
    let scores = ScoreRules {
        scale: Some(config.score_scale(text_config, generation, heads.head_dim)?),
        softcap: score_softcap,
        window: None,
    };
    let (h, eps) = (config.hidden_size, config.rms_norm_eps);
    let mlp = GatedMlpSpec {
        hidden: h,
        inner: config.intermediate_size,
        bias: false,
        activation: config.activation(text_config, generation)?,
    };
    let sandwich = generation != Generation::Gemma;
    let qk_norm = (generation == Generation::Gemma3).then_some(QkNorm {
        eps,
        unit_offset: true,
        span: QkNormSpan::PerHead,
    });

    let mut model = loader.pp_stored(&["model.language_model", "language_model.model", "model"]);
    let embed_tokens = Embedding::load(model.pp("embed_tokens"), config.vocab_size(generation), h)?;
    let layers = (0..config.num_hidden_layers)
        .map(|i| {
            let mut layer = model.pp(format!("layers.{i}"));
            let attention = ProjectedAttentionSpec {
                qkv_bias: config.attention_bias,
                o_bias: config.attention_bias,
                qk_norm,
                scores: ScoreRules {
                    window: windows[i],
                    ..scores
                },
                ..ProjectedAttentionSpec::new(i, h, heads)
            };
            let attention = ProjectedAttention::load(layer.pp("self_attn"), &attention)?;
            // Gemma 1's `post_attention_layernorm` is the norm before the MLP, as Llama's;
            // the sandwich's is the attention output's, with `pre_feedforward_layernorm` before
            // the MLP.
            let (post_norm, output_norms) = match sandwich {
                false => (
                    RmsNorm::load_unit_offset(layer.pp("post_attention_layernorm"), h, eps)?,
                    None,
                ),
                true => (
                    RmsNorm::load_unit_offset(layer.pp("pre_feedforward_layernorm"), h, eps)?,
                    Some(OutputNorms {
                        mixer: RmsNorm::load_unit_offset(
                            layer.pp("post_attention_layernorm"),
                            h,
                            eps,
                        )?,
                        feed_forward: RmsNorm::load_unit_offset(
                            layer.pp("post_feedforward_layernorm"),
                            h,
                            eps,
                        )?,
                    }),
                ),
            };
            Ok(DecoderLayer {
                input_norm: Some(RmsNorm::load_unit_offset(
                    layer.pp("input_layernorm"),
                    h,
                    eps,
                )?),
                mixer: LayerMixer::Attention(Box::new(attention)),
                post_norm: Some(post_norm),
                feed_forward: GatedMlp::load(layer.pp("mlp"), &mlp)?,
                output_norms,
            })
        })
        .collect::<Result<_>>()?;
    let final_norm = RmsNorm::load_unit_offset(model.pp("norm"), h, eps)?;
    let tied = match text {
        // A conditional-generation checkpoint says it at the top (true by default).
        Some(_) => arch_config
            .json
            .get("tie_word_embeddings")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(true),
        None => config.tie_word_embeddings.unwrap_or(true),
    };
    let lm_head = Linear::head(
        loader.pp_stored(&["lm_head", "language_model.lm_head"]),
        &embed_tokens,
        tied,
    )?;
    // transformers multiplies by `sqrt(hidden)` cast to the activations' dtype, which is f32
    // here at every storage precision (a bf16 run of transformers rounds it to 5.65625 for
    // hidden 32; a bf16 load here computes what f32 computes on the rounded weights).
    let embedding_scale = (h as f64).sqrt() as f32;
    let (logit_softcap, logit_softcap_ignored) = config.logit_softcap(generation, text.is_some());
    if logit_softcap_ignored {
        loader.note(
            "final_logit_softcapping is ignored: transformers' Gemma3ForConditionalGeneration \
             does not apply it",
        );
    }
    Ok(HybridDecoder::new(DecoderParts {
        embed_tokens,
        rotary: rope.rotary(arch_config, heads.head_dim)?,
        layers,
        head: LmHead::new(final_norm, lm_head).soft_capped(logit_softcap),
        options: DecoderOptions {
            embedding_scale: Some(embedding_scale),
            sliding_rotary: sliding_rope
                .map(|rope| rope.rotary(arch_config, heads.head_dim))
                .transpose()?,
            ..DecoderOptions::default()
        },
    }))
}

/// Gemma (1), as the registry lists it.
pub static GEMMA: Architecture = Architecture {
    name: "gemma",
    model_types: &["gemma"],
    architectures: &["GemmaForCausalLM"],
    load: |config, loader| Ok(Box::new(load(config, loader)?)),
    tiny_config: r#"{"model_type": "gemma", "vocab_size": 61, "hidden_size": 16,
        "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 6, "max_position_embeddings": 64,
        "eos_token_id": 60}"#,
};

/// Gemma 2, as the registry lists it.
pub static GEMMA2: Architecture = Architecture {
    name: "gemma2",
    model_types: &["gemma2"],
    architectures: &["Gemma2ForCausalLM"],
    load: |config, loader| Ok(Box::new(load(config, loader)?)),
    tiny_config: r#"{"model_type": "gemma2", "vocab_size": 61, "hidden_size": 16,
        "intermediate_size": 24, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 6, "query_pre_attn_scalar": 8,
        "sliding_window": 3, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
        "max_position_embeddings": 64, "eos_token_id": 60}"#,
};

/// Gemma 3 (text-only checkpoints and the language model of multimodal ones), as the registry
/// lists it.
pub static GEMMA3: Architecture = Architecture {
    name: "gemma3",
    model_types: &["gemma3_text", "gemma3"],
    architectures: &["Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"],
    load: |config, loader| Ok(Box::new(load(config, loader)?)),
    tiny_config: r#"{"model_type": "gemma3_text", "vocab_size": 61, "hidden_size": 16,
        "intermediate_size": 24, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 6, "query_pre_attn_scalar": 8,
        "sliding_window": 3, "sliding_window_pattern": 3, "rope_theta": 100000.0,
        "rope_local_base_freq": 1000.0, "max_position_embeddings": 64, "eos_token_id": 60}"#,
};

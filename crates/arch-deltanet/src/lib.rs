//! # Gated DeltaNet hybrids
//!
//! "Gated Delta Networks: Improving Mamba2 with Delta Rule" (Yang, Kautz & Hatamizadeh, 2024)
//! as Qwen3-Next and Qwen3.5 use it: layers of the Gated DeltaNet mixer ([`mixer`], with the
//! chunked and recurrent rule in [`delta_rule`]) interleaved with gated softmax attention, each
//! followed by a dense MLP or a mixture of experts ([`model`]).
//!
//! A prompt call runs the chunked rule (chunks of 64), a decode step the one-token rule; both
//! carry the convolution window and the state `[B, NV, DK, DV]` in the cache.

pub mod delta_rule;
pub mod mixer;
pub mod model;

use hookscope_core::Architecture;

pub use model::{Family, Hybrid, load};

/// Qwen3-Next, as the registry lists it.
pub static QWEN3_NEXT: Architecture = Architecture {
    name: "qwen3_next",
    model_types: &["qwen3_next"],
    architectures: &["Qwen3NextForCausalLM"],
    load: |config, loader| Ok(Box::new(load(config, loader, Family::Qwen3Next)?)),
    tiny_config: r#"{"model_type": "qwen3_next", "vocab_size": 61, "hidden_size": 16,
        "intermediate_size": 24, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_key_head_dim": 4, "linear_value_head_dim": 6,
        "full_attention_interval": 2, "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 8, "shared_expert_intermediate_size": 12,
        "mlp_only_layers": [1], "eos_token_id": 60}"#,
};

/// Qwen3.5 (dense), as the registry lists it.
pub static QWEN3_5: Architecture = Architecture {
    name: "qwen3_5",
    model_types: &["qwen3_5", "qwen3_5_text"],
    architectures: &["Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"],
    load: |config, loader| Ok(Box::new(load(config, loader, Family::Qwen35)?)),
    tiny_config: r#"{"model_type": "qwen3_5_text", "vocab_size": 61, "hidden_size": 16,
        "intermediate_size": 24, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "linear_num_key_heads": 2,
        "linear_num_value_heads": 2, "linear_key_head_dim": 4, "linear_value_head_dim": 6,
        "full_attention_interval": 3, "eos_token_id": 60}"#,
};

/// Qwen3.5-MoE, as the registry lists it.
pub static QWEN3_5_MOE: Architecture = Architecture {
    name: "qwen3_5_moe",
    model_types: &["qwen3_5_moe", "qwen3_5_moe_text"],
    architectures: &[
        "Qwen3_5MoeForCausalLM",
        "Qwen3_5MoeForConditionalGeneration",
    ],
    load: |config, loader| Ok(Box::new(load(config, loader, Family::Qwen35Moe)?)),
    tiny_config: r#"{"model_type": "qwen3_5_moe_text", "vocab_size": 61, "hidden_size": 16,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 4, "linear_value_head_dim": 6, "full_attention_interval": 2,
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
        "shared_expert_intermediate_size": 12, "eos_token_id": 60}"#,
};

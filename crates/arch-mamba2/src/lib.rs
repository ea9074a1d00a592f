//! # Mamba-2 and Bamba
//!
//! "Transformers are SSMs: Generalized Models and Efficient Algorithms Through Structured State
//! Space Duality" (Dao & Gu, 2024): Mamba-2's mixer ([`mixer`]) and its chunked scan ([`ssd`]),
//! the Mamba-2 language model ([`mamba2`]) and IBM's Bamba ([`bamba`]), which interleaves the
//! same mixer with softmax attention layers.
//!
//! A prompt call runs the chunked scan (`chunk_size` from the config), a decode step the
//! one-token update; both carry the convolution window and the SSM state `[B, NH, P, N]` in the
//! cache, and serve `state_input`, `state_output` and `attention_head_outputs`.

pub mod bamba;
pub mod mamba2;
pub mod mixer;
pub mod ssd;

use hookscope_core::Architecture;

pub use bamba::Bamba;
pub use mamba2::Mamba2;

/// Mamba-2, as the registry lists it.
pub static ARCHITECTURE: Architecture = hookscope_core::architecture!(
    Mamba2,
    name: "mamba2",
    model_types: ["mamba2"],
    architectures: ["Mamba2ForCausalLM"],
    tiny_config: r#"{"model_type": "mamba2", "vocab_size": 61, "hidden_size": 16,
        "num_hidden_layers": 2, "num_heads": 4, "head_dim": 8, "expand": 2, "n_groups": 2,
        "state_size": 4, "conv_kernel": 4, "chunk_size": 4, "tie_word_embeddings": true,
        "eos_token_id": 60}"#,
);

/// Bamba, as the registry lists it.
pub static BAMBA_ARCHITECTURE: Architecture = Architecture {
    name: "bamba",
    model_types: &["bamba"],
    architectures: &["BambaForCausalLM"],
    load: |config, loader| Ok(Box::new(bamba::load(config, loader)?)),
    tiny_config: r#"{"model_type": "bamba", "vocab_size": 61, "hidden_size": 16,
        "intermediate_size": 24, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 2, "attn_layer_indices": [1], "mamba_n_heads": 4,
        "mamba_d_head": 8, "mamba_n_groups": 1, "mamba_d_state": 4, "mamba_d_conv": 4,
        "mamba_chunk_size": 4, "eos_token_id": 60}"#,
};

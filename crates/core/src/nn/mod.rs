//! Layers shared by every architecture adapter: one implementation each, used by all.

mod activation;
mod attention;
mod block;
mod conv;
mod decay;
mod decoder;
mod elementwise;
mod embedding;
mod head_writes;
mod linear;
mod mlp;
mod moe;
mod norm;
mod output_head;
mod recurrent;
mod rope;
mod rotary;
mod selective_scan;

pub use crate::cpu::{DeltaRuleOperands, SsdOperands, chunked_delta_rule, chunked_ssd};
pub use activation::Activation;
pub use attention::{
    ProjectedAttention, ProjectedAttentionSpec, QkNorm, QkNormSpan, QkvWeights, ScoreRules,
    SoftmaxAttention,
};
pub use block::{parallel_residual_block, residual_block};
pub use conv::CausalConv1d;
pub use decay::{decay_matrix, pairwise_decay};
pub use decoder::{
    DecoderLayer, DecoderOptions, DecoderParts, FeedForward, HybridDecoder, LayerMixer, Mixer, Mlp,
    NoOtherMixer, OutputNorms,
};
pub use elementwise::{exp, sigmoid, silu, soft_cap, softmax_last};
pub use embedding::Embedding;
pub use head_writes::project_heads;
pub use linear::{FusedLayout, Linear};
pub use mlp::{GatedMlp, GatedMlpSpec, PlainMlp};
pub use moe::{MoeSpec, SparseMoe, is_sparse_layer};
pub use norm::{GatedRmsNorm, LayerNorm, RmsNorm};
pub use output_head::{FinalNorm, LmHead};
pub use recurrent::{Recurrence, RecurrentSites};
pub use rope::{Rope, RopeParameters, RopeRules, RotaryFraction};
pub use rotary::{RopeScaling, Rotary};
pub use selective_scan::{ScanInputs, selective_readout, selective_scan, selective_step};

//! Layers shared by every architecture adapter: one implementation each, used by all.

mod activation;
mod attention;
mod block;
mod conv;
mod decay;
mod decode_attention;
mod decoder;
mod embedding;
mod fastmath;
pub(crate) mod flex;
mod linear;
mod mlp;
mod moe;
mod norm;
pub(crate) mod packed;
mod pool;
mod prompt_attention;
mod recurrent;
mod rotary;
mod selective_scan;
mod softmax;

pub use activation::Activation;
pub use attention::{ProjectedAttention, ProjectedAttentionSpec, QkNorm, SoftmaxAttention};
pub use block::{parallel_residual_block, residual_block};
pub use conv::CausalConv1d;
pub use decay::{decay_matrix, pairwise_decay};
pub use decoder::{
    DecoderLayer, DecoderParts, FeedForward, HybridDecoder, LayerMixer, Mixer, NoOtherMixer,
};
pub use embedding::Embedding;
pub use fastmath::{exp, sigmoid, silu};
pub use linear::Linear;
pub use mlp::{GatedMlp, GatedMlpSpec};
pub use moe::{MoeSpec, SparseMoe};
pub use norm::{GatedRmsNorm, LayerNorm, RmsNorm};
pub use pool::on_worker;
pub use recurrent::{Recurrence, RecurrentSites};
pub use rotary::{RopeScaling, Rotary};
pub use selective_scan::{ScanInputs, selective_readout, selective_scan, selective_step};
pub use softmax::softmax_last;

//! Kernels for the CPU backend (burn's `flex`), where hookscope runs its own code instead of
//! burn's: packed weight products, attention over the cache where it lies, the fused selective
//! scan, the chunked gated delta rule, the causal convolution, Mamba-2's chunked scan, RMSNorm,
//! rotary embeddings, vectorised element-wise functions and an accurately summed softmax.
//!
//! The layers in `crate::nn` call these through one contract: each entry takes burn tensors
//! and returns `Option`, `Some` when the operands live on the CPU backend as `f32` in a layout
//! the kernel reads, `None` otherwise, and the layer then runs burn's own operations. Nothing
//! outside this module touches the backend's storage (`host` converts between burn tensors and
//! it), so kernels for another instruction set land here without touching a layer. Each kernel
//! picks its instruction set at run time, within the family `HOOKSCOPE_CPU_KERNELS` allows
//! (`isa`).

mod attention_tiles;
mod caches;
mod causal_conv;
mod decode_attention;
mod delta_rule;
mod elementwise;
mod host;
mod isa;
mod packed;
mod packed_tensors;
mod peak;
mod pool;
mod prompt_attention;
mod rms_norm;
mod rotary;
mod selective_scan;
mod softmax;
mod ssd;
mod tracked;
mod vector;

pub(crate) use causal_conv::{ConvOperands, causal_conv};
pub(crate) use decode_attention::attend as decode_attention;
pub use delta_rule::{DeltaRuleOperands, chunked_delta_rule};
pub(crate) use elementwise::{
    SQRT_2_OVER_PI, exp, gelu_tanh, gelu_tanh_times, sigmoid, silu, silu_times,
};
pub use isa::{KERNELS_VARIABLE, check_kernel_choice};
pub(crate) use packed::PackedMatrix;
pub use packed::product_kernels;
pub(crate) use packed_tensors::{
    embedding_rows, multiply, multiply_each, multiply_inputs, pack_view,
};
pub use peak::multiply_add_rounds;
pub use pool::on_worker;
pub(crate) use prompt_attention::{
    attend as prompt_attention, scores as attention_scores, weighted_values,
};
pub(crate) use rms_norm::rms_norm;
pub(crate) use rotary::rotate_half;
pub(crate) use selective_scan::{ScanOperands, selective_scan};
pub(crate) use softmax::softmax_last;
pub use ssd::{SsdOperands, chunked_ssd};
pub(crate) use tracked::{
    TrackedMatrix, gelu_tanh as tracked_gelu_tanh, multiply as tracked_multiply, pack_tracked,
};

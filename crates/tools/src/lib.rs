//! # hookscope-tools
//!
//! Tools built on [`hookscope_core::Model`]'s public API alone: activations over a whole dataset
//! streamed to safetensors files ([`extract`]), and the analyses researchers run on traces
//! ([`analysis`]: the logit lens and activation patching), and what a run reports ([`report`]).
//! The `hookscope` crate re-exports these modules.

pub mod analysis;
pub mod extract;
pub mod report;

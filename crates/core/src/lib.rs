//! # hookscope-core
//!
//! The architecture-independent half of hookscope: the standard hook schema (site names,
//! per-step shapes, the step-order contract), the hook engine, loading of Hugging Face
//! checkpoints, tokenization, the architecture registry, and the layers every adapter shares.
//!
//! Architecture adapters (the `hookscope-arch-*` crates) implement [`CausalLm`] and register an
//! [`Architecture`] with `inventory::submit!`; core knows nothing about any one architecture.

pub mod cache;
pub mod decoding;
pub mod error;
pub mod generate;
pub mod hooks;
pub mod input;
pub mod loading;
pub mod memory;
pub mod model;
pub mod nn;
pub mod output;
pub mod plugin;
pub mod registry;
pub mod schema;
pub mod tokenizer;

pub use decoding::{Decoding, GenerationConfig};
pub use error::{Error, Result};
pub use generate::Generation;
pub use hooks::{Hooks, Interventions, Saved, SiteValue, Steps};
pub use input::{Batch, CallInput};
pub use loading::{ArchConfig, EmbeddedModel, ModelSource, WeightLoader};
pub use model::{CausalLm, Model, Trace};
pub use registry::Architecture;
pub use schema::{LayerSite, MixerKind, MixerSite, ModelLayout, Site};

/// Re-exported so adapters register with the same `inventory` and `burn` as core.
pub use burn;
pub use inventory;

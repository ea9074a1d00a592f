//! # hookscope-core
//!
//! The architecture-independent half of hookscope: the standard hook schema (site names,
//! per-step shapes, the step-order contract), the hook engine, loading of Hugging Face
//! checkpoints, tokenization, the architecture registry, and the layers every adapter shares.
//!
//! Architecture adapters (the `hookscope-arch-*` crates) implement [`CausalLm`] and describe
//! themselves with an [`Architecture`]; the `hookscope` crate lists the built-in ones. Core knows
//! nothing about any one architecture. Tools built on [`Model`]'s public API (dataset
//! extraction, the logit lens, activation patching) live in `hookscope-tools`.

pub mod adapter;
pub mod cache;
pub mod call;
pub mod checkpoint;
pub mod config;
mod cpu;
pub mod decoding;
pub mod device;
pub mod dictionary;
pub mod error;
pub mod hooks;
pub mod host;
pub mod input;
pub mod memory;
pub mod model;
pub mod nn;
pub mod output;
pub mod plugin;
pub mod precision;
pub mod registry;
pub mod run;
pub mod schema;
pub mod source;
pub mod tokenizer;
pub mod weights;

pub use adapter::{Architecture, CausalLm, FeedForwardNorms, OutputHead, PlainNorm};
pub use call::Call;
pub use config::ArchConfig;
pub use cpu::{KERNELS_VARIABLE, multiply_add_rounds, product_kernels};
pub use decoding::{Decoding, GenerationConfig};
pub use device::DeviceChoice;
pub use dictionary::{AttachOptions, Dictionary};
pub use error::{Error, Result};
pub use hooks::{Interventions, Observer, Saved, SiteValue, Steps};
pub use input::Batch;
pub use model::{LoadOptions, Model};
pub use precision::{MatmulPrecision, WeightDtype};
pub use run::{Generation, Run, Trace};
pub use schema::{LayerSite, MixerKind, MixerSite, ModelLayout, Site};
pub use source::{EmbeddedModel, ModelSource};
pub use weights::WeightLoader;

/// Re-exported so adapters register with the same `inventory` and `burn` as core.
pub use burn;
pub use inventory;

/// What a researcher's program needs in one import: loading, requests, sites, generation and
/// the device type.
pub mod prelude {
    pub use crate::burn::tensor::Device;
    pub use crate::{
        Batch, Decoding, DeviceChoice, Error, Generation, GenerationConfig, Interventions,
        LayerSite, MixerSite, Model, ModelSource, Result, Run, Saved, Site, SiteValue, Steps,
        Trace,
    };
}

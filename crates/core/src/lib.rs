//! # hookscope-core
//!
//! The architecture-independent half of hookscope: the standard hook schema (site names,
//! per-step shapes, the step-order contract), the hook engine, loading of Hugging Face
//! checkpoints, tokenization, the architecture registry, and the layers every adapter shares.
//!
//! Architecture adapters (the `hookscope-arch-*` crates) implement [`CausalLm`] and describe
//! themselves with an [`Architecture`]; the `hookscope` crate lists the built-in ones. Core knows
//! nothing about any one architecture.

pub mod adapter;
pub mod analysis;
pub mod cache;
pub mod call;
pub mod decoding;
pub mod device;
pub mod error;
pub mod extract;
pub mod hooks;
pub mod host;
pub mod input;
pub mod loading;
pub mod memory;
pub mod model;
pub mod nn;
pub mod output;
pub mod plugin;
pub mod registry;
pub mod run;
pub mod schema;
pub mod tokenizer;

pub use adapter::{Architecture, CausalLm};
pub use call::Call;
pub use decoding::{Decoding, GenerationConfig};
pub use device::DeviceChoice;
pub use error::{Error, Result};
pub use hooks::{Interventions, Observer, Saved, SiteValue, Steps};
pub use input::Batch;
pub use loading::{
    ArchConfig, EmbeddedModel, MatmulPrecision, ModelSource, WeightDtype, WeightLoader,
};
pub use model::{LoadOptions, Model};
pub use run::{Generation, Run, Trace};
pub use schema::{LayerSite, MixerKind, MixerSite, ModelLayout, Site};

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

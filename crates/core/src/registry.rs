//! The architecture registry: adapters register themselves with `inventory`, and a checkpoint's
//! `config.json` finds its adapter here.

use crate::error::{Error, Result};
use crate::loading::{ArchConfig, WeightLoader};
use crate::model::CausalLm;

/// Builds an adapter's model from its config and weights.
pub type LoadFn = fn(&ArchConfig, &mut WeightLoader<'_>) -> Result<Box<dyn CausalLm>>;

/// One architecture adapter, as it registers itself.
#[derive(Debug)]
pub struct Architecture {
    /// Short name (`gpt2`).
    pub name: &'static str,
    /// The `model_type` values of `config.json` it serves.
    pub model_types: &'static [&'static str],
    /// The `architectures` class names it serves (used when `model_type` is absent).
    pub architectures: &'static [&'static str],
    /// Builds the model.
    pub load: LoadFn,
    /// `config.json` of a tiny model of this architecture, for the conformance suite (which
    /// fills it with seeded random weights).
    pub tiny_config: &'static str,
}

inventory::collect!(Architecture);

/// Every registered architecture (linked in, or loaded from a plugin), sorted by name.
pub fn registered() -> Vec<&'static Architecture> {
    let mut all: Vec<&'static Architecture> = inventory::iter::<Architecture>().collect();
    all.extend(crate::plugin::loaded());
    all.sort_by_key(|arch| arch.name);
    all
}

/// The architecture that serves `config`: by `model_type`, else by `architectures`.
pub fn find(config: &ArchConfig) -> Result<&'static Architecture> {
    let all = registered();
    let by_type = config.model_type().and_then(|model_type| {
        all.iter()
            .find(|arch| arch.model_types.contains(&model_type))
    });
    let by_class = || {
        let classes = config.architectures();
        all.iter().find(|arch| {
            classes
                .iter()
                .any(|c| arch.architectures.contains(&c.as_str()))
        })
    };
    match by_type.or_else(by_class) {
        Some(arch) => Ok(arch),
        None => Err(Error::UnknownArchitecture {
            model_type: config.model_type().unwrap_or("<missing>").to_string(),
            architectures: config.architectures(),
            registered: all
                .iter()
                .map(|arch| format!("{} ({})", arch.name, arch.model_types.join(", ")))
                .collect::<Vec<_>>()
                .join("; "),
        }),
    }
}

/// Registers an architecture whose model type has
/// `fn load(&ArchConfig, &mut WeightLoader) -> Result<Self>` and implements [`CausalLm`]:
///
/// ```text
/// hookscope_core::register_architecture!(Gpt2, name: "gpt2", model_types: ["gpt2"],
///     architectures: ["GPT2LMHeadModel"], tiny_config: r#"{"model_type": "gpt2", ...}"#);
/// ```
#[macro_export]
macro_rules! register_architecture {
    ($model:ty, name: $name:literal, model_types: [$($model_type:literal),* $(,)?],
     architectures: [$($class:literal),* $(,)?], tiny_config: $tiny:expr $(,)?) => {
        $crate::inventory::submit! {
            $crate::Architecture {
                name: $name,
                model_types: &[$($model_type),*],
                architectures: &[$($class),*],
                load: |config, loader| Ok(Box::new(<$model>::load(config, loader)?)),
                tiny_config: $tiny,
            }
        }
    };
}

//! The architecture registry: every architecture a checkpoint's `config.json` can be served by.
//!
//! Three sources feed it: lists linked into the program with [`Registration`] (the `hookscope`
//! crate's list of built-in architectures, and crates outside the workspace through
//! [`crate::register_architecture!`]), and architectures added at run time with [`add`] (what
//! `--plugin` loads).

use std::sync::RwLock;

use crate::adapter::Architecture;
use crate::config::ArchConfig;
use crate::error::{Error, Result};

/// Architectures a linked crate contributes, collected through `inventory`.
#[derive(Debug)]
pub struct Registration(pub &'static [&'static Architecture]);

inventory::collect!(Registration);

/// Architectures added at run time (plugins).
static ADDED: RwLock<Vec<&'static Architecture>> = RwLock::new(Vec::new());

fn linked() -> impl Iterator<Item = &'static Architecture> {
    inventory::iter::<Registration>().flat_map(|registration| registration.0.iter().copied())
}

/// Every registered architecture (linked in, or added at run time), sorted by name.
pub fn registered() -> Vec<&'static Architecture> {
    let mut all: Vec<&'static Architecture> = linked().collect();
    if let Ok(added) = ADDED.read() {
        all.extend(added.iter().copied());
    }
    all.sort_by_key(|arch| arch.name);
    all
}

/// Adds an architecture at run time; refused (with the reason) when its name is taken.
pub fn add(arch: &'static Architecture) -> std::result::Result<(), String> {
    let mut added = ADDED
        .write()
        .map_err(|_| "the registry is poisoned".to_string())?;
    let taken = linked()
        .chain(added.iter().copied())
        .any(|other| other.name == arch.name);
    if taken {
        return Err(format!(
            "an architecture named `{}` is already registered",
            arch.name
        ));
    }
    added.push(arch);
    Ok(())
}

/// The architecture that serves `config`: by `model_type`, else by `architectures`.
pub fn find(config: &ArchConfig) -> Result<&'static Architecture> {
    if let Some(model_type) = config.json.get("model_type").filter(|v| !v.is_string()) {
        return Err(config.unsupported(format!("`model_type` must be a string, got {model_type}")));
    }
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

/// Registers an architecture from a crate outside the workspace (built-ins are listed in the
/// `hookscope` crate instead). Same arguments as [`crate::architecture!`]:
///
/// ```text
/// hookscope_core::register_architecture!(Mine, name: "mine", model_types: ["mine"],
///     architectures: ["MineForCausalLM"], tiny_config: r#"{"model_type": "mine", ...}"#);
/// ```
#[macro_export]
macro_rules! register_architecture {
    ($($arguments:tt)*) => {
        const _: () = {
            static ARCHITECTURE: $crate::Architecture = $crate::architecture!($($arguments)*);
            $crate::inventory::submit! {
                $crate::registry::Registration(&[&ARCHITECTURE])
            }
        };
    };
}

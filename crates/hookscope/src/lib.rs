//! # hookscope
//!
//! Read and write the internals of language models under one standard set of site names
//! (`layers.6.layer_output`, `layers.6.self_attn.attention_keys`, `logits`, ...), on a single
//! forward call or at every step of generation. This crate is the one dependency a program
//! needs: it re-exports [`hookscope_core`], the tools of `hookscope-tools` ([`extract`],
//! [`analysis`]) and links every built-in architecture, listed in [`BUILTIN`].
//!
//! ```rust
#![doc = include_str!("../examples/quickstart.rs")]
//! ```

#![deny(unused_crate_dependencies)]

pub use hookscope_core::*;
pub use hookscope_tools::{analysis, extract, report};

use hookscope_core::registry::Registration;

/// Every built-in architecture: the one list the command line, the conformance suite, the tests
/// and library users share. A new built-in architecture is its crate, an entry here and a
/// fixture case in `conformance/scripts/make_fixtures.py`.
pub static BUILTIN: [&Architecture; 15] = [
    &hookscope_arch_gpt2::ARCHITECTURE,
    &hookscope_arch_gptneox::ARCHITECTURE,
    &hookscope_arch_llama::ARCHITECTURE,
    &hookscope_arch_llama::MOE,
    &hookscope_arch_llama::OLMO2,
    &hookscope_arch_llama::PHI3,
    &hookscope_arch_gemma::GEMMA,
    &hookscope_arch_gemma::GEMMA2,
    &hookscope_arch_gemma::GEMMA3,
    &hookscope_arch_mamba::ARCHITECTURE,
    &hookscope_arch_mamba2::ARCHITECTURE,
    &hookscope_arch_mamba2::BAMBA_ARCHITECTURE,
    &hookscope_arch_deltanet::QWEN3_NEXT,
    &hookscope_arch_deltanet::QWEN3_5,
    &hookscope_arch_deltanet::QWEN3_5_MOE,
];

hookscope_core::inventory::submit! {
    Registration(&BUILTIN)
}

/// The default model compiled into this crate, so that everything runs offline: a small Llama
/// (4 layers, 64 wide, 4 query and 2 key/value heads, tied embeddings, float16, 6.9 MB) with the
/// real GPT-2 tokenizer, trained on the King James Bible by
/// `conformance/scripts/train_demo_model.py`. It continues text readably, has an induction head
/// and a logit lens that sharpens with depth (`conformance/tests/checks/demo_model.rs` checks all three
/// against `transformers`).
pub static DEFAULT_MODEL: EmbeddedModel = EmbeddedModel {
    name: "demo",
    config_json: include_str!("../embedded/demo/config.json"),
    generation_config_json: Some(include_str!("../embedded/demo/generation_config.json")),
    tokenizer_json: Some(include_bytes!("../embedded/demo/tokenizer.json")),
    weights: include_bytes!("../embedded/demo/model.safetensors"),
};

/// The embedded [`DEFAULT_MODEL`] as a model source.
pub fn default_model() -> ModelSource {
    ModelSource::Embedded(&DEFAULT_MODEL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_is_registered_once() {
        let registered = registry::registered();
        for arch in BUILTIN {
            let count = registered.iter().filter(|a| a.name == arch.name).count();
            assert_eq!(count, 1, "{} registered {count} times", arch.name);
        }
    }

    /// A new `crates/arch-*` crate that is not in [`BUILTIN`] would be invisible to the CLI, the
    /// suite and library users alike. Every workspace member under `crates/arch-` must be a
    /// dependency of this crate; `unused_crate_dependencies` (denied above) then fails the build
    /// of a dependency nothing here names, and only [`BUILTIN`] names them.
    #[test]
    fn every_arch_crate_of_the_workspace_is_a_dependency() {
        let workspace = include_str!("../../../Cargo.toml");
        let manifest = include_str!("../Cargo.toml");
        let mut members: Vec<&str> = workspace
            .lines()
            .filter_map(|line| line.trim().strip_prefix("\"crates/arch-"))
            .filter_map(|rest| rest.strip_suffix("\","))
            .collect();
        let mut dependencies: Vec<&str> = manifest
            .lines()
            .filter_map(|line| line.strip_prefix("hookscope-arch-"))
            .filter_map(|rest| rest.strip_suffix(".workspace = true"))
            .collect();
        members.sort_unstable();
        dependencies.sort_unstable();
        assert!(members.len() >= 4, "found {members:?} in the workspace");
        assert_eq!(
            members, dependencies,
            "the workspace's arch crates and this crate's dependencies differ"
        );
    }

    #[test]
    fn the_readme_shows_the_quickstart_example_verbatim() {
        let readme = include_str!("../../../README.md");
        let example = include_str!("../examples/quickstart.rs");
        assert!(
            readme.contains(&format!("```rust\n{example}```")),
            "README.md's \"From Rust\" block must be examples/quickstart.rs, verbatim"
        );
    }
}

//! # hookscope
//!
//! Read and write the internals of language models under one standard set of site names
//! (`layers.6.layer_output`, `layers.6.self_attn.attention_keys`, `logits`, ...), on a single
//! forward call or at every step of generation. This crate is the one dependency a program
//! needs: it re-exports [`hookscope_core`] and links every built-in architecture, listed in
//! [`BUILTIN`].
//!
//! ```rust
#![doc = include_str!("../examples/quickstart.rs")]
//! ```

pub use hookscope_core::*;

use hookscope_core::registry::Registration;

/// Every built-in architecture: the one list the command line, the conformance suite, the tests
/// and library users share. A new built-in architecture is its crate, an entry here and a
/// fixture case in `conformance/scripts/make_fixtures.py`.
pub static BUILTIN: [&Architecture; 8] = [
    &hookscope_arch_gpt2::ARCHITECTURE,
    &hookscope_arch_llama::ARCHITECTURE,
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
/// and a logit lens that sharpens with depth (`conformance/tests/demo_model.rs` checks all three
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
    /// suite and library users alike: every one must be listed.
    #[test]
    fn every_arch_crate_of_the_workspace_is_listed() {
        let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let listing = include_str!("lib.rs");
        let builtin = &listing[listing.find("pub static BUILTIN").unwrap_or(0)..];
        let builtin = &builtin[..builtin.find("];").unwrap_or(builtin.len())];
        let mut found = 0;
        for entry in std::fs::read_dir(&crates).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            if let Some(family) = name.strip_prefix("arch-") {
                found += 1;
                let path = format!("hookscope_arch_{}::", family.replace('-', "_"));
                assert!(
                    builtin.contains(&path),
                    "crates/{name} is not listed in BUILTIN"
                );
            }
        }
        assert!(
            found >= 4,
            "found {found} arch crates under {}",
            crates.display()
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

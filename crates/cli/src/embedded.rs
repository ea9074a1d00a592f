//! The default model compiled into the binary: a tiny random GPT-2 with the real GPT-2
//! tokenizer (made by `conformance/scripts/make_fixtures.py`), so `hookscope run` works offline.

use hookscope_core::EmbeddedModel;

macro_rules! fixture {
    ($file:literal) => {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../conformance/fixtures/gpt2-tiny/",
            $file
        )
    };
}

/// The embedded default model.
pub static DEFAULT_MODEL: EmbeddedModel = EmbeddedModel {
    name: "gpt2-tiny",
    config_json: include_str!(fixture!("config.json")),
    generation_config_json: Some(include_str!(fixture!("generation_config.json"))),
    tokenizer_json: Some(include_bytes!(fixture!("tokenizer.json"))),
    weights: include_bytes!(fixture!("model.safetensors")),
};

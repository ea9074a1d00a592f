//! Property tests over the parsers that read untrusted bytes: corrupted `config.json` and
//! `generation_config.json` values, safetensors headers, tokenizer files, and site/step/pattern
//! syntax. The property is always the same: any input gives a model or a typed error, never a
//! panic (an abort would end the test binary). CI runs few cases; for a long run set
//! `PROPTEST_CASES` (the README's testing section records the runs).

use crate::common::{copy_fixture, load};
use hookscope::Steps;
use hookscope::hooks::Selection;
use hookscope::tokenizer::Tokenizer;
use hookscope_conformance::fixture::one_per_architecture;
use proptest::prelude::*;
use serde_json::Value;

/// Cases per property: `PROPTEST_CASES`, else a CI-sized default.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(24);
    ProptestConfig::with_cases(cases)
}

/// JSON values a corrupted file might hold: odd integers (huge, negative, zero), floats
/// (including non-finite markers), strings, nulls, booleans, small arrays and objects.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (0u64..70).prop_map(Value::from),
        (0u64..(1 << 31)).prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON numbers are finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
        Just(serde_json::json!({"__float__": "Infinity"})),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            proptest::collection::btree_map(".{0,6}", inner, 0..3)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// Sets `key` (an existing key of the file, picked by `pick`) or a new one to `value`.
fn corrupt_json(path: &std::path::Path, pick: usize, value: Value) {
    let mut json: Value = match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text).unwrap(),
        Err(_) => Value::Object(Default::default()),
    };
    let object = json.as_object_mut().unwrap();
    let keys: Vec<String> = object.keys().cloned().collect();
    let key = keys
        .get(pick % (keys.len() + 1))
        .cloned()
        .unwrap_or_else(|| "max_new_tokens".into());
    object.insert(key, value);
    std::fs::write(path, json.to_string()).unwrap();
}

/// Loads the model and, if it loads, runs a short generation; either may fail, neither may
/// panic.
fn load_and_generate(dir: &std::path::Path) {
    let Ok(model) = load(dir) else { return };
    let Ok(batch) = hookscope::Batch::left_padded(vec![vec![1, 2, 3]], 0) else {
        return;
    };
    let mut generation = model.generation_config().clone();
    generation.max_new_tokens = generation.max_new_tokens.min(2);
    let _ = model.generate(&batch, &hookscope::Interventions::new(), &generation);
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn corrupted_config_values_never_panic(
        fixture in 0..one_per_architecture(|_| true).len(),
        pick in any::<usize>(),
        value in json_value(),
    ) {
        let dir = copy_fixture(&one_per_architecture(|_| true)[fixture].name);
        corrupt_json(&dir.path().join("config.json"), pick, value);
        load_and_generate(dir.path());
    }

    #[test]
    fn corrupted_generation_configs_never_panic(pick in any::<usize>(), value in json_value()) {
        let dir = copy_fixture("gpt2-tied");
        corrupt_json(&dir.path().join("generation_config.json"), pick, value);
        load_and_generate(dir.path());
    }

    #[test]
    fn corrupted_safetensors_headers_never_panic(
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        cut in proptest::option::of(any::<usize>()),
    ) {
        let dir = copy_fixture("llama-mha-tied");
        let path = dir.path().join("model.safetensors");
        let mut bytes = std::fs::read(&path).unwrap();
        let header = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        for (at, byte) in flips {
            bytes[at % header] = byte;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut % bytes.len());
        }
        std::fs::write(&path, bytes).unwrap();
        load_and_generate(dir.path());
    }

    #[test]
    fn arbitrary_tokenizer_bytes_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..256),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
    ) {
        let path = std::path::Path::new("tokenizer.json");
        let _ = Tokenizer::from_bytes(path, &bytes);
        let mut real = std::fs::read(
            hookscope_conformance::fixtures_dir().join("gpt2-tiny/tokenizer.json"),
        )
        .unwrap_or_else(|_| b"{}".to_vec());
        for (at, byte) in flips {
            let len = real.len();
            real[at % len] = byte;
        }
        if let Ok(tokenizer) = Tokenizer::from_bytes(path, &real) {
            let _ = tokenizer.encode("The Eiffel Tower");
            let _ = tokenizer.decode(&[0, 1, 50_000, u32::MAX]);
        }
    }

    #[test]
    fn site_step_and_pattern_syntax_never_panics(spec in "[a-z_.*?@:0-9 \\-\\[\\]]{0,40}") {
        let model = crate::common::load_fixture("bamba-hybrid");
        let _ = Selection::parse(model.layout(), &spec, Steps::All);
        let _ = Steps::parse(&spec);
        let _ = model.layout().resolve(&spec);
    }
}

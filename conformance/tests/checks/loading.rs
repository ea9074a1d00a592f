//! Loading checkpoints: the layouts transformers writes, and clear errors for broken ones.

use crate::common::{copy_fixture, load, load_fixture, read_tensors, write_tensors};
use hookscope::{Error, Interventions, ModelSource};

fn error_of(result: hookscope::Result<hookscope::Model>) -> Error {
    match result {
        Ok(_) => panic!("loading should have failed"),
        Err(error) => error,
    }
}

#[test]
fn malformed_config_names_the_file() {
    let dir = copy_fixture("gpt2-tied");
    std::fs::write(
        dir.path().join("config.json"),
        "{\"model_type\": \"gpt2\", ",
    )
    .unwrap();
    let error = error_of(load(dir.path()));
    assert!(matches!(error, Error::Json { .. }), "{error}");
    assert!(error.to_string().contains("config.json"), "{error}");
}

#[test]
fn config_missing_a_field_says_which() {
    let dir = copy_fixture("gpt2-tied");
    let path = dir.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config.as_object_mut().unwrap().remove("n_embd");
    std::fs::write(&path, config.to_string()).unwrap();
    let error = error_of(load(dir.path())).to_string();
    assert!(error.contains("n_embd"), "{error}");
}

#[test]
fn unknown_model_type_lists_what_is_registered() {
    let dir = copy_fixture("gpt2-tied");
    let path = dir.path().join("config.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let text = text
        .replace("\"gpt2\"", "\"bloom\"")
        .replace("GPT2LMHeadModel", "BloomForCausalLM");
    std::fs::write(&path, text).unwrap();
    let error = error_of(load(dir.path()));
    assert!(
        matches!(error, Error::UnknownArchitecture { .. }),
        "{error}"
    );
    let message = error.to_string();
    assert!(
        message.contains("bloom") && message.contains("gpt2"),
        "{message}"
    );
}

#[test]
fn unsupported_activation_is_refused() {
    let dir = copy_fixture("gpt2-tied");
    let path = dir.path().join("config.json");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("\"gelu_new\"", "\"quick_gelu\"");
    std::fs::write(&path, text).unwrap();
    let error = error_of(load(dir.path()));
    assert!(matches!(error, Error::UnsupportedConfig { .. }), "{error}");
    assert!(error.to_string().contains("quick_gelu"));
}

#[test]
fn truncated_safetensors_is_a_clear_error() {
    let dir = copy_fixture("gpt2-tied");
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let error = error_of(load(dir.path()));
    assert!(matches!(error, Error::Safetensors { .. }), "{error}");
    std::fs::write(&path, &bytes[..5]).unwrap();
    assert!(matches!(
        error_of(load(dir.path())),
        Error::Safetensors { .. }
    ));
}

#[test]
fn every_missing_or_misshapen_weight_is_listed() {
    let dir = copy_fixture("gpt2-tied");
    let path = dir.path().join("model.safetensors");
    let mut tensors = read_tensors(&path);
    tensors.remove("transformer.h.0.ln_1.bias").unwrap();
    tensors.remove("transformer.h.2.mlp.c_fc.weight").unwrap();
    let wpe = tensors.get_mut("transformer.wpe.weight").unwrap();
    wpe.1 = vec![wpe.1[1], wpe.1[0]];
    write_tensors(&path, &tensors);
    let Error::Weights { problems, .. } = error_of(load(dir.path())) else {
        panic!("expected a weights error");
    };
    let text = problems.join("\n");
    assert_eq!(problems.len(), 3, "{text}");
    assert!(text.contains("transformer.h.0.ln_1.bias"), "{text}");
    assert!(text.contains("transformer.h.2.mlp.c_fc.weight"), "{text}");
    assert!(text.contains("transformer.wpe.weight` has shape"), "{text}");
}

#[test]
fn unused_weights_are_reported() {
    let dir = copy_fixture("gpt2-tied");
    let path = dir.path().join("model.safetensors");
    let mut tensors = read_tensors(&path);
    let extra = tensors["transformer.ln_f.bias"].clone();
    tensors.insert("transformer.h.0.attn.bias".into(), extra);
    write_tensors(&path, &tensors);
    let model = load(dir.path()).unwrap();
    assert_eq!(model.load_report().unused, ["transformer.h.0.attn.bias"]);
    assert!(load_fixture("gpt2-tied").load_report().unused.is_empty());
}

#[test]
fn malformed_tokenizer_is_a_clear_error() {
    let dir = copy_fixture("gpt2-tiny");
    std::fs::write(dir.path().join("tokenizer.json"), "{\"model\": 3}").unwrap();
    let error = error_of(load(dir.path()));
    assert!(matches!(error, Error::Tokenizer { .. }), "{error}");
    assert!(error.to_string().contains("tokenizer.json"));
}

#[test]
fn sharded_checkpoint_equals_single_file() {
    let dir = copy_fixture("gpt2-tied");
    let single = dir.path().join("model.safetensors");
    let tensors = read_tensors(&single);
    std::fs::remove_file(&single).unwrap();
    let mut shards = [
        crate::common::RawTensors::new(),
        crate::common::RawTensors::new(),
    ];
    let mut weight_map = serde_json::Map::new();
    for (i, (name, tensor)) in tensors.into_iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i % 2 + 1);
        weight_map.insert(name.clone(), file.into());
        shards[i % 2].insert(name, tensor);
    }
    for (i, shard) in shards.iter().enumerate() {
        write_tensors(
            &dir.path()
                .join(format!("model-0000{}-of-00002.safetensors", i + 1)),
            shard,
        );
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();

    let sharded = load(dir.path()).unwrap();
    let reference = load_fixture("gpt2-tied");
    let batch = reference.batch(vec![vec![1, 2, 3, 4]]).unwrap();
    let none = Interventions::new();
    let a = sharded
        .trace(&batch, &none)
        .unwrap()
        .logits()
        .unwrap()
        .to_data();
    let b = reference
        .trace(&batch, &none)
        .unwrap()
        .logits()
        .unwrap()
        .to_data();
    assert_eq!(a, b);
}

#[test]
fn hub_ids_resolve_from_the_local_cache_first() {
    let cache = tempfile::tempdir().unwrap();
    let error = ModelSource::resolve_in("openai-community/gpt2", cache.path(), true).unwrap_err();
    let message = error.to_string();
    assert!(message.contains("HF_HUB_OFFLINE is set"), "{message}");

    let repo = cache.path().join("models--openai-community--gpt2");
    let snapshot = repo.join("snapshots").join("abc123");
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs").join("main"), "abc123").unwrap();
    // Every file a model can need is cached, so resolving online touches no network either.
    for entry in std::fs::read_dir(hookscope_conformance::fixtures_dir().join("gpt2-tiny")).unwrap()
    {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), snapshot.join(entry.file_name())).unwrap();
    }
    // Offline or not, a cached model is used from the cache (no network is touched: every
    // file it needs is there).
    let source = ModelSource::resolve_in("openai-community/gpt2", cache.path(), true).unwrap();
    let ModelSource::Directory(dir) = &source else {
        panic!("expected a directory");
    };
    assert_eq!(dir, &snapshot);
    assert!(load(dir).is_ok());
    let online = ModelSource::resolve_in("openai-community/gpt2", cache.path(), false).unwrap();
    assert!(matches!(online, ModelSource::Directory(d) if d == snapshot));
}

#[test]
fn missing_directory_is_not_found() {
    let error = ModelSource::resolve("./no/such/model/dir").unwrap_err();
    assert!(matches!(error, Error::ModelNotFound { .. }), "{error}");
}

fn edit_config(
    fixture: &str,
    edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) -> tempfile::TempDir {
    let dir = copy_fixture(fixture);
    let path = dir.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(config.as_object_mut().unwrap());
    std::fs::write(&path, config.to_string()).unwrap();
    dir
}

#[test]
fn mistral_without_a_limiting_window_runs_as_llama() {
    let dir = edit_config("llama-mha-tied", |config| {
        config.insert("model_type".into(), "mistral".into());
        config.insert(
            "architectures".into(),
            serde_json::json!(["MistralForCausalLM"]),
        );
        config.insert("sliding_window".into(), serde_json::Value::Null);
    });
    let model = load(dir.path()).unwrap();
    assert_eq!(model.architecture().name, "llama");
}

#[test]
fn a_zero_sliding_window_is_refused() {
    let dir = edit_config("llama-mha-tied", |config| {
        config.insert("model_type".into(), "mistral".into());
        config.insert("sliding_window".into(), 0.into());
    });
    let error = error_of(load(dir.path()));
    assert!(matches!(error, Error::UnsupportedConfig { .. }), "{error}");
    assert!(error.to_string().contains("sliding"), "{error}");
}

#[test]
fn unknown_rope_types_are_refused() {
    let dir = edit_config("llama-mha-tied", |config| {
        config.insert(
            "rope_parameters".into(),
            serde_json::json!({"rope_type": "proportional", "factor": 4.0, "rope_theta": 10000.0}),
        );
    });
    let error = error_of(load(dir.path()));
    assert!(error.to_string().contains("proportional"), "{error}");
}

#[test]
fn grouped_query_heads_must_divide() {
    let dir = edit_config("llama-mha-tied", |config| {
        config.insert("num_key_value_heads".into(), 2.into());
    });
    let error = error_of(load(dir.path()));
    assert!(error.to_string().contains("num_key_value_heads"), "{error}");
}

/// `Qwen/Qwen3-0.6B` as released (tied, 16 query / 8 key-value heads of 128 beside a hidden
/// size of 1024), at 2 of its 28 layers and a 512-token vocabulary.
const QWEN3_0_6B: &str = r#"{
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 2, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 512
}"#;

/// `Qwen/Qwen3-8B` as released (untied, 32 query / 8 key-value heads of 128), at 1 of its 36
/// layers and a 512-token vocabulary.
const QWEN3_8B: &str = r#"{
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
  "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
  "num_attention_heads": 32, "num_hidden_layers": 1, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 512
}"#;

#[test]
fn released_qwen3_configs_load_and_run() {
    for (config, kv_heads) in [(QWEN3_0_6B, 8), (QWEN3_8B, 8)] {
        let (model, keys) = crate::common::random_run(config);
        assert_eq!(model.architecture().name, "llama");
        assert_eq!(keys, [1, kv_heads, 3, 128]);
    }
}

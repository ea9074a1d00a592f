//! Gemma's released configurations: each `config.json` as published (the hub's older keys
//! included: `rope_local_base_freq`, `sliding_window_pattern`, `rope_scaling`, a text config
//! leaving most keys to their defaults), at a few of its layers and a 512-token vocabulary (the
//! full vocabularies would allocate gigabytes of random weights), loads and runs.

use crate::common::{floats, load_fixture, max_diff, random_run};
use hookscope::hooks::{Action, Index, Write};
use hookscope::{Interventions, MixerSite, Model, Site, Steps};

/// `google/gemma-2-2b`, at 2 of its 26 layers.
const GEMMA_2_2B: &str = r#"{
  "architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
  "eos_token_id": 1, "final_logit_softcapping": 30.0, "head_dim": 256,
  "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 2304, "initializer_range": 0.02, "intermediate_size": 9216,
  "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
  "num_hidden_layers": 2, "num_key_value_heads": 4, "pad_token_id": 0,
  "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
  "sliding_window": 4096, "torch_dtype": "float32", "use_cache": true, "vocab_size": 512
}"#;

/// `google/gemma-2-9b`, at 1 of its 42 layers.
const GEMMA_2_9B: &str = r#"{
  "architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
  "eos_token_id": 1, "final_logit_softcapping": 30.0, "head_dim": 256,
  "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 16,
  "num_hidden_layers": 1, "num_key_value_heads": 8, "pad_token_id": 0,
  "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
  "sliding_window": 4096, "torch_dtype": "float32", "use_cache": true, "vocab_size": 512
}"#;

/// `google/gemma-3-270m`, at 6 of its 18 layers (`layer_types` cut to match).
const GEMMA_3_270M: &str = r#"{
  "_sliding_window_pattern": 6, "architectures": ["Gemma3ForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "attn_logit_softcapping": null, "bos_token_id": 2, "eos_token_id": 1,
  "final_logit_softcapping": null, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 640, "initializer_range": 0.02, "intermediate_size": 2048,
  "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
    "sliding_attention", "sliding_attention", "full_attention"],
  "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
  "num_hidden_layers": 6, "num_key_value_heads": 1, "pad_token_id": 0,
  "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0,
  "rope_scaling": null, "rope_theta": 1000000.0, "sliding_window": 512,
  "torch_dtype": "bfloat16", "use_bidirectional_attention": false, "use_cache": true,
  "vocab_size": 512
}"#;

/// `google/gemma-3-1b-pt`, at 2 of its 26 layers.
const GEMMA_3_1B: &str = r#"{
  "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid",
  "eos_token_id": 1, "final_logit_softcapping": null, "head_dim": 256,
  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
  "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
  "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 1, "pad_token_id": 0,
  "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": 512,
  "sliding_window_pattern": 6, "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 512
}"#;

/// `google/gemma-3-4b-pt` (`Gemma3ForConditionalGeneration`: a text config leaving the
/// vocabulary, bases, pattern and norms to their defaults), at 1 of its 34 layers, with the
/// vocabulary cut to 512.
const GEMMA_3_4B: &str = r#"{
  "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
  "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
  "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
  "text_config": {
    "head_dim": 256, "hidden_size": 2560, "intermediate_size": 10240,
    "model_type": "gemma3_text", "num_attention_heads": 8, "num_hidden_layers": 1,
    "num_key_value_heads": 4, "query_pre_attn_scalar": 256,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024,
    "vocab_size": 512
  },
  "torch_dtype": "bfloat16",
  "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
    "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
    "patch_size": 14, "vision_use_head": false}
}"#;

#[test]
fn released_gemma_configs_load_and_run() {
    for (name, config, arch, kv_heads) in [
        ("gemma-2-2b", GEMMA_2_2B, "gemma2", 4),
        ("gemma-2-9b", GEMMA_2_9B, "gemma2", 8),
        ("gemma-3-270m", GEMMA_3_270M, "gemma3", 1),
        ("gemma-3-1b-pt", GEMMA_3_1B, "gemma3", 1),
        ("gemma-3-4b-pt", GEMMA_3_4B, "gemma3", 4),
    ] {
        let (model, keys) = random_run(config);
        assert_eq!(model.architecture().name, arch, "{name}");
        assert_eq!(keys, [1, kv_heads, 3, 256], "{name}");
        let notes = &model.load_report().notes;
        let multimodal = notes.iter().any(|n| n.contains("vision tower is ignored"));
        assert_eq!(multimodal, name == "gemma-3-4b-pt", "{name}: {notes:?}");
    }
}

/// Logits of the last position of a prompt call over 7 tokens, with layer `layer`'s key at
/// position 0 zeroed (`gemma2-window-softcap`: windows of 3 on layers 0 and 2, layer 1 full).
fn last_logits_with_first_key_zeroed(model: &Model, layer: Option<usize>) -> Vec<f32> {
    let mut interventions = Interventions::new();
    if let Some(layer) = layer {
        let keys = Site::self_attn(layer, MixerSite::AttentionKeys);
        let write = Action::Write(Write::Zero);
        let first = Index::parse(":, :, 0:1").unwrap();
        interventions.push_indexed(keys, first, Steps::At(0), write);
    }
    let prompt: Vec<u32> = (1..8).collect();
    let trace = model
        .trace(&model.batch(vec![prompt]).unwrap(), &interventions)
        .unwrap();
    let logits = floats(trace.logits().unwrap().to_data());
    logits[logits.len() - model.layout().vocab..].to_vec()
}

/// A key outside every window of the positions that follow changes nothing there; the same
/// edit on a full-attention layer does.
#[test]
fn an_edit_of_a_key_outside_the_window_changes_nothing() {
    let model = load_fixture("gemma2-window-softcap");
    let clean = last_logits_with_first_key_zeroed(&model, None);
    // In the last layer (2, sliding), key 0 is seen by positions 0-2 only: the last
    // position's output is exactly what it was.
    let sliding = last_logits_with_first_key_zeroed(&model, Some(2));
    assert_eq!(max_diff(&sliding, &clean), 0.0);
    let full = last_logits_with_first_key_zeroed(&model, Some(1));
    assert!(max_diff(&full, &clean) > 1e-4);
}

/// Every logit of a prompt call of a tiny random model of `config` with `extra` keys added,
/// and the load's notes.
fn tiny_logits(config: &str, extra: &str) -> (Vec<f32>, Vec<String>) {
    let config = config.replacen('{', &format!("{{{extra}"), 1);
    let model = Model::random_from_config(&config, 3, &hookscope_conformance::test_device())
        .unwrap_or_else(|e| panic!("{e}"));
    let trace = model
        .trace(
            &model.batch(vec![vec![1, 5, 9, 2]]).unwrap(),
            &Interventions::new(),
        )
        .unwrap();
    let logits = floats(trace.logits().unwrap().to_data());
    (logits, model.load_report().notes.clone())
}

/// A soft-cap key left out takes the generation's default, as transformers 5.24's configs do:
/// Gemma 2 caps logits at 30 and scores at 50, Gemma 3 caps neither; `null` is no cap. Gemma 3's
/// attention ignores `attn_logit_softcapping` (as transformers' does), with a note.
#[test]
fn absent_soft_caps_take_each_generations_default() {
    let gemma2 = tiny_config_without_caps("gemma2");
    let (absent, _) = tiny_logits(&gemma2, "");
    let (defaults, _) = tiny_logits(
        &gemma2,
        r#""final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0, "#,
    );
    let (uncapped, _) = tiny_logits(
        &gemma2,
        r#""final_logit_softcapping": null, "attn_logit_softcapping": null, "#,
    );
    assert_eq!(absent, defaults);
    assert_ne!(absent, uncapped);

    let gemma3 = tiny_config_without_caps("gemma3_text");
    let (absent, _) = tiny_logits(&gemma3, "");
    let (null, _) = tiny_logits(&gemma3, r#""final_logit_softcapping": null, "#);
    let (capped, _) = tiny_logits(&gemma3, r#""final_logit_softcapping": 30.0, "#);
    assert_eq!(absent, null);
    assert_ne!(absent, capped);
    let (scores_capped, notes) = tiny_logits(&gemma3, r#""attn_logit_softcapping": 1.0, "#);
    assert_eq!(absent, scores_capped);
    assert!(
        notes
            .iter()
            .any(|n| n.contains("attn_logit_softcapping is ignored")),
        "{notes:?}"
    );
}

/// A tiny config of `model_type` without any soft-cap key.
fn tiny_config_without_caps(model_type: &str) -> String {
    format!(
        r#"{{"model_type": "{model_type}", "vocab_size": 61, "hidden_size": 16,
        "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 6, "query_pre_attn_scalar": 8,
        "sliding_window": 3, "max_position_embeddings": 64, "eos_token_id": 60}}"#
    )
}

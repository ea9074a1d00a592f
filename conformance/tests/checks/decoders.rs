//! The decoders of the Qwen3, Pythia, OLMo-2, Phi-3 and Mixtral releases: each `config.json` as
//! published, at one or two of its layers and a 512-token vocabulary (the full vocabularies and
//! expert sets would allocate gigabytes of random weights), loads and runs under the
//! architecture that serves it.

use crate::common::{copy_fixture, load, load_fixture, max_diff, random_run};
use crate::common::{floats, read_tensors, write_tensors};
use hookscope::Interventions;

/// `Qwen/Qwen3-30B-A3B`, at 1 of its 48 layers and 16 of its 128 experts.
const QWEN3_30B_A3B: &str = r#"{
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
  "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
  "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 16,
  "num_experts_per_tok": 8, "num_hidden_layers": 1, "num_key_value_heads": 4,
  "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null,
  "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 512
}"#;

/// `EleutherAI/pythia-70m-deduped`, at 2 of its 6 layers.
const PYTHIA_70M: &str = r#"{
  "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0,
  "hidden_act": "gelu", "hidden_size": 512, "initializer_range": 0.02,
  "intermediate_size": 2048, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
  "model_type": "gpt_neox", "num_attention_heads": 8, "num_hidden_layers": 2,
  "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": false,
  "torch_dtype": "float16", "use_cache": true, "use_parallel_residual": true, "vocab_size": 512
}"#;

/// `EleutherAI/pythia-1.4b`, at 1 of its 24 layers.
const PYTHIA_1_4B: &str = r#"{
  "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0,
  "hidden_act": "gelu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 8192, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
  "model_type": "gpt_neox", "num_attention_heads": 16, "num_hidden_layers": 1,
  "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": false,
  "torch_dtype": "float16", "use_cache": true, "use_parallel_residual": true, "vocab_size": 512
}"#;

/// `allenai/OLMo-2-0425-1B`, at 2 of its 16 layers.
const OLMO_2_1B: &str = r#"{
  "architectures": ["Olmo2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 4096,
  "model_type": "olmo2", "num_attention_heads": 16, "num_hidden_layers": 2,
  "num_key_value_heads": 16, "pad_token_id": 100277, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 500000, "tie_word_embeddings": false,
  "torch_dtype": "float32", "use_cache": true, "vocab_size": 512
}"#;

/// `microsoft/Phi-3-mini-4k-instruct`, at 1 of its 32 layers.
const PHI_3_MINI_4K: &str = r#"{
  "architectures": ["Phi3ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072,
  "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 4096,
  "model_type": "phi3", "num_attention_heads": 32, "num_hidden_layers": 1,
  "num_key_value_heads": 32, "original_max_position_embeddings": 4096, "pad_token_id": 32000,
  "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
  "sliding_window": 2047, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "use_cache": true, "vocab_size": 512
}"#;

/// `microsoft/Phi-3.5-mini-instruct`, at 1 of its 32 layers: LongRoPE over a 4096-token
/// pretraining context extended to 131072. (Its 48 short and 48 long factors are written here as
/// numbers of the same shape and range, not the release's own.)
const PHI_3_5_MINI: &str = r#"{
  "architectures": ["Phi3ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072,
  "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072,
  "model_type": "phi3", "num_attention_heads": 32, "num_hidden_layers": 1,
  "num_key_value_heads": 32, "original_max_position_embeddings": 4096, "pad_token_id": 32000,
  "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "long_factor": [1.0489, 2.0887, 3.2266, 3.9211, 4.9404, 5.6299, 6.6915, 7.4096, 8.5929, 9.5067, 10.009, 11.2326, 11.8473, 13.1746, 13.6878, 14.5644, 15.8463, 16.6073, 17.2054, 18.333, 19.4145, 19.9826, 21.1763, 21.8461, 22.821, 23.6978, 24.4268, 25.4949, 26.4611, 27.4094, 28.2699, 28.9849, 30.1028, 30.845, 32.05, 32.5491, 33.7883, 34.3427, 35.4815, 36.2756, 37.2298, 38.2437, 39.199, 39.7018, 41.042, 41.8258, 42.4516, 43.6482],
    "short_factor": [1.011, 1.065, 1.1149, 1.1673, 1.2057, 1.2693, 1.3113, 1.3649, 1.4151, 1.4686, 1.5055, 1.5573, 1.6143, 1.6617, 1.715, 1.7573, 1.8191, 1.8502, 1.9144, 1.9575, 2.0005, 2.0635, 2.101, 2.1547, 2.2065, 2.2531, 2.3033, 2.3515, 2.4169, 2.4517, 2.5032, 2.5515, 2.6182, 2.6609, 2.7164, 2.7694, 2.8099, 2.8579, 2.9078, 2.9553, 3.0119, 3.0693, 3.1101, 3.1651, 3.2178, 3.2666, 3.3134, 3.361],
    "type": "longrope"
  },
  "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 512
}"#;

/// `mistralai/Mixtral-8x7B-v0.1`, at 1 of its 32 layers and 2 of its 8 experts, each 1024 wide
/// instead of 14336.
const MIXTRAL_8X7B: &str = r#"{
  "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 1024, "max_position_embeddings": 32768, "model_type": "mixtral",
  "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 1,
  "num_key_value_heads": 8, "num_local_experts": 2, "output_router_logits": false,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "use_cache": true, "vocab_size": 512
}"#;

#[test]
fn released_decoder_configs_load_and_run() {
    // (config, architecture, key/value heads, head size)
    let cases = [
        (QWEN3_30B_A3B, "mixtral", 4, 128),
        (PYTHIA_70M, "gpt_neox", 8, 64),
        (PYTHIA_1_4B, "gpt_neox", 16, 128),
        (OLMO_2_1B, "olmo2", 16, 128),
        (PHI_3_MINI_4K, "phi3", 32, 96),
        (PHI_3_5_MINI, "phi3", 32, 96),
        (MIXTRAL_8X7B, "mixtral", 8, 128),
    ];
    for (config, arch, kv_heads, head_dim) in cases {
        let (model, keys) = random_run(config);
        assert_eq!(model.architecture().name, arch);
        assert_eq!(keys, [1, kv_heads, 3, head_dim], "{arch}");
    }
}

#[test]
fn longrope_factors_must_cover_the_rotated_pairs() {
    // Phi-3.5 with one short factor too few: refused, naming the key and the lengths.
    let mut config: serde_json::Value = serde_json::from_str(PHI_3_5_MINI).unwrap();
    let factors = config["rope_scaling"]["short_factor"]
        .as_array_mut()
        .unwrap();
    factors.pop();
    let device = hookscope_conformance::test_device();
    let error = hookscope::Model::random_from_config(&config.to_string(), 5, &device)
        .map(|_| ())
        .expect_err("a short factor list is refused");
    let message = error.to_string();
    assert!(
        message.contains("short_factor field must have length 48, got 47"),
        "{message}"
    );
}

/// Rewrites a per-expert Mixtral checkpoint (the hub's `block_sparse_moe.experts.{e}.w1/w3/w2`,
/// as transformers saves it) into transformers' in-memory layout: `mlp.gate`, fused
/// `mlp.experts.gate_up_proj` `[E, 2I, H]` (gate rows first) and `mlp.experts.down_proj`
/// `[E, H, I]`.
fn fuse_mixtral_experts(dir: &std::path::Path, layers: usize, experts: usize) {
    let path = dir.join("model.safetensors");
    let mut tensors = read_tensors(&path);
    for layer in 0..layers {
        let old = format!("model.layers.{layer}.block_sparse_moe");
        let new = format!("model.layers.{layer}.mlp");
        let gate = tensors.remove(&format!("{old}.gate.weight")).unwrap();
        tensors.insert(format!("{new}.gate.weight"), gate);
        let mut take = |e: usize, w: &str| {
            tensors
                .remove(&format!("{old}.experts.{e}.{w}.weight"))
                .unwrap()
        };
        let (mut gate_up, mut down) = (Vec::new(), Vec::new());
        let (mut inner, mut hidden) = (0, 0);
        for e in 0..experts {
            let (dtype, shape, w1) = take(e, "w1");
            let (_, _, w3) = take(e, "w3");
            let (_, _, w2) = take(e, "w2");
            assert_eq!(dtype, safetensors::Dtype::F32);
            (inner, hidden) = (shape[0], shape[1]);
            gate_up.extend(w1);
            gate_up.extend(w3);
            down.extend(w2);
        }
        let dtype = safetensors::Dtype::F32;
        tensors.insert(
            format!("{new}.experts.gate_up_proj"),
            (dtype, vec![experts, 2 * inner, hidden], gate_up),
        );
        tensors.insert(
            format!("{new}.experts.down_proj"),
            (dtype, vec![experts, hidden, inner], down),
        );
    }
    write_tensors(&path, &tensors);
}

#[test]
fn mixtral_experts_load_from_either_layout() {
    let dir = copy_fixture("mixtral-top2");
    fuse_mixtral_experts(dir.path(), 2, 4);
    let stored = read_tensors(&dir.path().join("model.safetensors"));
    assert!(stored.contains_key("model.layers.1.mlp.experts.gate_up_proj"));
    assert!(!stored.keys().any(|k| k.contains("block_sparse_moe")));
    let (hub, fused) = (load_fixture("mixtral-top2"), load(dir.path()).unwrap());
    assert!(
        fused.load_report().unused.is_empty(),
        "{:?}",
        fused.load_report().unused
    );
    let prompt = vec![vec![3, 14, 15, 92, 65, 35]];
    let logits = |model: &hookscope::Model| {
        let trace = model
            .trace(&model.batch(prompt.clone()).unwrap(), &Interventions::new())
            .unwrap();
        floats(trace.logits().unwrap().to_data())
    };
    assert_eq!(max_diff(&logits(&hub), &logits(&fused)), 0.0);
}

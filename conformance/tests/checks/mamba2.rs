//! Mamba-2 and Bamba beyond parity: the configs of released checkpoints load (random weights,
//! reduced depth), and a hybrid declares and serves each layer's own mixer.

use crate::common::load_fixture;
use hookscope::{Error, Interventions, LayerSite, MixerKind, MixerSite, Model, Site, Steps};

/// `config.json` of `mamba2-130m` converted to transformers' format, as older transformers
/// wrote it (a bare `Infinity`), at 2 of its 24 layers.
const MAMBA2_130M: &str = r#"{
  "architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "bos_token_id": 0,
  "chunk_size": 256, "conv_kernel": 4, "eos_token_id": 0, "expand": 2, "head_dim": 64,
  "hidden_act": "silu", "hidden_size": 768, "initializer_range": 0.1, "layer_norm_epsilon": 1e-05,
  "n_groups": 1, "num_heads": 24, "num_hidden_layers": 2, "pad_token_id": 0,
  "rescale_prenorm_residual": false, "residual_in_fp32": true, "rms_norm": true,
  "state_size": 128, "tie_word_embeddings": true, "time_step_floor": 0.0001,
  "time_step_limit": [0.0, Infinity], "time_step_max": 0.1, "time_step_min": 0.001,
  "time_step_rank": 256, "use_bias": false, "use_cache": true, "use_conv_bias": true,
  "vocab_size": 50288
}"#;

/// `config.json` of Mamba-Codestral-7B (8 groups, head dim 64, untied head) at 1 of its 64
/// layers and a 512-token vocabulary (its 32768 would make the test allocate 1 GB of embeddings);
/// every mixer size is the checkpoint's. transformers ignores `norm_before_gate` (it always
/// gates first), and so does hookscope.
const CODESTRAL: &str = r#"{
  "architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "bos_token_id": 0,
  "chunk_size": 256, "conv_kernel": 4, "eos_token_id": 0, "expand": 2, "head_dim": 64,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.1, "intermediate_size": 8192,
  "layer_norm_epsilon": 1e-05, "model_type": "mamba2", "n_groups": 8, "norm_before_gate": true,
  "num_heads": 128, "num_hidden_layers": 1, "pad_token_id": 0, "rescale_prenorm_residual": false,
  "residual_in_fp32": true, "rms_norm": true, "state_size": 128, "tie_word_embeddings": false,
  "time_step_floor": 0.0001, "time_step_limit": [0.0, {"__float__": "Infinity"}],
  "time_step_max": 0.1, "time_step_min": 0.001, "time_step_rank": 256, "torch_dtype": "bfloat16",
  "use_bias": false, "use_cache": true, "use_conv_bias": true, "vocab_size": 512
}"#;

fn state_site(layer: usize, site: MixerSite) -> Site {
    Site::self_attn(layer, site)
}

/// Loads `config` with random weights, runs a 3-token trace, and returns the model and the
/// shapes of layer 0's state and head outputs.
fn trace_shapes(config: &str) -> (Model, Vec<usize>, Vec<usize>) {
    let model =
        Model::random_from_config(config, 3, &hookscope_conformance::test_device()).unwrap();
    let state = state_site(0, MixerSite::StateOutput);
    let heads = state_site(0, MixerSite::AttentionHeadOutputs);
    let reads = Interventions::new()
        .save(state, Steps::At(0))
        .save(heads, Steps::At(0));
    let trace = model
        .trace(&model.batch(vec![vec![1, 2, 3]]).unwrap(), &reads)
        .unwrap();
    let shape = |site| trace.saved.get(site, 0).unwrap().shape();
    let (state, heads) = (shape(state), shape(heads));
    (model, state, heads)
}

#[test]
fn released_mamba2_configs_load_and_run() {
    let (model, state, heads) = trace_shapes(MAMBA2_130M);
    assert_eq!(
        model.layout().layers[0].mixer,
        MixerKind::Mamba2 {
            heads: 24,
            head_dim: 64,
            state: 128
        }
    );
    assert_eq!((state, heads), (vec![1, 24, 64, 128], vec![1, 3, 24, 64]));

    let (model, state, heads) = trace_shapes(CODESTRAL);
    assert_eq!(model.layout().layers.len(), 1);
    assert_eq!((state, heads), (vec![1, 128, 64, 128], vec![1, 3, 128, 64]));
}

#[test]
fn inconsistent_mamba2_sizes_are_refused_with_the_reason() {
    let wrong = MAMBA2_130M.replace(r#""num_heads": 24"#, r#""num_heads": 20"#);
    let error =
        Model::random_from_config(&wrong, 3, &hookscope_conformance::test_device()).unwrap_err();
    assert!(matches!(error, Error::UnsupportedConfig { .. }), "{error}");
    assert!(error.to_string().contains("heads 20"), "{error}");
    let groups = MAMBA2_130M.replace(r#""n_groups": 1"#, r#""n_groups": 5"#);
    let error =
        Model::random_from_config(&groups, 3, &hookscope_conformance::test_device()).unwrap_err();
    assert!(error.to_string().contains("5 groups"), "{error}");
}

#[test]
fn bamba_declares_and_serves_each_layers_own_mixer() {
    let model = load_fixture("bamba-hybrid");
    let layers = &model.layout().layers;
    assert!(matches!(layers[0].mixer, MixerKind::Mamba2 { .. }));
    assert!(matches!(
        layers[1].mixer,
        MixerKind::SoftmaxAttention { .. }
    ));
    assert!(layers.iter().all(|layer| layer.has_mlp()));
    let attention_state = model.layout().resolve("layers.1.self_attn.state_input");
    assert!(
        attention_state
            .unwrap_err()
            .to_string()
            .contains("softmax attention"),
    );
    let mamba_keys = model.layout().resolve("layers.0.self_attn.attention_keys");
    assert!(mamba_keys.unwrap_err().to_string().contains("Mamba-2"));
    // One generation carries both kinds of state: the attention layer's cache grows and the
    // Mamba-2 layers' state is handed on.
    let keys = state_site(1, MixerSite::AttentionKeys);
    let (input, output) = (
        state_site(2, MixerSite::StateInput),
        state_site(2, MixerSite::StateOutput),
    );
    let reads = Interventions::new()
        .save(keys, Steps::All)
        .save(input, Steps::All)
        .save(output, Steps::All)
        .save(Site::layer(2, LayerSite::MlpOutput), Steps::All);
    let mut config = model.generation_config().clone();
    config.max_new_tokens = 3;
    config.eos_token_ids.clear();
    let run = model
        .generate(
            &model.batch(vec![vec![4, 8, 15, 16, 23]]).unwrap(),
            &reads,
            &config,
        )
        .unwrap();
    assert_eq!(run.saved.get(keys, 2).unwrap().shape()[2], 7);
    assert_eq!(
        run.saved.get(input, 2).unwrap().to_data(),
        run.saved.get(output, 1).unwrap().to_data()
    );
}

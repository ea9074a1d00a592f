//! Gated DeltaNet hybrids beyond parity: released configurations load (random weights, reduced
//! size), a multimodal checkpoint's language model loads with a note, and state writes reach
//! what they should.

use crate::common::{load_fixture, max_diff, values};
use hookscope::{Decoding, Interventions, LayerSite, MixerKind, MixerSite, Model, Site, Steps};

fn linear(layer: usize, site: MixerSite) -> Site {
    Site::layer(
        layer,
        LayerSite::Mixer(hookscope::schema::MixerNamespace::LinearAttn, site),
    )
}

/// Qwen3-Next-80B-A3B's `config.json` with its head geometry (16 key / 32 value heads of 128,
/// 16 query / 2 key-value heads of 256, a quarter rotated, every fourth layer attention), at 4 of
/// its 48 layers, 8 of its 512 experts (top 2 of them, not 10) and a 512-token vocabulary: the
/// full expert count and vocabulary would allocate several GB.
const QWEN3_NEXT_80B: &str = r#"{
  "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
  "hidden_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 16,
  "num_key_value_heads": 2, "head_dim": 256, "intermediate_size": 5120,
  "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
  "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
  "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 512,
  "shared_expert_intermediate_size": 512, "norm_topk_prob": true, "decoder_sparse_step": 1,
  "mlp_only_layers": [], "rms_norm_eps": 1e-06, "rope_theta": 10000000,
  "partial_rotary_factor": 0.25, "hidden_act": "silu", "tie_word_embeddings": false,
  "vocab_size": 512, "max_position_embeddings": 262144
}"#;

/// Qwen3.5-0.8B as released (`Qwen3_5ForConditionalGeneration`: the text model under
/// `text_config`, both tying flags set, 16 key and 16 value heads), at 4 of 24 layers and a
/// 512-token vocabulary.
const QWEN3_5_0_8B: &str = r#"{
  "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
  "tie_word_embeddings": true, "image_token_id": 248056, "video_token_id": 248057,
  "vision_config": {"depth": 12, "hidden_size": 768},
  "text_config": {
    "model_type": "qwen3_5_text", "hidden_size": 1024, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
    "intermediate_size": 3584, "linear_num_key_heads": 16, "linear_num_value_heads": 16,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "rms_norm_eps": 1e-06, "hidden_act": "silu", "tie_word_embeddings": true,
    "vocab_size": 512, "attn_output_gate": true, "mtp_num_hidden_layers": 1,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
      "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10], "mrope_interleaved": true}
  }
}"#;

fn run_three_tokens(model: &Model) -> Vec<usize> {
    let state = linear(0, MixerSite::StateOutput);
    let trace = model
        .trace(
            &model.batch(vec![vec![1, 2, 3]]).unwrap(),
            &Interventions::new().save(state, Steps::At(0)),
        )
        .unwrap();
    trace.saved.get(state, 0).unwrap().shape()
}

#[test]
fn released_configs_load_and_run() {
    let next = Model::random_from_config(QWEN3_NEXT_80B, 5, &hookscope_conformance::test_device())
        .unwrap();
    let kinds: Vec<bool> = next
        .layout()
        .layers
        .iter()
        .map(|l| matches!(l.mixer, MixerKind::SoftmaxAttention { .. }))
        .collect();
    assert_eq!(kinds, [false, false, false, true]);
    assert_eq!(run_three_tokens(&next), [1, 32, 128, 128]);

    let small =
        Model::random_from_config(QWEN3_5_0_8B, 5, &hookscope_conformance::test_device()).unwrap();
    assert_eq!(small.architecture().name, "qwen3_5");
    assert!(
        small
            .load_report()
            .notes
            .iter()
            .any(|note| note.contains("vision tower is ignored")),
        "{:?}",
        small.load_report().notes
    );
    assert_eq!(run_three_tokens(&small), [1, 16, 128, 128]);
}

#[test]
fn deltanet_state_writes_reach_the_next_step_and_a_decode_steps_output() {
    let model = load_fixture("qwen3.5-dense");
    let batch = model.batch(vec![vec![5, 17, 33, 2, 8]]).unwrap();
    let heads = linear(0, MixerSite::AttentionHeadOutputs);
    let (input, output) = (
        linear(0, MixerSite::StateInput),
        linear(0, MixerSite::StateOutput),
    );
    let reads = Interventions::new()
        .save(heads, Steps::All)
        .save(input, Steps::All)
        .save(output, Steps::All);
    let mut config = model.generation_config().clone();
    config.decoding = Decoding::Greedy;
    config.max_new_tokens = 3;
    config.eos_token_ids.clear();
    let plain = model.generate(&batch, &reads, &config).unwrap();
    for step in 1..3 {
        assert_eq!(
            plain.saved.get(input, step).unwrap().to_data(),
            plain.saved.get(output, step - 1).unwrap().to_data(),
            "state_input@{step} is state_output@{}",
            step - 1
        );
    }
    let zeroed = model
        .generate(&batch, &reads.clone().zero(output, Steps::At(1)), &config)
        .unwrap();
    assert!(
        values(zeroed.saved.get(input, 2).unwrap())
            .iter()
            .all(|x| *x == 0.0)
    );
    let a = values(plain.saved.get(heads, 1).unwrap());
    let b = values(zeroed.saved.get(heads, 1).unwrap());
    assert!(
        max_diff(&a, &b) > 1e-6,
        "a decode step reads its written state"
    );
    assert_eq!(
        plain.saved.get(heads, 0).unwrap().to_data(),
        zeroed.saved.get(heads, 0).unwrap().to_data()
    );
}

/// Official Qwen3.5-MoE checkpoints store each layer's experts fused (`experts.gate_up_proj`
/// `[E, 2I, H]`, gate rows first, and `experts.down_proj` `[E, H, I]`); transformers saves them
/// per expert. The same weights in the fused form give the same numbers.
#[test]
fn fused_expert_tensors_load_like_per_expert_ones() {
    let dir = crate::common::copy_fixture("qwen3.5-moe");
    let path = dir.path().join("model.safetensors");
    let mut tensors = crate::common::read_tensors(&path);
    let experts = |tensors: &crate::common::RawTensors, layer: &str| {
        let prefix = format!("{layer}.mlp.experts.");
        let mut ids: Vec<usize> = tensors
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix)?.split('.').next()?.parse().ok())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    };
    let layers: Vec<String> = tensors
        .keys()
        .filter(|k| k.ends_with(".mlp.gate.weight"))
        .map(|k| k.trim_end_matches(".mlp.gate.weight").to_string())
        .collect();
    assert!(!layers.is_empty());
    for layer in layers {
        let ids = experts(&tensors, &layer);
        let mut take = |e: usize, part: &str| {
            tensors
                .remove(&format!("{layer}.mlp.experts.{e}.{part}.weight"))
                .unwrap()
        };
        let (mut gate_up, mut down) = (Vec::new(), Vec::new());
        let (mut inner, mut hidden, mut dtype) = (0, 0, None);
        for &e in &ids {
            let (gate_dtype, gate_shape, gate) = take(e, "gate_proj");
            let (_, _, up) = take(e, "up_proj");
            let (_, _, d) = take(e, "down_proj");
            (inner, hidden, dtype) = (gate_shape[0], gate_shape[1], Some(gate_dtype));
            gate_up.extend(gate);
            gate_up.extend(up);
            down.extend(d);
        }
        let dtype = dtype.unwrap();
        tensors.insert(
            format!("{layer}.mlp.experts.gate_up_proj"),
            (dtype, vec![ids.len(), 2 * inner, hidden], gate_up),
        );
        tensors.insert(
            format!("{layer}.mlp.experts.down_proj"),
            (dtype, vec![ids.len(), hidden, inner], down),
        );
    }
    crate::common::write_tensors(&path, &tensors);
    let model = crate::common::load(dir.path()).unwrap();
    assert!(
        model.load_report().unused.is_empty(),
        "{:?}",
        model.load_report().unused
    );
    let report = hookscope_conformance::parity::check_prompt_call(
        dir.path(),
        &hookscope_conformance::test_device(),
        1e-4,
        hookscope_conformance::parity::all_sites,
    )
    .unwrap();
    assert!(
        report.mismatches.is_empty(),
        "{}",
        report.mismatches.join("\n")
    );
    assert!(report.matched.iter().any(|k| k.contains("mlp_output")));
}

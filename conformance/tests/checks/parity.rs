//! hookscope against `transformers` on the committed fixtures: every site at the prompt call.

use hookscope_conformance::fixture::fixtures_of;
use hookscope_conformance::parity::{
    all_sites, check_generation, check_prompt_call, without_attention_pattern,
};
use hookscope_conformance::{fixtures_dir, test_device};

const TOLERANCE: f64 = 1e-4;

/// Every site matches; only `unreferenced` sites lack a reference value.
fn assert_parity(fixture: &str, unreferenced: &[&str]) {
    let report = check_prompt_call(
        &fixtures_dir().join(fixture),
        &test_device(),
        TOLERANCE,
        all_sites,
    )
    .unwrap();
    assert!(
        report.mismatches.is_empty(),
        "{fixture}: {} mismatches:\n{}",
        report.mismatches.len(),
        report.mismatches.join("\n")
    );
    assert!(!report.matched.is_empty());
    assert_eq!(report.unreferenced, unreferenced, "{fixture}");
}

#[test]
fn gpt2_tied_matches_transformers_at_every_site() {
    assert_parity("gpt2-tied", &[]);
}

#[test]
fn gpt2_untied_without_prefix_matches_transformers_at_every_site() {
    assert_parity("gpt2-untied-bare", &[]);
}

#[test]
fn float16_gpt2_with_the_real_vocabulary_matches_transformers() {
    // The vocabulary-sized logits are referenced through next_token_probs.
    assert_parity("gpt2-tiny", &["prompt0/logits@0"]);
}

/// No scores or probabilities observed: attention runs a fused kernel (the CPU's own, or
/// burn's where scores are soft-capped), windowed and capped as the explicit path is.
#[test]
fn fused_attention_path_gives_the_same_numbers() {
    for fixture in [
        "gpt2-tied",
        "mistral-window",
        "gemma2-window-softcap",
        "gemma3-text-window",
    ] {
        let report = check_prompt_call(
            &fixtures_dir().join(fixture),
            &test_device(),
            TOLERANCE,
            without_attention_pattern,
        )
        .unwrap();
        assert!(
            report.mismatches.is_empty(),
            "{fixture}: {}",
            report.mismatches.join("\n")
        );
        assert!(
            report
                .matched
                .iter()
                .any(|key| key.ends_with("attention_head_outputs@0"))
        );
        assert!(
            !report
                .matched
                .iter()
                .any(|key| key.contains("attention_probabilities"))
        );
    }
}

fn assert_generation_parity(fixture: &str, unreferenced: impl Fn(&str) -> bool) {
    let report =
        check_generation(&fixtures_dir().join(fixture), &test_device(), TOLERANCE).unwrap();
    assert!(
        report.mismatches.is_empty(),
        "{fixture}: {} mismatches:\n{}",
        report.mismatches.len(),
        report.mismatches.join("\n")
    );
    assert!(
        report
            .matched
            .iter()
            .any(|key| key.ends_with("/output_ids"))
    );
    assert!(report.matched.iter().any(|key| key.starts_with("zero0/")));
    // The run saving only the outputs (attention's fused paths) was compared too.
    assert!(
        report
            .matched
            .iter()
            .any(|key| key.contains("/output_ids (only the outputs saved)"))
    );
    let unexpected: Vec<&String> = report
        .unreferenced
        .iter()
        .filter(|k| !unreferenced(k))
        .collect();
    assert!(
        unexpected.is_empty(),
        "{fixture}: no reference for {unexpected:?}"
    );
}

#[test]
fn gpt2_greedy_generation_matches_transformers_at_every_step() {
    assert_generation_parity("gpt2-tied", |_| false);
    assert_generation_parity("gpt2-untied-bare", |_| false);
}

#[test]
fn embedded_model_generation_and_intervention_match_transformers() {
    // Vocabulary-sized values are referenced at step 0 only (next_token_probs).
    assert_generation_parity("gpt2-tiny", |key| {
        key.contains("/logits@") || (key.contains("/next_token_probs@") && !key.ends_with("@0"))
    });
}

/// The Llama family (Llama, Qwen2).
const LLAMA: [&str; 1] = ["llama"];

#[test]
fn llama_family_matches_transformers_at_every_site() {
    for fixture in fixtures_of(&LLAMA) {
        assert_parity(&fixture.name, &[]);
    }
}

#[test]
fn llama_family_generation_matches_transformers_at_every_step() {
    for fixture in fixtures_of(&LLAMA) {
        assert_generation_parity(&fixture.name, |_| false);
    }
}

const MAMBA: [&str; 1] = ["mamba"];

#[test]
fn mamba_matches_transformers_at_every_site() {
    for fixture in fixtures_of(&MAMBA) {
        assert_parity(&fixture.name, &[]);
    }
}

#[test]
fn mamba_generation_matches_transformers_at_every_step() {
    for fixture in fixtures_of(&MAMBA) {
        assert_generation_parity(&fixture.name, |_| false);
    }
}

/// Mamba-2 and its attention hybrid, Bamba.
const MAMBA2: [&str; 2] = ["mamba2", "bamba"];

#[test]
fn mamba2_and_bamba_match_transformers_at_every_site() {
    for fixture in fixtures_of(&MAMBA2) {
        assert_parity(&fixture.name, &[]);
    }
}

#[test]
fn mamba2_and_bamba_generation_match_transformers_at_every_step() {
    for fixture in fixtures_of(&MAMBA2) {
        assert_generation_parity(&fixture.name, |_| false);
    }
}

/// The Gated DeltaNet hybrids.
const DELTANET: [&str; 3] = ["qwen3_next", "qwen3_5", "qwen3_5_moe"];

#[test]
fn deltanet_hybrids_match_transformers_at_every_site() {
    for fixture in fixtures_of(&DELTANET) {
        assert_parity(&fixture.name, &[]);
    }
}

#[test]
fn deltanet_hybrid_generation_matches_transformers_at_every_step() {
    for fixture in fixtures_of(&DELTANET) {
        assert_generation_parity(&fixture.name, |_| false);
    }
}

/// The decoders built on the shared layers since: GPT-NeoX, the mixtures of experts (Mixtral,
/// Qwen2-MoE, Qwen3-MoE), OLMo-2 and Phi-3.
const DECODERS: [&str; 4] = ["gpt_neox", "mixtral", "olmo2", "phi3"];

#[test]
fn decoders_match_transformers_at_every_site() {
    for fixture in fixtures_of(&DECODERS) {
        assert_parity(&fixture.name, &[]);
    }
}

#[test]
fn decoder_generation_matches_transformers_at_every_step() {
    for fixture in fixtures_of(&DECODERS) {
        assert_generation_parity(&fixture.name, |_| false);
    }
}

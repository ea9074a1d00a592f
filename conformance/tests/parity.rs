//! hookscope against `transformers` on the committed fixtures: every site at the prompt call.

use hookscope_conformance::fixtures_dir;
use hookscope_conformance::parity::{all_sites, check_prompt_call, without_attention_pattern};

const TOLERANCE: f64 = 1e-4;

/// Every site matches; only `unreferenced` sites lack a reference value.
fn assert_parity(fixture: &str, unreferenced: &[&str]) {
    let report = check_prompt_call(&fixtures_dir().join(fixture), TOLERANCE, all_sites).unwrap();
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
fn embedded_default_model_matches_transformers() {
    // float16 weights; the vocabulary-sized logits are referenced through next_token_probs.
    assert_parity("gpt2-tiny", &["prompt0/logits@0"]);
}

#[test]
fn fused_attention_path_gives_the_same_numbers() {
    // No scores or probabilities observed: attention runs burn's fused kernel.
    let report = check_prompt_call(
        &fixtures_dir().join("gpt2-tied"),
        TOLERANCE,
        without_attention_pattern,
    )
    .unwrap();
    assert!(
        report.mismatches.is_empty(),
        "{}",
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

//! Edits and the logit lens against `transformers` with the same edit made by a torch hook
//! (`conformance/scripts/make_edit_fixtures.py`): steering (`--add`), patching part of a value
//! from a stored tensor (`--set` with an index), zeroing part of a value, head ablation, and
//! the lens probabilities, on GPT-2, Llama, Mamba and a Gated DeltaNet hybrid. Each case is
//! given in the CLI's own syntax and parsed by the library parser the CLI uses.

use std::path::Path;

use crate::common::{f32_tensors, floats, greedy_run, load, max_diff};
use hookscope::hooks::RequestSpecs;
use hookscope_conformance::{Fixture, fixtures};
use serde_json::Value;

const TOLERANCE: f32 = 1e-4;
/// The fixtures `make_edit_fixtures.py` wrote edit references for.
fn edit_fixtures() -> Vec<Fixture> {
    let found: Vec<Fixture> = fixtures()
        .into_iter()
        .filter(|fixture| fixture.has("edits.safetensors"))
        .collect();
    assert!(!found.is_empty(), "no fixture holds edits.safetensors");
    found
}

/// A fixture's `edits.json` and the prompt its cases run on.
fn cases(dir: &Path) -> (Value, Vec<u32>) {
    let meta: Value =
        serde_json::from_slice(&std::fs::read(dir.join("edits.json")).unwrap()).unwrap();
    let prompt = meta["prompt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    (meta, prompt)
}

fn strings(case: &Value, key: &str, dir: &Path) -> Vec<String> {
    case[key]
        .as_array()
        .map(|specs| {
            specs
                .iter()
                .map(|s| {
                    s.as_str()
                        .unwrap()
                        .replace("{dir}", &dir.display().to_string())
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn edits_match_transformers_with_torch_hooks() {
    for Fixture { name, dir, .. } in edit_fixtures() {
        let (meta, prompt) = cases(&dir);
        let reference = f32_tensors(&dir.join("edits.safetensors"));
        let model = load(&dir).unwrap();
        let new_tokens = meta["new_tokens"].as_u64().unwrap() as usize;
        let (_, plain) = greedy_run(&model, &prompt, &RequestSpecs::default(), new_tokens);
        for case in meta["cases"].as_array().unwrap() {
            let case_name = case["name"].as_str().unwrap();
            let specs = RequestSpecs {
                save: Vec::new(),
                zero: strings(case, "zero", &dir),
                add: strings(case, "add", &dir),
                set: strings(case, "set", &dir),
                ..Default::default()
            };
            let (ids, logits) = greedy_run(&model, &prompt, &specs, new_tokens);
            let (_, expected_ids) = &reference[&format!("{case_name}/output_ids")];
            let (_, expected) = &reference[&format!("{case_name}/logits")];
            assert_eq!(&ids, expected_ids, "{name} {case_name}: greedy tokens");
            let diff = max_diff(&logits, expected);
            assert!(
                diff < TOLERANCE,
                "{name} {case_name}: logits differ by {diff}"
            );
            // The edit must matter, or the comparison shows nothing.
            let effect = max_diff(&logits, &plain);
            assert!(
                effect > 1e-3,
                "{name} {case_name}: the edit changed nothing"
            );
        }
    }
}

#[test]
fn the_logit_lens_matches_transformers() {
    for Fixture { name, dir, .. } in edit_fixtures() {
        let (_, prompt) = cases(&dir);
        let (shape, expected) = &f32_tensors(&dir.join("edits.safetensors"))["lens"];
        let model = load(&dir).unwrap();
        let batch = model.batch(vec![prompt]).unwrap();
        let lens =
            hookscope::analysis::logit_lens(&model, &batch, &hookscope::Interventions::new())
                .unwrap();
        assert_eq!(lens.layers(), shape[0], "{name}: layers");
        let mut got = Vec::new();
        for layer in 0..lens.layers() {
            got.extend(floats(lens.probabilities(layer).unwrap().into_data()));
        }
        let diff = max_diff(&got, expected);
        assert!(
            diff < TOLERANCE,
            "{name}: lens probabilities differ by {diff}"
        );
        // At the last layer the lens is the model's own distribution.
        let trace = model
            .trace(&batch, &hookscope::Interventions::new())
            .unwrap();
        let probs =
            hookscope::burn::tensor::activation::softmax(trace.logits().unwrap().clone(), 2);
        let last = floats(lens.probabilities(lens.layers() - 1).unwrap().into_data());
        assert!(max_diff(&last, &floats(probs.into_data())) < 1e-5, "{name}");
    }
}

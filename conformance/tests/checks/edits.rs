//! Edits and the logit lens against `transformers` with the same edit made by a torch hook
//! (`conformance/scripts/make_edit_fixtures.py`): steering (`--add`), patching part of a value
//! from a stored tensor (`--set` with an index), zeroing part of a value, head ablation, and
//! the lens probabilities, on GPT-2, Llama, Mamba and a Gated DeltaNet hybrid. Each case is
//! given in the CLI's own syntax and parsed by the library parser the CLI uses.

use std::path::Path;

use crate::common::{floats, load, max_diff, read_tensors};
use hookscope::hooks::RequestSpecs;
use hookscope::{Model, Site, Steps};
use hookscope_conformance::{Fixture, fixtures};
use safetensors::tensor::Dtype;
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

/// The reference tensors of a fixture's `edits.safetensors`: name → (shape, values as f32).
fn reference(dir: &Path) -> std::collections::BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    read_tensors(&dir.join("edits.safetensors"))
        .into_iter()
        .map(|(name, (dtype, shape, bytes))| {
            let values = match dtype {
                Dtype::F32 => bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
                Dtype::I64 => bytes
                    .chunks_exact(8)
                    .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as f32)
                    .collect(),
                other => panic!("{name}: unexpected dtype {other:?}"),
            };
            (name, (shape, values))
        })
        .collect()
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

/// Greedy generation with `specs` applied: the output ids and each step's last-position logits.
fn run(
    model: &Model,
    prompt: &[u32],
    specs: &RequestSpecs,
    new_tokens: usize,
) -> (Vec<f32>, Vec<f32>) {
    let mut specs = specs.clone();
    specs.save.push("logits".into());
    let interventions = specs
        .interventions(model.layout(), &Steps::All, true, model.device())
        .unwrap();
    let mut config = model.generation_config().clone();
    config.max_new_tokens = new_tokens;
    config.decoding = hookscope::Decoding::Greedy;
    config.eos_token_ids.clear();
    let batch = model.batch(vec![prompt.to_vec()]).unwrap();
    let generation = model.generate(&batch, &interventions, &config).unwrap();
    let ids = generation.output_ids[0]
        .iter()
        .map(|id| *id as f32)
        .collect();
    let mut logits = Vec::new();
    for step in 0..new_tokens {
        let value = generation.saved.get(Site::Logits, step).unwrap();
        let shape = value.shape();
        let all = floats(value.to_data());
        let vocab = shape[2];
        logits.extend_from_slice(&all[all.len() - vocab..]);
    }
    (ids, logits)
}

#[test]
fn edits_match_transformers_with_torch_hooks() {
    for Fixture { name, dir, .. } in edit_fixtures() {
        let (meta, prompt) = cases(&dir);
        let reference = reference(&dir);
        let model = load(&dir).unwrap();
        let new_tokens = meta["new_tokens"].as_u64().unwrap() as usize;
        let (_, plain) = run(&model, &prompt, &RequestSpecs::default(), new_tokens);
        for case in meta["cases"].as_array().unwrap() {
            let case_name = case["name"].as_str().unwrap();
            let specs = RequestSpecs {
                save: Vec::new(),
                zero: strings(case, "zero", &dir),
                add: strings(case, "add", &dir),
                set: strings(case, "set", &dir),
                ..Default::default()
            };
            let (ids, logits) = run(&model, &prompt, &specs, new_tokens);
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
        let (shape, expected) = &reference(&dir)["lens"];
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

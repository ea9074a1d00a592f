//! Weights stored in bf16 or f16: on every committed fixture, a model loaded that way computes
//! what an f32 model computes on the same weights rounded to that precision, at every site of a
//! greedy cached generation (prompt call and decode steps), and picks the same tokens.

mod common;

use std::path::Path;

use common::{RawTensors, max_diff, read_tensors, values, write_tensors};
use hookscope::{Decoding, Interventions, LoadOptions, Model, ModelSource, Steps, WeightDtype};
use hookscope_conformance::fixtures_dir;
use hookscope_conformance::reference::Reference;
use safetensors::tensor::Dtype;

/// Largest difference accepted, relative to a value's magnitude (at least 1).
const TOLERANCE: f32 = 1e-4;
/// Greedy steps after the prompt call.
const NEW_TOKENS: usize = 4;

fn load(dir: &Path, dtype: WeightDtype) -> Model {
    let options = LoadOptions { dtype: Some(dtype) };
    Model::load_with(
        &ModelSource::Directory(dir.to_path_buf()),
        &hookscope_conformance::test_device(),
        options,
    )
    .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// A copy of the fixture in `dir` whose floating-point weights are rounded to `dtype` and
/// stored as f32, and whether rounding changed any weight.
fn rounded_copy(dir: &Path, dtype: WeightDtype) -> (tempfile::TempDir, bool) {
    let mut changed = false;
    let copy = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "model.safetensors" {
            std::fs::copy(entry.path(), copy.path().join(entry.file_name())).unwrap();
        }
    }
    let tensors: RawTensors = read_tensors(&dir.join("model.safetensors"))
        .into_iter()
        .map(|(name, (stored, shape, bytes))| {
            let widened: Vec<f32> = match stored {
                Dtype::F32 => bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
                Dtype::F16 => bytes
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
                Dtype::BF16 => bytes
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
                _ => return (name, (stored, shape, bytes)),
            };
            changed |= widened.iter().any(|v| dtype.round(*v) != *v);
            let rounded = widened
                .iter()
                .flat_map(|v| dtype.round(*v).to_le_bytes())
                .collect();
            (name, (Dtype::F32, shape, rounded))
        })
        .collect();
    write_tensors(&copy.path().join("model.safetensors"), &tensors);
    (copy, changed)
}

/// Mismatches between the half-precision load and f32 on rounded weights, for one fixture.
fn mismatches(fixture: &Path, dtype: WeightDtype) -> Vec<String> {
    let name = fixture.file_name().unwrap().to_string_lossy();
    let (rounded, changed) = rounded_copy(fixture, dtype);
    let half = load(fixture, dtype);
    let full = load(rounded.path(), WeightDtype::F32);
    assert_eq!(half.dtype(), dtype);
    assert!(
        half.weight_bytes() < full.weight_bytes(),
        "{name}: not stored smaller"
    );
    let sites = half.layout().call_order();
    let all = sites.iter().fold(Interventions::new(), |acc, site| {
        acc.save(*site, Steps::All)
    });
    let mut config = half.generation_config().clone();
    config.decoding = Decoding::Greedy;
    config.max_new_tokens = NEW_TOKENS;
    config.eos_token_ids.clear();
    let prompt = Reference::open(fixture).unwrap().prompts.prompts[0].clone();
    let run = |model: &Model| {
        let batch = model.batch(vec![prompt.clone()]).unwrap();
        model.generate(&batch, &all, &config).unwrap()
    };
    let (got, expected) = (run(&half), run(&full));
    let mut problems = Vec::new();
    // Not vacuous: the unrounded weights give other values.
    let unrounded = run(&load(fixture, WeightDtype::F32));
    let logits = |generation: &hookscope::Generation| {
        values(generation.saved.get(hookscope::Site::Logits, 0).unwrap())
    };
    if changed && max_diff(&logits(&unrounded), &logits(&got)) == 0.0 {
        problems.push(format!("{name} {dtype}: weights were not rounded"));
    }
    if got.output_ids != expected.output_ids {
        problems.push(format!(
            "{name} {dtype}: tokens {:?} vs {:?}",
            got.output_ids, expected.output_ids
        ));
    }
    for step in 0..expected.steps {
        for site in &sites {
            let (Some(a), Some(b)) = (got.saved.get(*site, step), expected.saved.get(*site, step))
            else {
                continue;
            };
            let (a, b) = (values(a), values(b));
            let scale = b.iter().fold(1.0f32, |m, v| m.max(v.abs()));
            let diff = max_diff(&a, &b);
            if diff > TOLERANCE * scale {
                problems.push(format!(
                    "{name} {dtype}: {site}@{step}: max |diff| {diff:.3e}"
                ));
            }
        }
    }
    problems
}

#[test]
fn half_precision_weights_compute_what_f32_computes_on_the_rounded_weights() {
    let mut fixtures: Vec<_> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|dir| dir.join("reference.json").is_file())
        // Plugin architectures (GPT-NeoX) are checked where their plugin is loaded.
        .filter(|dir| {
            let config = ModelSource::Directory(dir.clone()).config().unwrap();
            hookscope::registry::find(&config).is_ok()
        })
        .collect();
    fixtures.sort();
    assert!(fixtures.len() >= 10, "fixtures missing");
    let problems: Vec<String> = fixtures
        .iter()
        .flat_map(|fixture| {
            [WeightDtype::Bf16, WeightDtype::F16]
                .into_iter()
                .flat_map(move |dtype| mismatches(fixture, dtype))
        })
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

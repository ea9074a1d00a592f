//! Weights stored in bf16 or f16: on every committed fixture, a model loaded that way computes
//! what an f32 model computes on the same weights rounded to that precision, at every site of a
//! greedy cached generation (prompt call and decode steps), and picks the same tokens.
//!
//! With bf16 products (activations rounded to bf16 entering each weight product), the logits
//! stay within a stated tolerance of the exact ones, and no further from them than
//! transformers' own bf16 run on the same weights (`reference-bf16.safetensors`).

use std::path::Path;

use crate::common::{RawTensors, max_diff, read_tensors, values, write_tensors};
use hookscope::{
    Decoding, Interventions, LoadOptions, MatmulPrecision, Model, ModelSource, Run, Site, Steps,
    WeightDtype,
};
use hookscope_conformance::fixtures_dir;
use hookscope_conformance::reference::Reference;
use safetensors::tensor::Dtype;

/// Largest difference accepted, relative to a value's magnitude (at least 1).
const TOLERANCE: f32 = 1e-4;
/// Greedy steps after the prompt call.
const NEW_TOKENS: usize = 4;

fn load(dir: &Path, dtype: WeightDtype) -> Model {
    load_with(dir, dtype, MatmulPrecision::F32)
}

fn load_with(dir: &Path, dtype: WeightDtype, matmul_precision: MatmulPrecision) -> Model {
    let options = LoadOptions {
        dtype: Some(dtype),
        matmul_precision,
    };
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
        if entry.file_name() != "model.safetensors" && entry.path().is_file() {
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

/// Every committed fixture of a built-in architecture.
fn builtin_fixtures() -> Vec<std::path::PathBuf> {
    let mut fixtures: Vec<_> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|dir| dir.join("reference.json").is_file())
        // Plugin architectures (GPT-J) are checked where their plugin is loaded.
        .filter(|dir| {
            let config = ModelSource::Directory(dir.clone()).config().unwrap();
            hookscope::registry::find(&config).is_ok()
        })
        .collect();
    fixtures.sort();
    assert!(fixtures.len() >= 10, "fixtures missing");
    fixtures
}

#[test]
fn half_precision_weights_compute_what_f32_computes_on_the_rounded_weights() {
    let problems: Vec<String> = builtin_fixtures()
        .iter()
        .flat_map(|fixture| {
            [WeightDtype::Bf16, WeightDtype::F16]
                .into_iter()
                .flat_map(move |dtype| mismatches(fixture, dtype))
        })
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Largest difference between bf16-product logits and exact ones, relative to the largest
/// exact logit. Dense fixtures stay below 1.4e-2; in the MoE fixtures a token whose router
/// scores are near a tie can go to another expert (transformers' bf16 run does the same), which
/// reaches 3.8e-2.
const BF16_PRODUCTS_TOLERANCE: f32 = 1.0 / 16.0;

/// The prompt call's logits for the fixture's first prompt, in a batch of `copies` of it (the
/// first copy's).
fn prompt_logits(model: &Model, fixture: &Path, copies: usize) -> Vec<f32> {
    let prompt = Reference::open(fixture).unwrap().prompts.prompts[0].clone();
    let batch = model.batch(vec![prompt; copies]).unwrap();
    let requests = Interventions::new().save(Site::Logits, Steps::All);
    let run = Run::new()
        .interventions(&requests)
        .stop_after_last_request();
    let saved = model.trace(&batch, run).unwrap().saved;
    let mut logits = values(saved.get(Site::Logits, 0).unwrap());
    logits.truncate(logits.len() / copies);
    logits
}

/// Root-mean-square difference.
fn rms_diff(a: &[f32], b: &[f32]) -> f64 {
    let sum: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    (sum / a.len().max(1) as f64).sqrt()
}

/// On every fixture: bf16 products change the logits (the kernel ran), by at most the stated
/// tolerance, and by no more (root mean square) than transformers' bf16 run differs from the
/// exact logits on the same weights (it rounds every activation, not only a product's input:
/// about twice hookscope's error on every fixture). The prompt alone (7-10 rows a product) and
/// in a batch of three copies (21-30 rows: AMX tiles, where the CPU has them, take products of
/// 16 rows or more).
#[test]
fn bf16_products_stay_closer_to_exact_logits_than_transformers_in_bf16() {
    let mut checked = 0;
    let mut problems = Vec::new();
    for fixture in builtin_fixtures() {
        let name = fixture.file_name().unwrap().to_string_lossy().to_string();
        let torch_bf16 = fixture.join("reference-bf16.safetensors");
        assert!(
            torch_bf16.is_file(),
            "{name}: no reference-bf16.safetensors (make_fixtures.py --bf16-references)"
        );
        let torch_bf16 = stored_values(&torch_bf16, "logits");
        let exact = prompt_logits(&load(&fixture, WeightDtype::Bf16), &fixture, 1);
        let model = load_with(&fixture, WeightDtype::Bf16, MatmulPrecision::Bf16);
        assert_eq!(model.load_report().matmul_precision, MatmulPrecision::Bf16);
        assert_eq!(torch_bf16.len(), exact.len(), "{name}: reference shape");
        let scale = exact.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        let theirs = rms_diff(&torch_bf16, &exact);
        for copies in [1, 3] {
            let fast = prompt_logits(&model, &fixture, copies);
            let largest = max_diff(&fast, &exact);
            let ours = rms_diff(&fast, &exact);
            eprintln!(
                "{name} x {copies}: bf16 products max {largest:.2e} (of {scale:.2}), rms \
                 {ours:.2e}; transformers bf16 rms {theirs:.2e}"
            );
            if largest == 0.0 {
                problems.push(format!("{name} x {copies}: bf16 products changed nothing"));
            }
            if largest > BF16_PRODUCTS_TOLERANCE * scale || ours > theirs {
                problems.push(format!(
                    "{name} x {copies}: bf16 products differ from exact by up to {largest:.3e} \
                     (tolerance {:.3e}), rms {ours:.3e}; transformers bf16 rms {theirs:.3e}",
                    BF16_PRODUCTS_TOLERANCE * scale
                ));
            }
        }
        checked += 1;
    }
    assert!(checked >= 10, "fixtures missing");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The tensor `key` of a safetensors file (bf16, or f32 where the model returns f32 logits, as
/// Mamba's does), as f32.
fn stored_values(path: &Path, key: &str) -> Vec<f32> {
    let (dtype, _, bytes) = read_tensors(path)
        .remove(key)
        .unwrap_or_else(|| panic!("{}: no `{key}`", path.display()));
    match dtype {
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        other => panic!("{}: `{key}` is {other:?}", path.display()),
    }
}

//! Gradients at sites (issue 36) against torch autograd: every fixture's `gradients.safetensors`
//! (written by `make_gradient_fixtures.py`) holds, for prompt 0's prompt call, the gradient of a
//! logit difference and (with `layers.0.layer_output` steered by 0.5) of the next-token loss
//! with respect to every site torch's graph reaches. hookscope, on the model loaded on an
//! autodiff device, must give each within 1e-4 of its largest entry.

use std::path::Path;

use hookscope::analysis::GradMetric;
use hookscope::hooks::RequestSpecs;
use hookscope::{Error, Model, ModelSource, Steps};
use hookscope_conformance::fixtures_dir;
use serde_json::Value;

use crate::common::{f32_tensors, floats};

/// Compares one fixture's runs, on the model loaded on the test device with autodiff; the
/// worst relative difference, per run.
fn check_fixture(dir: &Path, model: &Model) -> Vec<(String, f32)> {
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("gradients.json")).unwrap())
            .unwrap();
    let references = f32_tensors(&dir.join("gradients.safetensors"));
    let prompt: Vec<u32> = meta["prompt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_u64().unwrap() as u32)
        .collect();
    let mut worst = Vec::new();
    for (run, spec) in meta["runs"].as_object().unwrap() {
        let prefix = format!("{run}/");
        let sites: Vec<String> = references
            .keys()
            .filter_map(|key| key.strip_prefix(&prefix))
            .map(|key| key.trim_end_matches("@0").to_string())
            .collect();
        let add = spec["add"].as_array().unwrap();
        let specs = RequestSpecs {
            add: add
                .iter()
                .map(|a| a.as_str().unwrap().to_string())
                .collect(),
            save_grad: sites.clone(),
            ..Default::default()
        };
        let interventions = specs
            .interventions(model.layout(), &Steps::At(0), false, model.device())
            .unwrap();
        let mut trace = model
            .trace(&model.batch(vec![prompt.clone()]).unwrap(), &interventions)
            .unwrap();
        let metric = GradMetric::parse(model, spec["metric"].as_str().unwrap()).unwrap();
        let measured = metric.measure(&trace).unwrap();
        let value = floats(measured.to_data())[0];
        let expected = spec["value"].as_f64().unwrap() as f32;
        assert!(
            (value - expected).abs() < 1e-4 * expected.abs().max(1.0),
            "{}: {run}: metric {value} != torch's {expected}",
            dir.display()
        );
        let gradients = trace.gradients(&measured).unwrap();
        let mut run_worst = 0.0f32;
        for site in &sites {
            let key = format!("{site}@0");
            let (shape, want) = &references[&format!("{prefix}{key}")];
            let entry = gradients
                .iter()
                .find(|entry| entry.key() == key)
                .unwrap_or_else(|| panic!("{}: {run}: no gradient for {key}", dir.display()));
            assert_eq!(entry.shape(), shape.as_slice(), "{key}");
            let got = floats(entry.to_data());
            let largest = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let diff = got
                .iter()
                .zip(want)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            let relative = diff / largest.max(1e-6);
            assert!(
                relative < 1e-4 || diff < 1e-7,
                "{}: {run}: {key}: max difference {diff} against a largest entry {largest}",
                dir.display()
            );
            run_worst = run_worst.max(relative);
        }
        worst.push((format!("{run} ({} sites)", sites.len()), run_worst));
    }
    worst
}

#[test]
fn site_gradients_equal_torch_autograd_on_every_fixture() {
    let mut checked = 0;
    for entry in std::fs::read_dir(fixtures_dir()).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.join("gradients.json").exists() {
            continue;
        }
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let device = hookscope_conformance::test_device().autodiff();
        let model = match Model::load(&ModelSource::Directory(dir.clone()), &device) {
            Ok(model) => model,
            // GPT-J is the plugin example's architecture, not built in.
            Err(Error::UnknownArchitecture { model_type, .. }) if model_type == "gptj" => continue,
            Err(error) => panic!("{name}: {error}"),
        };
        eprintln!("{name}: {:?}", check_fixture(&dir, &model));
        checked += 1;
    }
    assert!(
        checked >= 32,
        "only {checked} fixtures have gradient references"
    );
}

/// Attribution patching's estimate is `(clean - corrupt) . dM/dsite` at the corrupt run,
/// normalised by the metric's span: recomputed here from saved values and a gradient of the
/// same metric, per site, position and head.
#[test]
fn the_attribution_estimate_is_the_saved_difference_times_the_gradient() {
    use hookscope::Interventions;
    use hookscope::analysis::{AttributionMethod, PromptPair, attribution_patching};
    let dir = fixtures_dir().join("llama-gqa2-llama3-bias");
    let device = hookscope_conformance::test_device().autodiff();
    let model = Model::load(&ModelSource::Directory(dir), &device).unwrap();
    let (clean, corrupt) = (vec![5, 17, 33, 2, 61], vec![5, 17, 40, 2, 61]);
    let metric = GradMetric::parse(&model, "logit-diff:#3,#7").unwrap();
    let layout = model.layout();
    let sites = layout
        .expand("layers.0.self_attn.attention_head_outputs")
        .unwrap();
    let prompts = PromptPair {
        clean: &clean,
        corrupt: &corrupt,
    };
    let sweep =
        attribution_patching(&model, prompts, &sites, metric, AttributionMethod::Atp).unwrap();
    let site = sites[0];
    let saved = |ids: &[u32], grad: bool| {
        let mut requests = Interventions::new().save(site, Steps::At(0));
        if grad {
            requests = requests.grad(site);
        }
        let mut trace = model
            .trace(&model.batch(vec![ids.to_vec()]).unwrap(), &requests)
            .unwrap();
        let measured = metric.measure(&trace).unwrap();
        let value = floats(measured.to_data())[0];
        let values = floats(trace.saved.require(site, 0).unwrap().to_data());
        let gradient = grad.then(|| {
            let gradients = trace.gradients(&measured).unwrap();
            floats(gradients.require(site, 0).unwrap().to_data())
        });
        (value, values, gradient)
    };
    let (clean_metric, clean_values, _) = saved(&clean, false);
    let (corrupt_metric, corrupt_values, gradient) = saved(&corrupt, true);
    let gradient = gradient.unwrap();
    let span = clean_metric - corrupt_metric;
    // `[1, T, NH, D]`: per position and head, the sum over D.
    let shape = layout
        .shape(
            site,
            hookscope::schema::CallDims::at_step(1, clean.len(), 0),
        )
        .unwrap();
    let (tokens, heads, width) = (shape[1], shape[2], shape[3]);
    let estimate = |t: usize, h: usize| -> f32 {
        (0..width)
            .map(|d| {
                let i = (t * heads + h) * width + d;
                (clean_values[i] - corrupt_values[i]) * gradient[i]
            })
            .sum::<f32>()
            / span
    };
    assert_eq!(sweep.rows.len(), 1 + heads);
    for row in &sweep.rows {
        assert_eq!(row.site, site);
        for t in 0..tokens {
            let expected = match row.head {
                Some(h) => estimate(t, h),
                None => (0..heads).map(|h| estimate(t, h)).sum(),
            };
            assert!(
                (row.scores[t] - expected).abs() < 1e-5,
                "{:?} position {t}: {} != {expected}",
                row.head,
                row.scores[t]
            );
        }
    }
    // The prompts differ at position 2 only: nothing before it can change; position 2 reaches
    // the last one through layer 1's attention.
    let scores = &sweep.rows[0].scores;
    assert!(scores[..2].iter().all(|s| s.abs() < 1e-6), "{scores:?}");
    assert!(
        scores[2].abs() > 1e-3 && scores[4].abs() > 1e-3,
        "{scores:?}"
    );
}

/// Gradients are refused, by name, where they cannot be taken.
#[test]
fn gradient_requests_are_refused_where_they_cannot_be_taken() {
    use hookscope::{GenerationConfig, Interventions, Site};
    let dir = fixtures_dir().join("llama-mha-tied");
    let plain = Model::load(
        &ModelSource::Directory(dir.clone()),
        &hookscope_conformance::test_device(),
    )
    .unwrap();
    let batch = plain.batch(vec![vec![3, 4, 5]]).unwrap();
    let requests = Interventions::new().grad(Site::layer(0, hookscope::LayerSite::LayerOutput));
    let error = plain.trace(&batch, &requests).unwrap_err().to_string();
    assert!(error.contains("autodiff"), "{error}");

    let device = hookscope_conformance::test_device().autodiff();
    let model = Model::load(&ModelSource::Directory(dir), &device).unwrap();
    let config = GenerationConfig {
        max_new_tokens: 2,
        ..model.generation_config().clone()
    };
    let error = model
        .generate(&batch, &requests, &config)
        .unwrap_err()
        .to_string();
    assert!(error.contains("prompt call"), "{error}");
    let ids = hookscope::Interventions::new().grad(Site::InputIds);
    let error = model.trace(&batch, &ids).unwrap_err().to_string();
    assert!(error.contains("token ids have no gradient"), "{error}");

    let mut trace = model.trace(&batch, &requests).unwrap();
    let metric = GradMetric::parse(&model, "loss").unwrap();
    let measured = metric.measure(&trace).unwrap();
    trace.gradients(&measured).unwrap();
    let again = trace.gradients(&measured).unwrap_err().to_string();
    assert!(again.contains("taken already"), "{again}");
    for (text, needle) in [
        ("kl", "metric `kl`"),
        ("logit:#999999", "outside the vocabulary"),
        ("logit:#1@7", "outside the prompt"),
    ] {
        let error = GradMetric::parse(&model, text)
            .and_then(|metric| metric.measure(&model.trace(&batch, &Interventions::new())?))
            .unwrap_err()
            .to_string();
        assert!(error.contains(needle), "{text}: {error}");
    }
    let specs = RequestSpecs {
        save_grad: vec!["layers.0.layer_output".into()],
        ..Default::default()
    };
    let error = specs
        .interventions(model.layout(), &Steps::All, true, model.device())
        .unwrap_err()
        .to_string();
    assert!(error.contains("prompt call"), "{error}");
}

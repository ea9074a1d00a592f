//! The embedded default model is a trained one (`conformance/scripts/train_demo_model.py`):
//! what it shows must hold in hookscope and match `transformers` on the same weights
//! (`demo_model.json`, written by that script): its greedy continuations, an induction head on
//! repeated random tokens, and a logit lens that sharpens with depth; and the README's patching
//! example localises as it says.

use crate::common::floats;
use hookscope::hooks::RequestSpecs;
use hookscope::{Interventions, Model, Steps};
use hookscope_conformance::test_device;
use serde_json::Value;

/// Within this of `transformers` (f32 arithmetic on the same float16 weights).
const TOLERANCE: f64 = 1e-4;

fn references() -> Value {
    serde_json::from_str(include_str!("demo_model.json")).unwrap()
}

fn demo() -> Model {
    Model::load(&hookscope::default_model(), &test_device()).unwrap()
}

fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn greedy_continuations_equal_transformers() {
    let model = demo();
    let mut config = model.generation_config().clone();
    config.max_new_tokens = 12;
    for case in references()["continuations"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let run = model
            .generate(
                &model.encode(&[prompt]).unwrap(),
                &Interventions::new(),
                &config,
            )
            .unwrap();
        assert_eq!(
            run.new_tokens(0),
            ids(&case["new_ids"]).as_slice(),
            "{prompt:?}"
        );
    }
}

/// Per layer and head, the mean attention from each token of the second copy to the token
/// after its previous occurrence, from hookscope's own `attention_probabilities`.
fn induction_scores(model: &Model, prompts: Vec<Vec<u32>>, period: usize) -> Vec<Vec<f64>> {
    let specs = RequestSpecs {
        save: vec!["layers.*.self_attn.attention_probabilities".into()],
        ..Default::default()
    };
    let requests = specs
        .interventions(model.layout(), &Steps::At(0), false, model.device())
        .unwrap();
    let trace = model
        .trace(&model.batch(prompts).unwrap(), &requests)
        .unwrap();
    let mut layers = Vec::new();
    for entry in trace.saved.iter() {
        let &[batch, heads, queries, keys] = entry.shape() else {
            panic!("{}: {:?}", entry.key(), entry.shape());
        };
        let probabilities = floats(entry.to_data());
        let at = |b: usize, h: usize, q: usize, k: usize| {
            f64::from(probabilities[((b * heads + h) * queries + q) * keys + k])
        };
        let per_head = (0..heads)
            .map(|h| {
                let targets: Vec<f64> = (0..batch)
                    .flat_map(|b| (period + 1..queries).map(move |q| (b, q)))
                    .map(|(b, q)| at(b, h, q, q - period + 1))
                    .collect();
                targets.iter().sum::<f64>() / targets.len() as f64
            })
            .collect();
        layers.push(per_head);
    }
    layers
}

#[test]
fn an_induction_head_attends_to_the_token_after_the_previous_occurrence() {
    let model = demo();
    let case = &references()["induction"];
    let prompts: Vec<Vec<u32>> = case["prompt"].as_array().unwrap().iter().map(ids).collect();
    let period = case["period"].as_u64().unwrap() as usize;
    let scores = induction_scores(&model, prompts, period);
    let expected = case["scores"].as_array().unwrap();
    assert_eq!(scores.len(), expected.len());
    for (layer, (ours, theirs)) in scores.iter().zip(expected).enumerate() {
        for (head, (a, b)) in ours.iter().zip(theirs.as_array().unwrap()).enumerate() {
            let b = b.as_f64().unwrap();
            assert!(
                (a - b).abs() < TOLERANCE,
                "layer {layer} head {head}: {a} vs {b}"
            );
        }
    }
    let best = scores.iter().flatten().cloned().fold(0.0, f64::max);
    assert!(best >= 0.5, "no induction head: best score {best:.3}");
}

#[test]
fn the_logit_lens_sharpens_with_depth() {
    let model = demo();
    let case = &references()["lens"];
    let prompt = case["prompt"].as_str().unwrap();
    let batch = model.encode(&[prompt]).unwrap();
    let tokens = model.tokenizer().unwrap().encode(prompt).unwrap();
    let lens = hookscope::analysis::logit_lens(&model, &batch, &Interventions::new()).unwrap();
    let vocab = model.layout().vocab;
    let mut means = Vec::new();
    for layer in 0..lens.layers() {
        let probabilities = floats(lens.probabilities(layer).unwrap().to_data());
        let log_probs: Vec<f64> = tokens[1..]
            .iter()
            .enumerate()
            .map(|(position, &next)| {
                f64::from(probabilities[position * vocab + next as usize]).ln()
            })
            .collect();
        means.push(log_probs.iter().sum::<f64>() / log_probs.len() as f64);
    }
    let expected: Vec<f64> = case["mean_log_prob"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(means.len(), expected.len());
    for (layer, (a, b)) in means.iter().zip(&expected).enumerate() {
        assert!((a - b).abs() < TOLERANCE, "layer {layer}: {a} vs {b}");
    }
    for pair in means.windows(2) {
        assert!(pair[1] > pair[0], "the lens does not sharpen: {means:?}");
    }
}

/// The README's patching example: the clean/corrupt difference sits at the differing token in
/// layer 0 and has moved to the last position from layer 1 on.
#[test]
fn patching_localises_where_the_prompts_differ_then_the_last_position() {
    use hookscope::analysis::{Metric, activation_patching};
    use hookscope::{LayerSite, Site};
    let model = demo();
    let tokenizer = model.tokenizer().unwrap();
    let encode = |text: &str| tokenizer.encode(text).unwrap();
    let (clean, corrupt) = (
        encode("Speak unto the children of"),
        encode("Speak unto the daughters of"),
    );
    let differing = (0..clean.len()).find(|&p| clean[p] != corrupt[p]).unwrap();
    let last = clean.len() - 1;
    assert_eq!(differing + 1, last, "{clean:?} vs {corrupt:?}");
    let token = |text: &str| encode(text)[0];
    let metric = Metric::LogitDiff {
        correct: token(" Israel"),
        wrong: token(" the"),
    };
    let sites: Vec<Site> = (0..model.layout().layers.len())
        .map(|layer| Site::Layer {
            layer,
            site: LayerSite::LayerOutput,
        })
        .collect();
    let sweep = activation_patching(&model, &clean, &corrupt, &sites, metric).unwrap();
    assert!(sweep.clean > sweep.corrupt + 1.0, "{sweep:?}");
    let scores = &sweep.scores;
    assert!(scores[0][differing] > 0.5, "{scores:?}");
    for layer in 1..scores.len() {
        assert!(scores[layer][last] > 0.9, "layer {layer}: {scores:?}");
        assert!(scores[layer][differing] < 0.1, "layer {layer}: {scores:?}");
    }
}

/// Attribution patching on the README's example (issue 36): the estimates of every layer's
/// output at every position track the exact patching sweep. Measured on this model:
/// correlation 0.9931 for the gradient at the corrupt run (atp), 0.9998 for integrated
/// gradients over 16 points; the test keeps a margin below each.
#[test]
fn attribution_patching_tracks_the_exact_sweep_on_the_readme_example() {
    use hookscope::analysis::{
        AttributionMethod, GradMetric, Metric, PromptPair, activation_patching,
        attribution_patching, correlation,
    };
    let device = test_device().autodiff();
    let model = Model::load(&hookscope::default_model(), &device).unwrap();
    let tokenizer = model.tokenizer().unwrap();
    let encode = |text: &str| tokenizer.encode(text).unwrap();
    let (clean, corrupt) = (
        encode("Speak unto the children of"),
        encode("Speak unto the daughters of"),
    );
    let sites = model.layout().expand("layers.*.layer_output").unwrap();
    let metric = GradMetric::parse(&model, "logit-diff: Israel, the").unwrap();
    let GradMetric::LogitDiff { a, b, .. } = metric else {
        panic!("{metric:?}")
    };
    let exact = activation_patching(
        &model,
        &clean,
        &corrupt,
        &sites,
        Metric::LogitDiff {
            correct: a,
            wrong: b,
        },
    )
    .unwrap();
    let exact_scores: Vec<f32> = exact.scores.concat();
    for (method, floor) in [
        (AttributionMethod::Atp, 0.98),
        (AttributionMethod::IntegratedGradients { steps: 16 }, 0.995),
    ] {
        let prompts = PromptPair {
            clean: &clean,
            corrupt: &corrupt,
        };
        let sweep = attribution_patching(&model, prompts, &sites, metric, method).unwrap();
        assert!((sweep.clean - exact.clean).abs() < 1e-4);
        assert!((sweep.corrupt - exact.corrupt).abs() < 1e-4);
        let estimates: Vec<f32> = sweep
            .site_rows()
            .flat_map(|row| row.scores.clone())
            .collect();
        let r = correlation(&estimates, &exact_scores).unwrap();
        assert!(r > floor, "{method:?}: correlation {r}");
    }
}

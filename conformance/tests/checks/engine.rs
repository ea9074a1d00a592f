//! The hook engine on a real model: reads, writes that flow on, order, errors, batching.

use crate::common::{floats, load_fixture, max_diff, values};
use hookscope::burn::tensor::{Int, Tensor};
use hookscope::{Error, Interventions, LayerSite, MixerSite, Run, Site, SiteValue, Steps};
use hookscope_conformance::order::{Recorder, check_call_order};

fn layer(layer: usize, site: LayerSite) -> Site {
    Site::layer(layer, site)
}

fn save_all(model: &hookscope::Model) -> Interventions {
    model
        .layout()
        .call_order()
        .into_iter()
        .fold(Interventions::new(), |acc, site| {
            acc.save(site, Steps::At(0))
        })
}

#[test]
fn observing_the_order_does_not_change_the_attention_path() {
    let model = load_fixture("gpt2-tied");
    let batch = model.batch(vec![vec![3, 1, 4, 1, 5]]).unwrap();
    let declared = model.layout().call_order();
    // Nobody reads the attention pattern or the heads' writes: the fused path runs and serves
    // neither.
    let mut fused = Recorder::default();
    model
        .trace(&batch, Run::new().observer(&mut fused))
        .unwrap();
    let is_pattern = |site: &Site| {
        matches!(site, Site::Layer { site: LayerSite::Mixer(_, s), .. }
            if matches!(s, MixerSite::AttentionScores | MixerSite::AttentionProbabilities))
    };
    let is_writes = |site: &Site| {
        matches!(
            site,
            Site::Layer {
                site: LayerSite::Mixer(_, MixerSite::AttentionHeadWrites),
                ..
            }
        )
    };
    let without_pattern: Vec<Site> = declared
        .iter()
        .copied()
        .filter(|s| !is_pattern(s) && !is_writes(s))
        .collect();
    assert_eq!(fused.steps, [without_pattern]);
    // Reading one layer's probabilities makes that layer, and only it, serve its pattern.
    let probabilities = Site::self_attn(1, MixerSite::AttentionProbabilities);
    let mut explicit = Recorder::default();
    model
        .trace(
            &batch,
            Run::new()
                .interventions(&Interventions::new().save(probabilities, Steps::At(0)))
                .observer(&mut explicit),
        )
        .unwrap();
    let expected: Vec<Site> = declared
        .iter()
        .copied()
        .filter(|s| !is_writes(s))
        .filter(|s| !is_pattern(s) || matches!(s, Site::Layer { layer: 1, .. }))
        .collect();
    assert_eq!(explicit.steps, [expected]);
    check_call_order(&declared, &explicit.steps[0], |s| *s == probabilities).unwrap();
}

#[test]
fn saving_every_site_does_not_change_the_output() {
    let model = load_fixture("gpt2-tied");
    let batch = model.batch(vec![vec![3, 1, 4, 1, 5]]).unwrap();
    let plain = model.trace(&batch, &Interventions::new()).unwrap();
    let hooked = model.trace(&batch, &save_all(&model)).unwrap();
    let a = floats(plain.logits().unwrap().to_data());
    let b = floats(hooked.logits().unwrap().to_data());
    assert!(max_diff(&a, &b) < 1e-5);
    assert_eq!(hooked.saved.len(), model.layout().call_order().len());
}

#[test]
fn a_zeroed_residual_flows_into_later_layers_only() {
    let model = load_fixture("gpt2-tied");
    let batch = model.batch(vec![vec![3, 1, 4, 1, 5]]).unwrap();
    let reads = Interventions::new()
        .save(layer(0, LayerSite::MlpOutput), Steps::At(0))
        .save(layer(1, LayerSite::LayerInput), Steps::At(0))
        .save(Site::Logits, Steps::At(0));
    let plain = model.trace(&batch, &reads).unwrap();
    let edited = model
        .trace(
            &batch,
            &reads
                .clone()
                .zero(layer(0, LayerSite::LayerOutput), Steps::At(0)),
        )
        .unwrap();
    let get = |trace: &hookscope::Trace, site| values(trace.saved.get(site, 0).unwrap());
    // Before the write: untouched.
    assert_eq!(
        get(&plain, layer(0, LayerSite::MlpOutput)),
        get(&edited, layer(0, LayerSite::MlpOutput))
    );
    // The write is what the next layer receives.
    assert!(
        get(&edited, layer(1, LayerSite::LayerInput))
            .iter()
            .all(|x| *x == 0.0)
    );
    // And it reaches the output.
    assert!(max_diff(&get(&plain, Site::Logits), &get(&edited, Site::Logits)) > 1e-3);
}

#[test]
fn an_edit_sees_the_value_and_its_result_flows_on() {
    let model = load_fixture("gpt2-tied");
    let batch = model.batch(vec![vec![7, 8, 9]]).unwrap();
    let probs = Site::self_attn(1, MixerSite::AttentionProbabilities);
    let plain = model
        .trace(&batch, &Interventions::new().save(probs, Steps::At(0)))
        .unwrap();
    let doubled = Interventions::new()
        .edit(
            layer(0, LayerSite::AttentionOutput),
            Steps::At(0),
            |value| match value {
                SiteValue::Float3(t) => Ok(SiteValue::Float3(t * 2.0)),
                other => Err(format!("unexpected {}", other.describe())),
            },
        )
        .save(layer(0, LayerSite::AttentionOutput), Steps::At(0))
        .save(probs, Steps::At(0));
    let reference = model
        .trace(
            &batch,
            &Interventions::new().save(layer(0, LayerSite::AttentionOutput), Steps::At(0)),
        )
        .unwrap();
    let edited = model.trace(&batch, &doubled).unwrap();
    let before = values(
        reference
            .saved
            .get(layer(0, LayerSite::AttentionOutput), 0)
            .unwrap(),
    );
    let after = values(
        edited
            .saved
            .get(layer(0, LayerSite::AttentionOutput), 0)
            .unwrap(),
    );
    let twice: Vec<f32> = before.iter().map(|x| x * 2.0).collect();
    assert!(max_diff(&after, &twice) < 1e-6);
    let p0 = values(plain.saved.get(probs, 0).unwrap());
    let p1 = values(edited.saved.get(probs, 0).unwrap());
    assert!(
        max_diff(&p0, &p1) > 1e-4,
        "the edit must reach layer 1's attention"
    );
}

#[test]
fn writing_attention_probabilities_changes_the_head_outputs() {
    let model = load_fixture("gpt2-tied");
    let batch = model.batch(vec![vec![7, 8, 9, 10]]).unwrap();
    let heads = Site::self_attn(0, MixerSite::AttentionHeadOutputs);
    let probs = Site::self_attn(0, MixerSite::AttentionProbabilities);
    let plain = model
        .trace(&batch, &Interventions::new().save(heads, Steps::At(0)))
        .unwrap();
    let zeroed = model
        .trace(
            &batch,
            &Interventions::new()
                .zero(probs, Steps::At(0))
                .save(heads, Steps::At(0)),
        )
        .unwrap();
    assert!(
        values(zeroed.saved.get(heads, 0).unwrap())
            .iter()
            .all(|x| *x == 0.0)
    );
    assert!(
        values(plain.saved.get(heads, 0).unwrap())
            .iter()
            .any(|x| *x != 0.0)
    );
}

#[test]
fn writes_of_the_wrong_shape_or_kind_are_refused() {
    let model = load_fixture("gpt2-tied");
    let batch = model.batch(vec![vec![7, 8, 9]]).unwrap();
    let device = model.device().clone();
    let site = layer(0, LayerSite::LayerOutput);
    let wrong_shape = SiteValue::Float3(Tensor::zeros([1, 2, 24], &device));
    let error = model
        .trace(
            &batch,
            &Interventions::new().set(site, Steps::At(0), wrong_shape),
        )
        .unwrap_err();
    assert!(
        matches!(&error, Error::WriteShapeMismatch { expected, got, .. } if expected == &[1, 3, 24] && got == &[1, 2, 24]),
        "{error}"
    );
    let ids: Tensor<2, Int> = Tensor::zeros([1, 3], &device);
    let error = model
        .trace(
            &batch,
            &Interventions::new().set(site, Steps::At(0), SiteValue::Ids(ids)),
        )
        .unwrap_err();
    assert!(matches!(error, Error::WriteKindMismatch { .. }), "{error}");
    let right = SiteValue::Float3(Tensor::ones([1, 3, 24], &device));
    assert!(
        model
            .trace(&batch, &Interventions::new().set(site, Steps::At(0), right))
            .is_ok()
    );
}

#[test]
fn requests_for_sites_the_model_lacks_fail_before_running() {
    let model = load_fixture("gpt2-tied");
    let batch = model.batch(vec![vec![1, 2]]).unwrap();
    let error = model
        .trace(
            &batch,
            &Interventions::new().save(layer(7, LayerSite::LayerOutput), Steps::At(0)),
        )
        .unwrap_err();
    assert!(
        matches!(error, Error::LayerOutOfRange { layers: 3, .. }),
        "{error}"
    );
    let error = model
        .trace(
            &batch,
            &Interventions::new().save(Site::self_attn(0, MixerSite::StateInput), Steps::At(0)),
        )
        .unwrap_err();
    assert!(
        matches!(error, Error::SiteNotInArchitecture { .. }),
        "{error}"
    );
}

#[test]
fn bad_inputs_are_refused() {
    let model = load_fixture("gpt2-tied");
    assert!(matches!(
        model.batch(vec![vec![96]]),
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(model.batch(vec![]), Err(Error::InvalidInput(_))));
    let too_long = model.batch(vec![vec![1; 33]]).unwrap();
    assert!(matches!(
        model.trace(&too_long, &Interventions::new()),
        Err(Error::InvalidInput(_))
    ));
}

#[test]
fn a_padded_batch_equals_its_prompts_run_alone() {
    let model = load_fixture("gpt2-tied");
    let prompts = vec![vec![5, 9, 2, 7, 7, 1], vec![3, 8]];
    let batch = model.batch(prompts.clone()).unwrap();
    assert!(batch.is_padded());
    let all = save_all(&model);
    let together = model.trace(&batch, &all).unwrap();
    for (row, prompt) in prompts.iter().enumerate() {
        let alone = model
            .trace(&model.batch(vec![prompt.clone()]).unwrap(), &all)
            .unwrap();
        let pad = batch.len() - prompt.len();
        for site in [
            layer(2, LayerSite::LayerOutput),
            Site::self_attn(1, MixerSite::AttentionHeadOutputs),
            Site::Logits,
        ] {
            let a = values(together.saved.get(site, 0).unwrap());
            let b = values(alone.saved.get(site, 0).unwrap());
            // Rows are [T, ...] blocks of the batch; compare the real positions.
            let per_position = b.len() / prompt.len();
            let row_len = batch.len() * per_position;
            let real = &a[row * row_len + pad * per_position..(row + 1) * row_len];
            assert!(max_diff(real, &b) < 1e-5, "{site} row {row}");
        }
        let next_a = values(together.saved.get(Site::NextTokenProbs, 0).unwrap());
        let next_b = values(alone.saved.get(Site::NextTokenProbs, 0).unwrap());
        let vocab = next_b.len();
        assert!(max_diff(&next_a[row * vocab..(row + 1) * vocab], &next_b) < 1e-6);
    }
}

#[test]
fn token_ids_written_outside_the_vocabulary_are_refused() {
    let model = load_fixture("gpt2-tied");
    let batch = model.batch(vec![vec![1, 2, 3]]).unwrap();
    let device = model.device().clone();
    let ids: Tensor<2, Int> = Tensor::from_data([[1i64, 500, 3]], &device);
    let error = model
        .trace(
            &batch,
            &Interventions::new().set(Site::InputIds, Steps::At(0), SiteValue::Ids(ids)),
        )
        .unwrap_err();
    assert!(matches!(error, Error::InvalidInput(_)), "{error}");
    assert!(error.to_string().contains("500"), "{error}");
}

/// The size estimate the CLI checks before a run (`Interventions::saved_bytes`) is exact when
/// generation runs every step: attention caches, recurrent states and logits alike.
#[test]
fn the_saved_size_estimate_matches_what_a_run_saves() {
    for name in ["gpt2-tied", "mamba-tied", "qwen3.5-moe"] {
        let model = load_fixture(name);
        let batch = model.batch(vec![vec![3, 1, 4, 1, 5], vec![2, 7]]).unwrap();
        let interventions = model
            .layout()
            .call_order()
            .into_iter()
            .fold(Interventions::new(), |acc, site| acc.save(site, Steps::All))
            .save(Site::Logits, Steps::Range(1..3));
        let mut config = model.generation_config().clone();
        config.max_new_tokens = 4;
        config.eos_token_ids.clear();
        let generation = model.generate(&batch, &interventions, &config).unwrap();
        assert_eq!(generation.steps, 4);
        let duplicated_logits: usize = generation
            .saved
            .iter()
            .filter(|entry| entry.site == Site::Logits && (1..3).contains(&entry.step))
            .map(|entry| entry.shape().iter().product::<usize>() * 4)
            .sum();
        let saved: usize = generation
            .saved
            .iter()
            .map(|entry| {
                let element = if entry.site == Site::InputIds { 8 } else { 4 };
                entry.shape().iter().product::<usize>() * element
            })
            .sum();
        let estimate = interventions
            .saved_bytes(model.layout(), (batch.batch_size(), batch.len()), 4)
            .unwrap()
            .expect("the estimate does not overflow");
        assert_eq!(estimate, saved + duplicated_logits, "{name}");
    }
}

/// A run told to stop after the last requested site saves what a whole trace saves, and
/// computes no logits.
#[test]
fn stopping_after_the_last_request_saves_what_a_trace_saves() {
    for name in ["gpt2-tied", "mamba2-groups1-tied", "qwen3.5-moe"] {
        let model = load_fixture(name);
        let batch = model.batch(vec![vec![3, 1, 4, 1, 5], vec![2, 7]]).unwrap();
        let early = layer(0, LayerSite::LayerOutput);
        let sites = [Site::TokenEmbeddings, early];
        let requests = sites.iter().fold(Interventions::new(), |acc, site| {
            acc.save(*site, Steps::At(0))
        });
        let stop = |requests: &Interventions| {
            model.trace(
                &batch,
                Run::new().interventions(requests).stop_after_last_request(),
            )
        };
        let early_trace = stop(&requests).unwrap();
        assert!(
            matches!(
                early_trace.logits(),
                Err(Error::NotComputed { value: "logits" })
            ),
            "{name}"
        );
        let read = early_trace.saved;
        let traced = model.trace(&batch, &requests).unwrap();
        assert_eq!(read.len(), 2, "{name}");
        for site in sites {
            let diff = max_diff(
                &values(read.get(site, 0).unwrap()),
                &values(traced.saved.get(site, 0).unwrap()),
            );
            assert!(diff == 0.0, "{name} {site}: {diff}");
        }
        // A write after the last save still runs (the call stops after the last touched site).
        let late = layer(model.layout().layers.len() - 1, LayerSite::LayerOutput);
        let failing = requests.edit(late, Steps::At(0), |_| Err("reached".into()));
        let error = stop(&failing).unwrap_err().to_string();
        assert!(error.contains("reached"), "{name}: {error}");
    }
}

/// A write that turns a residual stream to NaN is caught where it would decide tokens: a
/// trace's last-position logits, a generation step's next-token distribution.
#[test]
fn non_finite_values_reaching_the_output_are_errors() {
    let model = load_fixture("gpt2-tied");
    let batch = model.batch(vec![vec![3, 1, 4]]).unwrap();
    let last = layer(model.layout().layers.len() - 1, LayerSite::LayerOutput);
    let poison = |steps| {
        Interventions::new().edit(last, steps, |value| match value {
            SiteValue::Float3(t) => Ok(SiteValue::Float3(t * f32::NAN)),
            other => Ok(other),
        })
    };
    let traced = model.trace(&batch, &poison(Steps::At(0))).unwrap_err();
    assert!(
        matches!(&traced, Error::NonFinite(m) if m.starts_with("row 0: the logits")),
        "{traced}"
    );
    let mut config = model.generation_config().clone();
    config.max_new_tokens = 3;
    let generated = model
        .generate(&batch, &poison(Steps::At(1)), &config)
        .unwrap_err();
    assert!(
        matches!(&generated, Error::NonFinite(m) if m.starts_with("step 1, row 0") && m.contains("NaN")),
        "{generated}"
    );
}

/// A run's interruption check is asked before every call, and the step it refuses never runs;
/// a generation refuses to stop after its last request (it needs every step's distribution).
#[test]
fn a_run_is_interrupted_before_the_step_its_check_refuses() {
    let model = load_fixture("gpt2-tied");
    let batch = model.batch(vec![vec![3, 1, 4]]).unwrap();
    let mut config = model.generation_config().clone();
    config.max_new_tokens = 5;
    config.eos_token_ids.clear();
    let mut asked = Vec::new();
    let mut at_step_2 = |step| {
        asked.push(step);
        step == 2
    };
    let run = Run::new().interrupt_when(&mut at_step_2);
    let error = model.generate(&batch, run, &config).unwrap_err();
    assert!(matches!(error, Error::Interrupted { step: 2 }), "{error}");
    assert_eq!(asked, [0, 1, 2]);
    let early = Run::new().stop_after_last_request();
    let error = model.generate(&batch, early, &config).unwrap_err();
    assert!(
        matches!(
            error,
            Error::RunOption {
                option: "Run::stop_after_last_request",
                ..
            }
        ),
        "{error}"
    );
}

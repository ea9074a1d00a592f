//! Generation with per-step hooks: the seed's examples and the binding rules of SCHEMA.md.

use crate::common::{load_fixture, max_diff, values};
use hookscope::decoding::argmax;
use hookscope::schema::CallDims;
use hookscope::{
    Decoding, Error, GenerationConfig, Interventions, LayerSite, MixerSite, Model, Site, SiteValue,
    Steps,
};

const EIFFEL: [u32; 10] = [464, 412, 733, 417, 8765, 318, 287, 262, 1748, 286];

fn greedy(model: &Model, max_new_tokens: usize) -> GenerationConfig {
    let mut config = model.generation_config().clone();
    config.decoding = Decoding::Greedy;
    config.max_new_tokens = max_new_tokens;
    config.eos_token_ids.clear();
    config
}

fn save_all(model: &Model, steps: Steps) -> Interventions {
    model
        .layout()
        .call_order()
        .into_iter()
        .fold(Interventions::new(), |acc, site| {
            acc.save(site, steps.clone())
        })
}

fn layer_output(layer: usize) -> Site {
    Site::layer(layer, LayerSite::LayerOutput)
}

/// Every site of every step has the shape the table declares, for a padded batch of two.
fn assert_shape_table(fixture: &str, prompts: Vec<Vec<u32>>) {
    let model = load_fixture(fixture);
    let batch = model.batch(prompts).unwrap();
    let run = model
        .generate(&batch, &save_all(&model, Steps::All), &greedy(&model, 3))
        .unwrap();
    assert_eq!(run.steps, 3);
    for step in 0..3 {
        let dims = CallDims::at_step(batch.batch_size(), batch.len(), step);
        for site in model.layout().call_order() {
            let value = run.saved.get(site, step).unwrap();
            let expected = model.layout().shape(site, dims).unwrap();
            assert_eq!(value.shape(), expected, "{fixture} {site}@{step}");
        }
    }
}

#[test]
fn every_site_has_its_table_shape_at_every_step() {
    assert_shape_table("gpt2-tiny", vec![EIFFEL.to_vec(), vec![15496]]);
    // Grouped-query attention: 4 query heads share 1 key/value head of an explicit dim 12.
    assert_shape_table(
        "llama-gqa4-linear-headdim",
        vec![vec![3, 1, 4, 1, 5], vec![9, 2]],
    );
    let model = load_fixture("llama-gqa4-linear-headdim");
    let dims = CallDims::at_step(2, 5, 2);
    let keys = Site::self_attn(0, MixerSite::AttentionKeys);
    let queries = Site::self_attn(0, MixerSite::AttentionQueries);
    assert_eq!(model.layout().shape(keys, dims).unwrap(), [2, 1, 7, 12]);
    assert_eq!(model.layout().shape(queries, dims).unwrap(), [2, 4, 1, 12]);
}

#[test]
fn the_seed_example_shapes_hold() {
    let model = load_fixture("gpt2-tiny");
    let batch = model.batch(vec![EIFFEL.to_vec()]).unwrap();
    let keys = Site::self_attn(1, MixerSite::AttentionKeys);
    let pattern = Site::self_attn(1, MixerSite::AttentionProbabilities);
    let out = layer_output(1);
    let reads = Interventions::new()
        .save(keys, Steps::At(1))
        .save(pattern, Steps::At(2))
        .save(out, Steps::All);
    let run = model.generate(&batch, &reads, &greedy(&model, 3)).unwrap();
    // Keys grow with the cache, queries do not.
    assert_eq!(run.saved.get(keys, 1).unwrap().shape(), [1, 4, 11, 8]);
    assert_eq!(run.saved.get(pattern, 2).unwrap().shape(), [1, 4, 1, 12]);
    let shapes: Vec<Vec<usize>> = (0..3)
        .map(|s| run.saved.get(out, s).unwrap().shape())
        .collect();
    assert_eq!(shapes, [vec![1, 10, 32], vec![1, 1, 32], vec![1, 1, 32]]);
}

#[test]
fn each_step_feeds_the_previous_token_and_appends_its_argmax() {
    let model = load_fixture("gpt2-tiny");
    let batch = model.batch(vec![EIFFEL.to_vec()]).unwrap();
    let reads = Interventions::new()
        .save(Site::InputIds, Steps::All)
        .save(Site::NextTokenProbs, Steps::All);
    let run = model.generate(&batch, &reads, &greedy(&model, 3)).unwrap();
    let new = run.new_tokens(0).to_vec();
    assert_eq!(new.len(), 3);
    for (step, token) in new.iter().enumerate() {
        let probs = values(run.saved.get(Site::NextTokenProbs, step).unwrap());
        assert_eq!(argmax(&probs), *token, "step {step}");
        assert!((probs.iter().sum::<f32>() - 1.0).abs() < 1e-4);
    }
    for step in 1..3 {
        let ids = values(run.saved.get(Site::InputIds, step).unwrap());
        assert_eq!(ids, [new[step - 1] as f32], "step {step}");
    }
}

#[test]
fn a_write_at_step_k_leaves_earlier_steps_bit_identical() {
    let model = load_fixture("gpt2-tied");
    let batch = model.batch(vec![vec![15, 4, 25, 86, 67, 51, 23]]).unwrap();
    let config = greedy(&model, 4);
    let reads = save_all(&model, Steps::All);
    let plain = model.generate(&batch, &reads, &config).unwrap();
    let edited = model
        .generate(
            &batch,
            &reads.clone().zero(layer_output(1), Steps::At(1)),
            &config,
        )
        .unwrap();
    for site in model.layout().call_order() {
        assert_eq!(
            plain.saved.get(site, 0).unwrap().to_data(),
            edited.saved.get(site, 0).unwrap().to_data(),
            "{site}@0"
        );
    }
    assert_eq!(plain.new_tokens(0)[0], edited.new_tokens(0)[0]);
    // Step 1 changes from the zeroed layer on, and the change is carried to later steps.
    let at = |run: &hookscope::Generation, site, step| values(run.saved.get(site, step).unwrap());
    assert_eq!(
        at(&plain, layer_output(0), 1),
        at(&edited, layer_output(0), 1)
    );
    assert!(at(&edited, layer_output(1), 1).iter().all(|x| *x == 0.0));
    assert!(max_diff(&at(&plain, Site::Logits, 3), &at(&edited, Site::Logits, 3)) > 1e-4);
}

#[test]
fn reads_bind_to_exactly_their_steps() {
    let model = load_fixture("gpt2-tied");
    let batch = model.batch(vec![vec![1, 2, 3, 4]]).unwrap();
    let config = greedy(&model, 4);
    let site = Site::self_attn(2, MixerSite::AttentionProbabilities);
    let all = model
        .generate(
            &batch,
            &Interventions::new().save(site, Steps::All),
            &config,
        )
        .unwrap();
    let range = model
        .generate(
            &batch,
            &Interventions::new().save(site, Steps::Range(1..3)),
            &config,
        )
        .unwrap();
    let one = model
        .generate(
            &batch,
            &Interventions::new().save(site, Steps::At(2)),
            &config,
        )
        .unwrap();
    let unnamed = model
        .generate(
            &batch,
            &Interventions::new().save(site, Steps::default()),
            &config,
        )
        .unwrap();
    assert_eq!(range.saved.len(), 2);
    assert_eq!(one.saved.len(), 1);
    assert_eq!(unnamed.saved.len(), 1);
    for step in 1..3 {
        assert_eq!(
            range.saved.get(site, step).unwrap().to_data(),
            all.saved.get(site, step).unwrap().to_data()
        );
        // The key axis says which step a pattern is: S = prompt_len + step.
        assert_eq!(range.saved.get(site, step).unwrap().shape()[3], 4 + step);
    }
    assert_eq!(
        one.saved.get(site, 2).unwrap().to_data(),
        all.saved.get(site, 2).unwrap().to_data()
    );
    assert_eq!(unnamed.saved.get(site, 0).unwrap().shape(), [1, 3, 4, 4]);
}

#[test]
fn an_edit_reading_a_later_site_is_rejected_before_running() {
    let model = load_fixture("gpt2-tied");
    let batch = model.batch(vec![vec![1, 2, 3]]).unwrap();
    let later = Site::self_attn(1, MixerSite::AttentionProbabilities);
    let bad =
        Interventions::new().edit_with(layer_output(0), Steps::All, vec![later], |value, _| {
            Ok(value)
        });
    let error = model
        .generate(&batch, &bad, &greedy(&model, 2))
        .unwrap_err();
    assert!(matches!(error, Error::OutOfOrder { .. }), "{error}");
    let message = error.to_string();
    assert!(
        message.contains("layers.0.layer_output")
            && message.contains("layers.1.self_attn.attention_probabilities"),
        "{message}"
    );
    assert!(model.trace(&batch, &bad).is_err());
}

#[test]
fn an_edit_can_read_an_earlier_site_of_the_same_call() {
    let model = load_fixture("gpt2-tied");
    let batch = model.batch(vec![vec![1, 2, 3]]).unwrap();
    // Skip block 1: its output becomes its input.
    let skip = Interventions::new()
        .edit_with(
            layer_output(1),
            Steps::All,
            vec![Site::layer(1, LayerSite::LayerInput)],
            |_, sources| Ok(sources[0].clone()),
        )
        .save(layer_output(0), Steps::All)
        .save(layer_output(1), Steps::All);
    let run = model.generate(&batch, &skip, &greedy(&model, 2)).unwrap();
    for step in 0..2 {
        assert_eq!(
            run.saved.get(layer_output(0), step).unwrap().to_data(),
            run.saved.get(layer_output(1), step).unwrap().to_data()
        );
    }
}

#[test]
fn writing_keys_on_a_decode_step_edits_the_cache() {
    let model = load_fixture("gpt2-tied");
    let batch = model.batch(vec![vec![5, 6, 7]]).unwrap();
    let keys = Site::self_attn(0, MixerSite::AttentionKeys);
    let run = model
        .generate(
            &batch,
            &Interventions::new()
                .zero(keys, Steps::At(1))
                .save(keys, Steps::At(2)),
            &greedy(&model, 3),
        )
        .unwrap();
    let SiteValue::Float4(later) = run.saved.get(keys, 2).unwrap() else {
        panic!("keys are rank 4");
    };
    let [_, heads, positions, dim] = later.dims();
    assert_eq!(positions, 5);
    let kept = values(&SiteValue::Float4(later.clone().slice_dim(2, 0..4)));
    assert!(
        kept.iter().all(|x| *x == 0.0),
        "the zeroed cache is what step 2 sees"
    );
    let fresh = values(&SiteValue::Float4(later.clone().slice_dim(2, 4..5)));
    assert_eq!(fresh.len(), heads * dim);
    assert!(
        fresh.iter().any(|x| *x != 0.0),
        "step 2's own key is computed anew"
    );
}

#[test]
fn cached_decoding_equals_full_recomputation() {
    let model = load_fixture("gpt2-tied");
    let batch = model
        .batch(vec![vec![15, 4, 25, 86], vec![71, 28]])
        .unwrap();
    let reads = Interventions::new().save(Site::NextTokenProbs, Steps::All);
    let cached = greedy(&model, 5);
    let mut recomputed = cached.clone();
    recomputed.use_cache = false;
    let a = model.generate(&batch, &reads, &cached).unwrap();
    let b = model.generate(&batch, &reads, &recomputed).unwrap();
    assert_eq!(a.output_ids, b.output_ids);
    for step in 0..5 {
        let pa = values(a.saved.get(Site::NextTokenProbs, step).unwrap());
        let pb = values(b.saved.get(Site::NextTokenProbs, step).unwrap());
        assert!(max_diff(&pa, &pb) < 1e-5, "step {step}");
    }
}

#[test]
fn a_padded_batch_generates_as_its_prompts_alone() {
    // GPT-2 (learned positions), Llama with GQA and llama3 rope, Qwen2: positions come from the
    // mask, so a padded row must see exactly what it sees alone.
    for fixture in ["gpt2-tied", "llama-gqa2-llama3-bias", "qwen2-bias"] {
        assert_padded_batch_equals_single_prompts(fixture);
    }
}

fn assert_padded_batch_equals_single_prompts(fixture: &str) {
    let model = load_fixture(fixture);
    let prompts = vec![vec![15, 4, 25, 86, 67, 51, 23], vec![71, 28, 89]];
    let batch = model.batch(prompts.clone()).unwrap();
    let config = greedy(&model, 4);
    let last = model.layout().layers.len() - 1;
    let probs = Site::self_attn(last, MixerSite::AttentionProbabilities);
    let keys = Site::self_attn(1, MixerSite::AttentionKeys);
    let reads = Interventions::new()
        .save(layer_output(last), Steps::All)
        .save(probs, Steps::All)
        .save(keys, Steps::All)
        .save(Site::NextTokenProbs, Steps::All);
    let together = model.generate(&batch, &reads, &config).unwrap();
    let len = batch.len();
    for (row, prompt) in prompts.iter().enumerate() {
        let alone = model
            .generate(&model.batch(vec![prompt.clone()]).unwrap(), &reads, &config)
            .unwrap();
        assert_eq!(
            together.new_tokens(row),
            alone.new_tokens(0),
            "{fixture} row {row}"
        );
        let pad = len - prompt.len();
        for step in 1..4 {
            let row_of = |site| -> Vec<f32> {
                let SiteValue::Float3(t) = together.saved.get(site, step).unwrap() else {
                    panic!("rank 3");
                };
                values(&SiteValue::Float3(t.clone().slice_dim(0, row..row + 1)))
            };
            let alone_of = |site| values(alone.saved.get(site, step).unwrap());
            let out = layer_output(last);
            assert!(
                max_diff(&row_of(out), &alone_of(out)) < 1e-5,
                "{fixture} {out}@{step}"
            );
            for site in [probs, keys] {
                let SiteValue::Float4(t) = together.saved.get(site, step).unwrap() else {
                    panic!("rank 4");
                };
                let axis = if site == keys { 2 } else { 3 };
                let real = t
                    .clone()
                    .slice_dim(0, row..row + 1)
                    .slice_dim(axis, pad..len + step);
                let got = values(&SiteValue::Float4(real));
                assert!(
                    max_diff(&got, &alone_of(site)) < 1e-5,
                    "{site}@{step} row {row}"
                );
            }
        }
    }
}

#[test]
fn rows_stop_at_eos_and_generation_ends_when_all_have() {
    let model = load_fixture("gpt2-tied");
    let batch = model.batch(vec![vec![15, 4, 25, 86, 67, 51, 23]]).unwrap();
    let free = model
        .generate(&batch, &Interventions::new(), &greedy(&model, 4))
        .unwrap();
    let mut config = greedy(&model, 4);
    config.eos_token_ids = vec![free.new_tokens(0)[1]];
    let stopped = model
        .generate(&batch, &Interventions::new(), &config)
        .unwrap();
    assert_eq!(stopped.steps, 2);
    assert_eq!(stopped.new_tokens(0), &free.new_tokens(0)[..2]);

    let two = model
        .batch(vec![vec![15, 4, 25, 86, 67, 51, 23], vec![71, 28, 89, 46]])
        .unwrap();
    let both = model
        .generate(&two, &Interventions::new(), &config)
        .unwrap();
    assert_eq!(both.steps, 4, "the other row goes on");
    assert_eq!(both.new_tokens(0)[2..], [config.pad_token_id; 2]);
}

#[test]
fn seeded_sampling_is_reproducible() {
    let model = load_fixture("gpt2-tied");
    let batch = model.batch(vec![vec![1, 2, 3]]).unwrap();
    let sample = |seed| {
        let mut config = greedy(&model, 8);
        config.decoding = Decoding::Sample {
            temperature: 1.5,
            top_k: 0,
            top_p: 1.0,
            seed,
        };
        model
            .generate(&batch, &Interventions::new(), &config)
            .unwrap()
            .output_ids
    };
    assert_eq!(sample(7), sample(7));
    assert_ne!(sample(7), sample(8));
}

//! Recurrent state under hooks (Mamba-1 and Mamba-2): carried exactly, and writes reaching what
//! they should.

use crate::common::{load_fixture, max_diff, values};
use hookscope::{
    Decoding, Error, GenerationConfig, Interventions, LayerSite, MixerSite, Model, Site, Steps,
};
use hookscope_conformance::Fixture;
use hookscope_conformance::fixture::one_of_each;

fn greedy(model: &Model, steps: usize) -> GenerationConfig {
    let mut config = model.generation_config().clone();
    config.decoding = Decoding::Greedy;
    config.max_new_tokens = steps;
    config.eos_token_ids.clear();
    config
}

fn mixer(layer: usize, site: MixerSite) -> Site {
    Site::self_attn(layer, site)
}

/// One fixture of each recurrent mixer kind whose sites live under `self_attn`.
fn recurrent_fixtures() -> Vec<Fixture> {
    one_of_each(&["mamba", "mamba2"])
}

#[test]
fn state_input_is_the_previous_state_output_bit_for_bit() {
    for fixture in recurrent_fixtures() {
        state_is_carried_bit_for_bit(&fixture.name);
    }
}

fn state_is_carried_bit_for_bit(fixture: &str) {
    let model = load_fixture(fixture);
    let batch = model.batch(vec![vec![5, 17, 33, 2, 8]]).unwrap();
    let reads = Interventions::new()
        .save(mixer(1, MixerSite::StateInput), Steps::All)
        .save(mixer(1, MixerSite::StateOutput), Steps::All);
    let run = model.generate(&batch, &reads, &greedy(&model, 4)).unwrap();
    let input0 = values(run.saved.get(mixer(1, MixerSite::StateInput), 0).unwrap());
    assert!(input0.iter().all(|x| *x == 0.0));
    for step in 1..4 {
        assert_eq!(
            run.saved
                .get(mixer(1, MixerSite::StateInput), step)
                .unwrap()
                .to_data(),
            run.saved
                .get(mixer(1, MixerSite::StateOutput), step - 1)
                .unwrap()
                .to_data(),
            "step {step}"
        );
    }
}

#[test]
fn a_state_write_reaches_the_next_step_and_a_decode_steps_own_output() {
    for fixture in recurrent_fixtures() {
        state_writes_reach_what_they_should(&fixture.name);
    }
}

fn state_writes_reach_what_they_should(fixture: &str) {
    let model = load_fixture(fixture);
    let batch = model.batch(vec![vec![5, 17, 33, 2, 8]]).unwrap();
    let heads = mixer(0, MixerSite::AttentionHeadOutputs);
    let reads = Interventions::new()
        .save(heads, Steps::All)
        .save(mixer(0, MixerSite::StateInput), Steps::All);
    let config = greedy(&model, 3);
    let plain = model.generate(&batch, &reads, &config).unwrap();
    // At the prompt call: the carried state changes, this call's outputs do not.
    let at_prompt = model
        .generate(
            &batch,
            &reads
                .clone()
                .zero(mixer(0, MixerSite::StateOutput), Steps::At(0)),
            &config,
        )
        .unwrap();
    assert_eq!(
        plain.saved.get(heads, 0).unwrap().to_data(),
        at_prompt.saved.get(heads, 0).unwrap().to_data()
    );
    let carried = values(
        at_prompt
            .saved
            .get(mixer(0, MixerSite::StateInput), 1)
            .unwrap(),
    );
    assert!(
        carried.iter().all(|x| *x == 0.0),
        "the written state is what step 1 receives"
    );
    // At a decode step: that step's head outputs read the written state.
    let at_decode = model
        .generate(
            &batch,
            &reads
                .clone()
                .zero(mixer(0, MixerSite::StateOutput), Steps::At(1)),
            &config,
        )
        .unwrap();
    let a = values(plain.saved.get(heads, 1).unwrap());
    let b = values(at_decode.saved.get(heads, 1).unwrap());
    assert!(max_diff(&a, &b) > 1e-6);
}

#[test]
fn a_head_output_write_changes_only_what_flows_from_it() {
    for fixture in recurrent_fixtures() {
        head_output_writes_flow_on(&fixture.name);
    }
}

fn head_output_writes_flow_on(fixture: &str) {
    let model = load_fixture(fixture);
    let batch = model.batch(vec![vec![5, 17, 33, 2, 8]]).unwrap();
    let heads = mixer(0, MixerSite::AttentionHeadOutputs);
    let state = mixer(0, MixerSite::StateOutput);
    let out = Site::layer(0, LayerSite::AttentionOutput);
    let reads = Interventions::new()
        .save(state, Steps::All)
        .save(out, Steps::All);
    let config = greedy(&model, 2);
    let plain = model.generate(&batch, &reads, &config).unwrap();
    let edited = model
        .generate(&batch, &reads.clone().zero(heads, Steps::At(0)), &config)
        .unwrap();
    assert_eq!(
        plain.saved.get(state, 0).unwrap().to_data(),
        edited.saved.get(state, 0).unwrap().to_data(),
        "the state is computed before the head outputs"
    );
    let a = values(plain.saved.get(out, 0).unwrap());
    let b = values(edited.saved.get(out, 0).unwrap());
    assert!(max_diff(&a, &b) > 1e-6);
}

#[test]
fn mamba_has_no_mlp_and_says_so() {
    let model = load_fixture("mamba-tied");
    let error = model.layout().resolve("layers.0.mlp_output").unwrap_err();
    assert!(
        matches!(error, Error::SiteNotInArchitecture { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("Mamba-1"), "{error}");
    assert_eq!(
        model
            .layout()
            .resolve("layers.1.mixer.state_output")
            .unwrap(),
        mixer(1, MixerSite::StateOutput)
    );
}

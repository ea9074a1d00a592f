//! Indexed requests (`SITE[INDEX]`) and writes of stored tensors, through the text parser the
//! CLI and the Python package share: what is saved, what a write changes, and the errors.

use crate::common::{floats, load_fixture, max_diff};
use hookscope::hooks::{Index, RequestSpecs};
use hookscope::{Error, LayerSite, Model, Site, Steps};

fn layer_output(layer: usize) -> Site {
    Site::Layer {
        layer,
        site: LayerSite::LayerOutput,
    }
}

fn specs(save: &[&str], zero: &[&str], add: &[&str], set: &[&str]) -> RequestSpecs {
    let owned = |list: &[&str]| list.iter().map(|s| s.to_string()).collect();
    RequestSpecs {
        save: owned(save),
        zero: owned(zero),
        add: owned(add),
        set: owned(set),
        ..Default::default()
    }
}

/// A saved value: its key, numpy shape and elements.
type SavedValue = (String, Vec<usize>, Vec<f32>);

/// Runs a trace of `prompt` with `specs`; the saved values by key with their numpy shapes.
fn trace(
    model: &Model,
    prompt: &[u32],
    specs: &RequestSpecs,
) -> hookscope::Result<Vec<SavedValue>> {
    let interventions =
        specs.interventions(model.layout(), &Steps::At(0), false, model.device())?;
    let trace = model.trace(&model.batch(vec![prompt.to_vec()])?, &interventions)?;
    Ok(trace
        .saved
        .iter()
        .map(|entry| (entry.key(), entry.shape().to_vec(), floats(entry.to_data())))
        .collect())
}

/// A safetensors file holding `tensors` (f32), in a temporary folder.
fn stored(tensors: &[(&str, Vec<usize>, Vec<f32>)]) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("operands.safetensors");
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, values)| values.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let views: Vec<(&str, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), data)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data)
                    .unwrap();
            (*name, view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, &path).unwrap();
    let path = path.display().to_string();
    (dir, path)
}

const PROMPT: [u32; 5] = [7, 8, 9, 10, 11];
const H: usize = 24;

#[test]
fn indexed_saves_keep_the_selected_part_in_numpy_shape() {
    let model = load_fixture("gpt2-tied");
    let saved = trace(
        &model,
        &PROMPT,
        &specs(
            &[
                "layers.1.layer_output",
                "layers.1.layer_output[:, -1]",
                "layers.1.layer_output[0, 1:4, ::2]",
                "layers.0.self_attn.attention_head_outputs[..., 2, :]",
            ],
            &[],
            &[],
            &[],
        ),
    )
    .unwrap();
    let get = |key: &str| saved.iter().find(|(k, _, _)| k == key).unwrap().clone();
    let (_, shape, whole) = get("layers.1.layer_output@0");
    assert_eq!(shape, [1, 5, H]);
    let (_, shape, last) = get("layers.1.layer_output[:, -1]@0");
    assert_eq!(shape, [1, H]);
    assert_eq!(last, whole[4 * H..]);
    let (_, shape, strided) = get("layers.1.layer_output[0, 1:4, ::2]@0");
    assert_eq!(shape, [3, H / 2]);
    let expected: Vec<f32> = (1..4)
        .flat_map(|t| (0..H).step_by(2).map(move |h| t * H + h))
        .map(|i| whole[i])
        .collect();
    assert_eq!(strided, expected);
    let (_, shape, _) = get("layers.0.self_attn.attention_head_outputs[..., 2, :]@0");
    assert_eq!(shape, [1, 5, 8]);
}

#[test]
fn indexed_writes_change_only_their_part() {
    let model = load_fixture("gpt2-tied");
    let save = ["layers.0.layer_output", "layers.1.layer_output"];
    let plain = trace(&model, &PROMPT, &specs(&save, &[], &[], &[])).unwrap();
    let zeroed = trace(
        &model,
        &PROMPT,
        &specs(&save, &["layers.0.layer_output[:, 2, :5]"], &[], &[]),
    )
    .unwrap();
    let (before, after) = (&plain[0].2, &zeroed[0].2);
    for (i, (a, b)) in before.iter().zip(after).enumerate() {
        let (t, h) = (i / H, i % H);
        if t == 2 && h < 5 {
            assert_eq!(*b, 0.0);
        } else {
            assert_eq!(a, b, "position {t}, unit {h} changed");
        }
    }
    // Causal: layer 1 changes from position 2 on, not before.
    let (before, after) = (&plain[1].2, &zeroed[1].2);
    assert_eq!(before[..2 * H], after[..2 * H]);
    assert!(max_diff(&before[2 * H..], &after[2 * H..]) > 1e-4);
}

#[test]
fn stored_tensors_add_and_set_with_broadcasting() {
    let model = load_fixture("gpt2-tied");
    let steer: Vec<f32> = (0..H).map(|h| h as f32 / 10.0).collect();
    let patch: Vec<f32> = (0..2 * H).map(|i| i as f32).collect();
    let (_dir, file) = stored(&[
        ("steer", vec![H], steer.clone()),
        ("patch", vec![2, H], patch.clone()),
        ("short", vec![H - 1], vec![0.0; H - 1]),
    ]);
    let save = ["layers.0.layer_output"];
    let plain = trace(&model, &PROMPT, &specs(&save, &[], &[], &[])).unwrap();
    let added = trace(
        &model,
        &PROMPT,
        &specs(
            &save,
            &[],
            &[&format!("layers.0.layer_output={file}:steer*-2")],
            &[],
        ),
    )
    .unwrap();
    for (i, (a, b)) in plain[0].2.iter().zip(&added[0].2).enumerate() {
        assert!((a - 2.0 * steer[i % H] - b).abs() < 1e-5);
    }
    let set = trace(
        &model,
        &PROMPT,
        &specs(
            &save,
            &[],
            &[],
            &[&format!("layers.0.layer_output[0, 3:]={file}:patch")],
        ),
    )
    .unwrap();
    assert_eq!(set[0].2[..3 * H], plain[0].2[..3 * H]);
    assert_eq!(set[0].2[3 * H..], patch);

    let error = trace(
        &model,
        &PROMPT,
        &specs(
            &[],
            &[],
            &[&format!("layers.0.layer_output={file}:short")],
            &[],
        ),
    )
    .unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, Error::InvalidSpec { .. }), "{message}");
    assert!(
        message.contains("[23]") && message.contains("[B, T, 24]"),
        "{message}"
    );
    // Broadcasting along a varying axis is checked at the call: 2 rows for 5 positions.
    let error = trace(
        &model,
        &PROMPT,
        &specs(
            &[],
            &[],
            &[],
            &[&format!("layers.0.layer_output={file}:patch")],
        ),
    )
    .unwrap_err();
    assert!(
        matches!(&error, Error::WriteShapeMismatch { expected, got, .. } if expected == &[1, 5, H] && got == &[1, 2, H]),
        "{error}"
    );
}

#[test]
fn bad_specs_name_the_part_at_fault() {
    let model = load_fixture("gpt2-tied");
    let (_dir, file) = stored(&[("steer", vec![H], vec![1.0; H])]);
    let cases: Vec<(RequestSpecs, &str)> = vec![
        (
            specs(&["layers.0.layer_output[:, 9]"], &[], &[], &[]),
            "index 9 is out of bounds for axis 1 with size 5",
        ),
        (
            specs(
                &[],
                &["layers.0.self_attn.attention_head_outputs[:, :, 3]"],
                &[],
                &[],
            ),
            "index 3 is out of bounds for axis 2 with size 3",
        ),
        (
            specs(&["layers.0.layer_output[0, 0, 0, 0]"], &[], &[], &[]),
            "too many indices",
        ),
        (
            specs(&["layers.0.layer_output[:, x]"], &[], &[], &[]),
            "`x` is not an integer",
        ),
        (
            specs(&["layers.0.layer_output[:, -1"], &[], &[], &[]),
            "no closing `]`",
        ),
        (
            specs(
                &[],
                &[],
                &[&format!("layers.0.layer_output={file}:steer*abc")],
                &[],
            ),
            "scale `abc` is not a number",
        ),
        (
            specs(
                &[],
                &[],
                &[&format!("layers.0.layer_output={file}:missing")],
                &[],
            ),
            "no tensor `missing`; it holds `steer`",
        ),
        (
            specs(&[], &[], &["layers.0.layer_output=steer.npy:v"], &[]),
            "FILE.safetensors:KEY",
        ),
        (
            specs(&[], &[], &["layers.0.layer_output"], &[]),
            "expected `SITE[@STEPS]=FILE.safetensors:KEY`",
        ),
        (
            specs(
                &[],
                &[],
                &[],
                &[&format!("layers.0.layer_output={file}:steer*2")],
            ),
            "--set takes no `*SCALE`",
        ),
        (
            specs(
                &[],
                &[],
                &[&format!(
                    "layers.0.layer_output={}/none.safetensors:steer",
                    std::env::temp_dir().display()
                )],
                &[],
            ),
            "none.safetensors",
        ),
    ];
    for (specs, expected) in cases {
        let error = trace(&model, &PROMPT, &specs).unwrap_err().to_string();
        assert!(error.contains(expected), "{error:?} lacks {expected:?}");
    }
}

#[test]
fn an_index_prints_canonically_in_saved_keys() {
    let index = Index::parse("0,1:3, ...").unwrap();
    assert_eq!(
        format!("layers.0.layer_output{index}@0"),
        "layers.0.layer_output[0, 1:3, ...]@0"
    );
}

#[test]
fn the_batched_patching_sweep_equals_one_indexed_set_per_position() {
    use hookscope::analysis::{Metric, activation_patching};
    use hookscope::hooks::{Action, Write};
    use hookscope::{Interventions, SiteValue};
    let model = load_fixture("gpt2-tied");
    let (clean, corrupt) = ([5u32, 6, 7, 8], [5u32, 9, 7, 8]);
    let site = layer_output(0);
    let metric = Metric::LogitDiff {
        correct: 3,
        wrong: 4,
    };
    let sweep = activation_patching(
        &model,
        &clean,
        &corrupt,
        &[site, Site::TokenEmbeddings],
        metric,
    )
    .unwrap();
    let logit_diff = |interventions: &Interventions, prompt: &[u32]| -> (f32, hookscope::Saved) {
        let trace = model
            .trace(&model.batch(vec![prompt.to_vec()]).unwrap(), interventions)
            .unwrap();
        let logits = floats(trace.logits().unwrap().to_data());
        let last = &logits[logits.len() - model.layout().vocab..];
        (last[3] - last[4], trace.saved)
    };
    let (clean_metric, saved) = logit_diff(&Interventions::new().save(site, Steps::At(0)), &clean);
    let (corrupt_metric, _) = logit_diff(&Interventions::new(), &corrupt);
    assert!((sweep.clean - clean_metric).abs() < 1e-5);
    let clean_value = saved.get(site, 0).unwrap();
    for p in 0..clean.len() {
        let index = Index::parse(&format!(":, {p}:{}", p + 1)).unwrap();
        let region = index.resolve(&clean_value.shape()).unwrap();
        let part: SiteValue = region.read(clean_value);
        let mut interventions = Interventions::new();
        let write = Action::Write(Write::Set(Box::new(part)));
        interventions.push_indexed(site, index, Steps::At(0), write);
        let (patched, _) = logit_diff(&interventions, &corrupt);
        let score = (patched - corrupt_metric) / (clean_metric - corrupt_metric);
        assert!(
            (score - sweep.scores[0][p]).abs() < 1e-4,
            "position {p}: {score} vs {}",
            sweep.scores[0][p]
        );
    }
    // The prompts differ only in token 1: its embedding carries the whole difference.
    let embeddings = &sweep.scores[1];
    assert_eq!(sweep.sites[1], Site::TokenEmbeddings);
    assert!((embeddings[1] - 1.0).abs() < 1e-4, "{embeddings:?}");
    for p in [0, 2, 3] {
        assert!(embeddings[p].abs() < 1e-4, "{embeddings:?}");
    }
}

/// Which requests read and write every batch row alone (`Interventions::rows_independent`,
/// what the server checks before it stacks requests in one batch), and `Trace::rows`: rows of
/// a batch traced together equal each traced alone, saved values, logits and distributions.
#[test]
fn rows_of_a_batch_traced_together_equal_each_traced_alone() {
    let model = load_fixture("llama-gqa2-llama3-bias");
    let independent = |save: &[&str], zero: &[&str], add: &[&str]| {
        specs(save, zero, add, &[])
            .interventions(model.layout(), &Steps::At(0), false, model.device())
            .unwrap()
            .rows_independent()
    };
    assert!(independent(
        &["layers.0.layer_output", "logits[:, -1]"],
        &[],
        &[]
    ));
    assert!(independent(
        &[],
        &["layers.1.self_attn.attention_head_outputs[:, :, 1]"],
        &[]
    ));
    assert!(independent(&[], &[], &["layers.0.layer_output=0.5"]));
    assert!(!independent(&["layers.0.layer_output[0]"], &[], &[]));
    assert!(!independent(&["layers.0.layer_output[..., 0]"], &[], &[]));
    assert!(!independent(&[], &["layers.0.layer_output[1:]"], &[]));
    let adding = |shape: Vec<usize>| {
        let values = vec![0.5; shape.iter().product()];
        let operand = hookscope::hooks::Operand { values, shape };
        RequestSpecs {
            add_values: vec![("layers.0.layer_output".into(), operand)],
            ..Default::default()
        }
        .interventions(model.layout(), &Steps::At(0), false, model.device())
        .unwrap()
        .rows_independent()
    };
    let hidden = model.layout().hidden;
    assert!(adding(vec![hidden]), "a vector broadcast over the batch");
    assert!(!adding(vec![2, 1, hidden]), "one vector per row");

    let prompts = vec![vec![3, 17, 9, 41], vec![8, 2, 30, 5], vec![11, 12, 13, 14]];
    let interventions = specs(
        &[
            "layers.1.layer_output",
            "layers.0.self_attn.attention_probabilities[:, 1]",
        ],
        &["layers.0.mlp_output[:, -1]"],
        &["layers.1.attention_output[:, :, 0]=0.25"],
        &[],
    )
    .interventions(model.layout(), &Steps::At(0), false, model.device())
    .unwrap();
    assert!(interventions.rows_independent());
    let together = model
        .trace(&model.batch(prompts.clone()).unwrap(), &interventions)
        .unwrap();
    for (row, prompt) in prompts.iter().enumerate() {
        let alone = model
            .trace(&model.batch(vec![prompt.clone()]).unwrap(), &interventions)
            .unwrap();
        let part = together.rows(row..row + 1).unwrap();
        assert_eq!(part.batch, alone.batch);
        let entries = |trace: &hookscope::Trace| -> Vec<SavedValue> {
            trace
                .saved
                .iter()
                .map(|e| (e.key(), e.shape().to_vec(), floats(e.to_data())))
                .collect()
        };
        let (part_values, alone_values) = (entries(&part), entries(&alone));
        assert_eq!(part_values.len(), 2);
        for (a, b) in part_values.iter().zip(&alone_values) {
            assert_eq!((&a.0, &a.1), (&b.0, &b.1));
            assert!(max_diff(&a.2, &b.2) < 1e-5, "{}", a.0);
        }
        let logits = |trace: &hookscope::Trace| floats(trace.logits().unwrap().to_data());
        assert!(max_diff(&logits(&part), &logits(&alone)) < 1e-4);
        let probs = |trace: &hookscope::Trace| floats(trace.next_token_probs().unwrap().to_data());
        assert!(max_diff(&probs(&part), &probs(&alone)) < 1e-5);
    }
    let rows = together.rows(1..3).unwrap();
    assert_eq!(rows.batch.batch_size(), 2);
    assert!(together.rows(2..4).is_err());
    assert!(together.rows(1..1).is_err());
}

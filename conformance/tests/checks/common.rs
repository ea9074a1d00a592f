//! Helpers shared by the integration tests.

#![allow(dead_code)] // each test binary uses its own subset

use std::collections::BTreeMap;
use std::path::Path;

use hookscope::{Interventions, MixerSite, Model, ModelSource, Site, Steps};
use hookscope_conformance::fixtures_dir;
use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, TensorView};

/// A temporary copy of a committed fixture's files (not its folders), to break on purpose.
pub fn copy_fixture(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixtures_dir().join(name)).unwrap() {
        let entry = entry.unwrap();
        if entry.path().is_dir() {
            continue;
        }
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    dir
}

/// Loads a model directory on the default device.
pub fn load(dir: &Path) -> hookscope::Result<Model> {
    Model::load(
        &ModelSource::Directory(dir.to_path_buf()),
        &hookscope_conformance::test_device(),
    )
}

/// Loads a committed fixture.
pub fn load_fixture(name: &str) -> Model {
    load(&fixtures_dir().join(name)).unwrap()
}

/// Raw tensors of a safetensors file: name → (dtype, shape, bytes).
pub type RawTensors = BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>;

/// Tensors by name, each as its shape and f32 values.
pub type Tensors = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

/// Reads every tensor of a safetensors file.
pub fn read_tensors(path: &Path) -> RawTensors {
    let bytes = std::fs::read(path).unwrap();
    let tensors = SafeTensors::deserialize(&bytes).unwrap();
    tensors
        .iter()
        .map(|(name, view)| {
            (
                name.to_string(),
                (view.dtype(), view.shape().to_vec(), view.data().to_vec()),
            )
        })
        .collect()
}

/// Writes tensors to a safetensors file.
pub fn write_tensors(path: &Path, tensors: &RawTensors) {
    let views: Vec<(&str, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, (dtype, shape, data))| {
            (
                name.as_str(),
                TensorView::new(*dtype, shape.clone(), data).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// A site value's elements as f32.
pub fn values(value: &hookscope::SiteValue) -> Vec<f32> {
    floats(value.to_data())
}

/// Tensor data's elements as f32.
pub fn floats(data: hookscope::burn::tensor::TensorData) -> Vec<f32> {
    data.convert::<f32>().try_into_vec::<f32>().unwrap()
}

/// The largest absolute difference between two equally long slices.
pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Loads `config` (a released `config.json`, cut down) with random weights, runs three tokens
/// (finite logits) and returns the model and its last layer's `attention_keys` shape.
pub fn random_run(config: &str) -> (Model, Vec<usize>) {
    let model = Model::random_from_config(config, 5, &hookscope_conformance::test_device())
        .unwrap_or_else(|e| panic!("{e}"));
    let last = model.layout().layers.len() - 1;
    let keys = Site::self_attn(last, MixerSite::AttentionKeys);
    let trace = model
        .trace(
            &model.batch(vec![vec![2, 10, 20]]).unwrap(),
            &Interventions::new().save(keys, Steps::At(0)),
        )
        .unwrap();
    let logits = floats(trace.logits().unwrap().to_data());
    assert!(logits.iter().all(|v| v.is_finite()));
    let shape = trace.saved.get(keys, 0).unwrap().shape();
    (model, shape)
}

/// The f32 and i64 tensors of a safetensors file of references, as f32: name → (shape, values).
pub fn f32_tensors(path: &Path) -> Tensors {
    read_tensors(path)
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

/// Greedy generation of `new_tokens` tokens from `prompt` with `specs` applied: the output ids
/// (as f32) and each step's last-position logits.
pub fn greedy_run(
    model: &Model,
    prompt: &[u32],
    specs: &hookscope::hooks::RequestSpecs,
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

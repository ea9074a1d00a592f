//! Helpers shared by the integration tests.

#![allow(dead_code)] // each test binary uses its own subset

use std::collections::BTreeMap;
use std::path::Path;

use hookscope::{Model, ModelSource};
use hookscope_conformance::fixtures_dir;
use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, TensorView};

/// A temporary copy of a committed fixture, to break on purpose.
pub fn copy_fixture(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixtures_dir().join(name)).unwrap() {
        let entry = entry.unwrap();
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

//! The precision `--dtype auto` picks for a checkpoint, as transformers' `dtype="auto"` does.

use safetensors::Dtype;
use serde_json::Value;

use super::Checkpoint;
use crate::precision::WeightDtype;

/// The precision `auto` picks, as transformers' `dtype="auto"` does: `config.json`'s `dtype`
/// (or the older `torch_dtype`) when it names one of the three, else the floating-point type
/// holding most of the checkpoint's bytes (f32 for anything wider or not floating).
pub fn auto_dtype(config: &Value, checkpoint: Option<&Checkpoint>) -> WeightDtype {
    let declared = ["dtype", "torch_dtype"]
        .iter()
        .filter_map(|key| config.get(*key).and_then(Value::as_str))
        .find_map(|name| name.parse().ok());
    if let Some(dtype) = declared {
        return dtype;
    }
    let stored = checkpoint.and_then(|checkpoint| {
        [Dtype::F32, Dtype::BF16, Dtype::F16]
            .into_iter()
            .map(|dtype| (checkpoint.bytes_of(dtype), dtype))
            .filter(|(bytes, _)| *bytes > 0)
            .max_by_key(|(bytes, _)| *bytes)
    });
    match stored {
        Some((_, Dtype::BF16)) => WeightDtype::Bf16,
        Some((_, Dtype::F16)) => WeightDtype::F16,
        _ => WeightDtype::F32,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn auto_follows_the_config_then_the_stored_bytes() {
        assert_eq!(
            auto_dtype(&json!({"dtype": "bfloat16"}), None),
            WeightDtype::Bf16
        );
        assert_eq!(
            auto_dtype(&json!({"torch_dtype": "float16"}), None),
            WeightDtype::F16
        );
        assert_eq!(
            auto_dtype(&json!({"dtype": "float64"}), None),
            WeightDtype::F32
        );
        assert_eq!(auto_dtype(&json!({}), None), WeightDtype::F32);
    }

    /// Without a declared dtype, the type holding most of the checkpoint's bytes decides.
    #[test]
    fn auto_without_a_declared_dtype_reads_the_checkpoint() {
        use safetensors::tensor::TensorView;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let (small, large) = (vec![0u8; 4 * 3], vec![0u8; 2 * 10]);
        let tensors = [
            (
                "norm",
                TensorView::new(Dtype::F32, vec![3], &small).unwrap(),
            ),
            (
                "matrix",
                TensorView::new(Dtype::BF16, vec![2, 5], &large).unwrap(),
            ),
        ];
        safetensors::serialize_to_file(tensors, None, &path).unwrap();
        let checkpoint = Checkpoint::open_file(&path).unwrap();
        assert_eq!(auto_dtype(&json!({}), Some(&checkpoint)), WeightDtype::Bf16);
        assert_eq!(
            auto_dtype(&json!({"dtype": "float32"}), Some(&checkpoint)),
            WeightDtype::F32,
            "the config wins"
        );
        assert_eq!(checkpoint.bytes_as(WeightDtype::F16), 2 * 13);
    }
}

//! Element-wise functions and the vocabulary softmax: the CPU kernels where they apply
//! (`crate::cpu`), burn's operations elsewhere.

use burn::tensor::{Tensor, activation};

use crate::cpu;

/// `x * sigmoid(x)`.
pub fn silu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    cpu::silu(&x).unwrap_or_else(|| activation::silu(x))
}

/// `e^x` element-wise: 0 below the normal range (as `e^-inf`), infinite past `f32::MAX`.
pub fn exp<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    cpu::exp(&x).unwrap_or_else(|| x.exp())
}

/// `1 / (1 + e^-x)` element-wise.
pub fn sigmoid<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    cpu::sigmoid(&x).unwrap_or_else(|| activation::sigmoid(x))
}

/// `softmax` over the last axis: `e^(x - max) / sum`, the sum accurate to a few units in the
/// last place over a whole vocabulary on the CPU. A row holding NaN or `+inf` gives NaN, a row
/// of `-inf` gives NaN (as in torch); `-inf` entries elsewhere give 0.
pub fn softmax_last<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    cpu::softmax_last(&x).unwrap_or_else(|| activation::softmax(x, D - 1))
}

/// Soft-capping: `cap · tanh(x / cap)`, which bounds `x` to `(-cap, cap)` (Gemma 2's scores and
/// logits).
pub fn soft_cap<const D: usize>(x: Tensor<D>, cap: f64) -> Tensor<D> {
    activation::tanh(x / cap) * cap
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, TensorData};

    use super::*;

    /// Layouts the kernels leave alone (a transposed view) get burn's values.
    #[test]
    fn strided_inputs_get_burns_values() {
        let values: Vec<f32> = (0..400).map(|i| (i as f32 - 200.0) * 0.05).collect();
        let square: Tensor<2> =
            Tensor::from_data(TensorData::new(values, [20, 20]), &Device::default());
        let strided = square.transpose();
        let read = |t: Tensor<2>| t.into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(
            read(silu(strided.clone())),
            read(activation::silu(strided.clone()))
        );
        assert_eq!(
            read(softmax_last(strided.clone())),
            read(activation::softmax(strided, 1))
        );
    }
}

//! Normalisation layers.

use burn::tensor::Tensor;
use burn::tensor::module::layer_norm;

use crate::loading::WeightLoader;

/// LayerNorm over the last axis, with weight and bias.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: Tensor<1>,
    bias: Tensor<1>,
    eps: f64,
}

impl LayerNorm {
    /// Loads `{name}.weight` and `{name}.bias`.
    pub fn load(loader: &mut WeightLoader<'_>, name: &str, size: usize, eps: f64) -> Self {
        LayerNorm {
            weight: loader.tensor(&format!("{name}.weight"), [size]),
            bias: loader.tensor(&format!("{name}.bias"), [size]),
            eps,
        }
    }

    /// Normalises the last axis.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        layer_norm(x, self.weight.clone(), Some(self.bias.clone()), self.eps)
    }
}

/// RMSNorm over the last axis: `x / sqrt(mean(x²) + eps) * weight`.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor<1>,
    eps: f64,
}

impl RmsNorm {
    /// Loads `{name}.weight`.
    pub fn load(loader: &mut WeightLoader<'_>, name: &str, size: usize, eps: f64) -> Self {
        RmsNorm {
            weight: loader.tensor(&format!("{name}.weight"), [size]),
            eps,
        }
    }

    /// Normalises the last axis.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let mean_square = x.clone().powi_scalar(2).mean_dim(D - 1);
        let scale = (mean_square + self.eps).sqrt().recip();
        x * scale * self.weight.clone().unsqueeze()
    }
}

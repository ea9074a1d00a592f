//! Affine maps `y = x W + b`, stored as `[in, out]`.

use burn::tensor::Tensor;
use burn::tensor::module::linear;

use crate::loading::WeightLoader;

/// An affine map with its weight stored `[in, out]`.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Tensor<2>,
    bias: Option<Tensor<1>>,
}

impl Linear {
    /// Loads a GPT-2-style `Conv1D` (`{name}.weight` stored `[in, out]`, `{name}.bias`).
    pub fn load_conv1d(
        loader: &mut WeightLoader<'_>,
        name: &str,
        d_in: usize,
        d_out: usize,
    ) -> Self {
        Linear {
            weight: loader.tensor(&format!("{name}.weight"), [d_in, d_out]),
            bias: Some(loader.tensor(&format!("{name}.bias"), [d_out])),
        }
    }

    /// Loads a torch `nn.Linear` (`{name}.weight` stored `[out, in]`), with its bias if `bias`.
    pub fn load_torch(
        loader: &mut WeightLoader<'_>,
        name: &str,
        d_in: usize,
        d_out: usize,
        bias: bool,
    ) -> Self {
        let weight: Tensor<2> = loader.tensor(&format!("{name}.weight"), [d_out, d_in]);
        Linear {
            weight: weight.transpose(),
            bias: bias.then(|| loader.tensor(&format!("{name}.bias"), [d_out])),
        }
    }

    /// A bias-free map from an `[out, in]` matrix, e.g. a language-model head tied to the
    /// `[vocab, hidden]` embedding table.
    pub fn from_out_in(weight: Tensor<2>) -> Self {
        Linear {
            weight: weight.transpose(),
            bias: None,
        }
    }

    /// Applies the map to the last axis.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        linear(x, self.weight.clone(), self.bias.clone())
    }
}

//! Activation functions named as `transformers` names them in `config.json`.

use burn::tensor::Tensor;
use burn::tensor::activation;

/// An elementwise activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// Exact (erf) GELU: `gelu`.
    Gelu,
    /// Tanh-approximated GELU: `gelu_new`, `gelu_pytorch_tanh`, `gelu_fast`.
    GeluTanh,
    /// `relu`.
    Relu,
    /// `silu` / `swish`.
    Silu,
}

impl Activation {
    /// The activation a `transformers` config names, if supported.
    pub fn from_hf_name(name: &str) -> Option<Self> {
        match name {
            "gelu" => Some(Activation::Gelu),
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Some(Activation::GeluTanh),
            "relu" => Some(Activation::Relu),
            "silu" | "swish" => Some(Activation::Silu),
            _ => None,
        }
    }

    /// Applies the activation.
    pub fn forward<const D: usize>(self, x: Tensor<D>) -> Tensor<D> {
        match self {
            Activation::Gelu => activation::gelu(x),
            Activation::GeluTanh => activation::gelu_approximate(x),
            Activation::Relu => activation::relu(x),
            Activation::Silu => activation::silu(x),
        }
    }
}

//! Activation functions named as `transformers` names them in `config.json`.

use burn::tensor::Tensor;
use burn::tensor::activation;

use crate::config::ArchConfig;
use crate::error::Result;

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

    /// The activation `config.json` names under `key`, or an "unsupported" error naming it.
    pub fn from_config(config: &ArchConfig, key: &str, name: &str) -> Result<Self> {
        Activation::from_hf_name(name).ok_or_else(|| {
            config.unsupported(format!(
                "{key} `{name}` (supported: gelu, gelu_new, gelu_pytorch_tanh, gelu_fast, relu, silu)"
            ))
        })
    }

    /// Applies the activation.
    pub fn forward<const D: usize>(self, x: Tensor<D>) -> Tensor<D> {
        match self {
            Activation::Gelu => activation::gelu(x),
            Activation::GeluTanh => gelu_tanh(x),
            Activation::Relu => activation::relu(x),
            Activation::Silu => super::silu(x),
        }
    }

    /// `act(gate) * up`, a gated MLP's inner values: in one pass on the CPU backend for SiLU
    /// and tanh GELU (the same values as the two steps).
    pub fn gated<const D: usize>(self, gate: Tensor<D>, up: Tensor<D>) -> Tensor<D> {
        let fused = match self {
            Activation::Silu => crate::cpu::silu_times(&gate, &up),
            Activation::GeluTanh => crate::cpu::gelu_tanh_times(&gate, &up),
            Activation::Gelu | Activation::Relu => None,
        };
        fused.unwrap_or_else(|| self.forward(gate) * up)
    }
}

/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`: vectorised on the CPU backend
/// (`cpu::gelu_tanh`, and under autodiff `cpu::tracked_gelu_tanh` with its own backward);
/// elsewhere with the cube as two products (burn's `gelu_approximate` computes it with
/// `powf`, several times slower).
fn gelu_tanh<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let fast = crate::cpu::gelu_tanh(&x).or_else(|| crate::cpu::tracked_gelu_tanh(&x));
    if let Some(y) = fast {
        return y;
    }
    let cube = x.clone() * x.clone() * x.clone();
    let inner = (x.clone() + cube * 0.044715) * crate::cpu::SQRT_2_OVER_PI;
    x * (activation::tanh(inner) + 1.0) * 0.5
}

//! The gated MLP of Llama-style decoders (SwiGLU and its kin): `down(act(gate(x)) * up(x))`.

use burn::tensor::Tensor;

use super::{Activation, Linear};
use crate::error::Result;
use crate::weights::WeightScope;

/// The sizes, biases and activation of a gated MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatedMlpSpec {
    /// Hidden size (input and output).
    pub hidden: usize,
    /// Inner size.
    pub inner: usize,
    /// Whether the three projections have biases.
    pub bias: bool,
    /// The gate's activation.
    pub activation: Activation,
}

/// `down(act(gate(x)) * up(x))`.
#[derive(Debug, Clone)]
pub struct GatedMlp {
    gate: Linear,
    up: Linear,
    down: Linear,
    activation: Activation,
}

impl GatedMlp {
    /// The MLP of three `[out, in]` matrices (e.g. one expert's slices of fused tensors).
    pub fn from_out_in([gate, up, down]: [Tensor<2>; 3], activation: Activation) -> Self {
        GatedMlp {
            gate: Linear::from_out_in(gate),
            up: Linear::from_out_in(up),
            down: Linear::from_out_in(down),
            activation,
        }
    }

    /// Loads the scope's `gate_proj`, `up_proj` and `down_proj` (torch layouts).
    pub fn load(mut scope: WeightScope<'_, '_>, spec: &GatedMlpSpec) -> Result<Self> {
        let GatedMlpSpec {
            hidden,
            inner,
            bias,
            activation,
        } = *spec;
        Ok(GatedMlp {
            gate: Linear::load_torch(scope.pp("gate_proj"), hidden, inner, bias)?,
            up: Linear::load_torch(scope.pp("up_proj"), hidden, inner, bias)?,
            down: Linear::load_torch(scope.pp("down_proj"), inner, hidden, bias)?,
            activation,
        })
    }

    /// Applies the MLP to the last axis of `x` (`[B, T, H]`, or `[rows, H]`).
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let gate = self.activation.forward(self.gate.forward(x.clone()));
        self.down.forward(gate * self.up.forward(x))
    }
}

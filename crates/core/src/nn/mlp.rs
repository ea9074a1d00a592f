//! The gated MLP of Llama-style decoders (SwiGLU and its kin): `down(act(gate(x)) * up(x))`.

use burn::tensor::Tensor;

use super::{Activation, FusedLayout, Linear};
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
    pub fn load(scope: WeightScope<'_, '_>, spec: &GatedMlpSpec) -> Result<Self> {
        GatedMlp::load_named(scope, spec, ["gate_proj", "up_proj", "down_proj"])
    }

    /// Loads the scope's gate, up and down projections stored under `names` (Mixtral's experts:
    /// `w1`, `w3`, `w2`).
    pub fn load_named(
        mut scope: WeightScope<'_, '_>,
        spec: &GatedMlpSpec,
        [gate, up, down]: [&str; 3],
    ) -> Result<Self> {
        let GatedMlpSpec {
            hidden,
            inner,
            bias,
            activation,
        } = *spec;
        Ok(GatedMlp {
            gate: Linear::load_torch(scope.pp(gate), hidden, inner, bias)?,
            up: Linear::load_torch(scope.pp(up), hidden, inner, bias)?,
            down: Linear::load_torch(scope.pp(down), inner, hidden, bias)?,
            activation,
        })
    }

    /// Loads the scope's fused `gate_up_proj` (`[2I, H]`, the gate's rows first, split at load)
    /// and `down_proj` (Phi-3).
    pub fn load_fused(mut scope: WeightScope<'_, '_>, spec: &GatedMlpSpec) -> Result<Self> {
        let GatedMlpSpec {
            hidden,
            inner,
            bias,
            activation,
        } = *spec;
        let parts = Linear::split(&[inner, inner], FusedLayout::Blocks);
        let stored = 2 * inner;
        let mut part = |outputs: &[usize]| {
            Linear::load_torch_part(scope.pp("gate_up_proj"), hidden, stored, outputs, bias)
        };
        Ok(GatedMlp {
            gate: part(&parts[0])?,
            up: part(&parts[1])?,
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

//! The MLPs of the decoders, serving their neuron sites: the gated MLP of Llama-style decoders
//! (SwiGLU and its kin), `down(act(gate(x)) * up(x))`, and the plain one of GPT-2, GPT-NeoX and
//! GPT-J, `down(act(up(x)))`.

use burn::tensor::Tensor;

use super::{Activation, FusedLayout, Linear};
use crate::call::Call;
use crate::error::Result;
use crate::schema::{FeedForwardKind, LayerSite, MlpSite, Site};
use crate::weights::WeightScope;

/// Serves `layers.{layer}.mlp_input` with what a feed-forward part reads: the first site every
/// feed-forward part visits.
pub(super) fn serve_mlp_input(
    layer: usize,
    x: Tensor<3>,
    call: &mut Call<'_>,
) -> Result<Tensor<3>> {
    call.visit(Site::layer(layer, LayerSite::MlpInput), x)
}

/// `layers.{layer}.mlp.{site}`.
pub(super) fn mlp_site(layer: usize, site: MlpSite) -> Site {
    Site::layer(layer, LayerSite::Mlp(site))
}

/// `down(act(up(x)))` with biases (GPT-2's `c_fc`/`c_proj`, GPT-NeoX's `dense_h_to_4h`/
/// `dense_4h_to_h`, GPT-J's `fc_in`/`fc_out`).
#[derive(Debug, Clone)]
pub struct PlainMlp {
    up: Linear,
    down: Linear,
    activation: Activation,
}

impl PlainMlp {
    /// The MLP of its two maps (loaded by the adapter, in its checkpoint's layout).
    pub fn new(up: Linear, down: Linear, activation: Activation) -> Self {
        PlainMlp {
            up,
            down,
            activation,
        }
    }

    /// The part's kind, for the layout.
    pub fn kind(&self) -> FeedForwardKind {
        FeedForwardKind::Plain {
            inner: self.down.d_in(),
        }
    }

    /// The MLP on `x` (`[B, T, H]`, what it reads), serving `mlp_input` and the neuron sites of
    /// `layer` in contract order.
    pub fn serve(&self, layer: usize, x: Tensor<3>, call: &mut Call<'_>) -> Result<Tensor<3>> {
        let x = serve_mlp_input(layer, x, call)?;
        let pre = call.visit(mlp_site(layer, MlpSite::PreActivation), self.up.forward(x))?;
        let post = call.visit(
            mlp_site(layer, MlpSite::PostActivation),
            self.activation.forward(pre),
        )?;
        Ok(self.down.forward(post))
    }
}

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

    /// The part's kind, for the layout.
    pub fn kind(&self) -> FeedForwardKind {
        FeedForwardKind::Gated {
            inner: self.down.d_in(),
        }
    }

    /// The MLP on `x` (`[B, T, H]`, what it reads), serving `mlp_input` and the neuron sites of
    /// `layer` in contract order.
    pub fn serve(&self, layer: usize, x: Tensor<3>, call: &mut Call<'_>) -> Result<Tensor<3>> {
        let x = serve_mlp_input(layer, x, call)?;
        let site = |site| mlp_site(layer, site);
        let [gate, up] = Linear::forward_each([&self.gate, &self.up], x);
        let pre = call.visit(site(MlpSite::PreActivation), gate)?;
        let up = call.visit(site(MlpSite::UpProjection), up)?;
        let post = call.visit(
            site(MlpSite::PostActivation),
            self.activation.gated(pre, up),
        )?;
        Ok(self.down.forward(post))
    }

    /// Applies the MLP to the last axis of `x` (`[B, T, H]`, or `[rows, H]`), serving no site
    /// (a mixture's experts).
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let [gate, up] = Linear::forward_each([&self.gate, &self.up], x);
        self.down.forward(self.activation.gated(gate, up))
    }
}

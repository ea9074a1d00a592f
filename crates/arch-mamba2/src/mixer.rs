//! The Mamba-2 mixer, shared by Mamba-2 and the Mamba-2 layers of hybrids (Bamba):
//! `in_proj` → gate `z`, `xBC`, `dt`; causal depthwise convolution over `xBC` (window carried);
//! activation; split into `x`, `B`, `C` (`B` and `C` shared by the heads of each of `n_groups`
//! groups); `dt = softplus(dt + dt_bias)`; the scan with `A = -exp(A_log)`; the `D` skip; the
//! gated RMSNorm `norm(y * silu(z))`; `out_proj`.
//!
//! Sites (`layers.{i}.self_attn.*`): `state_input`, `state_output` `[B, NH, P, N]`, then
//! `attention_head_outputs` `[B, T, NH, P]` (scan output with the `D` skip, before the gated
//! norm).

use hookscope_core::burn::tensor::{Tensor, activation};
use hookscope_core::nn::{
    Activation, CausalConv1d, GatedRmsNorm, Linear, Mixer, Recurrence, RecurrentSites,
};
use hookscope_core::schema::{MixerKind, MixerNamespace};
use hookscope_core::weights::WeightScope;
use hookscope_core::{ArchConfig, Call, MixerSite, Result, Site};

use crate::ssd::{self, ScanInputs};

/// The sizes and options of a Mamba-2 mixer, as a config declares them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MixerSpec {
    /// Hidden size.
    pub hidden: usize,
    /// Heads (`NH`).
    pub heads: usize,
    /// Head dimension (`P`).
    pub head_dim: usize,
    /// Groups sharing `B` and `C`.
    pub groups: usize,
    /// State size (`N`).
    pub state: usize,
    /// Convolution width.
    pub conv_kernel: usize,
    /// Chunk length of the prompt call's scan.
    pub chunk: usize,
    /// Biases on `in_proj` and `out_proj`.
    pub proj_bias: bool,
    /// Bias on the convolution.
    pub conv_bias: bool,
    /// The activation after the convolution.
    pub activation: Activation,
    /// Epsilon of the gated norm.
    pub eps: f64,
    /// `time_step_limit`: the bounds `dt` is clamped to in the chunked scan.
    pub dt_limit: (f64, f64),
}

impl MixerSpec {
    /// Inner size (`NH * P`).
    pub fn inner(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Channels of the convolution: `x`, `B` and `C`.
    fn conv_channels(&self) -> usize {
        self.inner() + 2 * self.groups * self.state
    }

    /// The mixer kind the layout declares.
    pub fn kind(&self) -> MixerKind {
        MixerKind::Mamba2 {
            heads: self.heads,
            head_dim: self.head_dim,
            state: self.state,
        }
    }

    /// Refuses sizes the mixer cannot run: `expand * hidden` must equal `heads * head_dim`
    /// (what transformers checks), heads must split evenly into groups, sizes be nonzero and
    /// `time_step_limit` be an interval.
    pub fn check(&self, config: &ArchConfig, expand: usize) -> Result<()> {
        let sizes = [
            self.heads,
            self.head_dim,
            self.groups,
            self.state,
            self.chunk,
        ];
        if sizes.contains(&0) || self.conv_kernel == 0 {
            return Err(config.unsupported(
                "heads, head_dim, n_groups, state_size, chunk_size and conv_kernel must be nonzero",
            ));
        }
        if expand.checked_mul(self.hidden) != Some(self.inner()) {
            return Err(config.unsupported(format!(
                "expand {expand} x hidden_size {} is not heads {} x head_dim {}",
                self.hidden, self.heads, self.head_dim
            )));
        }
        if !self.heads.is_multiple_of(self.groups) {
            return Err(config.unsupported(format!(
                "{} heads do not split into {} groups",
                self.heads, self.groups
            )));
        }
        let (low, high) = self.dt_limit;
        if low.is_nan() || high.is_nan() || low > high {
            return Err(config.unsupported(format!(
                "time_step_limit [{low}, {high}] is not an interval (low <= high)"
            )));
        }
        Ok(())
    }
}

/// A loaded Mamba-2 mixer of one layer.
#[derive(Debug, Clone)]
pub struct Mamba2Mixer {
    layer: usize,
    spec: MixerSpec,
    in_proj: Linear,
    conv: CausalConv1d,
    dt_bias: Tensor<1>,
    /// `-exp(A_log)`, `[NH]`.
    a: Tensor<1>,
    d: Tensor<1>,
    norm: GatedRmsNorm,
    out_proj: Linear,
}

impl Mamba2Mixer {
    /// Loads the mixer of `layer` stored under `scope` (`backbone.layers.3.mixer`).
    pub fn load(mut scope: WeightScope<'_, '_>, layer: usize, spec: MixerSpec) -> Result<Self> {
        let (hidden, inner, heads) = (spec.hidden, spec.inner(), spec.heads);
        let projected = inner + spec.conv_channels() + heads;
        let a_log: Tensor<1> = scope.tensor("A_log", [heads])?;
        Ok(Mamba2Mixer {
            layer,
            in_proj: Linear::load_torch(scope.pp("in_proj"), hidden, projected, spec.proj_bias)?,
            conv: CausalConv1d::load(
                scope.pp("conv1d"),
                spec.conv_channels(),
                spec.conv_kernel,
                spec.conv_bias,
            )?,
            dt_bias: scope.tensor("dt_bias", [heads])?,
            a: a_log.exp().neg(),
            d: scope.tensor("D", [heads])?,
            norm: GatedRmsNorm::load(scope.pp("norm"), inner, spec.groups, spec.eps)?,
            out_proj: Linear::load_torch(scope.pp("out_proj"), inner, hidden, spec.proj_bias)?,
            spec,
        })
    }
}

/// One call's chunked scan of a layer: its inputs, the chunk length and the layer's `D`.
struct Ssd<'m> {
    inputs: ScanInputs,
    chunk: usize,
    state_size: usize,
    d: &'m Tensor<1>,
}

/// The scan output `y` `[B, T, NH, P]` with the `D` skip over the inputs `x`.
fn skip(y: Tensor<4>, x: Tensor<4>, d: &Tensor<1>) -> Tensor<4> {
    let heads = x.dims()[2];
    y + x * d.clone().reshape([1, 1, heads, 1])
}

impl Recurrence<4> for Ssd<'_> {
    type Output = Tensor<4>;

    fn zero_state(&self) -> Tensor<4> {
        let [batch, _, heads, head_dim] = self.inputs.x.dims();
        let shape = [batch, heads, head_dim, self.state_size];
        Tensor::zeros(shape, &self.inputs.x.device())
    }

    fn step(&self, state: Tensor<4>) -> Tensor<4> {
        ssd::step(&self.inputs, state)
    }

    fn read_out(&self, state: &Tensor<4>) -> Tensor<4> {
        let y = ssd::read_out(state, &self.inputs.c);
        skip(y, self.inputs.x.clone(), self.d)
    }

    fn scan(self, state: Tensor<4>) -> Result<(Tensor<4>, Tensor<4>)> {
        let x = self.inputs.x.clone();
        let (y, state) = ssd::chunked(self.inputs, state, self.chunk);
        Ok((skip(y, x, self.d), state))
    }
}

impl Mixer for Mamba2Mixer {
    fn kind(&self) -> MixerKind {
        self.spec.kind()
    }

    /// The mixer on normalised `x` `[B, T, H]`, serving its sites; returns `[B, T, H]`.
    fn mix(&self, x: Tensor<3>, call: &mut Call<'_>) -> Result<Tensor<3>> {
        let [batch, tokens, _] = x.dims();
        let spec = &self.spec;
        let (inner, heads, head_dim) = (spec.inner(), spec.heads, spec.head_dim);
        let channels = spec.conv_channels();
        // Padding positions feed zeros to the convolution and the scan. They are zeroed after
        // the projection: transformers zeroes its input, which lets a biased `in_proj` leak
        // into the convolution window, so that a padded prompt's values would depend on its
        // batch (the contract says they equal the prompt alone).
        let real = call.token_mask().unsqueeze_dim::<3>(2);
        let projected = self.in_proj.forward(x);
        let gate = projected.clone().slice_dim(2, 0..inner);
        let xbc = projected.clone().slice_dim(2, inner..inner + channels) * real.clone();
        let dt = projected.slice_dim(2, inner + channels..inner + channels + heads);

        let sites = RecurrentSites {
            layer: self.layer,
            namespace: MixerNamespace::SelfAttn,
        };
        let y = sites.run(&self.conv, xbc, call, |conv_out, warm, _| {
            let xbc = spec.activation.forward(conv_out) * real;
            let xs = xbc
                .clone()
                .slice_dim(2, 0..inner)
                .reshape([batch, tokens, heads, head_dim]);
            let grouped = spec.groups * spec.state;
            let per_group = [batch, tokens, spec.groups, spec.state];
            let b = xbc
                .clone()
                .slice_dim(2, inner..inner + grouped)
                .reshape(per_group);
            let c = xbc
                .slice_dim(2, inner + grouped..inner + 2 * grouped)
                .reshape(per_group);

            // transformers clamps dt to `time_step_limit` in the chunked scan only, not in the
            // one-token update of a warm cache.
            let decode = tokens == 1 && warm;
            let dt = activation::softplus(dt + self.dt_bias.clone().unsqueeze::<3>(), 1.0);
            let dt = match spec.dt_limit {
                (low, high) if !decode && (low > 0.0 || high.is_finite()) => dt.clamp(low, high),
                _ => dt,
            };
            Ok(Ssd {
                inputs: ScanInputs {
                    x: xs,
                    dt,
                    a: self.a.clone(),
                    b,
                    c,
                },
                chunk: spec.chunk,
                state_size: spec.state,
                d: &self.d,
            })
        })?;
        let y = call.visit(
            Site::self_attn(self.layer, MixerSite::AttentionHeadOutputs),
            y,
        )?;
        let y = self.norm.forward(y.reshape([batch, tokens, inner]), gate);
        Ok(self.out_proj.forward(y))
    }
}

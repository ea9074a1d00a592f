//! The Gated DeltaNet mixer shared by Qwen3-Next, Qwen3.5 and Qwen3.5-MoE: projections to
//! `q`, `k`, `v` (one causal depthwise convolution over the three, window carried), `z`, `b`,
//! `a`; SiLU; L2-normalised `q` and `k`, key heads expanded to the value heads;
//! `β = sigmoid(b)`, `g = -exp(A_log) · softplus(a + dt_bias)`; the gated delta rule; an RMSNorm
//! per head gated by `silu(z)`; `out_proj`.
//!
//! Sites (`layers.{i}.linear_attn.*`): `attention_queries`, `attention_keys` `[B, NV, T, DK]`
//! (normalised and expanded, queries without the rule's `1/sqrt(DK)`), `attention_values`
//! `[B, NV, T, DV]`, `state_input`, `state_output` `[B, NV, DK, DV]`, `attention_head_outputs`
//! `[B, T, NV, DV]` (before the gated norm).

use hookscope_core::burn::tensor::{Tensor, activation};
use hookscope_core::nn::{
    Activation, CausalConv1d, Linear, Mixer, Recurrence, RecurrentSites, RmsNorm, silu,
};
use hookscope_core::schema::{LayerSite, MixerKind, MixerNamespace};
use hookscope_core::weights::WeightScope;
use hookscope_core::{ArchConfig, Call, MixerSite, Result, Site};

use crate::delta_rule::{self, RuleInputs};

/// Epsilon of the L2 normalisation of queries and keys (fixed in transformers' kernels).
const L2_EPS: f64 = 1e-6;

/// The sizes and options of a Gated DeltaNet mixer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeltaNetSpec {
    /// Hidden size.
    pub hidden: usize,
    /// Key heads (`NK`).
    pub key_heads: usize,
    /// Value heads (`NV`, a multiple of `NK`).
    pub value_heads: usize,
    /// Key head dimension (`DK`).
    pub key_head_dim: usize,
    /// Value head dimension (`DV`).
    pub value_head_dim: usize,
    /// Convolution width.
    pub conv_kernel: usize,
    /// The activation after the convolution.
    pub activation: Activation,
    /// Epsilon of the gated norm.
    pub eps: f64,
}

/// How a checkpoint stores the input projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProjectionLayout {
    /// Qwen3-Next: `in_proj_qkvz` and `in_proj_ba`, rows grouped per key head.
    Grouped,
    /// Qwen3.5: `in_proj_qkv` (`[q | k | v]`), `in_proj_z`, `in_proj_b`, `in_proj_a`.
    Separate,
}

impl DeltaNetSpec {
    fn key_dim(&self) -> usize {
        self.key_heads * self.key_head_dim
    }

    fn value_dim(&self) -> usize {
        self.value_heads * self.value_head_dim
    }

    fn conv_channels(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// The mixer kind the layout declares.
    pub fn kind(&self) -> MixerKind {
        MixerKind::GatedDeltaNet {
            value_heads: self.value_heads,
            key_head_dim: self.key_head_dim,
            value_head_dim: self.value_head_dim,
        }
    }

    /// Refuses sizes the mixer cannot run.
    pub fn check(&self, config: &ArchConfig) -> Result<()> {
        let sizes = [
            self.key_heads,
            self.value_heads,
            self.key_head_dim,
            self.value_head_dim,
            self.conv_kernel,
        ];
        if sizes.contains(&0) {
            return Err(config.unsupported("linear-attention sizes must be nonzero"));
        }
        if !self.value_heads.is_multiple_of(self.key_heads) {
            return Err(config.unsupported(format!(
                "linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
                self.value_heads, self.key_heads
            )));
        }
        Ok(())
    }
}

/// A loaded Gated DeltaNet mixer of one layer.
#[derive(Debug, Clone)]
pub struct GatedDeltaNet {
    layer: usize,
    spec: DeltaNetSpec,
    in_proj_qkv: Linear,
    in_proj_z: Linear,
    in_proj_b: Linear,
    in_proj_a: Linear,
    conv: CausalConv1d,
    dt_bias: Tensor<1>,
    /// `-exp(A_log)`, `[NV]`.
    a: Tensor<1>,
    norm: RmsNorm,
    out_proj: Linear,
}

impl GatedDeltaNet {
    /// Loads the mixer of `layer` stored under `scope` (`model.layers.0.linear_attn`).
    pub fn load(
        mut scope: WeightScope<'_, '_>,
        (layer, layout): (usize, ProjectionLayout),
        spec: DeltaNetSpec,
    ) -> Result<Self> {
        let (hidden, heads) = (spec.hidden, spec.value_heads);
        let [qkv, z, b, a] = match layout {
            ProjectionLayout::Separate => {
                let mut separate = |rows: usize, part: &str| {
                    scope.tensor(&format!("{part}.weight"), [rows, hidden])
                };
                [
                    separate(spec.conv_channels(), "in_proj_qkv")?,
                    separate(spec.value_dim(), "in_proj_z")?,
                    separate(heads, "in_proj_b")?,
                    separate(heads, "in_proj_a")?,
                ]
            }
            ProjectionLayout::Grouped => grouped_projections(&mut scope, &spec)?,
        };
        let a_log: Tensor<1> = scope.tensor("A_log", [heads])?;
        Ok(GatedDeltaNet {
            layer,
            in_proj_qkv: Linear::from_out_in(qkv),
            in_proj_z: Linear::from_out_in(z),
            in_proj_b: Linear::from_out_in(b),
            in_proj_a: Linear::from_out_in(a),
            conv: CausalConv1d::load(
                scope.pp("conv1d"),
                spec.conv_channels(),
                spec.conv_kernel,
                false,
            )?,
            dt_bias: scope.tensor("dt_bias", [heads])?,
            a: a_log.exp().neg(),
            norm: RmsNorm::load(scope.pp("norm"), spec.value_head_dim, spec.eps)?,
            out_proj: Linear::load_torch(scope.pp("out_proj"), spec.value_dim(), hidden, false)?,
            spec,
        })
    }
}

impl Recurrence<4> for RuleInputs {
    type Output = Tensor<4>;

    fn zero_state(&self) -> Tensor<4> {
        let [batch, heads, _, dk] = self.k.dims();
        let dv = self.v.dims()[3];
        Tensor::zeros([batch, heads, dk, dv], &self.v.device())
    }

    fn step(&self, state: Tensor<4>) -> Tensor<4> {
        delta_rule::step(self, state)
    }

    fn read_out(&self, state: &Tensor<4>) -> Tensor<4> {
        delta_rule::read_out(state, &self.q)
    }

    fn scan(self, state: Tensor<4>) -> Result<(Tensor<4>, Tensor<4>)> {
        delta_rule::chunked(self, state)
    }
}

impl Mixer for GatedDeltaNet {
    fn kind(&self) -> MixerKind {
        self.spec.kind()
    }

    /// The mixer on normalised `x` `[B, T, H]`, serving its sites; returns `[B, T, H]`.
    fn mix(&self, x: Tensor<3>, call: &mut Call<'_>) -> Result<Tensor<3>> {
        let [batch, tokens, _] = x.dims();
        let spec = &self.spec;
        let (heads, dk, dv) = (spec.value_heads, spec.key_head_dim, spec.value_head_dim);
        // Padding positions feed zeros to every projection (as transformers does).
        let x = x * call.token_mask().unsqueeze_dim::<3>(2);
        let projections = [
            &self.in_proj_qkv,
            &self.in_proj_z,
            &self.in_proj_b,
            &self.in_proj_a,
        ];
        let [qkv, z, b, a] = Linear::forward_each(projections, x);
        let z = z.reshape([batch, tokens, heads, dv]);

        let namespace = MixerNamespace::LinearAttn;
        let site = |s| Site::layer(self.layer, LayerSite::Mixer(namespace, s));
        let sites = RecurrentSites {
            layer: self.layer,
            namespace,
        };
        let output = sites.run(&self.conv, qkv, call, |conv_out, _, call| {
            let qkv = spec.activation.forward(conv_out);
            let key_dim = spec.key_dim();
            // [B, T, NK * DK] → [B, NV, T, DK]: value head h reads key head h / (NV / NK).
            let expanded = |t: Tensor<3>| -> Tensor<4> {
                let groups = spec.key_heads;
                let per_key = heads / groups;
                l2_normalise(
                    t.reshape([batch, tokens, groups, 1, dk])
                        .expand([batch, tokens, groups, per_key, dk])
                        .reshape([batch, tokens, heads, dk]),
                )
                .swap_dims(1, 2)
            };
            let q = expanded(qkv.clone().slice_dim(2, 0..key_dim));
            let k = expanded(qkv.clone().slice_dim(2, key_dim..2 * key_dim));
            let v = qkv
                .slice_dim(2, 2 * key_dim..spec.conv_channels())
                .reshape([batch, tokens, heads, dv])
                .swap_dims(1, 2);

            let q = call.visit(site(MixerSite::AttentionQueries), q)?;
            let k = call.visit(site(MixerSite::AttentionKeys), k)?;
            let v = call.visit(site(MixerSite::AttentionValues), v)?;
            let per_head = |t: Tensor<3>| t.swap_dims(1, 2);
            let beta = per_head(activation::sigmoid(b));
            let g = per_head(
                activation::softplus(a + self.dt_bias.clone().unsqueeze::<3>(), 1.0)
                    * self.a.clone().unsqueeze::<3>(),
            );
            Ok(RuleInputs {
                q: q * (dk as f64).powf(-0.5),
                k,
                v,
                beta,
                g,
            })
        })?;
        // [B, NV, T, DV] → [B, T, NV, DV], laid out anew (the reshape through `NV * DV` copies)
        // so that the norm and gate below run on contiguous memory.
        let output = output
            .swap_dims(1, 2)
            .reshape([batch, tokens, spec.value_dim()])
            .reshape([batch, tokens, heads, dv]);
        let output = call.visit(site(MixerSite::AttentionHeadOutputs), output)?;
        let gated = self.norm.forward(output) * silu(z);
        Ok(self
            .out_proj
            .forward(gated.reshape([batch, tokens, spec.value_dim()])))
    }
}

/// `x / sqrt(Σ x² + ε)` over the last axis.
fn l2_normalise(x: Tensor<4>) -> Tensor<4> {
    let norm = (x.clone().powi_scalar(2).sum_dim(3) + L2_EPS).sqrt();
    x / norm
}

/// Qwen3-Next's `in_proj_qkvz` and `in_proj_ba`, rows grouped per key head
/// (`[q_g | k_g | v of its value heads | z of its value heads]`, `[b of its value heads | a of
/// them]`), reordered into the separate `[q | k | v]`, `z`, `b`, `a` matrices.
fn grouped_projections(
    scope: &mut WeightScope<'_, '_>,
    spec: &DeltaNetSpec,
) -> Result<[Tensor<2>; 4]> {
    let (hidden, groups) = (spec.hidden, spec.key_heads);
    let (dk, per_key) = (spec.key_head_dim, spec.value_heads / spec.key_heads);
    let values = per_key * spec.value_head_dim;
    let width = 2 * dk + 2 * values;
    let qkvz: Tensor<2> = scope.tensor("in_proj_qkvz.weight", [groups * width, hidden])?;
    let ba: Tensor<2> = scope.tensor("in_proj_ba.weight", [groups * 2 * per_key, hidden])?;
    let qkvz = qkvz.reshape([groups, width, hidden]);
    let rows = |t: &Tensor<3>, range: std::ops::Range<usize>| -> Tensor<2> {
        let count = groups * range.len();
        t.clone().slice_dim(1, range).reshape([count, hidden])
    };
    let q = rows(&qkvz, 0..dk);
    let k = rows(&qkvz, dk..2 * dk);
    let v = rows(&qkvz, 2 * dk..2 * dk + values);
    let z = rows(&qkvz, 2 * dk + values..width);
    let ba = ba.reshape([groups, 2 * per_key, hidden]);
    Ok([
        Tensor::cat(vec![q, k, v], 0),
        z,
        rows(&ba, 0..per_key),
        rows(&ba, per_key..2 * per_key),
    ])
}

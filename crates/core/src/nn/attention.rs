//! Softmax attention with a key/value cache, grouped-query heads and all six interior sites.
//!
//! Four paths give the same numbers: when no request reads or writes the scores or
//! probabilities (they are then not served at all: interior sites nobody observes may be computed
//! by a fused kernel), on the CPU a decode step reads the cache in place (`cpu::decode_attention`)
//! and a prompt call runs `cpu::prompt_attention`; on other backends calls use burn's fused
//! `attention`; otherwise an explicit one (scores, mask, softmax, weighted values), whose
//! scores and weighted values have CPU kernels too (`cpu::attention_scores`,
//! `cpu::weighted_values`; uncapped scores only) and whose softmax is [`super::softmax_last`].

use burn::tensor::Tensor;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;

use super::{FusedLayout, Linear, RmsNorm, Rotary};
use crate::cache::KvCache;
use crate::call::Call;
use crate::config::AttentionHeads;
use crate::cpu;
use crate::error::Result;
use crate::schema::{MixerKind, MixerSite, Site};
use crate::weights::WeightScope;

/// How a layer's scores `Q Kᵀ` are shaped before the softmax. The default is plain attention:
/// scaled by `1/sqrt(D)`, no cap, every earlier key visible.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ScoreRules {
    /// The factor on `Q Kᵀ` (Gemma's `query_pre_attn_scalar^-0.5`, GPT-2's per-layer
    /// scalings); `None`: `1/sqrt(D)`.
    pub scale: Option<f64>,
    /// Soft-capping after the scale, before the mask: `cap · tanh(s / cap)` (Gemma 2).
    pub softcap: Option<f64>,
    /// A sliding window: a query sees the `window` newest keys up to and including itself, the
    /// others are masked (the key axis still holds the whole context).
    pub window: Option<usize>,
}

/// The place, shape and scaling of one softmax-attention layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SoftmaxAttention {
    layer: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    scale: f64,
    softcap: Option<f64>,
    window: Option<usize>,
}

impl SoftmaxAttention {
    /// The attention of `layer` (its sites are `layers.{layer}.self_attn.*`) with these heads,
    /// its scores shaped by `rules`.
    pub fn new(layer: usize, heads: AttentionHeads, rules: ScoreRules) -> Self {
        SoftmaxAttention {
            layer,
            heads: heads.heads,
            kv_heads: heads.kv_heads,
            head_dim: heads.head_dim,
            scale: rules
                .scale
                .unwrap_or_else(|| (heads.head_dim as f64).powf(-0.5)),
            softcap: rules.softcap,
            window: rules.window,
        }
    }

    /// The mixer kind a layout declares for this layer.
    pub fn kind(&self) -> MixerKind {
        MixerKind::SoftmaxAttention {
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            output_gate: false,
        }
    }

    /// The sliding window, if the layer has one.
    pub fn window(&self) -> Option<usize> {
        self.window
    }

    /// Its query and key/value heads and their size.
    pub fn heads(&self) -> AttentionHeads {
        AttentionHeads {
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
        }
    }

    /// Attends this call's `queries` `[B, NH, T, D]` (rotary already applied) over the layer's
    /// cache extended by `keys` and `values` `[B, NKV, T, D]`, serving the mixer sites in
    /// contract order, and returns the merged head outputs `[B, T, NH * D]` for the output
    /// projection.
    pub fn forward(
        &self,
        queries: Tensor<4>,
        keys: Tensor<4>,
        values: Tensor<4>,
        call: &mut Call<'_>,
    ) -> Result<Tensor<3>> {
        let site = |mixer_site| Site::self_attn(self.layer, mixer_site);
        let queries = call.visit(site(MixerSite::AttentionQueries), queries)?;
        let (keys, values) = call.state::<KvCache>(self.layer)?.append(keys, values);
        let (keys_site, values_site) = (
            site(MixerSite::AttentionKeys),
            site(MixerSite::AttentionValues),
        );
        let written = call.writes(keys_site) || call.writes(values_site);
        let keys = call.visit(keys_site, keys)?;
        let values = call.visit(values_site, values)?;
        if written {
            // The cache holds what flows on. (A view a read keeps is safe as it is: the next
            // append copies the shared buffer before writing to it.)
            call.state::<KvCache>(self.layer)?
                .store(keys.clone(), values.clone());
        }

        let [batch, heads, tokens, _] = queries.dims();
        let positions = keys.dims()[2];
        let mask = call.attention_mask_within(self.window);

        let explicit = call.observes(site(MixerSite::AttentionScores))
            || call.observes(site(MixerSite::AttentionProbabilities));
        let scale = self.scale as f32;
        // The CPU kernels compute uncapped scores.
        let fused = match explicit || self.softcap.is_some() {
            true => None,
            false => cpu::decode_attention(&queries, &keys, &values, &mask, scale)
                .or_else(|| cpu::prompt_attention(&queries, &keys, &values, &mask, scale)),
        };
        let head_outputs = match fused {
            Some(head_outputs) => head_outputs,
            None if explicit => {
                // On the CPU the scores and the weighted values have kernels of their own
                // (uncapped scores only); the softmax between them is `softmax_last`'s.
                let scores = match self.softcap {
                    None => cpu::attention_scores(&queries, &keys, &mask, scale),
                    Some(_) => None,
                };
                let scores = scores.unwrap_or_else(|| {
                    let keys = self.repeat_kv(keys.clone());
                    let scores = queries.matmul(keys.swap_dims(2, 3)) * self.scale;
                    let scores = match self.softcap {
                        Some(cap) => super::soft_cap(scores, cap),
                        None => scores,
                    };
                    let mask = mask.expand([batch, heads, tokens, positions]);
                    scores.mask_fill(mask, f32::NEG_INFINITY)
                });
                let scores = call.visit(site(MixerSite::AttentionScores), scores)?;
                let probabilities = super::softmax_last(scores);
                let probabilities =
                    call.visit(site(MixerSite::AttentionProbabilities), probabilities)?;
                cpu::weighted_values(&probabilities, &values)
                    .unwrap_or_else(|| probabilities.matmul(self.repeat_kv(values)))
            }
            None => {
                let (keys, values) = (self.repeat_kv(keys), self.repeat_kv(values));
                let mask = mask.expand([batch, heads, tokens, positions]);
                let options = AttentionModuleOptions {
                    scale: Some(self.scale),
                    softcap: self.softcap,
                    ..Default::default()
                };
                attention(queries, keys, values, Some(mask), None, options)
            }
        };
        let head_outputs = call.visit(
            site(MixerSite::AttentionHeadOutputs),
            head_outputs.swap_dims(1, 2),
        )?;
        Ok(head_outputs.reshape([batch, tokens, heads * self.head_dim]))
    }

    /// `[B, NKV, S, D]` → `[B, NH, S, D]`, each key/value head shared by its query group.
    fn repeat_kv(&self, x: Tensor<4>) -> Tensor<4> {
        let group = self.heads / self.kv_heads;
        if group == 1 {
            return x;
        }
        let [batch, kv_heads, positions, dim] = x.dims();
        x.unsqueeze_dim::<5>(2)
            .expand([batch, kv_heads, group, positions, dim])
            .reshape([batch, kv_heads * group, positions, dim])
    }
}

/// How a layer stores its query, key and value projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkvWeights {
    /// `q_proj`, `k_proj` and `v_proj`.
    Separate,
    /// One matrix of this name holding the three, laid out so (Phi-3: `qkv_proj` in blocks;
    /// GPT-NeoX: `query_key_value` per head), split into three at load.
    Fused(&'static str, FusedLayout),
}

/// The shape of a Llama-style attention layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProjectedAttentionSpec {
    /// The layer it belongs to.
    pub layer: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Query and key/value heads and their size.
    pub heads: AttentionHeads,
    /// Biases on the query, key and value projections.
    pub qkv_bias: bool,
    /// Bias on the output projection.
    pub o_bias: bool,
    /// How the query, key and value projections are stored.
    pub qkv: QkvWeights,
    /// The output projection's name (`o_proj`; GPT-NeoX: `dense`).
    pub output: &'static str,
    /// RMSNorm of queries and keys before the rotary (`q_norm`, `k_norm`), if any.
    pub qk_norm: Option<QkNorm>,
    /// Whether `q_proj` also yields an output gate (per head `[query | gate]`):
    /// `sigmoid(gate)` scales the merged head outputs before `o_proj` (Qwen3-Next).
    pub output_gate: bool,
    /// How the scores are scaled, capped and windowed.
    pub scores: ScoreRules,
}

impl ProjectedAttentionSpec {
    /// Plain attention of `layer` in a model of `hidden` size: separate `q_proj` ... `o_proj`,
    /// no biases, norms or gate, [`ScoreRules::default`]. Set the fields that differ with
    /// struct update syntax.
    pub fn new(layer: usize, hidden: usize, heads: AttentionHeads) -> Self {
        ProjectedAttentionSpec {
            layer,
            hidden,
            heads,
            qkv: QkvWeights::Separate,
            output: "o_proj",
            qkv_bias: false,
            o_bias: false,
            qk_norm: None,
            output_gate: false,
            scores: ScoreRules::default(),
        }
    }
}

/// How queries and keys are normalised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QkNorm {
    /// Epsilon.
    pub eps: f64,
    /// Whether the stored weights are zero-centred (the scale is `1 + weight`).
    pub unit_offset: bool,
    /// What one normalisation covers.
    pub span: QkNormSpan,
}

/// The vectors a query/key norm normalises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNormSpan {
    /// Each head's (Qwen3, Gemma 3: weights of the head size).
    PerHead,
    /// The whole projection's, all heads at once (OLMo-2: weights of the projection's size).
    Projection,
}

/// Softmax attention behind query, key, value and output maps (stored apart, or fused and split
/// at load: [`QkvWeights`]), with rotary positions on queries and keys (Llama, Mistral, Qwen2,
/// GPT-NeoX, Phi-3, the attention layers of hybrids such as Bamba), optionally with query/key
/// norms (per head or over the whole projection) and an output gate (Qwen3-Next's gated
/// attention).
#[derive(Debug, Clone)]
pub struct ProjectedAttention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    qk_norm: Option<((RmsNorm, RmsNorm), QkNormSpan)>,
    output_gate: bool,
    attention: SoftmaxAttention,
}

impl ProjectedAttention {
    /// Loads the scope's `q_proj` ... `o_proj` (torch layouts).
    pub fn load(mut scope: WeightScope<'_, '_>, spec: &ProjectedAttentionSpec) -> Result<Self> {
        let ProjectedAttentionSpec {
            layer,
            hidden,
            heads,
            qkv,
            output,
            qkv_bias,
            o_bias,
            qk_norm,
            output_gate,
            scores,
        } = *spec;
        let head_dim = heads.head_dim;
        let query_width = if output_gate { 2 } else { 1 } * heads.heads * head_dim;
        let kv_width = heads.kv_heads * head_dim;
        let qk_norm = match qk_norm {
            None => None,
            Some(QkNorm {
                eps,
                unit_offset,
                span,
            }) => {
                let mut norm = |part: &str, width: usize| {
                    let size = match span {
                        QkNormSpan::PerHead => head_dim,
                        QkNormSpan::Projection => width,
                    };
                    if unit_offset {
                        RmsNorm::load_unit_offset(scope.pp(part), size, eps)
                    } else {
                        RmsNorm::load(scope.pp(part), size, eps)
                    }
                };
                // The queries' width, without an output gate's half.
                let queries = heads.heads * head_dim;
                let norms = (norm("q_norm", queries)?, norm("k_norm", kv_width)?);
                Some((norms, span))
            }
        };
        let widths = [query_width, kv_width, kv_width];
        let [q_proj, k_proj, v_proj] = match qkv {
            QkvWeights::Separate => {
                let mut linear =
                    |part: &str, width| Linear::load_torch(scope.pp(part), hidden, width, qkv_bias);
                [
                    linear("q_proj", widths[0])?,
                    linear("k_proj", widths[1])?,
                    linear("v_proj", widths[2])?,
                ]
            }
            QkvWeights::Fused(name, layout) => {
                let stored = widths.iter().sum();
                let parts = Linear::split(&widths, layout);
                let mut part = |outputs: &[usize]| {
                    Linear::load_torch_part(scope.pp(name), hidden, stored, outputs, qkv_bias)
                };
                [part(&parts[0])?, part(&parts[1])?, part(&parts[2])?]
            }
        };
        Ok(ProjectedAttention {
            q_proj,
            k_proj,
            v_proj,
            o_proj: Linear::load_torch(scope.pp(output), heads.heads * head_dim, hidden, o_bias)?,
            qk_norm,
            output_gate,
            attention: SoftmaxAttention::new(layer, heads, scores),
        })
    }

    /// The sliding window, if the layer has one.
    pub fn window(&self) -> Option<usize> {
        self.attention.window
    }

    /// The mixer kind a layout declares for this layer.
    pub fn kind(&self) -> MixerKind {
        match self.attention.kind() {
            MixerKind::SoftmaxAttention {
                heads,
                kv_heads,
                head_dim,
                ..
            } => MixerKind::SoftmaxAttention {
                heads,
                kv_heads,
                head_dim,
                output_gate: self.output_gate,
            },
            other => other,
        }
    }

    /// Attends normalised `x` `[B, T, H]` with the call's rotary `(cos, sin)` (see
    /// [`Rotary::cos_sin`]), serving the layer's attention sites; returns `[B, T, H]`.
    pub fn forward(
        &self,
        x: Tensor<3>,
        rotary: &(Tensor<4>, Tensor<4>),
        call: &mut Call<'_>,
    ) -> Result<Tensor<3>> {
        let [batch, tokens, _] = x.dims();
        let attention = &self.attention;
        let (heads, head_dim) = (attention.heads, attention.head_dim);
        // [B, T, heads * D] → [B, T, heads, D], and back.
        let per_head = |x: Tensor<3>, heads: usize| -> Tensor<4> {
            x.reshape([batch, tokens, heads, head_dim])
        };
        let whole = |x: Tensor<4>| -> Tensor<3> {
            let [.., heads, _] = x.dims();
            x.reshape([batch, tokens, heads * head_dim])
        };
        let [q, k, v] = Linear::forward_each([&self.q_proj, &self.k_proj, &self.v_proj], x);
        let (q, gate) = if self.output_gate {
            let both = q.reshape([batch, tokens, heads, 2 * head_dim]);
            let gate = both.clone().slice_dim(3, head_dim..2 * head_dim);
            (both.slice_dim(3, 0..head_dim), Some(gate))
        } else {
            (per_head(q, heads), None)
        };
        let k = per_head(k, attention.kv_heads);
        let v = per_head(v, attention.kv_heads);
        let (q, k) = match &self.qk_norm {
            Some(((q_norm, k_norm), QkNormSpan::PerHead)) => (q_norm.forward(q), k_norm.forward(k)),
            Some(((q_norm, k_norm), QkNormSpan::Projection)) => (
                per_head(q_norm.forward(whole(q)), heads),
                per_head(k_norm.forward(whole(k)), attention.kv_heads),
            ),
            None => (q, k),
        };
        let (cos, sin) = rotary;
        let q = Rotary::apply(q.swap_dims(1, 2), cos, sin);
        let k = Rotary::apply(k.swap_dims(1, 2), cos, sin);
        let mixed = attention.forward(q, k, v.swap_dims(1, 2), call)?;
        let mixed = match gate {
            Some(gate) => {
                let site = Site::self_attn(attention.layer, MixerSite::AttentionGate);
                mixed * whole(call.visit(site, super::sigmoid(gate))?)
            }
            None => mixed,
        };
        super::project_heads(attention.layer, heads, mixed, &self.o_proj, call)
    }
}

//! `config.json` of Llama-family checkpoints, and what of it this adapter can run: which
//! variant a `model_type` is, and what each variant changes (biases, norms, windows, experts,
//! fused projections, rotary), with transformers 5.24's defaults where a key is absent.

use hookscope_core::config::{AttentionHeads, HeadDim, HeadKeys, layer_windows, sliding_layers};
use hookscope_core::nn::{
    Activation, MoeSpec, QkNorm, QkNormSpan, Rope, RopeParameters, RopeRules, RotaryFraction,
    is_sparse_layer,
};
use hookscope_core::{ArchConfig, Result};
use serde::Deserialize;

/// The checkpoints that run this adapter's code path, by `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// `llama`.
    Llama,
    /// `mistral`: a sliding window on every layer.
    Mistral,
    /// `qwen2`: q/k/v biases, Qwen's windows.
    Qwen2,
    /// `qwen3`: per-head q/k norms, a head size of its own, Qwen's windows.
    Qwen3,
    /// `mixtral`: Mistral with a mixture of experts in every layer.
    Mixtral,
    /// `qwen2_moe`: Qwen2 with experts and a gated shared expert.
    Qwen2Moe,
    /// `qwen3_moe`: Qwen3 with experts.
    Qwen3Moe,
    /// `olmo2`: norms after each part instead of before, q/k norms over whole projections.
    Olmo2,
    /// `phi3`: fused projections, a partial rotary, LongRoPE, a window.
    Phi3,
}

impl Variant {
    /// The variant of a `model_type`, if this adapter runs it.
    pub fn of(model_type: &str) -> Option<Variant> {
        Some(match model_type {
            "llama" => Variant::Llama,
            "mistral" => Variant::Mistral,
            "qwen2" => Variant::Qwen2,
            "qwen3" => Variant::Qwen3,
            "mixtral" => Variant::Mixtral,
            "qwen2_moe" => Variant::Qwen2Moe,
            "qwen3_moe" => Variant::Qwen3Moe,
            "olmo2" => Variant::Olmo2,
            "phi3" => Variant::Phi3,
            _ => return None,
        })
    }

    /// Whether the variant has norms after its parts and none before (OLMo-2).
    pub fn post_norms(self) -> bool {
        self == Variant::Olmo2
    }

    /// Whether the variant fuses q/k/v and gate/up into one matrix each (Phi-3).
    pub fn fused(self) -> bool {
        self == Variant::Phi3
    }

    /// RMSNorm's epsilon where the config names none.
    fn default_eps(self) -> f64 {
        match self {
            Variant::Mixtral | Variant::Olmo2 | Variant::Phi3 => 1e-5,
            _ => 1e-6,
        }
    }
}

/// The fields the forward pass depends on.
#[derive(Debug, Clone, Deserialize)]
pub struct LlamaConfig {
    /// One of [`Variant::of`]'s model types.
    pub model_type: String,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden size.
    pub hidden_size: usize,
    /// MLP inner size (of the dense layers, in a mixture-of-experts model).
    pub intermediate_size: usize,
    /// Blocks.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention); defaults to the query heads.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Head dimension; defaults to `hidden_size / num_attention_heads` (Qwen3: 128).
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Longest sequence.
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon (default per variant).
    #[serde(default)]
    pub rms_norm_eps: Option<f64>,
    /// MLP activation.
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Biases on q/k/v/o (Llama's `attention_bias`; Qwen2 always has q/k/v biases).
    #[serde(default)]
    pub attention_bias: bool,
    /// Qwen2-MoE's q/k/v biases (default true).
    #[serde(default)]
    pub qkv_bias: Option<bool>,
    /// Biases on the MLP projections.
    #[serde(default)]
    pub mlp_bias: bool,
    /// Whether the head shares the embedding table.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// The sliding window (Mistral, Mixtral, Phi-3: every layer's; Qwen: the layers
    /// `layer_types` or `max_window_layers` name, when `use_sliding_window`).
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// Qwen's switch for its sliding window.
    #[serde(default)]
    pub use_sliding_window: bool,
    /// Qwen2/3: the layers below this index attend to the whole context (Qwen2-MoE: the
    /// layers from it on).
    #[serde(default)]
    pub max_window_layers: Option<usize>,
    /// Qwen: `sliding_attention` or `full_attention` per layer.
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// Old-style rotary base.
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// New-style rotary parameters.
    #[serde(default)]
    pub rope_parameters: Option<RopeParameters>,
    /// Old-style rotary scaling.
    #[serde(default)]
    pub rope_scaling: Option<RopeParameters>,
    /// Phi-3's rotated share of each head (top level).
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
    /// Phi-3's pretraining context (top level; it wins over the rotary parameters').
    #[serde(default)]
    pub original_max_position_embeddings: Option<usize>,
    /// Llama 2's tensor-parallel pretraining split (unsupported when > 1).
    #[serde(default)]
    pub pretraining_tp: Option<usize>,
    /// Mixtral's experts (and Qwen3-MoE's, as transformers 5.x saves them).
    #[serde(default)]
    pub num_local_experts: Option<usize>,
    /// Qwen-MoE's experts.
    #[serde(default)]
    pub num_experts: Option<usize>,
    /// Experts per token.
    #[serde(default)]
    pub num_experts_per_tok: Option<usize>,
    /// Each Qwen-MoE expert's inner size.
    #[serde(default)]
    pub moe_intermediate_size: Option<usize>,
    /// Qwen2-MoE's shared expert's inner size (0: none).
    #[serde(default)]
    pub shared_expert_intermediate_size: Option<usize>,
    /// Whether Qwen-MoE renormalises the top-k routing weights.
    #[serde(default)]
    pub norm_topk_prob: bool,
    /// Qwen-MoE: every this-many-th layer is sparse.
    #[serde(default = "default_one")]
    pub decoder_sparse_step: usize,
    /// Qwen-MoE: layers that stay dense.
    #[serde(default)]
    pub mlp_only_layers: Vec<usize>,
}

fn default_act() -> String {
    "silu".into()
}
fn default_one() -> usize {
    1
}

impl LlamaConfig {
    /// The variant; an error naming `model_type` for one this adapter does not run.
    pub fn variant(&self, config: &ArchConfig) -> Result<Variant> {
        Variant::of(&self.model_type).ok_or_else(|| {
            config.unsupported(format!(
                "model_type `{}` is not a Llama-family type",
                self.model_type
            ))
        })
    }

    /// RMSNorm's epsilon.
    pub fn eps(&self, variant: Variant) -> f64 {
        self.rms_norm_eps.unwrap_or(variant.default_eps())
    }

    /// The RMSNorm of queries and keys, if the variant has one: Qwen3's per head, OLMo-2's
    /// over the whole projection.
    pub fn qk_norm(&self, variant: Variant) -> Option<QkNorm> {
        let span = match variant {
            Variant::Qwen3 | Variant::Qwen3Moe => QkNormSpan::PerHead,
            Variant::Olmo2 => QkNormSpan::Projection,
            _ => return None,
        };
        Some(QkNorm {
            eps: self.eps(variant),
            unit_offset: false,
            span,
        })
    }

    /// Whether q/k/v carry biases, and whether o does.
    pub fn attention_biases(&self, variant: Variant) -> (bool, bool) {
        match variant {
            Variant::Qwen2 => (true, false),
            Variant::Qwen2Moe => (self.qkv_bias.unwrap_or(true), false),
            // Mixtral's and Phi-3's projections have none.
            Variant::Mixtral | Variant::Phi3 => (false, false),
            // Qwen3's and OLMo-2's `attention_bias` covers q/k/v/o, as Llama's does.
            _ => (self.attention_bias, self.attention_bias),
        }
    }

    /// The attention heads; refuses what this adapter would get wrong, with the reason.
    pub fn check(&self, config: &ArchConfig, variant: Variant) -> Result<AttentionHeads> {
        let heads = AttentionHeads::check(
            config,
            HeadKeys::LLAMA,
            (
                self.hidden_size,
                self.num_attention_heads,
                self.num_key_value_heads,
            ),
            HeadDim::Declared(match variant {
                Variant::Qwen3 => Some(self.head_dim.unwrap_or(128)),
                _ => self.head_dim,
            }),
        )?;
        if self.pretraining_tp.unwrap_or(1) > 1 {
            return Err(config.unsupported("pretraining_tp > 1"));
        }
        Ok(heads)
    }

    /// Each layer's sliding window, as transformers decides it per variant: Mistral's,
    /// Mixtral's, Phi-3's and (when `use_sliding_window`) Qwen3-MoE's on every layer; Qwen2's
    /// and Qwen3's, when `use_sliding_window`, on the `sliding_attention` layers of
    /// `layer_types` (by default those from `max_window_layers` on); Qwen2-MoE's likewise (by
    /// default the even layers below `max_window_layers`); Llama and OLMo-2 have none.
    pub fn windows(&self, config: &ArchConfig, variant: Variant) -> Result<Vec<Option<usize>>> {
        let layers = self.num_hidden_layers;
        let window = self.sliding_window;
        let qwen = self.use_sliding_window && window.is_some();
        let from_types = |default: &dyn Fn(usize) -> bool| match &self.layer_types {
            Some(types) => sliding_layers(config, types, layers),
            None => Ok((0..layers).map(default).collect()),
        };
        let max_window_layers = self.max_window_layers.unwrap_or(28);
        let sliding = match variant {
            Variant::Mistral | Variant::Mixtral | Variant::Phi3 => vec![window.is_some(); layers],
            Variant::Qwen3Moe => vec![qwen; layers],
            Variant::Qwen2 | Variant::Qwen3 if qwen => from_types(&|i| i >= max_window_layers)?,
            Variant::Qwen2Moe if qwen => from_types(&|i| i % 2 == 0 && i < max_window_layers)?,
            _ => vec![false; layers],
        };
        layer_windows(config, &sliding, window)
    }

    /// The rotary embedding, from `rope_parameters` or the older `rope_theta` and
    /// `rope_scaling` (Phi-3: its `su` and `yarn` types are LongRoPE, as transformers reads
    /// them; its rotary may be partial).
    pub fn rope(&self, config: &ArchConfig, variant: Variant) -> Result<Rope> {
        let phi3 = variant == Variant::Phi3;
        let rules = RopeRules {
            scaled: Some(self.max_position_embeddings),
            original_max_positions: self
                .recompute_beyond(variant)
                .or(self.original_max_position_embeddings),
            theta: self.rope_theta,
            fraction: match phi3 {
                true => RotaryFraction::Configured {
                    legacy: self.partial_rotary_factor,
                    default: 1.0,
                },
                false => RotaryFraction::Full,
            },
        };
        let mut params = self
            .rope_parameters
            .as_ref()
            .or(self.rope_scaling.as_ref())
            .cloned();
        if let Some(params) = params.as_mut().filter(|_| phi3) {
            let kind = params.rope_type.as_ref().or(params.legacy_type.as_ref());
            if matches!(kind.map(String::as_str), Some("su" | "yarn")) {
                params.rope_type = Some("longrope".into());
            }
        }
        Rope::parse(config, params.as_ref(), rules)
    }

    /// The context past which generation recomputes the whole sequence once: Phi-3's
    /// pretraining context, as transformers' `Phi3ForCausalLM` drops its cache there (whatever
    /// the rotary type).
    pub fn recompute_beyond(&self, variant: Variant) -> Option<usize> {
        (variant == Variant::Phi3).then(|| self.original_max_position_embeddings.unwrap_or(4096))
    }

    /// The mixture of experts of layer `i`, if it has one: Mixtral's in every layer; Qwen-MoE's
    /// where [`is_sparse_layer`] says so (sizes absent from the config take transformers'
    /// defaults, as its classes do).
    pub fn moe(&self, variant: Variant, i: usize, activation: Activation) -> Option<MoeSpec> {
        let hidden = self.hidden_size;
        match variant {
            Variant::Mixtral => Some(MoeSpec {
                hidden,
                experts: self.num_local_experts.unwrap_or(8),
                top_k: self.num_experts_per_tok.unwrap_or(2),
                inner: self.intermediate_size,
                shared_inner: None,
                renormalise: true,
                activation,
            }),
            Variant::Qwen2Moe | Variant::Qwen3Moe => {
                let (experts, top_k, inner, shared) = match variant {
                    Variant::Qwen2Moe => (
                        60,
                        4,
                        1408,
                        self.shared_expert_intermediate_size.unwrap_or(5632),
                    ),
                    _ => (128, 8, 768, 0),
                };
                // transformers 5.x saves Qwen3-MoE's count as `num_local_experts`.
                let experts = self
                    .num_experts
                    .or(self.num_local_experts)
                    .unwrap_or(experts);
                let sparse =
                    is_sparse_layer(i, experts, self.decoder_sparse_step, &self.mlp_only_layers);
                match sparse {
                    false => None,
                    true => Some(MoeSpec {
                        hidden,
                        experts,
                        top_k: self.num_experts_per_tok.unwrap_or(top_k),
                        inner: self.moe_intermediate_size.unwrap_or(inner),
                        shared_inner: (shared > 0).then_some(shared),
                        renormalise: self.norm_topk_prob,
                        activation,
                    }),
                }
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use hookscope_core::nn::{Activation, RopeScaling};
    use serde_json::{Value, json};

    use super::*;

    /// A 6-layer config of `model_type` with `extra` keys.
    fn parsed(model_type: &str, extra: Value) -> (ArchConfig, LlamaConfig, Variant) {
        let mut json = json!({"model_type": model_type, "vocab_size": 8, "hidden_size": 8,
            "intermediate_size": 8, "num_hidden_layers": 6, "num_attention_heads": 2,
            "max_position_embeddings": 64});
        json.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let arch = ArchConfig {
            path: "config.json".into(),
            json,
        };
        let parsed: LlamaConfig = arch.parse().unwrap();
        let variant = parsed.variant(&arch).unwrap();
        (arch, parsed, variant)
    }

    fn sliding(model_type: &str, extra: Value) -> Vec<bool> {
        let (arch, config, variant) = parsed(model_type, extra);
        let windows = config.windows(&arch, variant).unwrap();
        windows.iter().map(Option::is_some).collect()
    }

    /// Each variant's windows as transformers 5.24's configs and modeling files place them.
    #[test]
    fn windows_fall_where_each_variant_puts_them() {
        let window = json!({"sliding_window": 4});
        let qwen = json!({"sliding_window": 4, "use_sliding_window": true, "max_window_layers": 4});
        for model_type in ["mistral", "mixtral", "phi3"] {
            assert_eq!(
                sliding(model_type, window.clone()),
                [true; 6],
                "{model_type}"
            );
        }
        assert_eq!(sliding("qwen3_moe", qwen.clone()), [true; 6]);
        assert_eq!(sliding("qwen3_moe", window.clone()), [false; 6]);
        // Qwen2 and Qwen3: from `max_window_layers` on; Qwen2-MoE: the even layers below it.
        assert_eq!(
            sliding("qwen2", qwen.clone()),
            [false, false, false, false, true, true]
        );
        assert_eq!(
            sliding("qwen3", qwen.clone()),
            [false, false, false, false, true, true]
        );
        assert_eq!(
            sliding("qwen2_moe", qwen),
            [true, false, true, false, false, false]
        );
        for model_type in ["llama", "olmo2"] {
            assert_eq!(
                sliding(model_type, window.clone()),
                [false; 6],
                "{model_type}"
            );
        }
    }

    #[test]
    fn sparse_layers_and_expert_counts_follow_the_config() {
        let silu = Activation::Silu;
        let qwen = json!({"num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 2,
            "mlp_only_layers": [3], "moe_intermediate_size": 4});
        let (_, config, variant) = parsed("qwen2_moe", qwen);
        let sparse: Vec<bool> = (0..6)
            .map(|i| config.moe(variant, i, silu).is_some())
            .collect();
        assert_eq!(sparse, [false, true, false, false, false, true]);
        // Qwen2-MoE's shared expert takes transformers' default size when the key is absent.
        assert_eq!(
            config.moe(variant, 1, silu).unwrap().shared_inner,
            Some(5632)
        );
        // Qwen3-MoE as transformers 5.x saves it: the count under `num_local_experts`.
        let (_, config, variant) = parsed("qwen3_moe", json!({"num_local_experts": 16}));
        let moe = config.moe(variant, 0, silu).unwrap();
        assert_eq!((moe.experts, moe.top_k, moe.shared_inner), (16, 8, None));
        let (_, config, variant) = parsed("mixtral", json!({}));
        let moe = config.moe(variant, 5, silu).unwrap();
        assert_eq!((moe.experts, moe.top_k, moe.renormalise), (8, 2, true));
        assert!(config.moe(Variant::Llama, 0, silu).is_none());
    }

    /// Phi-3 reads `su` and `yarn` as LongRoPE, takes its top-level pretraining context (4096
    /// when absent) and recomputes past it; other variants do neither.
    #[test]
    fn phi3_reads_its_rope_aliases_and_recomputes_past_its_context() {
        let factors = json!({"type": "su", "short_factor": [1.0, 1.5], "long_factor": [2.0, 3.0]});
        let (arch, config, variant) = parsed(
            "phi3",
            json!({"rope_scaling": factors,
            "original_max_position_embeddings": 16}),
        );
        let rope = config.rope(&arch, variant).unwrap();
        let RopeScaling::LongRope {
            original_max_positions,
            ..
        } = rope.scaling
        else {
            panic!("{:?}", rope.scaling)
        };
        assert_eq!(original_max_positions, 16);
        assert_eq!(config.recompute_beyond(variant), Some(16));
        let (_, config, variant) = parsed("phi3", json!({}));
        assert_eq!(config.recompute_beyond(variant), Some(4096));
        let (arch, config, variant) = parsed("llama", json!({"rope_scaling": {"type": "su"}}));
        assert_eq!(config.recompute_beyond(variant), None);
        let error = config.rope(&arch, variant).unwrap_err().to_string();
        assert!(error.contains("rope type `su`"), "{error}");
    }
}

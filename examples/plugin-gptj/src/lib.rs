//! # GPT-J, as a hookscope plugin
//!
//! GPT-J-6B (Wang and Komatsuzaki, 2021, `mesh-transformer-jax`): one LayerNorm per block
//! feeding attention and MLP in parallel (`h + attn(ln h) + mlp(ln h)`), rotary positions on the
//! first `rotary_dim` dimensions of each head with GPT-J's interleaved pairs (dimension `2i`
//! rotates with `2i + 1`), bias-free q/k/v/out projections, a GELU MLP with biases, and an
//! untied head with a bias.
//!
//! `GPTJForCausalLM` as `transformers` 5.x stores it: `transformer.wte`, `transformer.h.{i}`,
//! `transformer.ln_f`, `lm_head`. Built as a `cdylib` and loaded at run time: `hookscope
//! --plugin target/debug/libhookscope_plugin_gptj.so conformance`. It uses only
//! hookscope-core's public API, as an out-of-tree adapter would: the shared layers (LayerNorm,
//! linear maps, the attention with its cache and sites, the rotary, the parallel residual
//! block) composed into a model of its own.

use std::cell::OnceCell;

use hookscope_core::burn::tensor::Tensor;
use hookscope_core::config::{AttentionHeads, HeadDim, HeadKeys};
use hookscope_core::nn::{
    Activation, Embedding, LayerNorm, Linear, LmHead, PlainMlp, RopeScaling, Rotary, ScoreRules,
    SoftmaxAttention, parallel_residual_block, project_heads,
};
use hookscope_core::schema::{FeedForwardKind, LayerSpec};
use hookscope_core::{
    ArchConfig, Call, CausalLm, ModelLayout, OutputHead, Result, Site, WeightLoader,
};
use serde::Deserialize;

/// `config.json` of a GPT-J checkpoint (the fields the forward pass depends on).
#[derive(Debug, Clone, Deserialize)]
pub struct GptJConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden size.
    pub n_embd: usize,
    /// Blocks.
    pub n_layer: usize,
    /// Attention heads.
    pub n_head: usize,
    /// MLP inner size (default `4 * n_embd`).
    #[serde(default)]
    pub n_inner: Option<usize>,
    /// Rotated dimensions of each head (`null`: the whole hidden size, as transformers reads
    /// it).
    #[serde(default = "default_rotary_dim")]
    pub rotary_dim: Option<usize>,
    /// LayerNorm epsilon.
    #[serde(default = "default_eps")]
    pub layer_norm_epsilon: f64,
    /// MLP activation.
    #[serde(default = "default_act")]
    pub activation_function: String,
    /// Whether the head shares the embedding table.
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

fn default_rotary_dim() -> Option<usize> {
    Some(64)
}
fn default_eps() -> f64 {
    1e-5
}
fn default_act() -> String {
    "gelu_new".into()
}

/// GPT-J's rotary base.
const THETA: f64 = 10_000.0;

struct Block {
    norm: LayerNorm,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    out_proj: Linear,
    attention: SoftmaxAttention,
    mlp: PlainMlp,
}

/// A loaded GPT-J.
pub struct GptJ {
    layout: ModelLayout,
    rotary: Rotary,
    wte: Embedding,
    blocks: Vec<Block>,
    head: LmHead,
}

impl GptJ {
    /// Builds the model from its config and weights.
    pub fn load(arch_config: &ArchConfig, loader: &mut WeightLoader<'_>) -> Result<Self> {
        let config: GptJConfig = arch_config.parse()?;
        let activation = Activation::from_config(
            arch_config,
            "activation_function",
            &config.activation_function,
        )?;
        let h = config.n_embd;
        let keys = HeadKeys {
            hidden: "n_embd",
            heads: "n_head",
            kv_heads: "n_head",
        };
        let heads =
            AttentionHeads::check(arch_config, keys, (h, config.n_head, None), HeadDim::Split)?;
        let rotary_dim = config.rotary_dim.unwrap_or(h);
        if rotary_dim > heads.head_dim || !rotary_dim.is_multiple_of(2) {
            return Err(arch_config.unsupported(format!(
                "rotary_dim {rotary_dim} must be even and at most the head size {}",
                heads.head_dim
            )));
        }
        if config.tie_word_embeddings {
            return Err(arch_config.unsupported(
                "tie_word_embeddings (GPT-J's head has a bias of its own, and transformers ties \
                 only its weight)",
            ));
        }
        let inner = config.n_inner.unwrap_or(4 * h);
        let eps = config.layer_norm_epsilon;
        let mut transformer = loader.pp("transformer");
        let wte = Embedding::load(transformer.pp("wte"), config.vocab_size, h)?;
        let blocks = (0..config.n_layer)
            .map(|i| {
                let mut block = transformer.pp(format!("h.{i}"));
                let mut projection =
                    |name: &str| Linear::load_torch(block.pp(format!("attn.{name}")), h, h, false);
                Ok(Block {
                    q_proj: projection("q_proj")?,
                    k_proj: projection("k_proj")?,
                    v_proj: projection("v_proj")?,
                    out_proj: projection("out_proj")?,
                    norm: LayerNorm::load(block.pp("ln_1"), h, eps)?,
                    attention: SoftmaxAttention::new(i, heads, ScoreRules::default()),
                    mlp: PlainMlp::new(
                        Linear::load_torch(block.pp("mlp.fc_in"), h, inner, true)?,
                        Linear::load_torch(block.pp("mlp.fc_out"), inner, h, true)?,
                        activation,
                    ),
                })
            })
            .collect::<Result<_>>()?;
        let ln_f = LayerNorm::load(transformer.pp("ln_f"), h, eps)?;
        let lm_head = Linear::load_torch(loader.pp("lm_head"), h, config.vocab_size, true)?;
        let feed_forward = FeedForwardKind::Plain { inner };
        let layer = LayerSpec::attention(heads.heads, heads.heads, heads.head_dim, feed_forward);
        Ok(GptJ {
            layout: ModelLayout::uniform(h, config.vocab_size, layer.parallel(), config.n_layer),
            rotary: Rotary::new(rotary_dim, THETA, RopeScaling::Default),
            wte,
            blocks,
            head: LmHead::new(ln_f, lm_head),
        })
    }
}

impl CausalLm for GptJ {
    fn layout(&self) -> &ModelLayout {
        &self.layout
    }

    fn forward(&self, call: &mut Call<'_>) -> Result<Tensor<3>> {
        let [batch, tokens] = call.dims();
        let embeddings = self.wte.forward(call.input_ids());
        let mut hidden = call.visit(Site::TokenEmbeddings, embeddings)?;
        let (cos, sin) = self.rotary.cos_sin(&call.position_ids());
        for (layer, block) in self.blocks.iter().enumerate() {
            let AttentionHeads {
                heads, head_dim, ..
            } = block.attention.heads();
            // [B, T, H] → [B, heads, T, D].
            let per_head =
                |x: Tensor<3>| x.reshape([batch, tokens, heads, head_dim]).swap_dims(1, 2);
            // Both parts read `ln_1` of the block's input: normalised once, by whichever runs
            // first.
            let normed = OnceCell::new();
            let norm =
                |hidden: Tensor<3>| normed.get_or_init(|| block.norm.forward(hidden)).clone();
            let mixer = |hidden: Tensor<3>, call: &mut Call<'_>| {
                let x = norm(hidden);
                let q = Rotary::apply_interleaved(
                    per_head(block.q_proj.forward(x.clone())),
                    &cos,
                    &sin,
                );
                let k = Rotary::apply_interleaved(
                    per_head(block.k_proj.forward(x.clone())),
                    &cos,
                    &sin,
                );
                let v = per_head(block.v_proj.forward(x));
                let mixed = block.attention.forward(q, k, v, call)?;
                project_heads(layer, heads, mixed, &block.out_proj, call)
            };
            let mlp =
                |hidden: Tensor<3>, call: &mut Call<'_>| block.mlp.serve(layer, norm(hidden), call);
            hidden = parallel_residual_block(layer, hidden, call, mixer, mlp)?;
        }
        Ok(hidden)
    }

    fn output_head(&self) -> &dyn OutputHead {
        &self.head
    }
}

hookscope_core::export_plugin!(
    GptJ,
    name: "gptj",
    model_types: ["gptj"],
    architectures: ["GPTJForCausalLM"],
    tiny_config: r#"{"model_type": "gptj", "vocab_size": 61, "n_embd": 16, "n_inner": 32,
        "n_layer": 2, "n_head": 2, "rotary_dim": 4, "n_positions": 64, "eos_token_id": 60}"#,
);

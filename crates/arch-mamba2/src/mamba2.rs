//! `Mamba2ForCausalLM` as `transformers` 5.x stores it: `backbone.embeddings`,
//! `backbone.layers.{i}.{norm, mixer.*}`, `backbone.norm_f`, and `lm_head` unless tied. Blocks
//! are RMSNorm and a Mamba-2 mixer with a residual, no MLP.

use hookscope_core::burn::tensor::Tensor;
use hookscope_core::config::ConfigFloat;
use hookscope_core::nn::{Activation, Embedding, Linear, LmHead, Mixer, RmsNorm, residual_block};
use hookscope_core::schema::{FeedForwardKind, LayerSpec};
use hookscope_core::{
    ArchConfig, Call, CausalLm, ModelLayout, OutputHead, Result, Site, WeightLoader,
};
use serde::Deserialize;

use crate::mixer::{Mamba2Mixer, MixerSpec};

/// `config.json` of a Mamba-2 checkpoint (the fields the forward pass depends on; defaults as
/// `transformers`' `Mamba2Config`).
#[derive(Debug, Clone, Deserialize)]
pub struct Mamba2Config {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden size.
    pub hidden_size: usize,
    /// Blocks.
    pub num_hidden_layers: usize,
    /// SSM heads (`NH`).
    #[serde(default = "default_heads")]
    pub num_heads: usize,
    /// Head dimension (`P`).
    #[serde(default = "default_head_dim")]
    pub head_dim: usize,
    /// Inner size factor: `expand * hidden_size = num_heads * head_dim`.
    #[serde(default = "default_expand")]
    pub expand: usize,
    /// Groups sharing `B` and `C`.
    #[serde(default = "default_groups")]
    pub n_groups: usize,
    /// State size (`N`).
    #[serde(default = "default_state")]
    pub state_size: usize,
    /// Convolution width.
    #[serde(default = "default_kernel")]
    pub conv_kernel: usize,
    /// Chunk length of the prompt call's scan.
    #[serde(default = "default_chunk")]
    pub chunk_size: usize,
    /// Biases on `in_proj` and `out_proj`.
    #[serde(default)]
    pub use_bias: bool,
    /// Bias on the convolution.
    #[serde(default = "default_true")]
    pub use_conv_bias: bool,
    /// Activation after the convolution.
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Epsilon of every RMSNorm.
    #[serde(default = "default_eps")]
    pub layer_norm_epsilon: f64,
    /// Bounds of `dt` (`[0.0, Infinity]` by default; either JSON spelling of infinity).
    #[serde(default)]
    pub time_step_limit: Option<(ConfigFloat, ConfigFloat)>,
    /// Whether the head shares the embedding table.
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

fn default_heads() -> usize {
    128
}
fn default_head_dim() -> usize {
    64
}
fn default_expand() -> usize {
    2
}
fn default_groups() -> usize {
    8
}
fn default_state() -> usize {
    128
}
fn default_kernel() -> usize {
    4
}
fn default_chunk() -> usize {
    256
}
fn default_true() -> bool {
    true
}
fn default_act() -> String {
    "silu".into()
}
fn default_eps() -> f64 {
    1e-5
}

/// `time_step_limit`, `(0, inf)` when absent.
pub(crate) fn dt_limit(limit: Option<(ConfigFloat, ConfigFloat)>) -> (f64, f64) {
    limit.map_or((0.0, f64::INFINITY), |(low, high)| (low.0, high.0))
}

struct Block {
    norm: RmsNorm,
    mixer: Mamba2Mixer,
}

/// A loaded Mamba-2.
pub struct Mamba2 {
    layout: ModelLayout,
    embeddings: Embedding,
    blocks: Vec<Block>,
    head: LmHead,
}

impl Mamba2 {
    /// Builds the model from its config and weights.
    pub fn load(arch_config: &ArchConfig, loader: &mut WeightLoader<'_>) -> Result<Self> {
        let config: Mamba2Config = arch_config.parse()?;
        let spec = MixerSpec {
            hidden: config.hidden_size,
            heads: config.num_heads,
            head_dim: config.head_dim,
            groups: config.n_groups,
            state: config.state_size,
            conv_kernel: config.conv_kernel,
            chunk: config.chunk_size,
            proj_bias: config.use_bias,
            conv_bias: config.use_conv_bias,
            activation: Activation::from_config(arch_config, "hidden_act", &config.hidden_act)?,
            eps: config.layer_norm_epsilon,
            dt_limit: dt_limit(config.time_step_limit),
        };
        spec.check(arch_config, config.expand)?;
        let (h, eps) = (config.hidden_size, config.layer_norm_epsilon);
        let mut backbone = loader.pp("backbone");
        let embeddings = Embedding::load(backbone.pp("embeddings"), config.vocab_size, h)?;
        let blocks = (0..config.num_hidden_layers)
            .map(|i| {
                let mut layer = backbone.pp(format!("layers.{i}"));
                Ok(Block {
                    norm: RmsNorm::load(layer.pp("norm"), h, eps)?,
                    mixer: Mamba2Mixer::load(layer.pp("mixer"), i, spec)?,
                })
            })
            .collect::<Result<_>>()?;
        let norm_f = RmsNorm::load(backbone.pp("norm_f"), h, eps)?;
        let tied = config.tie_word_embeddings && !loader.contains("lm_head.weight");
        let lm_head = Linear::head(loader.pp("lm_head"), &embeddings, tied)?;
        let layer = LayerSpec::new(spec.kind(), FeedForwardKind::None);
        Ok(Mamba2 {
            layout: ModelLayout::uniform(h, config.vocab_size, layer, config.num_hidden_layers),
            embeddings,
            blocks,
            head: LmHead::new(norm_f, lm_head),
        })
    }
}

impl CausalLm for Mamba2 {
    fn layout(&self) -> &ModelLayout {
        &self.layout
    }

    fn forward(&self, call: &mut Call<'_>) -> Result<Tensor<3>> {
        let embeddings = self.embeddings.forward(call.input_ids());
        let mut hidden = call.visit(Site::TokenEmbeddings, embeddings)?;
        for (layer, block) in self.blocks.iter().enumerate() {
            hidden = residual_block(
                layer,
                hidden,
                call,
                |hidden, call| block.mixer.mix(block.norm.forward(hidden), call),
                None::<fn(Tensor<3>, &mut Call<'_>) -> Result<Tensor<3>>>,
            )?;
        }
        Ok(hidden)
    }

    fn output_head(&self) -> &dyn OutputHead {
        &self.head
    }
}

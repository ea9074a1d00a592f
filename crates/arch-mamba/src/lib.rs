//! # Mamba
//!
//! "Mamba: Linear-Time Sequence Modeling with Selective State Spaces" (Gu & Dao, 2023): blocks
//! of RMSNorm and a selective-scan mixer, no MLP. `MambaForCausalLM` as `transformers` 5.x
//! stores it (`backbone.embeddings`, `backbone.layers.{i}.mixer.*`, `backbone.norm_f`, the head
//! tied unless `lm_head.weight` is stored).
//!
//! Mixer sites (`layers.{i}.self_attn.*`, alias `mixer`): `state_input`, `state_output`, then
//! `attention_head_outputs` (the scan output `y` with the `D` skip, before the `silu(z)` gate).
//! The prompt call scans its tokens in one pass (`nn::selective_scan`: linear in the prompt
//! length); a decode step is one update (`nn::selective_step`). Both carry the convolution
//! window and the SSM state in the cache.

use hookscope_core::burn::tensor::{Tensor, activation};
use hookscope_core::nn::{
    Activation, CausalConv1d, Embedding, Linear, LmHead, Recurrence, RecurrentSites, RmsNorm,
    ScanInputs, residual_block, selective_readout, selective_scan, selective_step, silu,
};
use hookscope_core::schema::{FeedForwardKind, LayerSpec, MixerKind, MixerNamespace};
use hookscope_core::{
    ArchConfig, Architecture, Call, CausalLm, MixerSite, ModelLayout, OutputHead, Result, Site,
    WeightLoader,
};
use serde::Deserialize;
use serde_json::Value;

/// `config.json` of a Mamba checkpoint (the fields the forward pass depends on).
#[derive(Debug, Clone, Deserialize)]
pub struct MambaConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden size.
    pub hidden_size: usize,
    /// SSM state size (`N`).
    pub state_size: usize,
    /// Blocks.
    pub num_hidden_layers: usize,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub layer_norm_epsilon: f64,
    /// Inner size factor (`E = expand * hidden_size`).
    #[serde(default = "default_expand")]
    pub expand: usize,
    /// Explicit inner size (transformers writes it).
    #[serde(default)]
    pub intermediate_size: Option<usize>,
    /// Convolution width.
    #[serde(default = "default_kernel")]
    pub conv_kernel: usize,
    /// Biases on in/out projections.
    #[serde(default)]
    pub use_bias: bool,
    /// Bias on the convolution.
    #[serde(default = "default_true")]
    pub use_conv_bias: bool,
    /// Mixer activation.
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Rank of the time-step projection, or `"auto"` (`ceil(hidden_size / 16)`).
    #[serde(default)]
    pub time_step_rank: Option<Value>,
    /// Whether the head shares the embedding table.
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
}

fn default_eps() -> f64 {
    1e-5
}
fn default_expand() -> usize {
    2
}
fn default_kernel() -> usize {
    4
}
fn default_true() -> bool {
    true
}
fn default_act() -> String {
    "silu".into()
}

impl MambaConfig {
    fn inner(&self) -> usize {
        self.intermediate_size
            .unwrap_or(self.expand * self.hidden_size)
    }

    fn time_step_rank(&self, config: &ArchConfig) -> Result<usize> {
        match &self.time_step_rank {
            None => Ok(self.hidden_size.div_ceil(16)),
            Some(Value::String(auto)) if auto == "auto" => Ok(self.hidden_size.div_ceil(16)),
            Some(Value::Number(n)) => n
                .as_u64()
                .map(|n| n as usize)
                .ok_or_else(|| config.unsupported(format!("time_step_rank {n}"))),
            Some(other) => Err(config.unsupported(format!("time_step_rank {other}"))),
        }
    }
}

struct Mixer {
    in_proj: Linear,
    conv: CausalConv1d,
    x_proj: Linear,
    dt_proj: Linear,
    /// `-exp(A_log)`, `[E, N]`.
    a: Tensor<2>,
    d: Tensor<1>,
    out_proj: Linear,
}

struct Block {
    norm: RmsNorm,
    mixer: Mixer,
}

/// A loaded Mamba.
pub struct Mamba {
    layout: ModelLayout,
    activation: Activation,
    inner: usize,
    rank: usize,
    state: usize,
    embeddings: Embedding,
    blocks: Vec<Block>,
    head: LmHead,
}

impl Mamba {
    /// Builds the model from its config and weights.
    pub fn load(arch_config: &ArchConfig, loader: &mut WeightLoader<'_>) -> Result<Self> {
        let config: MambaConfig = arch_config.parse()?;
        let activation = Activation::from_config(arch_config, "hidden_act", &config.hidden_act)?;
        let (h, e, n) = (config.hidden_size, config.inner(), config.state_size);
        let rank = config.time_step_rank(arch_config)?;
        let eps = config.layer_norm_epsilon;
        let mut backbone = loader.pp("backbone");
        let embeddings = Embedding::load(backbone.pp("embeddings"), config.vocab_size, h)?;
        let blocks = (0..config.num_hidden_layers)
            .map(|i| {
                let mut layer = backbone.pp(format!("layers.{i}"));
                let a_log: Tensor<2> = layer.tensor("mixer.A_log", [e, n])?;
                let norm = RmsNorm::load(layer.pp("norm"), h, eps)?;
                let mut mixer = layer.pp("mixer");
                Ok(Block {
                    norm,
                    mixer: Mixer {
                        in_proj: Linear::load_torch(
                            mixer.pp("in_proj"),
                            h,
                            2 * e,
                            config.use_bias,
                        )?,
                        conv: CausalConv1d::load(
                            mixer.pp("conv1d"),
                            e,
                            config.conv_kernel,
                            config.use_conv_bias,
                        )?,
                        x_proj: Linear::load_torch(mixer.pp("x_proj"), e, rank + 2 * n, false)?,
                        dt_proj: Linear::load_torch(mixer.pp("dt_proj"), rank, e, true)?,
                        a: a_log.exp().neg(),
                        d: mixer.tensor("D", [e])?,
                        out_proj: Linear::load_torch(mixer.pp("out_proj"), e, h, config.use_bias)?,
                    },
                })
            })
            .collect::<Result<_>>()?;
        let norm_f = RmsNorm::load(backbone.pp("norm_f"), h, eps)?;
        let tied = config.tie_word_embeddings && !loader.contains("lm_head.weight");
        let lm_head = Linear::head(loader.pp("lm_head"), &embeddings, tied)?;
        let layer = LayerSpec::new(
            MixerKind::Mamba1 { inner: e, state: n },
            FeedForwardKind::None,
        );
        Ok(Mamba {
            layout: ModelLayout::uniform(h, config.vocab_size, layer, config.num_hidden_layers),
            activation,
            inner: e,
            rank,
            state: n,
            embeddings,
            blocks,
            head: LmHead::new(norm_f, lm_head),
        })
    }

    /// The mixer of `layer` on normalised `x` `[B, T, H]`.
    fn mix(
        &self,
        layer: usize,
        mixer: &Mixer,
        x: Tensor<3>,
        call: &mut Call<'_>,
    ) -> Result<Tensor<3>> {
        let (e, n, rank) = (self.inner, self.state, self.rank);
        let real = call.token_mask().unsqueeze_dim::<3>(2);
        // Padding positions feed zeros to the convolution and the scan. They are zeroed after
        // the projection: transformers zeroes its input, which lets a biased `in_proj` leak
        // into the convolution window (see the README's choices).
        let projected = mixer.in_proj.forward(x);
        let xs = projected.clone().slice_dim(2, 0..e) * real.clone();
        let gate = projected.slice_dim(2, e..2 * e);
        let sites = RecurrentSites {
            layer,
            namespace: MixerNamespace::SelfAttn,
        };
        let y = sites.run(&mixer.conv, xs, call, |conv_out, _, _| {
            let xs = self.activation.forward(conv_out) * real;
            let params = mixer.x_proj.forward(xs.clone());
            let dt = params.clone().slice_dim(2, 0..rank);
            let b = params.clone().slice_dim(2, rank..rank + n);
            let c = params.slice_dim(2, rank + n..rank + 2 * n);
            let dt = activation::softplus(mixer.dt_proj.forward(dt), 1.0);
            Ok(Selective {
                inputs: ScanInputs { dt, x: xs, b, c },
                mixer,
            })
        })?;
        let y = call.visit(Site::self_attn(layer, MixerSite::AttentionHeadOutputs), y)?;
        Ok(mixer.out_proj.forward(y * silu(gate)))
    }
}

/// One call's selective scan of a layer: its inputs and the layer's `A` and `D`.
struct Selective<'m> {
    inputs: ScanInputs,
    mixer: &'m Mixer,
}

impl Selective<'_> {
    /// The batch, inner and state sizes `[B, E, N]`.
    fn sizes(&self) -> [usize; 3] {
        let [batch, _, e] = self.inputs.x.dims();
        [batch, e, self.mixer.a.dims()[1]]
    }

    /// The scan output `y` with the `D` skip.
    fn skip(&self, y: Tensor<3>) -> Tensor<3> {
        y + self.inputs.x.clone() * self.mixer.d.clone().unsqueeze::<3>()
    }
}

impl Recurrence<3> for Selective<'_> {
    type Output = Tensor<3>;

    fn zero_state(&self) -> Tensor<3> {
        Tensor::zeros(self.sizes(), &self.inputs.x.device())
    }

    fn step(&self, state: Tensor<3>) -> Tensor<3> {
        let [batch, e, n] = self.sizes();
        let inputs = &self.inputs;
        let (dt, x) = (
            inputs.dt.clone().reshape([batch, e]),
            inputs.x.clone().reshape([batch, e]),
        );
        let b = inputs.b.clone().reshape([batch, n]);
        selective_step(dt, x, b, &self.mixer.a, state)
    }

    fn read_out(&self, state: &Tensor<3>) -> Tensor<3> {
        let [batch, e, n] = self.sizes();
        let c = self.inputs.c.clone().reshape([batch, n]);
        self.skip(selective_readout(state, c).reshape([batch, 1, e]))
    }

    fn scan(self, state: Tensor<3>) -> Result<(Tensor<3>, Tensor<3>)> {
        let (y, last) = selective_scan(&self.inputs, &self.mixer.a, state);
        Ok((self.skip(y), last))
    }
}

impl CausalLm for Mamba {
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
                |hidden, call| {
                    let x = block.norm.forward(hidden);
                    self.mix(layer, &block.mixer, x, call)
                },
                None::<fn(Tensor<3>, &mut Call<'_>) -> Result<Tensor<3>>>,
            )?;
        }
        Ok(hidden)
    }

    fn output_head(&self) -> &dyn OutputHead {
        &self.head
    }
}

/// Mamba-1, as the registry lists it.
pub static ARCHITECTURE: Architecture = hookscope_core::architecture!(
    Mamba,
    name: "mamba",
    model_types: ["mamba"],
    architectures: ["MambaForCausalLM"],
    tiny_config: r#"{"model_type": "mamba", "vocab_size": 61, "hidden_size": 16,
        "state_size": 4, "num_hidden_layers": 2, "expand": 2, "conv_kernel": 4,
        "eos_token_id": 60}"#,
);

//! What an architecture adapter is: the [`CausalLm`] forward pass it implements and the
//! [`Architecture`] record that makes it loadable.

use burn::tensor::Tensor;

use crate::cache::ModelCache;
use crate::call::Call;
use crate::config::ArchConfig;
use crate::error::Result;
use crate::schema::ModelLayout;
use crate::weights::WeightLoader;

/// An architecture's forward pass. Implementations serve every site they declare through
/// [`Call::visit`], in contract order, from `token_embeddings` to the last `layer_output`;
/// `input_ids`, `logits` and `next_token_probs` are served by the engine around them.
///
/// A loaded model is shared across threads, so adapters are `Send + Sync`; everything a call
/// changes (the carried state) lives in the [`Call`], never in the adapter.
pub trait CausalLm: Send + Sync {
    /// The declared structure: sizes and the mixer of each layer.
    fn layout(&self) -> &ModelLayout;

    /// The longest sequence the model can position, if it has a limit (none by default).
    fn max_positions(&self) -> Option<usize> {
        None
    }

    /// Empty carried state for a new batch: by default, derived from the declared layout (a
    /// key/value cache per attention layer, the typed recurrent state per recurrent layer).
    fn new_cache(&self) -> ModelCache {
        ModelCache::for_layout(self.layout())
    }

    /// Whether a generation step whose sequence is `total` tokens long, `cached` of them
    /// already in the carried state, must drop that state and feed the whole sequence (as
    /// transformers' Phi-3 does once, when the sequence first outgrows its pretraining context
    /// and LongRoPE switches to its long factors). Never, by default.
    fn recomputes(&self, cached: usize, total: usize) -> bool {
        let _ = (cached, total);
        false
    }

    /// One call: serves every site from `token_embeddings` to the last `layer_output` and
    /// returns the residual stream leaving the last block, `[B, T, H]`.
    fn forward(&self, call: &mut Call<'_>) -> Result<Tensor<3>>;

    /// What turns the last residual stream into logits (`nn::LmHead` for a norm, a linear
    /// head and any soft-cap).
    fn output_head(&self) -> &dyn OutputHead;

    /// The norms around layer `layer`'s feed-forward part, if the adapter declares them: what
    /// dictionaries trained on TransformerLens' `ln2.hook_normalized` (the MLP's input before
    /// its norm's gain) and `mlp.hook_out` (the MLP's output before any norm after it) need.
    /// `None` (the default) where the layer has no feed-forward part or the adapter does not
    /// say; such dictionaries are then refused, naming the hook.
    fn feed_forward_norms(&self, layer: usize) -> Option<FeedForwardNorms> {
        let _ = layer;
        None
    }
}

/// A normalisation's arithmetic alone, without its learned gain and bias (applied by
/// `nn`'s norms: `PlainNorm::apply`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PlainNorm {
    /// `x / sqrt(mean(x²) + eps)` (RMSNorm).
    Rms {
        /// The epsilon under the root.
        eps: f64,
    },
    /// `(x - mean) / sqrt(var + eps)`, the variance biased (LayerNorm).
    Layer {
        /// The epsilon under the root.
        eps: f64,
    },
}

/// The norms around one layer's feed-forward part ([`CausalLm::feed_forward_norms`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FeedForwardNorms {
    /// The norm the part reads through (`ln2`), without its gain and bias, if it has one.
    pub input: Option<PlainNorm>,
    /// Whether a norm follows the part before the residual add (Gemma's
    /// `post_feedforward_layernorm`, OLMo-2's), so that `mlp_output` is not the part's own
    /// output.
    pub output_norm: bool,
}

/// What turns the residual stream leaving the last block into logits. The engine serves the
/// final norm's output as `final_norm_output`, then applies the head and any soft-cap; the logit
/// lens applies the same to every layer's output, and direct logit attribution its linear form.
pub trait OutputHead: Send + Sync {
    /// The final norm on a residual stream `[B, T, H]`.
    fn final_norm(&self, hidden: Tensor<3>) -> Tensor<3>;

    /// The language-model head on the final norm's output `[B, T, H]`: logits `[B, T, V]`,
    /// before any soft-cap.
    fn head(&self, normed: Tensor<3>) -> Tensor<3>;

    /// The cap of a final logit soft-cap, `cap · tanh(logits / cap)` (Gemma 2), if the model
    /// has one; the engine applies it after [`OutputHead::head`].
    fn logit_softcap(&self) -> Option<f64>;

    /// The final norm of `reference` `[B, T, H]` applied to `parts` `[B, T, N, H]` with
    /// `reference`'s scale frozen and without the norm's bias: a linear map under which the
    /// parts of a residual stream sum to its norm less the bias (direct logit attribution).
    fn final_norm_linearised(&self, reference: Tensor<3>, parts: Tensor<4>) -> Tensor<4>;
}

/// Builds an adapter's model from its config and weights.
pub type LoadFn = fn(&ArchConfig, &mut WeightLoader<'_>) -> Result<Box<dyn CausalLm>>;

/// One architecture adapter: the checkpoints it serves and how to build it. Built-in adapters
/// expose one as `ARCHITECTURE`; [`crate::architecture!`] writes it.
#[derive(Debug)]
pub struct Architecture {
    /// Short name (`gpt2`).
    pub name: &'static str,
    /// The `model_type` values of `config.json` it serves.
    pub model_types: &'static [&'static str],
    /// The `architectures` class names it serves (used when `model_type` is absent).
    pub architectures: &'static [&'static str],
    /// Builds the model.
    pub load: LoadFn,
    /// `config.json` of a tiny model of this architecture, for the conformance suite (which
    /// fills it with seeded random weights).
    pub tiny_config: &'static str,
}

/// The [`Architecture`] of a model type that has
/// `fn load(&ArchConfig, &mut WeightLoader) -> Result<Self>` and implements [`CausalLm`]:
///
/// ```text
/// pub static ARCHITECTURE: Architecture = hookscope_core::architecture!(Gpt2, name: "gpt2",
///     model_types: ["gpt2"], architectures: ["GPT2LMHeadModel"],
///     tiny_config: r#"{"model_type": "gpt2", ...}"#);
/// ```
#[macro_export]
macro_rules! architecture {
    ($model:ty, name: $name:literal, model_types: [$($model_type:literal),* $(,)?],
     architectures: [$($class:literal),* $(,)?], tiny_config: $tiny:expr $(,)?) => {
        $crate::Architecture {
            name: $name,
            model_types: &[$($model_type),*],
            architectures: &[$($class),*],
            load: |config, loader| Ok(Box::new(<$model>::load(config, loader)?)),
            tiny_config: $tiny,
        }
    };
}

//! The pre-norm decoder of Llama and of Llama-style hybrids (Bamba, Qwen3-Next, Qwen3.5): each
//! layer is softmax attention with rotary positions or another sequence mixer, followed by a
//! feed-forward part (a dense MLP or a mixture of experts), both behind RMSNorms and residual
//! adds. Gemma's and OLMo-2's additions are options: norms on both parts' outputs before their
//! adds (Gemma's "sandwich"; OLMo-2's post-norms, without the norms before), a scaled
//! embedding, a rotary of its own for sliding-window layers, a soft-capped head. The decoder is
//! a [`CausalLm`] itself, its layout read off its layers.

use std::cell::OnceCell;

use burn::tensor::Tensor;

use super::{Embedding, GatedMlp, LmHead, ProjectedAttention, RmsNorm, Rotary, SparseMoe};
use crate::adapter::{CausalLm, FeedForwardNorms, OutputHead};
use crate::call::Call;
use crate::error::Result;
use crate::nn::residual_block;
use crate::schema::{FeedForwardKind, LayerSpec, MixerKind, ModelLayout, Site};

/// A sequence mixer that serves its own interior sites (Mamba-2, Gated DeltaNet, ...).
pub trait Mixer: Send + Sync {
    /// The mixer kind a layout declares for its layer.
    fn kind(&self) -> MixerKind;

    /// The mixer on normalised `x` `[B, T, H]`; returns `[B, T, H]`.
    fn mix(&self, x: Tensor<3>, call: &mut Call<'_>) -> Result<Tensor<3>>;
}

/// The "other mixer" of a decoder whose every layer is attention (Llama): there is none.
pub enum NoOtherMixer {}

impl Mixer for NoOtherMixer {
    fn kind(&self) -> MixerKind {
        match *self {}
    }

    fn mix(&self, _: Tensor<3>, _: &mut Call<'_>) -> Result<Tensor<3>> {
        match *self {}
    }
}

/// A layer's feed-forward part.
pub trait FeedForward: Send + Sync {
    /// The part's kind, as a layout declares it.
    fn kind(&self) -> FeedForwardKind;

    /// The part of layer `layer` on normalised `x` `[B, T, H]`, serving `mlp_input` and its
    /// interior sites.
    fn serve(&self, layer: usize, x: Tensor<3>, call: &mut Call<'_>) -> Result<Tensor<3>>;
}

impl FeedForward for GatedMlp {
    fn kind(&self) -> FeedForwardKind {
        GatedMlp::kind(self)
    }

    fn serve(&self, layer: usize, x: Tensor<3>, call: &mut Call<'_>) -> Result<Tensor<3>> {
        GatedMlp::serve(self, layer, x, call)
    }
}

impl FeedForward for SparseMoe {
    fn kind(&self) -> FeedForwardKind {
        SparseMoe::kind(self)
    }

    fn serve(&self, layer: usize, x: Tensor<3>, call: &mut Call<'_>) -> Result<Tensor<3>> {
        SparseMoe::serve(self, layer, x, call)
    }
}

/// The feed-forward part of a decoder whose layers mix dense MLPs and mixtures of experts
/// (Qwen-MoE's `mlp_only_layers` and `decoder_sparse_step`).
pub enum Mlp {
    /// A dense gated MLP.
    Dense(Box<GatedMlp>),
    /// A sparse mixture of experts.
    Sparse(Box<SparseMoe>),
}

impl FeedForward for Mlp {
    fn kind(&self) -> FeedForwardKind {
        match self {
            Mlp::Dense(mlp) => mlp.kind(),
            Mlp::Sparse(moe) => moe.kind(),
        }
    }

    fn serve(&self, layer: usize, x: Tensor<3>, call: &mut Call<'_>) -> Result<Tensor<3>> {
        match self {
            Mlp::Dense(mlp) => mlp.serve(layer, x, call),
            Mlp::Sparse(moe) => moe.serve(layer, x, call),
        }
    }
}

/// The mixer of one layer of a hybrid.
pub enum LayerMixer<M> {
    /// Softmax attention with the model's rotary positions.
    Attention(Box<ProjectedAttention>),
    /// The model's other mixer.
    Other(Box<M>),
}

impl<M: Mixer> LayerMixer<M> {
    /// The mixer kind a layout declares for its layer.
    pub fn kind(&self) -> MixerKind {
        match self {
            LayerMixer::Attention(attention) => attention.kind(),
            LayerMixer::Other(mixer) => mixer.kind(),
        }
    }
}

/// One layer: `h + mixer(input_norm(h))`, then `h + feed_forward(post_norm(h))`; with
/// output norms, `h + output_norms.mixer(mixer(input_norm(h)))` and likewise for the
/// feed-forward part. A layer without input norms (OLMo-2) feeds `h` itself to both parts.
pub struct DecoderLayer<M, F> {
    /// The norm before the mixer, if the layer has one.
    pub input_norm: Option<RmsNorm>,
    /// The mixer.
    pub mixer: LayerMixer<M>,
    /// The norm before the feed-forward part, if the layer has one.
    pub post_norm: Option<RmsNorm>,
    /// The feed-forward part.
    pub feed_forward: F,
    /// Norms of both parts' outputs before their residual adds, if the layer has them.
    pub output_norms: Option<OutputNorms>,
}

/// The norms a sandwich-norm layer (Gemma 2 and 3) or a post-norm layer (OLMo-2) applies to
/// its parts' outputs: what they return is what the layer adds to the residual stream
/// (`attention_output`, `mlp_output`).
pub struct OutputNorms {
    /// After the mixer (`post_attention_layernorm`).
    pub mixer: RmsNorm,
    /// After the feed-forward part (`post_feedforward_layernorm`).
    pub feed_forward: RmsNorm,
}

/// What a decoder does beyond Llama's; the default does none of it.
#[derive(Debug, Clone, Default)]
pub struct DecoderOptions {
    /// The factor on the embeddings before layer 0 (Gemma: `sqrt(hidden)` in f32, the
    /// activations' dtype).
    pub embedding_scale: Option<f32>,
    /// The rotary of the sliding-window attention layers, where it differs from the others'
    /// (Gemma 3's local base).
    pub sliding_rotary: Option<Rotary>,
    /// A context length past which generation recomputes the whole sequence once, at the first
    /// step whose sequence outgrows it (Phi-3's `original_max_position_embeddings`: see
    /// [`CausalLm::recomputes`]).
    pub recompute_beyond: Option<usize>,
}

/// The parts of a [`HybridDecoder`], as an adapter loads them.
pub struct DecoderParts<M, F> {
    /// The token embedding table.
    pub embed_tokens: Embedding,
    /// Rotary positions of the attention layers.
    pub rotary: Rotary,
    /// The layers, in order.
    pub layers: Vec<DecoderLayer<M, F>>,
    /// The final norm, the language-model head and any final soft-cap.
    pub head: LmHead,
    /// What the decoder does beyond Llama's.
    pub options: DecoderOptions,
}

/// A decoder: embeddings, layers, final norm and head, with the layout they declare.
pub struct HybridDecoder<M, F> {
    parts: DecoderParts<M, F>,
    layout: ModelLayout,
}

impl<M: Mixer, F: FeedForward> HybridDecoder<M, F> {
    /// The decoder of `parts`; its layout is read off them (every layer has its mixer's kind
    /// and a feed-forward part; hidden and vocabulary sizes are the embedding table's).
    pub fn new(parts: DecoderParts<M, F>) -> Self {
        let [vocab, hidden] = parts.embed_tokens.dims();
        let layers = parts
            .layers
            .iter()
            .map(|layer| LayerSpec::new(layer.mixer.kind(), layer.feed_forward.kind()))
            .collect();
        HybridDecoder {
            layout: ModelLayout::new(hidden, vocab, layers),
            parts,
        }
    }
}

/// `x` through `norm`, if there is one.
fn normed(norm: &Option<RmsNorm>, x: Tensor<3>) -> Tensor<3> {
    match norm {
        Some(norm) => norm.forward(x),
        None => x,
    }
}

impl<M: Mixer, F: FeedForward> CausalLm for HybridDecoder<M, F> {
    fn layout(&self) -> &ModelLayout {
        &self.layout
    }

    fn recomputes(&self, cached: usize, total: usize) -> bool {
        self.parts
            .options
            .recompute_beyond
            .is_some_and(|context| total > context && cached <= context)
    }

    /// One call, serving `token_embeddings` and every layer's sites in contract order.
    fn forward(&self, call: &mut Call<'_>) -> Result<Tensor<3>> {
        let parts = &self.parts;
        let options = &parts.options;
        let embeddings = parts.embed_tokens.forward(call.input_ids());
        let embeddings = match options.embedding_scale {
            Some(scale) => embeddings * scale,
            None => embeddings,
        };
        let mut hidden = call.visit(Site::TokenEmbeddings, embeddings)?;
        // Computed by the first attention layer of each kind, shared by the others.
        let (rotary, sliding_rotary) = (OnceCell::new(), OnceCell::new());
        for (index, layer) in parts.layers.iter().enumerate() {
            let norms = layer.output_norms.as_ref();
            hidden = residual_block(
                index,
                hidden,
                call,
                |hidden, call| {
                    let x = normed(&layer.input_norm, hidden);
                    let mixed = match &layer.mixer {
                        LayerMixer::Attention(attention) => {
                            let cos_sin = match (&options.sliding_rotary, attention.window()) {
                                (Some(sliding), Some(_)) => sliding_rotary
                                    .get_or_init(|| sliding.cos_sin(&call.position_ids())),
                                _ => rotary
                                    .get_or_init(|| parts.rotary.cos_sin(&call.position_ids())),
                            };
                            attention.forward(x, cos_sin, call)?
                        }
                        LayerMixer::Other(mixer) => mixer.mix(x, call)?,
                    };
                    Ok(match norms {
                        Some(norms) => norms.mixer.forward(mixed),
                        None => mixed,
                    })
                },
                Some(|hidden, call: &mut Call<'_>| {
                    let x = normed(&layer.post_norm, hidden);
                    let out = layer.feed_forward.serve(index, x, call)?;
                    Ok(match norms {
                        Some(norms) => norms.feed_forward.forward(out),
                        None => out,
                    })
                }),
            )?;
        }
        Ok(hidden)
    }

    fn output_head(&self) -> &dyn OutputHead {
        &self.parts.head
    }

    fn feed_forward_norms(&self, layer: usize) -> Option<FeedForwardNorms> {
        let layer = self.parts.layers.get(layer)?;
        Some(FeedForwardNorms {
            input: layer.post_norm.as_ref().map(RmsNorm::plain),
            output_norm: layer.output_norms.is_some(),
        })
    }
}

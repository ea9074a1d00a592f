//! The pre-norm decoder of Llama and of Llama-style hybrids (Bamba, Qwen3-Next, Qwen3.5): each
//! layer is softmax attention with rotary positions or another sequence mixer, followed by a
//! feed-forward part, both behind RMSNorms and residual adds.

use std::cell::OnceCell;

use burn::tensor::Tensor;

use super::{Embedding, GatedMlp, Linear, ProjectedAttention, RmsNorm, Rotary, SparseMoe};
use crate::call::Call;
use crate::error::Result;
use crate::nn::residual_block;
use crate::schema::Site;

/// A sequence mixer that serves its own interior sites (Mamba-2, Gated DeltaNet, ...).
pub trait Mixer: Send + Sync {
    /// The mixer on normalised `x` `[B, T, H]`; returns `[B, T, H]`.
    fn mix(&self, x: Tensor<3>, call: &mut Call<'_>) -> Result<Tensor<3>>;
}

/// The "other mixer" of a decoder whose every layer is attention (Llama): there is none.
pub enum NoOtherMixer {}

impl Mixer for NoOtherMixer {
    fn mix(&self, _: Tensor<3>, _: &mut Call<'_>) -> Result<Tensor<3>> {
        match *self {}
    }
}

/// A layer's feed-forward part.
pub trait FeedForward: Send + Sync {
    /// The part on normalised `x` `[B, T, H]`.
    fn feed_forward(&self, x: Tensor<3>) -> Result<Tensor<3>>;
}

impl FeedForward for GatedMlp {
    fn feed_forward(&self, x: Tensor<3>) -> Result<Tensor<3>> {
        Ok(self.forward(x))
    }
}

impl FeedForward for SparseMoe {
    fn feed_forward(&self, x: Tensor<3>) -> Result<Tensor<3>> {
        self.forward(x)
    }
}

/// The mixer of one layer of a hybrid.
pub enum LayerMixer<M> {
    /// Softmax attention with the model's rotary positions.
    Attention(Box<ProjectedAttention>),
    /// The model's other mixer.
    Other(Box<M>),
}

/// One layer: `h + mixer(input_norm(h))`, then `h + feed_forward(post_norm(h))`.
pub struct DecoderLayer<M, F> {
    /// The norm before the mixer.
    pub input_norm: RmsNorm,
    /// The mixer.
    pub mixer: LayerMixer<M>,
    /// The norm before the feed-forward part.
    pub post_norm: RmsNorm,
    /// The feed-forward part.
    pub feed_forward: F,
}

/// A decoder: embeddings, layers, final norm and head.
pub struct HybridDecoder<M, F> {
    /// The token embedding table.
    pub embed_tokens: Embedding,
    /// Rotary positions of the attention layers.
    pub rotary: Rotary,
    /// The layers, in order.
    pub layers: Vec<DecoderLayer<M, F>>,
    /// The final norm.
    pub norm: RmsNorm,
    /// The language-model head.
    pub lm_head: Linear,
}

impl<M: Mixer, F: FeedForward> HybridDecoder<M, F> {
    /// One call, serving `token_embeddings` and every layer's sites in contract order.
    pub fn forward(&self, call: &mut Call<'_>) -> Result<Tensor<3>> {
        let embeddings = self.embed_tokens.forward(call.input_ids());
        let mut hidden = call.visit(Site::TokenEmbeddings, embeddings)?;
        // Computed by the first attention layer, shared by the others.
        let rotary = OnceCell::new();
        for (index, layer) in self.layers.iter().enumerate() {
            hidden = residual_block(
                index,
                hidden,
                call,
                |hidden, call| {
                    let x = layer.input_norm.forward(hidden);
                    match &layer.mixer {
                        LayerMixer::Attention(attention) => {
                            let rotary =
                                rotary.get_or_init(|| self.rotary.cos_sin(&call.position_ids()));
                            attention.forward(x, rotary, call)
                        }
                        LayerMixer::Other(mixer) => mixer.mix(x, call),
                    }
                },
                Some(|hidden| {
                    layer
                        .feed_forward
                        .feed_forward(layer.post_norm.forward(hidden))
                }),
            )?;
        }
        Ok(self.unembed(hidden))
    }

    /// A residual stream `[B, T, H]` through the final norm and the head.
    pub fn unembed(&self, hidden: Tensor<3>) -> Tensor<3> {
        self.lm_head.forward(self.norm.forward(hidden))
    }
}

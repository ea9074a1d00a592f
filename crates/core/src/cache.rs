//! State carried from one call to the next: per layer, a key/value cache or recurrent state.
//! It lives outside the model and is passed `&mut` to each forward call.

use burn::tensor::Tensor;

use crate::error::{Error, Result};
use crate::hooks::SiteValue;
use crate::schema::{MixerKind, ModelLayout};

/// The keys and values an attention layer has seen so far, `[B, NKV, S, D]` each.
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    entries: Option<(Tensor<4>, Tensor<4>)>,
}

impl KvCache {
    /// The cache after appending this call's keys and values along the position axis.
    pub fn appended(&self, keys: Tensor<4>, values: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        match &self.entries {
            None => (keys, values),
            Some((past_keys, past_values)) => (
                Tensor::cat(vec![past_keys.clone(), keys], 2),
                Tensor::cat(vec![past_values.clone(), values], 2),
            ),
        }
    }

    /// Replaces the cache contents (after hooks may have edited them).
    pub fn store(&mut self, keys: Tensor<4>, values: Tensor<4>) {
        self.entries = Some((keys, values));
    }
}

/// A recurrent mixer's carried state: its causal-convolution window and its state (the SSM
/// or delta-rule state, whose rank depends on the mixer).
#[derive(Debug, Clone, Default)]
pub struct RecurrentState {
    /// The last inputs of the causal convolution, `[B, channels, kernel]`.
    pub conv: Option<Tensor<3>>,
    /// The recurrent state after the last call.
    pub state: Option<SiteValue>,
}

/// One layer's carried state.
#[derive(Debug, Clone)]
pub enum LayerState {
    /// Softmax attention's key/value cache.
    KeyValue(KvCache),
    /// A recurrent mixer's state (Mamba-1, Mamba-2, Gated DeltaNet).
    Recurrent(RecurrentState),
}

/// The carried state of every layer of one model, for one batch.
#[derive(Debug, Clone)]
pub struct ModelCache {
    layers: Vec<LayerState>,
}

impl ModelCache {
    /// A cache from each layer's initial state.
    pub fn new(layers: Vec<LayerState>) -> Self {
        ModelCache { layers }
    }

    /// Empty state for every layer of a declared layout: a key/value cache for attention
    /// layers, recurrent state for the others.
    pub fn for_layout(layout: &ModelLayout) -> Self {
        ModelCache::new(
            layout
                .layers
                .iter()
                .map(|layer| match layer.mixer {
                    MixerKind::SoftmaxAttention { .. } => LayerState::KeyValue(KvCache::default()),
                    _ => LayerState::Recurrent(RecurrentState::default()),
                })
                .collect(),
        )
    }

    /// Layer `layer`'s recurrent state.
    pub fn recurrent(&mut self, layer: usize) -> Result<&mut RecurrentState> {
        match self.layers.get_mut(layer) {
            Some(LayerState::Recurrent(state)) => Ok(state),
            _ => Err(Error::InvalidInput(format!(
                "layer {layer} carries no recurrent state"
            ))),
        }
    }

    /// Layer `layer`'s key/value cache.
    pub fn key_value(&mut self, layer: usize) -> Result<&mut KvCache> {
        match self.layers.get_mut(layer) {
            Some(LayerState::KeyValue(cache)) => Ok(cache),
            _ => Err(Error::InvalidInput(format!(
                "layer {layer} carries no key/value cache"
            ))),
        }
    }
}

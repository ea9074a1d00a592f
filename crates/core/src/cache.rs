//! State carried from one call to the next: per layer, a key/value cache or recurrent state.
//! It lives outside the model and is passed `&mut` to each forward call.

use burn::tensor::Tensor;

use crate::error::{Error, Result};

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

/// One layer's carried state.
#[derive(Debug, Clone)]
pub enum LayerState {
    /// Softmax attention's key/value cache.
    KeyValue(KvCache),
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

    /// An empty key/value cache for each of `layers` attention layers.
    pub fn key_values(layers: usize) -> Self {
        ModelCache::new(
            (0..layers)
                .map(|_| LayerState::KeyValue(KvCache::default()))
                .collect(),
        )
    }

    /// Layer `layer`'s key/value cache.
    pub fn key_value(&mut self, layer: usize) -> Result<&mut KvCache> {
        match self.layers.get_mut(layer) {
            Some(LayerState::KeyValue(cache)) => Ok(cache),
            None => Err(Error::InvalidInput(format!(
                "the cache has no layer {layer}"
            ))),
        }
    }
}

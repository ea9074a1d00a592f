//! State carried from one call to the next: per layer, a key/value cache or a recurrent state,
//! typed by the layer's mixer kind. It lives outside the model and reaches each forward call
//! through the [`crate::Call`].

use burn::tensor::Tensor;

use crate::error::{Error, Result};
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

/// A recurrent mixer's carried state: its causal-convolution window and its state of rank `R`
/// (`[B, E, N]` for Mamba-1; `[B, NH, P, N]` for Mamba-2; `[B, NV, DK, DV]` for Gated DeltaNet).
/// Both are absent before the first call.
#[derive(Debug, Clone, Default)]
pub struct RecurrentState<const R: usize> {
    /// The last inputs of the causal convolution, `[B, kernel, channels]`.
    pub conv: Option<Tensor<3>>,
    /// The recurrent state after the last call.
    pub state: Option<Tensor<R>>,
}

/// One layer's carried state.
#[derive(Debug, Clone)]
pub enum LayerState {
    /// Softmax attention's key/value cache.
    KeyValue(KvCache),
    /// A rank-3 recurrent state (Mamba-1).
    Recurrent3(RecurrentState<3>),
    /// A rank-4 recurrent state (Mamba-2, Gated DeltaNet).
    Recurrent4(RecurrentState<4>),
}

impl LayerState {
    /// The empty state of a layer with this mixer.
    pub fn for_mixer(mixer: &MixerKind) -> Self {
        match mixer {
            MixerKind::SoftmaxAttention { .. } => LayerState::KeyValue(KvCache::default()),
            MixerKind::Mamba1 { .. } => LayerState::Recurrent3(RecurrentState::default()),
            MixerKind::Mamba2 { .. } | MixerKind::GatedDeltaNet { .. } => {
                LayerState::Recurrent4(RecurrentState::default())
            }
        }
    }

    fn describe(&self) -> &'static str {
        match self {
            LayerState::KeyValue(_) => KvCache::DESCRIPTION,
            LayerState::Recurrent3(_) => RecurrentState::<3>::DESCRIPTION,
            LayerState::Recurrent4(_) => RecurrentState::<4>::DESCRIPTION,
        }
    }
}

/// A kind of per-layer state, as an adapter asks for it with [`ModelCache::layer`].
pub trait CarriedState: Sized {
    /// What it is, for errors.
    const DESCRIPTION: &'static str;
    /// The state of this kind held by `layer`, if it holds this kind.
    fn of(layer: &mut LayerState) -> Option<&mut Self>;
}

impl CarriedState for KvCache {
    const DESCRIPTION: &'static str = "a key/value cache";
    fn of(layer: &mut LayerState) -> Option<&mut Self> {
        match layer {
            LayerState::KeyValue(cache) => Some(cache),
            _ => None,
        }
    }
}

impl CarriedState for RecurrentState<3> {
    const DESCRIPTION: &'static str = "a rank-3 recurrent state";
    fn of(layer: &mut LayerState) -> Option<&mut Self> {
        match layer {
            LayerState::Recurrent3(state) => Some(state),
            _ => None,
        }
    }
}

impl CarriedState for RecurrentState<4> {
    const DESCRIPTION: &'static str = "a rank-4 recurrent state";
    fn of(layer: &mut LayerState) -> Option<&mut Self> {
        match layer {
            LayerState::Recurrent4(state) => Some(state),
            _ => None,
        }
    }
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

    /// Empty state for every layer of a declared layout, typed by each layer's mixer.
    pub fn for_layout(layout: &ModelLayout) -> Self {
        ModelCache::new(
            layout
                .layers
                .iter()
                .map(|layer| LayerState::for_mixer(&layer.mixer))
                .collect(),
        )
    }

    /// Layer `layer`'s state of kind `S`; an error naming both kinds when the layer carries
    /// another kind (an adapter whose forward pass disagrees with its declared layout).
    pub fn layer<S: CarriedState>(&mut self, layer: usize) -> Result<&mut S> {
        let held = self.layers.get_mut(layer).ok_or(Error::CarriedState {
            layer,
            expected: S::DESCRIPTION,
            found: "no state (the cache has fewer layers)",
        })?;
        let found = held.describe();
        S::of(held).ok_or(Error::CarriedState {
            layer,
            expected: S::DESCRIPTION,
            found,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::LayerSpec;

    #[test]
    fn state_is_typed_by_the_declared_mixer() {
        let mamba = LayerSpec {
            mixer: MixerKind::Mamba1 { inner: 4, state: 2 },
            has_mlp: false,
        };
        let layout = ModelLayout {
            hidden: 2,
            vocab: 3,
            layers: vec![LayerSpec::attention(1, 1, 2), mamba],
        };
        let mut cache = ModelCache::for_layout(&layout);
        assert!(cache.layer::<KvCache>(0).is_ok());
        assert!(cache.layer::<RecurrentState<3>>(1).is_ok());
        let wrong = cache.layer::<RecurrentState<4>>(1).unwrap_err().to_string();
        assert!(
            wrong.contains("layer 1") && wrong.contains("rank-3") && wrong.contains("rank-4"),
            "{wrong}"
        );
        let missing = cache.layer::<KvCache>(2).unwrap_err().to_string();
        assert!(missing.contains("layer 2"), "{missing}");
    }
}

//! State carried from one call to the next: per layer, a key/value cache or a recurrent state,
//! typed by the layer's mixer kind. It lives outside the model and reaches each forward call
//! through the [`crate::Call`].

use burn::tensor::Tensor;

use crate::error::{Error, Result};
use crate::schema::{MixerKind, ModelLayout};

/// The keys and values an attention layer has seen so far, `[B, NKV, S, D]` each.
///
/// They are held in buffers with room for more positions (`[B, NKV, capacity, D]`, the capacity
/// growing by half when full), so that a decode step writes its own keys and values in place instead
/// of copying the whole cache: generating `n` tokens copies `O(n)` values, not `O(n²)`. What the
/// attention layer (and a hook) sees is a view of the filled positions; a view that outlives its
/// step (a saved site) keeps its values, because writing to shared storage copies it first.
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    buffers: Option<(Tensor<4>, Tensor<4>)>,
    len: usize,
}

/// Positions a grown buffer has room for at least.
const MIN_CAPACITY: usize = 64;

impl KvCache {
    /// Appends this call's keys and values along the position axis and returns the whole
    /// cache, `[B, NKV, S, D]` each (views of the buffers).
    pub fn append(&mut self, keys: Tensor<4>, values: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        let start = self.len;
        let end = start + keys.dims()[2];
        let (key_buffer, value_buffer) = match self.buffers.take() {
            // The first call's keys and values are the cache; room is made when it grows.
            None => (keys, values),
            Some((key_buffer, value_buffer)) => {
                let write = |buffer: Tensor<4>, new: Tensor<4>| {
                    let [batch, heads, _, dim] = new.dims();
                    grown(buffer, start, end)
                        .slice_assign([0..batch, 0..heads, start..end, 0..dim], new)
                };
                (write(key_buffer, keys), write(value_buffer, values))
            }
        };
        let filled = |buffer: &Tensor<4>| {
            let [batch, heads, _, dim] = buffer.dims();
            buffer.clone().slice([0..batch, 0..heads, 0..end, 0..dim])
        };
        let cache = (filled(&key_buffer), filled(&value_buffer));
        self.buffers = Some((key_buffer, value_buffer));
        self.len = end;
        cache
    }

    /// Replaces the cache contents by `keys` and `values` `[B, NKV, S, D]` (after hooks edited
    /// what [`KvCache::append`] returned).
    pub fn store(&mut self, keys: Tensor<4>, values: Tensor<4>) {
        self.len = keys.dims()[2];
        self.buffers = Some((keys, values));
    }
}

/// `buffer` (`[B, NKV, capacity, D]`, its first `filled` positions in use) with room for `needed`
/// positions: itself when it has it, else a buffer of half as much room again (at least
/// [`MIN_CAPACITY`]: growth by a constant factor keeps the copying linear in the length) holding
/// the same first positions.
fn grown(buffer: Tensor<4>, filled: usize, needed: usize) -> Tensor<4> {
    let [batch, heads, capacity, dim] = buffer.dims();
    if needed <= capacity {
        return buffer;
    }
    let room = needed.max(capacity + capacity / 2).max(MIN_CAPACITY);
    let used = [0..batch, 0..heads, 0..filled, 0..dim];
    Tensor::zeros([batch, heads, room, dim], &buffer.device())
        .slice_assign(used.clone(), buffer.slice(used))
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
    use crate::schema::{FeedForwardKind, LayerSpec};

    #[test]
    fn appends_grow_the_buffers_by_a_factor_and_earlier_views_keep_their_values() {
        let device = burn::tensor::Device::flex();
        // Position p holds p + 1 in the keys and -(p + 1) in the values.
        let ramp = |first: usize, positions: usize, sign: f32| {
            let column: Vec<f32> = (first + 1..=first + positions)
                .map(|p| sign * p as f32)
                .collect();
            Tensor::<1>::from_floats(column.as_slice(), &device)
                .reshape([1, 1, positions, 1])
                .expand([2, 3, positions, 4])
        };
        let mut cache = KvCache::default();
        assert_eq!(cache.len, 0);
        let prompt = 5;
        let (keys, values) = cache.append(ramp(0, prompt, 1.0), ramp(0, prompt, -1.0));
        assert_eq!(keys.dims(), [2, 3, prompt, 4]);
        let mut kept = Vec::new();
        for step in 0..300 {
            let position = prompt + step;
            let (keys, values) = cache.append(ramp(position, 1, 1.0), ramp(position, 1, -1.0));
            assert_eq!(keys.dims(), [2, 3, position + 1, 4]);
            if step % 97 == 0 {
                kept.push((keys, values));
            }
        }
        assert_eq!(cache.len, prompt + 300);
        let capacity = cache.buffers.as_ref().unwrap().0.dims()[2];
        assert!(
            capacity >= cache.len && capacity < 2 * cache.len,
            "{capacity}"
        );
        // Views taken at earlier steps (as a saved site holds them) are unchanged.
        for (keys, values) in kept.into_iter().chain([(keys, values)]) {
            let positions = keys.dims()[2];
            keys.into_data()
                .assert_eq(&ramp(0, positions, 1.0).into_data(), true);
            values
                .into_data()
                .assert_eq(&ramp(0, positions, -1.0).into_data(), true);
        }
    }

    #[test]
    fn state_is_typed_by_the_declared_mixer() {
        let mamba = LayerSpec::new(
            MixerKind::Mamba1 { inner: 4, state: 2 },
            FeedForwardKind::None,
        );
        let attention = LayerSpec::attention(1, 1, 2, FeedForwardKind::Gated { inner: 4 });
        let layout = ModelLayout::new(2, 3, vec![attention, mamba]);
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

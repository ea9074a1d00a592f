//! The per-call context an adapter's forward pass receives: this call's input, the carried
//! state and the hooks, in one value (the shape mistral.rs settled on), instead of long
//! argument lists.

use std::cell::OnceCell;

use burn::tensor::{Bool, Device, Int, Tensor};

use crate::cache::{CarriedState, ModelCache};
use crate::error::Result;
use crate::hooks::{Hooks, SiteTensor};
use crate::input::{attention_mask, position_ids, token_mask};
use crate::schema::Site;

/// One forward call: input, carried state and hooks.
///
/// The masks are computed on first use, so a model without attention layers never builds the
/// dense `[B, 1, T, S]` attention mask, and one without recurrent layers no token mask.
pub struct Call<'a> {
    input_ids: Tensor<2, Int>,
    /// `[B][S]`: true at real tokens of the whole context so far (this call's are the last `T`).
    key_mask: &'a [Vec<bool>],
    device: Device,
    position_ids: OnceCell<Tensor<2, Int>>,
    attention_mask: OnceCell<Tensor<4, Bool>>,
    /// The sliding-window mask and its window (a model has one window; another is computed
    /// afresh).
    window_mask: OnceCell<(usize, Tensor<4, Bool>)>,
    token_mask: OnceCell<Tensor<2>>,
    cache: &'a mut ModelCache,
    hooks: Hooks<'a>,
}

impl<'a> Call<'a> {
    /// A call feeding `input_ids` `[B, T]` (the newest `T` tokens of a context whose real-token
    /// mask is `key_mask`, `[B][S]`), continuing from `cache`.
    pub(crate) fn new(
        input_ids: Tensor<2, Int>,
        key_mask: &'a [Vec<bool>],
        cache: &'a mut ModelCache,
        hooks: Hooks<'a>,
    ) -> Self {
        Call {
            device: input_ids.device(),
            input_ids,
            key_mask,
            position_ids: OnceCell::new(),
            attention_mask: OnceCell::new(),
            window_mask: OnceCell::new(),
            token_mask: OnceCell::new(),
            cache,
            hooks,
        }
    }

    /// `[B, T]` token ids of this call (after any write to `input_ids`).
    pub fn input_ids(&self) -> Tensor<2, Int> {
        self.input_ids.clone()
    }

    /// `[batch, tokens]` of this call.
    pub fn dims(&self) -> [usize; 2] {
        self.input_ids.dims()
    }

    /// `[B, T]` positions, counted over real tokens only (pads get position 1, as
    /// `transformers` does).
    pub fn position_ids(&self) -> Tensor<2, Int> {
        let tokens = self.dims()[1];
        self.position_ids
            .get_or_init(|| position_ids(self.key_mask, tokens, &self.device))
            .clone()
    }

    /// `[B, 1, T, S]`, true where a query must not see a key (future or padding).
    pub fn attention_mask(&self) -> Tensor<4, Bool> {
        let tokens = self.dims()[1];
        self.attention_mask
            .get_or_init(|| attention_mask(self.key_mask, tokens, None, &self.device))
            .clone()
    }

    /// The attention mask of a layer that sees at most `window` keys, `[B, 1, T, S]` (see
    /// [`Call::attention_mask`]): also true at keys `window` or more positions before the query.
    /// `None` is the full mask.
    pub fn attention_mask_within(&self, window: Option<usize>) -> Tensor<4, Bool> {
        let Some(window) = window else {
            return self.attention_mask();
        };
        let tokens = self.dims()[1];
        let compute = || attention_mask(self.key_mask, tokens, Some(window), &self.device);
        let (cached, mask) = self.window_mask.get_or_init(|| (window, compute()));
        match *cached == window {
            true => mask.clone(),
            false => compute(),
        }
    }

    /// `[B, T]`: 1.0 at this call's real tokens, 0.0 at padding (recurrent mixers zero their
    /// inputs there).
    pub fn token_mask(&self) -> Tensor<2> {
        let tokens = self.dims()[1];
        self.token_mask
            .get_or_init(|| token_mask(self.key_mask, tokens, &self.device))
            .clone()
    }

    /// Layer `layer`'s carried state of kind `S` (a [`crate::cache::KvCache`], a
    /// [`crate::cache::RecurrentState`]).
    pub fn state<S: CarriedState>(&mut self, layer: usize) -> Result<&mut S> {
        self.cache.layer(layer)
    }

    /// The hook entry: serves `site` with `value` (reads, writes) and returns the value that
    /// flows on. Call it at every declared site, in contract order.
    pub fn visit<T: SiteTensor>(&mut self, site: Site, value: T) -> Result<T> {
        self.hooks.visit(site, value)
    }

    /// Whether any request reads or writes `site` in this call: an unobserved interior site
    /// may be computed by a fused kernel and not served at all.
    pub fn observes(&self, site: Site) -> bool {
        self.hooks.observes(site)
    }

    /// Whether any request writes `site` in this call (a read alone leaves the value as it is).
    pub fn writes(&self, site: Site) -> bool {
        self.hooks.writes(site)
    }
}

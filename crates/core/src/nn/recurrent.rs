//! The carried-state protocol of recurrent sequence mixers (Mamba-1, Mamba-2, Gated DeltaNet),
//! written once: the causal convolution continues from the window the cache carries and puts
//! the new one back; the state the cache carries (or zeros) is served at `state_input`; one
//! token steps it, a prompt scans; the result is served at `state_output` and stored. The
//! adapter supplies only its math, as a [`Recurrence`].

use burn::tensor::Tensor;

use super::CausalConv1d;
use crate::cache::{CarriedState, RecurrentState};
use crate::call::Call;
use crate::error::Result;
use crate::hooks::SiteTensor;
use crate::schema::{LayerSite, MixerNamespace, MixerSite, Site};

/// One call's update of a recurrent mixer's state `[B, ...]` of rank `R`, with the inputs it
/// reads (its step sizes, projections, ...).
pub trait Recurrence<const R: usize> {
    /// The per-position output (`[B, T, ...]`).
    type Output;
    /// The state of a batch that carries none: zeros of the state's shape.
    fn zero_state(&self) -> Tensor<R>;
    /// One token's update of `state`.
    fn step(&self, state: Tensor<R>) -> Tensor<R>;
    /// One token's output, read from its updated (and possibly written) state.
    fn read_out(&self, state: &Tensor<R>) -> Self::Output;
    /// A prompt's outputs and the state after its last position, from `state`.
    fn scan(self, state: Tensor<R>) -> Result<(Self::Output, Tensor<R>)>;
}

/// Where a recurrent mixer's sites and carried state live: `layers.{layer}.{namespace}.*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecurrentSites {
    /// The layer.
    pub layer: usize,
    /// The mixer's namespace (`self_attn`, `linear_attn`).
    pub namespace: MixerNamespace,
}

impl RecurrentSites {
    /// Runs one call of the mixer of this layer: `conv` over `conv_input` `[B, T, C]` from the
    /// carried window; `prepare` turns its output (and whether a state was carried) into the
    /// call's [`Recurrence`], serving any sites in between; then the state protocol (see the
    /// module docs). Returns the recurrence's output.
    pub fn run<const R: usize, M: Recurrence<R>>(
        self,
        conv: &CausalConv1d,
        conv_input: Tensor<3>,
        call: &mut Call<'_>,
        prepare: impl FnOnce(Tensor<3>, bool, &mut Call<'_>) -> Result<M>,
    ) -> Result<M::Output>
    where
        RecurrentState<R>: CarriedState,
        Tensor<R>: SiteTensor,
    {
        let tokens = conv_input.dims()[1];
        let carried = call.state::<RecurrentState<R>>(self.layer)?;
        let (conv_out, window) = conv.forward(conv_input, carried.conv.take());
        carried.conv = Some(window);
        let previous = carried.state.take();
        let recurrence = prepare(conv_out, previous.is_some(), call)?;
        let site = |s| Site::layer(self.layer, LayerSite::Mixer(self.namespace, s));
        let initial = previous.unwrap_or_else(|| recurrence.zero_state());
        let initial = call.visit(site(MixerSite::StateInput), initial)?;
        let (output, state) = if tokens == 1 {
            // One token: the (possibly written) state output is what this step reads.
            let state = call.visit(site(MixerSite::StateOutput), recurrence.step(initial))?;
            (recurrence.read_out(&state), state)
        } else {
            let (output, state) = recurrence.scan(initial)?;
            (output, call.visit(site(MixerSite::StateOutput), state)?)
        };
        call.state::<RecurrentState<R>>(self.layer)?.state = Some(state);
        Ok(output)
    }
}

//! The per-step shape table, as data: each site's symbolic shape, resolved against a model and a
//! call. One source for the CLI, the conformance checks and the docs.

use super::dim::{Dim, SymbolicShape};
use super::layout::{MixerKind, ModelLayout};
use super::site::{LayerSite, Site};
use super::table::{OUTER_SITES, OuterSite};

/// The sizes of one call: batch, tokens fed, positions seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallDims {
    /// `B`.
    pub batch: usize,
    /// `T`: `prompt_len` at step 0, 1 at a decode step.
    pub tokens: usize,
    /// `S`: `prompt_len + step`.
    pub positions: usize,
}

impl CallDims {
    /// The dimensions of step `step` of a generation from a `prompt_len`-token prompt.
    pub fn at_step(batch: usize, prompt_len: usize, step: usize) -> Self {
        CallDims {
            batch,
            tokens: if step == 0 { prompt_len } else { 1 },
            positions: prompt_len + step,
        }
    }
}

use Dim::*;
impl ModelLayout {
    /// The symbolic shape of a site this model serves, from the schema's tables.
    pub fn symbolic_shape(&self, site: Site) -> SymbolicShape {
        let outer = match site {
            Site::InputIds => OuterSite::InputIds,
            Site::TokenEmbeddings => OuterSite::TokenEmbeddings,
            Site::Logits => OuterSite::Logits,
            Site::NextTokenProbs => OuterSite::NextTokenProbs,
            Site::Layer { layer, site } => match site {
                LayerSite::LayerInput => OuterSite::LayerInput,
                LayerSite::AttentionOutput => OuterSite::AttentionOutput,
                LayerSite::MlpOutput => OuterSite::MlpOutput,
                LayerSite::LayerOutput => OuterSite::LayerOutput,
                LayerSite::Mixer(_, interior) => {
                    // Sites a layer lacks never reach here: layouts are checked before lookup.
                    let table = self.layers.get(layer).map(|spec| spec.mixer.table());
                    return table
                        .and_then(|rows| rows.iter().find(|row| row.site == interior))
                        .map_or(SymbolicShape(&[]), |row| row.shape);
                }
            },
        };
        OUTER_SITES
            .iter()
            .find(|row| row.site == outer)
            .map_or(SymbolicShape(&[]), |row| row.shape)
    }

    /// The number of axes of a site's value.
    pub fn rank(&self, site: Site) -> usize {
        self.symbolic_shape(site).0.len()
    }

    /// A site's shape with the model's own sizes filled in and `None` for the axes that vary
    /// from call to call (`B`, `T`, `S`).
    pub fn fixed_shape(&self, site: Site) -> Vec<Option<usize>> {
        let mixer = match site {
            Site::Layer { layer, .. } => self.layers.get(layer).map(|l| l.mixer),
            _ => None,
        };
        let unused = CallDims::at_step(0, 0, 0);
        self.symbolic_shape(site)
            .0
            .iter()
            .map(|dim| match dim {
                B | T | S => None,
                _ => Some(self.resolve_dim(*dim, mixer.as_ref(), unused)),
            })
            .collect()
    }

    /// The concrete shape of a site in a call of the given dimensions.
    pub fn shape(&self, site: Site, call: CallDims) -> Vec<usize> {
        let mixer = match site {
            Site::Layer { layer, .. } => self.layers.get(layer).map(|l| l.mixer),
            _ => None,
        };
        self.symbolic_shape(site)
            .0
            .iter()
            .map(|dim| self.resolve_dim(*dim, mixer.as_ref(), call))
            .collect()
    }

    fn resolve_dim(&self, dim: Dim, mixer: Option<&MixerKind>, call: CallDims) -> usize {
        match (dim, mixer) {
            (B, _) => call.batch,
            (T, _) => call.tokens,
            (S, _) => call.positions,
            (H, _) => self.hidden,
            (V, _) => self.vocab,
            (NH, Some(MixerKind::SoftmaxAttention { heads, .. })) => *heads,
            (NH, Some(MixerKind::Mamba2 { heads, .. })) => *heads,
            (NKV, Some(MixerKind::SoftmaxAttention { kv_heads, .. })) => *kv_heads,
            (D, Some(MixerKind::SoftmaxAttention { head_dim, .. })) => *head_dim,
            (E, Some(MixerKind::Mamba1 { inner, .. })) => *inner,
            (N, Some(MixerKind::Mamba1 { state, .. } | MixerKind::Mamba2 { state, .. })) => *state,
            (P, Some(MixerKind::Mamba2 { head_dim, .. })) => *head_dim,
            (NV, Some(MixerKind::GatedDeltaNet { value_heads, .. })) => *value_heads,
            (DK, Some(MixerKind::GatedDeltaNet { key_head_dim, .. })) => *key_head_dim,
            (DV, Some(MixerKind::GatedDeltaNet { value_head_dim, .. })) => *value_head_dim,
            // A symbol the mixer lacks cannot occur: `mixer_shape` only names the mixer's own.
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::layout::tests::gpt2_like;
    use super::super::site::MixerSite;
    use super::*;

    #[test]
    fn attention_keys_grow_with_the_cache_and_queries_do_not() {
        let layout = gpt2_like(2);
        let keys = Site::self_attn(1, MixerSite::AttentionKeys);
        let queries = Site::self_attn(1, MixerSite::AttentionQueries);
        assert_eq!(layout.symbolic_shape(keys).to_string(), "[B, NKV, S, D]");
        assert_eq!(
            layout.shape(keys, CallDims::at_step(1, 10, 0)),
            [1, 2, 10, 4]
        );
        assert_eq!(
            layout.shape(keys, CallDims::at_step(1, 10, 2)),
            [1, 2, 12, 4]
        );
        assert_eq!(
            layout.shape(queries, CallDims::at_step(3, 10, 2)),
            [3, 2, 1, 4]
        );
        assert_eq!(
            layout.shape(Site::NextTokenProbs, CallDims::at_step(3, 10, 2)),
            [3, 11]
        );
    }
}

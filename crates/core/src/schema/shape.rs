//! The per-step shape table, as data: each site's symbolic shape, resolved against a model and a
//! call. One source for the CLI, the conformance checks and the docs.

use super::dim::{Dim, SymbolicShape};
use super::layout::{FeedForwardKind, LayerSpec, MixerKind, ModelLayout, Residual};
use super::resolve::{no_dictionary, not_in_architecture};
use super::site::{DictionaryPart, LayerSite, Site};
use super::table::OuterSite;
use crate::error::{Error, Result};

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

impl LayerSpec {
    /// The symbolic shape of this block's `site`, from the schema's tables; `None` where the
    /// block has no such site (an interior site of another mixer or name space, or `mlp_output`
    /// of a block without an MLP).
    pub fn shape_of(&self, site: LayerSite) -> Option<SymbolicShape> {
        let has_mlp = self.has_mlp();
        let outer = match site {
            LayerSite::LayerInput => OuterSite::LayerInput,
            LayerSite::AttentionOutput => OuterSite::AttentionOutput,
            LayerSite::ResidualMid if has_mlp && self.residual == Residual::Sequential => {
                OuterSite::ResidualMid
            }
            LayerSite::MlpInput if has_mlp => OuterSite::MlpInput,
            LayerSite::MlpOutput if has_mlp => OuterSite::MlpOutput,
            LayerSite::ResidualMid | LayerSite::MlpInput | LayerSite::MlpOutput => return None,
            LayerSite::LayerOutput => OuterSite::LayerOutput,
            LayerSite::Mlp(interior) => {
                let mut rows = self.feed_forward.table().iter();
                return rows.find(|row| row.site == interior).map(|row| row.shape);
            }
            LayerSite::Mixer(namespace, interior) => {
                if namespace != self.mixer.namespace() {
                    return None;
                }
                let mut rows = self.mixer.table().iter();
                return rows.find(|row| row.site == interior).map(|row| row.shape);
            }
        };
        Some(outer.row().shape)
    }
}

use Dim::*;
impl ModelLayout {
    /// The symbolic shape of a site this model serves, from the schema's tables.
    ///
    /// A site this model does not serve is an error naming it: [`Error::LayerOutOfRange`] for a
    /// layer past the last, [`Error::SiteNotInArchitecture`] for a site its layer lacks.
    pub fn symbolic_shape(&self, site: Site) -> Result<SymbolicShape> {
        self.shaped(site).map(|(shape, _)| shape)
    }

    /// The number of axes of a site's value (errors as [`Self::symbolic_shape`]).
    pub fn rank(&self, site: Site) -> Result<usize> {
        Ok(self.symbolic_shape(site)?.0.len())
    }

    /// A site's shape with the model's own sizes filled in and `None` for the axes that vary
    /// from call to call (`B`, `T`, `S`); errors as [`Self::shape`].
    pub fn fixed_shape(&self, site: Site) -> Result<Vec<Option<usize>>> {
        let (shape, mixer) = self.shaped(site)?;
        let unused = CallDims::at_step(0, 0, 0);
        shape
            .0
            .iter()
            .map(|dim| match dim {
                B | T | S => Ok(None),
                _ => self.resolve_dim(site, *dim, mixer, unused).map(Some),
            })
            .collect()
    }

    /// The concrete shape of a site in a call of the given dimensions.
    ///
    /// Errors as [`Self::symbolic_shape`], and with [`Error::UnsizedAxis`] where the tables give
    /// the site an axis its block does not size.
    pub fn shape(&self, site: Site, call: CallDims) -> Result<Vec<usize>> {
        let (shape, mixer) = self.shaped(site)?;
        shape
            .0
            .iter()
            .map(|dim| self.resolve_dim(site, *dim, mixer, call))
            .collect()
    }

    /// A site's symbolic shape and the block serving it (`None` outside the blocks).
    fn shaped(&self, site: Site) -> Result<(SymbolicShape, Option<&LayerSpec>)> {
        let outer = match site {
            Site::InputIds => OuterSite::InputIds,
            Site::TokenEmbeddings => OuterSite::TokenEmbeddings,
            Site::FinalNormOutput => OuterSite::FinalNormOutput,
            Site::Logits => OuterSite::Logits,
            Site::NextTokenProbs => OuterSite::NextTokenProbs,
            Site::Layer { layer, site: local } => {
                let spec = self.block(layer, &site)?;
                let shape = spec
                    .shape_of(local)
                    .ok_or_else(|| not_in_architecture(spec, layer, &site))?;
                return Ok((shape, Some(spec)));
            }
            Site::Dictionary { part, .. } => {
                let (host, mixer) = self.shaped(site.dictionary_host())?;
                let (_, placement) = self
                    .dictionary_at(site.dictionary_host())
                    .ok_or_else(|| no_dictionary(site))?;
                let shape = match (part, placement.head) {
                    (DictionaryPart::Features, _) => &[B, T, F][..],
                    (_, None) => host.0,
                    (_, Some(_)) => match host.0 {
                        [B, T, _, P] => &[B, T, P][..],
                        [B, T, _, DV] => &[B, T, DV][..],
                        _ => &[B, T, D][..],
                    },
                };
                return Ok((SymbolicShape(shape), mixer));
            }
        };
        Ok((outer.row().shape, None))
    }

    /// The size of axis `dim` of `site`, served by `block` (`None` outside the blocks).
    fn resolve_dim(
        &self,
        site: Site,
        dim: Dim,
        block: Option<&LayerSpec>,
        call: CallDims,
    ) -> Result<usize> {
        let mixer = block.map(|block| &block.mixer);
        let feed_forward = block.map(|block| &block.feed_forward);
        let size = match (dim, mixer) {
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
            (I, _) => match feed_forward {
                Some(FeedForwardKind::Plain { inner } | FeedForwardKind::Gated { inner }) => *inner,
                _ => return Err(unsized_axis(site, dim, block)),
            },
            (NE, _) => match feed_forward {
                Some(FeedForwardKind::Sparse { experts, .. }) => *experts,
                _ => return Err(unsized_axis(site, dim, block)),
            },
            (K, _) => match feed_forward {
                Some(FeedForwardKind::Sparse { top_k, .. }) => *top_k,
                _ => return Err(unsized_axis(site, dim, block)),
            },
            (F, _) => match self.dictionary_at(site.dictionary_host()) {
                Some((_, placement)) => placement.features,
                None => return Err(no_dictionary(site)),
            },
            _ => return Err(unsized_axis(site, dim, block)),
        };
        Ok(size)
    }
}

/// The error for an axis the tables give `site` that `block` does not size.
fn unsized_axis(site: Site, dim: Dim, block: Option<&LayerSpec>) -> Error {
    Error::UnsizedAxis {
        site: site.to_string(),
        dim: dim.to_string(),
        owner: block.map_or("the model outside its blocks".into(), |block| {
            format!(
                "a {} block with {} feed-forward part",
                block.mixer.describe(),
                block.feed_forward.describe()
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::super::layout::tests::gpt2_like;
    use super::super::site::{MixerNamespace, MixerSite, MlpSite};
    use super::*;

    #[test]
    fn dictionary_values_are_shaped_by_their_placement() {
        use super::super::layout::DictionaryPlacement;
        use super::super::site::DictionaryPart;
        let mut layout = gpt2_like(2);
        let heads = Site::self_attn(0, MixerSite::AttentionHeadOutputs);
        let residual = Site::layer(1, LayerSite::LayerOutput);
        for (site, head) in [(heads, Some(1)), (residual, None)] {
            layout.dictionaries.push(DictionaryPlacement {
                site,
                input: site,
                features: 7,
                head,
            });
        }
        let call = CallDims::at_step(2, 5, 0);
        let part = |site: Site, part| match site {
            Site::Layer { layer, site } => Site::Dictionary { layer, site, part },
            other => other,
        };
        let shape = |site| layout.shape(site, call).unwrap();
        assert_eq!(shape(part(heads, DictionaryPart::Features)), [2, 5, 7]);
        assert_eq!(shape(part(heads, DictionaryPart::Error)), [2, 5, 4]);
        assert_eq!(
            shape(part(residual, DictionaryPart::Reconstruction)),
            [2, 5, 8]
        );
        assert_eq!(
            layout
                .fixed_shape(part(heads, DictionaryPart::Features))
                .unwrap(),
            [None, None, Some(7)]
        );
        let unattached = part(
            Site::layer(0, LayerSite::LayerOutput),
            DictionaryPart::Error,
        );
        assert!(layout.shape(unattached, call).is_err());
    }

    #[test]
    fn attention_keys_grow_with_the_cache_and_queries_do_not() {
        let layout = gpt2_like(2);
        let keys = Site::self_attn(1, MixerSite::AttentionKeys);
        let queries = Site::self_attn(1, MixerSite::AttentionQueries);
        let shape = |site, call| layout.shape(site, call).unwrap();
        assert_eq!(
            layout.symbolic_shape(keys).unwrap().to_string(),
            "[B, NKV, S, D]"
        );
        assert_eq!(shape(keys, CallDims::at_step(1, 10, 0)), [1, 2, 10, 4]);
        assert_eq!(shape(keys, CallDims::at_step(1, 10, 2)), [1, 2, 12, 4]);
        assert_eq!(shape(queries, CallDims::at_step(3, 10, 2)), [3, 2, 1, 4]);
        assert_eq!(
            shape(Site::NextTokenProbs, CallDims::at_step(3, 10, 2)),
            [3, 11]
        );
    }

    #[test]
    fn a_site_the_layer_does_not_serve_has_no_shape() {
        let layout = gpt2_like(2);
        let call = CallDims::at_step(1, 10, 0);
        let state = Site::self_attn(1, MixerSite::StateOutput);
        let err = layout.shape(state, call).unwrap_err();
        assert!(
            matches!(&err, Error::SiteNotInArchitecture { name, layer: 1, .. }
                if name == "layers.1.self_attn.state_output"),
            "{err}"
        );
        let other_namespace = Site::layer(
            0,
            LayerSite::Mixer(MixerNamespace::LinearAttn, MixerSite::AttentionKeys),
        );
        assert!(matches!(
            layout.symbolic_shape(other_namespace),
            Err(Error::SiteNotInArchitecture { .. })
        ));
        let past_the_end = Site::layer(99, LayerSite::LayerOutput);
        let err = layout.rank(past_the_end).unwrap_err();
        assert_eq!(
            err.to_string(),
            "`layers.99.layer_output`: layer 99 is out of range; this model has 2 layers (0..=1)"
        );
        assert!(layout.fixed_shape(past_the_end).is_err());
        let mut no_mlp = gpt2_like(1);
        no_mlp.layers[0].feed_forward = FeedForwardKind::None;
        for site in [
            LayerSite::MlpOutput,
            LayerSite::MlpInput,
            LayerSite::ResidualMid,
            LayerSite::Mlp(MlpSite::PostActivation),
        ] {
            assert!(matches!(
                no_mlp.shape(Site::layer(0, site), call),
                Err(Error::SiteNotInArchitecture { .. })
            ));
        }
        let parallel = ModelLayout::uniform(8, 11, gpt2_like(1).layers[0].parallel(), 1);
        assert!(!parallel.has(Site::layer(0, LayerSite::ResidualMid)));
        assert!(parallel.has(Site::layer(0, LayerSite::MlpInput)));
        let plain = Site::layer(0, LayerSite::Mlp(MlpSite::UpProjection));
        assert!(!gpt2_like(1).has(plain), "a plain MLP has no up projection");
    }

    #[test]
    fn every_site_of_every_block_kind_has_a_sized_shape() {
        let call = CallDims::at_step(1, 1, 0);
        let feed_forwards = FeedForwardKind::every_kind();
        for mixer in MixerKind::every_kind() {
            for feed_forward in feed_forwards.into_iter().chain([FeedForwardKind::None]) {
                let layout = ModelLayout::uniform(1, 1, LayerSpec::new(mixer, feed_forward), 1);
                for site in layout.call_order() {
                    let rank = layout.rank(site).unwrap();
                    let shape = layout.shape(site, call);
                    assert_eq!(shape.map(|s| s.len()).ok(), Some(rank), "{site}: {mixer:?}");
                }
            }
        }
    }

    #[test]
    fn an_axis_no_block_sizes_is_an_error_naming_the_site() {
        let err = gpt2_like(1)
            .resolve_dim(Site::Logits, NH, None, CallDims::at_step(1, 1, 0))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "`logits`: its shape has the axis `NH`, which the model outside its blocks does not size"
        );
    }
}

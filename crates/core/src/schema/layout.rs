//! A model's declared structure (mixer kind per layer) and the step-order contract derived from it.

use super::site::{DictionaryPart, LayerSite, MixerNamespace, MixerSite, Site};

/// The sequence mixer of one layer, with the dimensions its sites are shaped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MixerKind {
    /// Softmax attention with a key/value cache.
    SoftmaxAttention {
        /// Query heads (`NH`).
        heads: usize,
        /// Key/value heads (`NKV`).
        kv_heads: usize,
        /// Head dimension (`D`).
        head_dim: usize,
    },
    /// Mamba-1 selective scan.
    Mamba1 {
        /// Inner size (`E = expand * H`).
        inner: usize,
        /// State size (`N`).
        state: usize,
    },
    /// Mamba-2 state-space duality.
    Mamba2 {
        /// Heads (`NH`).
        heads: usize,
        /// Head dimension (`P`).
        head_dim: usize,
        /// State size (`N`).
        state: usize,
    },
    /// Gated DeltaNet linear attention.
    GatedDeltaNet {
        /// Value heads (`NV`).
        value_heads: usize,
        /// Key head dimension (`DK`).
        key_head_dim: usize,
        /// Value head dimension (`DV`).
        value_head_dim: usize,
    },
}

impl MixerKind {
    /// Human-readable name used in errors and listings.
    pub fn describe(&self) -> &'static str {
        match self {
            MixerKind::SoftmaxAttention { .. } => "softmax attention",
            MixerKind::Mamba1 { .. } => "Mamba-1",
            MixerKind::Mamba2 { .. } => "Mamba-2",
            MixerKind::GatedDeltaNet { .. } => "Gated DeltaNet",
        }
    }

    /// The name space this mixer's sites live under.
    pub fn namespace(&self) -> MixerNamespace {
        match self {
            MixerKind::GatedDeltaNet { .. } => MixerNamespace::LinearAttn,
            _ => MixerNamespace::SelfAttn,
        }
    }

    /// The mixer's interior sites, in call order (its [`MixerKind::table`]).
    pub fn interior_sites(&self) -> impl Iterator<Item = MixerSite> + use<> {
        self.table().iter().map(|row| row.site)
    }

    /// One mixer of every kind (dimensions zero): what the schema's documentation lists.
    pub fn every_kind() -> [MixerKind; 4] {
        // Matching here makes adding a kind without listing it a compile error.
        let kind = |k: MixerKind| match k {
            MixerKind::SoftmaxAttention { .. }
            | MixerKind::Mamba1 { .. }
            | MixerKind::Mamba2 { .. }
            | MixerKind::GatedDeltaNet { .. } => k,
        };
        [
            kind(MixerKind::SoftmaxAttention {
                heads: 0,
                kv_heads: 0,
                head_dim: 0,
            }),
            kind(MixerKind::Mamba1 { inner: 0, state: 0 }),
            kind(MixerKind::Mamba2 {
                heads: 0,
                head_dim: 0,
                state: 0,
            }),
            kind(MixerKind::GatedDeltaNet {
                value_heads: 0,
                key_head_dim: 0,
                value_head_dim: 0,
            }),
        ]
    }
}

/// One block: its mixer and whether it has an MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerSpec {
    /// The sequence mixer.
    pub mixer: MixerKind,
    /// Whether the block has an MLP (and so a `mlp_output` site).
    pub has_mlp: bool,
}

impl LayerSpec {
    /// A softmax-attention block with an MLP.
    pub fn attention(heads: usize, kv_heads: usize, head_dim: usize) -> Self {
        LayerSpec {
            mixer: MixerKind::SoftmaxAttention {
                heads,
                kv_heads,
                head_dim,
            },
            has_mlp: true,
        }
    }

    /// The block's sites, in call order.
    pub fn sites(&self) -> impl Iterator<Item = LayerSite> + '_ {
        let namespace = self.mixer.namespace();
        std::iter::once(LayerSite::LayerInput)
            .chain(
                self.mixer
                    .interior_sites()
                    .map(move |site| LayerSite::Mixer(namespace, site)),
            )
            .chain(std::iter::once(LayerSite::AttentionOutput))
            .chain(self.has_mlp.then_some(LayerSite::MlpOutput))
            .chain(std::iter::once(LayerSite::LayerOutput))
    }

    /// Whether the block has this site (whether [`LayerSpec::shape_of`] gives it a shape).
    pub fn has(&self, site: LayerSite) -> bool {
        self.shape_of(site).is_some()
    }
}

/// Where a feature dictionary is attached and the sizes its sites are shaped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DictionaryPlacement {
    /// The site it replaces (a layer site shaped `[B, T, ...]`); its values are named under it.
    pub site: Site,
    /// The site it encodes: `site` for a sparse autoencoder, an earlier site for a transcoder.
    pub input: Site,
    /// Its number of features (`F`).
    pub features: usize,
    /// The one head of a per-head site it reads (`[B, T, NH, D]` sites only), if any.
    pub head: Option<usize>,
}

/// What an adapter declares about a loaded model: sizes and the mixer of every layer, and the
/// feature dictionaries a researcher attached (none as an adapter declares it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelLayout {
    /// Hidden size (`H`).
    pub hidden: usize,
    /// Vocabulary size (`V`).
    pub vocab: usize,
    /// The blocks, in order.
    pub layers: Vec<LayerSpec>,
    /// The attached dictionaries, at most one per site, in the order they were attached.
    pub dictionaries: Vec<DictionaryPlacement>,
}

/// Number of per-layer slots in the dense site index (4 block sites + every mixer site).
const SLOTS_PER_LAYER: usize = 4 + MixerSite::ALL.len();

impl ModelLayout {
    /// A model whose `count` blocks all have the same `layer` declaration.
    pub fn uniform(hidden: usize, vocab: usize, layer: LayerSpec, count: usize) -> Self {
        ModelLayout::new(hidden, vocab, vec![layer; count])
    }

    /// A model of these blocks, with no dictionary attached.
    pub fn new(hidden: usize, vocab: usize, layers: Vec<LayerSpec>) -> Self {
        ModelLayout {
            hidden,
            vocab,
            layers,
            dictionaries: Vec::new(),
        }
    }

    /// The dictionary attached at `site` and its place among the attached ones.
    pub fn dictionary_at(&self, site: Site) -> Option<(usize, &DictionaryPlacement)> {
        self.dictionaries
            .iter()
            .enumerate()
            .find(|(_, placement)| placement.site == site)
    }

    /// The dictionary sites served after `site`, in call order (none where nothing is attached).
    fn dictionary_sites(&self, site: Site) -> impl Iterator<Item = Site> + use<> {
        let parts = match (site, self.dictionary_at(site)) {
            (Site::Layer { layer, site }, Some(_)) => Some((layer, site)),
            _ => None,
        };
        parts.into_iter().flat_map(|(layer, site)| {
            DictionaryPart::ALL
                .into_iter()
                .map(move |part| Site::Dictionary { layer, site, part })
        })
    }

    /// Every site of one call, in the order the step-order contract prescribes.
    pub fn call_order(&self) -> Vec<Site> {
        let mut order = vec![Site::InputIds, Site::TokenEmbeddings];
        for (layer, spec) in self.layers.iter().enumerate() {
            for site in spec.sites().map(|site| Site::Layer { layer, site }) {
                order.push(site);
                order.extend(self.dictionary_sites(site));
            }
        }
        order.extend([Site::Logits, Site::NextTokenProbs]);
        order
    }

    /// Whether this model serves `site`.
    pub fn has(&self, site: Site) -> bool {
        match site {
            Site::Layer { layer, site } => self.layers.get(layer).is_some_and(|l| l.has(site)),
            Site::Dictionary { .. } => self.dictionary_at(site.dictionary_host()).is_some(),
            _ => true,
        }
    }

    /// Size of the dense slot table [`Self::slot`] indexes into.
    pub fn slot_count(&self) -> usize {
        4 + SLOTS_PER_LAYER * self.layers.len()
            + DictionaryPart::ALL.len() * self.dictionaries.len()
    }

    /// A dense index for a site this model serves: O(1), no hashing, distinct for distinct sites.
    pub fn slot(&self, site: Site) -> usize {
        let per_layer_base = 2;
        match site {
            Site::InputIds => 0,
            Site::TokenEmbeddings => 1,
            Site::Layer { layer, site } => {
                let local = match site {
                    LayerSite::LayerInput => 0,
                    LayerSite::AttentionOutput => 1,
                    LayerSite::MlpOutput => 2,
                    LayerSite::LayerOutput => 3,
                    LayerSite::Mixer(_, interior) => 4 + interior.index(),
                };
                per_layer_base + layer * SLOTS_PER_LAYER + local
            }
            Site::Logits => per_layer_base + self.layers.len() * SLOTS_PER_LAYER,
            Site::NextTokenProbs => per_layer_base + self.layers.len() * SLOTS_PER_LAYER + 1,
            // Past the model's own slots; a dictionary this model lacks gets the (empty) slot
            // one past the table.
            Site::Dictionary { part, .. } => match self.dictionary_at(site.dictionary_host()) {
                Some((place, _)) => {
                    per_layer_base
                        + self.layers.len() * SLOTS_PER_LAYER
                        + 2
                        + place * DictionaryPart::ALL.len()
                        + part as usize
                }
                None => self.slot_count(),
            },
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn gpt2_like(layers: usize) -> ModelLayout {
        ModelLayout::new(
            8,
            11,
            vec![
                LayerSpec {
                    mixer: MixerKind::SoftmaxAttention {
                        heads: 2,
                        kv_heads: 2,
                        head_dim: 4,
                    },
                    has_mlp: true,
                };
                layers
            ],
        )
    }

    #[test]
    fn call_order_follows_the_contract() {
        let names: Vec<String> = gpt2_like(1)
            .call_order()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            names,
            [
                "input_ids",
                "token_embeddings",
                "layers.0.layer_input",
                "layers.0.self_attn.attention_queries",
                "layers.0.self_attn.attention_keys",
                "layers.0.self_attn.attention_values",
                "layers.0.self_attn.attention_scores",
                "layers.0.self_attn.attention_probabilities",
                "layers.0.self_attn.attention_head_outputs",
                "layers.0.attention_output",
                "layers.0.mlp_output",
                "layers.0.layer_output",
                "logits",
                "next_token_probs",
            ]
        );
    }

    #[test]
    fn hybrid_declaration_orders_each_mixer_by_its_table() {
        let layout = ModelLayout::new(
            8,
            11,
            vec![
                LayerSpec {
                    mixer: MixerKind::GatedDeltaNet {
                        value_heads: 2,
                        key_head_dim: 4,
                        value_head_dim: 4,
                    },
                    has_mlp: true,
                },
                LayerSpec {
                    mixer: MixerKind::Mamba1 {
                        inner: 16,
                        state: 4,
                    },
                    has_mlp: false,
                },
            ],
        );
        let names: Vec<String> = layout
            .call_order()
            .iter()
            .map(ToString::to_string)
            .collect();
        let layer0: Vec<&str> = names
            .iter()
            .filter(|n| n.starts_with("layers.0."))
            .map(String::as_str)
            .collect();
        assert_eq!(layer0[1], "layers.0.linear_attn.attention_queries");
        assert_eq!(layer0[4], "layers.0.linear_attn.state_input");
        let layer1: Vec<&str> = names
            .iter()
            .filter(|n| n.starts_with("layers.1."))
            .map(String::as_str)
            .collect();
        assert_eq!(
            layer1,
            [
                "layers.1.layer_input",
                "layers.1.self_attn.state_input",
                "layers.1.self_attn.state_output",
                "layers.1.self_attn.attention_head_outputs",
                "layers.1.attention_output",
                "layers.1.layer_output",
            ]
        );
    }

    #[test]
    fn dictionary_sites_follow_the_site_they_are_attached_to() {
        let mut layout = gpt2_like(1);
        let site = Site::layer(0, LayerSite::AttentionOutput);
        layout.dictionaries.push(DictionaryPlacement {
            site,
            input: site,
            features: 5,
            head: None,
        });
        let names: Vec<String> = layout
            .call_order()
            .iter()
            .map(ToString::to_string)
            .collect();
        let at = names
            .iter()
            .position(|n| n == "layers.0.attention_output")
            .unwrap();
        assert_eq!(
            names[at + 1..at + 5],
            [
                "layers.0.attention_output.sae.features",
                "layers.0.attention_output.sae.reconstruction",
                "layers.0.attention_output.sae.error",
                "layers.0.mlp_output",
            ]
        );
        assert!(!layout.has(Site::Dictionary {
            layer: 0,
            site: LayerSite::LayerOutput,
            part: DictionaryPart::Error,
        }));
    }

    #[test]
    fn slots_are_dense_and_distinct() {
        let mut layout = gpt2_like(3);
        for layer in [2, 0] {
            let site = Site::layer(layer, LayerSite::LayerOutput);
            layout.dictionaries.push(DictionaryPlacement {
                site,
                input: site,
                features: 5,
                head: None,
            });
        }
        let mut slots: Vec<usize> = layout
            .call_order()
            .iter()
            .map(|s| layout.slot(*s))
            .collect();
        assert!(slots.iter().all(|s| *s < layout.slot_count()));
        let n = slots.len();
        assert_eq!(n, gpt2_like(3).call_order().len() + 6);
        slots.sort_unstable();
        slots.dedup();
        assert_eq!(slots.len(), n);
    }
}

//! A model's declared structure (mixer kind per layer) and the step-order contract derived from it.

use super::site::{DictionaryPart, LayerSite, MixerNamespace, MixerSite, MlpSite, Site};

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
        /// Whether a sigmoid gate multiplies each head's output before the output projection
        /// (Qwen3-Next's and Qwen3.5's gated attention; served as `attention_gate`).
        output_gate: bool,
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
            MixerKind::SoftmaxAttention {
                output_gate: false, ..
            } => "softmax attention",
            MixerKind::SoftmaxAttention {
                output_gate: true, ..
            } => "gated softmax attention",
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
    pub fn every_kind() -> [MixerKind; 5] {
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
                output_gate: false,
            }),
            kind(MixerKind::SoftmaxAttention {
                heads: 0,
                kv_heads: 0,
                head_dim: 0,
                output_gate: true,
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

/// A block's feed-forward part, with the sizes its sites are shaped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeedForwardKind {
    /// No feed-forward part (Mamba's blocks): no `mlp_*` sites.
    None,
    /// `down(act(up(x)))` (GPT-2's `c_fc`/`c_proj`, GPT-NeoX's, GPT-J's).
    Plain {
        /// Neurons (`I`).
        inner: usize,
    },
    /// `down(act(gate(x)) * up(x))` (Llama's SwiGLU and its kin).
    Gated {
        /// Neurons (`I`).
        inner: usize,
    },
    /// A mixture of experts (with any shared expert): routing sites, no neuron sites.
    Sparse {
        /// Experts (`NE`).
        experts: usize,
        /// Experts per token (`K`).
        top_k: usize,
    },
}

impl FeedForwardKind {
    /// Human-readable name used in listings.
    pub fn describe(&self) -> &'static str {
        match self {
            FeedForwardKind::None => "no",
            FeedForwardKind::Plain { .. } => "plain MLP",
            FeedForwardKind::Gated { .. } => "gated MLP",
            FeedForwardKind::Sparse { .. } => "mixture-of-experts",
        }
    }

    /// The part's interior sites (`layers.{i}.mlp.*`) in call order (its table).
    pub fn interior_sites(&self) -> impl Iterator<Item = MlpSite> + use<> {
        self.table().iter().map(|row| row.site)
    }

    /// One part of every kind with sites (sizes zero): what the schema's documentation lists.
    pub fn every_kind() -> [FeedForwardKind; 3] {
        // Matching here makes adding a kind without listing it a compile error.
        let kind = |k: FeedForwardKind| match k {
            FeedForwardKind::None
            | FeedForwardKind::Plain { .. }
            | FeedForwardKind::Gated { .. }
            | FeedForwardKind::Sparse { .. } => k,
        };
        [
            kind(FeedForwardKind::Plain { inner: 0 }),
            kind(FeedForwardKind::Gated { inner: 0 }),
            kind(FeedForwardKind::Sparse {
                experts: 0,
                top_k: 0,
            }),
        ]
    }
}

/// How a block's two parts meet the residual stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residual {
    /// `h + mixer(h)`, then `+ mlp(...)` of that: the block has a `residual_mid`.
    Sequential,
    /// `h + mixer(h) + mlp(h)`, both reading the block's input (GPT-NeoX, GPT-J): no
    /// `residual_mid`.
    Parallel,
}

/// One block: its mixer, its feed-forward part and how they meet the residual stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerSpec {
    /// The sequence mixer.
    pub mixer: MixerKind,
    /// The feed-forward part.
    pub feed_forward: FeedForwardKind,
    /// Sequential or parallel.
    pub residual: Residual,
}

impl LayerSpec {
    /// A sequential block of this mixer and feed-forward part.
    pub fn new(mixer: MixerKind, feed_forward: FeedForwardKind) -> Self {
        LayerSpec {
            mixer,
            feed_forward,
            residual: Residual::Sequential,
        }
    }

    /// A sequential softmax-attention block with this feed-forward part.
    pub fn attention(
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        feed_forward: FeedForwardKind,
    ) -> Self {
        let mixer = MixerKind::SoftmaxAttention {
            heads,
            kv_heads,
            head_dim,
            output_gate: false,
        };
        LayerSpec::new(mixer, feed_forward)
    }

    /// The same block with parallel parts.
    pub fn parallel(self) -> Self {
        LayerSpec {
            residual: Residual::Parallel,
            ..self
        }
    }

    /// Whether the block has a feed-forward part (and so `mlp_input` and `mlp_output`).
    pub fn has_mlp(&self) -> bool {
        self.feed_forward != FeedForwardKind::None
    }

    /// The block's sites, in call order.
    pub fn sites(&self) -> impl Iterator<Item = LayerSite> + '_ {
        let namespace = self.mixer.namespace();
        let has_mlp = self.has_mlp();
        let mid = has_mlp && self.residual == Residual::Sequential;
        std::iter::once(LayerSite::LayerInput)
            .chain(
                self.mixer
                    .interior_sites()
                    .map(move |site| LayerSite::Mixer(namespace, site)),
            )
            .chain(std::iter::once(LayerSite::AttentionOutput))
            .chain(mid.then_some(LayerSite::ResidualMid))
            .chain(has_mlp.then_some(LayerSite::MlpInput))
            .chain(self.feed_forward.interior_sites().map(LayerSite::Mlp))
            .chain(has_mlp.then_some(LayerSite::MlpOutput))
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

/// Number of per-layer slots in the dense site index (6 block sites + every mixer and
/// feed-forward site).
const SLOTS_PER_LAYER: usize = 6 + MixerSite::ALL.len() + MlpSite::ALL.len();

/// Number of slots outside the blocks (`input_ids`, `token_embeddings`, `final_norm_output`,
/// `logits`, `next_token_probs`).
const OUTER_SLOTS: usize = 5;

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
        order.extend([Site::FinalNormOutput, Site::Logits, Site::NextTokenProbs]);
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
        OUTER_SLOTS
            + SLOTS_PER_LAYER * self.layers.len()
            + DictionaryPart::ALL.len() * self.dictionaries.len()
    }

    /// A dense index for a site this model serves: O(1), no hashing, distinct for distinct sites.
    pub fn slot(&self, site: Site) -> usize {
        let per_layer_base = 2;
        let past_layers = per_layer_base + self.layers.len() * SLOTS_PER_LAYER;
        match site {
            Site::InputIds => 0,
            Site::TokenEmbeddings => 1,
            Site::Layer { layer, site } => {
                let local = match site {
                    LayerSite::LayerInput => 0,
                    LayerSite::AttentionOutput => 1,
                    LayerSite::ResidualMid => 2,
                    LayerSite::MlpInput => 3,
                    LayerSite::MlpOutput => 4,
                    LayerSite::LayerOutput => 5,
                    LayerSite::Mixer(_, interior) => 6 + interior.index(),
                    LayerSite::Mlp(interior) => 6 + MixerSite::ALL.len() + interior.index(),
                };
                per_layer_base + layer * SLOTS_PER_LAYER + local
            }
            Site::FinalNormOutput => past_layers,
            Site::Logits => past_layers + 1,
            Site::NextTokenProbs => past_layers + 2,
            // Past the model's own slots; a dictionary this model lacks gets the (empty) slot
            // one past the table.
            Site::Dictionary { part, .. } => match self.dictionary_at(site.dictionary_host()) {
                Some((place, _)) => {
                    past_layers + 3 + place * DictionaryPart::ALL.len() + part as usize
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
            vec![LayerSpec::attention(2, 2, 4, FeedForwardKind::Plain { inner: 12 }); layers],
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
                "layers.0.self_attn.attention_head_writes",
                "layers.0.attention_output",
                "layers.0.residual_mid",
                "layers.0.mlp_input",
                "layers.0.mlp.pre_activation",
                "layers.0.mlp.post_activation",
                "layers.0.mlp_output",
                "layers.0.layer_output",
                "final_norm_output",
                "logits",
                "next_token_probs",
            ]
        );
    }

    #[test]
    fn parallel_blocks_have_no_mid_residual_and_gated_ones_an_up_projection() {
        let layer = LayerSpec::attention(2, 2, 4, FeedForwardKind::Gated { inner: 12 }).parallel();
        let names: Vec<String> = layer.sites().map(LayerSite::name).collect();
        assert!(!names.contains(&"residual_mid".to_string()), "{names:?}");
        let mlp: Vec<&String> = names.iter().filter(|n| n.starts_with("mlp")).collect();
        assert_eq!(
            mlp,
            [
                "mlp_input",
                "mlp.pre_activation",
                "mlp.up_projection",
                "mlp.post_activation",
                "mlp_output"
            ]
        );
    }

    #[test]
    fn hybrid_declaration_orders_each_mixer_by_its_table() {
        let layout = ModelLayout::new(
            8,
            11,
            vec![
                LayerSpec::new(
                    MixerKind::GatedDeltaNet {
                        value_heads: 2,
                        key_head_dim: 4,
                        value_head_dim: 4,
                    },
                    FeedForwardKind::Sparse {
                        experts: 4,
                        top_k: 2,
                    },
                ),
                LayerSpec::new(
                    MixerKind::Mamba1 {
                        inner: 16,
                        state: 4,
                    },
                    FeedForwardKind::None,
                ),
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
        assert_eq!(
            layer0[layer0.len() - 6..],
            [
                "layers.0.mlp_input",
                "layers.0.mlp.router_logits",
                "layers.0.mlp.expert_indices",
                "layers.0.mlp.expert_weights",
                "layers.0.mlp_output",
                "layers.0.layer_output",
            ]
        );
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
                "layers.0.residual_mid",
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

//! Typed site names and their canonical strings (`layers.6.self_attn.attention_keys`).

use std::fmt;

/// The interior value of a sequence mixer (`layers.{i}.self_attn.*` or `layers.{i}.linear_attn.*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MixerSite {
    /// Queries as the mixer consumes them.
    AttentionQueries,
    /// Keys (the whole cache for softmax attention, this call's keys for DeltaNet).
    AttentionKeys,
    /// Values (the whole cache for softmax attention, this call's values for DeltaNet).
    AttentionValues,
    /// Scaled, masked scores before the softmax.
    AttentionScores,
    /// Softmax of the scores.
    AttentionProbabilities,
    /// Recurrent state before this call.
    StateInput,
    /// Recurrent state after this call.
    StateOutput,
    /// Per-head mixer output before any gate and the output projection.
    AttentionHeadOutputs,
    /// What each head adds to the residual stream: its slice of the output projection applied
    /// to its (gated) output.
    AttentionHeadWrites,
    /// Gated attention's output gate, which multiplies each head's output.
    AttentionGate,
}

impl MixerSite {
    /// Every mixer site, in a fixed order (not the call order of any one mixer).
    pub const ALL: [MixerSite; 10] = [
        MixerSite::AttentionQueries,
        MixerSite::AttentionKeys,
        MixerSite::AttentionValues,
        MixerSite::AttentionScores,
        MixerSite::AttentionProbabilities,
        MixerSite::StateInput,
        MixerSite::StateOutput,
        MixerSite::AttentionHeadOutputs,
        MixerSite::AttentionHeadWrites,
        MixerSite::AttentionGate,
    ];

    /// This site's place in [`MixerSite::ALL`] (its declaration order): a dense index with no
    /// lookup that could miss.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The canonical name of this site, without its layer prefix.
    pub fn name(self) -> &'static str {
        match self {
            MixerSite::AttentionQueries => "attention_queries",
            MixerSite::AttentionKeys => "attention_keys",
            MixerSite::AttentionValues => "attention_values",
            MixerSite::AttentionScores => "attention_scores",
            MixerSite::AttentionProbabilities => "attention_probabilities",
            MixerSite::StateInput => "state_input",
            MixerSite::StateOutput => "state_output",
            MixerSite::AttentionHeadOutputs => "attention_head_outputs",
            MixerSite::AttentionHeadWrites => "attention_head_writes",
            MixerSite::AttentionGate => "attention_gate",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|site| site.name() == name)
    }
}

/// The name space a layer's mixer sites live under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MixerNamespace {
    /// `self_attn` (softmax attention, Mamba-1, Mamba-2; `mixer` is accepted as an alias).
    SelfAttn,
    /// `linear_attn` (Gated DeltaNet layers of a hybrid).
    LinearAttn,
}

impl MixerNamespace {
    /// The canonical path segment.
    pub fn name(self) -> &'static str {
        match self {
            MixerNamespace::SelfAttn => "self_attn",
            MixerNamespace::LinearAttn => "linear_attn",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        match name {
            "self_attn" | "mixer" => Some(MixerNamespace::SelfAttn),
            "linear_attn" => Some(MixerNamespace::LinearAttn),
            _ => None,
        }
    }
}

/// An interior value of a block's feed-forward part (`layers.{i}.mlp.*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MlpSite {
    /// The neurons' pre-activation: a gated MLP's gate projection, a plain MLP's first one.
    PreActivation,
    /// A gated MLP's up projection.
    UpProjection,
    /// The neuron activations entering the down projection.
    PostActivation,
    /// A mixture of experts' router logits.
    RouterLogits,
    /// The experts each token is routed to.
    ExpertIndices,
    /// The weights of the routed experts' outputs.
    ExpertWeights,
}

impl MlpSite {
    /// Every feed-forward site, in a fixed order (not the call order of any one block).
    pub const ALL: [MlpSite; 6] = [
        MlpSite::PreActivation,
        MlpSite::UpProjection,
        MlpSite::PostActivation,
        MlpSite::RouterLogits,
        MlpSite::ExpertIndices,
        MlpSite::ExpertWeights,
    ];

    /// This site's place in [`MlpSite::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The canonical name of this site, without its `layers.{i}.mlp.` prefix.
    pub fn name(self) -> &'static str {
        match self {
            MlpSite::PreActivation => "pre_activation",
            MlpSite::UpProjection => "up_projection",
            MlpSite::PostActivation => "post_activation",
            MlpSite::RouterLogits => "router_logits",
            MlpSite::ExpertIndices => "expert_indices",
            MlpSite::ExpertWeights => "expert_weights",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|site| site.name() == name)
    }
}

/// The path segment of the feed-forward sites.
const MLP_NAMESPACE: &str = "mlp";

/// A site of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LayerSite {
    /// Residual stream entering the block.
    LayerInput,
    /// An interior value of the block's sequence mixer.
    Mixer(MixerNamespace, MixerSite),
    /// What the sequence mixer adds to the residual stream (after a post-norm, where the
    /// block has one).
    AttentionOutput,
    /// The residual stream between the mixer's add and the MLP's (sequential blocks).
    ResidualMid,
    /// What the feed-forward part reads (after its pre-norm, where the block has one).
    MlpInput,
    /// An interior value of the feed-forward part.
    Mlp(MlpSite),
    /// Output of the MLP.
    MlpOutput,
    /// Residual stream leaving the block.
    LayerOutput,
}

impl LayerSite {
    /// The canonical name of this site, without the `layers.{i}.` prefix.
    pub fn name(self) -> String {
        match self {
            LayerSite::LayerInput => "layer_input".into(),
            LayerSite::Mixer(namespace, site) => format!("{}.{}", namespace.name(), site.name()),
            LayerSite::AttentionOutput => "attention_output".into(),
            LayerSite::ResidualMid => "residual_mid".into(),
            LayerSite::MlpInput => "mlp_input".into(),
            LayerSite::Mlp(site) => format!("{MLP_NAMESPACE}.{}", site.name()),
            LayerSite::MlpOutput => "mlp_output".into(),
            LayerSite::LayerOutput => "layer_output".into(),
        }
    }

    fn parse(name: &str) -> Option<Self> {
        match name {
            "layer_input" => return Some(LayerSite::LayerInput),
            "attention_output" => return Some(LayerSite::AttentionOutput),
            "residual_mid" => return Some(LayerSite::ResidualMid),
            "mlp_input" => return Some(LayerSite::MlpInput),
            "mlp_output" => return Some(LayerSite::MlpOutput),
            "layer_output" => return Some(LayerSite::LayerOutput),
            _ => {}
        }
        let (namespace, site) = name.split_once('.')?;
        if namespace == MLP_NAMESPACE {
            return MlpSite::from_name(site).map(LayerSite::Mlp);
        }
        Some(LayerSite::Mixer(
            MixerNamespace::from_name(namespace)?,
            MixerSite::from_name(site)?,
        ))
    }
}

/// A value a feature dictionary (a sparse autoencoder or a transcoder) attached to a site serves,
/// named under that site: `layers.6.layer_output.sae.features`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DictionaryPart {
    /// The feature activations, `[B, T, F]`.
    Features,
    /// The decoder's output from the features as they flow on.
    Reconstruction,
    /// The site's value minus the reconstruction of the unedited features.
    Error,
}

impl DictionaryPart {
    /// Every part, in call order.
    pub const ALL: [DictionaryPart; 3] = [
        DictionaryPart::Features,
        DictionaryPart::Reconstruction,
        DictionaryPart::Error,
    ];

    /// The part's name, after `.sae.`.
    pub fn name(self) -> &'static str {
        match self {
            DictionaryPart::Features => "features",
            DictionaryPart::Reconstruction => "reconstruction",
            DictionaryPart::Error => "error",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|part| part.name() == name)
    }
}

/// The path segment between a dictionary's site and its parts.
pub const DICTIONARY_SEGMENT: &str = ".sae.";

/// One named place in the forward pass where a value can be read or written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Site {
    /// `input_ids`: the tokens fed to this call.
    InputIds,
    /// `token_embeddings`: the token embedding table's output.
    TokenEmbeddings,
    /// `layers.{layer}.{site}`.
    Layer {
        /// Zero-based block index.
        layer: usize,
        /// The site within the block.
        site: LayerSite,
    },
    /// `layers.{layer}.{site}.sae.{part}`: a value of the dictionary attached to a layer site.
    Dictionary {
        /// Zero-based block index.
        layer: usize,
        /// The site the dictionary is attached to (for a transcoder, the site it writes).
        site: LayerSite,
        /// Which of its values.
        part: DictionaryPart,
    },
    /// `final_norm_output`: the final norm's output, what the language-model head reads.
    FinalNormOutput,
    /// `logits`: the language-model head output (after any final soft-cap).
    Logits,
    /// `next_token_probs`: softmax of the last position's logits.
    NextTokenProbs,
}

impl Site {
    /// Shorthand for a layer site.
    pub fn layer(layer: usize, site: LayerSite) -> Self {
        Site::Layer { layer, site }
    }

    /// Shorthand for a mixer site under `self_attn`.
    pub fn self_attn(layer: usize, site: MixerSite) -> Self {
        Site::layer(layer, LayerSite::Mixer(MixerNamespace::SelfAttn, site))
    }

    /// The site a dictionary value is named under (the site itself for any other site).
    pub fn dictionary_host(self) -> Site {
        match self {
            Site::Dictionary { layer, site, .. } => Site::Layer { layer, site },
            other => other,
        }
    }

    /// Parses a canonical site name. Only the syntax is checked here; whether a model has the
    /// site is [`crate::schema::ModelLayout::resolve`]'s job.
    pub fn parse(name: &str) -> Option<Self> {
        if let Some((host, part)) = name.rsplit_once(DICTIONARY_SEGMENT) {
            let Site::Layer { layer, site } = Site::parse(host)? else {
                return None;
            };
            return Some(Site::Dictionary {
                layer,
                site,
                part: DictionaryPart::from_name(part)?,
            });
        }
        match name {
            "input_ids" => return Some(Site::InputIds),
            "token_embeddings" => return Some(Site::TokenEmbeddings),
            "final_norm_output" => return Some(Site::FinalNormOutput),
            "logits" => return Some(Site::Logits),
            "next_token_probs" => return Some(Site::NextTokenProbs),
            _ => {}
        }
        let rest = name.strip_prefix("layers.")?;
        let (index, site) = rest.split_once('.')?;
        if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(Site::Layer {
            layer: index.parse().ok()?,
            site: LayerSite::parse(site)?,
        })
    }
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Site::InputIds => f.write_str("input_ids"),
            Site::TokenEmbeddings => f.write_str("token_embeddings"),
            Site::Layer { layer, site } => write!(f, "layers.{layer}.{}", site.name()),
            Site::Dictionary { layer, site, part } => write!(
                f,
                "layers.{layer}.{}{DICTIONARY_SEGMENT}{}",
                site.name(),
                part.name()
            ),
            Site::FinalNormOutput => f.write_str("final_norm_output"),
            Site::Logits => f.write_str("logits"),
            Site::NextTokenProbs => f.write_str("next_token_probs"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mixer_and_mlp_site_indexes_its_place_in_all() {
        for (place, site) in MixerSite::ALL.iter().enumerate() {
            assert_eq!(site.index(), place, "{site:?}");
        }
        for (place, site) in MlpSite::ALL.iter().enumerate() {
            assert_eq!(site.index(), place, "{site:?}");
        }
    }

    #[test]
    fn canonical_names_round_trip() {
        let sites = [
            Site::InputIds,
            Site::TokenEmbeddings,
            Site::layer(6, LayerSite::LayerOutput),
            Site::self_attn(6, MixerSite::AttentionKeys),
            Site::layer(
                2,
                LayerSite::Mixer(MixerNamespace::LinearAttn, MixerSite::StateInput),
            ),
            Site::Dictionary {
                layer: 3,
                site: LayerSite::Mixer(MixerNamespace::SelfAttn, MixerSite::AttentionHeadOutputs),
                part: DictionaryPart::Features,
            },
            Site::layer(1, LayerSite::ResidualMid),
            Site::layer(1, LayerSite::MlpInput),
            Site::layer(1, LayerSite::Mlp(MlpSite::PostActivation)),
            Site::self_attn(0, MixerSite::AttentionHeadWrites),
            Site::FinalNormOutput,
            Site::Logits,
            Site::NextTokenProbs,
        ];
        for site in sites {
            assert_eq!(Site::parse(&site.to_string()), Some(site));
        }
        assert_eq!(
            Site::self_attn(6, MixerSite::AttentionKeys).to_string(),
            "layers.6.self_attn.attention_keys"
        );
    }

    #[test]
    fn mixer_alias_parses_to_self_attn() {
        assert_eq!(
            Site::parse("layers.0.mixer.state_output"),
            Some(Site::self_attn(0, MixerSite::StateOutput))
        );
    }

    #[test]
    fn malformed_names_do_not_parse() {
        for name in [
            "",
            "layers",
            "layers.x.layer_output",
            "layers.+1.layer_output",
            "layers..layer_output",
            "layers.0.self_attn",
            "layers.0.self_attn.bogus",
            "layers.0.layer_outputs",
            "logit",
            "layers.0.layer_output.sae",
            "layers.0.layer_output.sae.bogus",
            "logits.sae.features",
            "layers.0.layer_output.sae.features.sae.error",
            "layers.0.mlp.bogus",
            "layers.0.mlp",
            "final_norm",
        ] {
            assert_eq!(Site::parse(name), None, "{name}");
        }
    }
}

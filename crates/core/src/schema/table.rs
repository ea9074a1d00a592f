//! The schema's tables, as data: for every site kind its symbolic shape and meaning, and for
//! every mixer kind its interior sites in call order. The order contract, the shape table, the
//! CLI's listings and `docs/SCHEMA.md` (through `hookscope sites --markdown`) all read these.

use super::dim::{Dim, Dim::*, SymbolicShape};
use super::layout::MixerKind;
use super::site::{DictionaryPart, MixerNamespace, MixerSite};

/// One row of a table: a site's name (relative to its table), symbolic shape and meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SiteRow<S: 'static> {
    /// The site.
    pub site: S,
    /// Its shape per call.
    pub shape: SymbolicShape,
    /// What it holds.
    pub meaning: &'static str,
}

/// A site outside any mixer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OuterSite {
    /// `input_ids`.
    InputIds,
    /// `token_embeddings`.
    TokenEmbeddings,
    /// `layers.{i}.layer_input`.
    LayerInput,
    /// `layers.{i}.attention_output`.
    AttentionOutput,
    /// `layers.{i}.mlp_output`.
    MlpOutput,
    /// `layers.{i}.layer_output`.
    LayerOutput,
    /// `logits`.
    Logits,
    /// `next_token_probs`.
    NextTokenProbs,
}

impl OuterSite {
    /// The name as the table shows it (`layers.{i}.layer_input`).
    pub fn name(self) -> &'static str {
        match self {
            OuterSite::InputIds => "input_ids",
            OuterSite::TokenEmbeddings => "token_embeddings",
            OuterSite::LayerInput => "layers.{i}.layer_input",
            OuterSite::AttentionOutput => "layers.{i}.attention_output",
            OuterSite::MlpOutput => "layers.{i}.mlp_output",
            OuterSite::LayerOutput => "layers.{i}.layer_output",
            OuterSite::Logits => "logits",
            OuterSite::NextTokenProbs => "next_token_probs",
        }
    }
}

const fn row<S>(site: S, shape: &'static [Dim], meaning: &'static str) -> SiteRow<S> {
    SiteRow {
        site,
        shape: SymbolicShape(shape),
        meaning,
    }
}

impl OuterSite {
    /// This site's row of the outer table: its shape and meaning. A `match`, so every site has
    /// one by construction.
    pub const fn row(self) -> SiteRow<OuterSite> {
        match self {
            OuterSite::InputIds => row(self, &[B, T], "the tokens fed to this call"),
            OuterSite::TokenEmbeddings => row(
                self,
                &[B, T, H],
                "rows of the token embedding table, times the architecture's embedding scale \
                 (Gemma: sqrt(H)); before learned positions are added (GPT-2's `wpe`)",
            ),
            OuterSite::LayerInput => row(self, &[B, T, H], "residual stream entering block i"),
            OuterSite::AttentionOutput => row(
                self,
                &[B, T, H],
                "what block i's sequence mixer adds to the residual stream: its output, after \
                 the block's post-norm where it has one (Gemma 2 and 3)",
            ),
            OuterSite::MlpOutput => row(
                self,
                &[B, T, H],
                "what block i's MLP adds to the residual stream, after a post-norm where the \
                 block has one (absent where the block has none, e.g. Mamba; for a \
                 mixture-of-experts block, the whole block's output: routed experts plus any \
                 shared expert)",
            ),
            OuterSite::LayerOutput => row(self, &[B, T, H], "residual stream leaving block i"),
            OuterSite::Logits => row(
                self,
                &[B, T, V],
                "language-model head output, after any final soft-cap (Gemma 2)",
            ),
            OuterSite::NextTokenProbs => row(
                self,
                &[B, V],
                "softmax of the last position's logits: the distribution the call samples from",
            ),
        }
    }
}

/// The sites outside any mixer, in call order (a block's mixer sites come after its
/// `layer_input`).
pub const OUTER_SITES: [SiteRow<OuterSite>; 8] = [
    OuterSite::InputIds.row(),
    OuterSite::TokenEmbeddings.row(),
    OuterSite::LayerInput.row(),
    OuterSite::AttentionOutput.row(),
    OuterSite::MlpOutput.row(),
    OuterSite::LayerOutput.row(),
    OuterSite::Logits.row(),
    OuterSite::NextTokenProbs.row(),
];

use MixerSite::*;

const SOFTMAX_ATTENTION: [SiteRow<MixerSite>; 6] = [
    row(
        AttentionQueries,
        &[B, NH, T, D],
        "queries after any rotary embedding",
    ),
    row(
        AttentionKeys,
        &[B, NKV, S, D],
        "keys of the whole cache after this call's append (rotary applied; every position, \
         on sliding-window layers too)",
    ),
    row(
        AttentionValues,
        &[B, NKV, S, D],
        "values of the whole cache after this call's append",
    ),
    row(
        AttentionScores,
        &[B, NH, T, S],
        "what enters the softmax: `Q Kᵀ` times the layer's scale, soft-capped where the \
         model caps scores (Gemma 2), then masked (causal, padding, sliding window: `-inf`)",
    ),
    row(
        AttentionProbabilities,
        &[B, NH, T, S],
        "softmax of the scores",
    ),
    row(
        AttentionHeadOutputs,
        &[B, T, NH, D],
        "per-head weighted values (probabilities × values), before any output gate and the \
         output projection",
    ),
];

const MAMBA1: [SiteRow<MixerSite>; 3] = [
    row(
        StateInput,
        &[B, E, N],
        "SSM state before this call (zeros at step 0): exactly the previous step's `state_output`",
    ),
    row(
        StateOutput,
        &[B, E, N],
        "SSM state after this call, carried to the next step",
    ),
    row(
        AttentionHeadOutputs,
        &[B, T, E],
        "scan output `y` (with the `D` skip), before gating and out-projection",
    ),
];

const MAMBA2: [SiteRow<MixerSite>; 3] = [
    row(
        StateInput,
        &[B, NH, P, N],
        "SSM state before this call (zeros at step 0): exactly the previous step's `state_output`",
    ),
    row(
        StateOutput,
        &[B, NH, P, N],
        "SSM state after this call, carried to the next step",
    ),
    row(
        AttentionHeadOutputs,
        &[B, T, NH, P],
        "per-head scan output (with the `D` skip), before the gated norm",
    ),
];

const GATED_DELTANET: [SiteRow<MixerSite>; 6] = [
    row(
        AttentionQueries,
        &[B, NV, T, DK],
        "queries as the delta rule consumes them: L2-normalised, heads expanded to NV, without \
         the rule's internal `1/sqrt(DK)` scale",
    ),
    row(
        AttentionKeys,
        &[B, NV, T, DK],
        "this call's keys: L2-normalised, heads expanded (no cache: the state replaces it)",
    ),
    row(AttentionValues, &[B, NV, T, DV], "this call's values"),
    row(
        StateInput,
        &[B, NV, DK, DV],
        "recurrent state before this call (zeros at step 0): exactly the previous step's \
         `state_output`",
    ),
    row(
        StateOutput,
        &[B, NV, DK, DV],
        "recurrent state after this call, carried to the next step",
    ),
    row(
        AttentionHeadOutputs,
        &[B, T, NV, DV],
        "per-head output, before the gated norm and out-projection",
    ),
];

impl MixerKind {
    /// The mixer's interior sites in call order, with shapes and meanings.
    pub fn table(&self) -> &'static [SiteRow<MixerSite>] {
        match self {
            MixerKind::SoftmaxAttention { .. } => &SOFTMAX_ATTENTION,
            MixerKind::Mamba1 { .. } => &MAMBA1,
            MixerKind::Mamba2 { .. } => &MAMBA2,
            MixerKind::GatedDeltaNet { .. } => &GATED_DELTANET,
        }
    }
}

/// Every table of the schema as Markdown, in the form `docs/SCHEMA.md` holds them (what
/// `hookscope sites --markdown` prints).
pub fn markdown() -> String {
    let mut out = String::from("Sites outside the mixers, in call order:\n\n");
    out += &markdown_table(OUTER_SITES.iter().map(|r| (r.site.name().to_string(), r)));
    for kind in MixerKind::every_kind() {
        let namespace = kind.namespace();
        let alias = match namespace {
            MixerNamespace::SelfAttn => " (alias `mixer`)",
            MixerNamespace::LinearAttn => "",
        };
        let name = kind.describe();
        let (first, rest) = name.split_at(name.chars().next().map_or(0, char::len_utf8));
        out += &format!(
            "\n{}{rest} mixer, `layers.{{i}}.{}.*`{alias}, in call order:\n\n",
            first.to_uppercase(),
            namespace.name()
        );
        out += &markdown_table(kind.table().iter().map(|r| (r.site.name().to_string(), r)));
    }
    out += "\nA feature dictionary attached at a layer site `SITE` (shaped `[B, T, X]` or \
            `[B, T, NH, D]`), `SITE.sae.*`, served right after `SITE`, in call order:\n\n\
            | site | shape | meaning |\n| --- | --- | --- |\n";
    for (part, shape, meaning) in DICTIONARY_SITES {
        out += &format!("| `sae.{}` | {shape} | {meaning} |\n", part.name());
    }
    out
}

/// The values a dictionary attached at a site serves: shape (as the docs write it) and meaning.
pub const DICTIONARY_SITES: [(DictionaryPart, &str, &str); 3] = [
    (
        DictionaryPart::Features,
        "`[B, T, F]`",
        "feature activations of the part of `SITE` the dictionary reads (all of it, or for a \
         per-head dictionary one head; for a transcoder, its input site); writing them edits the \
         value that flows on",
    ),
    (
        DictionaryPart::Reconstruction,
        "the part's shape",
        "the decoder's output from the features as they flow on (a transcoder's includes its \
         skip connection)",
    ),
    (
        DictionaryPart::Error,
        "the part's shape",
        "the part minus the reconstruction of the unedited features; what flows on is \
         reconstruction + error: the value itself, exactly, when nothing is written (without \
         the error term, the reconstruction alone)",
    ),
];

fn markdown_table<'a, S: 'static>(rows: impl Iterator<Item = (String, &'a SiteRow<S>)>) -> String {
    let mut out = String::from("| site | shape | meaning |\n| --- | --- | --- |\n");
    for (name, row) in rows {
        out += &format!("| `{name}` | `{}` | {} |\n", row.shape, row.meaning);
    }
    out
}

//! The schema's tables, as data: for every site kind its symbolic shape and meaning, and for
//! every mixer kind its interior sites in call order. The order contract, the shape table, the
//! CLI's listings and `docs/SCHEMA.md` (through `hookscope sites --markdown`) all read these.

use super::dim::{Dim, Dim::*, SymbolicShape};
use super::layout::{FeedForwardKind, MixerKind};
use super::site::{DictionaryPart, MixerNamespace, MixerSite, MlpSite};

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
    /// `layers.{i}.residual_mid`.
    ResidualMid,
    /// `layers.{i}.mlp_input`.
    MlpInput,
    /// `layers.{i}.mlp_output`.
    MlpOutput,
    /// `layers.{i}.layer_output`.
    LayerOutput,
    /// `final_norm_output`.
    FinalNormOutput,
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
            OuterSite::ResidualMid => "layers.{i}.residual_mid",
            OuterSite::MlpInput => "layers.{i}.mlp_input",
            OuterSite::MlpOutput => "layers.{i}.mlp_output",
            OuterSite::LayerOutput => "layers.{i}.layer_output",
            OuterSite::FinalNormOutput => "final_norm_output",
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
            OuterSite::ResidualMid => row(
                self,
                &[B, T, H],
                "residual stream between block i's two adds: `layer_input + attention_output`, \
                 what the MLP branch reads before its norm (sequential blocks with an MLP only; \
                 not served where both parts read the block's input, GPT-NeoX's and GPT-J's \
                 parallel blocks)",
            ),
            OuterSite::MlpInput => row(
                self,
                &[B, T, H],
                "what block i's feed-forward part reads: after its pre-norm where the block has \
                 one (`ln_2(residual_mid)`; the block input's norm in a parallel block; the \
                 residual itself where there is no pre-norm, OLMo-2)",
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
            OuterSite::FinalNormOutput => row(
                self,
                &[B, T, H],
                "the last block's output through the final norm: what the language-model head \
                 reads (nnterp's `ln_final` output); writing it changes the logits",
            ),
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

/// The sites outside any mixer and feed-forward part, in call order (a block's mixer sites come
/// after its `layer_input`, its feed-forward sites after its `mlp_input`).
pub const OUTER_SITES: [SiteRow<OuterSite>; 11] = [
    OuterSite::InputIds.row(),
    OuterSite::TokenEmbeddings.row(),
    OuterSite::LayerInput.row(),
    OuterSite::AttentionOutput.row(),
    OuterSite::ResidualMid.row(),
    OuterSite::MlpInput.row(),
    OuterSite::MlpOutput.row(),
    OuterSite::LayerOutput.row(),
    OuterSite::FinalNormOutput.row(),
    OuterSite::Logits.row(),
    OuterSite::NextTokenProbs.row(),
];

use MixerSite::*;

const SOFTMAX_ATTENTION: [SiteRow<MixerSite>; 7] = [
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
    row(
        AttentionHeadWrites,
        &[B, T, NH, H],
        "what each head adds to the residual stream: its slice of the output projection applied \
         to its head output (after the output gate of gated attention); the heads plus the \
         projection's bias sum to the mixer's output before any post-norm. Computed only when \
         read or written; a write flows on as the sum of the heads plus the bias",
    ),
];

const ATTENTION_GATE: SiteRow<MixerSite> = row(
    AttentionGate,
    &[B, T, NH, D],
    "gated attention's output gate, `sigmoid` of the query projection's gate half (Qwen3-Next, \
     Qwen3.5): multiplies each head's output before the output projection; a write changes what \
     the heads pass on",
);

/// Softmax attention with an output gate: the gate between the head outputs it multiplies and
/// the head writes it feeds.
const GATED_SOFTMAX_ATTENTION: [SiteRow<MixerSite>; 8] = {
    let rows = SOFTMAX_ATTENTION;
    let [.., outputs, writes] = rows;
    assert!(
        matches!(outputs.site, AttentionHeadOutputs) && matches!(writes.site, AttentionHeadWrites)
    );
    [
        rows[0],
        rows[1],
        rows[2],
        rows[3],
        rows[4],
        outputs,
        ATTENTION_GATE,
        writes,
    ]
};

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

const PLAIN_MLP: [SiteRow<MlpSite>; 2] = [
    row(
        MlpSite::PreActivation,
        &[B, T, I],
        "the neurons' pre-activation: the first projection of `mlp_input` (`c_fc`, `fc1`, \
         `dense_h_to_4h`, `fc_in`)",
    ),
    row(
        MlpSite::PostActivation,
        &[B, T, I],
        "the neuron activations, `act(pre_activation)`: what the down projection reads; \
         zeroing neuron `n` is a neuron ablation",
    ),
];

const GATED_MLP: [SiteRow<MlpSite>; 3] = [
    row(
        MlpSite::PreActivation,
        &[B, T, I],
        "the gate projection of `mlp_input` (`gate_proj`), before the activation",
    ),
    row(
        MlpSite::UpProjection,
        &[B, T, I],
        "the up projection of `mlp_input` (`up_proj`)",
    ),
    row(
        MlpSite::PostActivation,
        &[B, T, I],
        "the neuron activations `act(pre_activation) * up_projection`: what the down \
         projection reads; zeroing neuron `n` is a neuron ablation",
    ),
];

const SPARSE_MOE: [SiteRow<MlpSite>; 3] = [
    row(
        MlpSite::RouterLogits,
        &[B, T, NE],
        "the router's logits over the experts; a write changes the routing",
    ),
    row(
        MlpSite::ExpertIndices,
        &[B, T, K],
        "the `K` experts each token is routed to (the largest routing probabilities, ties to \
         the lower index), in increasing index, as floats holding integers; a write (whole \
         numbers below `NE`) reroutes the token",
    ),
    row(
        MlpSite::ExpertWeights,
        &[B, T, K],
        "the weights of those experts' outputs (softmax of the router logits at the chosen \
         experts, renormalised where the model renormalises); writable",
    ),
];

impl FeedForwardKind {
    /// The part's interior sites in call order, with shapes and meanings (none without a part).
    pub fn table(&self) -> &'static [SiteRow<MlpSite>] {
        match self {
            FeedForwardKind::None => &[],
            FeedForwardKind::Plain { .. } => &PLAIN_MLP,
            FeedForwardKind::Gated { .. } => &GATED_MLP,
            FeedForwardKind::Sparse { .. } => &SPARSE_MOE,
        }
    }
}

impl MixerKind {
    /// The mixer's interior sites in call order, with shapes and meanings.
    pub fn table(&self) -> &'static [SiteRow<MixerSite>] {
        match self {
            MixerKind::SoftmaxAttention {
                output_gate: false, ..
            } => &SOFTMAX_ATTENTION,
            MixerKind::SoftmaxAttention {
                output_gate: true, ..
            } => &GATED_SOFTMAX_ATTENTION,
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
    for kind in FeedForwardKind::every_kind() {
        let name = kind.describe();
        let (first, rest) = name.split_at(name.chars().next().map_or(0, char::len_utf8));
        out += &format!(
            "\n{}{rest} feed-forward part, `layers.{{i}}.mlp.*`, in call order (after \
             `mlp_input`):\n\n",
            first.to_uppercase()
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

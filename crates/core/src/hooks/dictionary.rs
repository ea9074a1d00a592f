//! What the hooks need of a feature dictionary attached at a site: encode rows into features,
//! decode features back. The dictionaries themselves (formats, weights) live in
//! `crate::dictionary`, above the layers they are built from.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use burn::tensor::Tensor;

/// A feature dictionary as the hooks run it.
pub trait FeatureDictionary: Send + Sync + fmt::Debug {
    /// Number of features (`F`).
    fn features(&self) -> usize;
    /// Where it was loaded from, for reports and messages.
    fn source(&self) -> &Path;
    /// Encodes rows `input` `[N, d_in]` into features `[N, F]`.
    fn encode(&self, input: Tensor<2>) -> Encoding;
    /// Decodes `features` `[N, F]` (those of `encoding`, or an edit of them) into `[N, d_out]`.
    fn decode(&self, features: Tensor<2>, encoding: &Encoding) -> Tensor<2>;
}

/// One encoding of rows: the features, the rows encoded, and how the input normalisation is
/// undone on the way out (`out * scale + shift`, per row).
#[derive(Debug, Clone)]
pub struct Encoding {
    /// The features `[N, F]`.
    pub features: Tensor<2>,
    /// The rows encoded, `[N, d_in]` (a transcoder's skip connection reads them).
    pub input: Tensor<2>,
    /// Per-row factor `[N, 1]` the decoder's output is multiplied by, if any.
    pub scale: Option<Tensor<2>>,
    /// Per-row offset `[N, 1]` added after it, if any.
    pub shift: Option<Tensor<2>>,
}

/// A dictionary attached to a model: the dictionary and how its output flows on.
#[derive(Debug, Clone)]
pub struct Attachment {
    /// The dictionary.
    pub dictionary: Arc<dyn FeatureDictionary>,
    /// Whether the error term is added back (SAELens' `use_error_term=True`: the model runs
    /// unchanged unless a dictionary value is written). Without it the site is replaced by the
    /// reconstruction at every call, for measuring what the dictionary loses.
    pub error_term: bool,
}

//! What the analyses report, shared by the CLI (`--json`) and `hookscope serve` (its answers):
//! token text, the most likely next tokens, the run, lens, patching, attention, feature and
//! direct-logit-attribution reports as JSON, and the saved values as named tensors (`--out`, the
//! server's safetensors answers).

mod attention;
mod attribution;
mod features;
mod lens;
mod patching;
mod run;

use hookscope_core::{Batch, Error, Model, Result};
use serde_json::{Value, json};

pub use attention::attention_json;
pub use attribution::attribution_json;
pub use features::features_json;
pub use lens::{LensLayer, lens_json, lens_top};
pub use patching::{attribution_patching_json, metric, patch_json, patch_labels};
pub use run::{
    continuation, generation_json, gradient_tensors, gradients_json, saved_tensors,
    top_next_tokens, trace_json,
};

/// The text of one token, or `<ID>` for a model without a tokenizer.
pub fn token_text(model: &Model, id: usize) -> Result<String> {
    match model.tokenizer() {
        Some(tokenizer) => tokenizer.decode(&[id as u32]),
        None => Ok(format!("<{id}>")),
    }
}

/// The tokens of row `row` of `batch` (padding skipped) as text labels.
pub fn prompt_labels(model: &Model, batch: &Batch, row: usize) -> Result<Vec<String>> {
    batch.ids[row]
        .iter()
        .zip(&batch.mask[row])
        .filter(|(_, real)| **real)
        .map(|(id, _)| token_text(model, *id as usize))
        .collect()
}

/// Encodes `text` and requires exactly one token (metrics and attributions name tokens so);
/// `#ID` names a token by id.
pub fn single_token(model: &Model, text: &str) -> Result<u32> {
    if let Some(id) = text.strip_prefix('#').and_then(|id| id.parse::<u32>().ok()) {
        return Ok(id);
    }
    let tokenizer = model.tokenizer().ok_or_else(|| {
        Error::InvalidInput(format!(
            "this model has no tokenizer: name `{text}` by id as `#ID`"
        ))
    })?;
    match tokenizer.encode(text)?.as_slice() {
        [id] => Ok(*id),
        ids => Err(Error::InvalidInput(format!(
            "`{text}` is {} tokens, not one (write `#ID` to name a token by id)",
            ids.len()
        ))),
    }
}

/// One candidate next token.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Its id.
    pub id: usize,
    /// Its text.
    pub text: String,
    /// Its probability.
    pub probability: f32,
}

impl Candidate {
    /// `{"id", "token", "probability"}`.
    pub fn to_json(&self) -> Value {
        json!({"id": self.id, "token": self.text, "probability": self.probability})
    }
}

/// The candidates `(id, probability)` with their text.
pub(crate) fn candidates(model: &Model, top: Vec<(usize, f32)>) -> Result<Vec<Candidate>> {
    top.into_iter()
        .map(|(id, probability)| {
            Ok(Candidate {
                id,
                text: token_text(model, id)?,
                probability,
            })
        })
        .collect()
}

/// The candidates as JSON rows.
pub(crate) fn candidates_json(candidates: &[Candidate]) -> Vec<Value> {
    candidates.iter().map(Candidate::to_json).collect()
}

//! The logit lens's report (`hookscope lens --json`, `POST /v1/lens`).

use hookscope_core::decoding::top_k;
use hookscope_core::{Batch, Error, Interventions, Model, Result};
use serde_json::{Value, json};

use super::{Candidate, candidates};

/// One layer's most likely tokens through the logit lens, at every position of a one-prompt
/// batch: `[position][rank]`.
pub type LensLayer = Vec<Vec<Candidate>>;

/// The logit lens on row 0 of `batch`: every layer's output through the model's final norm and
/// head, its `k` most likely tokens at every position.
pub fn lens_top(model: &Model, batch: &Batch, k: usize) -> Result<Vec<LensLayer>> {
    if k == 0 {
        return Err(Error::InvalidInput(
            "the lens shows at least 1 token (top_k)".into(),
        ));
    }
    let lens = crate::analysis::logit_lens(model, batch, &Interventions::new())?;
    (0..lens.layers())
        .map(|layer| {
            let probs = lens.probabilities(layer).ok_or_else(|| Error::NotServed {
                site: format!("layers.{layer}.layer_output"),
                step: 0,
            })?;
            let [_, _, vocab] = probs.dims();
            let values = hookscope_core::host::f32_values(probs.into_data())?;
            values
                .chunks(vocab.max(1))
                .map(|row| candidates(model, top_k(row, k)))
                .collect()
        })
        .collect()
}

/// The lens as `hookscope lens --json` prints it: `{"layers": [{"layer", "positions":
/// [{"position", "top": [{"id", "token", "prob"}]}]}]}`.
pub fn lens_json(layers: &[LensLayer]) -> Value {
    let layers: Vec<Value> = layers
        .iter()
        .enumerate()
        .map(|(layer, positions)| {
            let positions: Vec<Value> = positions
                .iter()
                .enumerate()
                .map(|(position, top)| {
                    let top: Vec<Value> = top
                        .iter()
                        .map(|c| json!({"id": c.id, "token": c.text, "prob": c.probability}))
                        .collect();
                    json!({"position": position, "top": top})
                })
                .collect();
            json!({"layer": layer, "positions": positions})
        })
        .collect();
    json!({ "layers": layers })
}

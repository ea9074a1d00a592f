//! The logit lens (nostalgebraist, "interpreting GPT: the logit lens", 2020): every layer's
//! residual stream read through the model's own final norm and language-model head.

use hookscope_core::burn::tensor::Tensor;

use hookscope_core::hooks::{Interventions, SiteValue};
use hookscope_core::nn::softmax_last;
use hookscope_core::schema::{LayerSite, Site};
use hookscope_core::{Batch, Model};
use hookscope_core::{Error, Result};

/// Every layer's output of one prompt call, ready to be read through the head. Probabilities
/// are computed one layer at a time, so a long prompt never holds `layers × [B, T, V]`.
pub struct LogitLens<'m> {
    model: &'m Model,
    layer_outputs: Vec<Tensor<3>>,
}

/// Runs the prompt call over `batch` (with `interventions` applied, e.g. a steering addition)
/// up to the last layer and keeps every `layers.{i}.layer_output` for the lens.
pub fn logit_lens<'m>(
    model: &'m Model,
    batch: &Batch,
    interventions: &Interventions,
) -> Result<LogitLens<'m>> {
    let layers = model.layout().layers.len();
    let site = |layer| Site::Layer {
        layer,
        site: LayerSite::LayerOutput,
    };
    let sites: Vec<Site> = (0..layers).map(site).collect();
    let saved = super::prompt_call_saving(model, batch, interventions, &sites)?;
    let layer_outputs = (0..layers)
        .map(|layer| {
            saved
                .get(site(layer), 0)
                .and_then(|value| match value {
                    SiteValue::Float3(t) => Some(t.clone()),
                    _ => None,
                })
                .ok_or_else(|| Error::NotServed {
                    site: site(layer).to_string(),
                    step: 0,
                })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(LogitLens {
        model,
        layer_outputs,
    })
}

impl LogitLens<'_> {
    /// The number of layers.
    pub fn layers(&self) -> usize {
        self.layer_outputs.len()
    }

    /// `[B, T, V]`: softmax of the final norm and head applied to `layers.{layer}.layer_output`.
    /// At the last layer this is the model's own next-token distribution at every position.
    pub fn probabilities(&self, layer: usize) -> Option<Tensor<3>> {
        let hidden = self.layer_outputs.get(layer)?.clone();
        Some(softmax_last(self.model.unembed(hidden)))
    }
}

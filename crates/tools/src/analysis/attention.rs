//! Attention patterns of a prompt (`hookscope attention`, `POST /v1/attention`): every softmax
//! attention layer's probabilities, per head, queries by keys.

use hookscope_core::hooks::{Interventions, SiteValue};
use hookscope_core::host::f32_values;
use hookscope_core::schema::Site;
use hookscope_core::{Batch, Error, Model, Result};

/// One layer's attention probabilities on row 0 of a prompt call.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionLayer {
    /// The block index.
    pub layer: usize,
    /// Query heads.
    pub heads: usize,
    /// Query positions (the prompt's tokens).
    pub queries: usize,
    /// Key positions (the whole context; out-of-window keys hold 0).
    pub keys: usize,
    /// `[head][query][key]`, flat.
    pub probabilities: Vec<f32>,
}

impl AttentionLayer {
    /// One head's pattern, a row per query.
    pub fn pattern(&self, head: usize) -> Vec<Vec<f32>> {
        let start = head * self.queries * self.keys;
        self.probabilities[start..start + self.queries * self.keys]
            .chunks(self.keys.max(1))
            .map(<[f32]>::to_vec)
            .collect()
    }
}

/// `layers.{i}.self_attn.attention_probabilities` of `layers`, or of every layer that has
/// them when `None`: an error naming the site where a layer has none.
pub fn attention_sites(model: &Model, layers: Option<&[usize]>) -> Result<Vec<Site>> {
    let layout = model.layout();
    match layers {
        Some(layers) => layers
            .iter()
            .map(|layer| {
                layout.resolve(&format!("layers.{layer}.self_attn.attention_probabilities"))
            })
            .collect(),
        None => layout.expand("layers.*.self_attn.attention_probabilities"),
    }
}

/// The attention probabilities of `layers` (every layer that has them when `None`) on row 0 of
/// `batch`'s prompt call, in one trace that stops after the last of them.
pub fn attention_patterns(
    model: &Model,
    batch: &Batch,
    layers: Option<&[usize]>,
) -> Result<Vec<AttentionLayer>> {
    let sites = attention_sites(model, layers)?;
    let saved = super::prompt_call_saving(model, batch, &Interventions::new(), &sites)?;
    sites
        .iter()
        .map(|site| {
            let (Site::Layer { layer, .. }, Some(SiteValue::Float4(probs))) =
                (site, saved.get(*site, 0))
            else {
                return Err(Error::NotServed {
                    site: site.to_string(),
                    step: 0,
                });
            };
            let [_, heads, queries, keys] = probs.dims();
            let row0 = probs.clone().slice_dim(0, 0..1);
            Ok(AttentionLayer {
                layer: *layer,
                heads,
                queries,
                keys,
                probabilities: f32_values(row0.into_data())?,
            })
        })
        .collect()
}

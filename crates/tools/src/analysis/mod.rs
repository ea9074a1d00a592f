//! Analyses built on traces: the logit lens, direct logit attribution, activation patching,
//! attention patterns and dictionary features.

mod attention;
mod attribution_patching;
mod features;
mod gradient;
mod lens;
mod logit_attribution;
mod patching;

pub use attention::{AttentionLayer, attention_patterns, attention_sites};
pub use attribution_patching::{
    AttributionMethod, AttributionRow, AttributionSweep, PromptPair, attribution_patching,
    correlation,
};
pub use features::{FeatureReport, feature_report, top_active};
pub use gradient::{GradMetric, Position};
pub use lens::{LogitLens, logit_lens};
pub use logit_attribution::{
    LayerAttribution, LogitAttribution, MixerAttribution, logit_attribution,
};
pub use patching::{Metric, PatchingSweep, activation_patching};

use hookscope_core::hooks::{Interventions, Saved, SiteValue, Steps};
use hookscope_core::schema::Site;
use hookscope_core::{Batch, Error, Model, Result, Run};

/// The prompt call of `batch` with `interventions`, saving every site of `sites` whole and
/// stopping after the last of them.
fn prompt_call_saving(
    model: &Model,
    batch: &Batch,
    interventions: &Interventions,
    sites: &[Site],
) -> Result<Saved> {
    let mut requests = interventions.clone();
    for site in sites {
        requests = requests.save(*site, Steps::At(0));
    }
    let run = Run::new()
        .interventions(&requests)
        .stop_after_last_request();
    Ok(model.trace(batch, run)?.saved)
}

/// Host `values` of `shape` as a value to write at `site` on the model's device; an error
/// naming the site for a shape no site has.
fn value_to_write(
    model: &Model,
    site: Site,
    values: Vec<f32>,
    shape: &[usize],
) -> Result<SiteValue> {
    SiteValue::from_floats(values, shape, model.device()).map_err(|message| Error::Edit {
        site: site.to_string(),
        message,
    })
}

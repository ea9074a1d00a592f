//! Analyses built on traces: the logit lens, direct logit attribution, activation patching and
//! dictionary features.

mod features;
mod lens;
mod logit_attribution;
mod patching;

pub use features::{FeatureReport, feature_report, top_active};
pub use lens::{LogitLens, logit_lens};
pub use logit_attribution::{
    LayerAttribution, LogitAttribution, MixerAttribution, logit_attribution,
};
pub use patching::{Metric, PatchingSweep, activation_patching};

//! Analyses built on traces: the logit lens, activation patching and dictionary features.

mod features;
mod lens;
mod patching;

pub use features::{FeatureReport, feature_report, top_active};
pub use lens::{LogitLens, logit_lens};
pub use patching::{Metric, PatchingSweep, activation_patching};

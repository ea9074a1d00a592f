//! Analyses built on traces: the logit lens and activation patching.

mod lens;
mod patching;

pub use lens::{LogitLens, logit_lens};
pub use patching::{Metric, PatchingSweep, activation_patching};

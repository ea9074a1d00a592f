//! The standard hook schema: site names, per-step shapes and the step-order contract.

mod dim;
mod layout;
mod resolve;
mod shape;
mod site;
mod table;

pub use layout::{
    DictionaryPlacement, FeedForwardKind, LayerSpec, MixerKind, ModelLayout, Residual,
};

pub use dim::{Dim, SymbolicShape};
#[cfg(test)]
pub(crate) use layout::tests;
pub use shape::CallDims;
pub use site::{
    DICTIONARY_SEGMENT, DictionaryPart, LayerSite, MixerNamespace, MixerSite, MlpSite, Site,
};
pub use table::{OUTER_SITES, OuterSite, SiteRow, markdown};

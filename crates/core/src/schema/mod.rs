//! The standard hook schema: site names, per-step shapes and the step-order contract.

mod layout;
mod resolve;
mod shape;
mod site;
mod table;

pub use layout::{LayerSpec, MixerKind, ModelLayout};

#[cfg(test)]
pub(crate) use layout::tests;
pub use shape::{CallDims, Dim, SymbolicShape};
pub use site::{LayerSite, MixerNamespace, MixerSite, Site};
pub use table::{OUTER_SITES, OuterSite, SiteRow, markdown};

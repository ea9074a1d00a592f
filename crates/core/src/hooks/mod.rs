//! The hook engine: requests, per-call dispatch and saved values.

mod dispatch;
mod index;
mod request;
mod spec;
mod value;

pub(crate) use dispatch::Hooks;
pub use dispatch::{Observer, Saved, SavedEntry};
pub use index::{Index, IndexItem, Region};
pub use request::{Action, EditFn, Interventions, Request, Selection, Steps, Write};
pub use spec::{Operand, RequestSpecs, SpecKind, StoredTensor};
pub use value::{SiteTensor, SiteValue};

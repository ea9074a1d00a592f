//! The hook engine: requests, per-call dispatch and saved values.

mod dispatch;
mod request;
mod value;

pub(crate) use dispatch::Hooks;
pub use dispatch::{Observer, Saved};
pub use request::{Action, EditFn, Interventions, Request, Selection, Steps, Write};
pub use value::{SiteTensor, SiteValue};

//! The hook engine: requests, per-call dispatch and saved values.

mod call;
mod request;
mod value;

pub use call::{Hooks, Saved};
pub use request::{Action, EditFn, Interventions, Request, Selection, Steps, Write};
pub use value::{SiteTensor, SiteValue};

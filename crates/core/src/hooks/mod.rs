//! The hook engine: requests, per-call dispatch and saved values.

mod dictionary;
mod dispatch;
mod index;
mod request;
mod spec;
mod value;

pub use dictionary::{Attachment, Encoding, FeatureDictionary};
pub(crate) use dispatch::{Hooks, ModelView};
pub use dispatch::{Observer, Saved, SavedEntry};
pub use index::{Index, IndexItem, Region};
pub use request::{Action, EditFn, Interventions, Request, Selection, Steps, Write};
pub use spec::{Operand, RequestSpecs, SpecKind, StoredTensor};
pub use value::{SiteTensor, SiteValue};

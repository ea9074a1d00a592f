//! # hookscope-conformance
//!
//! Checks that adapters keep hookscope's contract: numerical parity with Hugging Face
//! `transformers` on committed reference fixtures (made by `scripts/make_fixtures.py`).

pub mod parity;
pub mod reference;
pub mod suite;

// Links the built-in adapters so that their `inventory` registrations are present.
use hookscope_arch_gpt2 as _;
use hookscope_arch_llama as _;
use hookscope_arch_mamba as _;

use std::path::PathBuf;

/// The folder of committed fixtures.
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

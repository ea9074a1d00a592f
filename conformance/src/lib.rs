//! # hookscope-conformance
//!
//! Checks that adapters keep hookscope's contract: the suite of contract checks run against every
//! registered architecture ([`suite`]), and numerical parity with Hugging Face `transformers` on
//! reference fixtures made by `scripts/make_fixtures.py` ([`parity`]).

pub mod order;
pub mod parity;
pub mod reference;
pub mod suite;

use std::path::{Path, PathBuf};

/// The environment variable naming a folder of reference fixtures.
pub const FIXTURES_ENV: &str = "HOOKSCOPE_FIXTURES";

/// The committed fixtures of this repository (for its own tests, which run in the source tree).
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// Where a run of the suite finds its fixtures: `explicit` (a `--fixtures` option), else the
/// folder [`FIXTURES_ENV`] names, else none (parity is then skipped, and the report says so).
/// A folder that was named but does not exist is an error, not a silently skipped check.
pub fn locate_fixtures(explicit: Option<&Path>) -> Result<Option<PathBuf>, String> {
    let named = match explicit {
        Some(path) => Some((path.to_path_buf(), "--fixtures")),
        None => std::env::var_os(FIXTURES_ENV).map(|path| (PathBuf::from(path), FIXTURES_ENV)),
    };
    match named {
        None => Ok(None),
        Some((path, _)) if path.is_dir() => Ok(Some(path)),
        Some((path, origin)) => Err(format!(
            "fixtures folder {} (from {origin}) does not exist or is not a folder",
            path.display()
        )),
    }
}

//! # hookscope-conformance
//!
//! Checks that adapters keep hookscope's contract: the suite of contract checks run against every
//! registered architecture ([`suite`], reported as [`report`]), and numerical parity with Hugging Face `transformers` on
//! reference fixtures made by `scripts/make_fixtures.py` ([`parity`]).

pub mod fixture;
pub mod order;
pub mod parity;
pub mod reference;
pub mod report;
pub mod suite;

use std::path::{Path, PathBuf};

pub use fixture::{Fixture, fixtures};

use hookscope::DeviceChoice;
use hookscope::burn::tensor::Device;

/// The environment variable naming a folder of reference fixtures.
pub const FIXTURES_ENV: &str = "HOOKSCOPE_FIXTURES";

/// The environment variable naming the device the tests run on (`cpu` when unset), as
/// `--device` spells it: CI runs the suite once more with `HOOKSCOPE_DEVICE=wgpu`.
pub const DEVICE_ENV: &str = "HOOKSCOPE_DEVICE";

/// The device [`DEVICE_ENV`] names, the CPU when unset; a bad name is an error saying why.
pub fn device_from_env() -> Result<Device, String> {
    let choice = match std::env::var(DEVICE_ENV) {
        Ok(name) => name
            .parse::<DeviceChoice>()
            .map_err(|error| format!("{DEVICE_ENV}: {error}"))?,
        Err(_) => DeviceChoice::Cpu,
    };
    choice
        .open()
        .map_err(|error| format!("{DEVICE_ENV}: {error}"))
}

/// The device the tests of this repository run on: [`device_from_env`].
///
/// # Panics
/// When [`DEVICE_ENV`] names a device this build or machine lacks (a test set-up error).
pub fn test_device() -> Device {
    device_from_env().unwrap_or_else(|error| panic!("{error}"))
}

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
        Some((path, origin)) if path.is_dir() => {
            check_fixture_folder(&path).map_err(|problem| {
                format!(
                    "fixtures folder {} (from {origin}): {problem}",
                    path.display()
                )
            })?;
            Ok(Some(path))
        }
        Some((path, origin)) => Err(format!(
            "fixtures folder {} (from {origin}) does not exist or is not a folder",
            path.display()
        )),
    }
}

/// Files every fixture holds (`make_fixtures.py` writes them all).
const FIXTURE_FILES: [&str; 4] = [
    "config.json",
    "model.safetensors",
    "reference.json",
    "reference.safetensors",
];

/// A requested fixtures folder must hold at least one fixture, and every fixture all of its
/// files: a folder that would let parity pass without checking anything is an error.
fn check_fixture_folder(folder: &Path) -> Result<(), String> {
    let entries = std::fs::read_dir(folder).map_err(|e| format!("cannot read it: {e}"))?;
    let mut fixtures = 0;
    for dir in entries.filter_map(|e| e.ok().map(|e| e.path())) {
        let present: Vec<bool> = FIXTURE_FILES
            .iter()
            .map(|f| dir.join(f).is_file())
            .collect();
        if !present.contains(&true) {
            continue;
        }
        if let Some(missing) = FIXTURE_FILES.iter().zip(&present).find(|(_, p)| !**p) {
            return Err(format!(
                "fixture {} lacks {} (make_fixtures.py writes {})",
                dir.display(),
                missing.0,
                FIXTURE_FILES.join(", ")
            ));
        }
        fixtures += 1;
    }
    match fixtures {
        0 => Err(
            "it holds no fixture (folders with config.json and reference.safetensors, \
                  as conformance/scripts/make_fixtures.py writes them)"
                .into(),
        ),
        _ => Ok(()),
    }
}

//! Records what the plugin ABI fingerprint is derived from: the compiler and target this crate is
//! built with, a hash of its source, the burn it is built against (the dependency spec with its
//! features, and the version the lock file resolved) and the backend features enabled on this
//! crate. Each of these changes the layout of types that cross the plugin boundary (burn's
//! dispatch `Device` gains a variant per backend feature), so a plugin built with any of them
//! different is refused instead of being called with types of another layout.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(&rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| "unknown rustc".into());
    println!("cargo:rustc-env=HOOKSCOPE_RUSTC_VERSION={version}");
    // The compiler itself, for the test that builds a stand-in plugin.
    println!("cargo:rustc-env=HOOKSCOPE_RUSTC={rustc}");
    println!(
        "cargo:rustc-env=HOOKSCOPE_TARGET={}",
        std::env::var("TARGET").unwrap_or_default()
    );
    println!(
        "cargo:rustc-env=HOOKSCOPE_CORE_SOURCE={:016x}",
        source_hash(Path::new("src"))
    );
    println!("cargo:rustc-env=HOOKSCOPE_BURN={}", burn_identity());
    println!(
        "cargo:rustc-env=HOOKSCOPE_BACKEND_FEATURES={}",
        backend_features()
    );
    println!("cargo:rerun-if-env-changed=RUSTC");
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=Cargo.toml");
}

/// The backend features enabled on this crate (`CARGO_FEATURE_*`), sorted: `flex` (always) and
/// any of `wgpu`, `vulkan`, `cuda`, `ndarray`.
fn backend_features() -> String {
    let mut features = vec!["flex".to_string()];
    for feature in ["wgpu", "vulkan", "cuda", "ndarray"] {
        let variable = format!("CARGO_FEATURE_{}", feature.to_uppercase());
        if std::env::var_os(variable).is_some() {
            features.push(feature.to_string());
        }
    }
    features.join("+")
}

/// burn as this build takes it: its dependency spec (this crate's own, or the workspace's when
/// it defers to it), whitespace folded, and the version the nearest `Cargo.lock` resolved.
fn burn_identity() -> String {
    let manifest =
        Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default()).to_path_buf();
    let own = std::fs::read_to_string(manifest.join("Cargo.toml")).unwrap_or_default();
    let mut spec = dependency_line(&own, "burn").unwrap_or_default();
    let mut lock = None;
    for dir in manifest.ancestors().skip(1) {
        let workspace = dir.join("Cargo.toml");
        if lock.is_none() && dir.join("Cargo.lock").is_file() {
            lock = Some(dir.join("Cargo.lock"));
        }
        if spec.contains("workspace")
            && let Some(line) = std::fs::read_to_string(&workspace)
                .ok()
                .and_then(|text| dependency_line(&text, "burn"))
        {
            println!("cargo:rerun-if-changed={}", workspace.display());
            spec = line;
        }
    }
    let locked = lock
        .and_then(|path| {
            println!("cargo:rerun-if-changed={}", path.display());
            std::fs::read_to_string(path).ok()
        })
        .and_then(|text| locked_version(&text, "burn"))
        .unwrap_or_else(|| "unlocked".into());
    format!("{locked} {spec}")
}

/// The `name = ...` line of a manifest's dependency tables, whitespace folded.
fn dependency_line(manifest: &str, name: &str) -> Option<String> {
    manifest
        .lines()
        .map(str::trim)
        .find(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.trim_start().starts_with(['=', '.']))
        })
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// The version a lock file resolved for package `name`.
fn locked_version(lock: &str, name: &str) -> Option<String> {
    let entry = format!("name = \"{name}\"\n");
    let start = lock.find(&entry)? + entry.len();
    let line = lock[start..].lines().next()?;
    Some(
        line.trim()
            .strip_prefix("version = ")?
            .trim_matches('"')
            .to_string(),
    )
}

/// A hash of every file under `dir`: names and contents, in a fixed order.
fn source_hash(dir: &Path) -> u64 {
    let mut files = Vec::new();
    collect(dir, &mut files);
    files.sort();
    let mut hasher = DefaultHasher::new();
    for file in files {
        file.hash(&mut hasher);
        std::fs::read(&file).unwrap_or_default().hash(&mut hasher);
    }
    hasher.finish()
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for path in entries.filter_map(|entry| entry.ok().map(|e| e.path())) {
        if path.is_dir() {
            collect(&path, files);
        } else {
            files.push(path);
        }
    }
}

//! Records the compiler and target this crate was built with, and a hash of its source, for the
//! plugin ABI fingerprint: a plugin built against other hookscope-core sources (even of the
//! same version) is refused instead of being called with types of another layout.

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
    println!(
        "cargo:rustc-env=HOOKSCOPE_TARGET={}",
        std::env::var("TARGET").unwrap_or_default()
    );
    println!(
        "cargo:rustc-env=HOOKSCOPE_CORE_SOURCE={:016x}",
        source_hash(Path::new("src"))
    );
    println!("cargo:rerun-if-env-changed=RUSTC");
    println!("cargo:rerun-if-changed=src");
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

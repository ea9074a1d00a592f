//! Architectures as dynamic plugins: the example GPT-J plugin loaded by path passes the whole
//! conformance suite (with transformers parity), and unusable libraries are refused clearly.

use std::path::PathBuf;
use std::process::{Command, Output};

fn hookscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hookscope"))
        .args(args)
        .output()
        .expect("the hookscope binary runs")
}

/// The example plugin, built beside the `hookscope` binary under test (brought up to date here:
/// a plugin left from another build of hookscope-core is refused, as it should be). It is built
/// with the whole workspace, so its dependencies' features are the binary's: a build of the
/// plugin package alone resolves them anew and compiles the burn stack a second time.
fn example_plugin() -> PathBuf {
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_hookscope"));
    let dir = binary.parent().expect("the binary has a folder");
    let library = dir.join(format!(
        "{}hookscope_plugin_gptj{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    let profile = dir.file_name().and_then(|n| n.to_str()).unwrap_or("debug");
    let mut cargo = Command::new(env!("CARGO"));
    cargo.args(["build", "--workspace"]);
    if profile == "release" {
        cargo.arg("--release");
    }
    let status = cargo.status().expect("cargo runs");
    assert!(status.success(), "building the example plugin failed");
    library
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn the_example_plugin_passes_the_whole_suite() {
    let plugin = example_plugin();
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../conformance/fixtures");
    let output = hookscope(&[
        "--plugin",
        plugin.to_str().unwrap(),
        "conformance",
        "--json",
        "--fixtures",
        fixtures.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", text(&output));
    let reports: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let gptj = reports
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["arch"] == "gptj")
        .expect("the plugin's architecture is registered");
    for check in gptj["checks"].as_array().unwrap() {
        let expected = if check["check"] == "state carried" {
            "n/a"
        } else {
            "pass"
        };
        assert_eq!(check["status"], expected, "{check}");
    }
}

#[test]
fn a_plugin_model_runs_from_the_command_line() {
    let plugin = example_plugin();
    let model = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../conformance/fixtures/gptj-partial-rotary");
    let output = hookscope(&[
        "--plugin",
        plugin.to_str().unwrap(),
        "sites",
        model.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", text(&output));
    assert!(text(&output).contains("layers.1.self_attn.attention_keys"));
}

#[test]
fn unusable_plugins_are_refused_with_the_reason() {
    let plugin = example_plugin();
    let path = plugin.to_str().unwrap();
    let twice = hookscope(&["--plugin", path, "--plugin", path, "archs"]);
    assert!(!twice.status.success());
    assert!(text(&twice).contains("already loaded"), "{}", text(&twice));

    let not_a_library = hookscope(&["--plugin", "Cargo.toml", "archs"]);
    assert!(!not_a_library.status.success());
    assert!(
        text(&not_a_library).contains("not a loadable library"),
        "{}",
        text(&not_a_library)
    );

    // A real library that is not a hookscope plugin: the C library itself.
    let libc = [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists());
    if let Some(libc) = libc {
        let foreign = hookscope(&["--plugin", libc, "archs"]);
        assert!(!foreign.status.success());
        assert!(
            text(&foreign).contains("not a hookscope plugin"),
            "{}",
            text(&foreign)
        );
    }
}

#[test]
fn a_plugin_from_another_build_is_refused_before_it_is_called() {
    // A copy of the plugin whose recorded compiler version differs (same length, patched in the
    // library's bytes): the host must read the fingerprint, name the difference and stop.
    let plugin = example_plugin();
    let mut bytes = std::fs::read(&plugin).unwrap();
    let version = rustc_version();
    let patched = version.replacen("rustc 1.", "rustc 9.", 1);
    assert_eq!(version.len(), patched.len());
    let mut replaced = 0;
    let mut i = 0;
    while let Some(at) = find(&bytes[i..], version.as_bytes()) {
        let start = i + at;
        bytes[start..start + version.len()].copy_from_slice(patched.as_bytes());
        replaced += 1;
        i = start + version.len();
    }
    assert!(replaced > 0, "the plugin records its compiler version");
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join(plugin.file_name().unwrap());
    std::fs::write(&copy, bytes).unwrap();
    let output = hookscope(&["--plugin", copy.to_str().unwrap(), "archs"]);
    assert!(!output.status.success());
    let message = text(&output);
    assert!(message.contains("ABI mismatch"), "{message}");
    assert!(
        message.contains(&format!("rustc: plugin `{patched}`")),
        "{message}"
    );
}

fn rustc_version() -> String {
    let output = Command::new(option_env!("RUSTC").unwrap_or("rustc"))
        .arg("--version")
        .output()
        .expect("rustc runs");
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

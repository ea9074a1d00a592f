//! What the command tests share: running the binary and reading its JSON.

use std::process::{Command, Output};

use serde_json::Value;

/// Runs the `hookscope` binary under test with `args`.
pub fn hookscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hookscope"))
        .args(args)
        .output()
        .expect("the hookscope binary runs")
}

/// The JSON a successful run printed (the test fails with its stderr otherwise).
pub fn json(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

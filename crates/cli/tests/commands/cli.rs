//! The `hookscope` binary end to end.

use std::path::PathBuf;
use std::process::{Command, Output};

use safetensors::SafeTensors;

fn hookscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hookscope"))
        .args(args)
        .output()
        .expect("the hookscope binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../conformance/fixtures")
        .join(name)
}

#[test]
fn archs_lists_every_builtin_architecture() {
    let output = hookscope(&["archs"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(text.contains("gpt2") && text.contains("llama"), "{text}");
}

#[test]
fn run_on_a_local_directory_saves_the_requested_sites() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("trace.safetensors");
    let model = fixture("gpt2-tiny");
    let output = hookscope(&[
        "run",
        model.to_str().unwrap(),
        "--prompt",
        "The Eiffel Tower is in the city of",
        "--save",
        "layers.*.layer_output",
        "--save",
        "layers.1.self_attn.attention_probabilities",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let bytes = std::fs::read(&out).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let mut names = file.names();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "layers.0.layer_output@0",
            "layers.1.layer_output@0",
            "layers.1.self_attn.attention_probabilities@0",
            "output_ids",
        ]
    );
    assert_eq!(
        file.tensor("layers.1.layer_output@0").unwrap().shape(),
        [1, 10, 32]
    );
    assert_eq!(
        file.tensor("layers.1.self_attn.attention_probabilities@0")
            .unwrap()
            .shape(),
        [1, 4, 10, 10]
    );
    let ids: Vec<i64> = file
        .tensor("output_ids")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(ids, [464, 412, 733, 417, 8765, 318, 287, 262, 1748, 286]);
}

#[test]
fn run_without_a_model_uses_the_embedded_default() {
    let output = hookscope(&["run", "--prompt", "Hello world", "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    let prompt = &report["prompts"][0];
    assert_eq!(prompt["input_ids"], serde_json::json!([15496, 995]));
    assert_eq!(prompt["top_next_tokens"].as_array().unwrap().len(), 5);
}

#[test]
fn bad_site_names_fail_with_a_suggestion() {
    let output = hookscope(&["run", "--prompt", "x", "--save", "layers.0.layer_outptu"]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("did you mean `layers.0.layer_output`"),
        "{}",
        stderr(&output)
    );
    let output = hookscope(&["run", "--prompt", "x", "--save", "layers.0.layer_output@3"]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("only step 0"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn sites_prints_the_shape_table() {
    let output = hookscope(&["sites", "--prompt-len", "7", "--step", "2"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let keys = text
        .lines()
        .find(|line| line.starts_with("layers.1.self_attn.attention_keys "))
        .unwrap();
    assert!(
        keys.contains("[B, NKV, S, D]")
            && keys.contains("[1, 2, 7, 16]")
            && keys.contains("[1, 2, 9, 16]"),
        "{keys}"
    );
}

#[test]
fn run_generates_and_saves_every_step_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("gen.safetensors");
    let output = hookscope(&[
        "run",
        "--prompt",
        "The Eiffel Tower is in the city of",
        "--max-new-tokens",
        "3",
        "--greedy",
        "--save",
        "layers.1.layer_output",
        "--save",
        "layers.0.self_attn.attention_keys@2",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let bytes = std::fs::read(&out).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let shape = |name: &str| file.tensor(name).unwrap().shape().to_vec();
    assert_eq!(shape("layers.1.layer_output@0"), [1, 10, 64]);
    assert_eq!(shape("layers.1.layer_output@1"), [1, 1, 64]);
    assert_eq!(shape("layers.1.layer_output@2"), [1, 1, 64]);
    assert_eq!(shape("layers.0.self_attn.attention_keys@2"), [1, 2, 12, 16]);
    assert_eq!(shape("output_ids"), [1, 13]);
    assert_eq!(file.names().len(), 5);
    // The report lists what was saved, site by site, with its shape at each step.
    let report = stdout(&output);
    assert!(
        report.contains("  layers.1.layer_output  @0 [1, 10, 64]  @1 [1, 1, 64]  @2 [1, 1, 64]"),
        "{report}"
    );
    assert!(
        report.contains("  layers.0.self_attn.attention_keys  @2 [1, 2, 12, 16]"),
        "{report}"
    );
}

#[test]
fn generation_json_carries_each_prompts_ids_without_padding() {
    let output = hookscope(&[
        "run",
        "--prompt",
        "Hi",
        "--prompt",
        "The tower",
        "--max-new-tokens",
        "2",
        "--json",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    let ids = |row: usize| report["prompts"][row]["input_ids"].clone();
    assert_eq!(ids(0), serde_json::json!([17250]));
    assert_eq!(ids(1), serde_json::json!([464, 10580]));
    // Each step lists its most likely next tokens; greedy appends the first.
    for row in 0..2 {
        let steps = report["prompts"][row]["steps"].as_array().unwrap();
        assert_eq!(steps.len(), 2);
        for (step, entry) in steps.iter().enumerate() {
            let top = entry["top_next_tokens"].as_array().unwrap();
            assert_eq!(top.len(), 5);
            assert_eq!(entry["token"], top[0]["id"]);
            assert_eq!(entry["token"], report["prompts"][row]["new_ids"][step]);
        }
    }
}

#[test]
fn seeded_sampling_from_the_command_line_is_reproducible() {
    let args = [
        "run",
        "--prompt",
        "Hello",
        "--max-new-tokens",
        "6",
        "--sample",
        "--seed",
        "11",
        "--json",
    ];
    let first = hookscope(&args);
    assert!(first.status.success(), "{}", stderr(&first));
    assert_eq!(stdout(&first), stdout(&hookscope(&args)));
}

#[test]
fn conformance_checks_every_builtin_and_says_when_parity_was_skipped() {
    let mut builtin: Vec<&str> = hookscope::BUILTIN.iter().map(|a| a.name).collect();
    builtin.sort_unstable();
    let reports = |output: &Output| -> Vec<serde_json::Value> {
        assert!(
            output.status.success(),
            "{}{}",
            stdout(output),
            stderr(output)
        );
        serde_json::from_str(&stdout(output)).unwrap()
    };
    let parity = |report: &serde_json::Value| -> String {
        let checks = report["checks"].as_array().unwrap();
        let parity = checks.iter().find(|c| c["check"] == "transformers parity");
        parity.unwrap()["status"].as_str().unwrap().to_string()
    };

    let without = hookscope(&["conformance", "--json"]);
    assert!(
        stderr(&without).contains("parity was skipped"),
        "{}",
        stderr(&without)
    );
    let without = reports(&without);
    let archs: Vec<&str> = without
        .iter()
        .map(|r| r["arch"].as_str().unwrap())
        .collect();
    assert_eq!(archs, builtin);
    assert!(without.iter().all(|r| parity(r) == "skipped"));

    let fixtures = fixture("");
    let with = reports(&hookscope(&[
        "conformance",
        "--json",
        "--fixtures",
        fixtures.to_str().unwrap(),
    ]));
    assert!(with.iter().all(|r| parity(r) == "pass"), "{with:?}");

    let missing = hookscope(&["conformance", "--fixtures", "/no/such/dir"]);
    assert!(!missing.status.success());
    assert!(
        stderr(&missing).contains("/no/such/dir"),
        "{}",
        stderr(&missing)
    );
}

#[test]
fn docs_schema_holds_the_tables_sites_markdown_prints() {
    let output = hookscope(&["sites", "--markdown"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let tables = stdout(&output);
    let doc_path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/SCHEMA.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap();
    let begin = "<!-- BEGIN: hookscope sites --markdown -->\n";
    let end = "<!-- END: hookscope sites --markdown -->";
    let start = doc
        .find(begin)
        .expect("docs/SCHEMA.md marks its generated tables")
        + begin.len();
    let stop = doc[start..].find(end).expect("the generated block ends") + start;
    assert_eq!(
        doc[start..stop].trim(),
        tables.trim(),
        "docs/SCHEMA.md is out of date: replace its generated block by `hookscope sites --markdown`"
    );
    // Every site a model serves is in the tables (here: every mixer kind's and the outer ones).
    for name in [
        "input_ids",
        "layers.{i}.mlp_output",
        "attention_probabilities",
        "state_output",
    ] {
        assert!(tables.contains(&format!("`{name}`")), "{name}");
    }
}

#[test]
fn every_help_explains_model_and_steps() {
    for command in [
        &["--help"][..],
        &["run", "--help"],
        &["sites", "--help"],
        &["bench", "--help"],
        &["conformance", "--help"],
    ] {
        let output = hookscope(command);
        assert!(output.status.success());
        let help = stdout(&output);
        for needle in [
            "MODEL: a local Hugging Face directory",
            "`A:B`",
            "`all`",
            "hub id",
        ] {
            assert!(
                help.contains(needle),
                "{command:?} --help lacks {needle}:\n{help}"
            );
        }
    }
}

/// Bad input found by trying the CLI as a new user would: each is a clear error naming the
/// option or site at fault, or now works, never a panic or a silently ignored request.
#[test]
fn bad_numbers_and_requests_that_would_do_nothing_are_refused() {
    let failure = |args: &[&str], needle: &str| {
        let output = hookscope(args);
        assert!(!output.status.success(), "{args:?} succeeded");
        let message = stderr(&output);
        assert!(message.contains(needle), "{args:?}: {message}");
        assert!(!message.contains("panicked"), "{args:?}: {message}");
    };
    let run = ["run", "--prompt", "Hello world"];
    failure(
        &[&run[..], &["--max-new-tokens", "3", "--save", "logits@99"]].concat(),
        "`logits@99` never runs: this run has 3 step(s), 0..=2",
    );
    failure(
        &[&run[..], &["--max-new-tokens", "18446744073709551615"]].concat(),
        "too large",
    );
    failure(
        &[
            &run[..],
            &["--max-new-tokens", "2", "--greedy", "--top-k", "5"],
        ]
        .concat(),
        "--top-k applies only when sampling",
    );
    failure(
        &[
            "sites",
            "--prompt-len",
            "18446744073709551615",
            "--step",
            "3",
        ],
        "overflows",
    );
}

#[test]
fn bench_runs_in_a_debug_build() {
    let bench = hookscope(&[
        "bench",
        "--prompt-len",
        "6",
        "--batch",
        "3",
        "--iters",
        "1",
        "--warmup",
        "0",
    ]);
    assert!(bench.status.success(), "{}", stderr(&bench));
    let report: serde_json::Value = serde_json::from_str(&stdout(&bench)).unwrap();
    assert_eq!(report["batch"], 3);
    assert_eq!(report["matmul_precision"], "f32");
    assert!(report["load_seconds"].as_f64().unwrap() > 0.0);
    let empty = hookscope(&["bench", "--batch", "0"]);
    assert_eq!(empty.status.code(), Some(2), "{}", stderr(&empty));
    assert!(stderr(&empty).contains("--batch"), "{}", stderr(&empty));
}

/// SIGTERM while `extract` waits for its prompts: the signal watch cleans up and exits 130.
#[cfg(unix)]
#[test]
fn a_terminated_command_says_so_and_exits_130() {
    let dir = tempfile::tempdir().unwrap();
    let prompts = dir.path().join("prompts.fifo");
    let made = Command::new("mkfifo").arg(&prompts).status().unwrap();
    assert!(made.success(), "mkfifo");
    let child = Command::new(env!("CARGO_BIN_EXE_hookscope"))
        .args(["extract", fixture("gpt2-tiny").to_str().unwrap()])
        .args(["--save", "logits", "--prompts"])
        .arg(&prompts)
        .arg("--out-dir")
        .arg(dir.path().join("out"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Opening the write end waits for hookscope to open the read end, after it set its watch.
    let writer = std::fs::OpenOptions::new()
        .write(true)
        .open(&prompts)
        .unwrap();
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success(), "kill");
    let output = child.wait_with_output().unwrap();
    drop(writer);
    assert_eq!(output.status.code(), Some(130), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("interrupted"),
        "{}",
        stderr(&output)
    );
}

/// Output piped into a reader that stops early (`hookscope sites | head -1`) ends the command
/// quietly, as it ends other Unix tools, instead of a panic about a broken pipe.
#[cfg(unix)]
#[test]
fn a_closed_pipe_ends_the_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_hookscope"))
        .args(["sites", "--markdown"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the hookscope binary runs");
    // Closed before the command writes its first line.
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let message = stderr(&output);
    assert!(!message.contains("panicked"), "{message}");
    // SIGPIPE is 13 on Linux, macOS and the BSDs.
    let quiet = output.status.success() || output.status.signal() == Some(13);
    assert!(quiet, "{:?}: {message}", output.status);
}

/// `HOOKSCOPE_CPU_KERNELS` caps the product kernels' family (what `bench` reports), and a value
/// it does not know is refused naming the variable, not silently the default.
#[test]
fn the_kernel_family_can_be_forced_and_typos_are_refused() {
    let bench = |value: &str| {
        Command::new(env!("CARGO_BIN_EXE_hookscope"))
            .args([
                "bench",
                "--prompt-len",
                "4",
                "--iters",
                "1",
                "--warmup",
                "0",
            ])
            .arg("--unhooked-only")
            .env("HOOKSCOPE_CPU_KERNELS", value)
            .output()
            .expect("the hookscope binary runs")
    };
    let output = bench("portable");
    assert!(output.status.success(), "{}", stderr(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["product_kernels"], "portable", "{report}");
    let refused = bench("avx-2");
    assert!(!refused.status.success());
    let message = stderr(&refused);
    assert!(
        message
            .contains("HOOKSCOPE_CPU_KERNELS=avx-2: expected portable, neon, avx2, avx512 or amx"),
        "{message}"
    );
}

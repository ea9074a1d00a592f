//! The bad-input suite: each case builds a corrupted model (from the committed fixtures) or an
//! odd command line, runs the `hookscope` binary (the dev profile: overflow checks on), and
//! asserts a clear error: exit status 1, no panic or abort, and a message naming the file, key,
//! weight, site or option at fault.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../conformance/fixtures")
        .join(name)
}

/// A copy of fixture `name`'s files (with the GPT-2 tokenizer when it has none) in a temporary
/// folder.
struct Corrupted {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Corrupted {
    fn of(name: &str) -> Corrupted {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::create_dir(&path).unwrap();
        for entry in std::fs::read_dir(fixture(name)).unwrap() {
            let entry = entry.unwrap();
            if entry.path().is_file() {
                std::fs::copy(entry.path(), path.join(entry.file_name())).unwrap();
            }
        }
        if !path.join("tokenizer.json").exists() {
            let tokenizer = fixture("gpt2-tiny").join("tokenizer.json");
            std::fs::copy(tokenizer, path.join("tokenizer.json")).unwrap();
        }
        Corrupted { _dir: dir, path }
    }

    /// Edits one of its JSON files.
    fn json(self, file: &str, edit: impl FnOnce(&mut Value)) -> Corrupted {
        let file = self.path.join(file);
        let mut value: Value = match std::fs::read_to_string(&file) {
            Ok(text) => serde_json::from_str(&text).unwrap(),
            Err(_) => json!({}),
        };
        edit(&mut value);
        std::fs::write(&file, value.to_string()).unwrap();
        self
    }

    /// Sets `key` in `config.json`.
    fn config(self, key: &str, value: Value) -> Corrupted {
        self.json("config.json", |config| config[key] = value)
    }

    /// Rewrites `model.safetensors`'s header (names and offsets) with `edit`, keeping the data.
    fn header(self, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> Corrupted {
        let file = self.path.join("model.safetensors");
        let bytes = std::fs::read(&file).unwrap();
        let length = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let mut header: Value = serde_json::from_slice(&bytes[8..8 + length]).unwrap();
        edit(header.as_object_mut().unwrap());
        let mut text = header.to_string().into_bytes();
        text.resize(text.len().div_ceil(8) * 8, b' ');
        let mut out = (text.len() as u64).to_le_bytes().to_vec();
        out.extend(text);
        out.extend(&bytes[8 + length..]);
        std::fs::write(&file, out).unwrap();
        self
    }

    fn arg(&self) -> &str {
        self.path.to_str().unwrap()
    }
}

/// Runs `hookscope ARGS`; asserts a clean failure whose message holds every `needle`.
fn fails_naming(args: &[&str], needles: &[&str]) {
    let output = Command::new(env!("CARGO_BIN_EXE_hookscope"))
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(1),
        "`hookscope {}` must fail cleanly (status 1), got {:?}:\n{stderr}",
        args.join(" "),
        output.status
    );
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "expected `{needle}` in:\n{stderr}");
    }
}

/// `hookscope run MODEL --prompt A` (one token every fixture vocabulary holds), plus `extra`.
fn run_fails(model: &Corrupted, extra: &[&str], needles: &[&str]) {
    let mut args = vec!["run", model.arg(), "--prompt", "A"];
    args.extend(extra);
    fails_naming(&args, needles);
}

#[test]
fn sizes_beyond_any_model_are_refused_before_allocating() {
    for key in ["n_embd", "vocab_size", "n_layer", "n_positions", "n_head"] {
        let model = Corrupted::of("gpt2-tiny").config(key, json!(1_000_000_000_000u64));
        run_fails(
            &model,
            &[],
            &["config.json", &format!("`{key}` is 1000000000000")],
        );
    }
}

/// A checkpoint larger than the machine's memory is refused before any weight is read, with
/// both figures. The file is sparse: its header declares 2 TB of weights that take no disk.
#[test]
fn a_checkpoint_beyond_the_available_memory_is_refused_with_both_figures() {
    let model = Corrupted::of("gpt2-tiny");
    let elements: u64 = 1 << 40;
    let header =
        json!({"huge": {"dtype": "F16", "shape": [elements], "data_offsets": [0, 2 * elements]}});
    let mut text = header.to_string().into_bytes();
    text.resize(text.len().div_ceil(8) * 8, b' ');
    let file = std::fs::File::create(model.path.join("model.safetensors")).unwrap();
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend(&text);
    std::io::Write::write_all(&mut &file, &bytes).unwrap();
    file.set_len(bytes.len() as u64 + 2 * elements).unwrap();
    run_fails(
        &model,
        &["--dtype", "f32"],
        &[
            "in f32 needs about 4.4 TB of memory, and this machine has",
            "available; a half-precision load (--dtype bf16) needs half as much",
        ],
    );
    run_fails(&model, &[], &["in f16 needs about 2.2 TB of memory"]);
}

#[test]
fn config_sizes_that_disagree_with_the_checkpoint_stop_the_load() {
    let model = Corrupted::of("gpt2-tiny").config("n_embd", json!(2_000_000_000u64));
    run_fails(
        &model,
        &[],
        &[
            "`transformer.wte.weight` has shape [50257, 32], expected [50257, 2000000000]",
            "loading stopped here",
        ],
    );
    let model = Corrupted::of("llama-mha-tied").config("num_hidden_layers", json!(5000));
    run_fails(&model, &[], &["`model.layers.2.", "missing", "more"]);
    for (fixture, key) in [
        ("mamba-tied", "hidden_size"),
        ("mamba2-groups1-tied", "state_size"),
        ("qwen3-next-moe", "linear_key_head_dim"),
    ] {
        let model = Corrupted::of(fixture).config(key, json!(1 << 30));
        run_fails(&model, &[], &["cannot load weights", "expected"]);
    }
}

#[test]
fn degenerate_config_values_are_named() {
    let model = Corrupted::of("mamba-tied").config("conv_kernel", json!(0));
    run_fails(&model, &[], &["convolution kernel size is 0"]);
    // Found by the fuzzer (conformance/tests/checks/fuzz.rs): an inverted interval panicked in clamp.
    let model = Corrupted::of("mamba2-groups1-tied")
        .config("time_step_limit", json!([{"__float__": "Infinity"}, 0]));
    run_fails(
        &model,
        &[],
        &["time_step_limit [inf, 0] is not an interval"],
    );
    let model = Corrupted::of("qwen3-next-moe").config("num_experts_per_tok", json!(0));
    run_fails(&model, &[], &["num_experts_per_tok must be between 1"]);
    let model = Corrupted::of("gpt2-tiny").config("layer_norm_epsilon", json!(-1.0));
    run_fails(
        &model,
        &[],
        &["`transformer.h.0.ln_1`", "norm epsilon is -1"],
    );
    let model = Corrupted::of("llama-dynamic").json("config.json", |config| {
        let scaling = if config["rope_parameters"].is_object() {
            "rope_parameters"
        } else {
            "rope_scaling"
        };
        config[scaling]["factor"] = json!(0.5);
    });
    run_fails(&model, &[], &["factor field must be a float >= 1, got 0.5"]);
}

#[test]
fn wrongly_typed_values_name_the_file_and_key() {
    for (key, value, expected) in [
        ("eos_token_id", json!("five"), "must be a token id"),
        ("do_sample", json!("yes"), "must be true or false"),
        ("temperature", json!("hot"), "must be a number"),
        ("pad_token_id", json!(-3), "must be a token id"),
    ] {
        let model = Corrupted::of("gpt2-tiny").json("generation_config.json", |generation| {
            generation[key] = value
        });
        run_fails(
            &model,
            &["--max-new-tokens", "1"],
            &["generation_config.json", &format!("`{key}` {expected}")],
        );
    }
    let model = Corrupted::of("gpt2-tiny").config("model_type", json!(5));
    run_fails(
        &model,
        &[],
        &["config.json", "`model_type` must be a string"],
    );
    let model = Corrupted::of("gpt2-tiny").config("n_embd", json!("32"));
    run_fails(&model, &[], &["config.json", "invalid type: string \"32\""]);
}

#[test]
fn an_unknown_architecture_mentions_plugins() {
    let model = Corrupted::of("gpt2-tiny")
        .config("model_type", json!("gpt7"))
        .config("architectures", json!(["Gpt7ForCausalLM"]));
    run_fails(&model, &[], &["model_type `gpt7`", "--plugin"]);
}

#[test]
fn broken_weights_are_named_as_stored() {
    // A NaN in the final norm's weight.
    let model = Corrupted::of("gpt2-tiny");
    let file = model.path.join("model.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let length = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + length]).unwrap();
    let start = header["transformer.ln_f.weight"]["data_offsets"][0]
        .as_u64()
        .unwrap() as usize;
    let at = 8 + length + start;
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&file, &bytes).unwrap();
    run_fails(
        &model,
        &[],
        &["`transformer.ln_f.weight` holds a non-finite value (NaN)"],
    );

    // A finite f32 weight beyond f16's range, stored in f16 on request: named with the way out.
    let model = Corrupted::of("gpt2-tied");
    let file = model.path.join("model.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let length = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + length]).unwrap();
    let name = "transformer.h.0.mlp.c_fc.weight";
    let start = header[name]["data_offsets"][0].as_u64().unwrap() as usize;
    let at = 8 + length + start + 4 * 5;
    bytes[at..at + 4].copy_from_slice(&1e6f32.to_le_bytes());
    std::fs::write(&file, &bytes).unwrap();
    run_fails(
        &model,
        &["--dtype", "f16"],
        &[
            "`transformer.h.0.mlp.c_fc.weight` holds 1000000 at flat index 5, beyond the range \
             of f16 (load it with --dtype f32 or bf16)",
        ],
    );
    let output = Command::new(env!("CARGO_BIN_EXE_hookscope"))
        .args(["run", model.arg(), "--prompt", "A", "--dtype", "bf16"])
        .output()
        .unwrap();
    assert!(output.status.success(), "bf16 holds 1e6");

    // One weight missing from a prefixed checkpoint: reported once, with its prefix.
    let model = Corrupted::of("gpt2-tiny").header(|header| {
        let info = header.remove("transformer.wte.weight").unwrap();
        header.insert("transformer.wte.renamed".into(), info);
    });
    let output = Command::new(env!("CARGO_BIN_EXE_hookscope"))
        .args(["run", model.arg(), "--prompt", "A"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let problems: Vec<&str> = stderr.lines().skip(1).collect();
    assert_eq!(
        problems,
        ["  `transformer.wte.weight`: missing"],
        "{stderr}"
    );

    // A file cut short.
    let model = Corrupted::of("gpt2-tiny");
    let file = model.path.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    run_fails(
        &model,
        &[],
        &["malformed safetensors file", "model.safetensors"],
    );
}

#[test]
fn a_corrupt_tokenizer_is_named() {
    // Found by the fuzzer: JSON cut inside `decoder` made the tokenizers crate panic.
    let model = Corrupted::of("gpt2-tiny");
    let file = model.path.join("tokenizer.json");
    let text = std::fs::read_to_string(&file).unwrap();
    let cut = text.find("\"decoder\"").unwrap() + 20;
    std::fs::write(&file, &text[..cut]).unwrap();
    run_fails(
        &model,
        &[],
        &["cannot load tokenizer", "tokenizer.json", "not valid JSON"],
    );
}

#[test]
fn a_smaller_tokenizer_is_reported() {
    let model = Corrupted::of("gpt2-tiny").json("tokenizer.json", |tokenizer| {
        let vocab = tokenizer["model"]["vocab"].as_object_mut().unwrap();
        vocab.retain(|_, id| id.as_u64().is_some_and(|id| id < 1000));
        tokenizer["model"]["merges"] = json!([]);
        tokenizer["added_tokens"] = json!([]);
    });
    let output = Command::new(env!("CARGO_BIN_EXE_hookscope"))
        .args(["run", model.arg(), "--prompt", "A"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("tokenizer.json knows 1000 tokens but the model's vocabulary has 50257"),
        "{stderr}"
    );
}

#[test]
fn sampling_from_a_zeroed_distribution_is_refused() {
    let model = Corrupted::of("gpt2-tiny");
    run_fails(
        &model,
        &[
            "--max-new-tokens",
            "2",
            "--sample",
            "--zero",
            "next_token_probs@1",
        ],
        &["step 1, row 0", "cannot pick a token", "sum to 0"],
    );
}

#[test]
fn misleading_requests_get_messages_that_lead() {
    let model = Corrupted::of("gpt2-tiny");
    run_fails(
        &model,
        &["--save", "layers.1.self_attn.attention_output"],
        &["did you mean `layers.1.attention_output`?"],
    );
    run_fails(
        &model,
        &["--save", "logits@1"],
        &["`logits@1`", "single trace", "add --max-new-tokens"],
    );
    run_fails(
        &model,
        &["--max-new-tokens", "3", "--save", "logits@99"],
        &["`logits@99` never runs", "3 step(s)"],
    );
    run_fails(
        &model,
        &["--max-new-tokens", "18446744073709551615"],
        &["18446744073709551615"],
    );
}

#[test]
fn a_fixtures_folder_that_would_check_nothing_fails() {
    let empty = tempfile::tempdir().unwrap();
    let folder = empty.path().to_str().unwrap();
    fails_naming(
        &["conformance", "--fixtures", folder],
        &["holds no fixture"],
    );
    let model = Corrupted::of("gpt2-tiny");
    std::fs::remove_file(model.path.join("reference.safetensors")).unwrap();
    let parent = model.path.parent().unwrap().to_str().unwrap().to_string();
    fails_naming(
        &["conformance", "--fixtures", &parent],
        &["lacks reference.safetensors"],
    );
}

#[test]
fn steps_lost_to_an_early_eos_are_named() {
    let model = Corrupted::of("gpt2-tiny");
    let first = Command::new(env!("CARGO_BIN_EXE_hookscope"))
        .args(["run", model.arg(), "--prompt", "A", "--max-new-tokens", "1"])
        .args(["--greedy", "--json"])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&first.stdout).unwrap();
    let token = report["prompts"][0]["new_ids"][0].clone();
    let model = model.json("generation_config.json", |generation| {
        generation["eos_token_id"] = token;
    });
    let output = Command::new(env!("CARGO_BIN_EXE_hookscope"))
        .args(["run", model.arg(), "--prompt", "A", "--max-new-tokens", "3"])
        .args(["--greedy", "--save", "logits@2"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("generation ended at EOS after 1 of 3 steps")
            && stderr.contains("logits@2"),
        "{stderr}"
    );
}

/// A device this build lacks names the feature that builds it; `hookscope devices` says the
/// same for every backend, and lists the CPU.
#[test]
fn a_device_the_build_lacks_names_its_feature() {
    fails_naming(
        &["run", "--device", "cuda:1", "--prompt", "A"],
        &["device `cuda:1`", "--features cuda", "hookscope devices"],
    );
    fails_naming(
        &["sites", "--device", "ndarray"],
        &["device `ndarray`", "--features ndarray"],
    );
    let output = Command::new(env!("CARGO_BIN_EXE_hookscope"))
        .arg("devices")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(stdout.starts_with("cpu "), "{stdout}");
    assert!(stdout.contains("--features cuda"), "{stdout}");
    let output = Command::new(env!("CARGO_BIN_EXE_hookscope"))
        .args(["run", "--device", "tpu", "--prompt", "A"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && !stderr.contains("panicked"),
        "{stderr}"
    );
    assert!(stderr.contains("expected cpu, wgpu[:N]"), "{stderr}");
}

#[test]
fn bf16_products_need_bf16_weights() {
    let model = Corrupted::of("gpt2-tiny");
    run_fails(
        &model,
        &["--dtype", "f16", "--matmul-precision", "bf16"],
        &[
            "matmul precision `bf16`: bf16 products need weights stored in bf16, and this load \
             stores them in f16 (add --dtype bf16)",
        ],
    );
    let output = Command::new(env!("CARGO_BIN_EXE_hookscope"))
        .args(["run", model.arg(), "--prompt", "A"])
        .args(["--dtype", "bf16", "--matmul-precision", "bf16"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
}

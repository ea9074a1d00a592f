//! Feature dictionaries from the command line: `--sae` on `run` and `sites`, and
//! `hookscope features`, on the GPT-2 fixture and the SAELens dictionaries made for it.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::{hookscope, json};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../conformance/fixtures")
}

/// `gpt2-tied` (whose dictionaries these are) with the GPT-2 tokenizer beside it.
fn model() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let source = fixtures().join("gpt2-tied");
    for entry in std::fs::read_dir(&source).unwrap() {
        let entry = entry.unwrap();
        if entry.path().is_file() {
            std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
    }
    let tokenizer = fixtures().join("gpt2-tiny/tokenizer.json");
    std::fs::copy(tokenizer, dir.path().join("tokenizer.json")).unwrap();
    let path = dir.path().display().to_string();
    (dir, path)
}

fn dictionary(name: &str) -> String {
    fixtures()
        .join("gpt2-tied/dictionaries")
        .join(name)
        .display()
        .to_string()
}

fn top_tokens(report: &Value) -> Value {
    report["prompts"][0]["top_next_tokens"].clone()
}

#[test]
fn features_lists_the_active_features_of_every_attached_dictionary() {
    let (_keep, model) = model();
    let (standard, transcoder) = (dictionary("resid-standard"), dictionary("transcoder-skip"));
    let report = json(&hookscope(&[
        "features",
        &model,
        "--sae",
        &standard,
        "--sae",
        &transcoder,
        "--prompt",
        "A,B;C",
        "--top-k",
        "3",
        "--json",
    ]));
    let dictionaries = report["dictionaries"].as_array().unwrap();
    let sites: Vec<&str> = dictionaries
        .iter()
        .map(|d| d["site"].as_str().unwrap())
        .collect();
    assert_eq!(sites, ["layers.1.layer_input", "layers.1.mlp_output"]);
    for entry in dictionaries {
        let tokens = entry["tokens"].as_array().unwrap();
        assert!(!tokens.is_empty());
        let l0 = entry["l0"].as_f64().unwrap();
        assert!(l0 > 0.0 && l0 <= 24.0, "{entry}");
        assert!(entry["fraction_unexplained"].as_f64().unwrap().is_finite());
        for token in tokens {
            let activations: Vec<f64> = token["features"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["activation"].as_f64().unwrap())
                .collect();
            assert!(activations.len() <= 3);
            assert!(activations.windows(2).all(|w| w[0] >= w[1]), "{token}");
            assert!(activations.iter().all(|a| *a > 0.0));
        }
    }
}

#[test]
fn an_attached_dictionary_changes_nothing_until_a_feature_is_edited() {
    let (_keep, model) = model();
    let sae = format!("layers.1.layer_input={}", dictionary("resid-standard"));
    let run = |extra: &[&str]| {
        let mut args = vec!["run", &model, "--prompt", "A,B;C", "--json"];
        args.extend_from_slice(extra);
        top_tokens(&json(&hookscope(&args)))
    };
    let plain = run(&[]);
    let read = run(&["--sae", &sae, "--save", "layers.1.layer_input.sae.features"]);
    assert_eq!(plain, read, "reading features changed the run");
    let ablated = run(&[
        "--sae",
        &sae,
        "--zero",
        "layers.1.layer_input.sae.features[:, :, 18]",
    ]);
    assert_ne!(plain, ablated, "ablating an active feature changed nothing");
    let steered = run(&[
        "--sae",
        &sae,
        "--add",
        "layers.1.layer_input.sae.features[:, -1, 3]=5",
    ]);
    assert_ne!(plain, steered, "steering a feature changed nothing");
    let spliced = run(&["--sae", &sae, "--sae-without-error"]);
    assert_ne!(
        plain, spliced,
        "splicing the reconstruction changed nothing"
    );
}

#[test]
fn sites_lists_the_dictionary_sites_and_bad_dictionaries_are_named() {
    let (_keep, model) = model();
    let output = hookscope(&["sites", &model, "--sae", &dictionary("z-head1")]);
    assert!(output.status.success());
    let listing = String::from_utf8_lossy(&output.stdout);
    for line in [
        "layers.1.self_attn.attention_head_outputs.sae.features [B, T, F]",
        "layers.1.self_attn.attention_head_outputs.sae.error [B, T, D]",
    ] {
        assert!(listing.contains(line), "{listing}");
    }
    let llama = fixtures().join("llama-gqa2-llama3-bias/dictionaries/resid-jumprelu");
    for (sae, says) in [
        (llama.display().to_string(), "`d_in` is 32"),
        ("/no/such/dictionary".to_string(), "no such file or folder"),
        (
            format!(
                "blocks.1.ln2.hook_normalized={}",
                dictionary("resid-standard")
            ),
            "only a transcoder",
        ),
    ] {
        let output = hookscope(&["run", &model, "--prompt", "A", "--sae", &sae]);
        assert_eq!(output.status.code(), Some(1));
        let message = String::from_utf8_lossy(&output.stderr);
        assert!(message.contains(says), "{sae}: {message}");
    }
    assert!(Path::new(&dictionary("z-head1")).is_dir());
}

#[test]
fn extract_keeps_features_sparse_and_equal_to_a_runs_top_features() {
    let (dir, model) = model();
    let prompts = dir.path().join("prompts.jsonl");
    let lines = [
        "{\"text\": \"A,B;C\"}",
        "{\"ids\": [71, 28]}",
        "{\"ids\": [3]}",
    ];
    std::fs::write(&prompts, lines.join("\n") + "\n").unwrap();
    let out = dir.path().join("rows");
    let sae = dictionary("resid-standard");
    let site = "layers.1.layer_input.sae.features";
    let status = hookscope(&[
        "extract",
        &model,
        "--sae",
        &sae,
        "--prompts",
        prompts.to_str().unwrap(),
        "--save",
        site,
        "--out-dir",
        out.to_str().unwrap(),
        "--feature-top-k",
        "5",
    ]);
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["sites"][0]["sparse_top_k"], 5, "{manifest}");
    let file = out.join(manifest["files"][0].as_str().unwrap());
    let bytes = std::fs::read(&file).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let indices = tensors.tensor(&format!("{site}.indices")).unwrap();
    let values = tensors.tensor(&format!("{site}.values")).unwrap();
    let rows = indices.shape()[0];
    assert_eq!(indices.shape(), [rows, 5]);
    assert_eq!(values.shape(), [rows, 5]);
    assert!(tensors.tensor(site).is_err(), "dense rows were written too");
    // The first prompt's rows are the top 5 of the features a run of it saves.
    let saved = dir.path().join("run.safetensors");
    let run = hookscope(&[
        "run",
        &model,
        "--sae",
        &sae,
        "--prompt",
        "A,B;C",
        "--save",
        site,
        "--out",
        saved.to_str().unwrap(),
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let run_bytes = std::fs::read(&saved).unwrap();
    let run_tensors = safetensors::SafeTensors::deserialize(&run_bytes).unwrap();
    let dense: Vec<f32> = run_tensors
        .tensor(&format!("{site}@0"))
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let sparse_values: Vec<f32> = values
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let sparse_indices: Vec<i64> = indices
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let prompt_index: Vec<i64> = tensors
        .tensor("prompt_index")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let first_rows: Vec<usize> = (0..rows).filter(|r| prompt_index[*r] == 0).collect();
    assert_eq!(first_rows.len(), dense.len() / 24);
    assert_eq!(rows, first_rows.len() + 3);
    for (position, row) in first_rows.into_iter().enumerate() {
        let token = &dense[position * 24..(position + 1) * 24];
        let mut expected: Vec<(usize, f32)> = token
            .iter()
            .copied()
            .enumerate()
            .filter(|(_, v)| *v != 0.0)
            .collect();
        expected.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (slot, (index, value)) in expected.into_iter().take(5).enumerate() {
            assert_eq!(sparse_indices[row * 5 + slot], index as i64, "row {row}");
            assert!(
                (sparse_values[row * 5 + slot] - value).abs() < 1e-6,
                "row {row}"
            );
        }
    }
}

#[test]
fn patch_and_lens_take_dictionary_sites() {
    let (_keep, model) = model();
    let sae = dictionary("resid-standard");
    let site = "layers.1.layer_input.sae.features";
    let sweep = json(&hookscope(&[
        "patch",
        &model,
        "--sae",
        &sae,
        "--clean",
        "A,B;C",
        "--corrupt",
        "A,B;D",
        "--site",
        site,
        "--metric",
        "prob:#5",
        "--json",
    ]));
    assert_eq!(sweep["sites"][0]["site"], site, "{sweep}");
    let scores: Vec<f64> = sweep["sites"][0]["scores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_f64().unwrap())
        .collect();
    // Where the prompts agree the clean features are the corrupt ones: patching them moves
    // nothing (beyond rounding: the value flows on as reconstruction plus error).
    let (last, same) = scores.split_last().unwrap();
    assert!(same.iter().all(|s| s.abs() < 1e-4), "{scores:?}");
    assert!(last.abs() > 1e-3, "{scores:?}");
    // The lens reads through a spliced reconstruction: its layers differ from the plain lens.
    let lens = |extra: &[&str]| {
        let mut args = vec!["lens", &model, "--prompt", "A,B;C", "--json"];
        args.extend_from_slice(extra);
        json(&hookscope(&args))["layers"][1].clone()
    };
    assert_eq!(lens(&["--sae", &sae]), lens(&[]));
    assert_ne!(lens(&["--sae", &sae, "--sae-without-error"]), lens(&[]));
}

#[test]
fn a_transcoder_set_attaches_every_layer_and_a_site_is_for_one_dictionary_alone() {
    let (_keep, model) = model();
    let set = dictionary("ct-gpt2-normalized");
    let report = json(&hookscope(&[
        "features", &model, "--sae", &set, "--prompt", "A,B;C", "--json",
    ]));
    let sites: Vec<&str> = report["dictionaries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["site"].as_str().unwrap())
        .collect();
    assert_eq!(
        sites,
        [
            "layers.0.mlp_output",
            "layers.1.mlp_output",
            "layers.2.mlp_output"
        ]
    );
    let named = format!("layers.1.mlp_output={set}");
    let output = hookscope(&["run", &model, "--prompt", "A", "--sae", &named]);
    assert_eq!(output.status.code(), Some(1));
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(message.contains("one of a set of 3"), "{message}");
}

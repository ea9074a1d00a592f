//! The research toolkit end to end: patching from a saved run (`--set`), the logit lens,
//! attention maps and the activation-patching sweep.

use std::path::PathBuf;
use std::process::Output;

use serde_json::Value;

use crate::support::{hookscope, json};

fn failure(output: &Output) -> String {
    assert_eq!(output.status.code(), Some(1), "expected a clean failure");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn model() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../conformance/fixtures/gpt2-tiny")
        .display()
        .to_string()
}

fn top_ids(report: &Value) -> Vec<u64> {
    report["prompts"][0]["top_next_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_u64().unwrap())
        .collect()
}

#[test]
fn setting_the_last_layer_from_a_saved_run_gives_that_runs_prediction() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("donor.safetensors");
    let model = model();
    let donor = json(&hookscope(&[
        "run",
        &model,
        "--prompt",
        "The cat sat on the",
        "--json",
        "--save",
        "layers.1.layer_output",
        "--out",
        out.to_str().unwrap(),
    ]));
    let own = json(&hookscope(&[
        "run",
        &model,
        "--prompt",
        "A dog ran to a",
        "--json",
    ]));
    assert_ne!(
        top_ids(&donor),
        top_ids(&own),
        "the prompts must differ to show anything"
    );
    let source = format!(
        "layers.1.layer_output={}:layers.1.layer_output@0",
        out.display()
    );
    let patched = json(&hookscope(&[
        "run",
        &model,
        "--prompt",
        "A dog ran to a",
        "--json",
        "--set",
        &source,
    ]));
    assert_eq!(top_ids(&patched), top_ids(&donor));
    // The same value saved under an index is written back under that index.
    let last = format!(
        "layers.1.layer_output[:, -1]={}:layers.1.layer_output@0",
        out.display()
    );
    let error = failure(&hookscope(&[
        "run",
        &model,
        "--prompt",
        "A dog ran to a",
        "--set",
        &last,
    ]));
    assert!(error.contains("cannot broadcast"), "{error}");
}

#[test]
fn the_lens_reports_every_layer_and_position_and_ends_at_the_models_prediction() {
    let model = model();
    let prompt = "The cat sat on the";
    let report = json(&hookscope(&[
        "lens", &model, "--prompt", prompt, "--top-k", "3", "--json",
    ]));
    let layers = report["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 2);
    for layer in layers {
        let positions = layer["positions"].as_array().unwrap();
        assert_eq!(positions.len(), 5);
        for position in positions {
            let probs: Vec<f64> = position["top"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["prob"].as_f64().unwrap())
                .collect();
            assert_eq!(probs.len(), 3);
            assert!(probs.windows(2).all(|w| w[0] >= w[1]), "{probs:?}");
        }
    }
    let run = json(&hookscope(&[
        "run", &model, "--prompt", prompt, "--json", "--top", "3",
    ]));
    let lens_last: Vec<u64> = layers[1]["positions"][4]["top"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_u64().unwrap())
        .collect();
    assert_eq!(lens_last, top_ids(&run));
    let table = hookscope(&["lens", &model, "--prompt", prompt]);
    assert!(table.status.success());
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.starts_with("layer") && text.contains("\" cat\""),
        "{text}"
    );
}

#[test]
fn attention_maps_draw_and_print() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("attention.png");
    let model = model();
    let args = [
        "attention",
        &model,
        "--prompt",
        "one two three",
        "--layer",
        "1",
    ];
    let output = hookscope(&[&args[..], &["--png", png.to_str().unwrap()]].concat());
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 1000);
    let text = hookscope(&[&args[..], &["--head", "0"]].concat());
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert_eq!(text.lines().count(), 1 + 3, "{text}");
    assert!(
        text.contains("layer 1 head 0") && text.contains("top: 0"),
        "{text}"
    );
    let error = failure(&hookscope(&[&args[..], &["--head", "9"]].concat()));
    assert!(error.contains("--head 9: layer 1 has 4 heads"), "{error}");
    let error = failure(&hookscope(&[
        "attention",
        &model,
        "--prompt",
        "x",
        "--layer",
        "5",
    ]));
    assert!(
        error.contains("layer 5") && error.contains("2 layers"),
        "{error}"
    );
}

#[test]
fn the_patching_sweep_restores_the_clean_run_at_the_last_layers_last_position() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("patch.png");
    let model = model();
    let report = json(&hookscope(&[
        "patch",
        &model,
        "--clean",
        "The cat sat on the",
        "--corrupt",
        "The dog sat on the",
        "--site",
        "layers.*.layer_output",
        "--metric",
        "logit-diff: mat, floor",
        "--json",
        "--png",
        png.to_str().unwrap(),
    ]));
    assert_eq!(report["positions"].as_array().unwrap().len(), 5);
    let sites = report["sites"].as_array().unwrap();
    assert_eq!(sites.len(), 2);
    let scores = |k: usize| -> Vec<f64> {
        sites[k]["scores"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_f64().unwrap())
            .collect()
    };
    // Before the differing token nothing changes; the last layer acts only through its last
    // position, which carries the whole clean prediction.
    for k in 0..2 {
        assert!(scores(k)[0].abs() < 1e-4, "{:?}", scores(k));
    }
    let last = scores(1);
    assert!((last[4] - 1.0).abs() < 1e-4, "{last:?}");
    assert!(last[..4].iter().all(|s| s.abs() < 1e-4), "{last:?}");
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));

    // (clean, corrupt, site, metric, what the error must say)
    let refused = [
        (
            "The cat sat",
            "A dog",
            "layers.*.layer_output",
            "prob: mat",
            "same length",
        ),
        (
            "The cat",
            "The dog",
            "layers.*.layer_output",
            "prob: tablecloth-like",
            "not one",
        ),
        (
            "The cat",
            "The dog",
            "layers.0.self_attn.attention_keys",
            "kl",
            "metric `kl`",
        ),
    ];
    for (clean, corrupt, site, metric, needle) in refused {
        let error = failure(&hookscope(&[
            "patch",
            &model,
            "--clean",
            clean,
            "--corrupt",
            corrupt,
            "--site",
            site,
            "--metric",
            metric,
        ]));
        assert!(error.contains(needle), "{metric}: {error}");
    }
}

/// `hookscope dla`: the parts and biases sum to the reported logit difference, which is the
/// run's own; the heads of each layer and the rest sum to its mixer's part; the JSON names
/// every layer, the heatmap is written, and a multi-token target is refused.
#[test]
fn direct_logit_attribution_sums_to_the_runs_logit_difference() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("dla.png");
    let model = model();
    let prompt = "The Eiffel Tower is in the city of";
    let report = json(&hookscope(&[
        "dla",
        &model,
        "--prompt",
        prompt,
        "--target",
        " Paris",
        "--vs",
        " the",
        "--json",
        "--png",
        png.to_str().unwrap(),
    ]));
    let number = |v: &Value| v.as_f64().unwrap();
    let layers = report["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 2);
    let mut sum = number(&report["embeddings"])
        + number(&report["final_norm_bias"])
        + number(&report["head_bias"]);
    for layer in layers {
        let heads: f64 = layer["heads"].as_array().unwrap().iter().map(number).sum();
        assert_eq!(layer["heads"].as_array().unwrap().len(), 4);
        let mixer = number(&layer["mixer"]);
        assert!((heads + number(&layer["mixer_rest"]) - mixer).abs() < 1e-4);
        sum += mixer + number(&layer["mlp"]);
    }
    let logit = number(&report["logit"]);
    assert!((sum - logit).abs() < 1e-4, "{sum} vs {logit}");
    assert!((number(&report["sum"]) - logit).abs() < 1e-4);
    // The logit difference is the run's: the same two logits from `run`'s saved logits.
    let logits = dir.path().join("logits.safetensors");
    let run = hookscope(&[
        "run",
        &model,
        "--prompt",
        prompt,
        "--save",
        "logits[:, -1]",
        "--out",
        logits.to_str().unwrap(),
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let bytes = std::fs::read(&logits).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let row = file.tensor("logits[:, -1]@0").unwrap();
    let values: Vec<f32> = row
        .data()
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let (target, versus) = (
        report["target"].as_u64().unwrap() as usize,
        report["versus"].as_u64().unwrap() as usize,
    );
    assert!((f64::from(values[target] - values[versus]) - logit).abs() < 1e-4);
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));
    let table = hookscope(&["dla", &model, "--prompt", prompt, "--target", " Paris"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("layers.1 mlp") && text.contains("head 3"),
        "{text}"
    );
    let refused = hookscope(&[
        "dla",
        &model,
        "--prompt",
        prompt,
        "--target",
        " Parisian city",
    ]);
    assert!(failure(&refused).contains("not one"));
}

/// `run --grad --save-grad` keeps each site's gradient (`grad:{site}@0` in `--out`, the metric
/// in `--json`), equal to what the library computes; `attrib --compare` gives the estimate,
/// the exact sweep and their correlation, patching's shapes.
#[test]
fn gradients_and_attribution_patching_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("grads.safetensors");
    let model = model();
    let report = json(&hookscope(&[
        "run",
        &model,
        "--prompt",
        "The cat sat on the",
        "--grad",
        "logit-diff: mat, floor",
        "--save-grad",
        "layers.*.layer_output",
        "--save-grad",
        "layers.0.self_attn.attention_head_outputs[:, -1]",
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]));
    let mut keys: Vec<&str> = report["gradients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["key"].as_str().unwrap())
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "grad:layers.0.layer_output@0",
            "grad:layers.0.self_attn.attention_head_outputs[:, -1]@0",
            "grad:layers.1.layer_output@0",
        ]
    );
    let bytes = std::fs::read(&out).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let stored = file.tensor("grad:layers.1.layer_output@0").unwrap();
    assert_eq!(stored.shape(), [1, 5, 32]);
    let stored: Vec<f32> = stored
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    // The library's own gradient of the same metric.
    let device = hookscope::DeviceChoice::Cpu.open().unwrap().autodiff();
    let source = hookscope::ModelSource::Directory(PathBuf::from(&model));
    let loaded = hookscope::Model::load(&source, &device).unwrap();
    let site = loaded.layout().resolve("layers.1.layer_output").unwrap();
    let batch = loaded.encode(&["The cat sat on the"]).unwrap();
    let mut trace = loaded
        .trace(&batch, &hookscope::Interventions::new().grad(site))
        .unwrap();
    let metric = hookscope::analysis::GradMetric::parse(&loaded, "logit-diff: mat, floor")
        .unwrap()
        .measure(&trace)
        .unwrap();
    let value = hookscope::host::f32_values(metric.to_data()).unwrap()[0];
    assert!((report["metric"]["value"].as_f64().unwrap() as f32 - value).abs() < 1e-5);
    let gradients = trace.gradients(&metric).unwrap();
    let expected =
        hookscope::host::f32_values(gradients.require(site, 0).unwrap().to_data()).unwrap();
    assert_eq!(stored, expected);
    assert!(expected.iter().any(|g| g.abs() > 1e-4));

    let report = json(&hookscope(&[
        "attrib",
        &model,
        "--clean",
        "The cat sat on the",
        "--corrupt",
        "The dog sat on the",
        "--site",
        "layers.*.self_attn.attention_head_outputs",
        "--metric",
        "logit-diff: mat, floor",
        "--compare",
        "--json",
    ]));
    assert_eq!(report["method"], "atp");
    assert_eq!(report["sites"].as_array().unwrap().len(), 2);
    let heads = report["heads"].as_array().unwrap();
    assert_eq!(heads.len(), 2 * 4);
    assert_eq!(heads[5]["head"], 1);
    assert_eq!(report["positions"].as_array().unwrap().len(), 5);
    assert_eq!(report["patching"]["sites"].as_array().unwrap().len(), 2);
    let r = report["correlation"].as_f64().unwrap();
    assert!(r > 0.5 && r <= 1.0, "{r}");
    // Before the differing token nothing changes, in the estimate as in the exact sweep.
    for site in report["sites"].as_array().unwrap() {
        assert!(site["scores"][0].as_f64().unwrap().abs() < 1e-6, "{site}");
    }
}

#[test]
fn gradient_options_are_refused_where_they_cannot_apply() {
    let model = model();
    let refused: [(&[&str], &str); 4] = [
        (
            &["run", &model, "--prompt", "The", "--save-grad", "logits"],
            "--grad",
        ),
        (
            &[
                "run",
                &model,
                "--prompt",
                "The",
                "--grad",
                "loss",
                "--max-new-tokens",
                "2",
            ],
            "cannot be used with",
        ),
        (
            &[
                "run",
                &model,
                "--prompt",
                "The cat",
                "--grad",
                "kl",
                "--save-grad",
                "logits",
            ],
            "metric `kl`",
        ),
        (
            &[
                "attrib",
                &model,
                "--clean",
                "The cat",
                "--corrupt",
                "The dog",
                "--site",
                "layers.*.layer_output",
                "--metric",
                "loss",
                "--compare",
            ],
            "--compare runs `hookscope patch`",
        ),
    ];
    for (args, needle) in refused {
        let output = hookscope(args);
        assert!(!output.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

//! Feature dictionaries against SAELens (`conformance/scripts/make_dictionary_fixtures.py`):
//! tiny sparse autoencoders of every architecture hookscope runs (standard, TopK with decoder-
//! norm scaling, JumpReLU, gated; constant-norm and layer-norm input normalisation; per-token
//! and per-head `hook_z`), transcoders (with a skip connection, JumpReLU), and a Gemma Scope
//! `params.npz`, on GPT-2, Llama and Gemma-2 fixtures. Their features, reconstructions and
//! errors match SAELens' on the prompt call; a feature ablated or steered, a transcoder feature
//! ablated, and the reconstruction spliced in without its error give the same tokens and logits
//! as the same edit made with SAELens and torch hooks.

use std::path::{Path, PathBuf};

use crate::common::{
    f32_tensors, floats, greedy_run, load, max_diff, read_tensors, values, write_tensors,
};
use hookscope::dictionary::{AttachOptions, Dictionary};
use hookscope::hooks::RequestSpecs;
use hookscope::{Interventions, Model, ModelSource, Site, Steps};
use hookscope_conformance::{Fixture, fixtures, test_device};
use serde_json::Value;

/// Features, reconstructions and errors agree with SAELens' to this.
const VALUE_TOLERANCE: f32 = 1e-5;
/// Logits of edited generations agree with transformers + SAELens to this.
const LOGIT_TOLERANCE: f32 = 1e-4;

/// The fixtures holding dictionaries, with their `dictionaries.json`.
fn dictionary_fixtures() -> Vec<(Fixture, Value)> {
    let found: Vec<(Fixture, Value)> = fixtures()
        .into_iter()
        .filter(|fixture| fixture.has("dictionaries.json"))
        .map(|fixture| {
            let meta = std::fs::read(fixture.dir.join("dictionaries.json")).unwrap();
            let meta = serde_json::from_slice(&meta).unwrap();
            (fixture, meta)
        })
        .collect();
    assert!(found.len() >= 3, "dictionary fixtures are missing");
    found
}

fn prompt(meta: &Value) -> Vec<u32> {
    meta["prompt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_u64().unwrap() as u32)
        .collect()
}

/// The entry of `meta["dictionaries"]` named `name`.
fn entry<'m>(meta: &'m Value, name: &str) -> &'m Value {
    meta["dictionaries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("no dictionary `{name}`"))
}

/// Attaches the dictionary `entry` describes. SAELens' folders attach where their own config
/// says (a TransformerLens hook name); a Gemma Scope `params.npz` names no site, so the entry's.
fn attach(model: &mut Model, dir: &Path, entry: &Value, without_error: bool) -> Site {
    let folder = dir.join(entry["folder"].as_str().unwrap());
    let dictionary = Dictionary::load(&folder, &test_device()).unwrap();
    let site = match entry["format"].as_str().unwrap() {
        "gemma_scope_npz" => entry["site"].as_str().map(str::to_string),
        _ => None,
    };
    let options = AttachOptions {
        site,
        input: None,
        without_error,
    };
    let site = model.attach(dictionary, options).unwrap();
    assert_eq!(site.to_string(), entry["site"].as_str().unwrap());
    site
}

#[test]
fn dictionary_values_match_sae_lens() {
    for (Fixture { name, dir, .. }, meta) in dictionary_fixtures() {
        let reference = f32_tensors(&dir.join("dictionaries.safetensors"));
        let batch_prompt = prompt(&meta);
        for entry in meta["dictionaries"].as_array().unwrap() {
            let dictionary = entry["name"].as_str().unwrap();
            let mut model = load(&dir).unwrap();
            let site = attach(&mut model, &dir, entry, false);
            let batch = model.batch(vec![batch_prompt.clone()]).unwrap();
            let parts = ["features", "reconstruction", "error"];
            let mut interventions = Interventions::new();
            for part in parts {
                let part = model
                    .layout()
                    .resolve(&format!("{site}.sae.{part}"))
                    .unwrap();
                interventions = interventions.save(part, Steps::At(0));
            }
            let plain = model.trace(&batch, &Interventions::new()).unwrap();
            let trace = model.trace(&batch, &interventions).unwrap();
            for part in parts {
                let key = format!("{dictionary}/{part}");
                let (shape, expected) = &reference[&key];
                let served = model
                    .layout()
                    .resolve(&format!("{site}.sae.{part}"))
                    .unwrap();
                let value = trace.saved.get(served, 0).unwrap();
                assert_eq!(&value.shape(), shape, "{name} {key}: shape");
                let diff = max_diff(&values(value), expected);
                assert!(diff < VALUE_TOLERANCE, "{name} {key}: differs by {diff}");
            }
            // Reading a dictionary changes nothing downstream, exactly.
            assert_eq!(
                floats(trace.logits().unwrap().clone().into_data()),
                floats(plain.logits().unwrap().clone().into_data()),
                "{name} {dictionary}: reading features changed the logits"
            );
        }
    }
}

#[test]
fn dictionary_edits_match_sae_lens_hooked_runs() {
    let mut cases = 0;
    for (Fixture { name, dir, .. }, meta) in dictionary_fixtures() {
        let reference = f32_tensors(&dir.join("dictionaries.safetensors"));
        let batch_prompt = prompt(&meta);
        let new_tokens = meta["new_tokens"].as_u64().unwrap() as usize;
        for case in meta["cases"].as_array().unwrap() {
            let case_name = case["name"].as_str().unwrap();
            let mut model = load(&dir).unwrap();
            let (_, plain) =
                greedy_run(&model, &batch_prompt, &RequestSpecs::default(), new_tokens);
            let splice = case["splice"].as_bool().unwrap_or(false);
            let dictionary = entry(&meta, case["dictionary"].as_str().unwrap());
            attach(&mut model, &dir, dictionary, splice);
            let list = |key: &str| -> Vec<String> {
                case[key]
                    .as_array()
                    .map(|specs| {
                        specs
                            .iter()
                            .map(|s| s.as_str().unwrap().to_string())
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let specs = RequestSpecs {
                zero: list("zero"),
                add: list("add"),
                ..Default::default()
            };
            let (ids, logits) = greedy_run(&model, &batch_prompt, &specs, new_tokens);
            let (_, expected_ids) = &reference[&format!("{case_name}/output_ids")];
            let (_, expected) = &reference[&format!("{case_name}/logits")];
            assert_eq!(&ids, expected_ids, "{name} {case_name}: greedy tokens");
            let diff = max_diff(&logits, expected);
            assert!(
                diff < LOGIT_TOLERANCE,
                "{name} {case_name}: logits differ by {diff}"
            );
            let effect = max_diff(&logits, &plain);
            assert!(
                effect > 1e-3,
                "{name} {case_name}: the edit changed nothing"
            );
            cases += 1;
        }
    }
    assert!(cases >= 6, "only {cases} edit cases ran");
}

/// A copy of one dictionary folder of a fixture, to break on purpose.
fn copy_dictionary(fixture: &str, name: &str) -> (tempfile::TempDir, PathBuf) {
    let source = hookscope_conformance::fixtures_dir()
        .join(fixture)
        .join("dictionaries")
        .join(name);
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join(name);
    std::fs::create_dir(&target).unwrap();
    for entry in std::fs::read_dir(&source).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), target.join(entry.file_name())).unwrap();
    }
    (dir, target)
}

fn load_error(path: &Path) -> String {
    Dictionary::load(path, &test_device())
        .unwrap_err()
        .to_string()
}

#[test]
fn broken_dictionaries_are_refused_naming_the_file_and_key() {
    // An architecture hookscope does not run.
    let (_keep, folder) = copy_dictionary("gpt2-tied", "resid-standard");
    let cfg = folder.join("cfg.json");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, text.replace("\"standard\"", "\"matching_pursuit\"")).unwrap();
    let message = load_error(&folder);
    assert!(
        message.contains("cfg.json") && message.contains("matching_pursuit"),
        "{message}"
    );

    // A missing weight, and a NaN threshold.
    let (_keep, folder) = copy_dictionary("llama-gqa2-llama3-bias", "resid-jumprelu");
    let weights = folder.join("sae_weights.safetensors");
    let mut tensors = read_tensors(&weights);
    let (_, _, threshold) = tensors.get_mut("threshold").unwrap();
    threshold[..4].copy_from_slice(&f32::NAN.to_le_bytes());
    write_tensors(&weights, &tensors);
    let message = load_error(&folder);
    assert!(
        message.contains("sae_weights.safetensors") && message.contains("threshold"),
        "{message}"
    );
    tensors.remove("b_enc");
    write_tensors(&weights, &tensors);
    let message = load_error(&folder);
    assert!(message.contains("`b_enc`"), "{message}");

    // No weights at all, and a folder of neither format.
    std::fs::remove_file(&weights).unwrap();
    assert!(load_error(&folder).contains("sae_weights.safetensors"));
    std::fs::remove_file(folder.join("cfg.json")).unwrap();
    assert!(load_error(&folder).contains("neither cfg.json"));

    // A truncated npz.
    let (_keep, folder) = copy_dictionary("gemma2-window-softcap", "resid-jumprelu-npz");
    let npz = folder.join("params.npz");
    let bytes = std::fs::read(&npz).unwrap();
    std::fs::write(&npz, &bytes[..bytes.len() / 2]).unwrap();
    let message = load_error(&folder);
    assert!(message.contains("params.npz"), "{message}");
}

#[test]
fn a_dictionary_that_does_not_fit_the_model_is_refused_naming_both() {
    let fixtures = hookscope_conformance::fixtures_dir();
    let mut gpt2 = load(&fixtures.join("gpt2-tied")).unwrap();
    let llama_sae = fixtures.join("llama-gqa2-llama3-bias/dictionaries/resid-jumprelu");
    let dictionary = Dictionary::load(&llama_sae, &test_device()).unwrap();
    let message = gpt2
        .attach(dictionary.clone(), AttachOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("`d_in` is 32") && message.contains("layers.1.layer_output"),
        "{message}"
    );
    for (site, says) in [
        ("layers.7.layer_output", "out of range"),
        ("layers.0.self_attn.attention_keys", "shaped [B, NKV, S, D]"),
        ("logits", "not a layer site"),
    ] {
        let options = AttachOptions {
            site: Some(site.into()),
            ..Default::default()
        };
        let message = gpt2
            .attach(dictionary.clone(), options)
            .unwrap_err()
            .to_string();
        assert!(message.contains(says), "{site}: {message}");
    }
    // An input site is a transcoder's: it must come before the site written, and an SAE has none.
    let transcoder = fixtures.join("gpt2-tied/dictionaries/transcoder-skip");
    let transcoder = Dictionary::load(&transcoder, &test_device()).unwrap();
    let options = |input: &str| AttachOptions {
        input: Some(input.into()),
        ..Default::default()
    };
    let site = gpt2
        .attach(transcoder.clone(), options("layers.0.layer_output"))
        .unwrap();
    assert_eq!(
        gpt2.layout()
            .dictionary_at(site)
            .unwrap()
            .1
            .input
            .to_string(),
        "layers.0.layer_output"
    );
    assert!(gpt2.detach(site) && !gpt2.detach(site));
    let message = gpt2
        .attach(transcoder, options("layers.1.layer_output"))
        .unwrap_err()
        .to_string();
    assert!(message.contains("does not come before"), "{message}");
    let message = gpt2
        .attach(dictionary.clone(), options("layers.0.layer_input"))
        .unwrap_err()
        .to_string();
    assert!(message.contains("for transcoders"), "{message}");
    // A value of a dictionary nobody attached names the way to attach one.
    let message = gpt2
        .layout()
        .resolve("layers.1.layer_output.sae.features")
        .unwrap_err()
        .to_string();
    assert!(message.contains("no dictionary is attached"), "{message}");
}

#[test]
fn hub_paths_resolve_dictionaries_from_the_local_cache() {
    let cache = tempfile::tempdir().unwrap();
    let repo = cache.path().join("models--someone--gpt2-saes");
    let snapshot = repo.join("snapshots").join("abc123");
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs").join("main"), "abc123").unwrap();
    let spec = "someone/gpt2-saes/layer_1/resid";
    let missing = ModelSource::resolve_dictionary_in(spec, cache.path(), true).unwrap_err();
    assert!(missing.to_string().contains("HF_HUB_OFFLINE"), "{missing}");
    let fixtures = hookscope_conformance::fixtures_dir();
    for (folder, source) in [
        ("layer_1/resid", "gpt2-tied/dictionaries/resid-standard"),
        (
            "layer_1/npz",
            "gemma2-window-softcap/dictionaries/resid-jumprelu-npz",
        ),
    ] {
        let target = snapshot.join(folder);
        std::fs::create_dir_all(&target).unwrap();
        for entry in std::fs::read_dir(fixtures.join(source)).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), target.join(entry.file_name())).unwrap();
        }
        let spec = format!("someone/gpt2-saes/{folder}");
        let path = ModelSource::resolve_dictionary_in(&spec, cache.path(), true).unwrap();
        assert_eq!(path, target);
        Dictionary::load(&path, &test_device()).unwrap();
    }
    // A local path is taken as it is, whatever its shape.
    let local = fixtures.join("gpt2-tied/dictionaries/resid-standard");
    let spec = local.display().to_string();
    assert_eq!(
        ModelSource::resolve_dictionary_in(&spec, cache.path(), true).unwrap(),
        local
    );
}

#[test]
fn a_per_head_dictionary_replaces_only_its_head() {
    let dir = hookscope_conformance::fixtures_dir().join("gpt2-tied");
    let meta: Value =
        serde_json::from_slice(&std::fs::read(dir.join("dictionaries.json")).unwrap()).unwrap();
    let site = "layers.1.self_attn.attention_head_outputs";
    let heads_of = |model: &Model, names: &[&str]| {
        let batch = model.batch(vec![prompt(&meta)]).unwrap();
        let mut interventions = Interventions::new();
        for name in names {
            interventions = interventions.save(model.layout().resolve(name).unwrap(), Steps::At(0));
        }
        let trace = model.trace(&batch, &interventions).unwrap();
        names
            .iter()
            .map(|name| {
                let site = model.layout().resolve(name).unwrap();
                let value = trace.saved.get(site, 0).unwrap();
                (value.shape(), values(value))
            })
            .collect::<Vec<_>>()
    };
    let plain = load(&dir).unwrap();
    let original = heads_of(&plain, &[site]).remove(0);
    let mut spliced = load(&dir).unwrap();
    attach(&mut spliced, &dir, entry(&meta, "z-head1"), true);
    let reconstruction = format!("{site}.sae.reconstruction");
    let got = heads_of(&spliced, &[site, &reconstruction]);
    let ((shape, flowing), (_, head1)) = (&got[0], &got[1]);
    assert_eq!(shape, &original.0);
    let [_, tokens, heads, dim] = shape[..] else {
        panic!("{shape:?}")
    };
    for t in 0..tokens {
        for h in 0..heads {
            let at = (t * heads + h) * dim;
            let row = &flowing[at..at + dim];
            let expected = match h {
                1 => &head1[t * dim..(t + 1) * dim],
                _ => &original.1[at..at + dim],
            };
            assert_eq!(row, expected, "token {t} head {h}");
        }
    }
    assert!(max_diff(&head1[..dim], &original.1[dim..2 * dim]) > 1e-3);
}

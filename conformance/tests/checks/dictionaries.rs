//! Feature dictionaries against SAELens (`conformance/scripts/make_dictionary_fixtures.py`):
//! tiny sparse autoencoders of every architecture hookscope runs (standard, TopK with decoder-
//! norm scaling, JumpReLU, gated; constant-norm and layer-norm input normalisation; per-token
//! and per-head `hook_z`), transcoders (with a skip connection, JumpReLU), and a Gemma Scope
//! `params.npz`, on GPT-2, Llama and Gemma-2 fixtures. Their features, reconstructions and
//! errors match SAELens' on the prompt call; a feature ablated or steered, a transcoder feature
//! ablated, and the reconstruction spliced in without its error give the same tokens and logits
//! as the same edit made with SAELens and torch hooks. circuit-tracer's per-layer transcoder sets
//! (its own layer files, and Gemma Scope `params.npz` files a config lists; reading `mlp.hook_in`
//! or `ln2.hook_normalized`, writing `mlp.hook_out` or `hook_mlp_out`) match circuit-tracer's own
//! loaded transcoders at every layer, and a feature of one layer ablated at every step matches
//! the same ablation made with them in torch hooks.

use std::path::{Path, PathBuf};

use crate::common::{
    Tensors, f32_tensors, floats, greedy_run, load, max_diff, read_tensors, values, write_tensors,
};
use hookscope::dictionary::{AttachOptions, Dictionary};
use hookscope::hooks::RequestSpecs;
use hookscope::{Interventions, Model, ModelSource, Site, Steps, WeightDtype};
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

/// Attaches the dictionary or transcoder set `entry` describes; returns each attached site with
/// the prefix of its reference keys (`NAME`, or `NAME/layerL` for a set's layers). SAELens'
/// folders and circuit-tracer's sets attach where their own configs say (TransformerLens hook
/// names); a Gemma Scope `params.npz` names no site, so the entry's.
fn attach(
    model: &mut Model,
    dir: &Path,
    entry: &Value,
    without_error: bool,
) -> Vec<(String, Site)> {
    let folder = dir.join(entry["folder"].as_str().unwrap());
    let name = entry["name"].as_str().unwrap();
    if let Some(layers) = entry["layers"].as_array() {
        let set = Dictionary::load_all(&folder, &test_device()).unwrap();
        let options = AttachOptions {
            without_error,
            ..Default::default()
        };
        let sites = model.attach_all(set, options).unwrap();
        assert_eq!(sites.len(), layers.len(), "{name}: one dictionary a layer");
        return sites
            .into_iter()
            .zip(layers)
            .enumerate()
            .map(|(layer, (site, expected))| {
                let input = model.layout().dictionary_at(site).unwrap().1.input;
                assert_eq!(site.to_string(), expected["site"].as_str().unwrap());
                assert_eq!(input.to_string(), expected["input_site"].as_str().unwrap());
                (format!("{name}/layer{layer}"), site)
            })
            .collect();
    }
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
    vec![(name.to_string(), site)]
}

/// The features, reconstruction and error `model` serves at `site` on the prompt call, against
/// the references under `prefix`.
fn check_values(
    model: &Model,
    batch_prompt: &[u32],
    site: Site,
    reference: &Tensors,
    prefix: &str,
) {
    let batch = model.batch(vec![batch_prompt.to_vec()]).unwrap();
    let parts = ["features", "reconstruction", "error"];
    let served = |part: &str| {
        model
            .layout()
            .resolve(&format!("{site}.sae.{part}"))
            .unwrap()
    };
    let interventions = parts.iter().fold(Interventions::new(), |requests, part| {
        requests.save(served(part), Steps::At(0))
    });
    let plain = model.trace(&batch, &Interventions::new()).unwrap();
    let trace = model.trace(&batch, &interventions).unwrap();
    for part in parts {
        let key = format!("{prefix}/{part}");
        let (shape, expected) = &reference[&key];
        let value = trace.saved.get(served(part), 0).unwrap();
        assert_eq!(&value.shape(), shape, "{site} {key}: shape");
        let diff = max_diff(&values(value), expected);
        assert!(diff < VALUE_TOLERANCE, "{site} {key}: differs by {diff}");
    }
    // Reading a dictionary changes nothing downstream, exactly.
    assert_eq!(
        floats(trace.logits().unwrap().clone().into_data()),
        floats(plain.logits().unwrap().clone().into_data()),
        "{site} {prefix}: reading features changed the logits"
    );
}

#[test]
fn dictionary_values_match_sae_lens() {
    let mut sets = 0;
    for (Fixture { dir, .. }, meta) in dictionary_fixtures() {
        let reference = f32_tensors(&dir.join("dictionaries.safetensors"));
        let batch_prompt = prompt(&meta);
        for entry in meta["dictionaries"].as_array().unwrap() {
            let mut model = load(&dir).unwrap();
            let attached = attach(&mut model, &dir, entry, false);
            sets += usize::from(attached.len() > 1);
            for (prefix, site) in attached {
                check_values(&model, &batch_prompt, site, &reference, &prefix);
            }
        }
    }
    assert!(sets >= 3, "only {sets} transcoder sets ran");
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

/// The references of `fixture`: its dictionaries.json and dictionaries.safetensors.
fn fixture_references(fixture: &str) -> (PathBuf, Value, Tensors) {
    let dir = hookscope_conformance::fixtures_dir().join(fixture);
    let meta = serde_json::from_slice(&std::fs::read(dir.join("dictionaries.json")).unwrap());
    let reference = f32_tensors(&dir.join("dictionaries.safetensors"));
    (dir, meta.unwrap(), reference)
}

#[test]
fn one_layer_file_of_a_transcoder_set_loads_alone() {
    for (fixture, set, layer, file) in [
        (
            "llama-gqa2-llama3-bias",
            "ct-llama",
            1,
            "layer_1.safetensors",
        ),
        ("gpt2-tied", "ct-gpt2-normalized", 2, "layer_2.safetensors"),
        (
            "gemma2-window-softcap",
            "ct-gemma-scope",
            2,
            "layer_2/params.npz",
        ),
    ] {
        let (dir, meta, reference) = fixture_references(fixture);
        let folder = dir.join("dictionaries").join(set);
        let message = Dictionary::load(&folder, &test_device())
            .unwrap_err()
            .to_string();
        assert!(message.contains("holds a set of"), "{message}");
        let dictionary = Dictionary::load(&folder.join(file), &test_device()).unwrap();
        let mut model = load(&dir).unwrap();
        let site = model.attach(dictionary, AttachOptions::default()).unwrap();
        assert_eq!(site.to_string(), format!("layers.{layer}.mlp_output"));
        let prefix = format!("{set}/layer{layer}");
        check_values(&model, &prompt(&meta), site, &reference, &prefix);
    }
}

fn load_all_error(path: &Path) -> String {
    Dictionary::load_all(path, &test_device())
        .unwrap_err()
        .to_string()
}

#[test]
fn broken_transcoder_sets_are_refused_naming_the_file_and_key() {
    // A layer missing from a set whose files lie beside its config.
    let (_keep, folder) = copy_dictionary("llama-gqa2-llama3-bias", "ct-llama");
    std::fs::remove_file(folder.join("layer_0.safetensors")).unwrap();
    let message = load_all_error(&folder);
    assert!(
        message.contains("config.yaml") && message.contains("no transcoder for layer 0"),
        "{message}"
    );

    // Cross-layer transcoders, and a config with no input hook.
    let (_keep, folder) = copy_dictionary("llama-gqa2-llama3-bias", "ct-llama");
    let config = folder.join("config.yaml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("transcoder_set", "cross_layer_transcoder"),
    )
    .unwrap();
    assert!(load_all_error(&folder).contains("cross-layer"));
    std::fs::write(&config, text.replace("feature_input_hook", "input_hook")).unwrap();
    assert!(load_all_error(&folder).contains("`feature_input_hook` is missing"));

    // A negative JumpReLU threshold (circuit-tracer would let negative values through), and a
    // layer file without its encoder bias.
    std::fs::write(&config, &text).unwrap();
    let layer = folder.join("layer_1.safetensors");
    let mut tensors = read_tensors(&layer);
    let (_, _, threshold) = tensors.get_mut("activation_function.threshold").unwrap();
    threshold[..4].copy_from_slice(&(-0.5f32).to_le_bytes());
    write_tensors(&layer, &tensors);
    let message = load_all_error(&folder);
    assert!(
        message.contains("layer_1.safetensors") && message.contains("negative threshold"),
        "{message}"
    );
    tensors.remove("b_enc");
    write_tensors(&layer, &tensors);
    let message = load_all_error(&folder);
    assert!(message.contains("`b_enc`"), "{message}");

    // A listed file on the hub is fetched only through ModelSource::load_dictionaries.
    let (_keep, folder) = copy_dictionary("gpt2-tied", "ct-gpt2-normalized");
    let config = folder.join("config.yaml");
    let text = std::fs::read_to_string(&config).unwrap();
    let hub = "hf://someone/transcoders/layer_0.safetensors";
    std::fs::write(&config, text.replace("layer_0.safetensors", hub)).unwrap();
    let message = load_all_error(&folder);
    assert!(
        message.contains(hub) && message.contains("load_dictionaries"),
        "{message}"
    );
}

#[test]
fn transcoder_sets_resolve_from_the_hub_cache() {
    let (dir, meta, reference) = fixture_references("llama-gqa2-llama3-bias");
    let cache = tempfile::tempdir().unwrap();
    let repo = cache.path().join("models--someone--transcoders");
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs").join("main"), "abc123").unwrap();
    let snapshot = repo.join("snapshots").join("abc123");
    // A set whose layer files lie beside its config, in a folder of the repository.
    let beside = snapshot.join("beside");
    std::fs::create_dir_all(&beside).unwrap();
    for entry in std::fs::read_dir(dir.join("dictionaries/ct-llama")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), beside.join(entry.file_name())).unwrap();
    }
    // A set listing those files as hub references, one of them at a named revision.
    let listed = snapshot.join("listed");
    std::fs::create_dir_all(&listed).unwrap();
    let config = std::fs::read_to_string(beside.join("config.yaml")).unwrap();
    let files = "transcoders:\n- hf://someone/transcoders/beside/layer_0.safetensors\n\
                 - hf://someone/transcoders/beside/layer_1.safetensors?revision=main\n";
    std::fs::write(listed.join("config.yaml"), format!("{config}{files}")).unwrap();
    for folder in ["beside", "listed"] {
        let spec = format!("someone/transcoders/{folder}");
        let set =
            ModelSource::load_dictionaries_in(&spec, &test_device(), cache.path(), true).unwrap();
        let mut model = load(&dir).unwrap();
        let sites = model.attach_all(set, AttachOptions::default()).unwrap();
        assert_eq!(sites.len(), 2, "{folder}");
        for (layer, site) in sites.into_iter().enumerate() {
            let prefix = format!("ct-llama/layer{layer}");
            check_values(&model, &prompt(&meta), site, &reference, &prefix);
        }
    }
    // A listed file the cache lacks, offline.
    std::fs::write(
        listed.join("config.yaml"),
        format!("{config}transcoders:\n- hf://someone/transcoders/gone.safetensors\n"),
    )
    .unwrap();
    let spec = "someone/transcoders/listed";
    let message = ModelSource::load_dictionaries_in(spec, &test_device(), cache.path(), true)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("gone.safetensors") && message.contains("HF_HUB_OFFLINE"),
        "{message}"
    );
}

#[test]
fn hooks_around_the_mlp_attach_only_where_the_model_serves_them() {
    let fixtures = hookscope_conformance::fixtures_dir();
    let (_keep, folder) = copy_dictionary("llama-gqa2-llama3-bias", "transcoder-jumprelu");
    let cfg = folder.join("cfg.json");
    let text = std::fs::read_to_string(&cfg).unwrap();
    let with_hooks = |input: &str, output: &str| {
        let mut json: Value = serde_json::from_str(&text).unwrap();
        json["metadata"]["hook_name"] = input.into();
        json["metadata"]["hook_name_out"] = output.into();
        std::fs::write(&cfg, json.to_string()).unwrap();
        Dictionary::load(&folder, &test_device()).unwrap()
    };
    let attach_to = |fixture: &str, dictionary: Dictionary| {
        let mut model = load(&fixtures.join(fixture)).unwrap();
        model
            .attach(dictionary, AttachOptions::default())
            .map(|site| {
                let input = model.layout().dictionary_at(site).unwrap().1.input;
                (site.to_string(), input.to_string())
            })
            .map_err(|e| e.to_string())
    };
    // circuit-tracer's MLP hooks on Llama: mlp_input to mlp_output.
    let dictionary = with_hooks("blocks.0.mlp.hook_in", "blocks.0.mlp.hook_out");
    assert_eq!(
        attach_to("llama-gqa2-llama3-bias", dictionary.clone()).unwrap(),
        ("layers.0.mlp_output".into(), "layers.0.mlp_input".into())
    );
    // Gemma 2's MLP output passes a norm before the add: mlp.hook_out is not served there.
    let message = attach_to("gemma2-window-softcap", dictionary).unwrap_err();
    assert!(
        message.contains("mlp.hook_out") && message.contains("hook_mlp_out"),
        "{message}"
    );
    // ln2.hook_normalized reads the residual the MLP's norm reads: residual_mid in a sequential
    // block, the block's input in a parallel one (GPT-NeoX); a layer without an MLP has none.
    let normalized = with_hooks("blocks.0.ln2.hook_normalized", "blocks.0.hook_mlp_out");
    assert_eq!(
        attach_to("llama-gqa2-llama3-bias", normalized.clone())
            .unwrap()
            .1,
        "layers.0.residual_mid"
    );
    assert_eq!(
        attach_to("gptneox-parallel", normalized).unwrap().1,
        "layers.0.layer_input"
    );
    let into_residual = with_hooks("blocks.0.ln2.hook_normalized", "blocks.0.hook_resid_post");
    let message = attach_to("mamba-tied", into_residual).unwrap_err();
    assert!(message.contains("ln2.hook_normalized"), "{message}");
    // A sparse autoencoder cannot write back a normalised value.
    let mut json: Value = serde_json::from_str(&text).unwrap();
    json["architecture"] = "jumprelu".into();
    json["metadata"]["hook_name"] = "blocks.0.ln2.hook_normalized".into();
    std::fs::write(&cfg, json.to_string()).unwrap();
    let sae = Dictionary::load(&folder, &test_device()).unwrap();
    let message = attach_to("llama-gqa2-llama3-bias", sae).unwrap_err();
    assert!(message.contains("only a transcoder"), "{message}");
}

#[test]
fn a_half_precision_decoder_is_used_as_stored() {
    let (dir, meta, reference) = fixture_references("llama-gqa2-llama3-bias");
    let batch_prompt = prompt(&meta);
    type Round = fn(f32) -> [u8; 2];
    let bf16: Round = |v| half::bf16::from_f32(v).to_le_bytes();
    let f16: Round = |v| half::f16::from_f32(v).to_le_bytes();
    for (dtype, held, round) in [
        (safetensors::Dtype::BF16, WeightDtype::Bf16, bf16),
        (safetensors::Dtype::F16, WeightDtype::F16, f16),
    ] {
        let (_keep, folder) = copy_dictionary("llama-gqa2-llama3-bias", "resid-jumprelu");
        let weights = folder.join("sae_weights.safetensors");
        let mut tensors = read_tensors(&weights);
        let (stored, _, bytes) = tensors.get_mut("W_dec").unwrap();
        *stored = dtype;
        *bytes = bytes
            .chunks_exact(4)
            .flat_map(|b| round(f32::from_le_bytes(b.try_into().unwrap())))
            .collect();
        write_tensors(&weights, &tensors);
        let dictionary = Dictionary::load(&folder, &test_device()).unwrap();
        assert_eq!(dictionary.decoder_dtype(), held);
        let mut model = load(&dir).unwrap();
        let site = model.attach(dictionary, AttachOptions::default()).unwrap();
        let batch = model.batch(vec![batch_prompt.clone()]).unwrap();
        let served = |part: &str| {
            model
                .layout()
                .resolve(&format!("{site}.sae.{part}"))
                .unwrap()
        };
        let requests = Interventions::new()
            .save(served("features"), Steps::At(0))
            .save(served("reconstruction"), Steps::At(0));
        let trace = model.trace(&batch, &requests).unwrap();
        // The encoder is f32 as stored: the same features; the decoder's rounding shows in the
        // reconstruction at half precision's size, no more.
        let features = values(trace.saved.get(served("features"), 0).unwrap());
        let diff = max_diff(&features, &reference["resid-jumprelu/features"].1);
        assert!(
            diff < VALUE_TOLERANCE,
            "{dtype:?} features differ by {diff}"
        );
        let reconstruction = values(trace.saved.get(served("reconstruction"), 0).unwrap());
        let expected = &reference["resid-jumprelu/reconstruction"].1;
        let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = max_diff(&reconstruction, expected);
        assert!(
            diff > 0.0 && diff < 2e-2 * scale,
            "{dtype:?} reconstruction differs by {diff} (scale {scale})"
        );
    }
}

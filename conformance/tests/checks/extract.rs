//! Dataset extraction: rows equal the same prompt traced alone on every architecture, shards
//! cover every token exactly once, and a resumed job writes the files of an uninterrupted one.

use std::collections::BTreeMap;
use std::path::Path;

use crate::common::{load_fixture, max_diff, values};
use hookscope::extract::{
    ExtractJob, Manifest, POSITION, PROMPT_INDEX, PROMPTS_PROMPT_INDEX, RowBuffer, RowKind, Shard,
    SiteRows, TOKEN_ID, extract, merge_manifests,
};
use hookscope::{Interventions, Model, Site, Steps};
use hookscope_conformance::Fixture;
use hookscope_conformance::fixture::one_per_architecture;
use safetensors::SafeTensors;

/// Writes `count` prompts of 1 to 19 token ids below `vocab` as JSONL (with a blank line, which
/// is skipped), and returns them by line number.
fn write_prompts(path: &Path, count: usize, vocab: usize) -> BTreeMap<usize, Vec<u32>> {
    let mut rng = fastrand::Rng::with_seed(7);
    let mut text = String::new();
    let mut prompts = BTreeMap::new();
    let mut line = 0;
    for k in 0..count {
        if k == 3 {
            text.push('\n');
            line += 1;
        }
        let ids: Vec<u32> = (0..rng.usize(1..20))
            .map(|_| rng.u32(0..vocab as u32))
            .collect();
        text.push_str(&serde_json::json!({ "ids": ids }).to_string());
        text.push('\n');
        prompts.insert(line, ids);
        line += 1;
    }
    std::fs::write(path, text).unwrap();
    prompts
}

/// Every site a prompt call serves that extraction can stack into rows.
fn extractable_sites(model: &Model) -> Vec<Site> {
    model
        .layout()
        .call_order()
        .into_iter()
        .filter(|site| SiteRows::of(model.layout(), *site).is_ok())
        .collect()
}

fn job(model: &Model, prompts: &Path, out: &Path, shard: Shard) -> ExtractJob {
    ExtractJob {
        model: "fixture".into(),
        prompts: prompts.to_path_buf(),
        sites: extractable_sites(model),
        out_dir: out.to_path_buf(),
        batch_size: 3,
        max_rows_per_file: 40,
        shard,
        feature_top_k: 4,
    }
}

/// A file's tensors as (shape, f32 values); int64 arrays converted.
fn read_file(path: &Path) -> BTreeMap<String, (Vec<usize>, Vec<f64>)> {
    let bytes = std::fs::read(path).unwrap();
    let tensors = SafeTensors::deserialize(&bytes).unwrap();
    tensors
        .iter()
        .map(|(name, view)| {
            let values: Vec<f64> = match view.dtype() {
                safetensors::Dtype::I64 => view
                    .data()
                    .chunks_exact(8)
                    .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as f64)
                    .collect(),
                _ => view
                    .data()
                    .chunks_exact(4)
                    .map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap())))
                    .collect(),
            };
            (name.to_string(), (view.shape().to_vec(), values))
        })
        .collect()
}

#[test]
fn rows_equal_each_prompt_traced_alone_on_every_architecture() {
    // Dynamic RoPE and LongRoPE depend on the (padded) length of the call, so a batched
    // prompt's rows differ from the prompt run alone, in `transformers` too: those fixtures are
    // left out.
    let length_independent = |fixture: &Fixture| {
        let kind = &fixture.config()["rope_parameters"]["rope_type"];
        kind != "dynamic" && kind != "longrope"
    };
    for Fixture { name: fixture, .. } in one_per_architecture(length_independent) {
        let model = load_fixture(&fixture);
        let dir = tempfile::tempdir().unwrap();
        let prompts_path = dir.path().join("prompts.jsonl");
        let prompts = write_prompts(&prompts_path, 11, model.layout().vocab);
        let out = dir.path().join("out");
        let job = job(&model, &prompts_path, &out, Shard::WHOLE);
        let manifest = extract(&model, &job, &mut |_| {}).unwrap();
        assert_eq!(manifest.prompts, prompts.len());
        assert_eq!(
            manifest.tokens,
            prompts.values().map(Vec::len).sum::<usize>()
        );
        // Gather every file's rows by (prompt line, position) and by prompt line.
        let mut token_rows: BTreeMap<(String, usize, usize), Vec<f64>> = BTreeMap::new();
        let mut prompt_rows: BTreeMap<(String, usize), Vec<f64>> = BTreeMap::new();
        for file in &manifest.files {
            let tensors = read_file(&out.join(file));
            let lines = &tensors[PROMPT_INDEX].1;
            let positions = &tensors[POSITION].1;
            let prompt_lines = &tensors[PROMPTS_PROMPT_INDEX].1;
            for site in &manifest.sites {
                let (shape, data) = &tensors[&site.name];
                let width: usize = shape[1..].iter().product();
                for (row, chunk) in data.chunks(width.max(1)).enumerate() {
                    match site.rows {
                        RowKind::Token => token_rows.insert(
                            (
                                site.name.clone(),
                                lines[row] as usize,
                                positions[row] as usize,
                            ),
                            chunk.to_vec(),
                        ),
                        RowKind::Prompt => prompt_rows.insert(
                            (site.name.clone(), prompt_lines[row] as usize),
                            chunk.to_vec(),
                        ),
                    };
                }
            }
        }
        let sites = extractable_sites(&model);
        let saves = sites.iter().fold(Interventions::new(), |acc, site| {
            acc.save(*site, Steps::At(0))
        });
        for (line, ids) in &prompts {
            let trace = model
                .trace(&model.batch(vec![ids.clone()]).unwrap(), &saves)
                .unwrap();
            for site in &sites {
                let name = site.to_string();
                let alone = values(trace.saved.get(*site, 0).unwrap());
                let rows = SiteRows::of(model.layout(), *site).unwrap();
                let extracted: Vec<f32> = match rows.kind {
                    RowKind::Prompt => prompt_rows[&(name.clone(), *line)]
                        .iter()
                        .map(|v| *v as f32)
                        .collect(),
                    RowKind::Token => {
                        // Alone, the value is [1, ..., T, ...]; compare row by row.
                        let mut expected = RowBuffer::default();
                        let shape = trace.saved.get(*site, 0).unwrap().shape();
                        rows.append(&alone, &shape, &[ids.len()], &mut expected);
                        let expected = expected.values;
                        let got: Vec<f32> = (0..ids.len())
                            .flat_map(|p| token_rows[&(name.clone(), *line, p)].clone())
                            .map(|v| v as f32)
                            .collect();
                        assert_eq!(got.len(), expected.len(), "{fixture} {name}");
                        let diff = max_diff(&got, &expected);
                        assert!(diff <= 1e-4, "{fixture} {name} line {line}: {diff}");
                        continue;
                    }
                };
                let diff = max_diff(&extracted, &alone);
                assert!(diff <= 1e-4, "{fixture} {name} line {line}: {diff}");
            }
        }
    }
}

#[test]
fn shards_cover_every_token_once_and_merge() {
    let model = load_fixture("gpt2-tied");
    let dir = tempfile::tempdir().unwrap();
    let prompts_path = dir.path().join("prompts.jsonl");
    let prompts = write_prompts(&prompts_path, 23, model.layout().vocab);
    let out = dir.path().join("out");
    let count = 3;
    let error = merge_manifests(&out).err();
    assert!(error.is_some(), "nothing to merge yet");
    for index in 0..count {
        let shard = Shard { index, count };
        extract(
            &model,
            &job(&model, &prompts_path, &out, shard),
            &mut |_| {},
        )
        .unwrap();
        if index == 0 {
            let early = merge_manifests(&out).unwrap_err().to_string();
            assert!(
                early.contains("shards 1/3, 2/3 have not finished"),
                "{early}"
            );
        }
    }
    let merged: Manifest = merge_manifests(&out).unwrap();
    assert_eq!(merged.prompts, prompts.len());
    assert_eq!(merged.shards.len(), count);
    let mut seen = BTreeMap::new();
    for file in &merged.files {
        let tensors = read_file(&out.join(file));
        let (lines, positions, ids) = (
            &tensors[PROMPT_INDEX].1,
            &tensors[POSITION].1,
            &tensors[TOKEN_ID].1,
        );
        for row in 0..lines.len() {
            let key = (lines[row] as usize, positions[row] as usize);
            assert!(seen.insert(key, ids[row] as u32).is_none(), "{key:?} twice");
        }
    }
    let expected: BTreeMap<(usize, usize), u32> = prompts
        .iter()
        .flat_map(|(line, ids)| ids.iter().enumerate().map(move |(p, id)| ((*line, p), *id)))
        .collect();
    assert_eq!(seen, expected);
}

#[test]
fn a_resumed_job_writes_the_files_of_an_uninterrupted_one() {
    let model = load_fixture("llama-gqa2-llama3-bias");
    let dir = tempfile::tempdir().unwrap();
    let prompts_path = dir.path().join("prompts.jsonl");
    write_prompts(&prompts_path, 30, model.layout().vocab);
    let whole = dir.path().join("whole");
    let reference = extract(
        &model,
        &job(&model, &prompts_path, &whole, Shard::WHOLE),
        &mut |_| {},
    )
    .unwrap();
    assert!(reference.files.len() >= 4, "{:?}", reference.files);
    // A crash after two files: the later files and the manifest never appeared.
    let resumed = dir.path().join("resumed");
    extract(
        &model,
        &job(&model, &prompts_path, &resumed, Shard::WHOLE),
        &mut |_| {},
    )
    .unwrap();
    for file in &reference.files[2..] {
        std::fs::remove_file(resumed.join(file)).unwrap();
    }
    std::fs::remove_file(resumed.join("manifest.json")).unwrap();
    let mut runs = Vec::new();
    let again = extract(
        &model,
        &job(&model, &prompts_path, &resumed, Shard::WHOLE),
        &mut |p| runs.push(*p),
    )
    .unwrap();
    assert_eq!(again, reference);
    assert_eq!(
        runs.last().unwrap().files_written,
        reference.files.len() - 2,
        "only the missing files are redone"
    );
    for file in &reference.files {
        let (a, b) = (
            std::fs::read(whole.join(file)).unwrap(),
            std::fs::read(resumed.join(file)).unwrap(),
        );
        assert!(a == b, "{file} differs after resuming");
    }
    // Other settings in the same folder are refused, naming what changed.
    let mut other = job(&model, &prompts_path, &resumed, Shard::WHOLE);
    other.batch_size = 5;
    let error = extract(&model, &other, &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(error.contains("`batch_size`"), "{error}");
}

#[test]
fn a_malformed_line_is_named_by_its_number() {
    let model = load_fixture("gpt2-tied");
    let dir = tempfile::tempdir().unwrap();
    let prompts_path = dir.path().join("prompts.jsonl");
    std::fs::write(
        &prompts_path,
        "{\"ids\": [1, 2]}\n\n{\"ids\": [1, \"x\"]}\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    let error = extract(
        &model,
        &job(&model, &prompts_path, &out, Shard::WHOLE),
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("prompts.jsonl:3: `ids` must be"), "{error}");
}

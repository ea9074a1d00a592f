//! Activations over a whole dataset, streamed to safetensors files: the prompt calls of every
//! prompt in a file (or one shard of it), saving chosen sites as rows (one per real token, or
//! one per prompt for sites without a token axis).
//!
//! Memory is bounded by one window of prompts (`batch_size × 16`, sorted by length so that
//! batches waste little padding) and one file's rows, never by the dataset. Files fill with
//! whole batches up to `max_rows_per_file` token rows and are renamed into place when complete,
//! so a rerun of the same job after a crash skips the finished files and redoes only the rest,
//! with the same batches: its files equal those of an uninterrupted run.

mod files;
mod prompts;
mod rows;

use std::path::{Path, PathBuf};

pub use files::{
    POSITION, PROMPT_INDEX, PROMPTS_LENGTH, PROMPTS_PROMPT_INDEX, SPARSE_INDICES, SPARSE_VALUES,
    TOKEN_ID,
};
pub use prompts::{Prompt, PromptReader, Shard};
pub use rows::{RowBuffer, RowKind, SiteRows};

use files::{FileBuffer, FileNames, read_index, read_json, write_json};
use serde::{Deserialize, Serialize};

use hookscope_core::hooks::{Interventions, Steps};
use hookscope_core::schema::{DictionaryPart, Site};
use hookscope_core::{Error, Result};
use hookscope_core::{Model, Run};

/// Batches per window: a window of prompts is sorted by length before it is cut into batches.
const WINDOW_BATCHES: usize = 16;

/// Identifies the manifest format.
const FORMAT: &str = "hookscope-extract/1";

/// What to extract.
#[derive(Debug, Clone)]
pub struct ExtractJob {
    /// How the model was named (path or hub id), for the manifest.
    pub model: String,
    /// The prompts file (JSONL with `text` or `ids`, or plain text lines).
    pub prompts: PathBuf,
    /// The sites to save at the prompt call.
    pub sites: Vec<Site>,
    /// Where the files go.
    pub out_dir: PathBuf,
    /// Prompts per forward call.
    pub batch_size: usize,
    /// A file is written once it holds this many token rows (whole batches: a batch that
    /// would pass it starts the next file; a batch longer than it gets a file of its own).
    pub max_rows_per_file: usize,
    /// The part of the prompts this run takes.
    pub shard: Shard,
    /// Dictionary features (`SITE.sae.features`) are kept as their `k` largest non-zero entries
    /// per token (`SITE.sae.features.indices` and `.values`, `[rows, k]`); other sites densely.
    pub feature_top_k: usize,
}

/// How far a run has got (for progress displays).
#[derive(Debug, Clone, Copy, Default)]
pub struct Progress {
    /// Prompts of this shard done (including those found done by an earlier run).
    pub prompts_done: usize,
    /// Prompts of this shard in all.
    pub prompts_total: usize,
    /// Real tokens run by this process.
    pub tokens_run: usize,
    /// Files written by this process.
    pub files_written: usize,
}

/// A saved site as the manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteEntry {
    /// The site's name (the tensor's name in every file).
    pub name: String,
    /// Token rows or prompt rows.
    pub rows: RowKind,
    /// The shape of one row (`[k]` for sparse rows).
    pub shape: Vec<usize>,
    /// For sparse rows, `k`: the files hold `NAME.indices` and `NAME.values` instead of `NAME`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sparse_top_k: Option<usize>,
}

/// The settings a rerun must repeat to resume a job: written before the first file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct JobRecord {
    format: String,
    model: String,
    model_type: String,
    /// The precision the weights were stored in (absent from jobs before it was recorded).
    #[serde(default)]
    dtype: String,
    prompts_file: String,
    prompts_fingerprint: String,
    input_prompts: usize,
    sites: Vec<SiteEntry>,
    batch_size: usize,
    max_rows_per_file: usize,
    shard: Shard,
}

/// `manifest.json` (or a shard's `manifest.shard-I-of-N.json`): what the files hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// `hookscope-extract/1`.
    pub format: String,
    /// The model as named on the command line.
    pub model: String,
    /// Its `model_type`.
    pub model_type: String,
    /// The precision its weights were stored in (`f32`, `bf16`, `f16`).
    #[serde(default)]
    pub dtype: String,
    /// The prompts file as named on the command line.
    pub prompts_file: String,
    /// Prompts in the whole file (every shard).
    pub input_prompts: usize,
    /// The shards these files cover.
    pub shards: Vec<Shard>,
    /// Prompts covered.
    pub prompts: usize,
    /// Token rows written.
    pub tokens: usize,
    /// The saved sites.
    pub sites: Vec<SiteEntry>,
    /// Row files, relative to the manifest's folder.
    pub files: Vec<String>,
}

/// Runs (or resumes) `job` on `model`, calling `progress` after every batch; returns the
/// manifest it wrote.
pub fn extract(
    model: &Model,
    job: &ExtractJob,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Manifest> {
    if job.batch_size == 0 || job.max_rows_per_file == 0 || job.sites.is_empty() {
        return Err(Error::InvalidInput(
            "extract needs --batch-size >= 1, --max-rows-per-file >= 1 and at least one --save"
                .into(),
        ));
    }
    let rows: Vec<SiteRows> = job
        .sites
        .iter()
        .map(|site| {
            let sparse = matches!(
                site,
                Site::Dictionary {
                    part: DictionaryPart::Features,
                    ..
                }
            );
            SiteRows::of_with(model.layout(), *site, sparse.then_some(job.feature_top_k))
        })
        .collect::<Result<_>>()?;
    let row_bytes = rows
        .iter()
        .map(|r| {
            let element = match r.sparse {
                Some(_) => std::mem::size_of::<f32>() + std::mem::size_of::<i64>(),
                None => std::mem::size_of::<f32>(),
            };
            r.row_len().saturating_mul(element)
        })
        .fold(3 * std::mem::size_of::<i64>(), usize::saturating_add);
    hookscope_core::memory::ensure_fits(
        || format!("a file of {} rows", job.max_rows_per_file),
        row_bytes.saturating_mul(job.max_rows_per_file),
        "; lower --max-rows-per-file",
    )?;
    std::fs::create_dir_all(&job.out_dir).map_err(|source| Error::Io {
        path: job.out_dir.clone(),
        source,
    })?;
    let (input_prompts, fingerprint) = prompts::survey(&job.prompts)?;
    let record = JobRecord {
        format: FORMAT.into(),
        model: job.model.clone(),
        model_type: model.architecture().name.to_string(),
        dtype: model.dtype().to_string(),
        prompts_file: job.prompts.display().to_string(),
        prompts_fingerprint: format!("{fingerprint:016x}"),
        input_prompts,
        sites: rows.iter().map(site_entry).collect(),
        batch_size: job.batch_size,
        max_rows_per_file: job.max_rows_per_file,
        shard: job.shard,
    };
    let names = FileNames::new(job.shard);
    let manifest_path = job.out_dir.join(names.manifest());
    match_or_record_job(&job.out_dir.join(names.job()), &record)?;
    if manifest_path.is_file() {
        return read_json(&manifest_path);
    }
    let (mut files, done_prompts, done_tokens) = finished_files(&job.out_dir, &names)?;
    let prompts_total = shard_size(input_prompts, job.shard);
    let mut state = Progress {
        prompts_done: done_prompts,
        prompts_total,
        ..Progress::default()
    };
    let mut skip = done_prompts;
    let mut buffer = FileBuffer::new(&rows);
    let mut reader = PromptReader::open(&job.prompts, job.shard)?;
    let window_size = job.batch_size * WINDOW_BATCHES;
    let mut tokens = done_tokens;
    loop {
        let window = next_window(&mut reader, model, &job.prompts, window_size)?;
        if window.is_empty() {
            break;
        }
        for batch in window.chunks(job.batch_size) {
            if skip > 0 {
                if skip < batch.len() {
                    return Err(resume_mismatch(&job.out_dir));
                }
                skip -= batch.len();
                continue;
            }
            let batch_rows: usize = batch.iter().map(|p| p.ids.len()).sum();
            if buffer.rows() > 0 && buffer.rows() + batch_rows > job.max_rows_per_file {
                files.push(flush(&mut buffer, &job.out_dir, &names, files.len())?);
                state.files_written += 1;
            }
            run_batch(model, batch, &rows, &mut buffer)?;
            state.prompts_done += batch.len();
            state.tokens_run += batch_rows;
            tokens += batch_rows;
            if buffer.rows() >= job.max_rows_per_file {
                files.push(flush(&mut buffer, &job.out_dir, &names, files.len())?);
                state.files_written += 1;
            }
            progress(&state);
        }
    }
    if skip > 0 {
        return Err(resume_mismatch(&job.out_dir));
    }
    if buffer.prompts() > 0 {
        files.push(flush(&mut buffer, &job.out_dir, &names, files.len())?);
        state.files_written += 1;
        progress(&state);
    }
    let manifest = Manifest {
        format: FORMAT.into(),
        model: record.model,
        model_type: record.model_type,
        dtype: record.dtype,
        prompts_file: record.prompts_file,
        input_prompts,
        shards: vec![job.shard],
        prompts: state.prompts_done,
        tokens,
        sites: record.sites,
        files,
    };
    write_json(&manifest_path, &manifest)?;
    Ok(manifest)
}

fn site_entry(rows: &SiteRows) -> SiteEntry {
    SiteEntry {
        name: rows.site.to_string(),
        rows: rows.kind,
        shape: rows.row_shape.clone(),
        sparse_top_k: rows.sparse,
    }
}

/// Prompts with ordinal `≡ index (mod count)` among `total`.
fn shard_size(total: usize, shard: Shard) -> usize {
    total / shard.count + usize::from(shard.index < total % shard.count)
}

/// Records the job before its first file, or checks that a rerun repeats it.
fn match_or_record_job(path: &Path, record: &JobRecord) -> Result<()> {
    if !path.is_file() {
        return write_json(path, record);
    }
    let earlier: JobRecord = read_json(path)?;
    if earlier == *record {
        return Ok(());
    }
    let (was, now) = (
        serde_json::to_value(&earlier).unwrap_or_default(),
        serde_json::to_value(record).unwrap_or_default(),
    );
    let changed: Vec<String> = now
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(key, value)| was.get(key.as_str()) != Some(value))
        .map(|(key, _)| format!("`{key}`"))
        .collect();
    Err(Error::InvalidInput(format!(
        "{} records an earlier extraction with other settings ({} differ); resume it with the \
         same command, or use another --out-dir",
        path.display(),
        changed.join(", ")
    )))
}

/// The row files an earlier run finished (consecutive from 0), with their prompt and token
/// counts.
fn finished_files(dir: &Path, names: &FileNames) -> Result<(Vec<String>, usize, usize)> {
    let (mut files, mut prompts, mut tokens) = (Vec::new(), 0, 0);
    loop {
        let name = names.rows(files.len());
        let path = dir.join(&name);
        if !path.is_file() {
            return Ok((files, prompts, tokens));
        }
        prompts += read_index(&path, PROMPTS_PROMPT_INDEX)?.len();
        tokens += read_index(&path, PROMPT_INDEX)?.len();
        files.push(name);
    }
}

fn resume_mismatch(dir: &Path) -> Error {
    Error::InvalidInput(format!(
        "the finished files in {} do not end at a batch boundary of this job: they were not \
         written by it; use another --out-dir",
        dir.display()
    ))
}

/// The next window of prompts in input order, tokenized and stably sorted by length.
fn next_window(
    reader: &mut PromptReader,
    model: &Model,
    source: &Path,
    size: usize,
) -> Result<Vec<Prompt>> {
    let vocab = model.layout().vocab;
    let mut window = Vec::with_capacity(size);
    for raw in reader.by_ref().take(size) {
        let prompt = raw?.tokenize(model.tokenizer(), source)?;
        if let Some(id) = prompt.ids.iter().find(|id| **id as usize >= vocab) {
            return Err(Error::InvalidInput(format!(
                "{}:{}: token id {id} is outside the vocabulary (size {vocab})",
                source.display(),
                prompt.line + 1
            )));
        }
        window.push(prompt);
    }
    window.sort_by_key(|prompt| prompt.ids.len());
    Ok(window)
}

/// Runs one batch's prompt call and appends its rows to `buffer`.
fn run_batch(
    model: &Model,
    batch: &[Prompt],
    rows: &[SiteRows],
    buffer: &mut FileBuffer,
) -> Result<()> {
    let interventions = rows.iter().fold(Interventions::new(), |acc, site| {
        acc.save(site.site, Steps::At(0))
    });
    let ids: Vec<Vec<u32>> = batch.iter().map(|p| p.ids.clone()).collect();
    let run = Run::new()
        .interventions(&interventions)
        .stop_after_last_request();
    let saved = model.trace(&model.batch(ids)?, run)?.saved;
    let lengths: Vec<usize> = batch.iter().map(|p| p.ids.len()).collect();
    for (index, site) in rows.iter().enumerate() {
        let data = saved.require(site.site, 0)?.to_data();
        let shape = data.shape().to_vec();
        let values = hookscope_core::host::f32_values(data)?;
        let (layout, out) = buffer.site_buffer(index);
        layout.append(&values, &shape, &lengths, out);
    }
    for prompt in batch {
        buffer.push_prompt(prompt.line, &prompt.ids);
    }
    Ok(())
}

fn flush(buffer: &mut FileBuffer, dir: &Path, names: &FileNames, seq: usize) -> Result<String> {
    let name = names.rows(seq);
    buffer.write(&dir.join(&name))?;
    Ok(name)
}

/// Checks that the shard manifests in `dir` cover one job completely and disjointly (every
/// shard present, every prompt of the input in exactly one file), and writes their union as
/// `manifest.json`.
pub fn merge_manifests(dir: &Path) -> Result<Manifest> {
    let entries = std::fs::read_dir(dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut parts: Vec<Manifest> = Vec::new();
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("manifest.shard-") && name.ends_with(".json") {
            parts.push(read_json(&entry.path())?);
        }
    }
    let invalid = |message: String| Error::InvalidInput(format!("{}: {message}", dir.display()));
    let Some(first) = parts.first().cloned() else {
        return Err(invalid(
            "no shard manifests (manifest.shard-*.json) to merge".into(),
        ));
    };
    let count = first.shards.first().map_or(0, |s| s.count);
    for part in &parts {
        let same_job = part.model == first.model
            && part.dtype == first.dtype
            && part.prompts_file == first.prompts_file
            && part.input_prompts == first.input_prompts
            && part.sites == first.sites
            && part.shards.iter().all(|s| s.count == count);
        if !same_job {
            return Err(invalid(format!(
                "shard manifests of different jobs (compare {:?} with {:?})",
                first.shards, part.shards
            )));
        }
    }
    let mut shards: Vec<Shard> = parts.iter().flat_map(|p| p.shards.clone()).collect();
    shards.sort_by_key(|s| s.index);
    let missing: Vec<String> = (0..count)
        .filter(|i| !shards.iter().any(|s| s.index == *i))
        .map(|i| format!("{i}/{count}"))
        .collect();
    if !missing.is_empty() {
        return Err(invalid(format!(
            "shards {} have not finished (no manifest)",
            missing.join(", ")
        )));
    }
    let mut files: Vec<String> = parts.iter().flat_map(|p| p.files.clone()).collect();
    files.sort();
    let mut covered = Vec::new();
    for file in &files {
        covered.extend(read_index(&dir.join(file), PROMPTS_PROMPT_INDEX)?);
    }
    covered.sort_unstable();
    if let Some(pair) = covered.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(invalid(format!(
            "prompt on line {} is in more than one file",
            pair[0] + 1
        )));
    }
    if covered.len() != first.input_prompts {
        return Err(invalid(format!(
            "the files cover {} prompts, the input has {}",
            covered.len(),
            first.input_prompts
        )));
    }
    let manifest = Manifest {
        shards,
        prompts: covered.len(),
        tokens: parts.iter().map(|p| p.tokens).sum(),
        files,
        ..first
    };
    write_json(&dir.join("manifest.json"), &manifest)?;
    Ok(manifest)
}

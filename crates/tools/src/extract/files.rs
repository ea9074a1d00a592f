//! The files an extraction writes: row files (safetensors, one row per real token or per prompt),
//! the job description a rerun must match, and the manifest.

use std::path::{Path, PathBuf};

use hookscope_core::burn::tensor::TensorData;
use safetensors::SafeTensors;

use super::prompts::Shard;
use super::rows::{RowBuffer, RowKind, SiteRows};
use hookscope_core::{Error, Result};

/// Per-token index arrays every row file holds, `[rows]` int64.
pub const PROMPT_INDEX: &str = "prompt_index";
/// See [`PROMPT_INDEX`].
pub const POSITION: &str = "position";
/// See [`PROMPT_INDEX`].
pub const TOKEN_ID: &str = "token_id";
/// Per-prompt index arrays, `[prompts]` int64, aligned with the rows of per-prompt sites.
pub const PROMPTS_PROMPT_INDEX: &str = "prompts.prompt_index";
/// See [`PROMPTS_PROMPT_INDEX`].
pub const PROMPTS_LENGTH: &str = "prompts.length";

/// The names an extraction of `shard` gives its files.
#[derive(Debug, Clone)]
pub struct FileNames {
    stem: String,
}

impl FileNames {
    /// Names for `shard` (`extract-…` for a whole job, `shard-I-of-N-…` for a part).
    pub fn new(shard: Shard) -> FileNames {
        let stem = match shard {
            Shard::WHOLE => "extract".to_string(),
            Shard { index, count } => format!("shard-{index:05}-of-{count:05}"),
        };
        FileNames { stem }
    }

    /// Row file number `seq`.
    pub fn rows(&self, seq: usize) -> String {
        format!("{}-{seq:06}.safetensors", self.stem)
    }

    /// The job description.
    pub fn job(&self) -> String {
        format!("job.{}.json", self.stem)
    }

    /// The manifest (`manifest.json` for a whole job).
    pub fn manifest(&self) -> String {
        match self.stem.as_str() {
            "extract" => "manifest.json".into(),
            stem => format!("manifest.{stem}.json"),
        }
    }
}

/// The suffix of a sparse site's indices tensor (`SITE.indices`, int64 `[rows, k]`, `-1` where a
/// row has fewer than `k` non-zero entries).
pub const SPARSE_INDICES: &str = ".indices";
/// The suffix of a sparse site's values tensor (`SITE.values`, f32 `[rows, k]`).
pub const SPARSE_VALUES: &str = ".values";

/// Rows gathered for the next file.
pub struct FileBuffer {
    sites: Vec<(SiteRows, RowBuffer)>,
    prompt_index: Vec<i64>,
    position: Vec<i64>,
    token_id: Vec<i64>,
    prompt_lines: Vec<i64>,
    prompt_lengths: Vec<i64>,
}

impl FileBuffer {
    /// An empty buffer for these sites.
    pub fn new(sites: &[SiteRows]) -> FileBuffer {
        FileBuffer {
            sites: sites
                .iter()
                .map(|s| (s.clone(), RowBuffer::default()))
                .collect(),
            prompt_index: Vec::new(),
            position: Vec::new(),
            token_id: Vec::new(),
            prompt_lines: Vec::new(),
            prompt_lengths: Vec::new(),
        }
    }

    /// Token rows held.
    pub fn rows(&self) -> usize {
        self.prompt_index.len()
    }

    /// Prompts held.
    pub fn prompts(&self) -> usize {
        self.prompt_lines.len()
    }

    /// Records one prompt's index arrays (its line and token ids).
    pub fn push_prompt(&mut self, line: usize, ids: &[u32]) {
        let line = line as i64;
        self.prompt_lines.push(line);
        self.prompt_lengths.push(ids.len() as i64);
        for (position, id) in ids.iter().enumerate() {
            self.prompt_index.push(line);
            self.position.push(position as i64);
            self.token_id.push(i64::from(*id));
        }
    }

    /// The buffer a site's rows go to.
    pub fn site_buffer(&mut self, index: usize) -> (&SiteRows, &mut RowBuffer) {
        let (rows, buffer) = &mut self.sites[index];
        (rows, buffer)
    }

    /// Writes the held rows to `path` (atomically) and empties the buffer.
    pub fn write(&mut self, path: &Path) -> Result<()> {
        let (rows, prompts) = (self.rows(), self.prompts());
        let mut tensors = Vec::with_capacity(2 * self.sites.len() + 5);
        for (site, buffer) in &mut self.sites {
            let count = match site.kind {
                RowKind::Token => rows,
                RowKind::Prompt => prompts,
            };
            let shape: Vec<usize> = [count].into_iter().chain(site.row_shape.clone()).collect();
            let RowBuffer { values, indices } = std::mem::take(buffer);
            match site.sparse {
                None => tensors.push((site.site.to_string(), TensorData::new(values, shape))),
                Some(_) => {
                    let name = site.site.to_string();
                    tensors.push((
                        format!("{name}{SPARSE_INDICES}"),
                        TensorData::new(indices, shape.clone()),
                    ));
                    tensors.push((
                        format!("{name}{SPARSE_VALUES}"),
                        TensorData::new(values, shape),
                    ));
                }
            }
        }
        for (name, values, count) in [
            (PROMPT_INDEX, &mut self.prompt_index, rows),
            (POSITION, &mut self.position, rows),
            (TOKEN_ID, &mut self.token_id, rows),
            (PROMPTS_PROMPT_INDEX, &mut self.prompt_lines, prompts),
            (PROMPTS_LENGTH, &mut self.prompt_lengths, prompts),
        ] {
            let values = std::mem::take(values);
            tensors.push((name.to_string(), TensorData::new(values, [count])));
        }
        hookscope_core::output::write_safetensors(path, &tensors)
    }
}

/// The `int64` array `name` of a row file written by [`FileBuffer::write`].
pub fn read_index(path: &Path, name: &str) -> Result<Vec<i64>> {
    let malformed = |message: String| Error::Safetensors {
        path: path.to_path_buf(),
        message,
    };
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    // SAFETY: the map is read-only and private to this process; a row file is renamed into
    // place complete and never rewritten, so nothing changes it underneath the map.
    let bytes = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    let tensors = SafeTensors::deserialize(&bytes).map_err(|e| malformed(e.to_string()))?;
    let view = tensors
        .tensor(name)
        .map_err(|_| malformed(format!("no `{name}` array: not a file of this extraction")))?;
    if view.dtype() != safetensors::Dtype::I64 {
        return Err(malformed(format!("`{name}` is not int64")));
    }
    Ok(view
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap_or_default()))
        .collect())
}

/// Writes `value` as pretty JSON to `path` atomically (temporary file, then rename).
pub fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let error = |message: String| Error::Output {
        path: path.to_path_buf(),
        message,
    };
    let text = serde_json::to_string_pretty(value).map_err(|e| error(e.to_string()))?;
    let temporary: PathBuf = path.with_extension(format!("json.{}.tmp", std::process::id()));
    std::fs::write(&temporary, text + "\n").map_err(|e| error(e.to_string()))?;
    std::fs::rename(&temporary, path).map_err(|e| error(e.to_string()))
}

/// Reads JSON written by [`write_json`].
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })
}

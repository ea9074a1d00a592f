//! Reading safetensors checkpoints (a single file or shards), memory-mapped or compiled into the
//! binary: their headers, names, dtypes and stored bytes, read in place. Building a model's
//! weights from them is `crate::weights`.

mod dtype;

use std::collections::{BTreeSet, HashMap};
use std::ops::Deref;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, Metadata, SafeTensors};

pub use dtype::auto_dtype;

use crate::error::{Error, Result};
use crate::precision::WeightDtype;

/// File bytes: memory-mapped from disk, or compiled into the binary.
pub(crate) enum Bytes {
    Mapped(memmap2::Mmap),
    Static(&'static [u8]),
    /// A safetensors image built in memory (from another format).
    Owned(Vec<u8>),
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(map) => map,
            Bytes::Static(bytes) => bytes,
            Bytes::Owned(bytes) => bytes,
        }
    }
}

impl Bytes {
    /// Maps a file read-only.
    pub(crate) fn map(path: &Path) -> Result<Bytes> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process; a checkpoint rewritten
        // underneath a running process is outside what hookscope can guard against (as with
        // every mmap-based loader).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Ok(Bytes::Mapped(map))
    }
}

struct Shard {
    path: PathBuf,
    bytes: Bytes,
    data_start: usize,
    metadata: Metadata,
}

/// The weights of a checkpoint, by name, without reading them yet.
pub struct Checkpoint {
    /// Where it was read from (for messages).
    pub(crate) origin: PathBuf,
    shards: Vec<Shard>,
    /// Weight name → shard index.
    names: HashMap<String, usize>,
}

impl Checkpoint {
    /// Opens `model.safetensors` or the shards of `model.safetensors.index.json` in `dir`.
    pub fn open_dir(dir: &Path) -> Result<Checkpoint> {
        let single = dir.join("model.safetensors");
        if single.is_file() {
            return Checkpoint::from_shards(dir, vec![(single.clone(), Bytes::map(&single)?)]);
        }
        let index_path = dir.join("model.safetensors.index.json");
        if !index_path.is_file() {
            return Err(Error::ModelNotFound {
                spec: dir.display().to_string(),
                reason: "no model.safetensors or model.safetensors.index.json in it".into(),
            });
        }
        let index = crate::config::read_json(&index_path)?;
        let Some(weight_map) = index.get("weight_map").and_then(|m| m.as_object()) else {
            return Err(Error::Safetensors {
                path: index_path,
                message: "no `weight_map` object".into(),
            });
        };
        let mut files = BTreeSet::new();
        for file in weight_map.values() {
            let Some(file) = file.as_str() else {
                return Err(Error::Safetensors {
                    path: index_path.clone(),
                    message: format!("`weight_map` value {file} is not a file name"),
                });
            };
            files.insert(file.to_string());
        }
        let shards = files
            .into_iter()
            .map(|file| {
                let path = dir.join(&file);
                Bytes::map(&path).map(|bytes| (path, bytes))
            })
            .collect::<Result<Vec<_>>>()?;
        let checkpoint = Checkpoint::from_shards(dir, shards)?;
        let missing: Vec<String> = weight_map
            .keys()
            .filter(|name| !checkpoint.names.contains_key(*name))
            .map(|name| format!("  index names `{name}`, which its shard does not hold"))
            .collect();
        if !missing.is_empty() {
            return Err(Error::Weights {
                path: dir.to_path_buf(),
                problems: missing,
            });
        }
        Ok(checkpoint)
    }

    /// Opens one safetensors file of any tensors (e.g. values saved by `hookscope run --out`).
    pub fn open_file(path: &Path) -> Result<Checkpoint> {
        Checkpoint::from_shards(path, vec![(path.to_path_buf(), Bytes::map(path)?)])
    }

    /// A checkpoint of f32 tensors converted from another format read from `origin`.
    pub(crate) fn from_f32_tensors(
        origin: &Path,
        tensors: Vec<(String, Vec<usize>, Vec<f32>)>,
    ) -> Result<Checkpoint> {
        let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
            .into_iter()
            .map(|(name, shape, values)| {
                let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                (name, shape, bytes)
            })
            .collect();
        let views = bytes
            .iter()
            .map(|(name, shape, data)| {
                safetensors::tensor::TensorView::new(Dtype::F32, shape.clone(), data)
                    .map(|view| (name.clone(), view))
            })
            .collect::<std::result::Result<Vec<_>, _>>();
        let image = views
            .and_then(|views| safetensors::serialize(views, None))
            .map_err(|e| Error::Safetensors {
                path: origin.to_path_buf(),
                message: e.to_string(),
            })?;
        Checkpoint::from_shards(origin, vec![(origin.to_path_buf(), Bytes::Owned(image))])
    }

    /// One stored tensor as f32 values with its shape. Errors name the file and the key, and
    /// list the keys the file holds when it lacks this one.
    pub fn tensor_f32(&self, name: &str) -> Result<(Vec<f32>, Vec<usize>)> {
        let error = |message: String| Error::TensorInFile {
            path: self.origin.clone(),
            message,
        };
        if !self.contains(name) {
            let names = self.names();
            let shown: Vec<String> = names.iter().take(12).map(|n| format!("`{n}`")).collect();
            let more = names.len().saturating_sub(shown.len());
            return Err(error(format!(
                "no tensor `{name}`; it holds {}{}",
                shown.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            )));
        }
        self.read(name)
            .map_err(|message| error(format!("tensor `{name}`: {message}")))
    }

    /// A checkpoint held in memory (the embedded default model).
    pub(crate) fn from_static(origin: &Path, bytes: &'static [u8]) -> Result<Checkpoint> {
        let path = origin.join("model.safetensors");
        Checkpoint::from_shards(origin, vec![(path, Bytes::Static(bytes))])
    }

    fn from_shards(origin: &Path, files: Vec<(PathBuf, Bytes)>) -> Result<Checkpoint> {
        let mut shards = Vec::with_capacity(files.len());
        let mut names = HashMap::new();
        for (index, (path, bytes)) in files.into_iter().enumerate() {
            let (header_len, metadata) =
                SafeTensors::read_metadata(&bytes).map_err(|e| Error::Safetensors {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
            let data_start = 8 + header_len;
            for name in metadata.tensors().keys() {
                names.insert(name.clone(), index);
            }
            shards.push(Shard {
                path,
                bytes,
                data_start,
                metadata,
            });
        }
        Ok(Checkpoint {
            origin: origin.to_path_buf(),
            shards,
            names,
        })
    }

    /// Whether a weight of this name is stored.
    pub fn contains(&self, name: &str) -> bool {
        self.names.contains_key(name)
    }

    /// Every stored weight name, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.names.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Bytes the stored weights take once stored in `dtype` (what a load allocates).
    pub fn bytes_as(&self, dtype: WeightDtype) -> usize {
        self.shards
            .iter()
            .flat_map(|shard| shard.metadata.tensors().into_values())
            .map(|info| info.shape.iter().product::<usize>())
            .fold(0usize, |total, elements| {
                total.saturating_add(elements.saturating_mul(dtype.size()))
            })
    }

    /// Bytes of the stored tensors of type `dtype`, as stored.
    pub(crate) fn bytes_of(&self, dtype: Dtype) -> usize {
        self.shards
            .iter()
            .flat_map(|shard| shard.metadata.tensors().into_values())
            .filter(|info| info.dtype == dtype)
            .map(|info| info.data_offsets.1.saturating_sub(info.data_offsets.0))
            .fold(0usize, usize::saturating_add)
    }

    /// The stored shape of a weight, if the checkpoint holds it in a dtype hookscope reads.
    pub(crate) fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.stored(name).ok().map(|stored| stored.shape)
    }

    /// The precision a weight is stored in, if the checkpoint holds it in one hookscope reads.
    pub(crate) fn precision_of(&self, name: &str) -> Option<WeightDtype> {
        self.stored(name).ok().map(|stored| match stored.dtype {
            Dtype::BF16 => WeightDtype::Bf16,
            Dtype::F16 => WeightDtype::F16,
            _ => WeightDtype::F32,
        })
    }

    /// One weight's stored bytes, read in place.
    pub(crate) fn stored(&self, name: &str) -> Result<Stored<'_>, String> {
        let shard = &self.shards[*self.names.get(name).ok_or("missing")?];
        let info = shard.metadata.info(name).ok_or("missing")?;
        let (start, end) = info.data_offsets;
        let bytes = &shard.bytes[shard.data_start + start..shard.data_start + end];
        match info.dtype {
            Dtype::F32 | Dtype::F16 | Dtype::BF16 => Ok(Stored {
                dtype: info.dtype,
                bytes,
                shape: info.shape.clone(),
            }),
            other => Err(format!(
                "dtype {other:?} in {} is not supported (F32, F16, BF16 are)",
                shard.path.display()
            )),
        }
    }

    /// Reads one weight as f32 with its shape.
    pub(crate) fn read(&self, name: &str) -> Result<(Vec<f32>, Vec<usize>), String> {
        let stored = self.stored(name)?;
        let values = (0..stored.len()).map(|i| stored.value(i)).collect();
        Ok((values, stored.shape))
    }

    /// Gives back the memory pages holding a weight that has been read (a mapped file's pages
    /// count towards the process's resident memory until then): loading then never holds a
    /// weight twice, once as mapped bytes and once as loaded.
    pub(crate) fn release(&self, name: &str) {
        let Some(shard) = self.names.get(name).map(|&index| &self.shards[index]) else {
            return;
        };
        let (Bytes::Mapped(map), Some(info)) = (&shard.bytes, shard.metadata.info(name)) else {
            return;
        };
        let page = page_size();
        let start = (shard.data_start + info.data_offsets.0).next_multiple_of(page);
        let end = (shard.data_start + info.data_offsets.1) / page * page;
        if end > start {
            // SAFETY: the map is read-only and no reference into these pages outlives this
            // call's caller; dropped pages of a file mapping read back the same bytes from the
            // file if they are touched again. A failure only leaves the pages resident.
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
            };
        }
    }
}

/// The size of a memory page.
fn page_size() -> usize {
    // SAFETY: `sysconf` has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .unwrap_or(4096)
}

/// A stored tensor's bytes (F32, F16 or BF16, little-endian) and shape.
pub(crate) struct Stored<'a> {
    pub(crate) dtype: Dtype,
    pub(crate) bytes: &'a [u8],
    pub(crate) shape: Vec<usize>,
}

impl Stored<'_> {
    /// Number of stored elements.
    pub(crate) fn len(&self) -> usize {
        match self.dtype {
            Dtype::F32 => self.bytes.len() / 4,
            _ => self.bytes.len() / 2,
        }
    }

    /// Element `index` as f32 (exact: every stored type widens to f32 without rounding).
    pub(crate) fn value(&self, index: usize) -> f32 {
        match self.dtype {
            Dtype::F32 => f32_at(self.bytes, index),
            Dtype::F16 => f16_at(self.bytes, index),
            _ => bf16_at(self.bytes, index),
        }
    }
}

/// Element `index` of little-endian f32 bytes.
pub(crate) fn f32_at(bytes: &[u8], index: usize) -> f32 {
    let b = &bytes[4 * index..4 * index + 4];
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// Element `index` of little-endian f16 bytes, widened to f32.
pub(crate) fn f16_at(bytes: &[u8], index: usize) -> f32 {
    half::f16::from_le_bytes([bytes[2 * index], bytes[2 * index + 1]]).to_f32()
}

/// Element `index` of little-endian bf16 bytes, widened to f32.
pub(crate) fn bf16_at(bytes: &[u8], index: usize) -> f32 {
    half::bf16::from_le_bytes([bytes[2 * index], bytes[2 * index + 1]]).to_f32()
}

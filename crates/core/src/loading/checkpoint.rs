//! Safetensors checkpoints (single file or sharded), memory-mapped, and the weight loader that
//! reports every missing or misshapen weight at once.

use std::collections::{BTreeSet, HashMap};
use std::ops::Deref;
use std::path::{Path, PathBuf};

use burn::tensor::{Device, Tensor, TensorData};
use safetensors::tensor::{Dtype, Metadata, SafeTensors};

use super::{MatmulPrecision, WeightDtype};
use crate::error::{Error, Result};
use crate::nn::flex::is_flex;
use crate::nn::packed::PackedMatrix;

/// File bytes: memory-mapped from disk, or compiled into the binary.
pub(crate) enum Bytes {
    Mapped(memmap2::Mmap),
    Static(&'static [u8]),
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(map) => map,
            Bytes::Static(bytes) => bytes,
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
    origin: PathBuf,
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
        let index = crate::loading::read_json(&index_path)?;
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

    /// One weight's stored bytes, read in place.
    fn stored(&self, name: &str) -> Result<Stored<'_>, String> {
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
    fn read(&self, name: &str) -> Result<(Vec<f32>, Vec<usize>), String> {
        let stored = self.stored(name)?;
        let values = (0..stored.len()).map(|i| stored.value(i)).collect();
        Ok((values, stored.shape))
    }

    /// Gives back the memory pages holding a weight that has been read (a mapped file's pages
    /// count towards the process's resident memory until then): loading then never holds a
    /// weight twice, once as mapped bytes and once as loaded.
    fn release(&self, name: &str) {
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
struct Stored<'a> {
    dtype: Dtype,
    bytes: &'a [u8],
    shape: Vec<usize>,
}

impl Stored<'_> {
    fn len(&self) -> usize {
        match self.dtype {
            Dtype::F32 => self.bytes.len() / 4,
            _ => self.bytes.len() / 2,
        }
    }

    /// Element `index` as f32 (exact: every stored type widens to f32 without rounding).
    fn value(&self, index: usize) -> f32 {
        match self.dtype {
            Dtype::F32 => f32_at(self.bytes, index),
            Dtype::F16 => f16_at(self.bytes, index),
            _ => bf16_at(self.bytes, index),
        }
    }

    /// Packs the stored tensor as a `[d_in, d_out]` matrix whose element `(k, n)` is stored at
    /// flat index `index(k, n)`, in `dtype`.
    fn pack(
        &self,
        dtype: WeightDtype,
        [d_in, d_out]: [usize; 2],
        index: impl Fn(usize, usize) -> usize + Sync,
    ) -> PackedMatrix {
        let bytes = self.bytes;
        match self.dtype {
            Dtype::F32 => PackedMatrix::pack(dtype, d_in, d_out, |k, n| f32_at(bytes, index(k, n))),
            Dtype::F16 => PackedMatrix::pack(dtype, d_in, d_out, |k, n| f16_at(bytes, index(k, n))),
            _ => PackedMatrix::pack(dtype, d_in, d_out, |k, n| bf16_at(bytes, index(k, n))),
        }
    }
}

fn f32_at(bytes: &[u8], index: usize) -> f32 {
    let b = &bytes[4 * index..4 * index + 4];
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn f16_at(bytes: &[u8], index: usize) -> f32 {
    half::f16::from_le_bytes([bytes[2 * index], bytes[2 * index + 1]]).to_f32()
}

fn bf16_at(bytes: &[u8], index: usize) -> f32 {
    half::bf16::from_le_bytes([bytes[2 * index], bytes[2 * index + 1]]).to_f32()
}

/// How a weight matrix is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Orientation {
    /// `[in, out]` (GPT-2's `Conv1D`).
    InOut,
    /// `[out, in]` (torch's `nn.Linear`, embedding tables).
    OutIn,
}

/// A loaded weight matrix, ready for `x W`.
pub(crate) enum Matrix {
    /// Packed for the CPU kernels.
    Packed(PackedMatrix),
    /// An `[in, out]` tensor (a view of the stored matrix), for burn's matmul.
    Tensor(Box<Tensor<2>>),
}

/// Where a [`WeightLoader`] takes its weights from.
enum WeightSource<'a> {
    /// A stored checkpoint.
    Checkpoint(&'a Checkpoint),
    /// Seeded pseudo-random values of whatever shape is asked for (conformance models).
    Random { seed: u64 },
}

/// Loads weights into tensors, collecting every problem instead of stopping at the first, and
/// reporting which stored weights were never used (like burn-store's `ApplyResult`).
pub struct WeightLoader<'a> {
    source: WeightSource<'a>,
    device: Device,
    dtype: WeightDtype,
    matmul_precision: MatmulPrecision,
    used: BTreeSet<String>,
    problems: Vec<String>,
    notes: Vec<String>,
    parameters: usize,
    /// Bytes the loaded weights take as stored.
    weight_bytes: usize,
    /// Bytes of zero placeholders handed out for missing or misshapen weights.
    placeholder_bytes: usize,
}

/// Most bytes of zero placeholders (stand-ins for missing or misshapen weights, sized from the
/// config) a failing load allocates before it stops.
pub const PLACEHOLDER_BUDGET: usize = 256 << 20;

/// Most problems an error lists; the rest are counted.
const LISTED_PROBLEMS: usize = 32;

/// The first [`LISTED_PROBLEMS`] problems, and a count of the rest.
fn listed(mut problems: Vec<String>) -> Vec<String> {
    if problems.len() > LISTED_PROBLEMS {
        let more = problems.len() - LISTED_PROBLEMS;
        problems.truncate(LISTED_PROBLEMS);
        problems.push(format!("  ... and {more} more"));
    }
    problems
}

/// What loading did with the checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Stored weights the adapter never asked for.
    pub unused: Vec<String>,
    /// Number of parameters loaded.
    pub parameters: usize,
    /// Bytes the loaded weights take as stored (matrices in the load's precision, the other
    /// weights in f32).
    pub weight_bytes: usize,
    /// The precision the weight matrices are stored in.
    pub dtype: WeightDtype,
    /// The precision activations meet the weight matrices in.
    pub matmul_precision: MatmulPrecision,
    /// What the adapter wants the user to know about the load (e.g. a part of the checkpoint
    /// it does not run).
    pub notes: Vec<String>,
}

impl<'a> WeightLoader<'a> {
    /// A loader reading `checkpoint`, placing tensors on `device`.
    pub fn new(checkpoint: &'a Checkpoint, device: &Device) -> Self {
        WeightLoader::from_source(WeightSource::Checkpoint(checkpoint), device)
    }

    /// A loader inventing seeded random weights (uniform in ±0.2) for every name asked: a model
    /// for structural checks, with no checkpoint.
    pub fn random(seed: u64, device: &Device) -> WeightLoader<'static> {
        WeightLoader::from_source(WeightSource::Random { seed }, device)
    }

    fn from_source(source: WeightSource<'a>, device: &Device) -> Self {
        WeightLoader {
            source,
            device: device.clone(),
            dtype: WeightDtype::F32,
            matmul_precision: MatmulPrecision::F32,
            used: BTreeSet::new(),
            problems: Vec::new(),
            notes: Vec::new(),
            parameters: 0,
            weight_bytes: 0,
            placeholder_bytes: 0,
        }
    }

    /// Stores weights in `dtype`: matrices (linear maps, embedding tables) are held in it, and
    /// every other weight is rounded to it (and held in f32), so that the model computes what
    /// transformers computes with the weights in that precision, accumulating in f32.
    pub fn with_dtype(mut self, dtype: WeightDtype) -> Self {
        self.dtype = dtype;
        self
    }

    /// The precision weights are stored in.
    pub fn dtype(&self) -> WeightDtype {
        self.dtype
    }

    /// Multiplies activations rounded to `precision` by the weight matrices (see
    /// [`MatmulPrecision`]; the model load checks that the choice fits the weights).
    pub fn with_matmul_precision(mut self, precision: MatmulPrecision) -> Self {
        self.matmul_precision = precision;
        self
    }

    /// Records a problem the adapter found with the config or checkpoint; it is listed with the
    /// weight problems and fails the load at [`WeightLoader::finish`].
    pub fn problem(&mut self, message: impl Into<String>) {
        self.problems.push(format!("  {}", message.into()));
    }

    /// Ends the load at a config value no weight can make sense of: the error lists the problems
    /// found so far and this one.
    pub fn refuse(&mut self, message: impl Into<String>) -> Error {
        self.problem(message);
        Error::Weights {
            path: self.origin(),
            problems: listed(std::mem::take(&mut self.problems)),
        }
    }

    /// Records something the user should know about this load (shown by the CLI).
    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    /// Whether a weight of this name is available (always, for random weights).
    pub fn contains(&self, name: &str) -> bool {
        match &self.source {
            WeightSource::Checkpoint(checkpoint) => checkpoint.contains(name),
            WeightSource::Random { .. } => true,
        }
    }

    /// The prefix under which this checkpoint stores its weights, among `candidates` (e.g.
    /// `["transformer.", ""]`): the candidate that begins the most stored names, each name
    /// counted for the longest candidate it starts with (ties: the earlier candidate). Deciding
    /// from every name, not one probe weight, keeps one missing weight from being reported
    /// under the wrong prefix along with every other weight.
    pub fn prefix<'p>(&self, candidates: &[&'p str]) -> &'p str {
        let WeightSource::Checkpoint(checkpoint) = &self.source else {
            return candidates.first().copied().unwrap_or("");
        };
        let mut counts = vec![0usize; candidates.len()];
        for name in checkpoint.names.keys() {
            let longest = candidates
                .iter()
                .enumerate()
                .filter(|(_, prefix)| name.starts_with(*prefix))
                .max_by_key(|(index, prefix)| (prefix.len(), std::cmp::Reverse(*index)));
            if let Some((index, _)) = longest {
                counts[index] += 1;
            }
        }
        let best = (0..candidates.len()).max_by_key(|&i| (counts[i], std::cmp::Reverse(i)));
        best.map_or("", |i| candidates[i])
    }

    /// The weight `name`, which must have `shape` and hold only finite values once rounded to
    /// the load's precision.
    ///
    /// A missing, misshapen or non-finite weight is recorded and a zero placeholder returned,
    /// so that [`WeightLoader::finish`] can list every problem at once. Placeholders are sized
    /// from the config, which may be corrupt: once they would exceed [`PLACEHOLDER_BUDGET`]
    /// bytes (or a shape's size overflows), loading stops with the problems found so far,
    /// before allocating anything from the untrusted sizes.
    pub fn tensor<const D: usize>(&mut self, name: &str, shape: [usize; D]) -> Result<Tensor<D>> {
        let elements = self.elements(name, &shape)?;
        let read = match &self.source {
            WeightSource::Checkpoint(checkpoint) => {
                let read = checkpoint.read(name);
                checkpoint.release(name);
                read
            }
            WeightSource::Random { seed } => {
                Ok((random_values(*seed, name, &shape), shape.to_vec()))
            }
        };
        let problem = match read {
            Ok((mut values, stored)) if stored == shape => {
                self.used.insert(name.to_string());
                let dtype = self.dtype;
                match values.iter().position(|v| !dtype.round(*v).is_finite()) {
                    None => {
                        if dtype != WeightDtype::F32 {
                            values.iter_mut().for_each(|v| *v = dtype.round(*v));
                        }
                        self.count(elements, std::mem::size_of::<f32>());
                        return Ok(Tensor::from_data(
                            TensorData::new(values, shape),
                            &self.device,
                        ));
                    }
                    Some(index) => self.non_finite(name, index, values[index]),
                }
            }
            Ok((_, stored)) => {
                self.used.insert(name.to_string());
                format!("  `{name}` has shape {stored:?}, expected {shape:?} from the config")
            }
            Err(reason) => format!("  `{name}`: {reason}"),
        };
        self.placeholder(problem, elements)?;
        Ok(Tensor::zeros(shape, &self.device))
    }

    /// The weight matrix `name`, stored with `shape` as `[in, out]` (`InOut`, a GPT-2 `Conv1D`)
    /// or `[out, in]` (`OutIn`, a torch `nn.Linear` or an embedding table), ready for products
    /// `x W`. On the CPU backend it is packed straight from the checkpoint's bytes into the
    /// load's precision (never held in f32 as a whole); elsewhere it is an `[in, out]` view of a
    /// tensor. Problems are recorded as [`WeightLoader::tensor`] records them.
    pub(crate) fn matrix(
        &mut self,
        name: &str,
        shape: [usize; 2],
        orientation: Orientation,
    ) -> Result<Matrix> {
        let [rows, columns] = shape;
        let d_in_out = match orientation {
            Orientation::InOut => [rows, columns],
            Orientation::OutIn => [columns, rows],
        };
        let index = move |k: usize, n: usize| match orientation {
            Orientation::InOut => k * columns + n,
            Orientation::OutIn => n * columns + k,
        };
        if !is_flex(&self.device) {
            let tensor = self.tensor(name, shape)?;
            return Ok(Matrix::Tensor(Box::new(match orientation {
                Orientation::InOut => tensor,
                Orientation::OutIn => tensor.transpose(),
            })));
        }
        let elements = self.elements(name, &shape)?;
        let packed = match &self.source {
            WeightSource::Checkpoint(checkpoint) => match checkpoint.stored(name) {
                Ok(stored) if stored.shape == shape => {
                    let packed = stored.pack(self.dtype, d_in_out, index);
                    checkpoint.release(name);
                    Ok(packed)
                }
                // The weight is there, misshapen: it counts as used.
                Ok(stored) => Err((
                    format!(
                        "  `{name}` has shape {:?}, expected {shape:?} from the config",
                        stored.shape
                    ),
                    true,
                )),
                Err(reason) => Err((format!("  `{name}`: {reason}"), false)),
            },
            WeightSource::Random { seed } => {
                let values = random_values(*seed, name, &shape);
                let [d_in, d_out] = d_in_out;
                Ok(PackedMatrix::pack(self.dtype, d_in, d_out, |k, n| {
                    values[index(k, n)]
                }))
            }
        };
        let problem = match packed {
            Ok(packed) => {
                self.used.insert(name.to_string());
                match packed.first_non_finite() {
                    None => {
                        self.count(elements, self.dtype.size());
                        let packed = packed.with_precision(self.matmul_precision);
                        return Ok(Matrix::Packed(packed));
                    }
                    Some(bad) => {
                        let flat = index(bad.input, bad.output);
                        let stored = match &self.source {
                            WeightSource::Checkpoint(checkpoint) => checkpoint
                                .stored(name)
                                .map_or(bad.value, |stored| stored.value(flat)),
                            WeightSource::Random { .. } => bad.value,
                        };
                        self.non_finite(name, flat, stored)
                    }
                }
            }
            Err((problem, stored)) => {
                if stored {
                    self.used.insert(name.to_string());
                }
                problem
            }
        };
        self.placeholder(problem, elements)?;
        Ok(Matrix::Tensor(Box::new(Tensor::zeros(
            d_in_out,
            &self.device,
        ))))
    }

    /// Elements of a weight of `shape`, or the error that stops a load whose config sizes
    /// overflow.
    fn elements(&mut self, name: &str, shape: &[usize]) -> Result<usize> {
        match shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) {
            Some(elements) => Ok(elements),
            None => {
                self.problems
                    .push(format!("  `{name}`: expected shape {shape:?} overflows"));
                Err(self.stopped())
            }
        }
    }

    /// Counts a loaded weight.
    fn count(&mut self, elements: usize, bytes_each: usize) {
        self.parameters += elements;
        self.weight_bytes = self
            .weight_bytes
            .saturating_add(elements.saturating_mul(bytes_each));
    }

    /// The problem of a weight whose stored `value` is not finite, or not once rounded to the
    /// load's precision.
    fn non_finite(&self, name: &str, index: usize, value: f32) -> String {
        match value.is_finite() {
            false => format!("  `{name}` holds a non-finite value ({value}) at flat index {index}"),
            true => format!(
                "  `{name}` holds {value} at flat index {index}, beyond the range of {} (load it \
                 with --dtype f32 or bf16)",
                self.dtype
            ),
        }
    }

    /// Records a problem and accounts for the zero placeholder of `elements` f32 values handed
    /// out instead; stops the load once placeholders exceed [`PLACEHOLDER_BUDGET`].
    fn placeholder(&mut self, problem: String, elements: usize) -> Result<()> {
        self.problems.push(problem);
        self.placeholder_bytes = self
            .placeholder_bytes
            .saturating_add(elements.saturating_mul(std::mem::size_of::<f32>()));
        if self.placeholder_bytes > PLACEHOLDER_BUDGET {
            return Err(self.stopped());
        }
        Ok(())
    }

    /// The error that ends a load early: every problem so far, and why it stopped.
    fn stopped(&mut self) -> Error {
        self.refuse(
            "(loading stopped here: the config's sizes do not match the checkpoint; check \
             config.json)",
        )
    }

    fn origin(&self) -> PathBuf {
        match &self.source {
            WeightSource::Checkpoint(checkpoint) => checkpoint.origin.clone(),
            WeightSource::Random { .. } => PathBuf::from("<random weights>"),
        }
    }

    /// Finishes loading: an error listing every problem, or a report of unused weights.
    pub fn finish(self) -> Result<LoadReport> {
        if !self.problems.is_empty() {
            return Err(Error::Weights {
                path: self.origin(),
                problems: listed(self.problems),
            });
        }
        let stored = match &self.source {
            WeightSource::Checkpoint(checkpoint) => checkpoint.names(),
            WeightSource::Random { .. } => Vec::new(),
        };
        let unused = stored
            .into_iter()
            .filter(|name| !self.used.contains(*name))
            .map(str::to_string)
            .collect();
        Ok(LoadReport {
            unused,
            parameters: self.parameters,
            weight_bytes: self.weight_bytes,
            dtype: self.dtype,
            matmul_precision: self.matmul_precision,
            notes: self.notes,
        })
    }
}

/// Deterministic values in ±0.2 for one named weight: the same name and seed give the same
/// values on every run and machine.
fn random_values(seed: u64, name: &str, shape: &[usize]) -> Vec<f32> {
    let mut rng =
        fastrand::Rng::with_seed(name.bytes().fold(seed ^ 0x9e37_79b9_7f4a_7c15, |h, b| {
            h.rotate_left(5) ^ u64::from(b)
        }));
    (0..shape.iter().product::<usize>())
        .map(|_| (rng.f32() - 0.5) * 0.4)
        .collect()
}

//! Building a model's weights from a checkpoint: the loader adapters ask for each weight by
//! name and shape, which packs matrices for the CPU kernels (in the load's precision), checks
//! every value, and reports every missing or misshapen weight at once, and which weights were
//! never used (like burn-store's `ApplyResult`).

mod scope;

use std::collections::BTreeSet;
use std::path::PathBuf;

use burn::tensor::{Device, Int, Tensor, TensorData};
use safetensors::Dtype;

use crate::checkpoint::{Checkpoint, Stored, bf16_at, f16_at, f32_at};
use crate::cpu::PackedMatrix;
use crate::device::is_cpu;
use crate::error::{Error, Result};
use crate::precision::{MatmulPrecision, WeightDtype};

pub use scope::WeightScope;

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
        for name in checkpoint.names() {
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
        self.matrix_outputs(name, shape, orientation, None)
    }

    /// As [`WeightLoader::matrix`], keeping only the output units `outputs` (in that order), or
    /// all of them: one part of a fused projection (Phi-3's `qkv_proj`, GPT-NeoX's per-head
    /// `query_key_value`), split at load so that each part is a matrix of its own. Every index
    /// must be below the stored output size (the caller derives them from the same config as
    /// `shape`).
    pub(crate) fn matrix_outputs(
        &mut self,
        name: &str,
        shape: [usize; 2],
        orientation: Orientation,
        outputs: Option<&[usize]>,
    ) -> Result<Matrix> {
        let [rows, columns] = shape;
        let (d_in, stored_out) = match orientation {
            Orientation::InOut => (rows, columns),
            Orientation::OutIn => (columns, rows),
        };
        let output = move |n: usize| outputs.map_or(n, |outputs| outputs[n]);
        let d_in_out = [d_in, outputs.map_or(stored_out, <[usize]>::len)];
        let index = move |k: usize, n: usize| match orientation {
            Orientation::InOut => k * columns + output(n),
            Orientation::OutIn => output(n) * columns + k,
        };
        if !is_cpu(&self.device) {
            let tensor = self.tensor(name, shape)?;
            let tensor = match orientation {
                Orientation::InOut => tensor,
                Orientation::OutIn => tensor.transpose(),
            };
            let tensor = match outputs {
                None => tensor,
                Some(outputs) => {
                    // Counted as a whole by `tensor`: count only the part kept.
                    let dropped = stored_out.saturating_sub(outputs.len()) * d_in;
                    self.parameters = self.parameters.saturating_sub(dropped);
                    self.weight_bytes = self
                        .weight_bytes
                        .saturating_sub(dropped * std::mem::size_of::<f32>());
                    tensor.select(1, index_tensor(outputs, &self.device))
                }
            };
            return Ok(Matrix::Tensor(Box::new(tensor)));
        }
        self.elements(name, &shape)?;
        let elements = d_in_out[0].saturating_mul(d_in_out[1]);
        let packed = match &self.source {
            WeightSource::Checkpoint(checkpoint) => match checkpoint.stored(name) {
                Ok(stored) if stored.shape == shape => {
                    let packed = pack_stored(&stored, self.dtype, d_in_out, index);
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

/// `indices` as an integer tensor on `device`, for `select` (the output units of one part of
/// a fused projection).
pub(crate) fn index_tensor(indices: &[usize], device: &Device) -> Tensor<1, Int> {
    let values = indices.iter().map(|&n| n as i64).collect::<Vec<_>>();
    Tensor::from_data(TensorData::new(values, [indices.len()]), device)
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

/// Packs the stored tensor as a `[d_in, d_out]` matrix whose element `(k, n)` is stored at flat
/// index `index(k, n)`, in `dtype`.
fn pack_stored(
    stored: &Stored<'_>,
    dtype: WeightDtype,
    [d_in, d_out]: [usize; 2],
    index: impl Fn(usize, usize) -> usize + Sync,
) -> PackedMatrix {
    let bytes = stored.bytes;
    match stored.dtype {
        Dtype::F32 => PackedMatrix::pack(dtype, d_in, d_out, |k, n| f32_at(bytes, index(k, n))),
        Dtype::F16 => PackedMatrix::pack(dtype, d_in, d_out, |k, n| f16_at(bytes, index(k, n))),
        _ => PackedMatrix::pack(dtype, d_in, d_out, |k, n| bf16_at(bytes, index(k, n))),
    }
}

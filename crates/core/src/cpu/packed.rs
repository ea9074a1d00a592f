//! Matrix products with a weight packed once, at load, for the CPU's vector units.
//!
//! A prompt call multiplies many rows by every weight matrix; a decode step multiplies one row
//! per sequence. Both are served here by one register-blocked, cache-tiled product (the BLIS
//! loop nest) whose weight operand was rearranged at load into panels of [`PANEL`] columns,
//! each panel `[in, PANEL]` contiguous and 64-byte aligned. A call therefore never repacks the
//! weight (burn's `gemm` repacks it on every call, a pass over the whole matrix), and a decode
//! step streams each weight element exactly once, in memory order.
//!
//! Panels hold the weights in the load's precision ([`Element`]: f32, bf16 or f16); the kernels
//! widen each panel row to f32 in registers and accumulate in f32, so every precision computes
//! the same sums of the same (stored) weights.
//!
//! The inner kernel keeps an `R x PANEL` tile of outputs in registers (up to [`TILE_ROWS`] rows:
//! 24 AVX-512 accumulators) and adds one rank-1 update per input index: one panel row widened to
//! two vectors, `R` broadcasts of the activations (packed per call into `[in, R]` strips), `2R`
//! fused multiply-adds. Inputs are taken in blocks sized to the L2 ([`depth_block`]) so that a
//! panel's block stays in cache while every row strip passes over it, and rows in blocks of
//! [`ROW_BLOCK`] so that the strips stay in L2 while the panels pass; while the strips pass over
//! one panel block, the kernels bring the task's next one into L2 ([`prefetch::Upcoming`]), so that its
//! first strip does not wait on memory. The outputs are split into several tasks
//! per thread: by columns, and past one row block by rows as well ([`TaskSplit`]). Kernels for
//! AVX-512, AVX2 and NEON are picked at run time, within the cap of `isa`; elsewhere a portable
//! kernel computes the same products. Each family is a module ([`avx512`], [`avx2`], `neon`,
//! [`amx`]); [`prefetch`] holds the requests to the caches they share, [`half_pass`] the pass
//! structure of the AVX2 and NEON kernels.
//!
//! With [`MatmulPrecision::Bf16`] the activations are rounded to bf16 as they are packed into
//! strips. On a CPU with AVX-512 BF16 a bf16 weight's product then runs on `vdpbf16ps`, which
//! takes two inputs per instruction and lane: strips hold bf16 pairs (inputs `2i`, `2i + 1`)
//! and the kernel interleaves two panel rows into the same pairs. On a CPU with AMX, products
//! of [`amx::MIN_ROWS`] rows or more run on its tiles instead (`amx`), 32 x 32 outputs a step,
//! and fewer on the AVX-512 f32 kernel (faster than `vdpbf16ps` on these CPUs). Elsewhere the
//! rounded activations go through the f32 kernels, which compute the same exact products.

use std::ops::Range;
use std::sync::OnceLock;

use multiversion::multiversion;
#[cfg(target_arch = "x86_64")]
use multiversion::target::selected_target;
use rayon::prelude::*;

use super::caches;
use super::isa::{Family, kernel_cap};
use crate::precision::{MatmulPrecision, WeightDtype};

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod half_pass;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod prefetch;
mod strips;

use strips::{Layout, Strip, Strips, TILE_ROWS};

/// Output columns per packed panel: two AVX-512 vectors.
pub(crate) const PANEL: usize = 32;
/// The smallest budget of inputs a depth block may take (and the step budgets are rounded down
/// to): a panel's block (`256 x PANEL` f32 weights, 32 KiB) fits in L1 beside a strip's block.
const MIN_DEPTH_BLOCK: usize = 256;
/// Rows per block: their packed strips (`ROW_BLOCK x depth block` floats) stay in L2.
const ROW_BLOCK: usize = 16 * TILE_ROWS;

/// Tasks per thread a product's panels are split into: a thread slowed by other work on the
/// machine then leaves its remaining tasks to the others (one task per thread was ~12 % slower
/// at 128 tokens on GPT-2 small).
const TASKS_PER_THREAD: usize = 8;

/// How a stored weight type is written into panels and read back.
pub(crate) trait Element: Copy + Send + Sync + std::fmt::Debug + 'static {
    /// The precision this type stores.
    const DTYPE: WeightDtype;
    /// Zero, for the columns past a matrix's last.
    const ZERO: Self;
    /// `value` rounded to this type (to nearest, ties to even).
    fn from_f32(value: f32) -> Self;
    /// The stored value, exactly, as f32.
    fn to_f32(self) -> f32;
    /// Where column `j` of a panel sits in a panel row. bf16 rows interleave the two halves
    /// (column `j < 16` at `2j`, column `16 + j` at `2j + 1`) so that the AVX-512 kernel widens a
    /// row with one shift and one mask.
    fn slot(column: usize) -> usize {
        column
    }
    /// The panel rows of `panels` if they hold this type.
    fn rows_of(panels: &Panels) -> Option<&[PanelRow<Self>]>;
}

impl Element for f32 {
    const DTYPE: WeightDtype = WeightDtype::F32;
    const ZERO: Self = 0.0;
    fn from_f32(value: f32) -> Self {
        value
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn rows_of(panels: &Panels) -> Option<&[PanelRow<Self>]> {
        match panels {
            Panels::F32(rows) => Some(rows),
            _ => None,
        }
    }
}

impl Element for half::bf16 {
    const DTYPE: WeightDtype = WeightDtype::Bf16;
    const ZERO: Self = half::bf16::ZERO;
    fn from_f32(value: f32) -> Self {
        half::bf16::from_f32(value)
    }
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
    fn slot(column: usize) -> usize {
        (column % 16) * 2 + column / 16
    }
    fn rows_of(panels: &Panels) -> Option<&[PanelRow<Self>]> {
        match panels {
            Panels::Bf16(rows) => Some(rows),
            _ => None,
        }
    }
}

impl Element for half::f16 {
    const DTYPE: WeightDtype = WeightDtype::F16;
    const ZERO: Self = half::f16::ZERO;
    fn from_f32(value: f32) -> Self {
        half::f16::from_f32(value)
    }
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn rows_of(panels: &Panels) -> Option<&[PanelRow<Self>]> {
        match panels {
            Panels::F16(rows) => Some(rows),
            _ => None,
        }
    }
}

/// One input index's slice of a panel: `PANEL` weights, aligned for whole-vector loads.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct PanelRow<E>([E; PANEL]);

/// Panel `p`, input `k` at `[p * d_in + k]`; columns past `d_out` hold zeros.
#[derive(Debug)]
pub(super) enum Panels {
    F32(Vec<PanelRow<f32>>),
    Bf16(Vec<PanelRow<half::bf16>>),
    F16(Vec<PanelRow<half::f16>>),
}

/// Runs `$body` with `$rows` bound to the panel rows, whatever their element type.
macro_rules! with_rows {
    ($panels:expr, $rows:ident => $body:expr) => {
        match $panels {
            Panels::F32($rows) => $body,
            Panels::Bf16($rows) => $body,
            Panels::F16($rows) => $body,
        }
    };
}

/// A weight matrix `[in, out]` rearranged into column panels.
#[derive(Debug)]
pub(crate) struct PackedMatrix {
    panels: Panels,
    d_in: usize,
    d_out: usize,
    precision: MatmulPrecision,
}

/// A weight that is not finite once stored: its place in the `[in, out]` matrix and its value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct NonFinite {
    pub(crate) input: usize,
    pub(crate) output: usize,
    pub(crate) value: f32,
}

impl PackedMatrix {
    /// Packs the `[d_in, d_out]` matrix whose element `(k, n)` is `element(k, n)`, stored in
    /// `dtype` (rounded to nearest).
    pub(crate) fn pack(
        dtype: WeightDtype,
        d_in: usize,
        d_out: usize,
        element: impl Fn(usize, usize) -> f32 + Sync,
    ) -> Self {
        let panels = match dtype {
            WeightDtype::F32 => Panels::F32(pack_rows(d_in, d_out, element)),
            WeightDtype::Bf16 => Panels::Bf16(pack_rows(d_in, d_out, element)),
            WeightDtype::F16 => Panels::F16(pack_rows(d_in, d_out, element)),
        };
        PackedMatrix {
            panels,
            d_in,
            d_out,
            precision: MatmulPrecision::F32,
        }
    }

    /// The matrix, multiplying activations rounded to `precision`.
    pub(crate) fn with_precision(mut self, precision: MatmulPrecision) -> Self {
        self.precision = precision;
        self
    }

    /// The precision the weights are stored in.
    pub(crate) fn dtype(&self) -> WeightDtype {
        match self.panels {
            Panels::F32(_) => WeightDtype::F32,
            Panels::Bf16(_) => WeightDtype::Bf16,
            Panels::F16(_) => WeightDtype::F16,
        }
    }

    /// The first stored weight (in panel order) that is infinite or NaN, if any.
    pub(crate) fn first_non_finite(&self) -> Option<NonFinite> {
        with_rows!(&self.panels, rows => first_non_finite(rows, self.d_in, self.d_out))
    }

    /// Columns `ids` of the matrix as rows: `[ids.len(), d_in]`, row-major. An embedding table
    /// packed as a `[size, rows]` matrix is looked up this way.
    ///
    /// # Panics
    /// If an id is not below `d_out` (callers validate token ids first).
    pub(crate) fn columns(&self, ids: &[usize]) -> Vec<f32> {
        with_rows!(&self.panels, rows => columns(rows, self.d_in, self.d_out, ids))
    }

    /// Input width (rows of the weight matrix).
    pub(crate) fn d_in(&self) -> usize {
        self.d_in
    }

    /// Output width (columns of the weight matrix).
    pub(crate) fn d_out(&self) -> usize {
        self.d_out
    }

    /// `x W + b` for `x: [rows, d_in]` row-major; the result is `[rows, d_out]` row-major.
    ///
    /// # Panics
    /// If `x` or `bias` do not have the lengths the sizes imply (a caller bug).
    pub(crate) fn multiply(&self, x: &[f32], rows: usize, bias: Option<&[f32]>) -> Vec<f32> {
        let mut outputs = PackedMatrix::multiply_each(&[(self, bias)], x, rows);
        outputs.pop().unwrap_or_default()
    }

    /// `x W_i + b_i` for each matrix and bias of `maps`, matrices that read the same inputs
    /// (a layer's query, key and value maps; a gated MLP's gate and up maps): the results of
    /// [`PackedMatrix::multiply`] on each, computed as one product over all their panels, so
    /// the activations are packed once and one parallel loop covers every output. Split into
    /// three products, a Llama-shaped layer's 768 x 256 key and value maps ran at 155 GFLOP/s
    /// (AVX2, two threads, 128 rows, weights not in cache) against 198 for the 768 x 1280 of all three.
    ///
    /// # Panics
    /// If `x` or a bias do not have the lengths the sizes imply (a caller bug).
    pub(crate) fn multiply_each(
        maps: &[(&PackedMatrix, Option<&[f32]>)],
        x: &[f32],
        rows: usize,
    ) -> Vec<Vec<f32>> {
        let Some(&(first, _)) = maps.first() else {
            return Vec::new();
        };
        let x_rows = Activations {
            values: x,
            rows,
            inputs: 0..first.d_in,
        };
        let shared = maps
            .iter()
            .all(|(map, _)| (map.d_in, map.precision) == (first.d_in, first.precision));
        let together = match (shared, &first.panels) {
            (false, _) => None,
            (true, Panels::F32(_)) => {
                Part::<f32>::all(maps).map(|p| first.multiply_parts(&p, x_rows))
            }
            (true, Panels::Bf16(_)) => {
                Part::<half::bf16>::all(maps).map(|p| first.multiply_parts(&p, x_rows))
            }
            (true, Panels::F16(_)) => {
                Part::<half::f16>::all(maps).map(|p| first.multiply_parts(&p, x_rows))
            }
        };
        // Matrices of different depths or precisions: one product each.
        together.unwrap_or_else(|| {
            maps.iter()
                .map(|&(map, bias)| map.multiply(x, rows, bias))
                .collect()
        })
    }

    /// `x W[inputs, :]` for `x: [rows, inputs.len()]` row-major: the product of the matrix's
    /// rows `inputs` alone (one attention head's slice of an output projection), without a
    /// bias; `[rows, d_out]` row-major.
    ///
    /// # Panics
    /// If `inputs` is not inside `0..d_in` or `x` does not have the length the sizes imply (a
    /// caller bug).
    pub(crate) fn multiply_inputs(&self, x: &[f32], rows: usize, inputs: Range<usize>) -> Vec<f32> {
        assert!(inputs.end <= self.d_in, "input range");
        let x = Activations {
            values: x,
            rows,
            inputs,
        };
        let mut outputs = with_rows!(&self.panels, rows => {
            let part = Part {
                rows,
                d_out: self.d_out,
                bias: None,
            };
            self.multiply_parts(&[part], x)
        });
        outputs.pop().unwrap_or_default()
    }

    /// The products of `x` with each of `parts` (matrices of this one's depth and precision),
    /// over all their panels at once.
    fn multiply_parts<E: Element>(
        &self,
        parts: &[Part<'_, E>],
        x: Activations<'_>,
    ) -> Vec<Vec<f32>> {
        let Activations {
            values: x,
            rows,
            inputs,
        } = x;
        let d_in = inputs.len();
        assert_eq!(x.len(), rows * d_in, "activation length");
        for part in parts {
            if let Some(bias) = part.bias {
                assert_eq!(bias.len(), part.d_out, "bias length");
            }
        }
        // Each part's panels, numbered among all of them.
        let own_panels: Vec<Range<usize>> = parts
            .iter()
            .scan(0, |end, part| {
                let start = *end;
                *end += part.d_out.div_ceil(PANEL);
                Some(start..*end)
            })
            .collect();
        let panels = own_panels.last().map_or(0, |own| own.end);
        if rows == 0 || panels == 0 {
            return parts
                .iter()
                .map(|part| vec![0.0; rows * part.d_out])
                .collect();
        }
        // Left unwritten here: the first input block of every tile writes all its outputs.
        let mut outputs: Vec<Vec<f32>> = parts
            .iter()
            .map(|part| Vec::with_capacity(rows * part.d_out))
            .collect();
        let pointers: Vec<OutputPtr> = outputs
            .iter_mut()
            .map(|y| OutputPtr(y.as_mut_ptr()))
            .collect();
        let kernel = Kernel::detect(self.precision, E::DTYPE, rows);
        let strips = Strips::pack(kernel.layout(), self.precision, x, rows, d_in);
        let split = TaskSplit::new(
            rows,
            panels,
            rayon::current_num_threads(),
            kernel.strip_rows(),
        );
        (0..split.tasks()).into_par_iter().for_each(|task| {
            let (my_rows, mine) = split.task(task);
            for ((part, &output), own) in parts.iter().zip(&pointers).zip(&own_panels) {
                let overlap = mine.start.max(own.start)..mine.end.min(own.end);
                if overlap.is_empty() {
                    continue;
                }
                let product = Product {
                    rows: part.rows,
                    panel_depth: self.d_in,
                    first_input: inputs.start,
                    d_in,
                    d_out: part.d_out,
                    strips: &strips,
                    x_rows: rows,
                    bias: part.bias,
                    output,
                    kernel,
                };
                product.panels(
                    my_rows.clone(),
                    overlap.start - own.start..overlap.end - own.start,
                );
            }
        });
        for (y, part) in outputs.iter_mut().zip(parts) {
            // SAFETY: the tasks together wrote every element (each tile's first input block
            // stores its sums plus bias, or zero, to all of its outputs).
            unsafe { y.set_len(rows * part.d_out) };
        }
        outputs
    }
}

/// One matrix of a product over several that read the same activations, with its bias.
struct Part<'a, E> {
    rows: &'a [PanelRow<E>],
    d_out: usize,
    bias: Option<&'a [f32]>,
}

impl<'a, E: Element> Part<'a, E> {
    /// The parts of `maps`, if every matrix holds `E`s.
    fn all(maps: &[(&'a PackedMatrix, Option<&'a [f32]>)]) -> Option<Vec<Self>> {
        maps.iter()
            .map(|&(map, bias)| {
                Some(Part {
                    rows: E::rows_of(&map.panels)?,
                    d_out: map.d_out,
                    bias,
                })
            })
            .collect()
    }
}

/// How a product's outputs are split into about [`TASKS_PER_THREAD`] tasks a thread: a grid of
/// `row_groups x panel_groups` rectangles, each task's rows whole strips (of the kernel's
/// [`Kernel::strip_rows`]) but the last.
///
/// Each task reads all its rows' activation strips, and all its panels once per row block.
/// Columns alone are split while the rows fit one [`ROW_BLOCK`]; past it the rows are split as
/// well, so that each task keeps at least [`MIN_TASK_PANELS`] panels. Split by columns alone, a
/// 768-column matrix gave 16 tasks one or two panels each, and each task read the whole
/// activations (512 rows of 3072 inputs: 6 MiB, past L2) for them: 5 % slower on AVX2.
struct TaskSplit {
    rows: usize,
    panels: usize,
    strip_rows: usize,
    row_groups: usize,
    panel_groups: usize,
}

/// Fewest panels a task takes when the rows are split too.
const MIN_TASK_PANELS: usize = 8;

impl TaskSplit {
    /// The split of `rows x panels` outputs for `threads` threads, rows in strips of
    /// `strip_rows`.
    fn new(rows: usize, panels: usize, threads: usize, strip_rows: usize) -> Self {
        let target = (TASKS_PER_THREAD * threads).max(1);
        let strips = rows.div_ceil(strip_rows);
        let row_groups = if rows <= ROW_BLOCK {
            1
        } else {
            let panel_groups = (panels / MIN_TASK_PANELS).max(1);
            target.div_ceil(panel_groups).clamp(1, strips)
        };
        let panel_groups = target.div_ceil(row_groups).clamp(1, panels.max(1));
        TaskSplit {
            rows,
            panels,
            strip_rows,
            row_groups,
            panel_groups,
        }
    }

    /// How many tasks there are.
    fn tasks(&self) -> usize {
        self.row_groups * self.panel_groups
    }

    /// Task `task`'s rows (whole strips but the last) and panels.
    fn task(&self, task: usize) -> (Range<usize>, Range<usize>) {
        let (row_group, panel_group) = (task / self.panel_groups, task % self.panel_groups);
        let strips = self.rows.div_ceil(self.strip_rows);
        let strip_range = |group: usize| group * strips / self.row_groups * self.strip_rows;
        let rows = strip_range(row_group)..strip_range(row_group + 1).min(self.rows);
        let panels = panel_group * self.panels / self.panel_groups
            ..(panel_group + 1) * self.panels / self.panel_groups;
        (rows, panels)
    }
}

/// The inputs per block of a product of `rows` activation rows over `d_in` inputs: the fewest
/// equal blocks of at most [`max_depth_block`] (even, so that bf16 pairs never straddle two),
/// or the whole depth when the rows fit one strip (nothing is reused across strips then, so
/// each panel streams whole).
///
/// Each further block reads and writes every output again: the 768-input vocabulary map of a
/// 1024-row call (131 MB of outputs) ran at 170 GFLOP/s in three blocks of 256 and 205 in one
/// (AVX2, two threads, 2 MiB L2).
fn depth_block(d_in: usize, rows: usize) -> usize {
    if rows <= TILE_ROWS {
        return d_in.max(1);
    }
    let blocks = d_in.div_ceil(max_depth_block()).max(1);
    d_in.div_ceil(blocks).next_multiple_of(2).max(2)
}

/// The most inputs a depth block takes on this CPU ([`depth_budget`] of its L2).
fn max_depth_block() -> usize {
    static MOST: OnceLock<usize> = OnceLock::new();
    *MOST.get_or_init(|| depth_budget(caches::l2_bytes()))
}

/// Most inputs a depth block takes, whatever the L2: the largest measured.
const MAX_DEPTH_BLOCK: usize = 1024;

/// The most inputs a depth block takes with an L2 of `l2` bytes: a row block's strips for one
/// depth block and two panels' blocks (the one the kernels read and the next one, which they
/// bring in) fill at most half of it, in steps of [`MIN_DEPTH_BLOCK`] up to [`MAX_DEPTH_BLOCK`]
/// (1024 inputs for 2 MiB, 512 for 1 MiB, 256 for Zen 2's 512 KiB); [`MIN_DEPTH_BLOCK`] where
/// the L2's size is not known.
fn depth_budget(l2: Option<usize>) -> usize {
    let bytes_per_input = (ROW_BLOCK + 2 * PANEL) * std::mem::size_of::<f32>();
    let inputs = l2.map_or(0, |l2| l2 / 2 / bytes_per_input);
    (inputs / MIN_DEPTH_BLOCK * MIN_DEPTH_BLOCK).clamp(MIN_DEPTH_BLOCK, MAX_DEPTH_BLOCK)
}

/// The panel rows of a `[d_in, d_out]` matrix, packed in parallel, one panel per task.
fn pack_rows<E: Element>(
    d_in: usize,
    d_out: usize,
    element: impl Fn(usize, usize) -> f32 + Sync,
) -> Vec<PanelRow<E>> {
    let panels = d_out.div_ceil(PANEL);
    let mut rows = vec![PanelRow([E::ZERO; PANEL]); panels * d_in];
    if d_in > 0 {
        rows.par_chunks_mut(d_in)
            .enumerate()
            .for_each(|(panel, panel_rows)| {
                let columns = panel * PANEL..d_out.min((panel + 1) * PANEL);
                // Row by row: each panel row is written whole, and the source is read either
                // contiguously (`[in, out]`) or in one sequential stream per column (`[out, in]`).
                for (k, row) in panel_rows.iter_mut().enumerate() {
                    for (j, n) in columns.clone().enumerate() {
                        row.0[E::slot(j)] = E::from_f32(element(k, n));
                    }
                }
            });
    }
    rows
}

fn first_non_finite<E: Element>(
    rows: &[PanelRow<E>],
    d_in: usize,
    d_out: usize,
) -> Option<NonFinite> {
    if d_in == 0 {
        return None;
    }
    rows.chunks(d_in)
        .enumerate()
        .find_map(|(panel, panel_rows)| {
            let columns = PANEL.min(d_out - panel * PANEL);
            panel_rows.iter().enumerate().find_map(|(k, row)| {
                (0..columns).find_map(|j| {
                    let value = row.0[E::slot(j)].to_f32();
                    (!value.is_finite()).then_some(NonFinite {
                        input: k,
                        output: panel * PANEL + j,
                        value,
                    })
                })
            })
        })
}

fn columns<E: Element>(rows: &[PanelRow<E>], d_in: usize, d_out: usize, ids: &[usize]) -> Vec<f32> {
    let mut values = Vec::with_capacity(ids.len() * d_in);
    for &id in ids {
        assert!(id < d_out, "column {id} of {d_out}");
        let panel = &rows[id / PANEL * d_in..][..d_in];
        let slot = E::slot(id % PANEL);
        values.extend(panel.iter().map(|row| row.0[slot].to_f32()));
    }
    values
}

/// A product's activations: `rows` rows of `inputs.len()` values, row-major, multiplied by the
/// matrix's input rows `inputs`.
struct Activations<'a> {
    values: &'a [f32],
    rows: usize,
    inputs: Range<usize>,
}

/// The output buffer, shared by tasks that write disjoint columns of it.
#[derive(Clone, Copy)]
struct OutputPtr(*mut f32);

// SAFETY: tasks write disjoint column ranges of the buffer, which outlives the parallel loop.
unsafe impl Send for OutputPtr {}
unsafe impl Sync for OutputPtr {}

/// One call's operands, seen by the task that computes a range of panels.
struct Product<'a, E> {
    /// The weight's panel rows.
    rows: &'a [PanelRow<E>],
    /// Rows of one panel (the matrix's inputs).
    panel_depth: usize,
    /// The matrix's first input row the product reads (0 unless it reads a range of them).
    first_input: usize,
    /// Inputs the product reads, from `first_input`.
    d_in: usize,
    d_out: usize,
    strips: &'a Strips,
    /// Activation rows.
    x_rows: usize,
    bias: Option<&'a [f32]>,
    output: OutputPtr,
    kernel: Kernel,
}

impl<'a, E: Element> Product<'a, E> {
    /// The panel rows of `panel`'s depth block from `depth_start`.
    fn block(&self, panel: usize, depth_start: usize, depth_block: usize) -> &'a [PanelRow<E>] {
        let depth = depth_block.min(self.d_in - depth_start);
        &self.rows[panel * self.panel_depth + self.first_input + depth_start..][..depth]
    }

    /// The block a task computing `panels` reads after `panel`'s block of inputs `depths`
    /// (from a depth block's start, one depth block long): the next panel's; past the last, the
    /// first panel's again for the task's next row block (if `rows_follow`), else for the next
    /// depth block; none after the last.
    fn next_block(
        &self,
        panel: usize,
        panels: &Range<usize>,
        rows_follow: bool,
        depths: Range<usize>,
    ) -> &'a [PanelRow<E>] {
        let (depth_start, depth_block) = (depths.start, depths.len());
        match (panel + 1 < panels.end, rows_follow) {
            (true, _) => self.block(panel + 1, depth_start, depth_block),
            (false, true) => self.block(panels.start, depth_start, depth_block),
            (false, false) if depth_start + depth_block < self.d_in => {
                self.block(panels.start, depth_start + depth_block, depth_block)
            }
            (false, false) => &[],
        }
    }

    /// Computes the outputs of rows `row_range` (starting on a strip) in the columns of
    /// `panels`.
    fn panels(&self, row_range: Range<usize>, panels: Range<usize>) {
        #[cfg(target_arch = "x86_64")]
        if let Strips::Bf16Rows(activations) = self.strips {
            // SAFETY: `Kernel::detect` picks the AMX kernel, the one that reads `Bf16Rows`, for
            // bf16 weights where `amx::available`.
            return unsafe { amx::panels(self, activations, row_range, panels) };
        }
        let (d_in, d_out, rows) = (self.d_in, self.d_out, self.x_rows);
        let depth_block = depth_block(d_in, rows);
        let per_unit = self.strips.inputs_per_unit();
        let units_per_row = d_in.div_ceil(per_unit);
        for depth_start in (0..d_in.max(1)).step_by(depth_block) {
            let depth = depth_block.min(d_in - depth_start);
            // `depth_block` is even: a block starts on a whole unit.
            let (first_unit, units) = (depth_start / per_unit, depth.div_ceil(per_unit));
            for row_start in row_range.clone().step_by(ROW_BLOCK) {
                let row_end = (row_start + ROW_BLOCK).min(row_range.end);
                for panel in panels.clone() {
                    let first_column = panel * PANEL;
                    let columns = PANEL.min(d_out - first_column);
                    let weights = self.block(panel, depth_start, depth_block);
                    let bias = self
                        .bias
                        .map(|bias| &bias[first_column..first_column + columns]);
                    // The block the task reads next, a share of it for each strip's tile.
                    let next = self.next_block(
                        panel,
                        &panels,
                        row_end < row_range.end,
                        depth_start..depth_start + depth_block,
                    );
                    let strips = (row_end - row_start).div_ceil(TILE_ROWS);
                    let mut shares = next.chunks(next.len().div_ceil(strips).max(1));
                    for strip_start in (row_start..row_end).step_by(TILE_ROWS) {
                        let height = TILE_ROWS.min(rows - strip_start);
                        let strip = self.strips.strip(
                            strip_start * units_per_row + first_unit * height,
                            units * height,
                        );
                        let tile = Tile {
                            strip,
                            weights,
                            // SAFETY: the tile's rows and columns lie inside the `rows x d_out`
                            // output; `columns` bounds every access within a row.
                            output: unsafe {
                                self.output.0.add(strip_start * d_out + first_column)
                            },
                            stride: d_out,
                            columns,
                            upcoming: shares.next().unwrap_or(&[]),
                            start: match depth_start {
                                0 => Start::Bias(bias),
                                _ => Start::Accumulate,
                            },
                        };
                        self.kernel.run(height, &tile);
                    }
                }
            }
        }
    }
}

/// What a tile's sums are added to.
#[derive(Clone, Copy)]
enum Start<'a> {
    /// The first input block: the bias, or zero.
    Bias(Option<&'a [f32]>),
    /// A later input block: the partial sums already in the output.
    Accumulate,
}

/// One kernel call: `height x columns` outputs over one block of inputs.
struct Tile<'a, E> {
    /// `[units, height]` activations.
    strip: Strip<'a>,
    /// `[depth]` panel rows.
    weights: &'a [PanelRow<E>],
    /// The tile's first output; rows `stride` apart.
    output: *mut f32,
    stride: usize,
    columns: usize,
    /// Panel rows the kernel asks L2 to fetch for a later tile.
    upcoming: &'a [PanelRow<E>],
    start: Start<'a>,
}

/// The kernels this CPU runs, chosen once per call.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kernel {
    /// bf16 activations times bf16 weights on AMX tiles (`amx`).
    #[cfg(target_arch = "x86_64")]
    Amx,
    /// bf16 pairs times bf16 weights on `vdpbf16ps`.
    #[cfg(target_arch = "x86_64")]
    Avx512Bf16,
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// f32 strips on AVX2 with FMA (and F16C, to widen f16 weights): rows in groups of three.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// f32 strips on aarch64's NEON (every aarch64 CPU): the AVX2 kernel's structure.
    #[cfg(target_arch = "aarch64")]
    Neon,
    Portable,
}

impl Kernel {
    /// The fastest kernel for `rows` activation rows in `precision` and weights stored in
    /// `dtype`, within the family [`KERNELS_VARIABLE`](super::isa::KERNELS_VARIABLE) allows.
    fn detect(precision: MatmulPrecision, dtype: WeightDtype, rows: usize) -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let cap = kernel_cap().clone().unwrap_or(Family::Amx);
            let bf16_products = (precision, dtype) == (MatmulPrecision::Bf16, WeightDtype::Bf16);
            // On Intel's CPUs with AMX the pair kernel is slower than the f32 one on rounded
            // activations: a Llama-shaped 10-token call 19.6-20.3 ms against 18.5-19.0, 32
            // decode steps 377-389 against 368-371.
            if bf16_products && cap >= Family::Amx && amx::available() {
                return if rows >= amx::MIN_ROWS {
                    Kernel::Amx
                } else {
                    Kernel::Avx512
                };
            }
            if bf16_products
                && cap >= Family::Avx512
                && has!("avx512f")
                && has!("avx512bw")
                && has!("avx512bf16")
            {
                return Kernel::Avx512Bf16;
            }
            if cap >= Family::Avx512 && has!("avx512f") {
                return Kernel::Avx512;
            }
            if cap >= Family::Avx2 && has!("avx2") && has!("fma") && has!("f16c") {
                return Kernel::Avx2;
            }
        }
        // Only x86's bf16 kernels depend on the operands' precisions and the rows.
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (precision, dtype, rows);
        #[cfg(target_arch = "aarch64")]
        if kernel_cap().clone().unwrap_or(Family::Amx) >= Family::Neon {
            return Kernel::Neon;
        }
        Kernel::Portable
    }

    /// The instruction-set family of the kernel, as reports name it.
    fn family(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Amx => "amx",
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Bf16 => "avx512-bf16",
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => "avx512",
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => "avx2",
            #[cfg(target_arch = "aarch64")]
            Kernel::Neon => "neon",
            Kernel::Portable => "portable",
        }
    }

    /// How the kernel reads the activations.
    fn layout(self) -> Layout {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Amx => Layout::Bf16Rows,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Bf16 => Layout::Bf16Pairs,
            _ => Layout::F32,
        }
    }

    /// The rows the kernel computes together: a task's rows are whole strips of them.
    fn strip_rows(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Amx => strips::STEP_ROWS,
            _ => TILE_ROWS,
        }
    }

    /// Runs the kernel for a tile of `height` rows (1 to `TILE_ROWS`).
    fn run<E: Element>(self, height: usize, tile: &Tile<'_, E>) {
        macro_rules! by_height {
            ($($kernel:ident)::+, $strip:expr) => {
                match height {
                    1 => $($kernel)::+::<1, E>(tile, $strip),
                    2 => $($kernel)::+::<2, E>(tile, $strip),
                    3 => $($kernel)::+::<3, E>(tile, $strip),
                    4 => $($kernel)::+::<4, E>(tile, $strip),
                    5 => $($kernel)::+::<5, E>(tile, $strip),
                    6 => $($kernel)::+::<6, E>(tile, $strip),
                    7 => $($kernel)::+::<7, E>(tile, $strip),
                    8 => $($kernel)::+::<8, E>(tile, $strip),
                    9 => $($kernel)::+::<9, E>(tile, $strip),
                    10 => $($kernel)::+::<10, E>(tile, $strip),
                    11 => $($kernel)::+::<11, E>(tile, $strip),
                    _ => $($kernel)::+::<TILE_ROWS, E>(tile, $strip),
                }
            };
        }
        match (self, tile.strip) {
            // SAFETY: `detect` found AVX-512F, BW and BF16 on this CPU, and picks this kernel
            // for bf16 weights only.
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx512Bf16, Strip::Bf16Pairs(pairs)) => unsafe {
                by_height!(avx512::tile_avx512_bf16, pairs)
            },
            // SAFETY: `detect` found AVX-512F on this CPU.
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx512, Strip::F32(x)) => unsafe { by_height!(avx512::tile_avx512, x) },
            // SAFETY: `detect` found AVX2, FMA and F16C on this CPU.
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx2, Strip::F32(x)) => unsafe { avx2::tile_avx2(tile, x, height) },
            // SAFETY: NEON is part of every aarch64 CPU; the strip and output are the tile's.
            #[cfg(target_arch = "aarch64")]
            (Kernel::Neon, Strip::F32(x)) => unsafe { neon::tile_neon(tile, x, height) },
            (Kernel::Portable, Strip::F32(x)) => by_height!(tile_portable, x),
            // Only x86 has strips other than f32.
            #[cfg(target_arch = "x86_64")]
            (kernel, _) => unreachable!("`Strips::pack` packs what {kernel:?} reads"),
        }
    }
}

/// The kernel families that run products of weights stored in `dtype` with activations in
/// `precision` on this CPU: `amx`, `avx512-bf16`, `avx512`, `avx2`, `neon` or `portable`, or
/// one for prompt calls and one for fewer rows, as `amx from 16 rows, avx512` (what
/// benchmark reports name).
pub fn product_kernels(precision: MatmulPrecision, dtype: WeightDtype) -> String {
    let fewest = Kernel::detect(precision, dtype, 1);
    #[cfg(target_arch = "x86_64")]
    if let Kernel::Amx = Kernel::detect(precision, dtype, amx::MIN_ROWS) {
        return format!("amx from {} rows, {}", amx::MIN_ROWS, fewest.family());
    }
    fewest.family().to_string()
}

/// The portable kernel: the same sums, vectorised by the compiler (fused multiply-add where
/// the target has it).
#[multiversion(targets("x86_64+avx2+fma"))]
fn tile_portable<const R: usize, E: Element>(tile: &Tile<'_, E>, strip: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    const FUSED: bool = selected_target!().supports_feature_str("fma");
    // Every aarch64 CPU fuses multiply-adds (NEON's `fmla`).
    #[cfg(not(target_arch = "x86_64"))]
    const FUSED: bool = cfg!(target_arch = "aarch64");
    let mut sums = [[0.0f32; PANEL]; R];
    let mut weights = [0.0f32; PANEL];
    for (row, x) in tile.weights.iter().zip(strip.chunks_exact(R)) {
        for (j, w) in weights.iter_mut().enumerate() {
            *w = row.0[E::slot(j)].to_f32();
        }
        for (sum, x) in sums.iter_mut().zip(x) {
            for (s, w) in sum.iter_mut().zip(&weights) {
                *s = if FUSED { x.mul_add(*w, *s) } else { x * w + *s };
            }
        }
    }
    for (r, sum) in sums.iter().enumerate() {
        // SAFETY: row `r` of the tile has `columns` writable floats (the caller's contract),
        // written before they are read: by the first input block, then accumulated into.
        unsafe {
            store_scalar(
                tile.output.add(r * tile.stride),
                &sum[..tile.columns],
                tile.start,
            )
        }
    }
}

/// Adds `sums` to their start (the bias for these columns, zero or the partial sums at `out`)
/// and stores them at `out`, one float at a time.
///
/// # Safety
/// `out` must address `sums.len()` writable floats, and a bias must hold at least as many.
unsafe fn store_scalar(out: *mut f32, sums: &[f32], start: Start<'_>) {
    for (j, s) in sums.iter().enumerate() {
        // SAFETY: `j < sums.len()`, inside the caller's floats.
        unsafe {
            match start {
                Start::Bias(bias) => out.add(j).write(s + bias.map_or(0.0, |bias| bias[j])),
                Start::Accumulate => *out.add(j) += s,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(len: usize, salt: u64) -> Vec<f32> {
        let mut rng = fastrand::Rng::with_seed(salt);
        (0..len).map(|_| rng.f32() * 2.0 - 1.0).collect()
    }

    /// `x W + b` in f64, one output at a time.
    fn reference(x: &[f32], w: &[f32], bias: Option<&[f32]>, sizes: [usize; 3]) -> Vec<f32> {
        let [rows, d_in, d_out] = sizes;
        let mut y = Vec::with_capacity(rows * d_out);
        for r in 0..rows {
            for n in 0..d_out {
                let mut sum = bias.map_or(0.0, |b| b[n] as f64);
                for k in 0..d_in {
                    sum += x[r * d_in + k] as f64 * w[k * d_out + n] as f64;
                }
                y.push(sum as f32);
            }
        }
        y
    }

    fn assert_close(fast: &[f32], exact: &[f32], what: &str) {
        assert_eq!(fast.len(), exact.len(), "{what}: length");
        for (i, (a, b)) in fast.iter().zip(exact).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                "{what}: element {i}: {a} vs {b}"
            );
        }
    }

    /// `(rows, d_in, d_out)`: one row and several tiles, partial panels, odd input counts (a
    /// lone last input for the pair kernel), several input and row blocks, no inputs.
    fn odd_shapes() -> [(usize, usize, usize); 6] {
        [
            (1, 1, 1),
            (1, 37, 141),
            (5, 300, 33),
            (TILE_ROWS + 1, 71, 64),
            (ROW_BLOCK + 7, max_depth_block() + 3, 97),
            (3, 0, 5),
        ]
    }

    /// Every tile height, partial panels, several input and row blocks, both storage
    /// orientations, with and without bias, every storage precision (against the reference on
    /// the rounded weights), on both kernels.
    #[test]
    fn products_match_a_plain_reference_on_odd_sizes() {
        let dtypes = [WeightDtype::F32, WeightDtype::Bf16, WeightDtype::F16];
        for ((rows, d_in, d_out), dtype) in odd_shapes()
            .into_iter()
            .flat_map(|s| dtypes.map(|d| (s, d)))
        {
            let x = matrix(rows * d_in, 1);
            let w = matrix(d_in * d_out, 2);
            let rounded: Vec<f32> = w.iter().map(|&v| dtype.round(v)).collect();
            let bias = matrix(d_out, 3);
            let transposed: Vec<f32> = (0..d_out * d_in)
                .map(|i| w[(i % d_in) * d_out + i / d_in])
                .collect();
            let packings = [
                PackedMatrix::pack(dtype, d_in, d_out, |k, n| w[k * d_out + n]),
                PackedMatrix::pack(dtype, d_in, d_out, |k, n| transposed[n * d_in + k]),
            ];
            for packed in &packings {
                assert_eq!(packed.dtype(), dtype);
                assert_eq!(packed.first_non_finite(), None);
                for bias in [None, Some(&bias[..])] {
                    let exact = reference(&x, &rounded, bias, [rows, d_in, d_out]);
                    let what = format!("{rows}x{d_in}x{d_out} {dtype}, bias {}", bias.is_some());
                    assert_close(&packed.multiply(&x, rows, bias), &exact, &what);
                    for kernel in f32_kernels_here() {
                        let y = multiply_with(packed, &x, rows, bias, kernel);
                        assert_close(&y, &exact, &format!("{what}, {kernel:?}"));
                    }
                }
            }
        }
    }

    /// With bf16 products, every kernel this CPU has computes the products of the bf16-rounded
    /// activations and weights, on the same odd sizes (odd input counts leave a lone last
    /// input for the pair kernel, in the last input block of several; AMX tiles get partial
    /// row tiles, row blocks and depth blocks).
    #[test]
    fn bf16_products_match_a_reference_on_rounded_activations() {
        let bf16 = |v: f32| half::bf16::from_f32(v).to_f32();
        let kernels = bf16_kernels_here().chain(f32_kernels_here());
        for (rows, d_in, d_out) in odd_shapes() {
            let x = matrix(rows * d_in, 5);
            let w = matrix(d_in * d_out, 6);
            let bias = matrix(d_out, 7);
            let packed =
                PackedMatrix::pack(WeightDtype::Bf16, d_in, d_out, |k, n| w[k * d_out + n])
                    .with_precision(MatmulPrecision::Bf16);
            let x_rounded: Vec<f32> = x.iter().map(|&v| bf16(v)).collect();
            let w_rounded: Vec<f32> = w.iter().map(|&v| bf16(v)).collect();
            let exact = reference(&x_rounded, &w_rounded, Some(&bias), [rows, d_in, d_out]);
            let what = format!("{rows}x{d_in}x{d_out} bf16 products");
            assert_close(&packed.multiply(&x, rows, Some(&bias)), &exact, &what);
            for kernel in kernels.clone() {
                let y = multiply_with(&packed, &x, rows, Some(&bias), kernel);
                assert_close(&y, &exact, &format!("{what}, {kernel:?}"));
            }
        }
    }

    /// Columns read back exactly as stored, in every precision, and a weight that does not fit
    /// the precision is found with its place.
    #[test]
    fn columns_read_back_and_non_finite_weights_are_located() {
        let (d_in, d_out) = (3, 70);
        let w = matrix(d_in * d_out, 4);
        for dtype in [WeightDtype::F32, WeightDtype::Bf16, WeightDtype::F16] {
            let packed = PackedMatrix::pack(dtype, d_in, d_out, |k, n| w[k * d_out + n]);
            let ids = [0, 15, 16, 31, 33, 69];
            let expected: Vec<f32> = ids
                .iter()
                .flat_map(|&n| {
                    let w = &w;
                    (0..d_in).map(move |k| dtype.round(w[k * d_out + n]))
                })
                .collect();
            assert_eq!(packed.columns(&ids), expected, "{dtype}");
        }
        let huge = PackedMatrix::pack(WeightDtype::F16, d_in, d_out, |k, n| {
            if (k, n) == (2, 45) { 1e6 } else { 0.5 }
        });
        assert_eq!(
            huge.first_non_finite(),
            Some(NonFinite {
                input: 2,
                output: 45,
                value: f32::INFINITY
            })
        );
    }

    /// The product of a range of the matrix's inputs alone (one head's rows of an output
    /// projection) is the plain product of those rows: ranges at the start, inside and at the
    /// end, over several input blocks and tiles, every storage precision, and bf16 products.
    #[test]
    fn products_over_an_input_range_match_the_reference_on_those_rows() {
        let (d_in, d_out) = (max_depth_block() + 9, 45);
        let ranges = [0..7, 100..max_depth_block() + 5, 3..d_in, d_in - 1..d_in];
        for (rows, dtype) in [1, 2, TILE_ROWS + 5]
            .into_iter()
            .flat_map(|r| [WeightDtype::F32, WeightDtype::Bf16, WeightDtype::F16].map(|d| (r, d)))
        {
            let w = matrix(d_in * d_out, 4);
            let packed = PackedMatrix::pack(dtype, d_in, d_out, |k, n| w[k * d_out + n]);
            // bf16 weights with bf16 products too (the AMX tiles from 16 rows, where present).
            let bf16_products = (dtype == WeightDtype::Bf16).then(|| {
                PackedMatrix::pack(dtype, d_in, d_out, |k, n| w[k * d_out + n])
                    .with_precision(MatmulPrecision::Bf16)
            });
            for inputs in ranges.clone() {
                let x = matrix(rows * inputs.len(), 5);
                let slice: Vec<f32> = w[inputs.start * d_out..inputs.end * d_out]
                    .iter()
                    .map(|&v| dtype.round(v))
                    .collect();
                let exact = reference(&x, &slice, None, [rows, inputs.len(), d_out]);
                let what = format!("{rows} rows, inputs {inputs:?}, {dtype}");
                assert_close(
                    &packed.multiply_inputs(&x, rows, inputs.clone()),
                    &exact,
                    &what,
                );
                if let Some(packed) = &bf16_products {
                    let x_rounded: Vec<f32> = x.iter().map(|&v| dtype.round(v)).collect();
                    let exact = reference(&x_rounded, &slice, None, [rows, inputs.len(), d_out]);
                    let y = packed.multiply_inputs(&x, rows, inputs);
                    assert_close(&y, &exact, &format!("{what}, bf16 products"));
                }
            }
        }
    }

    /// Several matrices of the same inputs multiplied as one product give each matrix's own
    /// product: partial panels at each part's end (so tasks cross parts mid-matrix), an empty
    /// part, biases on some parts, several input and row blocks, every storage precision, on
    /// pools of one and five threads; matrices of mixed precisions take one product each.
    #[test]
    fn products_of_several_maps_match_each_map_alone() {
        let d_in = max_depth_block() + 3;
        let widths = [45, 32, 0, 7, 100];
        let dtypes = [WeightDtype::F32, WeightDtype::Bf16, WeightDtype::F16];
        let mixed = [
            WeightDtype::F32,
            WeightDtype::Bf16,
            WeightDtype::F16,
            WeightDtype::F32,
            WeightDtype::Bf16,
        ];
        let plans = dtypes.map(|dtype| [dtype; 5]).into_iter().chain([mixed]);
        for ((plan, rows), threads) in plans
            .flat_map(|plan| [1, TILE_ROWS + 5, ROW_BLOCK + 7].map(|rows| (plan, rows)))
            .flat_map(|case| [1, 5].map(|threads| (case, threads)))
        {
            let x = matrix(rows * d_in, 8);
            let weights: Vec<Vec<f32>> = (0..widths.len())
                .map(|part| matrix(d_in * widths[part], 9 + part as u64))
                .collect();
            let biases: Vec<Option<Vec<f32>>> = (0..widths.len())
                .map(|part| (part % 2 == 0).then(|| matrix(widths[part], 20 + part as u64)))
                .collect();
            let packed: Vec<PackedMatrix> = (0..widths.len())
                .map(|part| {
                    let (w, d_out) = (&weights[part], widths[part]);
                    PackedMatrix::pack(plan[part], d_in, d_out, |k, n| w[k * d_out + n])
                })
                .collect();
            let maps: Vec<_> = packed
                .iter()
                .zip(&biases)
                .map(|(packed, bias)| (packed, bias.as_deref()))
                .collect();
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let outputs = pool.install(|| PackedMatrix::multiply_each(&maps, &x, rows));
            assert_eq!(outputs.len(), widths.len());
            for (part, y) in outputs.iter().enumerate() {
                let rounded: Vec<f32> =
                    weights[part].iter().map(|&v| plan[part].round(v)).collect();
                let sizes = [rows, d_in, widths[part]];
                let exact = reference(&x, &rounded, biases[part].as_deref(), sizes);
                let what = format!("{plan:?}, {rows} rows, {threads} threads, part {part}");
                assert_close(y, &exact, &what);
            }
        }
    }

    /// The tasks of a split cover every output (row, panel) exactly once, start row groups on
    /// whole strips, and keep at least `MIN_TASK_PANELS` panels a task when rows are split.
    #[test]
    fn depth_blocks_split_the_inputs_evenly_within_the_l2_budget() {
        let budgets = [
            None,
            Some(256 << 10),
            Some(512 << 10),
            Some(1 << 20),
            Some(2 << 20),
        ];
        let expected = [256, 256, 256, 512, 1024];
        assert_eq!(budgets.map(depth_budget), expected);
        assert_eq!(depth_budget(Some(1 << 40)), MAX_DEPTH_BLOCK);
        let most = max_depth_block();
        for d_in in [
            0, 1, 255, 256, 257, 768, 1023, 1024, 1025, 2048, 3071, 11008,
        ] {
            assert_eq!(
                depth_block(d_in, TILE_ROWS),
                d_in.max(1),
                "one strip streams whole"
            );
            let block = depth_block(d_in, TILE_ROWS + 1);
            let blocks = d_in.div_ceil(block);
            assert!(
                block.is_multiple_of(2) && block <= most.max(2),
                "{d_in}: {block}"
            );
            assert_eq!(blocks, d_in.div_ceil(most), "{d_in}: fewest blocks");
            // Equal blocks: the last one is short by less than one input a block.
            assert!(
                d_in == 0 || d_in > (blocks - 1) * block + block - 2 * blocks,
                "{d_in}"
            );
        }
    }

    #[test]
    fn task_splits_cover_every_output_once() {
        for ((rows, panels, threads), strip_rows) in [
            (1, 1, 1),
            (10, 96, 2),
            (ROW_BLOCK, 3, 2),
            (ROW_BLOCK + 1, 24, 2),
            (512, 24, 2),
            (512, 72, 16),
            (2049, 5, 3),
            (37, 200, 64),
        ]
        .into_iter()
        .flat_map(|plan| [TILE_ROWS, 32].map(|strip_rows| (plan, strip_rows)))
        {
            let split = TaskSplit::new(rows, panels, threads, strip_rows);
            let mut seen = vec![0u8; rows * panels];
            for task in 0..split.tasks() {
                let (task_rows, task_panels) = split.task(task);
                assert_eq!(
                    task_rows.start % strip_rows,
                    0,
                    "{rows} rows: {task_rows:?}"
                );
                if split.row_groups > 1 {
                    assert!(task_panels.len() >= MIN_TASK_PANELS.min(panels));
                }
                for row in task_rows {
                    for panel in task_panels.clone() {
                        seen[row * panels + panel] += 1;
                    }
                }
            }
            assert!(
                seen.iter().all(|&n| n == 1),
                "{rows} x {panels} on {threads}"
            );
        }
    }

    /// Every kernel of bf16 products this CPU can run (none but on x86).
    fn bf16_kernels_here() -> impl Iterator<Item = Kernel> + Clone {
        #[cfg(target_arch = "x86_64")]
        let kernels = {
            use std::arch::is_x86_feature_detected as has;
            [
                (Kernel::Amx, amx::available()),
                (
                    Kernel::Avx512Bf16,
                    has!("avx512f") && has!("avx512bw") && has!("avx512bf16"),
                ),
            ]
        };
        #[cfg(not(target_arch = "x86_64"))]
        let kernels: [(Kernel, bool); 0] = [];
        kernels
            .into_iter()
            .filter_map(|(kernel, runs)| runs.then_some(kernel))
    }

    /// Every kernel of f32 strips this CPU can run, the portable one included.
    fn f32_kernels_here() -> impl Iterator<Item = Kernel> + Clone {
        #[cfg(target_arch = "x86_64")]
        let kernels = {
            use std::arch::is_x86_feature_detected as has;
            [
                (Kernel::Avx512, has!("avx512f")),
                (Kernel::Avx2, has!("avx2") && has!("fma") && has!("f16c")),
                (Kernel::Portable, true),
            ]
        };
        #[cfg(target_arch = "aarch64")]
        let kernels = [(Kernel::Neon, true), (Kernel::Portable, true)];
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        let kernels = [(Kernel::Portable, true)];
        kernels
            .into_iter()
            .filter_map(|(kernel, runs)| runs.then_some(kernel))
    }

    /// `multiply` with a given kernel, on one thread.
    fn multiply_with(
        packed: &PackedMatrix,
        x: &[f32],
        rows: usize,
        bias: Option<&[f32]>,
        kernel: Kernel,
    ) -> Vec<f32> {
        let mut y = vec![0.0; rows * packed.d_out];
        if rows == 0 || packed.d_out == 0 {
            return y;
        }
        let strips = Strips::pack(kernel.layout(), packed.precision, x, rows, packed.d_in);
        with_rows!(&packed.panels, panel_rows => {
            let product = Product {
                rows: panel_rows,
                panel_depth: packed.d_in,
                first_input: 0,
                d_in: packed.d_in,
                d_out: packed.d_out,
                strips: &strips,
                x_rows: rows,
                bias,
                output: OutputPtr(y.as_mut_ptr()),
                kernel,
            };
            product.panels(0..rows, 0..packed.d_out.div_ceil(PANEL));
        });
        y
    }
}

//! The chunked scan of Mamba-2's state-space model for a prompt call (its tensor form, the
//! fallback where this kernel does not apply, and the derivation are in
//! `hookscope-arch-mamba2`'s `ssd`), one task per sequence and head.
//!
//! First each chunk's `C Bᵀ` products, once per group, then per head its chunks in order:
//! the decayed products times the chunk's inputs, the entering state read out by `C`, and the
//! state carried to the next chunk, every product on the attention kernels' weighted-values
//! tile (`attention_tiles::multiply_rows`) with the head's state and chunk in cache. As burn operations this was some twenty passes over `[B, H, chunks, C, C]` tensors
//! and batched products across the threads, most of a Mamba-2 prompt call.

use burn::tensor::Tensor;

use super::attention_tiles::{HeadJob, Landing, Tiles, ValueRows, for_each_head, multiply_rows};
use super::elementwise::{LOG_TINY, above_tiny, decay_factor, exp_full_range, flush_tiny};
use super::host::{dense_f32, from_host};
use super::isa::vector_level;

/// The operands of one chunked scan: inputs `x` `[B, T, H, P]`, step sizes `dt` `[B, T, H]`
/// (after the softplus), decay rates `a` `[H]`, projections `b` and `c` `[B, T, G, N]` (one per
/// group of `H / G` consecutive heads), the states `initial` `[B, H, P, N]` and the chunk
/// length.
pub struct SsdOperands<'a> {
    /// `[B, T, H, P]` inputs.
    pub x: &'a Tensor<4>,
    /// `[B, T, H]` step sizes.
    pub dt: &'a Tensor<3>,
    /// `[H]` decay rates (negative).
    pub a: &'a Tensor<1>,
    /// `[B, T, G, N]` input projections.
    pub b: &'a Tensor<4>,
    /// `[B, T, G, N]` output projections.
    pub c: &'a Tensor<4>,
    /// `[B, H, P, N]` states before the first token.
    pub initial: &'a Tensor<4>,
    /// Tokens per chunk (fewer in the last one).
    pub chunk: usize,
}

/// The scan's outputs `y` `[B, T, H, P]` (without the `D` skip) and the states after the last
/// token `[B, H, P, N]`; `None` unless every operand lives on the CPU backend as `f32` with
/// consistent, non-empty sizes (then the caller runs the tensor form).
pub fn chunked_ssd(operands: &SsdOperands<'_>) -> Option<(Tensor<4>, Tensor<4>)> {
    let [batch, tokens, heads, p] = operands.x.dims();
    let [_, _, groups, n] = operands.b.dims();
    let consistent = operands.dt.dims() == [batch, tokens, heads]
        && operands.a.dims() == [heads]
        && operands.b.dims() == [batch, tokens, groups, n]
        && operands.c.dims() == [batch, tokens, groups, n]
        && operands.initial.dims() == [batch, heads, p, n];
    let sizes = [batch, tokens, heads, p, groups, n, operands.chunk];
    if !consistent || sizes.contains(&0) || heads % groups != 0 {
        return None;
    }
    let x = dense_f32(operands.x)?;
    let dt = dense_f32(operands.dt)?;
    let a = dense_f32(operands.a)?;
    let b = dense_f32(operands.b)?;
    let c = dense_f32(operands.c)?;
    let initial = dense_f32(operands.initial)?;
    let shape = Shape {
        tokens,
        heads,
        p,
        groups,
        n,
        chunk: operands.chunk.min(tokens),
    };
    let (b, c) = (b.as_slice::<f32>()?, c.as_slice::<f32>()?);
    // Each chunk's `C Bᵀ` `[rows, rows]`, per sequence and group, in blocks of `chunk²`.
    let chunks = tokens.div_ceil(shape.chunk);
    let block = shape.chunk * shape.chunk;
    let products_len = batch * groups * chunks * block;
    let products_job = ProductsJob {
        shape: &shape,
        b,
        c,
    };
    let products = for_each_head(vector_level(), &products_job, products_len, block);
    let job = ScanJob {
        shape: &shape,
        x: x.as_slice::<f32>()?,
        dt: dt.as_slice::<f32>()?,
        a: a.as_slice::<f32>()?,
        b,
        c,
        products: &products,
        initial: initial.as_slice::<f32>()?,
    };
    // Each task writes its outputs `[T, P]` followed by its final state `[P, N]`.
    let (per_output, per_state) = (tokens * p, p * n);
    let per_task = per_output + per_state;
    let results = for_each_head(vector_level(), &job, batch * heads * per_task, per_task);
    let mut y = vec![0.0f32; batch * tokens * heads * p];
    let mut states = Vec::with_capacity(batch * heads * per_state);
    for (task, result) in results.chunks_exact(per_output + per_state).enumerate() {
        let (sequence, head) = (task / heads, task % heads);
        for (t, row) in result[..per_output].chunks_exact(p).enumerate() {
            y[((sequence * tokens + t) * heads + head) * p..][..p].copy_from_slice(row);
        }
        states.extend_from_slice(&result[per_output..]);
    }
    Some((
        from_host(y, [batch, tokens, heads, p]),
        from_host(states, [batch, heads, p, n]),
    ))
}

/// The sizes of one scan.
struct Shape {
    tokens: usize,
    heads: usize,
    p: usize,
    groups: usize,
    n: usize,
    chunk: usize,
}

impl Shape {
    /// Chunk `k`'s first token and its length.
    fn span(&self, k: usize) -> (usize, usize) {
        let start = k * self.chunk;
        (start, self.chunk.min(self.tokens - start))
    }

    /// Group `g`'s projection of sequence `sequence` at token `t`, from `[B, T, G, N]`.
    #[inline(always)]
    fn projection<'v>(&self, values: &'v [f32], sequence: usize, t: usize, g: usize) -> &'v [f32] {
        &values[((sequence * self.tokens + t) * self.groups + g) * self.n..][..self.n]
    }
}

/// `C Bᵀ` of each sequence, group and chunk (task `(b * G + g) * chunks + k`).
struct ProductsJob<'a> {
    shape: &'a Shape,
    b: &'a [f32],
    c: &'a [f32],
}

impl HeadJob for ProductsJob<'_> {
    #[inline(always)]
    unsafe fn run<T: Tiles>(&self, task: usize, out: &mut [f32]) {
        let shape = self.shape;
        let chunks = shape.tokens.div_ceil(shape.chunk);
        let (sequence, group, k) = (
            task / (shape.groups * chunks),
            task / chunks % shape.groups,
            task % chunks,
        );
        let (start, rows) = shape.span(k);
        let n = shape.n;
        let mut c_rows = vec![0.0f32; rows * n];
        let mut b_columns = vec![0.0f32; n * rows];
        for s in 0..rows {
            c_rows[s * n..][..n].copy_from_slice(shape.projection(
                self.c,
                sequence,
                start + s,
                group,
            ));
            for (j, &value) in shape
                .projection(self.b, sequence, start + s, group)
                .iter()
                .enumerate()
            {
                b_columns[j * rows + s] = value;
            }
        }
        let b_columns = ValueRows::from_rows(&b_columns, n, rows);
        // SAFETY: `for_each_head` runs this with the tiles of a level this CPU has; `c_rows`
        // is `rows` rows of `N`, `b_columns` `N` rows, `out` at least `rows²` values.
        unsafe {
            multiply_rows::<T>(
                &c_rows,
                rows,
                &b_columns,
                &mut out[..rows * rows],
                Landing::Replace,
            )
        };
    }
}

/// The scan of every sequence and head (task `b * H + h`).
struct ScanJob<'a> {
    shape: &'a Shape,
    x: &'a [f32],
    dt: &'a [f32],
    a: &'a [f32],
    b: &'a [f32],
    c: &'a [f32],
    products: &'a [f32],
    initial: &'a [f32],
}

impl HeadJob for ScanJob<'_> {
    #[inline(always)]
    unsafe fn run<T: Tiles>(&self, task: usize, out: &mut [f32]) {
        let shape = self.shape;
        let (p, n) = (shape.p, shape.n);
        let (output, state) = out.split_at_mut(shape.tokens * p);
        state.copy_from_slice(&self.initial[task * p * n..][..p * n]);
        let (sequence, head) = (task / shape.heads, task % shape.heads);
        let group = head / (shape.heads / shape.groups);
        let chunks = shape.tokens.div_ceil(shape.chunk);
        let c = shape.chunk;
        let mut scratch = Scratch {
            cumulative: vec![0.0; c],
            scores: vec![0.0; c * c],
            inputs: vec![0.0; c * p],
            inputs_to_end: vec![0.0; p * c],
            c_grown: vec![0.0; c * n],
            b_rows: vec![0.0; c * n],
        };
        for k in 0..chunks {
            let chunk = Chunk {
                sequence,
                head,
                group,
                k,
                products: &self.products
                    [((sequence * shape.groups + group) * chunks + k) * c * c..][..c * c],
            };
            // SAFETY: `for_each_head` runs this with the tiles of a level this CPU has.
            unsafe { self.run_chunk::<T>(&chunk, &mut scratch, state, output) };
        }
    }
}

/// Which chunk a [`ScanJob::run_chunk`] call scans, and its `C Bᵀ`.
struct Chunk<'a> {
    sequence: usize,
    head: usize,
    group: usize,
    k: usize,
    products: &'a [f32],
}

/// One chunk's work space, `C = chunk` rows (a shorter chunk uses the front of each).
struct Scratch {
    /// `[C]` running sums of the log-decays `dt a` inside the chunk.
    cumulative: Vec<f32>,
    /// `[C, C]` the decayed `C Bᵀ` on and below the diagonal.
    scores: Vec<f32>,
    /// `[C, P]` inputs times their step sizes.
    inputs: Vec<f32>,
    /// `[P, C]` the same decayed to the chunk's end, transposed.
    inputs_to_end: Vec<f32>,
    /// `[C, N]` the output projections times `exp(cumulative)`.
    c_grown: Vec<f32>,
    /// `[C, N]` the input projections.
    b_rows: Vec<f32>,
}

impl ScanJob<'_> {
    /// One chunk: its outputs into `output` `[T, P]`, `state` `[P, N]` carried past it.
    ///
    /// # Safety
    /// The CPU must have `T`'s instructions.
    #[inline(always)]
    unsafe fn run_chunk<T: Tiles>(
        &self,
        chunk: &Chunk<'_>,
        s: &mut Scratch,
        state: &mut [f32],
        output: &mut [f32],
    ) {
        let shape = self.shape;
        let (p, n, heads) = (shape.p, shape.n, shape.heads);
        let (start, rows) = shape.span(chunk.k);
        let rate = self.a[chunk.head];
        let mut sum = 0.0f32;
        let mut falling = true;
        for i in 0..rows {
            let token = (chunk.sequence * shape.tokens + start + i) * heads + chunk.head;
            let step = self.dt[token];
            falling &= step * rate <= 0.0;
            sum += step * rate;
            s.cumulative[i] = sum;
            let input = &self.x[token * p..][..p];
            for (weighted, &value) in s.inputs[i * p..][..p].iter_mut().zip(input) {
                *weighted = value * step;
            }
        }
        let last = s.cumulative[rows - 1];
        for i in 0..rows {
            let here = s.cumulative[i];
            // Each factor and product at least `TINY` or zero, made so in the loop that makes
            // it: no product of the chunk falls below the normal range (`flush_tiny`).
            let grown = above_tiny(exp_full_range(here));
            let to_end = above_tiny(exp_full_range(last - here));
            let token = start + i;
            let c_row = shape.projection(self.c, chunk.sequence, token, chunk.group);
            for (grown_c, &value) in s.c_grown[i * n..][..n].iter_mut().zip(c_row) {
                *grown_c = above_tiny(value * grown);
            }
            s.b_rows[i * n..][..n].copy_from_slice(shape.projection(
                self.b,
                chunk.sequence,
                token,
                chunk.group,
            ));
            for j in 0..p {
                s.inputs_to_end[j * rows + i] = above_tiny(s.inputs[i * p + j] * to_end);
            }
            // Where no log-decay is positive (`dt > 0`, `a < 0`, as the model makes them) the
            // running sum only falls, so the decays below `TINY` are the row's first ones:
            // skipped, not computed.
            let first = match falling {
                true => (0..=i)
                    .rev()
                    .find(|&earlier| here - s.cumulative[earlier] < LOG_TINY)
                    .map_or(0, |earlier| earlier + 1),
                false => 0,
            };
            let row = &mut s.scores[i * rows..][..rows];
            let products = &chunk.products[i * rows..][first..=i];
            row[..first].fill(0.0);
            for ((score, &product), &there) in row[first..=i]
                .iter_mut()
                .zip(products)
                .zip(&s.cumulative[first..=i])
            {
                *score = above_tiny(product * decay_factor(here - there));
            }
            row[i + 1..].fill(0.0);
        }
        let (square, by_p, by_n) = (rows * rows, rows * p, rows * n);
        let out = &mut output[start * p..(start + rows) * p];
        let inputs = ValueRows::from_rows(&s.inputs[..by_p], rows, p);
        // SAFETY (every product below): the caller's level; each left operand is `m` rows of
        // the right one's row count, each destination `m` rows of its width.
        // Inside the chunk: y_l = Σ_{s ≤ l} (C_l · B_s) decay(s → l) dt_s x_s.
        unsafe { multiply_rows::<T>(&s.scores[..square], rows, &inputs, out, Landing::Replace) };
        // The entering state read out: y_l += exp(cumulative_l) C_l · S.
        let mut state_columns = vec![0.0f32; n * p];
        for (j, row) in state.chunks_exact(n).enumerate() {
            for (i, &value) in row.iter().enumerate() {
                state_columns[i * p + j] = value;
            }
        }
        let state_columns = ValueRows::from_rows(&state_columns, n, p);
        let add = Landing::Accumulate {
            keep: 1.0,
            sign: 1.0,
        };
        unsafe { multiply_rows::<T>(&s.c_grown[..by_n], rows, &state_columns, out, add) };
        // The state at the chunk's end: S = exp(last) S + Σ_s exp(last - cumulative_s) dt_s x_s B_sᵀ.
        let b_rows = ValueRows::from_rows(&s.b_rows[..by_n], rows, n);
        let decay_state = Landing::Accumulate {
            keep: exp_full_range(last),
            sign: 1.0,
        };
        unsafe { multiply_rows::<T>(&s.inputs_to_end[..by_p], p, &b_rows, state, decay_state) };
        flush_tiny(state);
    }
}

//! Attention of a prompt call's queries over their keys on the CPU (`flex`) backend: the fused
//! path ([`attend`]: scores, softmax and weighted values per row block, nothing materialised)
//! and, for a call that observes the scores or probabilities, its two halves ([`scores`] and
//! [`weighted_values`], with the softmax between them in `nn`).
//!
//! burn-flex's attention multiplies `Q Kᵀ` and `P V` with `gemm` but scales, masks and
//! exponentiates the scores element by element through libm, which took a third of a 512-token
//! GPT-2 call. Here each query head runs on the register tiles of `attention_tiles`, picked by
//! vector level ([`isa::vector_level`](super::isa::vector_level), capped like the products by
//! `HOOKSCOPE_CPU_KERNELS`); only keys up to a row block's last visible one are visited (half
//! the work under a causal mask), and the fused softmax uses `elementwise`'s vectorised
//! exponential. Grouped key/value heads are read where they lie, once per query head of their
//! group. Other backends, dtypes and layouts go to burn.

use burn::tensor::{Bool, Tensor};

use super::attention_tiles::{
    HeadJob, ROWS, Tiles, ValueRows, for_each_head, key_blocks, load_queries, score_blocks,
    weigh_values,
};
use super::decode_attention::{HostOperands, Strided, on_host};
use super::elementwise::{exp_f32, max_lanes, sum_lanes};
use super::host::{dense_f32, f32_primitive, from_host};
use super::isa::{VectorLevel, vector_level};

/// `softmax(scale · Q Kᵀ, masked) V` for `queries` `[B, NH, T, D]` over `keys` and `values`
/// `[B, NKV, S, D]` (each key/value head shared by `NH / NKV` query heads), `mask` `[B, 1, T, S]`
/// true where a query must not see a key; `[B, NH, T, D]`, rows that see no key all zero (as
/// burn computes them). `None` where this path does not apply (another backend or dtype, a
/// non-contiguous head dim).
pub(crate) fn attend(
    queries: &Tensor<4>,
    keys: &Tensor<4>,
    values: &Tensor<4>,
    mask: &Tensor<4, Bool>,
    scale: f32,
) -> Option<Tensor<4>> {
    attend_at(vector_level(), [queries, keys, values], mask, scale)
}

/// [`attend`] of `[queries, keys, values]` with the kernels of `level` (which this CPU must
/// have).
pub(super) fn attend_at(
    level: VectorLevel,
    [queries, keys, values]: [&Tensor<4>; 3],
    mask: &Tensor<4, Bool>,
    scale: f32,
) -> Option<Tensor<4>> {
    let [batch, heads, tokens, dim] = queries.dims();
    let output = on_host(queries, keys, values, mask, |host| {
        let job = Attend {
            heads: HeadViews::of(host),
            scale,
        };
        let per_head = tokens * dim;
        for_each_head(level, &job, batch * heads * per_head, per_head)
    })?;
    Some(from_host(output, [batch, heads, tokens, dim]))
}

/// The scaled scores `scale · Q Kᵀ` `[B, NH, T, S]` of `queries` over `keys`, `-inf` where
/// `mask` hides a key: what [`attend`] takes the softmax of. `None` where [`attend`] would be.
pub(crate) fn scores(
    queries: &Tensor<4>,
    keys: &Tensor<4>,
    mask: &Tensor<4, Bool>,
    scale: f32,
) -> Option<Tensor<4>> {
    scores_at(vector_level(), [queries, keys], mask, scale)
}

/// [`scores`] of `[queries, keys]` with the kernels of `level` (which this CPU must have).
pub(super) fn scores_at(
    level: VectorLevel,
    [queries, keys]: [&Tensor<4>; 2],
    mask: &Tensor<4, Bool>,
    scale: f32,
) -> Option<Tensor<4>> {
    let [batch, heads, tokens, _] = queries.dims();
    let positions = keys.dims()[2];
    // The values are not read: the keys stand in for them.
    let output = on_host(queries, keys, keys, mask, |host| {
        let job = Scores {
            heads: HeadViews::of(host),
            scale,
        };
        let per_head = tokens * positions;
        for_each_head(level, &job, batch * heads * per_head, per_head)
    })?;
    Some(from_host(output, [batch, heads, tokens, positions]))
}

/// `probabilities · V`: `[B, NH, T, D]` from `probabilities` `[B, NH, T, S]` and `values`
/// `[B, NKV, S, D]` (each value head shared by `NH / NKV` query heads). `None` where the
/// operands are not `f32` on the CPU backend or the heads do not group.
pub(crate) fn weighted_values(probabilities: &Tensor<4>, values: &Tensor<4>) -> Option<Tensor<4>> {
    weighted_values_at(vector_level(), probabilities, values)
}

/// [`weighted_values`] with the kernels of `level` (which this CPU must have).
pub(super) fn weighted_values_at(
    level: VectorLevel,
    probabilities: &Tensor<4>,
    values: &Tensor<4>,
) -> Option<Tensor<4>> {
    let [batch, heads, tokens, positions] = probabilities.dims();
    let [value_batch, kv_heads, value_positions, dim] = values.dims();
    if kv_heads == 0
        || heads % kv_heads != 0
        || (value_batch, value_positions) != (batch, positions)
    {
        return None;
    }
    let probabilities = dense_f32(probabilities)?;
    let value_storage = f32_primitive(values)?;
    let job = Weigh {
        probabilities: probabilities.as_slice::<f32>()?,
        values: Strided::of(&value_storage)?,
        heads,
        group: heads / kv_heads,
        tokens,
        positions,
        dim,
    };
    let per_head = tokens * dim;
    let output = for_each_head(level, &job, batch * heads * per_head, per_head);
    Some(from_host(output, [batch, heads, tokens, dim]))
}

/// One call's operands seen per query head, with each query row's end (one past its last
/// visible key).
struct HeadViews<'a> {
    host: &'a HostOperands<'a>,
    ends: Vec<usize>,
}

impl<'a> HeadViews<'a> {
    fn of(host: &'a HostOperands<'a>) -> Self {
        let positions = host.sizes.positions;
        // Past the last visible key of each query row nothing is computed: its end, per batch
        // row and query row (the mask is shared by every head).
        let ends = host
            .hidden
            .chunks_exact(positions.max(1))
            .map(|row| {
                row.iter()
                    .rposition(|&hidden| !hidden)
                    .map_or(0, |last| last + 1)
            })
            .collect();
        HeadViews { host, ends }
    }

    /// Task `task`'s (`b * NH + h`) operands.
    #[inline(always)]
    fn head(&self, task: usize) -> HeadOperands<'_> {
        let sizes = &self.host.sizes;
        let (heads, tokens, positions) = (sizes.heads, sizes.tokens, sizes.positions);
        let (b, h) = (task / heads, task % heads);
        let per_head = tokens * sizes.dim;
        HeadOperands {
            queries: &self.host.queries[task * per_head..][..per_head],
            kv_head: [b, h / (heads / sizes.kv_heads)],
            hidden: &self.host.hidden[b * tokens * positions..][..tokens * positions],
            ends: &self.ends[b * tokens..][..tokens],
        }
    }
}

/// One query head's operands: its queries `[T, D]`, its key/value head `[b, kv_head]`, and its
/// batch row's mask `[T, S]` with each query row's end.
struct HeadOperands<'a> {
    queries: &'a [f32],
    kv_head: [usize; 2],
    hidden: &'a [bool],
    ends: &'a [usize],
}

impl HeadOperands<'_> {
    /// The row block at `first`: its rows and its end (the latest of its rows' ends).
    #[inline(always)]
    fn block(&self, first: usize) -> (usize, usize) {
        let rows = ROWS.min(self.ends.len() - first);
        let end = self.ends[first..first + rows].iter().copied().max();
        (rows, end.unwrap_or(0))
    }
}

/// One row block of a head, with its scaled scores.
struct ScoredBlock<'a> {
    /// The block's first query row.
    first: usize,
    /// Its rows (`ROWS`, or fewer at the end).
    rows: usize,
    /// One past the last key any of its rows sees: scores before it are computed.
    end: usize,
    /// `[ROWS, stride]` scaled scores (unmasked), valid before `end`.
    scores: &'a mut [f32],
    stride: usize,
}

impl HeadViews<'_> {
    /// Computes the scaled scores of every row block of head `task` with the tiles `T` and
    /// hands each block to `visit`, with the head's operands.
    ///
    /// # Safety
    /// The CPU must have `T`'s instructions.
    #[inline(always)]
    unsafe fn score_row_blocks<T: Tiles>(
        &self,
        task: usize,
        scale: f32,
        mut visit: impl FnMut(&HeadOperands<'_>, ScoredBlock<'_>),
    ) {
        let head = self.head(task);
        let sizes = &self.host.sizes;
        let (tokens, positions, dim) = (sizes.tokens, sizes.positions, sizes.dim);
        let keys = key_blocks::<T>(&self.host.keys, head.kv_head, positions, dim);
        let stride = positions.div_ceil(T::KEYS) * T::KEYS;
        let mut scores = vec![0.0f32; ROWS * stride];
        let mut query = vec![[0.0f32; ROWS]; dim];
        for first in (0..tokens).step_by(ROWS) {
            let (rows, end) = head.block(first);
            load_queries(head.queries, first, rows, &mut query);
            // SAFETY: the caller's contract; `stride` covers every key block.
            unsafe { score_blocks::<T>(&query, &keys, end, scale, (&mut scores, stride)) };
            let scores = &mut scores[..];
            visit(
                &head,
                ScoredBlock {
                    first,
                    rows,
                    end,
                    scores,
                    stride,
                },
            );
        }
    }
}

/// The fused attention of each head into `[T, D]`.
struct Attend<'a> {
    heads: HeadViews<'a>,
    scale: f32,
}

impl HeadJob for Attend<'_> {
    #[inline(always)]
    unsafe fn run<T: Tiles>(&self, task: usize, out: &mut [f32]) {
        let sizes = &self.heads.host.sizes;
        let (positions, dim) = (sizes.positions, sizes.dim);
        let kv_head = self.heads.head(task).kv_head;
        let values = ValueRows::of(&self.heads.host.values, kv_head, positions, dim);
        let visit = |head: &HeadOperands<'_>, block: ScoredBlock<'_>| {
            let ScoredBlock {
                first,
                rows,
                end,
                scores,
                stride,
            } = block;
            // Each row's weights in place of its scores (all zero for a row that sees no
            // key), and the factor that normalises them.
            let mut inverse = [0.0f32; ROWS];
            for (r, inverse) in inverse.iter_mut().enumerate().take(rows) {
                let hidden = &head.hidden[(first + r) * positions..][..end];
                *inverse = softmax_in_place(&mut scores[r * stride..][..end], hidden);
            }
            let weights: [&[f32]; ROWS] = std::array::from_fn(|r| &scores[r * stride..][..end]);
            // SAFETY: the caller's contract; `end <= positions` value rows.
            unsafe {
                weigh_values::<T>(&weights, &values, &inverse, rows, &mut out[first * dim..])
            };
        };
        // SAFETY: the caller's contract.
        unsafe { self.heads.score_row_blocks::<T>(task, self.scale, visit) };
    }
}

/// The scaled, masked scores of each head into `[T, S]`.
struct Scores<'a> {
    heads: HeadViews<'a>,
    scale: f32,
}

impl HeadJob for Scores<'_> {
    #[inline(always)]
    unsafe fn run<T: Tiles>(&self, task: usize, out: &mut [f32]) {
        let positions = self.heads.host.sizes.positions;
        let visit = |head: &HeadOperands<'_>, block: ScoredBlock<'_>| {
            // Keys at or past the block's end are hidden from each of its rows.
            for r in 0..block.rows {
                let row = (block.first + r) * positions;
                let (out, hidden) = (
                    &mut out[row..][..positions],
                    &head.hidden[row..][..positions],
                );
                let scores = &block.scores[r * block.stride..];
                for ((o, &hidden), &score) in out.iter_mut().zip(hidden).zip(scores) {
                    *o = match hidden {
                        true => f32::NEG_INFINITY,
                        false => score,
                    };
                }
            }
        };
        // SAFETY: the caller's contract.
        unsafe { self.heads.score_row_blocks::<T>(task, self.scale, visit) };
    }
}

/// Each head's probabilities times its values into `[T, D]`.
struct Weigh<'a> {
    probabilities: &'a [f32],
    values: Strided<'a>,
    heads: usize,
    group: usize,
    tokens: usize,
    positions: usize,
    dim: usize,
}

impl HeadJob for Weigh<'_> {
    #[inline(always)]
    unsafe fn run<T: Tiles>(&self, task: usize, out: &mut [f32]) {
        let (tokens, positions, dim) = (self.tokens, self.positions, self.dim);
        let (b, h) = (task / self.heads, task % self.heads);
        let values = ValueRows::of(&self.values, [b, h / self.group], positions, dim);
        let per_head = tokens * positions;
        let probabilities = &self.probabilities[task * per_head..][..per_head];
        let ones = [1.0f32; ROWS];
        for first in (0..tokens).step_by(ROWS) {
            let rows = ROWS.min(tokens - first);
            // Rows past the block's last repeat it (computed alongside, never stored).
            let weights: [&[f32]; ROWS] = std::array::from_fn(|r| {
                &probabilities[(first + r.min(rows - 1)) * positions..][..positions]
            });
            // SAFETY: the caller's contract; every weight slice has `positions` entries, one per
            // value row.
            unsafe { weigh_values::<T>(&weights, &values, &ones, rows, &mut out[first * dim..]) };
        }
    }
}

/// A row's scores (`hidden` true where a key is masked) replaced by their unnormalised weights
/// `e^(score - max)`, zero where hidden; returns the factor that normalises them (zero for a
/// row that sees no key).
#[inline(always)]
fn softmax_in_place(weights: &mut [f32], hidden: &[bool]) -> f32 {
    for (weight, &hidden) in weights.iter_mut().zip(hidden) {
        *weight = if hidden { f32::NEG_INFINITY } else { *weight };
    }
    // Branch-free forms, so that the loops vectorise (no score is NaN).
    let max = max_lanes(weights);
    for weight in weights.iter_mut() {
        let shifted = *weight - max;
        *weight = if shifted == f32::NEG_INFINITY || max == f32::NEG_INFINITY {
            0.0
        } else {
            exp_f32(shifted)
        };
    }
    let total = sum_lanes(weights);
    if total > 0.0 { 1.0 / total } else { 0.0 }
}

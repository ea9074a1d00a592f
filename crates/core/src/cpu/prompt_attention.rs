//! Attention of a prompt call's queries over their keys on the CPU (`flex`) backend.
//!
//! burn-flex's attention multiplies `Q Kᵀ` and `P V` with `gemm` but scales, masks and
//! exponentiates the scores element by element through libm, which took a third of a 512-token
//! GPT-2 call. Here each query head is computed in blocks of [`ROWS`] query rows: the scores of
//! a block against 16 keys at a time are 16-wide fused multiply-adds over a transposed copy of
//! the head's keys (no horizontal sums), only keys up to the block's last visible one are
//! visited (half the work under a causal mask), the softmax uses `elementwise`'s vectorised
//! exponential, and each value row, once loaded, is added into every row of the block. Grouped
//! key/value heads are read where they lie, once per query head of their group. Other backends,
//! dtypes and layouts go to burn.

use burn::tensor::{Bool, Tensor};
use multiversion::multiversion;
use rayon::prelude::*;

use super::decode_attention::{Sizes, Strided, on_host};
use super::elementwise::exp_f32;

/// Query rows computed together: each key and value row loaded serves all of them.
const ROWS: usize = 4;
/// Keys per block of scores: one AVX-512 vector.
const KEYS: usize = 16;

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
    on_host(queries, keys, values, mask, |host| {
        let sizes = host.sizes;
        let (heads, tokens, positions) = (sizes.heads, sizes.tokens, sizes.positions);
        // Past the last visible key of each query row nothing is computed: its end, per batch
        // row and query row (the mask is shared by every head).
        let ends: Vec<usize> = host
            .hidden
            .chunks_exact(positions.max(1))
            .map(|row| {
                row.iter()
                    .rposition(|&hidden| !hidden)
                    .map_or(0, |last| last + 1)
            })
            .collect();
        let per_head = tokens * sizes.dim;
        let mut output = vec![0.0f32; sizes.batch * heads * per_head];
        output
            .par_chunks_mut(per_head.max(1))
            .enumerate()
            .for_each(|(task, out)| {
                let (b, h) = (task / heads, task % heads);
                let operands = HeadOperands {
                    queries: &host.queries[task * per_head..][..per_head],
                    keys: &host.keys,
                    values: &host.values,
                    b,
                    kv_head: h / (heads / sizes.kv_heads),
                    hidden: &host.hidden[b * tokens * positions..][..tokens * positions],
                    ends: &ends[b * tokens..][..tokens],
                };
                attend_head(&sizes, scale, &operands, out);
            });
        output
    })
}

/// One query head's operands: its queries `[T, D]`, its key/value head, and its batch row's
/// mask `[T, S]` with each query row's end (one past its last visible key).
struct HeadOperands<'a> {
    queries: &'a [f32],
    keys: &'a Strided<'a>,
    values: &'a Strided<'a>,
    b: usize,
    kv_head: usize,
    hidden: &'a [bool],
    ends: &'a [usize],
}

/// One query head into `out` `[T, D]`.
#[multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma"))]
fn attend_head<'a>(sizes: &Sizes, scale: f32, operands: &HeadOperands<'a>, out: &mut [f32]) {
    let (tokens, positions, dim) = (sizes.tokens, sizes.positions, sizes.dim);
    // The keys transposed: `[D, blocks]` of `KEYS` positions each, zero past the last.
    let padded_blocks = positions.div_ceil(KEYS);
    let padded = padded_blocks * KEYS;
    let mut transposed = vec![[0.0f32; KEYS]; dim * padded_blocks];
    for position in 0..positions {
        let key = operands
            .keys
            .row(operands.b, operands.kv_head, position, dim);
        for (d, &value) in key.iter().enumerate() {
            transposed[d * padded_blocks + position / KEYS][position % KEYS] = value;
        }
    }
    // The block's scaled scores, `[ROWS, padded]`, then its weights in place.
    let mut scores = vec![0.0f32; ROWS * padded];
    // The block's queries, `[D]` of `ROWS` lanes.
    let mut query = vec![[0.0f32; ROWS]; dim];
    for first in (0..tokens).step_by(ROWS) {
        let rows = ROWS.min(tokens - first);
        let end = operands.ends[first..first + rows]
            .iter()
            .copied()
            .max()
            .unwrap_or(0);
        // Lanes past the block's last row are zero: their scores and weighted values are
        // computed alongside (whole vectors) and never stored.
        for (d, lanes) in query.iter_mut().enumerate() {
            for (r, lane) in lanes.iter_mut().enumerate() {
                *lane = match r < rows {
                    true => operands.queries[(first + r) * dim + d],
                    false => 0.0,
                };
            }
        }
        for block in 0..end.div_ceil(KEYS) {
            let mut sums = [[0.0f32; KEYS]; ROWS];
            for (q, k) in query
                .iter()
                .zip(transposed[block..].iter().step_by(padded_blocks))
            {
                for (sum, &q) in sums.iter_mut().zip(q) {
                    for (s, &k) in sum.iter_mut().zip(k) {
                        *s = q.mul_add(k, *s);
                    }
                }
            }
            for (r, sum) in sums.iter().enumerate() {
                let scores = &mut scores[r * padded + block * KEYS..][..KEYS];
                for (score, &sum) in scores.iter_mut().zip(sum) {
                    *score = sum * scale;
                }
            }
        }
        // Each row's weights in place of its scores (all zero for a row that sees no key),
        // and the factor that normalises them.
        let mut inverse = [0.0f32; ROWS];
        for (r, inverse) in inverse.iter_mut().enumerate().take(rows) {
            let hidden = &operands.hidden[(first + r) * positions..][..end];
            let weights = &mut scores[r * padded..][..end];
            for (weight, &hidden) in weights.iter_mut().zip(hidden) {
                if hidden {
                    *weight = f32::NEG_INFINITY;
                }
            }
            // Branch-free forms, so that both loops vectorise (no score is NaN).
            let max = weights
                .iter()
                .fold(f32::NEG_INFINITY, |m, &w| if w > m { w } else { m });
            for weight in weights.iter_mut() {
                let shifted = *weight - max;
                *weight = if shifted == f32::NEG_INFINITY || max == f32::NEG_INFINITY {
                    0.0
                } else {
                    exp_f32(shifted)
                };
            }
            let total = sum_lanes(weights);
            *inverse = if total > 0.0 { 1.0 / total } else { 0.0 };
        }
        // The weighted values, `KEYS` output columns at a time for every row of the block, the
        // sums in registers while the value rows stream past.
        for column in (0..dim).step_by(KEYS) {
            let width = KEYS.min(dim - column);
            let mut sums = [[0.0f32; KEYS]; ROWS];
            for position in 0..end {
                let value = operands
                    .values
                    .row(operands.b, operands.kv_head, position, dim);
                let mut lanes = [0.0f32; KEYS];
                lanes[..width].copy_from_slice(&value[column..column + width]);
                for (r, sum) in sums.iter_mut().enumerate() {
                    let weight = scores[r * padded + position];
                    for (s, &v) in sum.iter_mut().zip(&lanes) {
                        *s = weight.mul_add(v, *s);
                    }
                }
            }
            for (r, sum) in sums.iter().enumerate().take(rows) {
                let out = &mut out[(first + r) * dim + column..][..width];
                for (o, &s) in out.iter_mut().zip(sum) {
                    *o = s * inverse[r];
                }
            }
        }
    }
}

/// `Σ values` in `KEYS` independent lanes (so that it vectorises), then summed.
#[inline(always)]
fn sum_lanes(values: &[f32]) -> f32 {
    let mut lanes = [0.0f32; KEYS];
    let (body, tail) = values.as_chunks::<KEYS>();
    for chunk in body {
        for (lane, &value) in lanes.iter_mut().zip(chunk) {
            *lane += value;
        }
    }
    lanes.iter().sum::<f32>() + tail.iter().sum::<f32>()
}

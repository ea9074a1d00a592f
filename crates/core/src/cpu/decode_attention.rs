//! Attention of a few new queries (a decode step) over the key/value cache on the CPU (`flex`)
//! backend, reading the cache where it lies.
//!
//! burn's fused attention first makes its keys and values contiguous, which for a view of the
//! growing cache buffer (`[B, NKV, capacity, D]` sliced to the positions seen so far) is a copy
//! of the whole cache at every step, and grouped-query heads are repeated into a copy before
//! it. Here each key/value head's rows are read in place, once per query head of its group, and
//! the softmax is the usual max-subtracted one. Other backends, dtypes and layouts go to burn.

use burn::backend::flex::FlexTensor;
use burn::tensor::{Bool, Tensor};
use rayon::prelude::*;

use super::elementwise::{exp_f32, sum_lanes};
use super::host::{f32_primitive, from_host};
use super::isa::per_vector_level;

/// Calls of at most this many new tokens take this path (decode steps, short continuations);
/// longer ones (prompt calls) are matrix products, where burn's tiled attention is the faster.
const MAX_TOKENS: usize = 4;

/// Rows of a rank-4 `f32` tensor: its storage, offset and element strides, the last dim
/// contiguous.
pub(super) struct Strided<'a> {
    data: &'a [f32],
    offset: usize,
    strides: [usize; 3],
}

impl<'a> Strided<'a> {
    /// `None` where the innermost dim is not contiguous or a stride is negative.
    pub(super) fn of(tensor: &'a FlexTensor) -> Option<Self> {
        let layout = tensor.layout();
        let strides = layout.strides();
        if strides.len() != 4 || strides[3] != 1 || strides.iter().any(|&s| s < 0) {
            return None;
        }
        Some(Strided {
            data: tensor.storage::<f32>(),
            offset: layout.start_offset(),
            strides: [
                strides[0] as usize,
                strides[1] as usize,
                strides[2] as usize,
            ],
        })
    }

    /// Row `[i, j, k, ..len]`.
    pub(super) fn row(&self, i: usize, j: usize, k: usize, len: usize) -> &[f32] {
        let start = self.offset + i * self.strides[0] + j * self.strides[1] + k * self.strides[2];
        &self.data[start..start + len]
    }
}

/// `softmax(scale · Q Kᵀ, masked) V` for `queries` `[B, NH, T, D]` over `keys` and `values`
/// `[B, NKV, S, D]` (each key/value head shared by `NH / NKV` query heads), `mask` `[B, 1, T, S]`
/// true where a query must not see a key; `[B, NH, T, D]`. `None` where this path does not apply
/// (another backend or dtype, a non-contiguous head dim, more than [`MAX_TOKENS`] queries).
pub(crate) fn attend(
    queries: &Tensor<4>,
    keys: &Tensor<4>,
    values: &Tensor<4>,
    mask: &Tensor<4, Bool>,
    scale: f32,
) -> Option<Tensor<4>> {
    if queries.dims()[2] > MAX_TOKENS {
        return None;
    }
    let [batch, heads, tokens, dim] = queries.dims();
    let output = on_host(queries, keys, values, mask, |host| {
        let sizes = host.sizes;
        let (tokens, positions) = (sizes.tokens, sizes.positions);
        let per_task = sizes.heads / sizes.kv_heads * tokens * sizes.dim;
        let mut output = vec![0.0f32; sizes.kv_heads * sizes.batch * per_task];
        output
            .par_chunks_mut(per_task.max(1))
            .enumerate()
            .for_each(|(task, out)| {
                let (b, kv_head) = (task / sizes.kv_heads, task % sizes.kv_heads);
                let queries = &host.queries[task * per_task..][..per_task];
                let mask = &host.hidden[b * tokens * positions..][..tokens * positions];
                attend_group(
                    &sizes,
                    queries,
                    &host.keys,
                    &host.values,
                    b,
                    kv_head,
                    mask,
                    scale,
                    out,
                );
            });
        output
    })?;
    Some(from_host(output, [batch, heads, tokens, dim]))
}

/// The sizes of one attention call.
#[derive(Clone, Copy)]
pub(super) struct Sizes {
    pub(super) batch: usize,
    pub(super) heads: usize,
    pub(super) kv_heads: usize,
    pub(super) tokens: usize,
    pub(super) positions: usize,
    pub(super) dim: usize,
}

/// One attention call's operands in host memory: the queries dense `[B, NH, T, D]`, the keys
/// and values read where they lie, the mask as booleans `[B, T, S]` (true: hidden).
pub(super) struct HostOperands<'a> {
    pub(super) queries: &'a [f32],
    pub(super) keys: Strided<'a>,
    pub(super) values: Strided<'a>,
    pub(super) hidden: &'a [bool],
    pub(super) sizes: Sizes,
}

/// Runs `kernel` on the call's operands in host memory and returns what it returns;
/// `None` where they are not there (another backend or dtype, a non-contiguous head dim) or the
/// heads do not group.
pub(super) fn on_host<R>(
    queries: &Tensor<4>,
    keys: &Tensor<4>,
    values: &Tensor<4>,
    mask: &Tensor<4, Bool>,
    kernel: impl FnOnce(&HostOperands<'_>) -> R,
) -> Option<R> {
    let [batch, heads, tokens, dim] = queries.dims();
    let [_, kv_heads, positions, _] = keys.dims();
    if kv_heads == 0 || heads % kv_heads != 0 {
        return None;
    }
    let queries = f32_primitive(queries)?.to_contiguous();
    let (keys, values) = (f32_primitive(keys)?, f32_primitive(values)?);
    let hidden = mask.to_data().try_to_vec::<bool>().ok()?;
    let host = HostOperands {
        queries: queries.as_slice::<f32>()?,
        keys: Strided::of(&keys)?,
        values: Strided::of(&values)?,
        hidden: &hidden,
        sizes: Sizes {
            batch,
            heads,
            kv_heads,
            tokens,
            positions,
            dim,
        },
    };
    Some(kernel(&host))
}

per_vector_level! {
    /// One key/value head of one batch row: the `group · T` query rows it serves (`queries`, in
    /// `[group, T, D]` order) into `out` (same order).
    #[allow(clippy::too_many_arguments)]
    fn attend_group<'a>(
        sizes: &Sizes,
        queries: &[f32],
        keys: &Strided<'a>,
        values: &Strided<'a>,
        b: usize,
        kv_head: usize,
        mask: &[bool],
        scale: f32,
        out: &mut [f32],
    ) {
        let (positions, dim) = (sizes.positions, sizes.dim);
        let mut scores = vec![0.0f32; positions];
        for ((query, out), row) in queries
            .chunks_exact(dim)
            .zip(out.chunks_exact_mut(dim))
            .zip((0..sizes.tokens).cycle())
        {
            let hidden = &mask[row * positions..][..positions];
            let mut max = f32::NEG_INFINITY;
            for (position, score) in scores.iter_mut().enumerate() {
                *score = if hidden[position] {
                    f32::NEG_INFINITY
                } else {
                    scale * dot(query, keys.row(b, kv_head, position, dim))
                };
                max = max.max(*score);
            }
            out.fill(0.0);
            if max == f32::NEG_INFINITY {
                continue;
            }
            // The weights in one vectorised pass (an exponential a key inside the loop below
            // stayed scalar); a hidden key's is zero, a visible one's never is (`exp_f32`
            // clamps above the subnormal range).
            for score in scores.iter_mut() {
                let shifted = *score - max;
                *score = if shifted == f32::NEG_INFINITY {
                    0.0
                } else {
                    exp_f32(shifted)
                };
            }
            let total = sum_lanes(&scores);
            for (position, &weight) in scores.iter().enumerate() {
                if weight == 0.0 {
                    continue;
                }
                for (o, &v) in out.iter_mut().zip(values.row(b, kv_head, position, dim)) {
                    *o += weight * v;
                }
            }
            let inverse = 1.0 / total;
            out.iter_mut().for_each(|o| *o *= inverse);
        }
    }
}

/// `Σ a·b` in 16 independent lanes (so that it vectorises), then summed.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [0.0f32; LANES];
    let (a_body, a_tail) = a.split_at(a.len() - a.len() % LANES);
    let (b_body, b_tail) = b.split_at(a_body.len());
    for (a, b) in a_body.chunks_exact(LANES).zip(b_body.chunks_exact(LANES)) {
        for ((lane, a), b) in lanes.iter_mut().zip(a).zip(b) {
            *lane += a * b;
        }
    }
    let tail: f32 = a_tail.iter().zip(b_tail).map(|(a, b)| a * b).sum();
    // A tree of halvings (vector adds) rather than one chain of 15 dependent scalar adds.
    let mut width = LANES / 2;
    while width > 0 {
        for lane in 0..width {
            lanes[lane] += lanes[lane + width];
        }
        width /= 2;
    }
    lanes[0] + tail
}

#[cfg(test)]
mod tests {
    use burn::tensor::module::attention;
    use burn::tensor::ops::AttentionModuleOptions;
    use burn::tensor::{Device, Distribution, TensorData};

    use super::super::isa::levels_here;
    use super::super::prompt_attention;
    use super::*;

    /// burn's attention with the key/value heads repeated for their query groups.
    fn reference(
        queries: Tensor<4>,
        keys: Tensor<4>,
        values: Tensor<4>,
        mask: Tensor<4, Bool>,
        scale: f64,
    ) -> Tensor<4> {
        let [batch, heads, tokens, _] = queries.dims();
        let [_, kv_heads, positions, dim] = keys.dims();
        let group = heads / kv_heads;
        let repeat = |x: Tensor<4>| {
            x.unsqueeze_dim::<5>(2)
                .expand([batch, kv_heads, group, positions, dim])
                .reshape([batch, heads, positions, dim])
        };
        let options = AttentionModuleOptions {
            scale: Some(scale),
            ..Default::default()
        };
        let mask = mask.expand([batch, heads, tokens, positions]);
        attention(
            queries,
            repeat(keys),
            repeat(values),
            Some(mask),
            None,
            options,
        )
    }

    /// Both fused kernels (this one for decode steps, `prompt_attention` for any number of
    /// queries, at every vector level this CPU has) against burn: cache views, grouped heads, padding (query rows that see no key
    /// included) and odd sizes.
    #[test]
    fn equals_burns_attention_on_cache_views_with_groups_masks_and_odd_sizes() {
        let device = Device::flex();
        // (batch, heads, kv heads, tokens, positions, capacity, dim)
        let cases = [
            (1, 4, 4, 1, 7, 7, 16),
            (2, 6, 2, 1, 33, 64, 20),
            (3, 4, 1, 3, 19, 40, 5),
            (2, 2, 2, 4, 4, 9, 64),
            (2, 6, 3, 37, 37, 64, 64),
            (3, 4, 2, 17, 50, 50, 24),
            (1, 2, 1, 6, 6, 6, 3),
            (2, 4, 2, 70, 75, 80, 80),
            (1, 2, 1, 45, 45, 45, 128),
        ];
        for (batch, heads, kv_heads, tokens, positions, capacity, dim) in cases {
            let normal = Distribution::Normal(0.0, 1.0);
            let queries = Tensor::<4>::random([batch, heads, tokens, dim], normal, &device);
            // The cache as the attention layer sees it: a view of the first positions of a
            // longer buffer.
            let buffer = |_| {
                Tensor::<4>::random([batch, kv_heads, capacity, dim], normal, &device).slice([
                    0..batch,
                    0..kv_heads,
                    0..positions,
                    0..dim,
                ])
            };
            let (keys, values) = (buffer(0), buffer(1));
            // Causal over the last `tokens` positions; batch row 1 has its first two keys
            // padded.
            let mut masked = Vec::new();
            for b in 0..batch {
                for t in 0..tokens {
                    let query = positions - tokens + t;
                    masked.extend((0..positions).map(|key| key > query || (b == 1 && key < 2)));
                }
            }
            let mask = Tensor::<4, Bool>::from_data(
                TensorData::new(masked, [batch, 1, tokens, positions]),
                &device,
            );
            let scale = (dim as f64).powf(-0.5);
            let expected = reference(
                queries.clone(),
                keys.clone(),
                values.clone(),
                mask.clone(),
                scale,
            );
            // The explicit path's halves at every vector level: the scores (`-inf` where
            // hidden) and the probabilities times the values.
            let group = heads / kv_heads;
            let repeat = |x: Tensor<4>| {
                x.unsqueeze_dim::<5>(2)
                    .expand([batch, kv_heads, group, positions, dim])
                    .reshape([batch, heads, positions, dim])
            };
            let expected_scores =
                (queries.clone().matmul(repeat(keys.clone()).swap_dims(2, 3)) * scale).mask_fill(
                    mask.clone().expand([batch, heads, tokens, positions]),
                    f32::NEG_INFINITY,
                );
            let probabilities = burn::tensor::activation::softmax(expected_scores.clone(), 3);
            let expected_weighted = probabilities.clone().matmul(repeat(values.clone()));
            let read = |t: Tensor<4>| t.into_data().try_to_vec::<f32>().unwrap();
            for level in levels_here() {
                let case = (level, batch, heads, kv_heads, tokens, positions, dim);
                let scores =
                    prompt_attention::scores_at(level, [&queries, &keys], &mask, scale as f32);
                for (a, b) in read(scores.unwrap())
                    .iter()
                    .zip(read(expected_scores.clone()))
                {
                    let close = a == &b || (a - b).abs() < 1e-5;
                    assert!(close, "scores, {case:?}: {a} vs {b}");
                }
                let weighted = prompt_attention::weighted_values_at(level, &probabilities, &values);
                // Rows that see no key are NaN in both (a softmax of `-inf` only).
                for (a, b) in read(weighted.unwrap())
                    .iter()
                    .zip(read(expected_weighted.clone()))
                {
                    let close = (a.is_nan() && b.is_nan()) || (a - b).abs() < 1e-5;
                    assert!(close, "weighted values, {case:?}: {a} vs {b}");
                }
            }
            // The prompt kernel at every vector level this CPU has, and the decode kernel.
            let prompt = levels_here().into_iter().map(|level| {
                let operands = [&queries, &keys, &values];
                let ours = prompt_attention::attend_at(level, operands, &mask, scale as f32);
                (format!("prompt, {level:?}"), ours)
            });
            let decode = (tokens <= MAX_TOKENS).then(|| {
                (
                    "decode".into(),
                    attend(&queries, &keys, &values, &mask, scale as f32),
                )
            });
            for (kernel, ours) in prompt.chain(decode) {
                let difference = (ours.unwrap() - expected.clone())
                    .abs()
                    .max()
                    .into_scalar::<f32>();
                assert!(
                    difference < 1e-5,
                    "{kernel}, case {:?}: {difference}",
                    (batch, heads, kv_heads, tokens, positions, capacity, dim)
                );
            }
        }
    }

    #[test]
    fn longer_calls_are_left_to_burn() {
        let device = Device::flex();
        let queries = Tensor::<4>::zeros([1, 1, MAX_TOKENS + 1, 8], &device);
        let keys = Tensor::<4>::zeros([1, 1, MAX_TOKENS + 1, 8], &device);
        let mask = Tensor::<4, Bool>::from_data(
            TensorData::new(
                vec![false; (MAX_TOKENS + 1) * (MAX_TOKENS + 1)],
                [1, 1, MAX_TOKENS + 1, MAX_TOKENS + 1],
            ),
            &device,
        );
        assert!(attend(&queries, &keys, &keys, &mask, 1.0).is_none());
    }
}

//! The chunked gated delta rule of a prompt call (the linear attention of Qwen3-Next and
//! Qwen3.5; its tensor form, the fallback where this kernel does not apply, and the derivation
//! are in `hookscope-arch-deltanet`'s `delta_rule`), one task per sequence and value head.
//!
//! As burn operations a layer's rule is some thirty passes over `[B, NV, chunks, C, C]`
//! tensors, then per chunk four batched products of `[C, C]`-sized matrices, each a call
//! across the threads. Here each head runs all its chunks in one task on rayon's threads: its
//! `[DK, DV]` state and the chunk's matrices stay in cache, and its eight products a chunk run
//! on the register tiles of the attention kernels (`attention_tiles`), whose weighted-values
//! tile is exactly a small row-major product. (The `gemm` crate, burn's CPU product, called
//! once per product instead, gave the same whole-call time on the Xeon this was measured on,
//! through a raw-pointer interface; the tiles need no new dependency.)

use burn::tensor::Tensor;

use super::attention_tiles::{HeadJob, Landing, Tiles, ValueRows, for_each_head, multiply_rows};
use super::elementwise::{exp_full_range, flush_tiny};
use super::host::{dense_f32, from_host};
use super::isa::vector_level;

/// The operands of one chunked rule, heads first: queries and keys `[B, NV, T, DK]` (queries
/// already scaled), values `[B, NV, T, DV]`, write strengths `beta` and log-decays `g`
/// `[B, NV, T]`, the state `initial` `[B, NV, DK, DV]` before the first token, and the chunk
/// length.
pub struct DeltaRuleOperands<'a> {
    /// `[B, NV, T, DK]` queries.
    pub q: &'a Tensor<4>,
    /// `[B, NV, T, DK]` keys.
    pub k: &'a Tensor<4>,
    /// `[B, NV, T, DV]` values.
    pub v: &'a Tensor<4>,
    /// `[B, NV, T]` write strengths.
    pub beta: &'a Tensor<3>,
    /// `[B, NV, T]` log-decays.
    pub g: &'a Tensor<3>,
    /// `[B, NV, DK, DV]` states before the first token.
    pub initial: &'a Tensor<4>,
    /// Tokens per chunk (fewer in the last one).
    pub chunk: usize,
}

/// The rule's outputs `[B, NV, T, DV]` and the states after the last token `[B, NV, DK, DV]`;
/// `None` unless every operand lives on the CPU backend as `f32` with consistent, non-empty
/// sizes (then the caller runs the tensor form).
pub fn chunked_delta_rule(operands: &DeltaRuleOperands<'_>) -> Option<(Tensor<4>, Tensor<4>)> {
    let [batch, heads, tokens, dk] = operands.q.dims();
    let dv = operands.v.dims()[3];
    let consistent = operands.k.dims() == [batch, heads, tokens, dk]
        && operands.v.dims() == [batch, heads, tokens, dv]
        && operands.beta.dims() == [batch, heads, tokens]
        && operands.g.dims() == [batch, heads, tokens]
        && operands.initial.dims() == [batch, heads, dk, dv];
    if !consistent || [batch, heads, tokens, dk, dv, operands.chunk].contains(&0) {
        return None;
    }
    let q = dense_f32(operands.q)?;
    let k = dense_f32(operands.k)?;
    let v = dense_f32(operands.v)?;
    let beta = dense_f32(operands.beta)?;
    let g = dense_f32(operands.g)?;
    let initial = dense_f32(operands.initial)?;
    let job = RuleJob {
        sizes: Sizes {
            tokens,
            dk,
            dv,
            chunk: operands.chunk.min(tokens),
        },
        q: q.as_slice::<f32>()?,
        k: k.as_slice::<f32>()?,
        v: v.as_slice::<f32>()?,
        beta: beta.as_slice::<f32>()?,
        g: g.as_slice::<f32>()?,
        initial: initial.as_slice::<f32>()?,
    };
    // Each task writes its outputs `[T, DV]` followed by its final state `[DK, DV]`.
    let (per_output, per_state) = (tokens * dv, dk * dv);
    let per_task = per_output + per_state;
    let results = for_each_head(vector_level(), &job, batch * heads * per_task, per_task);
    let mut outputs = Vec::with_capacity(batch * heads * per_output);
    let mut states = Vec::with_capacity(batch * heads * per_state);
    for task in results.chunks_exact(per_output + per_state) {
        outputs.extend_from_slice(&task[..per_output]);
        states.extend_from_slice(&task[per_output..]);
    }
    Some((
        from_host(outputs, [batch, heads, tokens, dv]),
        from_host(states, [batch, heads, dk, dv]),
    ))
}

/// The sizes every head shares.
struct Sizes {
    tokens: usize,
    dk: usize,
    dv: usize,
    chunk: usize,
}

/// The rule over every head: the sizes and the operands, row-major as their tensors.
struct RuleJob<'a> {
    sizes: Sizes,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    beta: &'a [f32],
    g: &'a [f32],
    initial: &'a [f32],
}

impl HeadJob for RuleJob<'_> {
    #[inline(always)]
    unsafe fn run<T: Tiles>(&self, task: usize, out: &mut [f32]) {
        let Sizes { tokens, dk, dv, .. } = self.sizes;
        let (output, state) = out.split_at_mut(tokens * dv);
        state.copy_from_slice(&self.initial[task * dk * dv..][..dk * dv]);
        let head = Head {
            sizes: &self.sizes,
            q: &self.q[task * tokens * dk..][..tokens * dk],
            k: &self.k[task * tokens * dk..][..tokens * dk],
            v: &self.v[task * tokens * dv..][..tokens * dv],
            beta: &self.beta[task * tokens..][..tokens],
            g: &self.g[task * tokens..][..tokens],
        };
        let mut scratch = Scratch::new(&self.sizes);
        let mut start = 0;
        while start < tokens {
            let rows = self.sizes.chunk.min(tokens - start);
            // SAFETY: `for_each_head` runs this with the tiles of a level this CPU has.
            unsafe { run_chunk::<T>(&head, start..start + rows, &mut scratch, state, output) };
            start += rows;
        }
    }
}

/// One head's inputs, row-major `[T, D]` and `[T]`, and the sizes.
struct Head<'a> {
    sizes: &'a Sizes,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    beta: &'a [f32],
    g: &'a [f32],
}

/// One chunk's work space, `C = chunk` rows (a shorter chunk uses the front of each).
struct Scratch {
    /// `[C]` running sums of the log-decays inside the chunk.
    cumulative: Vec<f32>,
    /// `[C, C]` `exp(cumulative_i - cumulative_j)` on and below the diagonal.
    decay: Vec<f32>,
    /// `[C, C]` `(I + L)⁻¹`, built in place from the keys' products.
    solve: Vec<f32>,
    /// `[C, C]` the decayed query-key products on and below the diagonal.
    within: Vec<f32>,
    /// `[DK, C]` the keys, transposed.
    keys_transposed: Vec<f32>,
    /// `[C, DK]` keys times `beta`.
    keys_beta: Vec<f32>,
    /// `[C, DK]` keys times `beta · exp(cumulative)`.
    keys_decayed: Vec<f32>,
    /// `[DK, C]` keys times the decay to the chunk's end, transposed.
    keys_to_end: Vec<f32>,
    /// `[C, DK]` queries times `exp(cumulative)`.
    queries_decayed: Vec<f32>,
    /// `[C, DK]` `(I + L)⁻¹` times the decayed keys.
    solved_keys: Vec<f32>,
    /// `[C, DV]` values times `beta`.
    values_beta: Vec<f32>,
    /// `[C, DV]` the corrections, then the chunk's new values.
    new_values: Vec<f32>,
}

impl Scratch {
    fn new(sizes: &Sizes) -> Scratch {
        let (c, dk, dv) = (sizes.chunk, sizes.dk, sizes.dv);
        Scratch {
            cumulative: vec![0.0; c],
            decay: vec![0.0; c * c],
            solve: vec![0.0; c * c],
            within: vec![0.0; c * c],
            keys_transposed: vec![0.0; dk * c],
            keys_beta: vec![0.0; c * dk],
            keys_decayed: vec![0.0; c * dk],
            keys_to_end: vec![0.0; dk * c],
            queries_decayed: vec![0.0; c * dk],
            solved_keys: vec![0.0; c * dk],
            values_beta: vec![0.0; c * dv],
            new_values: vec![0.0; c * dv],
        }
    }
}

/// One chunk of positions `span`: its outputs into `output`, `state` `[DK, DV]` carried past it.
///
/// # Safety
/// The CPU must have `T`'s instructions.
#[inline(always)]
unsafe fn run_chunk<T: Tiles>(
    head: &Head<'_>,
    span: std::ops::Range<usize>,
    s: &mut Scratch,
    state: &mut [f32],
    output: &mut [f32],
) {
    let (dk, dv, rows) = (head.sizes.dk, head.sizes.dv, span.len());
    let q = &head.q[span.start * dk..span.end * dk];
    let k = &head.k[span.start * dk..span.end * dk];
    let v = &head.v[span.start * dv..span.end * dv];
    let mut sum = 0.0f32;
    for (cumulative, &g) in s.cumulative.iter_mut().zip(&head.g[span.clone()]) {
        sum += g;
        *cumulative = sum;
    }
    let last = s.cumulative[rows - 1];
    for i in 0..rows {
        let beta = head.beta[span.start + i];
        let here = s.cumulative[i];
        let (grown, to_end) = (exp_full_range(here), exp_full_range(last - here));
        let (key, query) = (&k[i * dk..][..dk], &q[i * dk..][..dk]);
        for j in 0..dk {
            let weighted = key[j] * beta;
            s.keys_beta[i * dk + j] = weighted;
            s.keys_decayed[i * dk + j] = weighted * grown;
            s.queries_decayed[i * dk + j] = query[j] * grown;
            s.keys_transposed[j * rows + i] = key[j];
            s.keys_to_end[j * rows + i] = key[j] * to_end;
        }
        let values = s.values_beta[i * dv..][..dv].iter_mut();
        for (weighted, &value) in values.zip(&v[i * dv..][..dv]) {
            *weighted = value * beta;
        }
        let decays = s.decay[i * rows..][..=i].iter_mut();
        for (decay, &there) in decays.zip(&s.cumulative[..=i]) {
            *decay = exp_full_range(here - there);
        }
    }
    let (square, by_keys, by_values) = (rows * rows, rows * dk, rows * dv);
    for built in [
        &mut s.keys_beta[..by_keys],
        &mut s.keys_decayed[..by_keys],
        &mut s.queries_decayed[..by_keys],
        &mut s.keys_transposed[..by_keys],
        &mut s.keys_to_end[..by_keys],
        &mut s.values_beta[..by_values],
    ] {
        flush_tiny(built);
    }
    let key_columns = ValueRows::from_rows(&s.keys_transposed[..dk * rows], dk, rows);
    let replace = Landing::Replace;
    // SAFETY (every product below): the caller's level; each left operand is `m` rows of the
    // right one's row count, each destination `m` rows of its width.
    unsafe {
        multiply_rows::<T>(
            &s.keys_beta[..by_keys],
            rows,
            &key_columns,
            &mut s.solve[..square],
            replace,
        )
    };
    // A = -(kβ kᵀ ∘ decay), strictly lower; then (I + L)⁻¹ = I + X with X = A + A X, row by
    // row from the rows above (ascending `j` reads row i's entries before they change).
    for i in 0..rows {
        let row = &mut s.solve[i * rows..][..rows];
        for (entry, &decay) in row[..i].iter_mut().zip(&s.decay[i * rows..][..i]) {
            *entry = -*entry * decay;
        }
        row[i..].fill(0.0);
    }
    flush_tiny(&mut s.solve[..square]);
    for i in 2..rows {
        let (above, rest) = s.solve.split_at_mut(i * rows);
        let row = &mut rest[..rows];
        for j in 1..i {
            let coefficient = row[j];
            for (entry, &finished) in row[..j].iter_mut().zip(&above[j * rows..][..j]) {
                *entry += coefficient * finished;
            }
        }
        flush_tiny(row);
    }
    for i in 0..rows {
        s.solve[i * rows + i] = 1.0;
    }
    let solve = &s.solve[..square];
    let values_beta = ValueRows::from_rows(&s.values_beta[..by_values], rows, dv);
    let keys_decayed = ValueRows::from_rows(&s.keys_decayed[..by_keys], rows, dk);
    unsafe {
        multiply_rows::<T>(
            solve,
            rows,
            &values_beta,
            &mut s.new_values[..by_values],
            replace,
        )
    };
    unsafe {
        multiply_rows::<T>(
            solve,
            rows,
            &keys_decayed,
            &mut s.solved_keys[..by_keys],
            replace,
        )
    };
    unsafe { multiply_rows::<T>(q, rows, &key_columns, &mut s.within[..square], replace) };
    for i in 0..rows {
        let row = &mut s.within[i * rows..][..rows];
        for (entry, &decay) in row[..=i].iter_mut().zip(&s.decay[i * rows..][..=i]) {
            *entry *= decay;
        }
        row[i + 1..].fill(0.0);
    }
    flush_tiny(&mut s.within[..square]);
    flush_tiny(&mut s.solved_keys[..by_keys]);
    // The carried state: new values U - W S; outputs (q ∘ e^cum) S + within · new values;
    // S = e^last S + (k ∘ e^(last - cum))ᵀ new values.
    let carried = ValueRows::from_rows(state, dk, dv);
    let subtract = Landing::Accumulate {
        keep: 1.0,
        sign: -1.0,
    };
    unsafe {
        multiply_rows::<T>(
            &s.solved_keys[..by_keys],
            rows,
            &carried,
            &mut s.new_values[..by_values],
            subtract,
        )
    };
    let out = &mut output[span.start * dv..span.end * dv];
    unsafe { multiply_rows::<T>(&s.queries_decayed[..by_keys], rows, &carried, out, replace) };
    flush_tiny(&mut s.new_values[..by_values]);
    let new_values = ValueRows::from_rows(&s.new_values[..by_values], rows, dv);
    let add = Landing::Accumulate {
        keep: 1.0,
        sign: 1.0,
    };
    unsafe { multiply_rows::<T>(&s.within[..square], rows, &new_values, out, add) };
    let decay_state = Landing::Accumulate {
        keep: exp_full_range(last),
        sign: 1.0,
    };
    unsafe {
        multiply_rows::<T>(
            &s.keys_to_end[..dk * rows],
            dk,
            &new_values,
            state,
            decay_state,
        )
    };
    flush_tiny(state);
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, TensorData};

    use super::*;

    /// Deterministic values in `[low, low + 1)`.
    fn values(count: usize, seed: u64, low: f32) -> Vec<f32> {
        (0..count as u64)
            .map(|i| ((i * 2_654_435_761 + seed * 97) % 1000) as f32 / 1000.0 + low)
            .collect()
    }

    fn tensor<const D: usize>(values: &[f32], shape: [usize; D]) -> Tensor<D> {
        Tensor::from_data(TensorData::new(values.to_vec(), shape), &Device::default())
    }

    /// The rule one token at a time on the host, per head: `S = e^g S; S += k (β (v - Sᵀk))ᵀ;
    /// o = Sᵀ q`.
    fn stepped(sizes: [usize; 5], inputs: [&[f32]; 5], initial: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let [heads, tokens, dk, dv, _] = sizes;
        let [q, k, v, beta, g] = inputs;
        let mut state = initial.to_vec();
        let mut out = vec![0.0f32; heads * tokens * dv];
        for h in 0..heads {
            let s = &mut state[h * dk * dv..][..dk * dv];
            for t in 0..tokens {
                let at = h * tokens + t;
                s.iter_mut().for_each(|x| *x *= g[at].exp());
                let key = &k[at * dk..][..dk];
                for c in 0..dv {
                    let recalled: f32 = (0..dk).map(|r| s[r * dv + c] * key[r]).sum();
                    let correction = beta[at] * (v[at * dv + c] - recalled);
                    for r in 0..dk {
                        s[r * dv + c] += key[r] * correction;
                    }
                }
                for c in 0..dv {
                    out[at * dv + c] = (0..dk).map(|r| s[r * dv + c] * q[at * dk + r]).sum();
                }
            }
        }
        (out, state)
    }

    /// Chunks of 8 over 21 tokens (a short last chunk), odd head sizes, two sequences of three
    /// heads, a nonzero initial state, mild decays and decays strong enough (`g` down to -40 a
    /// token) that the chunk's products fall below the normal range: the kernel equals the
    /// token-by-token rule.
    #[test]
    fn chunked_kernel_equals_the_rule_token_by_token() {
        let (batch, heads, tokens, dk, dv) = (2, 3, 21, 5, 7);
        let rows = batch * heads;
        let scale = |mut x: Vec<f32>, by: f32| {
            x.iter_mut().for_each(|x| *x *= by);
            x
        };
        let q = scale(values(rows * tokens * dk, 1, -0.5), 0.6);
        let k = scale(values(rows * tokens * dk, 2, -0.5), 0.6);
        let v = values(rows * tokens * dv, 3, -0.5);
        let beta = values(rows * tokens, 4, 0.0);
        let initial = values(rows * dk * dv, 6, -0.5);
        let (q_t, k_t, v_t) = (
            tensor(&q, [batch, heads, tokens, dk]),
            tensor(&k, [batch, heads, tokens, dk]),
            tensor(&v, [batch, heads, tokens, dv]),
        );
        let beta_t = tensor(&beta, [batch, heads, tokens]);
        let initial_t = tensor(&initial, [batch, heads, dk, dv]);
        for strength in [0.4, 40.0] {
            let g = scale(values(rows * tokens, 5, -1.0), strength);
            let g_t = tensor(&g, [batch, heads, tokens]);
            let operands = DeltaRuleOperands {
                q: &q_t,
                k: &k_t,
                v: &v_t,
                beta: &beta_t,
                g: &g_t,
                initial: &initial_t,
                chunk: 8,
            };
            let (output, state) = chunked_delta_rule(&operands).expect("f32 on the CPU backend");
            let (expected, expected_state) =
                stepped([rows, tokens, dk, dv, 0], [&q, &k, &v, &beta, &g], &initial);
            let output = output.into_data().try_to_vec::<f32>().unwrap();
            let state = state.into_data().try_to_vec::<f32>().unwrap();
            assert_eq!(
                (output.len(), state.len()),
                (expected.len(), expected_state.len())
            );
            for (a, b) in output
                .iter()
                .zip(&expected)
                .chain(state.iter().zip(&expected_state))
            {
                assert!(
                    (a - b).abs() < 1e-4,
                    "{a} vs {b} at decay strength {strength}"
                );
            }
        }
    }

    /// Sizes that do not fit together, or an empty prompt, leave the work to the tensor form.
    #[test]
    fn inconsistent_or_empty_operands_are_declined() {
        let q = tensor(&values(2 * 3, 1, 0.0), [1, 1, 2, 3]);
        let v = tensor(&values(2 * 4, 2, 0.0), [1, 1, 2, 4]);
        let per_token = tensor(&values(2, 3, 0.0), [1, 1, 2]);
        let initial = tensor(&values(3 * 4, 4, 0.0), [1, 1, 3, 4]);
        let wrong_initial = tensor(&values(4 * 4, 4, 0.0), [1, 1, 4, 4]);
        let operands = |initial: &Tensor<4>, chunk| {
            chunked_delta_rule(&DeltaRuleOperands {
                q: &q,
                k: &q,
                v: &v,
                beta: &per_token,
                g: &per_token,
                initial,
                chunk,
            })
        };
        assert!(operands(&initial, 64).is_some());
        assert!(operands(&wrong_initial, 64).is_none());
        assert!(operands(&initial, 0).is_none());
    }
}

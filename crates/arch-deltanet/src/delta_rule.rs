//! The gated delta rule ("Gated Delta Networks: Improving Mamba2 with Delta Rule", Yang, Kautz
//! & Hatamizadeh, 2024), per value head with state `S` `[DK, DV]`:
//!
//! ```text
//! S_t = exp(g_t) S_{t-1};   S_t += k_t (β_t (v_t - S_tᵀ k_t))ᵀ;   o_t = S_tᵀ q_t
//! ```
//!
//! A prompt call runs the chunked form (chunks of 64, as transformers and llama.cpp do): inside
//! a chunk the corrections `β (v - Sᵀk)` of all positions are solved at once through the
//! unit-lower-triangular system `(I + L) U = β v` (the "UT transform"); between chunks the state
//! is carried. Linear in the prompt length. A decode step applies the rule once. Both leave the
//! same state.

use hookscope_core::Result;
use hookscope_core::burn::tensor::{Bool, Tensor, TensorData};
use hookscope_core::nn::{DeltaRuleOperands, chunked_delta_rule, exp, pairwise_decay};

/// The chunk length of the prompt call.
pub const CHUNK: usize = 64;

/// One call's inputs, heads first.
#[derive(Debug, Clone)]
pub struct RuleInputs {
    /// `[B, NV, T, DK]` queries: L2-normalised, scaled by `1/sqrt(DK)`.
    pub q: Tensor<4>,
    /// `[B, NV, T, DK]` keys: L2-normalised.
    pub k: Tensor<4>,
    /// `[B, NV, T, DV]` values.
    pub v: Tensor<4>,
    /// `[B, NV, T]` write strengths `β` in (0, 1).
    pub beta: Tensor<3>,
    /// `[B, NV, T]` log-decays `g` ≤ 0.
    pub g: Tensor<3>,
}

/// The chunked rule from `initial` `[B, NV, DK, DV]`: outputs `[B, NV, T, DV]` and the state
/// after the last token. Chunks hold [`CHUNK`] tokens, or all of them when there are fewer
/// (the chunk length changes nothing but rounding). On the CPU backend (without gradients) it
/// runs core's fused kernel, elsewhere [`chunked_tensors`].
pub fn chunked(inputs: RuleInputs, initial: Tensor<4>) -> Result<(Tensor<4>, Tensor<4>)> {
    let fused = chunked_delta_rule(&DeltaRuleOperands {
        q: &inputs.q,
        k: &inputs.k,
        v: &inputs.v,
        beta: &inputs.beta,
        g: &inputs.g,
        initial: &initial,
        chunk: CHUNK,
    });
    match fused {
        Some(result) => Ok(result),
        None => chunked_tensors(inputs, initial),
    }
}

/// [`chunked`] as tensor operations, on any backend and under autodiff.
fn chunked_tensors(inputs: RuleInputs, initial: Tensor<4>) -> Result<(Tensor<4>, Tensor<4>)> {
    let RuleInputs { q, k, v, beta, g } = inputs;
    let [batch, heads, tokens, _] = q.dims();
    let chunk = CHUNK.min(tokens).max(1);
    let chunks = tokens.div_ceil(chunk);
    let padded = chunks * chunk;
    // Padding positions have zero keys, values and log-decay: they change nothing.
    let pad = |t: Tensor<4>| -> Tensor<5> {
        let [batch, heads, _, width] = t.dims();
        let t = if padded == tokens {
            t
        } else {
            let zeros = Tensor::zeros([batch, heads, padded - tokens, width], &t.device());
            Tensor::cat(vec![t, zeros], 2)
        };
        t.reshape([batch, heads, chunks, chunk, width])
    };
    let per_position = |t: Tensor<3>| -> Tensor<4> {
        pad(t.unsqueeze_dim::<4>(3)).reshape([batch, heads, chunks, chunk])
    };
    let beta = per_position(beta).unsqueeze_dim::<5>(4);
    let g = per_position(g);
    let (q, k, v) = (pad(q), pad(k), pad(v));
    let k_beta = k.clone() * beta.clone();
    let v_beta = v * beta;
    let cumulative = g.cumsum(3);
    let decay = pairwise_decay(cumulative.clone());
    let device = k.device();
    let strictly_lower = |t: Tensor<5>| -> Tensor<5> {
        let on_or_above: Tensor<5, Bool> =
            Tensor::<2, Bool>::tril_mask([chunk, chunk], -1, &device)
                .unsqueeze::<5>()
                .expand(t.dims());
        t.mask_fill(on_or_above, 0.0)
    };
    let lower = strictly_lower(k_beta.clone().matmul(k.clone().swap_dims(3, 4)) * decay.clone());
    let solve = match lower.is_autodiff() {
        true => unit_lower_inverse_tracked(lower),
        false => unit_lower_inverse(lower)?,
    };
    let corrections = solve.clone().matmul(v_beta);
    let decayed_keys = solve.matmul(k_beta * exp(cumulative.clone()).unsqueeze_dim::<5>(4));
    let within = q.clone().matmul(k.clone().swap_dims(3, 4)) * decay;
    let q_decayed = q * exp(cumulative.clone()).unsqueeze_dim::<5>(4);
    let chunk_total = cumulative.clone().slice_dim(3, chunk - 1..chunk);
    let k_to_end = k * exp(chunk_total.clone() - cumulative).unsqueeze_dim::<5>(4);
    let chunk_decay = exp(chunk_total);

    let at = |t: &Tensor<5>, n: usize| -> Tensor<4> {
        let [batch, heads, _, rows, cols] = t.dims();
        t.clone()
            .slice_dim(2, n..n + 1)
            .reshape([batch, heads, rows, cols])
    };
    let mut state = initial;
    let mut outputs = Vec::with_capacity(chunks);
    for n in 0..chunks {
        let new_values = at(&corrections, n) - at(&decayed_keys, n).matmul(state.clone());
        outputs.push(
            at(&q_decayed, n).matmul(state.clone()) + at(&within, n).matmul(new_values.clone()),
        );
        let decay = chunk_decay
            .clone()
            .slice_dim(2, n..n + 1)
            .reshape([batch, heads, 1, 1]);
        state = state * decay + at(&k_to_end, n).swap_dims(2, 3).matmul(new_values);
    }
    let output = Tensor::cat(outputs, 2).slice_dim(2, 0..tokens);
    Ok((output, state))
}

/// `(I + L)⁻¹` for strictly lower-triangular `L` `[..., C, C]`, by forward substitution one row
/// at a time (row `i` from the rows above it), as transformers' fallback computes it. The
/// `C³/6` multiply-adds per matrix run as plain loops over the host copy: as tensor operations
/// they would be `C` rounds of slicing and re-assembling the whole batch of matrices.
fn unit_lower_inverse(lower: Tensor<5>) -> Result<Tensor<5>> {
    let dims = lower.dims();
    let size = dims[4];
    let device = lower.device();
    let mut values = lower.into_data().convert::<f32>().try_into_vec::<f32>()?;
    for matrix in values.chunks_mut(size * size) {
        // A = -L; then row i becomes A[i] + A[i] @ X[:i] over the finished rows above it.
        for value in matrix.iter_mut() {
            *value = -*value;
        }
        for i in 1..size {
            let (above, rest) = matrix.split_at_mut(i * size);
            let row = &mut rest[..size];
            let original: Vec<f32> = row[..i].to_vec();
            for (k, a_ik) in original.iter().enumerate().skip(1) {
                let finished = &above[k * size..k * size + k];
                for (value, x_kj) in row[..k].iter_mut().zip(finished) {
                    *value += a_ik * x_kj;
                }
            }
        }
        for i in 0..size {
            matrix[i * size + i] = 1.0;
        }
    }
    Ok(Tensor::from_data(TensorData::new(values, dims), &device))
}

/// [`unit_lower_inverse`] as tensor operations, for a run that takes gradients through it
/// (the host copy would cut the graph): with `A = -L`, the strictly lower part `S` of the
/// inverse solves `S = A + A S`, so row `i` is `A[i] + A[i, :i] @ S[:i]` over the rows above it.
fn unit_lower_inverse_tracked(lower: Tensor<5>) -> Tensor<5> {
    let size = lower.dims()[4];
    let device = lower.device();
    let negated = lower.neg();
    let row = |i: usize| negated.clone().slice_dim(3, i..i + 1);
    let mut rows = vec![row(0)];
    for i in 1..size {
        let above = Tensor::cat(rows.clone(), 3);
        let coefficients = row(i).slice_dim(4, 0..i);
        rows.push(row(i) + coefficients.matmul(above));
    }
    let identity: Tensor<5> = Tensor::<2>::eye(size, &device)
        .unsqueeze::<5>()
        .expand(negated.dims());
    Tensor::cat(rows, 3) + identity
}

/// One token's update of `state` `[B, NV, DK, DV]` (inputs with `T = 1`; `q` is not read).
pub fn step(inputs: &RuleInputs, state: Tensor<4>) -> Tensor<4> {
    let [batch, heads, _, _] = inputs.k.dims();
    let decay = inputs.g.clone().exp().reshape([batch, heads, 1, 1]);
    let state = state * decay;
    let beta = inputs.beta.clone().reshape([batch, heads, 1, 1]);
    // [B, NV, 1, DV]: what the state recalls for this key, and the correction toward v.
    let recalled = inputs.k.clone().matmul(state.clone());
    let correction = (inputs.v.clone() - recalled) * beta;
    state + inputs.k.clone().swap_dims(2, 3).matmul(correction)
}

/// A decode step's outputs read from `state` with queries `q` `[B, NV, 1, DK]`: `[B, NV, 1, DV]`.
pub fn read_out(state: &Tensor<4>, q: &Tensor<4>) -> Tensor<4> {
    q.clone().matmul(state.clone())
}

#[cfg(test)]
mod tests {
    use hookscope_core::burn::tensor::Device;

    use super::*;

    /// Deterministic values in [-0.5, 0.5).
    fn values<const D: usize>(shape: [usize; D], seed: u64) -> Tensor<D> {
        let count = shape.iter().product::<usize>() as u64;
        let values: Vec<f32> = (0..count)
            .map(|i| ((i * 2_654_435_761 + seed * 97) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        Tensor::from_data(TensorData::new(values, shape), &Device::default())
    }

    fn l2_normalised(x: Tensor<4>) -> Tensor<4> {
        let norm = x.clone().powi_scalar(2).sum_dim(3).sqrt();
        x / norm
    }

    /// A chunked prefill longer than one chunk (and not a multiple of it) equals the same
    /// tokens one step at a time: outputs and final state, from a nonzero initial state, through
    /// the fused kernel and the tensor form alike.
    #[test]
    fn chunked_prefill_equals_token_by_token_steps() {
        let (batch, heads, tokens, dk, dv) = (2, 3, CHUNK + 9, 4, 5);
        let inputs = RuleInputs {
            q: l2_normalised(values([batch, heads, tokens, dk], 1)) * 0.5,
            k: l2_normalised(values([batch, heads, tokens, dk], 2)),
            v: values([batch, heads, tokens, dv], 3),
            beta: values([batch, heads, tokens], 4) + 0.5,
            g: (values([batch, heads, tokens], 5) - 0.6) * 0.5,
        };
        let initial = values([batch, heads, dk, dv], 6);
        let at = |t: &Tensor<4>, i: usize| t.clone().slice_dim(2, i..i + 1);
        let at3 = |t: &Tensor<3>, i: usize| t.clone().slice_dim(2, i..i + 1);
        let mut state = initial.clone();
        let mut outputs = Vec::new();
        for i in 0..tokens {
            let one = RuleInputs {
                q: at(&inputs.q, i),
                k: at(&inputs.k, i),
                v: at(&inputs.v, i),
                beta: at3(&inputs.beta, i),
                g: at3(&inputs.g, i),
            };
            state = step(&one, state);
            outputs.push(read_out(&state, &one.q));
        }
        let stepped = Tensor::cat(outputs, 2)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let stepped_state = state.into_data().try_to_vec::<f32>().unwrap();
        for form in [chunked, chunked_tensors] {
            let (output, state) = form(inputs.clone(), initial.clone()).unwrap();
            let output = output.into_data().try_to_vec::<f32>().unwrap();
            let state = state.into_data().try_to_vec::<f32>().unwrap();
            for (a, b) in output
                .iter()
                .zip(&stepped)
                .chain(state.iter().zip(&stepped_state))
            {
                assert!((a - b).abs() < 1e-4, "{a} vs {b}");
            }
        }
    }
}

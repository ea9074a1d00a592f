//! The scan of Mamba-2's state-space model, per head `h` with state `S_h` `[P, N]`:
//!
//! ```text
//! S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_tᵀ        y_t = S_t C_t
//! ```
//!
//! A prompt call runs the chunked state-space-duality form ("Transformers are SSMs", Dao & Gu,
//! 2024, §6): inside a chunk the quadratic "attention-like" form, between chunks the
//! recurrence on the chunk states, so the cost grows linearly with the prompt. A decode step
//! runs the recurrence once. Both leave the same state.

use hookscope_core::burn::tensor::Tensor;
use hookscope_core::nn::{SsdOperands, chunked_ssd, decay_matrix};

/// One call's scan inputs.
#[derive(Debug, Clone)]
pub struct ScanInputs {
    /// `[B, T, H, P]` inputs.
    pub x: Tensor<4>,
    /// `[B, T, H]` step sizes (after softplus).
    pub dt: Tensor<3>,
    /// `[H]` continuous decay rates (`-exp(A_log)`).
    pub a: Tensor<1>,
    /// `[B, T, G, N]` input projections, one per group of `H / G` consecutive heads.
    pub b: Tensor<4>,
    /// `[B, T, G, N]` output projections, one per group.
    pub c: Tensor<4>,
}

/// `[B, G, ..., X]` per group → `[B, H, ..., X]` per head (each group's heads are consecutive).
fn per_head<const D: usize, const E: usize>(grouped: Tensor<D>, heads: usize) -> Tensor<D> {
    let dims = grouped.dims();
    let groups = dims[1];
    if groups == heads {
        return grouped;
    }
    let mut split = [1; E];
    split[0] = dims[0];
    split[1] = groups;
    split[3..].copy_from_slice(&dims[2..]);
    let mut expanded = split;
    expanded[2] = heads / groups;
    let mut merged = dims;
    merged[1] = heads;
    grouped.reshape(split).expand(expanded).reshape(merged)
}

/// The chunked scan from `initial` `[B, H, P, N]`: the outputs `y` `[B, T, H, P]` (without the
/// `D` skip) and the state after the last token. Chunks hold `chunk` tokens, or all of them
/// when there are fewer (the chunk length changes nothing but rounding, and a prompt shorter
/// than one chunk is not padded to a whole one).
///
/// `B` and `C` are used per group: the heads of a group are stacked along the head dimension
/// (`[.., heads per group * P]`), so no per-head copy of them is made. On the CPU backend
/// (without gradients) it runs core's fused kernel, elsewhere [`chunked_tensors`].
pub fn chunked(inputs: ScanInputs, initial: Tensor<4>, chunk: usize) -> (Tensor<4>, Tensor<4>) {
    let fused = chunked_ssd(&SsdOperands {
        x: &inputs.x,
        dt: &inputs.dt,
        a: &inputs.a,
        b: &inputs.b,
        c: &inputs.c,
        initial: &initial,
        chunk,
    });
    match fused {
        Some(result) => result,
        None => chunked_tensors(inputs, initial, chunk),
    }
}

/// [`chunked`] as tensor operations, on any backend and under autodiff.
fn chunked_tensors(inputs: ScanInputs, initial: Tensor<4>, chunk: usize) -> (Tensor<4>, Tensor<4>) {
    let ScanInputs { x, dt, a, b, c } = inputs;
    let [batch, tokens, heads, head_dim] = x.dims();
    let [_, _, groups, state_size] = b.dims();
    let per_group = heads / groups;
    let chunk = chunk.min(tokens).max(1);
    let chunks = tokens.div_ceil(chunk);
    let padded = chunks * chunk;
    // Padding positions carry zero input and zero decay: they leave the state unchanged.
    let pad_time = |t: Tensor<4>| -> Tensor<4> {
        let [batch, _, parts, width] = t.dims();
        if padded == tokens {
            return t;
        }
        let zeros = Tensor::zeros([batch, padded - tokens, parts, width], &t.device());
        Tensor::cat(vec![t, zeros], 1)
    };
    // [B, T, parts, X] → [B, parts, chunks, chunk, X].
    let to_chunks = |t: Tensor<4>| -> Tensor<5> {
        let [_, _, parts, width] = t.dims();
        pad_time(t)
            .reshape([batch, chunks, chunk, parts, width])
            .permute([0, 3, 1, 2, 4])
    };
    // Per head, and per group with the group's heads side by side.
    let xdt = x * dt.clone().unsqueeze_dim::<4>(3);
    let xdt_grouped = to_chunks(
        xdt.clone()
            .reshape([batch, tokens, groups, per_group * head_dim]),
    );
    let xdt = to_chunks(xdt);
    let b = to_chunks(b);
    let c = to_chunks(c);
    // [B, H, chunks, chunk]: log-decay per position and its running sum inside each chunk.
    let log_decay: Tensor<4> = to_chunks((dt * a.unsqueeze::<3>()).unsqueeze_dim::<4>(3))
        .reshape([batch, heads, chunks, chunk]);
    let cumulative = log_decay.clone().cumsum(3);
    // `[B, H, chunks, chunk]` per head → `[B, G, chunks, chunk, heads per group, 1]`, to scale
    // the grouped layout head by head.
    let per_grouped_head = |t: Tensor<4>| -> Tensor<6> {
        t.reshape([batch, groups, per_group, chunks, chunk])
            .permute([0, 1, 3, 4, 2])
            .unsqueeze_dim::<6>(5)
    };

    // Inside each chunk: y_l = Σ_{s ≤ l} (C_l · B_s) decay(s → l) xdt_s.
    let products = c
        .clone()
        .matmul(b.clone().swap_dims(3, 4))
        .unsqueeze_dim::<6>(2);
    let scores = (decay_matrix(log_decay)
        .reshape([batch, groups, per_group, chunks, chunk, chunk])
        * products)
        .reshape([batch, heads, chunks, chunk, chunk]);
    let y_diagonal = scores.matmul(xdt);

    // What each chunk adds to the state, decayed to the chunk's end: [B, G, chunks, hP, N].
    let chunk_total = cumulative.clone().slice_dim(3, chunk - 1..chunk);
    let to_end = per_grouped_head((chunk_total.clone() - cumulative.clone()).exp());
    let weighted = (xdt_grouped.reshape([batch, groups, chunks, chunk, per_group, head_dim])
        * to_end)
        .reshape([batch, groups, chunks, chunk, per_group * head_dim]);
    let chunk_states = weighted.swap_dims(3, 4).matmul(b);

    // Between chunks: the recurrence on chunk states, keeping the state entering each chunk.
    let chunk_decay = chunk_total.exp();
    let mut state = initial;
    let mut entering = Vec::with_capacity(chunks);
    for k in 0..chunks {
        entering.push(
            state
                .clone()
                .reshape([batch, groups, 1, per_group * head_dim, state_size]),
        );
        let decay = chunk_decay
            .clone()
            .slice_dim(2, k..k + 1)
            .reshape([batch, heads, 1, 1]);
        let added = chunk_states
            .clone()
            .slice_dim(2, k..k + 1)
            .reshape([batch, heads, head_dim, state_size]);
        state = state * decay + added;
    }
    // The entering state's contribution: y_l += (C_l · S_in) exp(cumulative_l).
    let y_carried = c.matmul(Tensor::cat(entering, 2).swap_dims(3, 4));
    let y_carried = y_carried.reshape([batch, groups, chunks, chunk, per_group, head_dim])
        * per_grouped_head(cumulative.exp());

    let y_diagonal = y_diagonal
        .permute([0, 2, 3, 1, 4])
        .reshape([batch, padded, heads, head_dim]);
    let y_carried = y_carried
        .permute([0, 2, 3, 1, 4, 5])
        .reshape([batch, padded, heads, head_dim]);
    let y = (y_diagonal + y_carried).slice_dim(1, 0..tokens);
    (y, state)
}

/// One token's update of `state` `[B, H, P, N]` (inputs with `T = 1`; `c` is not read).
pub fn step(inputs: &ScanInputs, state: Tensor<4>) -> Tensor<4> {
    let [batch, _, heads, head_dim] = inputs.x.dims();
    let dt = inputs.dt.clone().reshape([batch, heads]);
    let decay = (dt.clone() * inputs.a.clone().unsqueeze::<2>())
        .exp()
        .reshape([batch, heads, 1, 1]);
    let xdt = inputs.x.clone().reshape([batch, heads, head_dim]) * dt.unsqueeze_dim::<3>(2);
    let b = per_head::<4, 5>(inputs.b.clone().swap_dims(1, 2), heads);
    state * decay + xdt.unsqueeze_dim::<4>(3) * b
}

/// A decode step's outputs read from `state` `[B, H, P, N]` with `c` `[B, 1, G, N]`: `y`
/// `[B, 1, H, P]`.
pub fn read_out(state: &Tensor<4>, c: &Tensor<4>) -> Tensor<4> {
    let [batch, heads, head_dim, state_size] = state.dims();
    let c =
        per_head::<4, 5>(c.clone().swap_dims(1, 2), heads).reshape([batch, heads, state_size, 1]);
    state.clone().matmul(c).reshape([batch, 1, heads, head_dim])
}

#[cfg(test)]
mod tests {
    use hookscope_core::burn::tensor::{Device, TensorData};

    use super::*;

    /// Deterministic values in [-0.5, 0.5).
    fn random<const D: usize>(shape: [usize; D], seed: u64) -> Tensor<D> {
        let count = shape.iter().product::<usize>() as u64;
        let values: Vec<f32> = (0..count)
            .map(|i| ((i * 2_654_435_761 + seed * 97) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        Tensor::from_data(TensorData::new(values, shape), &Device::default())
    }

    /// Six heads in two groups of three.
    fn inputs(tokens: usize) -> ScanInputs {
        let (batch, heads, groups, head_dim, state) = (2, 6, 2, 4, 5);
        ScanInputs {
            x: random([batch, tokens, heads, head_dim], 1),
            dt: random([batch, tokens, heads], 2) + 0.6,
            a: random([heads], 3) - 0.5,
            b: random([batch, tokens, groups, state], 4),
            c: random([batch, tokens, groups, state], 5),
        }
    }

    fn slice_time<const D: usize>(t: &Tensor<D>, at: usize) -> Tensor<D> {
        t.clone().slice_dim(1, at..at + 1)
    }

    /// A chunked prefill of T tokens, for chunk sizes that do and do not divide T, equals T
    /// one-token steps: the same outputs and the same final state, through the fused kernel and
    /// the tensor form alike, with decaying rates, with one head's rate growing (an edited
    /// input: the kernel then computes every decay of a chunk) and with decays strong enough
    /// that the kernel skips a chunk's earlier positions.
    #[test]
    fn chunked_prefill_equals_token_by_token_steps() {
        let tokens = 11;
        let decaying = inputs(tokens);
        let growing = ScanInputs {
            a: Tensor::cat(
                vec![
                    Tensor::from_floats([0.3], &decaying.a.device()),
                    decaying.a.clone().slice_dim(0, 1..6),
                ],
                0,
            ),
            ..decaying.clone()
        };
        // Step sizes of 4-44: log-decays down to -44 a token, so a chunk's earlier positions
        // fall below the kernel's cut-off (`2^-60`) and are skipped.
        let strong = ScanInputs {
            dt: decaying.dt.clone() * 40.0,
            ..decaying.clone()
        };
        let initial = random([2, 6, 4, 5], 6);
        for all in [decaying, growing, strong] {
            let mut state = initial.clone();
            let mut outputs = Vec::new();
            for t in 0..tokens {
                let one = ScanInputs {
                    x: slice_time(&all.x, t),
                    dt: slice_time(&all.dt, t),
                    a: all.a.clone(),
                    b: slice_time(&all.b, t),
                    c: slice_time(&all.c, t),
                };
                state = step(&one, state);
                outputs.push(read_out(&state, &one.c));
            }
            let stepped = Tensor::cat(outputs, 1)
                .into_data()
                .try_to_vec::<f32>()
                .unwrap();
            let stepped_state = state.into_data().try_to_vec::<f32>().unwrap();
            let forms = [chunked, chunked_tensors];
            for (chunk, form) in [1, 4, 11, 16]
                .into_iter()
                .flat_map(|c| forms.map(|f| (c, f)))
            {
                let (y, state) = form(all.clone(), initial.clone(), chunk);
                let y = y.into_data().try_to_vec::<f32>().unwrap();
                let state = state.into_data().try_to_vec::<f32>().unwrap();
                for (a, b) in y
                    .iter()
                    .zip(&stepped)
                    .chain(state.iter().zip(&stepped_state))
                {
                    let tolerance = 1e-5 * b.abs().max(1.0);
                    assert!((a - b).abs() < tolerance, "chunk {chunk}: {a} vs {b}");
                }
            }
        }
    }
}

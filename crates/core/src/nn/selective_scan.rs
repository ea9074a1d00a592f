//! The selective scan of Mamba's S6 layer ("Mamba: Linear-Time Sequence Modeling with Selective
//! State Spaces", Gu & Dao, 2023), over a prompt: for every channel `e` and state index `n`,
//!
//! ```text
//! h_t[e, n] = exp(dt_t[e] A[e, n]) h_(t-1)[e, n] + dt_t[e] x_t[e] B_t[n]
//! y_t[e]    = sum_n h_t[e, n] C_t[n]
//! ```
//!
//! On the CPU backend the fused kernel `cpu::selective_scan` keeps the states in registers
//! through every position; elsewhere the same recurrence runs as burn tensor operations,
//! position by position.

use burn::tensor::Tensor;

use super::exp;
use crate::cpu::{self, ScanOperands};

/// One prompt's scan inputs, all per position.
#[derive(Debug, Clone)]
pub struct ScanInputs {
    /// Step sizes `[B, T, E]` (after the softplus).
    pub dt: Tensor<3>,
    /// Inputs `[B, T, E]`.
    pub x: Tensor<3>,
    /// Input projections `[B, T, N]`.
    pub b: Tensor<3>,
    /// Output projections `[B, T, N]`.
    pub c: Tensor<3>,
}

/// Scans `inputs` from the states `initial` `[B, E, N]` with the (negative) state matrix `a`
/// `[E, N]`: the outputs `y` `[B, T, E]` and the states after the last position.
pub fn selective_scan(
    inputs: &ScanInputs,
    a: &Tensor<2>,
    initial: Tensor<3>,
) -> (Tensor<3>, Tensor<3>) {
    let operands = ScanOperands {
        dt: &inputs.dt,
        x: &inputs.x,
        b: &inputs.b,
        c: &inputs.c,
        a,
        initial: &initial,
    };
    match cpu::selective_scan(&operands) {
        Some(result) => result,
        None => stepwise(inputs, a, initial),
    }
}

/// One position's update of the states `[B, E, N]`, `h = exp(dt A) h + dt x B`, from the
/// position's step sizes and inputs `[B, E]` and input projection `[B, N]`: a decode step, and
/// each position of the scan on backends without the fused pass.
pub fn selective_step(
    dt: Tensor<2>,
    x: Tensor<2>,
    b: Tensor<2>,
    a: &Tensor<2>,
    state: Tensor<3>,
) -> Tensor<3> {
    let [batch, e] = dt.dims();
    let n = a.dims()[1];
    let dt = dt.reshape([batch, e, 1]);
    let decay = exp(dt.clone() * a.clone().unsqueeze::<3>());
    let update = dt * x.reshape([batch, e, 1]) * b.reshape([batch, 1, n]);
    decay * state + update
}

/// A position's outputs `[B, E]`: the states `[B, E, N]` read through its output projection
/// `c` `[B, N]`.
pub fn selective_readout(state: &Tensor<3>, c: Tensor<2>) -> Tensor<2> {
    let [batch, e, n] = state.dims();
    state
        .clone()
        .matmul(c.reshape([batch, n, 1]))
        .reshape([batch, e])
}

/// The recurrence as tensor operations, one position at a time (any backend).
fn stepwise(inputs: &ScanInputs, a: &Tensor<2>, initial: Tensor<3>) -> (Tensor<3>, Tensor<3>) {
    let [batch, tokens, _] = inputs.dt.dims();
    let at = |x: &Tensor<3>, t: usize| {
        let width = x.dims()[2];
        x.clone().slice_dim(1, t..t + 1).reshape([batch, width])
    };
    let mut state = initial;
    let mut outputs = Vec::with_capacity(tokens);
    for t in 0..tokens {
        let (dt, x, b) = (at(&inputs.dt, t), at(&inputs.x, t), at(&inputs.b, t));
        state = selective_step(dt, x, b, a, state);
        outputs.push(selective_readout(&state, at(&inputs.c, t)).unsqueeze_dim::<3>(1));
    }
    (Tensor::cat(outputs, 1), state)
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, Distribution};

    use super::*;

    /// The fused pass computes what the step-by-step tensor operations compute, on a batch of
    /// two, a channel count that is not a multiple of the task size, and several state sizes.
    #[test]
    fn the_fused_scan_matches_the_stepwise_one() {
        let device = Device::default();
        for (batch, tokens, e, n) in [(2, 37, 21, 16), (1, 1, 16, 4), (3, 5, 40, 3)] {
            let uniform = |shape: [usize; 3], low: f64, high: f64| {
                Tensor::<3>::random(shape, Distribution::Uniform(low, high), &device)
            };
            let inputs = ScanInputs {
                dt: uniform([batch, tokens, e], 0.0, 1.5),
                x: uniform([batch, tokens, e], -2.0, 2.0),
                b: uniform([batch, tokens, n], -1.0, 1.0),
                c: uniform([batch, tokens, n], -1.0, 1.0),
            };
            let a = Tensor::<2>::random([e, n], Distribution::Uniform(-3.0, -0.1), &device);
            let initial = uniform([batch, e, n], -1.0, 1.0);
            let operands = ScanOperands {
                dt: &inputs.dt,
                x: &inputs.x,
                b: &inputs.b,
                c: &inputs.c,
                a: &a,
                initial: &initial,
            };
            let (y, last) = cpu::selective_scan(&operands).expect("flex tensors");
            let (y_ref, last_ref) = stepwise(&inputs, &a, initial);
            let read = |t: Tensor<3>| t.into_data().try_to_vec::<f32>().unwrap();
            for (got, expected) in [(read(y), read(y_ref)), (read(last), read(last_ref))] {
                assert_eq!(got.len(), expected.len());
                for (g, x) in got.iter().zip(&expected) {
                    assert!((g - x).abs() <= 1e-5 * (1.0 + x.abs()), "{g} vs {x}");
                }
            }
        }
    }
}

//! The selective scan of Mamba's S6 layer ("Mamba: Linear-Time Sequence Modeling with Selective
//! State Spaces", Gu & Dao, 2023), over a prompt: for every channel `e` and state index `n`,
//!
//! ```text
//! h_t[e, n] = exp(dt_t[e] A[e, n]) h_(t-1)[e, n] + dt_t[e] x_t[e] B_t[n]
//! y_t[e]    = sum_n h_t[e, n] C_t[n]
//! ```
//!
//! On the CPU (`flex`) backend one fused pass per channel keeps the channel's `N` states in
//! registers through every position: the `[B, T, E, N]` decays and updates are never formed
//! (two arrays of ~100 MB per layer at 1024 tokens on Mamba-130m), and the exponential is the
//! vectorised one of `fastmath`. Elsewhere the same recurrence runs as burn tensor operations,
//! position by position.

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::tensor::{Tensor, TensorData};
use multiversion::multiversion;
use rayon::prelude::*;

use super::fastmath::{exp, exp_full_range};
use super::flex::f32_primitive;

/// Channels one task scans together, one per vector lane.
const LANES: usize = 16;

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
    match fused(inputs, a, &initial) {
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

/// The fused CPU pass, when every operand lives on the `flex` backend as f32.
fn fused(
    inputs: &ScanInputs,
    a: &Tensor<2>,
    initial: &Tensor<3>,
) -> Option<(Tensor<3>, Tensor<3>)> {
    let [batch, tokens, e] = inputs.dt.dims();
    let n = a.dims()[1];
    let dense = |tensor: FlexTensor| tensor.to_contiguous();
    let dt = dense(f32_primitive(&inputs.dt)?);
    let x = dense(f32_primitive(&inputs.x)?);
    let b = dense(f32_primitive(&inputs.b)?);
    let c = dense(f32_primitive(&inputs.c)?);
    let a_values = dense(f32_primitive(a)?);
    let start = dense(f32_primitive(initial)?);
    let operands = Operands {
        dt: dt.as_slice::<f32>()?,
        x: x.as_slice::<f32>()?,
        b: b.as_slice::<f32>()?,
        c: c.as_slice::<f32>()?,
        a: a_values.as_slice::<f32>()?,
        tokens,
        channels: e,
        states: n,
    };
    let mut states = start.as_slice::<f32>()?.to_vec();
    // One task per sequence and block of `LANES` channels; each writes its outputs as
    // `[T, LANES]`, gathered into `[B, T, E]` at the end.
    let blocks = e.div_ceil(LANES);
    let mut outputs = vec![0.0f32; batch * blocks * tokens * LANES];
    let mut tasks: Vec<(usize, &mut [f32], &mut [f32])> = Vec::with_capacity(batch * blocks);
    let mut rest = states.as_mut_slice();
    for (index, output) in outputs.chunks_exact_mut(tokens * LANES).enumerate() {
        let width = LANES.min(e - index % blocks * LANES);
        let (mine, later) = rest.split_at_mut(width * n);
        rest = later;
        tasks.push((index, mine, output));
    }
    tasks.into_par_iter().for_each(|(index, states, output)| {
        let block = Block {
            sequence: index / blocks,
            first: index % blocks * LANES,
        };
        scan_block(&operands, &block, states, output);
    });
    let mut y = vec![0.0f32; batch * tokens * e];
    for (index, output) in outputs.chunks_exact(tokens * LANES).enumerate() {
        let (sequence, first) = (index / blocks, index % blocks * LANES);
        let width = LANES.min(e - first);
        for (t, lanes) in output.chunks_exact(LANES).enumerate() {
            y[(sequence * tokens + t) * e + first..][..width].copy_from_slice(&lanes[..width]);
        }
    }
    let tensor = |values: Vec<f32>, shape: [usize; 3]| {
        Tensor::from_primitive::<Flex>(FlexTensor::from_data(TensorData::new(values, shape)))
    };
    Some((tensor(y, [batch, tokens, e]), tensor(states, [batch, e, n])))
}

/// Dense operands of one scan, row-major as their tensors.
struct Operands<'a> {
    dt: &'a [f32],
    x: &'a [f32],
    b: &'a [f32],
    c: &'a [f32],
    a: &'a [f32],
    tokens: usize,
    channels: usize,
    states: usize,
}

/// The channels one task scans: `first..first + LANES` (fewer at the end) of `sequence`.
struct Block {
    sequence: usize,
    first: usize,
}

/// Scans one block of channels, a channel per lane, so that every operation is one vector
/// operation over the block: `states` holds the block's `[width, N]` states (updated in place),
/// `output` receives `[T, LANES]` outputs (lanes past the block's width are left unspecified).
#[multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma"))]
fn scan_block<'a>(operands: &Operands<'a>, block: &Block, states: &mut [f32], output: &mut [f32]) {
    let (tokens, e, n) = (operands.tokens, operands.channels, operands.states);
    let width = states.len() / n.max(1);
    // The block's states and state matrix, transposed to `[N, LANES]`; lanes past the width
    // stay zero.
    let mut h = vec![[0.0f32; LANES]; n];
    let mut a = vec![[0.0f32; LANES]; n];
    for lane in 0..width {
        for k in 0..n {
            h[k][lane] = states[lane * n + k];
            a[k][lane] = operands.a[(block.first + lane) * n + k];
        }
    }
    for (t, y) in output.chunks_exact_mut(LANES).enumerate() {
        let row = block.sequence * tokens + t;
        let mut dt = [0.0f32; LANES];
        let mut dt_x = [0.0f32; LANES];
        let channels = row * e + block.first..row * e + block.first + width;
        dt[..width].copy_from_slice(&operands.dt[channels.clone()]);
        dt_x[..width].copy_from_slice(&operands.x[channels]);
        for (dt_x, dt) in dt_x.iter_mut().zip(&dt) {
            *dt_x *= dt;
        }
        let mut sums = [0.0f32; LANES];
        let (b, c) = (&operands.b[row * n..][..n], &operands.c[row * n..][..n]);
        for (((h, a), &b), &c) in h.iter_mut().zip(&a).zip(b).zip(c) {
            for lane in 0..LANES {
                h[lane] = exp_full_range(dt[lane] * a[lane]) * h[lane] + dt_x[lane] * b;
                sums[lane] += h[lane] * c;
            }
        }
        y.copy_from_slice(&sums);
    }
    for lane in 0..width {
        for k in 0..n {
            states[lane * n + k] = h[k][lane];
        }
    }
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
            let (y, last) = fused(&inputs, &a, &initial).expect("flex tensors");
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

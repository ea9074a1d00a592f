//! The fused selective scan of Mamba's S6 layer over a prompt (the recurrence is written out in
//! `nn::selective_scan`, which falls back to burn's operations where this kernel does not apply).
//!
//! One fused pass per block of channels keeps each channel's `N` states in registers through
//! every position: the `[B, T, E, N]` decays and updates are never formed (two arrays of ~100 MB
//! per layer at 1024 tokens on Mamba-130m), and the exponential is the vectorised one of
//! `elementwise`.

use burn::tensor::Tensor;
use rayon::prelude::*;

use super::elementwise::exp_full_range;
use super::host::{dense_f32, from_host};
use super::isa::per_vector_level;

/// Channels one task scans together, one per vector lane.
const LANES: usize = 16;

/// The operands of one scan: per position the step sizes `dt` and inputs `x` `[B, T, E]` and
/// the projections `b`, `c` `[B, T, N]`; the (negative) state matrix `a` `[E, N]`; the states
/// `initial` `[B, E, N]` before the first position.
pub(crate) struct ScanOperands<'a> {
    pub(crate) dt: &'a Tensor<3>,
    pub(crate) x: &'a Tensor<3>,
    pub(crate) b: &'a Tensor<3>,
    pub(crate) c: &'a Tensor<3>,
    pub(crate) a: &'a Tensor<2>,
    pub(crate) initial: &'a Tensor<3>,
}

/// The scan's outputs `y` `[B, T, E]` and the states after the last position `[B, E, N]`, in
/// one fused pass; `None` unless every operand lives on the CPU backend as f32.
pub(crate) fn selective_scan(operands: &ScanOperands<'_>) -> Option<(Tensor<3>, Tensor<3>)> {
    let [batch, tokens, e] = operands.dt.dims();
    let n = operands.a.dims()[1];
    let dt = dense_f32(operands.dt)?;
    let x = dense_f32(operands.x)?;
    let b = dense_f32(operands.b)?;
    let c = dense_f32(operands.c)?;
    let a_values = dense_f32(operands.a)?;
    let start = dense_f32(operands.initial)?;
    let operands = Dense {
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
    Some((
        from_host(y, [batch, tokens, e]),
        from_host(states, [batch, e, n]),
    ))
}

/// Dense operands of one scan, row-major as their tensors.
struct Dense<'a> {
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

per_vector_level! {
    /// Scans one block of channels, a channel per lane, so that every operation is one vector
    /// operation over the block: `states` holds the block's `[width, N]` states (updated in place),
    /// `output` receives `[T, LANES]` outputs (lanes past the block's width are left unspecified).
    fn scan_block<'a>(operands: &Dense<'a>, block: &Block, states: &mut [f32], output: &mut [f32]) {
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
}

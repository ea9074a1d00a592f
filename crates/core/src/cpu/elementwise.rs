//! Element-wise exponential functions on the CPU (`flex`) backend, vectorised.
//!
//! burn-flex computes `exp` element by element through libm (about 12 ns per value on one
//! thread), which made SiLU a large share of prompt calls. Here the exponential is the Cephes
//! single-precision polynomial (range reduction by `ln 2`, degree-5 polynomial, relative error
//! about one unit in the last place), written so that the compiler vectorises it, over rayon's
//! threads. Each entry is `None` for other backends, dtypes and layouts, which the layers in
//! `nn` hand to burn unchanged.

use burn::tensor::Tensor;

use super::host::{f32_primitive, from_host, parallel_output};
use super::isa::per_vector_level;

/// Values per parallel task.
pub(super) const CHUNK: usize = 16 * 1024;

/// `x * sigmoid(x)`.
pub(crate) fn silu<const D: usize>(x: &Tensor<D>) -> Option<Tensor<D>> {
    map_f32(x, silu_slice)
}

/// `e^x` element-wise: 0 below the normal range (as `e^-inf`), infinite past `f32::MAX`.
pub(crate) fn exp<const D: usize>(x: &Tensor<D>) -> Option<Tensor<D>> {
    map_f32(x, exp_slice)
}

/// `1 / (1 + e^-x)` element-wise.
pub(crate) fn sigmoid<const D: usize>(x: &Tensor<D>) -> Option<Tensor<D>> {
    map_f32(x, sigmoid_slice)
}

per_vector_level! {
    fn exp_slice(input: &[f32], output: &mut [f32]) {
        for (y, &x) in output.iter_mut().zip(input) {
            *y = exp_full_range(x);
        }
    }
}

/// `e^x` for every `x`: 0 below the normal range (as `e^-inf`), infinite past `f32::MAX`.
#[inline(always)]
pub(crate) fn exp_full_range(x: f32) -> f32 {
    if x < -87.5 {
        0.0
    } else if x > 88.72 {
        f32::INFINITY
    } else if x > 88.0 {
        // Past the polynomial's clamp: one factor of e taken out.
        exp_f32(x - 1.0) * std::f32::consts::E
    } else {
        exp_f32(x)
    }
}

per_vector_level! {
    fn sigmoid_slice(input: &[f32], output: &mut [f32]) {
        for (y, &x) in output.iter_mut().zip(input) {
            *y = 1.0 / (1.0 + exp_f32(-x));
        }
    }
}

/// `sqrt(2 / pi)`, the scale inside the tanh approximation of GELU.
pub(crate) const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;

/// The tanh approximation of GELU, `0.5 x (1 + tanh(u))` with
/// `u = sqrt(2/pi) (x + 0.044715 x^3)`, computed as the equal `x / (1 + e^(-2u))`; `None`
/// where this path does not apply (another backend, dtype or layout).
pub(crate) fn gelu_tanh<const D: usize>(x: &Tensor<D>) -> Option<Tensor<D>> {
    map_f32(x, gelu_tanh_slice)
}

per_vector_level! {
    pub(super) fn gelu_tanh_slice(input: &[f32], output: &mut [f32]) {
        for (y, &x) in output.iter_mut().zip(input) {
            *y = gelu_tanh_value(x);
        }
    }
}

/// The tanh approximation of GELU of one value (see [`gelu_tanh`]).
#[inline(always)]
fn gelu_tanh_value(x: f32) -> f32 {
    const TWO_SQRT_2_OVER_PI: f32 = (2.0 * SQRT_2_OVER_PI) as f32;
    let u2 = TWO_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x);
    x / (1.0 + exp_f32(-u2))
}

/// Applies `kernel` (reading a slice, writing one of the same length) to `x`'s values when it
/// is a contiguous `f32` tensor on the `flex` backend.
fn map_f32<const D: usize>(x: &Tensor<D>, kernel: fn(&[f32], &mut [f32])) -> Option<Tensor<D>> {
    map_f32_chunks(x, CHUNK, kernel)
}

/// Like [`map_f32`], `kernel` seeing `chunk` values at a time (the last chunk may be shorter),
/// chunks spread over rayon's threads.
pub(crate) fn map_f32_chunks<const D: usize>(
    x: &Tensor<D>,
    chunk: usize,
    kernel: fn(&[f32], &mut [f32]),
) -> Option<Tensor<D>> {
    let primitive = f32_primitive(x)?;
    if !primitive.is_contiguous() || chunk == 0 {
        return None;
    }
    let input = primitive.as_slice::<f32>()?;
    Some(from_host(map_slice(input, chunk, kernel), x.dims()))
}

/// `kernel` over `input`, `chunk` values at a time, chunks spread over rayon's threads.
pub(super) fn map_slice(input: &[f32], chunk: usize, kernel: fn(&[f32], &mut [f32])) -> Vec<f32> {
    parallel_output(input.len(), chunk, |task, out| {
        kernel(&input[task * chunk..][..out.len()], out)
    })
}

per_vector_level! {
    fn silu_slice(input: &[f32], output: &mut [f32]) {
        for (y, &x) in output.iter_mut().zip(input) {
            *y = silu_value(x);
        }
    }
}

/// `x * sigmoid(x)`, as `x / (1 + e^-x)`.
#[inline(always)]
fn silu_value(x: f32) -> f32 {
    x / (1.0 + exp_f32(-x))
}

/// `silu(gate) * up` element-wise (a gated MLP's inner values) in one pass, each product of
/// the rounded activation as burn's two operations compute it; `None` unless both are
/// contiguous `f32` tensors of one shape on the `flex` backend.
pub(crate) fn silu_times<const D: usize>(gate: &Tensor<D>, up: &Tensor<D>) -> Option<Tensor<D>> {
    zip_f32(gate, up, silu_times_slice)
}

/// As [`silu_times`], with the tanh approximation of GELU ([`gelu_tanh`]) on the gate.
pub(crate) fn gelu_tanh_times<const D: usize>(
    gate: &Tensor<D>,
    up: &Tensor<D>,
) -> Option<Tensor<D>> {
    zip_f32(gate, up, gelu_tanh_times_slice)
}

per_vector_level! {
    fn silu_times_slice(gate: &[f32], up: &[f32], output: &mut [f32]) {
        for ((y, &x), &u) in output.iter_mut().zip(gate).zip(up) {
            *y = silu_value(x) * u;
        }
    }
}

per_vector_level! {
    fn gelu_tanh_times_slice(gate: &[f32], up: &[f32], output: &mut [f32]) {
        for ((y, &x), &u) in output.iter_mut().zip(gate).zip(up) {
            *y = gelu_tanh_value(x) * u;
        }
    }
}

/// `kernel(a, b, output)` over two contiguous `f32` tensors of one shape on the `flex`
/// backend, [`CHUNK`] values a task.
fn zip_f32<const D: usize>(
    a: &Tensor<D>,
    b: &Tensor<D>,
    kernel: fn(&[f32], &[f32], &mut [f32]),
) -> Option<Tensor<D>> {
    if a.dims() != b.dims() {
        return None;
    }
    let (a_storage, b_storage) = (f32_primitive(a)?, f32_primitive(b)?);
    if !a_storage.is_contiguous() || !b_storage.is_contiguous() {
        return None;
    }
    let (a_values, b_values) = (a_storage.as_slice::<f32>()?, b_storage.as_slice::<f32>()?);
    let output = parallel_output(a_values.len(), CHUNK, |task, out| {
        let run = task * CHUNK..task * CHUNK + out.len();
        kernel(&a_values[run.clone()], &b_values[run], out)
    });
    Some(from_host(output, a.dims()))
}

/// Below this magnitude an operand of the chunked scans' products is taken as zero: products
/// of two larger ones are at least `2^-120`, a normal `f32`.
const TINY: f32 = 1.0 / (1u64 << 60) as f32;

/// Sets the values below [`TINY`] in magnitude to zero. Strong decays drive a chunked scan's
/// factors, products and carried state toward zero; a product that lands below the normal
/// range (`2^-126`) takes a slow path on x86 cores for each multiply-add, and so do the layers
/// after the scan that read such outputs: a 1024-token Qwen3-Next-shaped call (random weights,
/// log-decays down to -40 a token) took 850-920 ms with them, 700-720 without. What this drops
/// is below `2^-60` of the operands' own scale: far under `f32`'s precision of any output it
/// adds to.
#[inline(always)]
pub(super) fn flush_tiny(values: &mut [f32]) {
    for value in values {
        *value = above_tiny(*value);
    }
}

/// `ln(TINY)`: a decay `e^d` with `d` below it is below [`TINY`].
pub(super) const LOG_TINY: f32 = -41.588_83;

/// The decay `e^d` of a log-decay difference `d`, or zero where it would be below [`TINY`]
/// (`d < LOG_TINY`).
#[inline(always)]
pub(super) fn decay_factor(d: f32) -> f32 {
    match d < LOG_TINY {
        true => 0.0,
        false => exp_full_range(d),
    }
}

/// `value`, or zero below [`TINY`] in magnitude ([`flush_tiny`] of one value, for the loops
/// that make an operand).
#[inline(always)]
pub(super) fn above_tiny(value: f32) -> f32 {
    match value.abs() < TINY {
        true => 0.0,
        false => value,
    }
}

/// Independent running sums or maxima of [`sum_lanes`] and [`max_lanes`] (one vector register
/// of `f32` on AVX-512).
const LANES: usize = 16;

/// `Σ values` in [`LANES`] independent lanes (so that it vectorises), then summed.
#[inline(always)]
pub(super) fn sum_lanes(values: &[f32]) -> f32 {
    sum_lanes_of(values, |value| value)
}

/// `Σ term(value)` over `values`, summed as [`sum_lanes`] sums.
#[inline(always)]
pub(super) fn sum_lanes_of(values: &[f32], term: impl Fn(f32) -> f32) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let (body, tail) = values.as_chunks::<LANES>();
    for chunk in body {
        for (lane, &value) in lanes.iter_mut().zip(chunk) {
            *lane += term(value);
        }
    }
    lanes.iter().sum::<f32>() + tail.iter().map(|&value| term(value)).sum::<f32>()
}

/// The largest of `values` (`-inf` for none), NaN ignored, kept in [`LANES`] independent lanes
/// so that the loop vectorises: a single running maximum is a chain the compiler leaves scalar.
#[inline(always)]
pub(super) fn max_lanes(values: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let (body, tail) = values.as_chunks::<LANES>();
    for chunk in body {
        for (lane, &value) in lanes.iter_mut().zip(chunk) {
            *lane = if value > *lane { value } else { *lane };
        }
    }
    lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |max, &value| max.max(value))
}

/// `e^x` for finite `x` (clamped to the range where `e^x` is a normal float).
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two so that `n * LN2_HIGH` is exact.
    const LN2_HIGH: f32 = 0.693_359_4;
    const LN2_LOW: f32 = -2.121_944_4e-4;
    // Adding 1.5 * 2^23 rounds to the nearest integer `n` in the low mantissa bits: the sum's
    // bits are those of 1.5 * 2^23 plus `n`.
    const ROUNDER: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let rounded = x * LOG2_E + ROUNDER;
    let n = rounded - ROUNDER;
    let r = x - n * LN2_HIGH - n * LN2_LOW;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e_r = p * r * r + r + 1.0;
    // `2^n` from those bits: `n + 127` in the exponent field, the bits of 1.5 * 2^23 shifted
    // out (its low nine bits are zero). Integer adds and shifts vectorise; a float-to-integer
    // cast (`n as i32`, saturating) became one scalar conversion a lane.
    let scale = f32::from_bits(rounded.to_bits().wrapping_add(127) << 23);
    e_r * scale
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, TensorData, activation};

    use super::*;

    #[test]
    fn exp_is_within_two_ulps_of_libm_over_the_normal_range() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let (fast, exact) = (exp_f32(x), x.exp());
            assert!(
                ((fast - exact) / exact).abs() < 2.5e-7,
                "exp({x}) = {fast}, libm {exact}"
            );
            x += 0.013;
        }
    }

    #[test]
    fn exp_and_sigmoid_match_burn_including_the_limits() {
        let values: Vec<f32> = (0..30_000)
            .map(|i| (i as f32 - 15_000.0) * 0.0123)
            .chain([
                f32::NEG_INFINITY,
                -1e30,
                -87.6,
                -87.4,
                0.0,
                88.4,
                88.6,
                1e30,
            ])
            .collect();
        let count = values.len();
        let x: Tensor<2> =
            Tensor::from_data(TensorData::new(values, [1, count]), &Device::default());
        let read = |t: Tensor<2>| t.into_data().try_to_vec::<f32>().unwrap();
        for (fast, reference) in [
            (read(exp(&x).unwrap()), read(x.clone().exp())),
            (
                read(sigmoid(&x).unwrap()),
                read(activation::sigmoid(x.clone())),
            ),
        ] {
            for (a, b) in fast.iter().zip(&reference) {
                let close = if b.is_finite() {
                    (a - b).abs() <= 3e-7 * b.abs().max(1e-30) || (a - b).abs() < 1e-37
                } else {
                    a == b
                };
                assert!(close, "{a} vs {b}");
            }
        }
    }

    #[test]
    fn gelu_tanh_matches_the_tanh_formula() {
        let values: Vec<f32> = (0..20_000)
            .map(|i| (i as f32 - 10_000.0) * 0.0013)
            .chain([-1e30, -200.0, -9.0, 0.0, 9.0, 200.0, 1e30])
            .collect();
        let count = values.len();
        let x: Tensor<2> = Tensor::from_data(
            TensorData::new(values.clone(), [1, count]),
            &Device::default(),
        );
        let fast = gelu_tanh(&x)
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        for (y, x) in fast.iter().zip(&values) {
            let x = f64::from(*x);
            let u = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x);
            let exact = 0.5 * x * (1.0 + u.tanh());
            let exact = if exact.is_finite() { exact } else { x.max(0.0) };
            assert!(
                (f64::from(*y) - exact).abs() <= 2e-6 * exact.abs().max(1.0),
                "gelu({x}) = {y}, expected {exact}"
            );
        }
    }

    #[test]
    fn silu_matches_burn_including_extremes_and_declines_strided_inputs() {
        let values: Vec<f32> = (0..40_000)
            .map(|i| (i as f32 - 20_000.0) * 0.0123)
            .chain([-1e30, -200.0, -88.5, 0.0, 88.5, 200.0, 1e30])
            .collect();
        let count = values.len();
        let x: Tensor<2> =
            Tensor::from_data(TensorData::new(values, [1, count]), &Device::default());
        let fast = silu(&x).unwrap().into_data().try_to_vec::<f32>().unwrap();
        let reference = activation::silu(x.clone())
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        for (a, b) in fast.iter().zip(&reference) {
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{a} vs {b}");
        }
        // A transposed view is not contiguous: the kernel leaves it to burn.
        let square: Tensor<2> = x.slice([0..1, 0..40_000]).reshape([200, 200]);
        assert!(silu(&square.transpose()).is_none());
    }

    /// The fused gated forms give what the activation and burn's product give, over several
    /// tasks' chunks and a short last one; other shapes and layouts are left to burn.
    #[test]
    fn gated_forms_match_the_activation_times_the_up_values() {
        let count = 2 * CHUNK + 77;
        let device = Device::default();
        let tensor = |values: Vec<f32>| -> Tensor<2> {
            Tensor::from_data(TensorData::new(values, [1, count]), &device)
        };
        let gate = tensor((0..count).map(|i| (i as f32 - 17_000.0) * 0.0021).collect());
        let up = tensor(
            (0..count)
                .map(|i| ((i * 7919) % 1000) as f32 * 0.003 - 1.5)
                .collect(),
        );
        let read = |t: Tensor<2>| t.into_data().try_to_vec::<f32>().unwrap();
        let silu_values = silu(&gate).unwrap();
        let gelu_values = gelu_tanh(&gate).unwrap();
        assert_eq!(
            read(silu_times(&gate, &up).unwrap()),
            read(silu_values * up.clone())
        );
        assert_eq!(
            read(gelu_tanh_times(&gate, &up).unwrap()),
            read(gelu_values * up.clone())
        );
        let shorter = up.clone().slice([0..1, 0..count - 1]);
        assert!(silu_times(&gate, &shorter).is_none());
        // Transposed views (`[count / 2, 2]` of `[2, count / 2]`) are not contiguous.
        let even = count - 1;
        let transposed = |t: Tensor<2>| t.slice([0..1, 0..even]).reshape([2, even / 2]).transpose();
        assert!(silu_times(&transposed(gate), &transposed(up)).is_none());
    }
}

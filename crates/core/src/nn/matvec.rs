//! Products of a few rows with a weight matrix, on the CPU (`flex`) backend.
//!
//! Decoding multiplies one row per sequence by every weight matrix, so its speed is the speed of
//! reading the weights once. burn-flex hands such products to `gemm`, which runs them on one
//! thread below ~7 M multiply-adds and streams a transposed (torch `[out, in]`) weight at half the
//! memory bandwidth. Here each weight element is read exactly once, in storage order, split over
//! rayon's threads (the pool burn-flex uses), with kernels compiled for AVX-512 / AVX2 and picked
//! at run time. Other backends, dtypes and layouts, and products with many rows, go to burn.

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Tensor, TensorData};
use multiversion::{multiversion, target::selected_target};
use rayon::prelude::*;

/// Products with more rows than this are left to burn's `gemm`, which reuses each weight element
/// across rows better (measured on GPT-2 small, 2 threads: this path is faster up to 8 rows,
/// slower at 16).
pub(crate) const MAX_ROWS: usize = 8;

/// Output rows computed per parallel task by the `[out, in]` kernel.
const OUTPUTS_PER_TASK: usize = 64;

/// `x W + b` for `x: [rows, in]` and `weight: [in, out]` (either storage orientation), or `None`
/// when this path does not apply and the caller should use burn's matmul.
pub(crate) fn try_forward(
    x: &Tensor<2>,
    weight: &Tensor<2>,
    bias: Option<&Tensor<1>>,
) -> Option<Tensor<2>> {
    let [rows, d_in] = x.dims();
    let [_, d_out] = weight.dims();
    if rows == 0 || rows > MAX_ROWS {
        return None;
    }
    let weight = f32_primitive(weight)?;
    let orientation = Orientation::of(&weight)?;
    let x = f32_primitive(x)?.to_contiguous();
    let bias = match bias {
        Some(bias) => Some(f32_primitive(bias)?.to_contiguous()),
        None => None,
    };
    let weights = &weight.storage::<f32>()[weight.layout().start_offset()..][..d_in * d_out];
    let product = Product {
        x: x.as_slice::<f32>()?,
        rows,
        d_in,
        d_out,
        bias: match &bias {
            Some(bias) => Some(bias.as_slice::<f32>()?),
            None => None,
        },
    };
    let y = match orientation {
        Orientation::InOut => product.in_out(weights),
        Orientation::OutIn => product.out_in(weights),
    };
    let y = FlexTensor::from_data(TensorData::new(y, [rows, d_out]));
    Some(Tensor::from_primitive::<Flex>(y))
}

/// The tensor's `flex` storage when it lives on that backend as `f32`.
fn f32_primitive<const D: usize>(tensor: &Tensor<D>) -> Option<FlexTensor> {
    let primitive = tensor.clone().try_into_primitive::<Flex>().ok()?;
    (primitive.dtype() == DType::F32).then_some(primitive)
}

/// How an `[in, out]` weight view lies in memory.
enum Orientation {
    /// Stored `[in, out]` row-major (GPT-2's `Conv1D`).
    InOut,
    /// Stored `[out, in]` row-major and viewed transposed (torch `nn.Linear`, tied heads).
    OutIn,
}

impl Orientation {
    fn of(weight: &FlexTensor) -> Option<Self> {
        let layout = weight.layout();
        let dims = layout.shape();
        let (d_in, d_out) = (dims[0] as isize, dims[1] as isize);
        match layout.strides() {
            [row, 1] if *row == d_out => Some(Orientation::InOut),
            [1, column] if *column == d_in => Some(Orientation::OutIn),
            _ => None,
        }
    }
}

/// One product's operands, as host slices.
struct Product<'a> {
    x: &'a [f32],
    rows: usize,
    d_in: usize,
    d_out: usize,
    bias: Option<&'a [f32]>,
}

impl Product<'_> {
    /// `weights` stored `[in, out]`: the input axis is split over the threads, each accumulating
    /// whole output rows from a contiguous band of weight rows; the partial sums are then added.
    fn in_out(&self, weights: &[f32]) -> Vec<f32> {
        let (rows, d_in, d_out) = (self.rows, self.d_in, self.d_out);
        let bands = rayon::current_num_threads().clamp(1, d_in);
        let band_len = d_in.div_ceil(bands);
        let partials: Vec<Vec<f32>> = (0..d_in.div_ceil(band_len))
            .into_par_iter()
            .map(|band| {
                let inputs = band * band_len..((band + 1) * band_len).min(d_in);
                let mut sums = vec![0.0; rows * d_out];
                accumulate_rows(
                    self.x,
                    d_in,
                    inputs.start,
                    &weights[inputs.start * d_out..inputs.end * d_out],
                    &mut sums,
                );
                sums
            })
            .collect();
        let mut partials = partials.into_iter();
        let mut y = partials.next().unwrap_or_else(|| vec![0.0; rows * d_out]);
        for partial in partials {
            add_into(&mut y, &partial);
        }
        if let Some(bias) = self.bias {
            for row in y.chunks_exact_mut(d_out) {
                add_into(row, bias);
            }
        }
        y
    }

    /// `weights` stored `[out, in]`: each output is a dot product with one contiguous weight
    /// row; blocks of outputs are spread over the threads.
    fn out_in(&self, weights: &[f32]) -> Vec<f32> {
        let (rows, d_in, d_out) = (self.rows, self.d_in, self.d_out);
        // Output-major `[out, rows]`, so that each task owns one contiguous chunk.
        let mut by_output = vec![0.0; d_out * rows];
        by_output
            .par_chunks_mut(OUTPUTS_PER_TASK * rows)
            .enumerate()
            .for_each(|(task, chunk)| {
                let first = task * OUTPUTS_PER_TASK;
                let count = chunk.len() / rows;
                dot_rows(
                    self.x,
                    d_in,
                    &weights[first * d_in..(first + count) * d_in],
                    chunk,
                );
                if let Some(bias) = self.bias {
                    for (sums, b) in chunk.chunks_exact_mut(rows).zip(&bias[first..]) {
                        sums.iter_mut().for_each(|sum| *sum += b);
                    }
                }
            });
        if rows == 1 {
            return by_output;
        }
        let mut y = vec![0.0; rows * d_out];
        for (output, sums) in by_output.chunks_exact(rows).enumerate() {
            for (row, sum) in sums.iter().enumerate() {
                y[row * d_out + output] = *sum;
            }
        }
        y
    }
}

/// Partial sums kept per output tile of the `[in, out]` kernel: small enough to stay in L1 while
/// every row of `x` is applied to each weight row segment.
const TILE_FLOATS: usize = 6 * 1024;

/// Weight rows combined per pass of the `[in, out]` kernel, so that each load and store of a
/// partial sum carries this many multiply-adds.
const GROUP: usize = 4;

/// `sums[r, :] += Σ_k x[r, first + k] · band[k, :]` for a band of `[in, out]` weight rows.
#[multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma"))]
fn accumulate_rows(x: &[f32], d_in: usize, first: usize, band: &[f32], sums: &mut [f32]) {
    const FUSED: bool = selected_target!().supports_feature_str("fma");
    let rows = x.len() / d_in;
    let d_out = sums.len() / rows;
    let tile = (TILE_FLOATS / rows).max(16).min(d_out);
    for start in (0..d_out).step_by(tile) {
        let end = (start + tile).min(d_out);
        for (group_index, group) in band.chunks(GROUP * d_out).enumerate() {
            let k = first + group_index * GROUP;
            if group.len() == GROUP * d_out {
                let weight_rows: [&[f32]; GROUP] =
                    std::array::from_fn(|g| &group[g * d_out + start..g * d_out + end]);
                for (x_row, sum_row) in x.chunks_exact(d_in).zip(sums.chunks_exact_mut(d_out)) {
                    let scales: [f32; GROUP] = std::array::from_fn(|g| x_row[k + g]);
                    axpy_group::<FUSED, GROUP>(&mut sum_row[start..end], scales, weight_rows);
                }
            } else {
                for (g, weight_row) in group.chunks_exact(d_out).enumerate() {
                    for (x_row, sum_row) in x.chunks_exact(d_in).zip(sums.chunks_exact_mut(d_out)) {
                        axpy_group::<FUSED, 1>(
                            &mut sum_row[start..end],
                            [x_row[k + g]],
                            [&weight_row[start..end]],
                        );
                    }
                }
            }
        }
    }
}

/// `sums += Σ_g scales[g] · rows[g]`, one load and store of each sum for all `G` rows.
#[inline(always)]
fn axpy_group<const FUSED: bool, const G: usize>(
    sums: &mut [f32],
    scales: [f32; G],
    rows: [&[f32]; G],
) {
    let len = sums.len();
    let rows = rows.map(|row| &row[..len]);
    for c in 0..len {
        let mut sum = sums[c];
        for g in 0..G {
            sum = multiply_add::<FUSED>(scales[g], rows[g][c], sum);
        }
        sums[c] = sum;
    }
}

/// `out[o, r] = x[r, :] · weights[o, :]` for a block of `[out, in]` weight rows.
#[multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma"))]
fn dot_rows(x: &[f32], d_in: usize, weights: &[f32], out: &mut [f32]) {
    const FUSED: bool = selected_target!().supports_feature_str("fma");
    let rows = x.len() / d_in;
    for (weight_row, sums) in weights.chunks_exact(d_in).zip(out.chunks_exact_mut(rows)) {
        for (x_row, sum) in x.chunks_exact(d_in).zip(sums) {
            *sum = dot::<FUSED>(x_row, weight_row);
        }
    }
}

/// `a · b + c`, rounded once where the target has fused multiply-add (where it has not,
/// `mul_add` would be a slow library call).
#[inline(always)]
fn multiply_add<const FUSED: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FUSED { a.mul_add(b, c) } else { a * b + c }
}

/// Independent partial sums per lane, so the compiler can vectorise the reduction.
const LANES: usize = 16;

#[inline(always)]
fn dot<const FUSED: bool>(a: &[f32], b: &[f32]) -> f32 {
    let split = a.len() / LANES * LANES;
    let mut lanes = [0.0f32; LANES];
    for (a, b) in a[..split]
        .chunks_exact(LANES)
        .zip(b[..split].chunks_exact(LANES))
    {
        for lane in 0..LANES {
            lanes[lane] = multiply_add::<FUSED>(a[lane], b[lane], lanes[lane]);
        }
    }
    let tail: f32 = a[split..].iter().zip(&b[split..]).map(|(a, b)| a * b).sum();
    lanes.iter().sum::<f32>() + tail
}

#[multiversion(targets("x86_64+avx512f+avx512vl", "x86_64+avx2"))]
fn add_into(target: &mut [f32], addend: &[f32]) {
    for (t, a) in target.iter_mut().zip(addend) {
        *t += a;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;

    /// A deterministic `[rows, cols]` matrix with values in [-1, 1).
    fn matrix(rows: usize, cols: usize, salt: u64) -> Vec<f32> {
        let mut rng = fastrand::Rng::with_seed(salt);
        (0..rows * cols).map(|_| rng.f32() * 2.0 - 1.0).collect()
    }

    fn tensor<const D: usize>(values: Vec<f32>, dims: [usize; D]) -> Tensor<D> {
        Tensor::from_data(TensorData::new(values, dims), &Device::default())
    }

    fn assert_close(fast: Tensor<2>, reference: Tensor<2>) {
        assert_eq!(fast.dims(), reference.dims());
        let fast = fast.into_data().try_to_vec::<f32>().unwrap();
        let reference = reference.into_data().try_to_vec::<f32>().unwrap();
        for (i, (a, b)) in fast.iter().zip(&reference).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                "element {i}: {a} vs {b}"
            );
        }
    }

    #[test]
    fn both_orientations_match_burn_matmul_with_bias() {
        // Odd sizes exercise the dot-product tail, partial tasks, uneven bands, a last group of
        // fewer than four weight rows and (with 1000 outputs) several output tiles.
        for (rows, d_in, d_out) in [(1, 37, 141), (3, 37, 141), (MAX_ROWS, 70, 1000)] {
            let x = tensor(matrix(rows, d_in, 1), [rows, d_in]);
            let bias = tensor(matrix(1, d_out, 2), [d_out]);
            let in_out = tensor(matrix(d_in, d_out, 3), [d_in, d_out]);
            let out_in = tensor(matrix(d_out, d_in, 4), [d_out, d_in]).transpose();
            for weight in [in_out, out_in] {
                let reference = x.clone().matmul(weight.clone()) + bias.clone().unsqueeze::<2>();
                let fast = try_forward(&x, &weight, Some(&bias)).expect("fast path applies");
                assert_close(fast, reference);
                let fast = try_forward(&x, &weight, None).expect("fast path applies");
                assert_close(fast, x.clone().matmul(weight.clone()));
            }
        }
    }

    #[test]
    fn declines_what_it_does_not_cover() {
        let x = tensor(matrix(MAX_ROWS + 1, 8, 1), [MAX_ROWS + 1, 8]);
        let weight = tensor(matrix(8, 4, 2), [8, 4]);
        assert!(try_forward(&x, &weight, None).is_none(), "too many rows");
        let strided = tensor(matrix(8, 8, 3), [8, 8]).slice([0..8, 0..4]);
        let x = tensor(matrix(1, 8, 4), [1, 8]);
        assert!(
            try_forward(&x, &strided, None).is_none(),
            "non-dense weight"
        );
    }
}

//! RMSNorm (Zhang and Sennrich 2019, "Root Mean Square Layer Normalization") over the last
//! axis, a row at a time: the mean square summed in vector lanes, then each value scaled and
//! weighted on the way out. As burn operations it is a square, a mean, the scale and two
//! broadcast products, each a pass over the whole tensor.

use burn::tensor::Tensor;

use super::elementwise::{CHUNK, sum_lanes_of};
use super::host::{dense_f32, from_host, parallel_output};
use super::isa::per_vector_level;

/// `x / sqrt(mean(x²) + eps)` over the last axis, times `weight` (`[width]`) when given, in
/// the order burn's operations compute it (the scale rounded, then each product); `None`
/// unless `x` and `weight` live on the CPU backend as `f32` with matching widths.
pub(crate) fn rms_norm<const D: usize>(
    x: &Tensor<D>,
    weight: Option<&Tensor<1>>,
    eps: f64,
) -> Option<Tensor<D>> {
    let dims = x.dims();
    let width = *dims.last()?;
    if width == 0 || weight.is_some_and(|weight| weight.dims() != [width]) {
        return None;
    }
    let storage = dense_f32(x)?;
    let weight_storage = match weight {
        Some(weight) => Some(dense_f32(weight)?),
        None => None,
    };
    let row = Row {
        weight: match &weight_storage {
            Some(storage) => Some(storage.as_slice::<f32>()?),
            None => None,
        },
        eps: eps as f32,
    };
    let values = storage.as_slice::<f32>()?;
    let run = CHUNK.div_ceil(width) * width;
    let output = parallel_output(values.len(), run, |task, out| {
        let values = &values[task * run..][..out.len()];
        for (out, values) in out.chunks_exact_mut(width).zip(values.chunks_exact(width)) {
            normalise_row(&row, values, out);
        }
    });
    Some(from_host(output, dims))
}

/// What every row is normalised with.
struct Row<'a> {
    weight: Option<&'a [f32]>,
    eps: f32,
}

per_vector_level! {
    fn normalise_row(row: &Row<'_>, values: &[f32], out: &mut [f32]) {
        let mean_square = sum_lanes_of(values, |value| value * value) / values.len() as f32;
        let scale = 1.0 / (mean_square + row.eps).sqrt();
        match row.weight {
            Some(weight) => {
                for ((y, &x), &w) in out.iter_mut().zip(values).zip(weight) {
                    *y = x * scale * w;
                }
            }
            None => {
                for (y, &x) in out.iter_mut().zip(values) {
                    *y = x * scale;
                }
            }
        }
    }
}

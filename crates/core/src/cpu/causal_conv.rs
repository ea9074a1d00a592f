//! The causal depthwise convolution of the recurrent mixers (`nn::conv`) in one pass: each
//! output row is the bias plus `kernel` rows of the carried window and the input, each times
//! its tap, summed in registers across the channels. As burn operations it is a concatenation,
//! `kernel` products and `kernel` sums, each a pass over the whole `[B, T, C]` tensor.

use burn::tensor::Tensor;
use rayon::prelude::*;

use super::host::{dense_f32, from_host};
use super::isa::per_vector_level;

/// Output rows one task computes.
const ROWS_PER_TASK: usize = 64;

/// The convolution's operands: the input `x` `[B, T, C]`, the last `K` inputs of the previous
/// call `window` `[B, K, C]` (zeros when absent), the taps `[K, C]` (row `j` multiplies the
/// input `K - 1 - j` positions back) and the bias `[C]`.
pub(crate) struct ConvOperands<'a> {
    pub(crate) x: &'a Tensor<3>,
    pub(crate) window: Option<&'a Tensor<3>>,
    pub(crate) taps: &'a Tensor<2>,
    pub(crate) bias: Option<&'a Tensor<1>>,
}

/// The output `[B, T, C]` and the new window `[B, K, C]` (the last `K` rows of the window
/// followed by the input); `None` unless every operand lives on the CPU backend as `f32` with
/// consistent sizes.
pub(crate) fn causal_conv(operands: &ConvOperands<'_>) -> Option<(Tensor<3>, Tensor<3>)> {
    let [batch, tokens, channels] = operands.x.dims();
    let [kernel, tap_channels] = operands.taps.dims();
    let window_fits = operands
        .window
        .is_none_or(|window| window.dims() == [batch, kernel, channels]);
    let bias_fits = operands.bias.is_none_or(|bias| bias.dims() == [channels]);
    if tap_channels != channels || !window_fits || !bias_fits {
        return None;
    }
    if [batch, tokens, channels, kernel].contains(&0) {
        return None;
    }
    let x = dense_f32(operands.x)?;
    let taps = dense_f32(operands.taps)?;
    let window = match operands.window {
        Some(window) => dense_f32(window)?.as_slice::<f32>()?.to_vec(),
        None => vec![0.0; batch * kernel * channels],
    };
    let bias = match operands.bias {
        Some(bias) => dense_f32(bias)?.as_slice::<f32>()?.to_vec(),
        None => vec![0.0; channels],
    };
    let rows = Rows {
        x: x.as_slice::<f32>()?,
        window: &window,
        tokens,
        kernel,
        channels,
    };
    let taps = taps.as_slice::<f32>()?;
    let mut output = vec![0.0f32; batch * tokens * channels];
    let blocks = tokens.div_ceil(ROWS_PER_TASK);
    let mut tasks: Vec<(usize, &mut [f32])> = Vec::with_capacity(batch * blocks);
    for (sequence, out) in output.chunks_exact_mut(tokens * channels).enumerate() {
        for (block, rows) in out.chunks_mut(ROWS_PER_TASK * channels).enumerate() {
            tasks.push((sequence * tokens + block * ROWS_PER_TASK, rows));
        }
    }
    tasks.into_par_iter().for_each(|(first, out)| {
        convolve_rows(&rows, taps, &bias, first, out);
    });
    let mut new_window = Vec::with_capacity(batch * kernel * channels);
    for sequence in 0..batch {
        for position in tokens..tokens + kernel {
            new_window.extend_from_slice(rows.extended(sequence, position));
        }
    }
    Some((
        from_host(output, [batch, tokens, channels]),
        from_host(new_window, [batch, kernel, channels]),
    ))
}

/// The rows the convolution reads: per sequence, the window's `K` rows then the input's `T`.
struct Rows<'a> {
    x: &'a [f32],
    window: &'a [f32],
    tokens: usize,
    kernel: usize,
    channels: usize,
}

impl Rows<'_> {
    /// Row `position` of sequence `sequence`'s window followed by its input.
    #[inline(always)]
    fn extended(&self, sequence: usize, position: usize) -> &[f32] {
        let (kernel, channels) = (self.kernel, self.channels);
        match position < kernel {
            true => &self.window[(sequence * kernel + position) * channels..][..channels],
            false => &self.x[(sequence * self.tokens + position - kernel) * channels..][..channels],
        }
    }
}

per_vector_level! {
    /// Output rows from flat row `first` (`sequence * T + t`) on, as many as `out` holds:
    /// row `t` is `bias + Σ_j taps[j] · extended[t + 1 + j]`.
    fn convolve_rows<'a>(rows: &Rows<'a>, taps: &[f32], bias: &[f32], first: usize, out: &mut [f32]) {
        let channels = rows.channels;
        for (offset, out) in out.chunks_exact_mut(channels).enumerate() {
            let (sequence, t) = ((first + offset) / rows.tokens, (first + offset) % rows.tokens);
            out.copy_from_slice(bias);
            for (j, tap) in taps.chunks_exact(channels).enumerate() {
                let input = rows.extended(sequence, t + 1 + j);
                for ((o, &w), &x) in out.iter_mut().zip(tap).zip(input) {
                    *o += w * x;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, TensorData};

    use super::*;

    /// Deterministic values in `[-0.5, 0.5)`.
    fn values(count: usize, seed: u64) -> Vec<f32> {
        (0..count as u64)
            .map(|i| ((i * 2_654_435_761 + seed * 97) % 1000) as f32 / 1000.0 - 0.5)
            .collect()
    }

    fn tensor<const D: usize>(values: &[f32], shape: [usize; D]) -> Tensor<D> {
        Tensor::from_data(TensorData::new(values.to_vec(), shape), &Device::default())
    }

    /// Two sequences of 70 tokens (more than one task's rows, not a multiple), 19 channels, 4
    /// taps, with and without a window and a bias: each output and the new window equal the
    /// convolution written out position by position.
    #[test]
    fn one_pass_equals_the_convolution_written_out() {
        let (batch, tokens, channels, kernel) = (2, 70, 19, 4);
        let x = values(batch * tokens * channels, 1);
        let window = values(batch * kernel * channels, 2);
        let taps = values(kernel * channels, 3);
        let bias = values(channels, 4);
        let x_t = tensor(&x, [batch, tokens, channels]);
        let window_t = tensor(&window, [batch, kernel, channels]);
        let taps_t = tensor(&taps, [kernel, channels]);
        let bias_t = tensor(&bias, [channels]);
        for (with_window, with_bias) in [(true, true), (false, false)] {
            let operands = ConvOperands {
                x: &x_t,
                window: with_window.then_some(&window_t),
                taps: &taps_t,
                bias: with_bias.then_some(&bias_t),
            };
            let (output, new_window) = causal_conv(&operands).expect("f32 on the CPU backend");
            let output = output.into_data().try_to_vec::<f32>().unwrap();
            let new_window = new_window.into_data().try_to_vec::<f32>().unwrap();
            let extended = |b: usize, p: usize, c: usize| match p < kernel {
                true if with_window => window[(b * kernel + p) * channels + c],
                true => 0.0,
                false => x[(b * tokens + p - kernel) * channels + c],
            };
            for b in 0..batch {
                for t in 0..tokens {
                    for c in 0..channels {
                        let sum: f32 = (0..kernel)
                            .map(|j| taps[j * channels + c] * extended(b, t + 1 + j, c))
                            .sum();
                        let expected = sum + if with_bias { bias[c] } else { 0.0 };
                        let got = output[(b * tokens + t) * channels + c];
                        assert!((got - expected).abs() < 1e-6, "{got} vs {expected}");
                    }
                }
                for p in 0..kernel {
                    for c in 0..channels {
                        let got = new_window[(b * kernel + p) * channels + c];
                        assert_eq!(got, extended(b, tokens + p, c));
                    }
                }
            }
        }
    }

    /// Taps of another width than the input's channels leave the work to burn's operations.
    #[test]
    fn mismatched_taps_are_declined() {
        let x = tensor(&values(3 * 5, 1), [1, 3, 5]);
        let taps = tensor(&values(4 * 6, 2), [4, 6]);
        let operands = ConvOperands {
            x: &x,
            window: None,
            taps: &taps,
            bias: None,
        };
        assert!(causal_conv(&operands).is_none());
    }
}

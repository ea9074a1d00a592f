//! Softmax over a vocabulary-sized last axis, with the normaliser summed accurately.
//!
//! burn-flex adds a row's exponentials one after the other in `f32`: over 50,257 or 151,936
//! entries the rounding of each addition piles up to a relative error near 1e-4 in every
//! probability, which shows as soon as a researcher takes a logarithm (the logit lens'
//! log-probabilities differed from `transformers`' by 1.4e-4). Here each row's exponentials are
//! summed in 16 running `f32` sums of 64 values each, whose sums are added in `f64`, so every
//! probability is within a few units in the last place. Other backends, dtypes and layouts are
//! `None`, left to burn by `nn::softmax_last`.

use burn::tensor::Tensor;

use super::elementwise::{exp_f32, map_f32_chunks, max_lanes};
use super::isa::per_vector_level;

/// Exponentials per block: each of the block's `LANES` running `f32` sums adds 64 values
/// before the block's sum joins the row's `f64` total.
const BLOCK: usize = 1024;
/// Independent running sums (one vector register of `f32` on AVX-512).
const LANES: usize = 16;

/// `softmax` over the last axis: `e^(x - max) / sum`. A row holding NaN or `+inf` gives NaN, a
/// row of `-inf` gives NaN (as in torch); `-inf` entries elsewhere give 0.
pub(crate) fn softmax_last<const D: usize>(x: &Tensor<D>) -> Option<Tensor<D>> {
    map_f32_chunks(x, *x.dims().last()?, softmax_row)
}

per_vector_level! {
    fn softmax_row(input: &[f32], output: &mut [f32]) {
        let max = max_lanes(input);
        for (y, &v) in output.iter_mut().zip(input) {
            let shifted = v - max;
            // Below e^-87.5 the value is 0 (and -inf - max is -inf); NaN stays NaN.
            *y = if shifted < -87.5 {
                0.0
            } else {
                exp_f32(shifted)
            };
        }
        let mut total = 0.0f64;
        for block in output.chunks(BLOCK) {
            let mut lanes = [0.0f32; LANES];
            let mut groups = block.chunks_exact(LANES);
            for group in &mut groups {
                for (lane, &y) in lanes.iter_mut().zip(group) {
                    *lane += y;
                }
            }
            let rest = groups.remainder().iter().map(|&y| f64::from(y));
            total += lanes.iter().map(|&l| f64::from(l)).chain(rest).sum::<f64>();
        }
        let scale = (1.0 / total) as f32;
        for y in output.iter_mut() {
            *y *= scale;
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, TensorData};

    use super::*;

    fn run(values: Vec<f32>, shape: [usize; 2]) -> Vec<f32> {
        let x: Tensor<2> = Tensor::from_data(TensorData::new(values, shape), &Device::default());
        softmax_last(&x)
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap()
    }

    #[test]
    fn every_probability_of_a_vocabulary_sized_row_is_within_a_few_ulps() {
        let vocab = 50_257;
        // Logits spread like a language model's: most far below the top, a few near it.
        let logits: Vec<f32> = (0..2 * vocab)
            .map(|i| ((i * 7919 % 10_007) as f32 / 10_007.0 - 0.8) * 20.0)
            .collect();
        let probabilities = run(logits.clone(), [2, vocab]);
        for (row, (got, x)) in probabilities
            .chunks(vocab)
            .zip(logits.chunks(vocab))
            .enumerate()
        {
            let max = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
            let sum: f64 = x.iter().map(|&v| (v as f64 - max).exp()).sum();
            for (&p, &v) in got.iter().zip(x) {
                let exact = (v as f64 - max).exp() / sum;
                assert!(
                    ((p as f64 - exact) / exact).abs() < 1e-6,
                    "row {row}: {p} vs {exact}"
                );
            }
        }
    }

    #[test]
    fn masked_entries_are_zero_and_broken_rows_are_nan() {
        let inf = f32::INFINITY;
        let got = run(
            vec![
                0.0,
                -inf,
                0.0,
                -inf, // two equal entries, two masked
                -inf,
                -inf,
                -inf,
                -inf, // nothing left: NaN
                1.0,
                f32::NAN,
                2.0,
                3.0, // a NaN: NaN
                1.0,
                inf,
                2.0,
                3.0, // +inf: NaN
            ],
            [4, 4],
        );
        assert_eq!(&got[..4], [0.5, 0.0, 0.5, 0.0]);
        assert!(got[4..].iter().all(|p| p.is_nan()), "{got:?}");
    }

    #[test]
    fn other_layouts_are_left_to_burn() {
        let x: Tensor<2> = Tensor::from_data(
            TensorData::new(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]),
            &Device::default(),
        );
        assert!(softmax_last(&x.transpose()).is_none());
    }

    /// What `next_token_probs` sees for a batch: the last position of `[B, T, V]` logits,
    /// reshaped to `[B, V]`. Each row must get the accurate sums a lone row gets (burn's own
    /// softmax is ~1e-4 off at this width).
    #[test]
    fn the_last_position_of_a_batch_is_summed_as_accurately_as_one_row() {
        let (batch, tokens, vocab) = (2, 3, 50_257);
        let logits: Vec<f32> = (0..batch * tokens * vocab)
            .map(|i| ((i * 7919 % 10_007) as f32 / 10_007.0 - 0.8) * 20.0)
            .collect();
        let x: Tensor<3> = Tensor::from_data(
            TensorData::new(logits.clone(), [batch, tokens, vocab]),
            &Device::default(),
        );
        let last = x.slice_dim(1, tokens - 1..tokens).reshape([batch, vocab]);
        let got = softmax_last(&last)
            .expect("the reshaped last position is dense")
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        for b in 0..batch {
            let row = &logits[(b * tokens + tokens - 1) * vocab..][..vocab];
            let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
            let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
            for (&p, &v) in got[b * vocab..][..vocab].iter().zip(row) {
                let exact = (v as f64 - max).exp() / sum;
                assert!(
                    ((p as f64 - exact) / exact).abs() < 1e-6,
                    "row {b}: {p} vs {exact}"
                );
            }
        }
    }
}

//! Rotary position embeddings (RoFormer, Su et al. 2021) with the scalings `transformers`
//! declares in `rope_parameters` / `rope_scaling`: `default`, `linear`, `dynamic`, `llama3`,
//! `yarn` (Peng et al. 2023) and `longrope` (Ding et al. 2024), each computed in f32 as
//! `transformers` computes it.
//!
//! [`Rotary::apply`] pairs dimension `i` with `i + D/2` (the "rotate half" convention of
//! GPT-NeoX and Llama); [`Rotary::apply_interleaved`] pairs `2i` with `2i + 1` (GPT-J's).

use std::f64::consts::PI;

use burn::tensor::{Device, Int, Tensor, TensorData};

use crate::cpu;

/// How the inverse frequencies are scaled.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    Default,
    /// Positions divided by `factor` (frequencies divided by `factor`).
    Linear {
        /// The factor.
        factor: f64,
    },
    /// NTK-aware: past `max_positions`, the base grows with the sequence length of the call.
    Dynamic {
        /// The factor.
        factor: f64,
        /// `max_position_embeddings`.
        max_positions: usize,
    },
    /// Llama 3: low frequencies divided by `factor`, high ones kept, a smooth ramp between.
    Llama3 {
        /// `factor`.
        factor: f64,
        /// `low_freq_factor`.
        low_freq_factor: f64,
        /// `high_freq_factor`.
        high_freq_factor: f64,
        /// `original_max_position_embeddings`.
        original_max_positions: f64,
    },
    /// YaRN: low frequencies divided by `factor` (interpolated), high ones kept
    /// (extrapolated), a linear ramp between over the dimensions whose wavelengths fall between
    /// `beta_fast` and `beta_slow` rotations in the pretraining context; cos and sin scaled by
    /// `attention_factor`.
    Yarn {
        /// `factor`.
        factor: f64,
        /// `original_max_position_embeddings`.
        original_max_positions: f64,
        /// `beta_fast`.
        beta_fast: f64,
        /// `beta_slow`.
        beta_slow: f64,
        /// Whether the ramp's ends are rounded outwards to whole dimensions (`truncate`).
        truncate: bool,
        /// The factor on cos and sin.
        attention_factor: f64,
    },
    /// LongRoPE (Phi-3): each frequency divided by its own factor, `short_factor`'s while a
    /// call's positions stay within `original_max_positions`, `long_factor`'s beyond (decided
    /// per call, as `transformers` decides it); cos and sin scaled by `attention_factor`.
    LongRope {
        /// Per-frequency factors within the pretraining context.
        short_factor: Vec<f64>,
        /// Per-frequency factors beyond it.
        long_factor: Vec<f64>,
        /// `original_max_position_embeddings`.
        original_max_positions: usize,
        /// The factor on cos and sin.
        attention_factor: f64,
    },
}

/// Rotary embedding of one head dimension.
#[derive(Debug, Clone, PartialEq)]
pub struct Rotary {
    head_dim: usize,
    theta: f64,
    scaling: RopeScaling,
}

impl Rotary {
    /// Rotary embedding over `head_dim` dimensions (the rotated ones, for partial rotary) with
    /// base `theta`.
    pub fn new(head_dim: usize, theta: f64, scaling: RopeScaling) -> Self {
        Rotary {
            head_dim,
            theta,
            scaling,
        }
    }

    /// Inverse frequencies for a call whose largest position is `max_position`.
    fn inv_freq(&self, max_position: usize) -> Vec<f32> {
        let dim = self.head_dim as f64;
        let base = match self.scaling {
            RopeScaling::Dynamic {
                factor,
                max_positions,
            } if max_position + 1 > max_positions => {
                let len = (max_position + 1) as f64;
                let max = max_positions as f64;
                self.theta * ((factor * len / max) - (factor - 1.0)).powf(dim / (dim - 2.0))
            }
            _ => self.theta,
        };
        // Computed in f32 like transformers: `base ** (arange(0, dim, 2).float() / dim)`.
        let powers = (0..self.head_dim / 2)
            .map(|i| (base as f32).powf((2 * i) as f32 / self.head_dim as f32));
        match &self.scaling {
            RopeScaling::Yarn {
                factor,
                original_max_positions,
                beta_fast,
                beta_slow,
                truncate,
                ..
            } => {
                let (low, high) = yarn_ramp(
                    dim,
                    base,
                    *original_max_positions,
                    (*beta_fast, *beta_slow),
                    *truncate,
                );
                powers
                    .enumerate()
                    .map(|(i, power)| {
                        let ramp = ((i as f32 - low as f32) / (high - low) as f32).clamp(0.0, 1.0);
                        let extrapolation = 1.0 - ramp;
                        let interpolated = 1.0 / (*factor as f32 * power);
                        interpolated * (1.0 - extrapolation) + (1.0 / power) * extrapolation
                    })
                    .collect()
            }
            RopeScaling::LongRope {
                short_factor,
                long_factor,
                original_max_positions,
                ..
            } => {
                let factors = match max_position + 1 > *original_max_positions {
                    true => long_factor,
                    false => short_factor,
                };
                powers
                    .zip(factors)
                    .map(|(power, factor)| 1.0 / (*factor as f32 * power))
                    .collect()
            }
            _ => powers.map(|power| self.scale(1.0 / power)).collect(),
        }
    }

    fn scale(&self, inv: f32) -> f32 {
        match self.scaling {
            RopeScaling::Linear { factor } => inv / factor as f32,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_positions,
            } => {
                let factor = factor as f32;
                let wavelen = 2.0 * PI as f32 / inv;
                let low_freq_wavelen = (original_max_positions / low_freq_factor) as f32;
                let high_freq_wavelen = (original_max_positions / high_freq_factor) as f32;
                if wavelen > low_freq_wavelen {
                    inv / factor
                } else if wavelen < high_freq_wavelen {
                    inv
                } else {
                    let smooth = (original_max_positions as f32 / wavelen - low_freq_factor as f32)
                        / (high_freq_factor - low_freq_factor) as f32;
                    (1.0 - smooth) * inv / factor + smooth * inv
                }
            }
            _ => inv,
        }
    }

    /// The factor on cos and sin (YaRN's and LongRoPE's attention factor; else 1).
    fn attention_factor(&self) -> Option<f32> {
        match self.scaling {
            RopeScaling::Yarn {
                attention_factor, ..
            }
            | RopeScaling::LongRope {
                attention_factor, ..
            } if attention_factor != 1.0 => Some(attention_factor as f32),
            _ => None,
        }
    }

    /// `(cos, sin)`, each `[B, 1, T, D]`, for `[B, T]` positions.
    pub fn cos_sin(&self, positions: &Tensor<2, Int>) -> (Tensor<4>, Tensor<4>) {
        let device: Device = positions.device();
        let [batch, tokens] = positions.dims();
        let max_position = positions.clone().max().into_scalar::<i64>().max(0) as usize;
        let half = self.head_dim / 2;
        let inv_freq: Tensor<3> = Tensor::from_data(
            TensorData::new(self.inv_freq(max_position), [1, 1, half]),
            &device,
        );
        let freqs = positions.clone().float().unsqueeze_dim::<3>(2) * inv_freq;
        let angles =
            Tensor::cat(vec![freqs.clone(), freqs], 2).reshape([batch, 1, tokens, self.head_dim]);
        let (cos, sin) = (angles.clone().cos(), angles.sin());
        match self.attention_factor() {
            Some(factor) => (cos * factor, sin * factor),
            None => (cos, sin),
        }
    }

    /// Rotates `[B, heads, T, D]` queries or keys. With partial rotary (`cos` narrower than
    /// `D`, as GPT-NeoX's `rotary_pct` makes it), the first dimensions rotate and the rest pass
    /// through.
    pub fn apply(x: Tensor<4>, cos: &Tensor<4>, sin: &Tensor<4>) -> Tensor<4> {
        cpu::rotate_half(&x, cos, sin).unwrap_or_else(|| Rotary::apply_tensors(x, cos, sin))
    }

    /// [`Rotary::apply`] as burn operations (other backends, gradients).
    fn apply_tensors(x: Tensor<4>, cos: &Tensor<4>, sin: &Tensor<4>) -> Tensor<4> {
        let [.., dim] = x.dims();
        let rotary = cos.dims()[3];
        let (x, pass) = if rotary < dim {
            let pass = x.clone().slice_dim(3, rotary..dim);
            (x.slice_dim(3, 0..rotary), Some(pass))
        } else {
            (x, None)
        };
        let first = x.clone().slice_dim(3, 0..rotary / 2);
        let second = x.clone().slice_dim(3, rotary / 2..rotary);
        let rotated = Tensor::cat(vec![second.neg(), first], 3);
        let x = x * cos.clone() + rotated * sin.clone();
        match pass {
            Some(pass) => Tensor::cat(vec![x, pass], 3),
            None => x,
        }
    }

    /// As [`Rotary::apply`], with GPT-J's pairing: dimension `2i` rotates with `2i + 1` by the
    /// `i`-th frequency. (The pairs are gathered into halves, rotated, and put back.)
    pub fn apply_interleaved(x: Tensor<4>, cos: &Tensor<4>, sin: &Tensor<4>) -> Tensor<4> {
        let [batch, heads, tokens, dim] = x.dims();
        let rotary = cos.dims()[3];
        let (rotated, pass) = if rotary < dim {
            let pass = x.clone().slice_dim(3, rotary..dim);
            (x.slice_dim(3, 0..rotary), Some(pass))
        } else {
            (x, None)
        };
        let halves = |x: Tensor<4>, shape: [usize; 5]| -> Tensor<4> {
            x.reshape(shape)
                .swap_dims(3, 4)
                .reshape([batch, heads, tokens, rotary])
        };
        let pairs = [batch, heads, tokens, rotary / 2, 2];
        let halved = halves(rotated, pairs);
        let turned = Rotary::apply(halved, cos, sin);
        let x = halves(turned, [batch, heads, tokens, 2, rotary / 2]);
        match pass {
            Some(pass) => Tensor::cat(vec![x, pass], 3),
            None => x,
        }
    }
}

/// The dimensions between which YaRN's ramp runs, as transformers' `find_correction_range`
/// computes them (in f64).
fn yarn_ramp(
    dim: f64,
    base: f64,
    original_max_positions: f64,
    (beta_fast, beta_slow): (f64, f64),
    truncate: bool,
) -> (f64, f64) {
    let correction = |rotations: f64| {
        dim * (original_max_positions / (rotations * 2.0 * PI)).ln() / (2.0 * base.ln())
    };
    let (mut low, mut high) = (correction(beta_fast), correction(beta_slow));
    if truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, high) = (low.max(0.0), high.min(dim - 1.0));
    // transformers' guard against a zero-width ramp.
    (low, if low == high { high + 0.001 } else { high })
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, TensorData};

    use super::*;

    /// Queries as the attention layers hand them over (a `[B, heads, T, D]` view of
    /// `[B, T, heads, D]`), rotated on the CPU kernel and as burn operations: whole and partial
    /// rotary, odd sizes, positions of several prompts.
    #[test]
    fn the_kernel_rotates_as_the_tensor_form_does() {
        let device = Device::default();
        let [batch, tokens, heads] = [2, 7, 3];
        for (dim, rotary_dims) in [(8, 8), (10, 6), (18, 18)] {
            let count = batch * tokens * heads * dim;
            let values: Vec<f32> = (0..count)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.03)
                .collect();
            let projected: Tensor<4> = Tensor::from_data(
                TensorData::new(values, [batch, tokens, heads, dim]),
                &device,
            );
            let x = projected.swap_dims(1, 2);
            let positions: Vec<i64> = (0..(batch * tokens) as i64).map(|p| 3 * p + 1).collect();
            let positions = Tensor::from_data(TensorData::new(positions, [batch, tokens]), &device);
            let rotary = Rotary::new(rotary_dims, 10_000.0, RopeScaling::Default);
            let (cos, sin) = rotary.cos_sin(&positions);
            let read = |t: Tensor<4>| t.into_data().try_to_vec::<f32>().unwrap();
            let kernel = cpu::rotate_half(&x, &cos, &sin).expect("f32 on the CPU backend");
            let tensors = Rotary::apply_tensors(x.clone(), &cos, &sin);
            assert_eq!(kernel.dims(), [batch, heads, tokens, dim]);
            assert_eq!(
                read(kernel),
                read(tensors),
                "head dim {dim}, rotary {rotary_dims}"
            );
        }
    }
}

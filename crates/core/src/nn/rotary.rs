//! Rotary position embeddings (RoFormer, Su et al. 2021) with the scalings `transformers`
//! declares in `rope_parameters` / `rope_scaling`: `default`, `linear`, `dynamic` and `llama3`.
//!
//! The rotation pairs dimension `i` with `i + D/2` (the "rotate half" convention).

use std::f64::consts::PI;

use burn::tensor::{Device, Int, Tensor, TensorData};

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
        (0..self.head_dim / 2)
            .map(|i| {
                // Computed in f32 like transformers: `base ** (arange(0, dim, 2).float() / dim)`.
                let exponent = (2 * i) as f32 / self.head_dim as f32;
                let inv = 1.0 / (base as f32).powf(exponent);
                self.scale(inv)
            })
            .collect()
    }

    fn scale(&self, inv: f32) -> f32 {
        match self.scaling {
            RopeScaling::Default | RopeScaling::Dynamic { .. } => inv,
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
        (angles.clone().cos(), angles.sin())
    }

    /// Rotates `[B, heads, T, D]` queries or keys. With partial rotary (`cos` narrower than
    /// `D`, as GPT-NeoX's `rotary_pct` makes it), the first dimensions rotate and the rest pass
    /// through.
    pub fn apply(x: Tensor<4>, cos: &Tensor<4>, sin: &Tensor<4>) -> Tensor<4> {
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
}

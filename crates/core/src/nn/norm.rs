//! Normalisation layers.

use burn::tensor::Tensor;
use burn::tensor::module::layer_norm;

use crate::adapter::PlainNorm;
use crate::error::Result;
use crate::weights::WeightScope;

impl PlainNorm {
    /// Normalises the last axis of `x`, with no gain or bias.
    pub fn apply<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        match *self {
            PlainNorm::Rms { eps } => rms_normalise(x, eps),
            PlainNorm::Layer { eps } => {
                let (variance, mean) = x.clone().var_mean_bias(D - 1);
                (x - mean) * (variance + eps).sqrt().recip()
            }
        }
    }
}

/// LayerNorm over the last axis, with weight and bias.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: Tensor<1>,
    bias: Tensor<1>,
    eps: f64,
}

impl LayerNorm {
    /// Loads the scope's `weight` and `bias`.
    pub fn load(mut scope: WeightScope<'_, '_>, size: usize, eps: f64) -> Result<Self> {
        check_eps(&mut scope, eps);
        Ok(LayerNorm {
            weight: scope.tensor("weight", [size])?,
            bias: scope.tensor("bias", [size])?,
            eps,
        })
    }

    /// Normalises the last axis.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        layer_norm(x, self.weight.clone(), Some(self.bias.clone()), self.eps)
    }

    /// Its arithmetic without the weight and bias.
    pub fn plain(&self) -> PlainNorm {
        PlainNorm::Layer { eps: self.eps }
    }

    /// The norm of `reference` `[B, T, H]` applied to `parts` `[B, T, N, H]` with the
    /// reference's standard deviation frozen and without the bias: each part centred, divided
    /// by the reference's `sqrt(var + eps)`, times the weight (see
    /// [`crate::adapter::OutputHead::final_norm_linearised`]).
    pub fn linearised(&self, reference: Tensor<3>, parts: Tensor<4>) -> Tensor<4> {
        let (variance, _) = reference.var_mean_bias(2);
        let scale = (variance + self.eps).sqrt().recip().unsqueeze_dim::<4>(2);
        let centred = parts.clone() - parts.mean_dim(3);
        centred * scale * self.weight.clone().unsqueeze::<4>()
    }
}

/// RMSNorm over the last axis: `x / sqrt(mean(x²) + eps) * weight`.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor<1>,
    eps: f64,
}

impl RmsNorm {
    /// Loads the scope's `weight`.
    pub fn load(mut scope: WeightScope<'_, '_>, size: usize, eps: f64) -> Result<Self> {
        check_eps(&mut scope, eps);
        Ok(RmsNorm {
            weight: scope.tensor("weight", [size])?,
            eps,
        })
    }

    /// Loads the scope's `weight` stored zero-centred, as Qwen3-Next and Qwen3.5 keep it: the
    /// scale is `1 + weight`.
    pub fn load_unit_offset(mut scope: WeightScope<'_, '_>, size: usize, eps: f64) -> Result<Self> {
        check_eps(&mut scope, eps);
        let stored: Tensor<1> = scope.tensor("weight", [size])?;
        Ok(RmsNorm {
            weight: stored + 1.0,
            eps,
        })
    }

    /// Normalises the last axis (in one pass a row on the CPU backend).
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        crate::cpu::rms_norm(&x, Some(&self.weight), self.eps)
            .unwrap_or_else(|| rms_normalise_tensors(x, self.eps) * self.weight.clone().unsqueeze())
    }

    /// Its arithmetic without the weight.
    pub fn plain(&self) -> PlainNorm {
        PlainNorm::Rms { eps: self.eps }
    }

    /// The norm of `reference` `[B, T, H]` applied to `parts` `[B, T, N, H]` with the
    /// reference's root mean square frozen (see
    /// [`crate::adapter::OutputHead::final_norm_linearised`]).
    pub fn linearised(&self, reference: Tensor<3>, parts: Tensor<4>) -> Tensor<4> {
        let mean_square = reference.powi_scalar(2).mean_dim(2);
        let scale = (mean_square + self.eps)
            .sqrt()
            .recip()
            .unsqueeze_dim::<4>(2);
        parts * scale * self.weight.clone().unsqueeze::<4>()
    }
}

/// Records a norm epsilon that is negative or not finite (it would turn every output NaN).
fn check_eps(scope: &mut WeightScope<'_, '_>, eps: f64) {
    if !(eps.is_finite() && eps >= 0.0) {
        scope.problem(format!(
            "the config's norm epsilon is {eps}; it must be a finite number >= 0"
        ));
    }
}

/// `x / sqrt(mean(x²) + eps)` over the last axis (in one pass a row on the CPU backend).
fn rms_normalise<const D: usize>(x: Tensor<D>, eps: f64) -> Tensor<D> {
    crate::cpu::rms_norm(&x, None, eps).unwrap_or_else(|| rms_normalise_tensors(x, eps))
}

/// [`rms_normalise`] as burn operations (other backends, gradients).
fn rms_normalise_tensors<const D: usize>(x: Tensor<D>, eps: f64) -> Tensor<D> {
    let mean_square = x.clone().powi_scalar(2).mean_dim(D - 1);
    x * (mean_square + eps).sqrt().recip()
}

/// Mamba-2's gated RMSNorm (`MambaRMSNormGated`): `x * silu(gate)`, normalised over each of
/// `groups` equal groups of the last axis on its own, times a weight.
#[derive(Debug, Clone)]
pub struct GatedRmsNorm {
    weight: Tensor<1>,
    groups: usize,
    eps: f64,
}

impl GatedRmsNorm {
    /// Loads the scope's `weight` `[size]`, normalised in `groups` groups (`size` is a
    /// multiple).
    pub fn load(
        mut scope: WeightScope<'_, '_>,
        size: usize,
        groups: usize,
        eps: f64,
    ) -> Result<Self> {
        check_eps(&mut scope, eps);
        if groups == 0 || !size.is_multiple_of(groups) {
            scope.problem(format!("{size} channels do not split into {groups} groups"));
        }
        Ok(GatedRmsNorm {
            weight: scope.tensor("weight", [size])?,
            groups: groups.max(1),
            eps,
        })
    }

    /// Gates `x` `[B, T, size]` by `silu(gate)`, then normalises group by group.
    pub fn forward(&self, x: Tensor<3>, gate: Tensor<3>) -> Tensor<3> {
        let [batch, tokens, size] = x.dims();
        let gated =
            (x * super::silu(gate)).reshape([batch, tokens, self.groups, size / self.groups]);
        rms_normalise(gated, self.eps).reshape([batch, tokens, size])
            * self.weight.clone().unsqueeze()
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, TensorData};

    use super::*;

    /// The one-pass kernel against burn's operations: rows of odd width, with and without a
    /// weight, a transposed (strided) input, values spanning six orders of magnitude.
    #[test]
    fn the_kernel_normalises_as_the_tensor_form_does() {
        let device = Device::default();
        let [rows, width]: [usize; 2] = [37, 45];
        let values: Vec<f32> = (0..rows * width)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) * 10f32.powi((i % 7) as i32 - 3))
            .collect();
        let x: Tensor<2> = Tensor::from_data(TensorData::new(values, [rows, width]), &device);
        let weights: Vec<f32> = (0..width).map(|i| 0.5 + i as f32 * 0.03).collect();
        let weight: Tensor<1> = Tensor::from_data(TensorData::new(weights, [width]), &device);
        let eps = 1e-5;
        let read = |t: Tensor<2>| t.into_data().try_to_vec::<f32>().unwrap();
        let close = |kernel: Tensor<2>, tensors: Tensor<2>| {
            for (a, b) in read(kernel).iter().zip(read(tensors)) {
                assert!((a - b).abs() <= 1e-6 * b.abs().max(1e-3), "{a} vs {b}");
            }
        };
        let kernel = |x: &Tensor<2>, weight: Option<&Tensor<1>>| {
            crate::cpu::rms_norm(x, weight, eps).expect("f32 on the CPU backend")
        };
        let expected = rms_normalise_tensors(x.clone(), eps) * weight.clone().unsqueeze();
        close(kernel(&x, Some(&weight)), expected);
        close(kernel(&x, None), rms_normalise_tensors(x.clone(), eps));
        let strided = x.clone().transpose();
        close(kernel(&strided, None), rms_normalise_tensors(strided, eps));
        // A weight of another width is left to burn's broadcast (and its error).
        assert!(crate::cpu::rms_norm(&x, Some(&weight.slice(0..width - 1)), eps).is_none());
    }
}

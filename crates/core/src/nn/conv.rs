//! Causal depthwise 1-D convolution with a carried window, as recurrent mixers (Mamba,
//! Mamba-2, Gated DeltaNet) use before their scan.
//!
//! It works time-major (`[B, T, channels]`, the layout of the projections around it): the
//! output is `kernel` shifted multiply-adds of contiguous slices, with no transposition and no
//! general convolution routine; on the CPU backend one pass of `cpu::causal_conv`, elsewhere
//! (and under gradients) burn's operations.

use burn::tensor::Tensor;

use crate::cpu;
use crate::error::Result;
use crate::weights::WeightScope;

/// A per-channel convolution over the last `kernel` positions.
#[derive(Debug, Clone)]
pub struct CausalConv1d {
    /// `[kernel, channels]`: row `j` multiplies the input `kernel - 1 - j` positions back.
    taps: Tensor<2>,
    bias: Option<Tensor<1>>,
    channels: usize,
    kernel: usize,
}

impl CausalConv1d {
    /// Loads a torch `nn.Conv1d(channels, channels, kernel, groups=channels)` stored under the
    /// scope (`weight` `[channels, 1, kernel]`, `bias`).
    pub fn load(
        mut scope: WeightScope<'_, '_>,
        channels: usize,
        kernel: usize,
        bias: bool,
    ) -> Result<Self> {
        if kernel == 0 {
            return Err(scope.refuse("the config's convolution kernel size is 0"));
        }
        let weight: Tensor<3> = scope.tensor("weight", [channels, 1, kernel])?;
        let bias = match bias {
            true => Some(scope.tensor("bias", [channels])?),
            false => None,
        };
        Ok(CausalConv1d {
            taps: weight.reshape([channels, kernel]).transpose(),
            bias,
            channels,
            kernel,
        })
    }

    /// Convolves `x` `[B, T, channels]`, continuing from `window` (the last `kernel` inputs of
    /// the previous call, `[B, kernel, channels]`; zeros when absent). Returns the output
    /// `[B, T, channels]` and the new window.
    pub fn forward(&self, x: Tensor<3>, window: Option<Tensor<3>>) -> (Tensor<3>, Tensor<3>) {
        let operands = cpu::ConvOperands {
            x: &x,
            window: window.as_ref(),
            taps: &self.taps,
            bias: self.bias.as_ref(),
        };
        if let Some(result) = cpu::causal_conv(&operands) {
            return result;
        }
        let [batch, tokens, channels] = x.dims();
        let kernel = self.kernel;
        let window =
            window.unwrap_or_else(|| Tensor::zeros([batch, kernel, channels], &x.device()));
        let extended = Tensor::cat(vec![window, x], 1);
        let total = kernel + tokens;
        let new_window = extended.clone().slice_dim(1, total - kernel..total);
        // Output t reads the `kernel` inputs ending at x_t: extended positions t+1 ..= t+kernel.
        let tap = |j: usize| {
            self.taps
                .clone()
                .slice_dim(0, j..j + 1)
                .reshape([1, 1, self.channels])
        };
        let mut output = extended.clone().slice_dim(1, 1..1 + tokens) * tap(0);
        for j in 1..kernel {
            output = output + extended.clone().slice_dim(1, 1 + j..1 + j + tokens) * tap(j);
        }
        let output = match &self.bias {
            Some(bias) => output + bias.clone().reshape([1, 1, self.channels]),
            None => output,
        };
        (output, new_window)
    }
}

//! Causal depthwise 1-D convolution with a carried window, as recurrent mixers (Mamba,
//! Mamba-2, Gated DeltaNet) use before their scan.

use burn::tensor::Tensor;
use burn::tensor::module::conv1d;
use burn::tensor::ops::ConvOptions;

use crate::loading::WeightLoader;

/// A per-channel convolution over the last `kernel` positions.
#[derive(Debug, Clone)]
pub struct CausalConv1d {
    /// `[channels, 1, kernel]`.
    weight: Tensor<3>,
    bias: Option<Tensor<1>>,
    channels: usize,
    kernel: usize,
}

impl CausalConv1d {
    /// Loads a torch `nn.Conv1d(channels, channels, kernel, groups=channels)` named `name`.
    pub fn load(
        loader: &mut WeightLoader<'_>,
        name: &str,
        channels: usize,
        kernel: usize,
        bias: bool,
    ) -> Self {
        CausalConv1d {
            weight: loader.tensor(&format!("{name}.weight"), [channels, 1, kernel]),
            bias: bias.then(|| loader.tensor(&format!("{name}.bias"), [channels])),
            channels,
            kernel,
        }
    }

    /// Convolves `x` `[B, channels, T]`, continuing from `window` (the last `kernel` inputs of
    /// the previous call, `[B, channels, kernel]`; zeros when absent). Returns the output
    /// `[B, channels, T]` and the new window.
    pub fn forward(&self, x: Tensor<3>, window: Option<Tensor<3>>) -> (Tensor<3>, Tensor<3>) {
        let [batch, channels, tokens] = x.dims();
        let window =
            window.unwrap_or_else(|| Tensor::zeros([batch, channels, self.kernel], &x.device()));
        let extended = Tensor::cat(vec![window, x], 2);
        let total = self.kernel + tokens;
        let new_window = extended.clone().slice_dim(2, total - self.kernel..total);
        let options = ConvOptions::new([1], [0], [1], self.channels);
        let input = extended.slice_dim(2, 1..total);
        let output = conv1d(input, self.weight.clone(), self.bias.clone(), options);
        (output, new_window)
    }
}

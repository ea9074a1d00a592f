//! Affine maps `y = x W + b`.
//!
//! The weight is kept as stored: a torch `[out, in]` matrix is used through a transposed view,
//! never copied. The map folds every leading axis into the rows of one 2-D matrix product, which
//! reads strided operands directly (burn's `linear` would first copy a strided weight, on every
//! call). Products with few rows (decoding) take the bandwidth-bound path of `matvec`.

use burn::tensor::Tensor;

use super::{Embedding, matvec};
use crate::error::Result;
use crate::loading::WeightLoader;

/// An affine map; `weight` is an `[in, out]` view of the stored matrix.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Tensor<2>,
    bias: Option<Tensor<1>>,
}

impl Linear {
    /// Loads a GPT-2-style `Conv1D` (`{name}.weight` stored `[in, out]`, `{name}.bias`).
    pub fn load_conv1d(
        loader: &mut WeightLoader<'_>,
        name: &str,
        d_in: usize,
        d_out: usize,
    ) -> Result<Self> {
        Ok(Linear {
            weight: loader.tensor(&format!("{name}.weight"), [d_in, d_out])?,
            bias: Some(loader.tensor(&format!("{name}.bias"), [d_out])?),
        })
    }

    /// Loads a torch `nn.Linear` (`{name}.weight` stored `[out, in]`), with its bias if `bias`.
    pub fn load_torch(
        loader: &mut WeightLoader<'_>,
        name: &str,
        d_in: usize,
        d_out: usize,
        bias: bool,
    ) -> Result<Self> {
        let weight: Tensor<2> = loader.tensor(&format!("{name}.weight"), [d_out, d_in])?;
        let bias = match bias {
            true => Some(loader.tensor(&format!("{name}.bias"), [d_out])?),
            false => None,
        };
        Ok(Linear {
            weight: weight.transpose(),
            bias,
        })
    }

    /// A bias-free map from an `[out, in]` matrix, e.g. a language-model head tied to the
    /// `[vocab, hidden]` embedding table.
    pub fn from_out_in(weight: Tensor<2>) -> Self {
        Linear {
            weight: weight.transpose(),
            bias: None,
        }
    }

    /// A language-model head: the embedding table itself when `tied`, else the stored torch
    /// `[vocab, hidden]` matrix `{name}.weight`.
    pub fn head(
        loader: &mut WeightLoader<'_>,
        name: &str,
        embeddings: &Embedding,
        tied: bool,
    ) -> Result<Self> {
        let table = embeddings.table();
        if tied {
            return Ok(Linear::from_out_in(table));
        }
        let [vocab, hidden] = table.dims();
        Linear::load_torch(loader, name, hidden, vocab, false)
    }

    /// Applies the map to the last axis.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let mut dims = x.dims();
        let d_in = dims[D - 1];
        let rows = dims[..D - 1].iter().product::<usize>();
        let x = x.reshape([rows, d_in]);
        dims[D - 1] = self.weight.dims()[1];
        if let Some(y) = matvec::try_forward(&x, &self.weight, self.bias.as_ref()) {
            return y.reshape(dims);
        }
        let y = x.matmul(self.weight.clone());
        let y = match &self.bias {
            Some(bias) => y + bias.clone().unsqueeze::<2>(),
            None => y,
        };
        y.reshape(dims)
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, TensorData};

    use super::*;

    fn random(dims: [usize; 2], seed: u64) -> Tensor<2> {
        let mut rng = fastrand::Rng::with_seed(seed);
        let values = (0..dims[0] * dims[1]).map(|_| rng.f32() - 0.5).collect();
        Tensor::from_data(TensorData::new(values, dims), &Device::default())
    }

    /// Both stored orientations `Linear` keeps (a `Conv1D` `[in, out]` matrix with bias, a
    /// torch/tied `[out, in]` matrix viewed transposed) take the few-row path, and a decode-sized
    /// call agrees with the same rows computed by burn's matmul inside a longer call.
    #[test]
    fn decode_rows_take_the_few_row_path_and_match_long_calls() {
        let (d_in, d_out, rows) = (24, 40, matvec::MAX_ROWS + 4);
        let bias = random([1, d_out], 3).reshape([d_out]);
        let maps = [
            Linear {
                weight: random([d_in, d_out], 1),
                bias: Some(bias),
            },
            Linear::from_out_in(random([d_out, d_in], 2)),
        ];
        let long = random([rows, d_in], 4);
        for map in maps {
            let first = long.clone().slice([0..1, 0..d_in]);
            assert!(matvec::try_forward(&first, &map.weight, map.bias.as_ref()).is_some());
            assert!(matvec::try_forward(&long, &map.weight, map.bias.as_ref()).is_none());
            let alone = map.forward(first).into_data().try_to_vec::<f32>().unwrap();
            let within = map.forward(long.clone()).slice([0..1, 0..d_out]);
            let within = within.into_data().try_to_vec::<f32>().unwrap();
            for (a, b) in alone.iter().zip(&within) {
                assert!((a - b).abs() < 1e-5, "{a} vs {b}");
            }
        }
    }
}

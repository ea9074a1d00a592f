//! Affine maps `y = x W + b`.
//!
//! The map folds every leading axis into the rows of one 2-D matrix product. On the CPU
//! (`flex`) backend the weight is packed once, at load, straight from the checkpoint into the
//! panels of `packed`, in the load's precision (f32, bf16 or f16), and every product, prompt
//! call or decode step, runs there, accumulating in f32. On other backends the weight stays a
//! burn tensor: a torch `[out, in]` matrix used through a transposed view, which burn's matmul
//! reads directly (burn's `linear` would copy it on every call).

use std::ops::Range;
use std::sync::Arc;

use burn::tensor::Tensor;

use super::embedding::{Embedding, Table};
use crate::cpu::{self, PackedMatrix, TrackedMatrix};
use crate::error::Result;
use crate::precision::WeightDtype;
use crate::weights::{Matrix, Orientation, WeightLoader, WeightScope, index_tensor};

/// How the parts of a fused projection are laid out along its outputs (see [`Linear::split`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FusedLayout {
    /// Each part's outputs together, the parts one after another.
    Blocks,
    /// Per head, a slice of each part, for this many heads.
    PerHead(usize),
}

/// An affine map from the last axis of its input.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Weight,
    bias: Option<Tensor<1>>,
}

/// Where a map's weight lives.
#[derive(Debug, Clone)]
enum Weight {
    /// Packed for the CPU kernels (`flex` backend, f32).
    Packed(Arc<PackedMatrix>),
    /// Packed both ways for products with their own backward pass (a model loaded for
    /// gradients on the CPU: burn's autodiff over `flex`).
    Tracked(Arc<TrackedMatrix>),
    /// An `[in, out]` view of the stored matrix, for burn's matmul.
    Tensor(Box<Tensor<2>>),
}

impl Weight {
    /// Packs an `[in, out]` view when it lives on the CPU backend as f32, with or without
    /// autodiff; elsewhere keeps the tensor.
    fn new(weight: Tensor<2>) -> Self {
        if let Some(packed) = cpu::pack_view(&weight) {
            return Weight::Packed(Arc::new(packed));
        }
        match cpu::pack_tracked(&weight) {
            Some(tracked) => Weight::Tracked(Arc::new(tracked)),
            None => Weight::Tensor(Box::new(weight)),
        }
    }

    /// Loads the scope's matrix `weight` stored with `shape` in `orientation`, keeping the
    /// output units `outputs` if given.
    fn load(
        scope: &mut WeightScope<'_, '_>,
        shape: [usize; 2],
        orientation: Orientation,
        outputs: Option<&[usize]>,
    ) -> Result<Self> {
        let name = scope.key("weight");
        Ok(
            match scope
                .loader()
                .matrix_outputs(&name, shape, orientation, outputs)?
            {
                Matrix::Packed(packed) => Weight::Packed(Arc::new(packed)),
                Matrix::Tensor(tensor) => Weight::new(*tensor),
            },
        )
    }
}

impl Linear {
    /// Loads a GPT-2-style `Conv1D` (the scope's `weight` stored `[in, out]`, and `bias`).
    pub fn load_conv1d(mut scope: WeightScope<'_, '_>, d_in: usize, d_out: usize) -> Result<Self> {
        Ok(Linear {
            weight: Weight::load(&mut scope, [d_in, d_out], Orientation::InOut, None)?,
            bias: Some(scope.tensor("bias", [d_out])?),
        })
    }

    /// Loads a torch `nn.Linear` (the scope's `weight` stored `[out, in]`), with its `bias`
    /// if `bias`.
    pub fn load_torch(
        mut scope: WeightScope<'_, '_>,
        d_in: usize,
        d_out: usize,
        bias: bool,
    ) -> Result<Self> {
        let weight = Weight::load(&mut scope, [d_out, d_in], Orientation::OutIn, None)?;
        let bias = match bias {
            true => Some(scope.tensor("bias", [d_out])?),
            false => None,
        };
        Ok(Linear { weight, bias })
    }

    /// One part of a fused torch `nn.Linear` whose `weight` is stored `[stored_out, in]`: the
    /// map to the output units `outputs` (in that order), with their `bias` entries if `bias`.
    /// [`Linear::split`] names the parts of the usual layouts.
    pub fn load_torch_part(
        mut scope: WeightScope<'_, '_>,
        d_in: usize,
        stored_out: usize,
        outputs: &[usize],
        bias: bool,
    ) -> Result<Self> {
        let shape = [stored_out, d_in];
        let weight = Weight::load(&mut scope, shape, Orientation::OutIn, Some(outputs))?;
        let bias = match bias {
            true => {
                let bias: Tensor<1> = scope.tensor("bias", [stored_out])?;
                let indices = index_tensor(outputs, &bias.device());
                Some(bias.select(0, indices))
            }
            false => None,
        };
        Ok(Linear { weight, bias })
    }

    /// The output units of each part of a fused projection whose parts have `widths`:
    /// `Blocks` stores them one after another (`[q | k | v]`, Phi-3's `qkv_proj` and
    /// `gate_up_proj`), `PerHead(heads)` interleaves them per head (`[q_h | k_h | v_h]` for each
    /// head `h`, GPT-NeoX's `query_key_value`; each width is then `heads` times its head's).
    pub fn split(widths: &[usize], layout: FusedLayout) -> Vec<Vec<usize>> {
        match layout {
            FusedLayout::Blocks => {
                let mut start = 0;
                widths
                    .iter()
                    .map(|&width| {
                        start += width;
                        (start - width..start).collect()
                    })
                    .collect()
            }
            FusedLayout::PerHead(heads) => {
                let per_head: Vec<usize> = widths.iter().map(|w| w / heads.max(1)).collect();
                let stride: usize = per_head.iter().sum();
                (0..widths.len())
                    .map(|part| {
                        let offset: usize = per_head[..part].iter().sum();
                        (0..heads)
                            .flat_map(|h| {
                                let start = h * stride + offset;
                                start..start + per_head[part]
                            })
                            .collect()
                    })
                    .collect()
            }
        }
    }

    /// The loader's stored `[in, out]` matrix `name`, in the load's precision (packed straight
    /// from the checkpoint's bytes on the CPU backend), with an optional bias `[out]`: e.g. a
    /// dictionary's decoder, used as stored.
    pub(crate) fn load_in_out(
        loader: &mut WeightLoader<'_>,
        name: &str,
        shape: [usize; 2],
        bias: Option<Tensor<1>>,
    ) -> Result<Self> {
        let weight = match loader.matrix(name, shape, Orientation::InOut)? {
            Matrix::Packed(packed) => Weight::Packed(Arc::new(packed)),
            Matrix::Tensor(tensor) => Weight::new(*tensor),
        };
        Ok(Linear { weight, bias })
    }

    /// The precision its matrix is held in.
    pub fn dtype(&self) -> WeightDtype {
        match &self.weight {
            Weight::Packed(packed) => packed.dtype(),
            Weight::Tracked(tracked) => tracked.forward().dtype(),
            Weight::Tensor(_) => WeightDtype::F32,
        }
    }

    /// A map from an `[in, out]` matrix and an optional bias `[out]` (e.g. a dictionary's
    /// encoder, built from stored tensors after folding constants into them).
    pub fn from_in_out(weight: Tensor<2>, bias: Option<Tensor<1>>) -> Self {
        Linear {
            weight: Weight::new(weight),
            bias,
        }
    }

    /// A bias-free map from an `[out, in]` matrix, e.g. a language-model head tied to the
    /// `[vocab, hidden]` embedding table.
    pub fn from_out_in(weight: Tensor<2>) -> Self {
        Linear {
            weight: Weight::new(weight.transpose()),
            bias: None,
        }
    }

    /// A language-model head: the embedding table itself when `tied` (one copy serves both),
    /// else the scope's stored torch `[vocab, hidden]` matrix `weight`.
    pub fn head(scope: WeightScope<'_, '_>, embeddings: &Embedding, tied: bool) -> Result<Self> {
        if tied {
            return Ok(Linear::tied_to(embeddings));
        }
        let [vocab, hidden] = embeddings.dims();
        Linear::load_torch(scope, hidden, vocab, false)
    }

    /// A language-model head tied to `embeddings`: on the CPU it shares the packed table (both
    /// ways under autodiff).
    pub(crate) fn tied_to(embeddings: &Embedding) -> Self {
        let weight = match embeddings.table() {
            Table::Dense(table) => return Linear::from_out_in(table.as_ref().clone()),
            Table::Packed(packed) => Weight::Packed(packed.clone()),
            Table::Tracked(tracked) => Weight::Tracked(tracked.clone()),
        };
        Linear { weight, bias: None }
    }

    /// The packed weight, where the map has one.
    #[cfg(test)]
    pub(crate) fn packed(&self) -> Option<Arc<PackedMatrix>> {
        match &self.weight {
            Weight::Packed(packed) => Some(packed.clone()),
            Weight::Tracked(_) | Weight::Tensor(_) => None,
        }
    }

    /// The input width.
    pub fn d_in(&self) -> usize {
        match &self.weight {
            Weight::Packed(packed) => packed.d_in(),
            Weight::Tracked(tracked) => tracked.forward().d_in(),
            Weight::Tensor(weight) => weight.dims()[0],
        }
    }

    /// The output width.
    pub fn d_out(&self) -> usize {
        match &self.weight {
            Weight::Packed(packed) => packed.d_out(),
            Weight::Tracked(tracked) => tracked.forward().d_out(),
            Weight::Tensor(weight) => weight.dims()[1],
        }
    }

    /// The bias, if the map has one.
    pub fn bias(&self) -> Option<&Tensor<1>> {
        self.bias.as_ref()
    }

    /// Applies the map to the last axis.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let bias = self.bias.as_ref();
        let inputs = 0..self.d_in();
        over_rows(x, self.d_out(), |x| match &self.weight {
            Weight::Packed(packed) => cpu::multiply(packed, x, bias),
            Weight::Tracked(tracked) => cpu::tracked_multiply(tracked, x, inputs, bias),
            Weight::Tensor(weight) => burn_forward(x, weight, bias),
        })
    }

    /// Applies each of `maps`, which read the same input width, to the last axis of `x`: on the
    /// CPU one product over all their packed weights (the activations packed once, one
    /// parallel loop; see [`PackedMatrix::multiply_each`]), elsewhere one map after another.
    /// A layer's query, key and value maps, or a gated MLP's gate and up maps, are applied so.
    pub fn forward_each<const D: usize, const N: usize>(
        maps: [&Linear; N],
        x: Tensor<D>,
    ) -> [Tensor<D>; N] {
        let packed: Vec<_> = maps
            .iter()
            .filter_map(|map| match &map.weight {
                Weight::Packed(packed) => Some((packed.as_ref(), map.bias.as_ref())),
                Weight::Tracked(_) | Weight::Tensor(_) => None,
            })
            .collect();
        if packed.len() < N || N < 2 {
            return maps.map(|map| map.forward(x.clone()));
        }
        let (folded, dims) = fold_rows(x);
        let mut outputs = cpu::multiply_each(&packed, folded).into_iter();
        maps.map(|map| unfold_rows(outputs.next().expect("one output a map"), dims, map.d_out()))
    }

    /// The matrix's input rows `inputs` alone, without the bias, applied to the last axis of
    /// `x` (`inputs.len()` wide): one attention head's share of an output projection.
    ///
    /// # Panics
    /// If `inputs` is not inside `0..d_in` or `x`'s last axis is not `inputs.len()` wide (a
    /// caller bug).
    pub fn forward_inputs<const D: usize>(&self, x: Tensor<D>, inputs: Range<usize>) -> Tensor<D> {
        assert_eq!(x.dims()[D - 1], inputs.len(), "input width");
        let d_out = self.d_out();
        over_rows(x, d_out, |x| match &self.weight {
            Weight::Packed(packed) => cpu::multiply_inputs(packed, x, inputs),
            Weight::Tracked(tracked) => cpu::tracked_multiply(tracked, x, inputs, None),
            Weight::Tensor(weight) => x.matmul(weight.clone().slice([inputs, 0..d_out])),
        })
    }
}

/// `product` on `x` with every leading axis folded into the rows of one `[rows, in]` matrix,
/// the result `[rows, d_out]` unfolded again.
fn over_rows<const D: usize>(
    x: Tensor<D>,
    d_out: usize,
    product: impl FnOnce(Tensor<2>) -> Tensor<2>,
) -> Tensor<D> {
    let (folded, dims) = fold_rows(x);
    unfold_rows(product(folded), dims, d_out)
}

/// `x` with every leading axis folded into the rows of one `[rows, in]` matrix, and its dims.
fn fold_rows<const D: usize>(x: Tensor<D>) -> (Tensor<2>, [usize; D]) {
    let dims = x.dims();
    let rows = dims[..D - 1].iter().product::<usize>();
    (x.reshape([rows, dims[D - 1]]), dims)
}

/// A product's `[rows, d_out]` result with the leading axes of `dims` unfolded again.
fn unfold_rows<const D: usize>(y: Tensor<2>, mut dims: [usize; D], d_out: usize) -> Tensor<D> {
    dims[D - 1] = d_out;
    y.reshape(dims)
}

/// `x W + b` through burn's matmul.
fn burn_forward(x: Tensor<2>, weight: &Tensor<2>, bias: Option<&Tensor<1>>) -> Tensor<2> {
    let y = x.matmul(weight.clone());
    match bias {
        Some(bias) => y + bias.clone().unsqueeze::<2>(),
        None => y,
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

    /// Both stored orientations (a `Conv1D` `[in, out]` matrix with bias, a torch/tied
    /// `[out, in]` matrix viewed transposed) are packed, and decode-sized and prompt-sized calls,
    /// with leading axes folded, agree with burn's matmul on the original matrices.
    #[test]
    fn packed_maps_match_burn_matmul_in_both_orientations() {
        let (d_in, d_out) = (24, 40);
        let bias = random([1, d_out], 3).reshape([d_out]);
        let in_out = random([d_in, d_out], 1);
        let out_in = random([d_out, d_in], 2);
        let maps = [
            (
                Linear {
                    weight: Weight::new(in_out.clone()),
                    bias: Some(bias.clone()),
                },
                in_out,
                Some(bias),
            ),
            (
                Linear::from_out_in(out_in.clone()),
                out_in.transpose(),
                None,
            ),
        ];
        for (map, weight, bias) in maps {
            assert!(matches!(map.weight, Weight::Packed(_)), "packed on flex");
            for rows in [1, 9, 40] {
                let x = random([rows, d_in], 4 + rows as u64);
                let mut expected = x.clone().matmul(weight.clone());
                if let Some(bias) = &bias {
                    expected = expected + bias.clone().unsqueeze::<2>();
                }
                let folded = map
                    .forward(x.reshape([1, rows, d_in]))
                    .reshape([rows, d_out]);
                let folded = folded.into_data().try_to_vec::<f32>().unwrap();
                let expected = expected.into_data().try_to_vec::<f32>().unwrap();
                for (a, b) in folded.iter().zip(&expected) {
                    assert!((a - b).abs() < 1e-5, "{rows} rows: {a} vs {b}");
                }
            }
        }
    }

    /// Maps applied together give what each gives alone, leading axes folded: packed maps of
    /// different widths with and without bias (one product), and a set holding a burn-tensor
    /// map (one map after another).
    #[test]
    fn maps_applied_together_match_each_map_alone() {
        let d_in = 24;
        let packed = |d_out: usize, seed: u64, bias: bool| Linear {
            weight: Weight::new(random([d_in, d_out], seed)),
            bias: bias.then(|| random([1, d_out], seed + 1).reshape([d_out])),
        };
        let tensor = Linear {
            weight: Weight::Tensor(Box::new(random([d_in, 8], 9))),
            bias: None,
        };
        let (q, k, v) = (
            packed(40, 1, true),
            packed(8, 3, false),
            packed(33, 5, true),
        );
        assert!(matches!(q.weight, Weight::Packed(_)), "packed on flex");
        let x = random([7, d_in], 7).reshape([1, 7, d_in]);
        let sets: [[&Linear; 3]; 2] = [[&q, &k, &v], [&q, &tensor, &v]];
        for maps in sets {
            let together = Linear::forward_each(maps, x.clone());
            for (map, y) in maps.iter().zip(together) {
                let alone = map
                    .forward(x.clone())
                    .into_data()
                    .try_to_vec::<f32>()
                    .unwrap();
                assert_eq!(y.dims(), [1, 7, map.d_out()]);
                let y = y.into_data().try_to_vec::<f32>().unwrap();
                for (a, b) in y.iter().zip(&alone) {
                    assert!((a - b).abs() < 1e-6, "{} wide: {a} vs {b}", map.d_out());
                }
            }
        }
    }

    /// A range of the matrix's inputs alone, packed and as a burn tensor (the other backends'
    /// form), agrees with burn's matmul on those rows of the matrix, without the bias.
    #[test]
    fn input_ranges_match_burn_matmul_on_those_rows() {
        let (d_in, d_out) = (24, 40);
        let weight = random([d_in, d_out], 5);
        let bias = Some(random([1, d_out], 6).reshape([d_out]));
        let maps = [
            Linear {
                weight: Weight::new(weight.clone()),
                bias: bias.clone(),
            },
            Linear {
                weight: Weight::Tensor(Box::new(weight.clone())),
                bias,
            },
        ];
        for (map, inputs) in maps
            .iter()
            .flat_map(|m| [(m, 0..8), (m, 8..24), (m, 23..24)])
        {
            let x = random([3, inputs.len()], 7);
            let expected = x
                .clone()
                .matmul(weight.clone().slice([inputs.clone(), 0..d_out]));
            let got = map
                .forward_inputs(x.reshape([1, 3, inputs.len()]), inputs.clone())
                .reshape([3, d_out]);
            let got = got.into_data().try_to_vec::<f32>().unwrap();
            let expected = expected.into_data().try_to_vec::<f32>().unwrap();
            for (a, b) in got.iter().zip(&expected) {
                assert!((a - b).abs() < 1e-5, "inputs {inputs:?}: {a} vs {b}");
            }
        }
    }
}

//! The packed products and GELU on burn's autodiff over the CPU backend (`Autodiff<Flex>`, a
//! model loaded for gradients), with backward passes of their own.
//!
//! Composed from burn's tensor operations, a gradient run took every product through burn's
//! `gemm` (repacking the weight on each call, forward and backward) and GELU through a scalar
//! `tanh` several times over. Here each is one autodiff operation: the forward pass runs the
//! packed kernels of a plain run, and the backward pass multiplies the output's gradient by the
//! transposed matrix, packed once at load for that direction (`x W` has `dL/dx = dL/dy Wᵀ`; the
//! weights keep no gradient). A map from an input range (one head's rows of an output
//! projection) multiplies forward by those rows alone and backward by the whole transposed
//! matrix, keeping the range's columns.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, NodeGuard, Ops, OpsKind, unary};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::tensor::{DType, Tensor};
use rayon::prelude::*;

use super::elementwise::{CHUNK, SQRT_2_OVER_PI, exp_f32, gelu_tanh_slice, map_slice};
use super::host::{contiguous_f32, contiguous_values, host_storage};
use super::isa::per_vector_level;
use super::packed::PackedMatrix;
use crate::precision::WeightDtype;

/// The CPU backend under autodiff, as the dispatch device builds it (no checkpointing).
type Tracked = Autodiff<Flex>;

/// A weight packed for both directions of a tracked product: `[in, out]` for the forward
/// pass, `[out, in]` for the input's gradient.
#[derive(Debug)]
pub(crate) struct TrackedMatrix {
    forward: PackedMatrix,
    backward: Arc<PackedMatrix>,
}

impl TrackedMatrix {
    /// The forward matrix (sizes, precision).
    pub(crate) fn forward(&self) -> &PackedMatrix {
        &self.forward
    }
}

/// Packs an `[in, out]` view (any strides) both ways when it lives on the autodiff CPU backend
/// as `f32`.
pub(crate) fn pack_tracked(weight: &Tensor<2>) -> Option<TrackedMatrix> {
    let primitive = weight.clone().try_into_primitive::<Tracked>().ok()?;
    let primitive = primitive.primitive();
    if primitive.dtype() != DType::F32 {
        return None;
    }
    let [d_in, d_out] = weight.dims();
    let element = super::packed_tensors::strided_element(primitive, [d_in, d_out])?;
    Some(TrackedMatrix {
        forward: PackedMatrix::pack(WeightDtype::F32, d_in, d_out, &element),
        backward: Arc::new(PackedMatrix::pack(WeightDtype::F32, d_out, d_in, |n, k| {
            element(k, n)
        })),
    })
}

/// `x W[inputs, :] + b` for `x` `[rows, inputs.len()]`, as one tracked operation on the
/// autodiff CPU backend (`x` is moved there if it is a plain CPU tensor).
///
/// # Panics
/// If `x` lives on another backend (a tracked matrix is only loaded where its activations live)
/// or is not `inputs.len()` wide (a caller bug).
pub(crate) fn multiply(
    matrix: &TrackedMatrix,
    x: Tensor<2>,
    inputs: Range<usize>,
    bias: Option<&Tensor<1>>,
) -> Tensor<2> {
    let [rows, width] = x.dims();
    assert_eq!(width, inputs.len(), "input width");
    let (values, node) = x
        .autodiff()
        .try_into_primitive::<Tracked>()
        .expect("a tracked matrix meets activations on the autodiff CPU backend")
        .into_parts();
    let values = contiguous_f32(values);
    let x_values = contiguous_values(&values);
    let bias: Option<Vec<f32>> = bias.map(|bias| {
        bias.clone()
            .into_data()
            .convert::<f32>()
            .iter::<f32>()
            .collect()
    });
    let forward = &matrix.forward;
    let y = if inputs == (0..forward.d_in()) {
        forward.multiply(x_values, rows, bias.as_deref())
    } else {
        let mut y = forward.multiply_inputs(x_values, rows, inputs.clone());
        if let Some(bias) = &bias {
            for row in y.chunks_exact_mut(forward.d_out()) {
                row.iter_mut().zip(bias).for_each(|(y, b)| *y += b);
            }
        }
        y
    };
    let y = host_storage(y, vec![rows, forward.d_out()]);
    let gradient = InputGradient::Product {
        transposed: matrix.backward.clone(),
        inputs,
    };
    finish(node, gradient, y)
}

/// The tanh approximation of GELU on the autodiff CPU backend, as one tracked operation;
/// `None` for a tensor elsewhere.
pub(crate) fn gelu_tanh<const D: usize>(x: &Tensor<D>) -> Option<Tensor<D>> {
    let (values, node) = x.clone().try_into_primitive::<Tracked>().ok()?.into_parts();
    let values = contiguous_f32(values);
    let y = map_slice(contiguous_values(&values), CHUNK, gelu_tanh_slice);
    let y = host_storage(y, x.dims().to_vec());
    Some(finish(node, InputGradient::GeluTanh { input: values }, y))
}

/// How a tracked operation turns its output's gradient into its input's.
#[derive(Clone)]
enum InputGradient {
    /// `dL/dx = dL/dy Wᵀ`, keeping the columns of `inputs`.
    Product {
        transposed: Arc<PackedMatrix>,
        inputs: Range<usize>,
    },
    /// `dL/dx = dL/dy gelu'(x)`.
    GeluTanh { input: FlexTensor },
}

impl fmt::Debug for InputGradient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InputGradient::Product { inputs, .. } => write!(f, "Product({inputs:?})"),
            InputGradient::GeluTanh { .. } => write!(f, "GeluTanh"),
        }
    }
}

impl InputGradient {
    fn apply(self, output_gradient: FlexTensor) -> FlexTensor {
        let output_gradient = contiguous_f32(output_gradient);
        let dims = output_gradient.layout().shape().to_vec();
        let gradient = contiguous_values(&output_gradient);
        match self {
            InputGradient::Product { transposed, inputs } => {
                let rows = gradient.len() / transposed.d_in().max(1);
                let full = transposed.multiply(gradient, rows, None);
                let d_in = transposed.d_out();
                let kept = if inputs.len() == d_in {
                    full
                } else {
                    full.chunks_exact(d_in)
                        .flat_map(|row| &row[inputs.clone()])
                        .copied()
                        .collect()
                };
                host_storage(kept, vec![rows, inputs.len()])
            }
            InputGradient::GeluTanh { input } => {
                let x = contiguous_values(&input);
                let mut out = vec![0.0f32; x.len()];
                out.par_chunks_mut(CHUNK)
                    .zip(x.par_chunks(CHUNK).zip(gradient.par_chunks(CHUNK)))
                    .for_each(|(out, (x, g))| gelu_tanh_gradient(x, g, out));
                host_storage(out, dims)
            }
        }
    }
}

/// The autodiff step of every operation here: hands the output's gradient to
/// [`InputGradient::apply`].
#[derive(Debug)]
struct HostBackward;

impl Backward<Flex, 1> for HostBackward {
    type State = InputGradient;

    fn backward(self, ops: Ops<InputGradient, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let state = ops.state;
        unary::<Flex, _>(ops.parents, ops.node, grads, |gradient| {
            state.apply(gradient)
        });
    }
}

/// Registers `output` as computed from the tensor of `node`, with `gradient` for its backward
/// pass when the input is tracked.
fn finish<const D: usize>(
    node: NodeGuard,
    gradient: InputGradient,
    output: FlexTensor,
) -> Tensor<D> {
    let output = match HostBackward
        .prepare::<NoCheckpointing>([node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(gradient, output),
        OpsKind::UnTracked(prep) => prep.finish(output),
    };
    Tensor::from_primitive::<Tracked>(output)
}

per_vector_level! {
    /// `g * d/dx [x sigmoid(2u)]` with `u = sqrt(2/pi) (x + 0.044715 x^3)`:
    /// `s + x s (1 - s) 2 u'` where `s = sigmoid(2u)`.
    fn gelu_tanh_gradient(x: &[f32], g: &[f32], out: &mut [f32]) {
        const TWO_C: f32 = (2.0 * SQRT_2_OVER_PI) as f32;
        for ((y, &x), &g) in out.iter_mut().zip(x).zip(g) {
            let x2 = x * x;
            let s = 1.0 / (1.0 + exp_f32(-TWO_C * (x + 0.044715 * x2 * x)));
            let du2 = TWO_C * (1.0 + 3.0 * 0.044715 * x2);
            *y = g * (s + x * s * (1.0 - s) * du2);
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, TensorData, activation};

    use super::*;

    fn random(dims: [usize; 2], seed: u64, device: &Device) -> Tensor<2> {
        let mut rng = fastrand::Rng::with_seed(seed);
        let values = (0..dims[0] * dims[1])
            .map(|_| rng.f32() * 4.0 - 2.0)
            .collect();
        Tensor::from_data(TensorData::new(values, dims), device)
    }

    fn values<const D: usize>(tensor: Tensor<D>) -> Vec<f32> {
        tensor
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .unwrap()
    }

    fn assert_close(got: &[f32], expected: &[f32], what: &str) {
        assert_eq!(got.len(), expected.len(), "{what}: length");
        for (i, (a, b)) in got.iter().zip(expected).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                "{what}[{i}]: {a} vs {b}"
            );
        }
    }

    /// `gelu(x W[inputs, :] + b)` summed against fixed weights, with the tracked product and
    /// GELU, has the value and the input gradient of the same function composed from burn's
    /// own operations under autodiff: for the whole input width and for a range of it (odd
    /// sizes: partial panels both ways).
    #[test]
    fn tracked_product_and_gelu_match_burns_autodiff() {
        let device = Device::default().autodiff();
        let (rows, d_in, d_out) = (7, 37, 45);
        let weight = random([d_in, d_out], 1, &device);
        let bias = random([1, d_out], 2, &device).reshape([d_out]);
        let tracked = pack_tracked(&weight).expect("packed on the autodiff CPU backend");
        let probe = random([rows, d_out], 3, &device);
        for inputs in [0..d_in, 5..16] {
            let width = inputs.len();
            let x = random([rows, width], 4, &device).require_grad();
            let ours = multiply(&tracked, x.clone(), inputs.clone(), Some(&bias));
            let ours = gelu_tanh(&ours).expect("tracked GELU");
            let ours_metric = (ours.clone() * probe.clone()).sum();
            let ours_gradient = ours_metric.backward();
            let ours_gradient = x.grad(&ours_gradient).expect("gradient reached x");

            let x = x.detach().require_grad();
            let rows_of = weight.clone().slice([inputs.clone(), 0..d_out]);
            let theirs = x.clone().matmul(rows_of) + bias.clone().unsqueeze::<2>();
            let theirs = activation::gelu_approximate(theirs);
            let theirs_metric = (theirs.clone() * probe.clone()).sum();
            let theirs_gradient = theirs_metric.backward();
            let theirs_gradient = x.grad(&theirs_gradient).expect("gradient reached x");

            let what = format!("inputs {inputs:?}");
            assert_close(&values(ours), &values(theirs), &format!("{what} value"));
            assert_close(
                &values(ours_gradient),
                &values(theirs_gradient),
                &format!("{what} gradient"),
            );
        }
    }
}

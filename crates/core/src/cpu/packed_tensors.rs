//! The packed products on burn tensors: packing a weight that lives on the CPU backend,
//! multiplying activations by a packed weight, and looking rows up in a packed embedding table.
//! A packed weight exists only on the CPU backend, so these always apply once one does.

use std::ops::Range;

use burn::backend::flex::FlexTensor;
use burn::tensor::{Int, Tensor};

use super::host::{contiguous_values, f32_primitive, from_host, to_host_f32};
use super::packed::PackedMatrix;
use crate::precision::WeightDtype;

/// Packs an `[in, out]` view (any strides) when it lives on the CPU backend as `f32`.
pub(crate) fn pack_view(weight: &Tensor<2>) -> Option<PackedMatrix> {
    let [d_in, d_out] = weight.dims();
    let primitive = f32_primitive(weight)?;
    let element = strided_element(&primitive, [d_in, d_out])?;
    Some(PackedMatrix::pack(WeightDtype::F32, d_in, d_out, element))
}

/// Element `(k, n)` of the `f32` storage `primitive` viewed as a `[d_in, d_out]` matrix with
/// its own strides; `None` when the layout is not two-dimensional or does not lie inside the
/// storage.
pub(crate) fn strided_element(
    primitive: &FlexTensor,
    [d_in, d_out]: [usize; 2],
) -> Option<impl Fn(usize, usize) -> f32 + Sync + '_> {
    let layout = primitive.layout();
    let [in_stride, out_stride] = layout.strides() else {
        return None;
    };
    let (in_stride, out_stride) = (
        usize::try_from(*in_stride).ok()?,
        usize::try_from(*out_stride).ok()?,
    );
    let storage = &primitive.storage::<f32>()[layout.start_offset()..];
    let last = (d_in.checked_sub(1)?) * in_stride + (d_out.checked_sub(1)?) * out_stride;
    (last < storage.len())
        .then_some(move |k: usize, n: usize| storage[k * in_stride + n * out_stride])
}

/// `x W + b` for `x` `[rows, in]`: `[rows, out]`.
pub(crate) fn multiply(packed: &PackedMatrix, x: Tensor<2>, bias: Option<&Tensor<1>>) -> Tensor<2> {
    let mut outputs = multiply_each(&[(packed, bias)], x);
    outputs.pop().expect("one output a matrix")
}

/// `x W_i + b_i` for each matrix and bias of `maps` (matrices of `x`'s input width), as one
/// product (see [`PackedMatrix::multiply_each`]): `[rows, out_i]` each.
pub(crate) fn multiply_each(
    maps: &[(&PackedMatrix, Option<&Tensor<1>>)],
    x: Tensor<2>,
) -> Vec<Tensor<2>> {
    let [rows, _] = x.dims();
    let x = to_host_f32(x);
    let biases: Vec<_> = maps
        .iter()
        .map(|(_, bias)| bias.map(|bias| to_host_f32(bias.clone())))
        .collect();
    let operands: Vec<_> = maps
        .iter()
        .zip(&biases)
        .map(|(&(packed, _), bias)| (packed, bias.as_ref().map(contiguous_values)))
        .collect();
    PackedMatrix::multiply_each(&operands, contiguous_values(&x), rows)
        .into_iter()
        .zip(maps)
        .map(|(y, (packed, _))| from_host(y, [rows, packed.d_out()]))
        .collect()
}

/// `x W[inputs, :]` for `x` `[rows, inputs.len()]`, without a bias: `[rows, out]` (see
/// [`PackedMatrix::multiply_inputs`]).
pub(crate) fn multiply_inputs(
    packed: &PackedMatrix,
    x: Tensor<2>,
    inputs: Range<usize>,
) -> Tensor<2> {
    let [rows, _] = x.dims();
    let x = to_host_f32(x);
    let y = packed.multiply_inputs(contiguous_values(&x), rows, inputs);
    from_host(y, [rows, packed.d_out()])
}

/// The rows `ids` `[B, T]` of an embedding table packed as the `[size, rows]` matrix of a
/// language-model head: `[B, T, size]`. Ids must be below the table's rows (the model
/// validates token ids before a call).
pub(crate) fn embedding_rows(packed: &PackedMatrix, ids: Tensor<2, Int>) -> Tensor<3> {
    let [batch, len] = ids.dims();
    let ids: Vec<usize> = ids
        .into_data()
        .convert::<i64>()
        .iter::<i64>()
        .map(|id| usize::try_from(id).unwrap_or(usize::MAX))
        .collect();
    from_host(packed.columns(&ids), [batch, len, packed.d_in()])
}

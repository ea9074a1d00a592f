//! Access to the host storage of tensors on the CPU (`flex`) backend, for the kernels that
//! work on it directly (`packed`, `fastmath`).

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Tensor};

/// The tensor's `flex` storage when it lives on that backend as `f32`.
pub(crate) fn f32_primitive<const D: usize>(tensor: &Tensor<D>) -> Option<FlexTensor> {
    let primitive = tensor.clone().try_into_primitive::<Flex>().ok()?;
    (primitive.dtype() == DType::F32).then_some(primitive)
}

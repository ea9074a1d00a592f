//! Access to the host storage of tensors on the CPU (`flex`) backend, for the kernels that
//! work on it directly (`packed`, `fastmath`).

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Device, Tensor};

/// The tensor's `flex` storage when it lives on that backend as `f32`.
pub(crate) fn f32_primitive<const D: usize>(tensor: &Tensor<D>) -> Option<FlexTensor> {
    let primitive = tensor.clone().try_into_primitive::<Flex>().ok()?;
    (primitive.dtype() == DType::F32).then_some(primitive)
}

/// Whether `device` is the CPU (`flex`) device, where weights are packed for the CPU kernels.
pub(crate) fn is_flex(device: &Device) -> bool {
    f32_primitive(&Tensor::<1>::zeros([0], device)).is_some()
}

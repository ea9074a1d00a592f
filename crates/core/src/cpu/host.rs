//! The CPU (`flex`) backend's host storage: with `tracked` (the same storage under autodiff),
//! the one place that names burn's `Flex` types. The kernels read their operands' `f32` values
//! where they lie and hand their results back as tensors of that backend.

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Tensor, TensorData};
use rayon::prelude::*;

/// The tensor's `flex` storage when it lives on that backend as `f32`.
pub(crate) fn f32_primitive<const D: usize>(tensor: &Tensor<D>) -> Option<FlexTensor> {
    let primitive = tensor.clone().try_into_primitive::<Flex>().ok()?;
    (primitive.dtype() == DType::F32).then_some(primitive)
}

/// The tensor's `flex` storage made contiguous (copied only when it is strided), when it lives
/// on that backend as `f32`.
pub(crate) fn dense_f32<const D: usize>(tensor: &Tensor<D>) -> Option<FlexTensor> {
    f32_primitive(tensor).map(|primitive| primitive.to_contiguous())
}

/// `values` (row-major) as a `flex` tensor of `shape`.
pub(crate) fn from_host<const D: usize>(values: Vec<f32>, shape: [usize; D]) -> Tensor<D> {
    Tensor::from_primitive::<Flex>(host_storage(values, shape.to_vec()))
}

/// `values` (row-major) as `flex` storage of `dims`.
pub(crate) fn host_storage(values: Vec<f32>, dims: Vec<usize>) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, dims))
}

/// The storage as contiguous `f32` (copied only when strided or of another dtype).
pub(crate) fn contiguous_f32(storage: FlexTensor) -> FlexTensor {
    match storage.dtype() {
        DType::F32 => storage.to_contiguous(),
        _ => FlexTensor::from_data(storage.into_data().convert::<f32>()),
    }
}

/// The tensor as contiguous `f32` storage on the CPU backend: in place when it already is,
/// else made contiguous, or converted from another dtype or backend.
pub(crate) fn to_host_f32<const D: usize>(tensor: Tensor<D>) -> FlexTensor {
    match dense_f32(&tensor) {
        Some(dense) => dense,
        None => FlexTensor::from_data(tensor.into_data().convert::<f32>()),
    }
}

/// The values of contiguous `f32` storage (what [`to_host_f32`] returns).
pub(crate) fn contiguous_values(tensor: &FlexTensor) -> &[f32] {
    tensor
        .as_slice::<f32>()
        .expect("`to_host_f32` returns contiguous f32 storage")
}

/// `len` values made on rayon's threads: `fill(task, values)` for each run of `chunk` values
/// (the last may be shorter), which that task zeroes first. The same as zeroing the whole
/// vector and then filling its runs in parallel, without that zeroing: one pass over the
/// output on the calling thread ahead of every kernel's parallel part (on a Llama-shaped
/// 8 x 128-token call, 4 % of the time with bf16 products). A task zeroes its run where it
/// then writes it, in its own cache.
pub(crate) fn parallel_output<T: Copy + Default + Send + Sync>(
    len: usize,
    chunk: usize,
    fill: impl Fn(usize, &mut [T]) + Sync,
) -> Vec<T> {
    let mut output = Vec::with_capacity(len);
    output.spare_capacity_mut()[..len]
        .par_chunks_mut(chunk.max(1))
        .enumerate()
        .for_each(|(task, run)| {
            for value in run.iter_mut() {
                value.write(T::default());
            }
            // SAFETY: every value of the run was written just above.
            fill(task, unsafe { run.assume_init_mut() });
        });
    // SAFETY: the runs cover the first `len` values, each written by its task.
    unsafe { output.set_len(len) };
    output
}

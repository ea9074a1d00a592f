//! Lookup tables (token and learned position embeddings).

use std::sync::Arc;

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::tensor::module::embedding;
use burn::tensor::{Int, Tensor, TensorData};

use super::packed::PackedMatrix;
use crate::error::Result;
use crate::loading::WeightLoader;

/// A `[rows, size]` lookup table.
#[derive(Debug, Clone)]
pub struct Embedding {
    table: Table,
}

/// Where the table lives.
#[derive(Debug, Clone)]
enum Table {
    /// The stored `[rows, size]` tensor.
    Dense(Box<Tensor<2>>),
    /// The packed weight of a head tied to this table (`[size, rows]` as a matrix): one copy
    /// serves both the lookup and the head.
    TiedHead(Arc<PackedMatrix>),
}

impl Embedding {
    /// Loads `{name}` stored `[rows, size]`.
    pub fn load(
        loader: &mut WeightLoader<'_>,
        name: &str,
        rows: usize,
        size: usize,
    ) -> Result<Self> {
        Ok(Embedding {
            table: Table::Dense(Box::new(loader.tensor(name, [rows, size])?)),
        })
    }

    /// Rows for `[B, T]` indices: `[B, T, size]`. Indices must be below `rows` (the model
    /// validates token ids before a call).
    pub fn forward(&self, indices: Tensor<2, Int>) -> Tensor<3> {
        match &self.table {
            Table::Dense(table) => embedding(table.as_ref().clone(), indices),
            Table::TiedHead(packed) => {
                let [batch, len] = indices.dims();
                let ids: Vec<usize> = indices
                    .into_data()
                    .convert::<i64>()
                    .iter::<i64>()
                    .map(|id| usize::try_from(id).unwrap_or(usize::MAX))
                    .collect();
                let rows = packed.columns(&ids);
                let rows = TensorData::new(rows, [batch, len, packed.d_in()]);
                Tensor::from_primitive::<Flex>(FlexTensor::from_data(rows))
            }
        }
    }

    /// A language-model head tied to this table. Where the head packs the table for the CPU
    /// kernels, the lookup reads that packed copy from then on and the dense table is dropped.
    pub(crate) fn tied_head(&mut self) -> super::Linear {
        let table = match &self.table {
            Table::Dense(table) => table.as_ref().clone(),
            Table::TiedHead(packed) => return super::Linear::from_packed(packed.clone()),
        };
        let head = super::Linear::from_out_in(table);
        if let Some(packed) = head.packed() {
            self.table = Table::TiedHead(packed);
        }
        head
    }

    /// The table's `[rows, size]` shape.
    pub fn dims(&self) -> [usize; 2] {
        match &self.table {
            Table::Dense(table) => table.dims(),
            Table::TiedHead(packed) => [packed.d_out(), packed.d_in()],
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::Device;

    use super::*;

    /// A head tied to the table takes the packed copy over: lookups read the same rows from it
    /// (every panel, including the partial last one), and the head multiplies by the table.
    #[test]
    fn a_tied_head_shares_one_copy_that_serves_lookups_and_the_head() {
        let (rows, size) = (70, 5);
        let mut rng = fastrand::Rng::with_seed(7);
        let values: Vec<f32> = (0..rows * size).map(|_| rng.f32() - 0.5).collect();
        let device = Device::default();
        let table = Tensor::<2>::from_data(TensorData::new(values, [rows, size]), &device);
        let mut embeddings = Embedding {
            table: Table::Dense(Box::new(table.clone())),
        };
        let ids = [[0i64, 33, 69], [31, 32, 64]];
        let indices = Tensor::<2, Int>::from_data(TensorData::from(ids), &device);
        let dense = embeddings.forward(indices.clone()).into_data();
        let head = embeddings.tied_head();
        assert!(
            matches!(embeddings.table, Table::TiedHead(_)),
            "table not shared"
        );
        assert_eq!(embeddings.dims(), [rows, size]);
        assert_eq!(embeddings.forward(indices).into_data(), dense);
        let x = Tensor::<2>::from_data(TensorData::new(vec![0.5f32; 2 * size], [2, size]), &device);
        let expected = x.clone().matmul(table.transpose()).into_data();
        let logits = head.forward(x).into_data();
        logits.assert_approx_eq::<f32>(&expected, burn::tensor::Tolerance::absolute(1e-5));
    }
}

//! Lookup tables (token and learned position embeddings).

use std::sync::Arc;

use burn::tensor::module::embedding;
use burn::tensor::{Int, Tensor};

use crate::cpu::{self, PackedMatrix, TrackedMatrix};
use crate::error::Result;
use crate::weights::{Matrix, Orientation, WeightScope};

/// A `[rows, size]` lookup table.
#[derive(Debug, Clone)]
pub struct Embedding {
    table: Table,
}

/// Where the table lives.
#[derive(Debug, Clone)]
pub(crate) enum Table {
    /// The stored `[rows, size]` tensor (backends other than the CPU's).
    Dense(Box<Tensor<2>>),
    /// On the CPU, the table packed in the load's precision as the `[size, rows]` matrix of a
    /// language-model head: a head tied to the table shares this one copy.
    Packed(Arc<PackedMatrix>),
    /// On the CPU under autodiff (a model loaded for gradients), the head's matrix packed both
    /// ways ([`TrackedMatrix`]); lookups read the forward one, and a tied head shares both.
    Tracked(Arc<TrackedMatrix>),
}

impl Embedding {
    /// Loads the scope's `weight` stored `[rows, size]`.
    pub fn load(mut scope: WeightScope<'_, '_>, rows: usize, size: usize) -> Result<Self> {
        let name = scope.key("weight");
        let table = match scope
            .loader()
            .matrix(&name, [rows, size], Orientation::OutIn)?
        {
            Matrix::Packed(packed) => Table::Packed(Arc::new(packed)),
            // An `[in, out]` view of the `[rows, size]` table.
            Matrix::Tensor(view) => match cpu::pack_tracked(&view) {
                Some(tracked) => Table::Tracked(Arc::new(tracked)),
                None => Table::Dense(Box::new(view.transpose())),
            },
        };
        Ok(Embedding { table })
    }

    /// Rows for `[B, T]` indices: `[B, T, size]`. Indices must be below `rows` (the model
    /// validates token ids before a call).
    pub fn forward(&self, indices: Tensor<2, Int>) -> Tensor<3> {
        match &self.table {
            Table::Dense(table) => embedding(table.as_ref().clone(), indices),
            Table::Packed(packed) => cpu::embedding_rows(packed, indices),
            Table::Tracked(tracked) => cpu::embedding_rows(tracked.forward(), indices).autodiff(),
        }
    }

    /// Where the table lives (a head tied to it shares it).
    pub(crate) fn table(&self) -> &Table {
        &self.table
    }

    /// The table's `[rows, size]` shape.
    pub fn dims(&self) -> [usize; 2] {
        match &self.table {
            Table::Dense(table) => table.dims(),
            Table::Packed(packed) => [packed.d_out(), packed.d_in()],
            Table::Tracked(tracked) => [tracked.forward().d_out(), tracked.forward().d_in()],
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, TensorData};

    use super::*;
    use crate::precision::WeightDtype;
    use crate::weights::WeightLoader;

    /// On the CPU the table is packed in the load's precision: lookups read the stored rows
    /// back (every panel, including the partial last one) and a tied head shares the same copy,
    /// multiplying by the table.
    #[test]
    fn a_packed_table_serves_lookups_and_a_tied_head() {
        let (rows, size) = (70, 5);
        let device = Device::default();
        for dtype in [WeightDtype::F32, WeightDtype::Bf16, WeightDtype::F16] {
            let mut loader = WeightLoader::random(7, &device).with_dtype(dtype);
            let embeddings = Embedding::load(loader.pp("table"), rows, size).unwrap();
            let table: Tensor<2> = loader.tensor("table.weight", [rows, size]).unwrap();
            let Table::Packed(packed) = &embeddings.table else {
                panic!("not packed on the CPU backend");
            };
            assert_eq!(packed.dtype(), dtype);
            assert_eq!(embeddings.dims(), [rows, size]);
            let ids = [[0i64, 33, 69], [31, 32, 64]];
            let indices = Tensor::<2, Int>::from_data(TensorData::from(ids), &device);
            let expected = embedding(table.clone(), indices.clone()).into_data();
            assert_eq!(embeddings.forward(indices).into_data(), expected, "{dtype}");
            let head = super::super::Linear::tied_to(&embeddings);
            assert!(
                Arc::ptr_eq(&head.packed().unwrap(), packed),
                "table not shared"
            );
            let x =
                Tensor::<2>::from_data(TensorData::new(vec![0.5f32; 2 * size], [2, size]), &device);
            let expected = x.clone().matmul(table.transpose()).into_data();
            let logits = head.forward(x).into_data();
            logits.assert_approx_eq::<f32>(&expected, burn::tensor::Tolerance::absolute(1e-5));
        }
    }
}

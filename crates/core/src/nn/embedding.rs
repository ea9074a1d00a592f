//! Lookup tables (token and learned position embeddings).

use burn::tensor::module::embedding;
use burn::tensor::{Int, Tensor};

use crate::error::Result;
use crate::loading::WeightLoader;

/// A `[rows, size]` lookup table.
#[derive(Debug, Clone)]
pub struct Embedding {
    table: Tensor<2>,
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
            table: loader.tensor(name, [rows, size])?,
        })
    }

    /// Rows for `[B, T]` indices: `[B, T, size]`.
    pub fn forward(&self, indices: Tensor<2, Int>) -> Tensor<3> {
        embedding(self.table.clone(), indices)
    }

    /// The table, `[rows, size]`.
    pub fn table(&self) -> Tensor<2> {
        self.table.clone()
    }
}

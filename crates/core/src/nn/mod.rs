//! Layers shared by every architecture adapter: one implementation each, used by all.

mod activation;
mod attention;
mod embedding;
mod linear;
mod norm;

pub use activation::Activation;
pub use attention::SoftmaxAttention;
pub use embedding::Embedding;
pub use linear::Linear;
pub use norm::LayerNorm;

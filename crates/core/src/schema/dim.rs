//! The schema's symbolic dimensions (`B`, `T`, `S`, `NKV`, ...) and shapes built from them: the
//! vocabulary the site tables are written in.

use std::fmt;

/// A symbolic dimension of SCHEMA.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dim {
    /// Batch.
    B,
    /// Tokens in this call.
    T,
    /// Positions the mixer sees: `prompt_len + step`.
    S,
    /// Hidden size.
    H,
    /// Vocabulary size.
    V,
    /// Attention (or Mamba-2) heads.
    NH,
    /// Key/value heads.
    NKV,
    /// Attention head dimension.
    D,
    /// Mamba-1 inner size.
    E,
    /// SSM state size.
    N,
    /// Mamba-2 head dimension.
    P,
    /// DeltaNet value heads.
    NV,
    /// DeltaNet key head dimension.
    DK,
    /// DeltaNet value head dimension.
    DV,
    /// Features of an attached dictionary.
    F,
    /// Neurons of a dense feed-forward part (its inner size).
    I,
    /// Experts of a mixture of experts.
    NE,
    /// Experts each token is routed to.
    K,
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A symbolic shape such as `[B, NKV, S, D]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SymbolicShape(pub &'static [Dim]);

impl fmt::Display for SymbolicShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        write!(f, "[{}]", dims.join(", "))
    }
}

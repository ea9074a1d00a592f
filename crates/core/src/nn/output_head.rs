//! The standard [`OutputHead`]: a final norm, the language-model head and, on some models
//! (Gemma 2), a soft-cap of the logits.

use burn::tensor::Tensor;

use super::linear::Linear;
use super::norm::{LayerNorm, RmsNorm};
use crate::adapter::OutputHead;

/// A norm an [`LmHead`] can apply to the last residual stream.
pub trait FinalNorm: Send + Sync {
    /// The norm of `hidden` `[B, T, H]`.
    fn normalise(&self, hidden: Tensor<3>) -> Tensor<3>;

    /// The norm of `reference` applied to `parts` with its scale frozen and without its bias
    /// (see [`OutputHead::final_norm_linearised`]).
    fn linearised(&self, reference: Tensor<3>, parts: Tensor<4>) -> Tensor<4>;
}

impl FinalNorm for LayerNorm {
    fn normalise(&self, hidden: Tensor<3>) -> Tensor<3> {
        self.forward(hidden)
    }

    fn linearised(&self, reference: Tensor<3>, parts: Tensor<4>) -> Tensor<4> {
        LayerNorm::linearised(self, reference, parts)
    }
}

impl FinalNorm for RmsNorm {
    fn normalise(&self, hidden: Tensor<3>) -> Tensor<3> {
        self.forward(hidden)
    }

    fn linearised(&self, reference: Tensor<3>, parts: Tensor<4>) -> Tensor<4> {
        RmsNorm::linearised(self, reference, parts)
    }
}

/// A final norm, then a linear language-model head, then any soft-cap: the [`OutputHead`] of
/// every built-in architecture.
pub struct LmHead {
    norm: Box<dyn FinalNorm>,
    lm_head: Linear,
    logit_softcap: Option<f64>,
}

impl LmHead {
    /// `norm` then `lm_head`, without a soft-cap.
    pub fn new(norm: impl FinalNorm + 'static, lm_head: Linear) -> Self {
        LmHead {
            norm: Box::new(norm),
            lm_head,
            logit_softcap: None,
        }
    }

    /// The same head with its logits soft-capped at `cap` (`cap · tanh(logits / cap)`), if
    /// given.
    pub fn soft_capped(self, cap: Option<f64>) -> Self {
        LmHead {
            logit_softcap: cap,
            ..self
        }
    }
}

impl OutputHead for LmHead {
    fn final_norm(&self, hidden: Tensor<3>) -> Tensor<3> {
        self.norm.normalise(hidden)
    }

    fn head(&self, normed: Tensor<3>) -> Tensor<3> {
        self.lm_head.forward(normed)
    }

    fn logit_softcap(&self) -> Option<f64> {
        self.logit_softcap
    }

    fn final_norm_linearised(&self, reference: Tensor<3>, parts: Tensor<4>) -> Tensor<4> {
        self.norm.linearised(reference, parts)
    }
}

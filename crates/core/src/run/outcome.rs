//! What a run returns: a [`Trace`] of one forward call, a [`Generation`] of many.

use std::ops::Range;

use burn::tensor::Tensor;

use crate::error::{Error, Result};
use crate::hooks::Saved;
use crate::input::Batch;

/// The result of [`crate::Model::trace`]: one forward call (step 0).
#[derive(Debug, Clone)]
pub struct Trace {
    /// Saved site values (step 0).
    pub saved: Saved,
    /// The batch that was run.
    pub batch: Batch,
    /// The call's `[B, T, V]` logits and `[B, V]` next-token distribution; `None` when the run
    /// stopped after its last requested site.
    pub(super) outputs: Option<(Tensor<3>, Tensor<2>)>,
}

impl Trace {
    /// `[B, T, V]` logits (after any write to `logits`); an error if the run stopped after its
    /// last requested site ([`crate::Run::stop_after_last_request`]) and never computed them.
    pub fn logits(&self) -> Result<&Tensor<3>> {
        self.outputs
            .as_ref()
            .map(|(logits, _)| logits)
            .ok_or(Error::NotComputed { value: "logits" })
    }

    /// What rows `rows` of the batch would have traced alone, when the run read and wrote
    /// every row alone ([`crate::Interventions::rows_independent`]) and the rows are padded
    /// to the same length alone: their saved values, prompts, logits and next-token
    /// distributions. An error naming the batch size for rows outside it.
    pub fn rows(&self, rows: Range<usize>) -> Result<Trace> {
        let batch_size = self.batch.batch_size();
        if rows.start >= rows.end || rows.end > batch_size {
            return Err(Error::InvalidInput(format!(
                "rows {rows:?} of a batch of {batch_size}"
            )));
        }
        let outputs = self.outputs.as_ref().map(|(logits, probs)| {
            (
                logits.clone().slice_dim(0, rows.clone()),
                probs.clone().slice_dim(0, rows.clone()),
            )
        });
        Ok(Trace {
            saved: self.saved.rows(rows.clone(), batch_size)?,
            batch: self.batch.rows(rows),
            outputs,
        })
    }

    /// The gradients of `metric` (one number computed from this trace, e.g. from its logits)
    /// with respect to every site part the run asked a gradient of, keyed as saved values are
    /// (see [`Saved::gradients`]); once per trace.
    pub fn gradients(&mut self, metric: &Tensor<1>) -> Result<Saved> {
        self.saved.gradients(metric)
    }

    /// `[B, V]` softmax of the last position's logits; an error if the run stopped early, as
    /// for [`Trace::logits`].
    pub fn next_token_probs(&self) -> Result<&Tensor<2>> {
        self.outputs
            .as_ref()
            .map(|(_, probs)| probs)
            .ok_or(Error::NotComputed {
                value: "next_token_probs",
            })
    }
}

/// The result of [`crate::Model::generate`].
#[derive(Debug, Clone)]
pub struct Generation {
    /// Saved site values, by site and step.
    pub saved: Saved,
    /// `[B][prompt_len + new tokens]`: the (left-padded) prompts and the tokens generated.
    pub output_ids: Vec<Vec<u32>>,
    /// `[B][prompt_len + new tokens]`: false at left padding.
    pub attention_mask: Vec<Vec<bool>>,
    /// The padded prompt length.
    pub prompt_len: usize,
    /// Calls made (= tokens appended): fewer than `max_new_tokens` when every row hit EOS.
    pub steps: usize,
    /// `[B][step]`: the [`TOP_TOKENS_RECORDED`] most likely next tokens of each step's
    /// `next_token_probs` as `(id, probability)`, most likely first.
    pub top_next_tokens: Vec<Vec<Vec<(u32, f32)>>>,
}

/// How many of the most likely next tokens a generation records per step and row.
pub const TOP_TOKENS_RECORDED: usize = 5;

impl Generation {
    /// The tokens generated for row `row`.
    pub fn new_tokens(&self, row: usize) -> &[u32] {
        &self.output_ids[row][self.prompt_len..]
    }
}

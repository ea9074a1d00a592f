//! Gradients of a scalar metric of the logits with respect to sites (attribution patching's
//! ingredient): the metrics `hookscope run --grad` and `hookscope attrib` take, computed as
//! tensors so the backward pass runs through them.

use hookscope_core::burn::tensor::{Int, Tensor, TensorData, activation};
use hookscope_core::{Error, Model, Result, Trace};

use crate::report::single_token;

/// Where a token metric reads the logits: a position of the prompt (negative counts from the
/// end; default the last).
pub type Position = i64;

/// A scalar of a prompt call's logits, summed over the batch's rows (so each row's gradient is
/// that of its own metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GradMetric {
    /// `logit[a] - logit[b]` at `position` (the IOI paper's logit difference).
    LogitDiff {
        /// The token counted up.
        a: u32,
        /// The token counted down.
        b: u32,
        /// Where.
        position: Position,
    },
    /// `logit[token]` at `position`.
    Logit {
        /// The token.
        token: u32,
        /// Where.
        position: Position,
    },
    /// `softmax(logits)[token]` at `position`.
    Probability {
        /// The token.
        token: u32,
        /// Where.
        position: Position,
    },
    /// `log_softmax(logits)[token]` at `position`.
    LogProbability {
        /// The token.
        token: u32,
        /// Where.
        position: Position,
    },
    /// The mean next-token cross-entropy over the prompt's real tokens (padding skipped), as
    /// `transformers` computes the loss with `labels = input_ids`.
    Loss,
}

impl GradMetric {
    /// `logit-diff:A,B`, `logit:A`, `prob:A`, `logprob:A` (each optionally `@POS`, a prompt
    /// position, negative from the end) or `loss`; tokens as text (one token each) or `#ID`.
    pub fn parse(model: &Model, text: &str) -> Result<GradMetric> {
        let invalid = || {
            Error::InvalidInput(format!(
                "metric `{text}`: expected `logit-diff:A,B`, `logit:A`, `prob:A`, `logprob:A` \
                 (each with an optional `@POS`) or `loss`; tokens as text or `#ID`"
            ))
        };
        if text == "loss" {
            return Ok(GradMetric::Loss);
        }
        let (kind, rest) = text.split_once(':').ok_or_else(invalid)?;
        // `@POS` only where what follows `@` is a whole number: a token may hold an `@`.
        let (tokens, position) = match rest.rsplit_once('@') {
            Some((tokens, position)) if position.parse::<Position>().is_ok() => {
                (tokens, position.parse::<Position>().map_err(|_| invalid())?)
            }
            _ => (rest, -1),
        };
        let token = |text: &str| single_token(model, text);
        Ok(match kind {
            "logit-diff" => {
                let (a, b) = tokens.split_once(',').ok_or_else(invalid)?;
                GradMetric::LogitDiff {
                    a: token(a)?,
                    b: token(b)?,
                    position,
                }
            }
            "logit" => GradMetric::Logit {
                token: token(tokens)?,
                position,
            },
            "prob" => GradMetric::Probability {
                token: token(tokens)?,
                position,
            },
            "logprob" => GradMetric::LogProbability {
                token: token(tokens)?,
                position,
            },
            _ => return Err(invalid()),
        })
    }

    /// The metric on `trace`'s logits, as a one-element tensor the backward pass starts from.
    pub fn measure(&self, trace: &Trace) -> Result<Tensor<1>> {
        let logits = trace.logits()?.clone();
        let [batch, tokens, vocab] = logits.dims();
        for token in self.tokens() {
            if token as usize >= vocab {
                return Err(Error::InvalidInput(format!(
                    "metric token {token} is outside the vocabulary of {vocab}"
                )));
            }
        }
        let at = |position: Position| -> Result<Tensor<2>> {
            let index = match position < 0 {
                true => (tokens as i64).checked_add(position),
                false => Some(position),
            }
            .filter(|index| (0..tokens as i64).contains(index))
            .ok_or_else(|| {
                Error::InvalidInput(format!(
                    "metric position {position} is outside the prompt's {tokens} positions"
                ))
            })? as usize;
            Ok(logits
                .clone()
                .slice_dim(1, index..index + 1)
                .reshape([batch, vocab]))
        };
        let column = |rows: Tensor<2>, token: u32| -> Tensor<1> {
            rows.slice_dim(1, token as usize..token as usize + 1).sum()
        };
        Ok(match *self {
            GradMetric::LogitDiff { a, b, position } => {
                let rows = at(position)?;
                column(rows.clone(), a) - column(rows, b)
            }
            GradMetric::Logit { token, position } => column(at(position)?, token),
            GradMetric::Probability { token, position } => {
                column(activation::softmax(at(position)?, 1), token)
            }
            GradMetric::LogProbability { token, position } => {
                column(activation::log_softmax(at(position)?, 1), token)
            }
            GradMetric::Loss => next_token_loss(trace, logits)?,
        })
    }

    fn tokens(&self) -> Vec<u32> {
        match *self {
            GradMetric::LogitDiff { a, b, .. } => vec![a, b],
            GradMetric::Logit { token, .. }
            | GradMetric::Probability { token, .. }
            | GradMetric::LogProbability { token, .. } => vec![token],
            GradMetric::Loss => Vec::new(),
        }
    }
}

/// Mean cross-entropy of each real position's logits against the next real token.
fn next_token_loss(trace: &Trace, logits: Tensor<3>) -> Result<Tensor<1>> {
    let [batch, tokens, vocab] = logits.dims();
    let ids = &trace.batch.ids;
    let mask = &trace.batch.mask;
    let mut targets = Vec::with_capacity(batch * tokens.saturating_sub(1));
    let mut weights = Vec::with_capacity(targets.capacity());
    for row in 0..batch {
        for t in 0..tokens.saturating_sub(1) {
            targets.push(i64::from(ids[row][t + 1]));
            weights.push(f32::from(u8::from(mask[row][t] && mask[row][t + 1])));
        }
    }
    let pairs: f32 = weights.iter().sum();
    if pairs == 0.0 {
        return Err(Error::InvalidInput(
            "the loss needs a prompt of at least 2 tokens".into(),
        ));
    }
    let rows = batch * (tokens - 1);
    let device = logits.device();
    let predicted = logits.slice_dim(1, 0..tokens - 1).reshape([rows, vocab]);
    let log_probs = activation::log_softmax(predicted, 1);
    let targets: Tensor<2, Int> = Tensor::from_data(TensorData::new(targets, [rows, 1]), &device);
    let weights: Tensor<2> = Tensor::from_data(TensorData::new(weights, [rows, 1]), &device);
    let picked = log_probs.gather(1, targets) * weights;
    Ok(picked.sum().neg() / pairs)
}

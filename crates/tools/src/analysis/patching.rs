//! Activation patching (Meng et al., "Locating and editing factual associations in GPT", 2022;
//! TransformerLens' `get_act_patch_*`): run a corrupted prompt with one site's value at one
//! position taken from a clean run, and measure how much of the clean behaviour returns.

use hookscope_core::burn::tensor::Tensor;

use hookscope_core::Model;
use hookscope_core::hooks::{Interventions, Saved, Steps};
use hookscope_core::host::f32_values;
use hookscope_core::schema::{Dim, Site};
use hookscope_core::{Error, Result};

/// What a patching sweep measures on the last position's logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// `logit[correct] - logit[wrong]` (the IOI paper's logit difference).
    LogitDiff {
        /// The token the clean prompt should predict.
        correct: u32,
        /// The token the corrupt prompt predicts instead.
        wrong: u32,
    },
    /// The probability of one token.
    Probability {
        /// The token.
        token: u32,
    },
}

impl Metric {
    /// The metric on one row of last-position logits.
    fn measure(&self, logits: &[f32]) -> f32 {
        match *self {
            Metric::LogitDiff { correct, wrong } => {
                logits[correct as usize] - logits[wrong as usize]
            }
            Metric::Probability { token } => {
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let total: f32 = logits.iter().map(|l| (l - max).exp()).sum();
                (logits[token as usize] - max).exp() / total
            }
        }
    }

    fn tokens(&self) -> Vec<u32> {
        match *self {
            Metric::LogitDiff { correct, wrong } => vec![correct, wrong],
            Metric::Probability { token } => vec![token],
        }
    }
}

/// The result of a sweep: for every site and position, the metric of the patched corrupt run
/// normalised so that 0 is the corrupt run's value and 1 the clean run's.
#[derive(Debug, Clone)]
pub struct PatchingSweep {
    /// The patched sites, in the order given.
    pub sites: Vec<Site>,
    /// The prompt length (the positions patched, `0..positions`).
    pub positions: usize,
    /// `[site][position]` normalised scores.
    pub scores: Vec<Vec<f32>>,
    /// The metric on the clean run.
    pub clean: f32,
    /// The metric on the corrupt run.
    pub corrupt: f32,
}

/// For every site of `sites` and every position `p`, runs `corrupt` with the site's value
/// at position `p` replaced by its value in the clean run (all positions of one site in one
/// batched call), and scores `metric` between the corrupt (0) and clean (1) runs. Both
/// prompts must have the same length; every site needs a position axis (`T`, or `S` at the
/// prompt call).
pub fn activation_patching(
    model: &Model,
    clean: &[u32],
    corrupt: &[u32],
    sites: &[Site],
    metric: Metric,
) -> Result<PatchingSweep> {
    if clean.len() != corrupt.len() {
        return Err(Error::InvalidInput(format!(
            "the clean prompt has {} tokens and the corrupt one {}: patching position by \
             position needs prompts of the same length",
            clean.len(),
            corrupt.len()
        )));
    }
    if let Some(token) = metric
        .tokens()
        .into_iter()
        .find(|t| *t as usize >= model.layout().vocab)
    {
        return Err(Error::InvalidInput(format!(
            "metric token {token} is outside the vocabulary of {}",
            model.layout().vocab
        )));
    }
    let axes = sites
        .iter()
        .map(|site| position_axis(model, *site))
        .collect::<Result<Vec<_>>>()?;
    let mut saves = Interventions::new();
    for site in sites {
        saves = saves.save(*site, Steps::At(0));
    }
    let run = |prompt: &[u32]| -> Result<(f32, Saved)> {
        let trace = model.trace(&model.batch(vec![prompt.to_vec()])?, &saves)?;
        let last = last_logits(trace.logits()?)?;
        Ok((metric.measure(&last[0]), trace.saved))
    };
    let (clean_metric, clean_saved) = run(clean)?;
    let (corrupt_metric, corrupt_saved) = run(corrupt)?;
    let span = clean_metric - corrupt_metric;
    if span == 0.0 || !span.is_finite() {
        return Err(Error::InvalidInput(format!(
            "the metric is {clean_metric} on both prompts: nothing to restore"
        )));
    }
    let positions = clean.len();
    let batch = model.batch(vec![corrupt.to_vec(); positions])?;
    let mut scores = Vec::with_capacity(sites.len());
    for (site, axis) in sites.iter().zip(axes) {
        let value = |saved: &Saved| -> Result<(Vec<f32>, Vec<usize>)> {
            let value = saved.require(*site, 0)?;
            let values = f32_values(value.to_data())?;
            Ok((values, value.shape()))
        };
        let (clean_values, shape) = value(&clean_saved)?;
        let (corrupt_values, _) = value(&corrupt_saved)?;
        let patched = patched_rows(&clean_values, &corrupt_values, &shape, axis);
        let mut patched_shape = shape.clone();
        patched_shape[0] = positions;
        let patched = super::value_to_write(model, *site, patched, &patched_shape)?;
        let interventions = Interventions::new().set(*site, Steps::At(0), patched);
        let trace = model.trace(&batch, &interventions)?;
        let row_scores = last_logits(trace.logits()?)?
            .iter()
            .map(|row| (metric.measure(row) - corrupt_metric) / span)
            .collect();
        scores.push(row_scores);
    }
    Ok(PatchingSweep {
        sites: sites.to_vec(),
        positions,
        scores,
        clean: clean_metric,
        corrupt: corrupt_metric,
    })
}

/// The axis of `site` that indexes prompt positions.
pub(crate) fn position_axis(model: &Model, site: Site) -> Result<usize> {
    let shape = model.layout().symbolic_shape(site)?;
    shape
        .0
        .iter()
        .position(|dim| matches!(dim, Dim::T | Dim::S))
        .filter(|axis| *axis > 0)
        .ok_or_else(|| {
            Error::InvalidInput(format!(
                "`{site}` ({shape}) has no position axis to patch position by position"
            ))
        })
}

/// `positions` copies of the corrupt value (`shape`, batch 1), copy `p` with position `p`
/// (along `axis`) taken from the clean value.
fn patched_rows(clean: &[f32], corrupt: &[f32], shape: &[usize], axis: usize) -> Vec<f32> {
    let positions = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[1..axis].iter().product();
    let mut rows = Vec::with_capacity(corrupt.len() * positions);
    for p in 0..positions {
        let start = rows.len();
        rows.extend_from_slice(corrupt);
        for block in 0..outer {
            let at = (block * positions + p) * inner;
            rows[start + at..start + at + inner].copy_from_slice(&clean[at..at + inner]);
        }
    }
    rows
}

/// Each row's last-position logits, on the host.
fn last_logits(logits: &Tensor<3>) -> Result<Vec<Vec<f32>>> {
    let [batch, tokens, vocab] = logits.dims();
    let last = f32_values(
        logits
            .clone()
            .slice_dim(1, tokens - 1..tokens)
            .reshape([batch, vocab])
            .into_data(),
    )?;
    Ok(last.chunks(vocab).map(<[f32]>::to_vec).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_copy_takes_its_own_position_from_the_clean_value() {
        // shape [1, 2 (heads), 3 (positions), 2]; position axis 2.
        let clean: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let corrupt = vec![-1.0; 12];
        let rows = patched_rows(&clean, &corrupt, &[1, 2, 3, 2], 2);
        assert_eq!(rows.len(), 36);
        let row1 = &rows[12..24];
        let expected = [
            -1.0, -1.0, 2.0, 3.0, -1.0, -1.0, -1.0, -1.0, 8.0, 9.0, -1.0, -1.0,
        ];
        assert_eq!(row1, expected);
    }

    #[test]
    fn metrics_read_the_last_logits() {
        let logits = [1.0, 3.0, 0.5];
        let diff = Metric::LogitDiff {
            correct: 1,
            wrong: 0,
        };
        assert_eq!(diff.measure(&logits), 2.0);
        let prob = Metric::Probability { token: 1 }.measure(&logits);
        let total = 1f32.exp() + 3f32.exp() + 0.5f32.exp();
        assert!((prob - 3f32.exp() / total).abs() < 1e-6);
    }
}

//! Attribution patching (Nanda, "Attribution patching: activation patching at industrial
//! scale", 2023; Syed et al., "Attribution patching outperforms automated circuit discovery",
//! 2023): the first-order estimate of every activation-patching score from one forward and one
//! backward pass, `(clean - corrupt) . dM/dsite` at the corrupt run, per site and position (and
//! head, for head-indexed sites). The `ig` method averages the gradient over N points on the
//! straight path between the corrupt and clean token embeddings (integrated gradients, the
//! node form of Hanna et al.'s EAP-IG, 2024).

use hookscope_core::hooks::{Interventions, Saved, Steps};
use hookscope_core::host::f32_values;
use hookscope_core::schema::{Dim, Site};
use hookscope_core::{Error, Model, Result, Trace};

use super::GradMetric;
use super::patching::position_axis;

/// How the gradient is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttributionMethod {
    /// At the corrupt run (one backward pass).
    Atp,
    /// Averaged over `steps` points between the corrupt and clean embeddings.
    IntegratedGradients {
        /// Points on the path (at least 1).
        steps: usize,
    },
}

/// One row of estimates: a site, or one head of a head-indexed site.
#[derive(Debug, Clone, PartialEq)]
pub struct AttributionRow {
    /// The site.
    pub site: Site,
    /// The head, for a site with a head axis.
    pub head: Option<usize>,
    /// Per position, the estimate normalised as patching's scores (0 corrupt, 1 clean).
    pub scores: Vec<f32>,
}

/// Estimates for every site, position (and head).
#[derive(Debug, Clone, PartialEq)]
pub struct AttributionSweep {
    /// Per site (summed over heads) and per head.
    pub rows: Vec<AttributionRow>,
    /// The prompt length.
    pub positions: usize,
    /// The metric on the clean run.
    pub clean: f32,
    /// The metric on the corrupt run.
    pub corrupt: f32,
}

impl AttributionSweep {
    /// The rows of whole sites (what an activation-patching sweep scores), in site order.
    pub fn site_rows(&self) -> impl Iterator<Item = &AttributionRow> {
        self.rows.iter().filter(|row| row.head.is_none())
    }
}

/// The two prompts of a patching experiment, as token ids of one length.
#[derive(Debug, Clone, Copy)]
pub struct PromptPair<'a> {
    /// The prompt whose behaviour is restored (score 1).
    pub clean: &'a [u32],
    /// The prompt patched into (score 0).
    pub corrupt: &'a [u32],
}

/// Estimates the activation-patching sweep of `sites` (each with a position axis) from the
/// corrupt prompt towards the clean one under `metric`, on a model loaded for gradients.
pub fn attribution_patching(
    model: &Model,
    prompts: PromptPair<'_>,
    sites: &[Site],
    metric: GradMetric,
    method: AttributionMethod,
) -> Result<AttributionSweep> {
    let PromptPair { clean, corrupt } = prompts;
    if clean.len() != corrupt.len() {
        return Err(Error::InvalidInput(format!(
            "the clean prompt has {} tokens and the corrupt one {}: attributing position by \
             position needs prompts of the same length",
            clean.len(),
            corrupt.len()
        )));
    }
    if let AttributionMethod::IntegratedGradients { steps: 0 } = method {
        return Err(Error::InvalidInput(
            "integrated gradients need at least 1 step".into(),
        ));
    }
    let axes = sites
        .iter()
        .map(|site| Ok((position_axis(model, *site)?, head_axis(model, *site)?)))
        .collect::<Result<Vec<_>>>()?;
    let embeddings = Site::TokenEmbeddings;
    let mut saves = Interventions::new().save(embeddings, Steps::At(0));
    for site in sites {
        saves = saves.save(*site, Steps::At(0));
    }
    let batch = |ids: &[u32]| model.batch(vec![ids.to_vec()]);
    let measured =
        |trace: &Trace| -> Result<f32> { Ok(f32_values(metric.measure(trace)?.to_data())?[0]) };
    let clean_trace = model.trace(&batch(clean)?, &saves)?;
    let corrupt_trace = model.trace(&batch(corrupt)?, &saves)?;
    let (clean_metric, corrupt_metric) = (measured(&clean_trace)?, measured(&corrupt_trace)?);
    let span = clean_metric - corrupt_metric;
    if span == 0.0 || !span.is_finite() {
        return Err(Error::InvalidInput(format!(
            "the metric is {clean_metric} on both prompts: nothing to restore"
        )));
    }
    let mut wanted = Interventions::new();
    for site in sites {
        wanted = wanted.grad(*site);
    }
    let gradients = match method {
        AttributionMethod::Atp => gradients_at(model, corrupt, &wanted, metric, sites)?,
        AttributionMethod::IntegratedGradients { steps } => {
            let from = f32_values(corrupt_trace.saved.require(embeddings, 0)?.to_data())?;
            let to = f32_values(clean_trace.saved.require(embeddings, 0)?.to_data())?;
            let shape = corrupt_trace.saved.require(embeddings, 0)?.shape();
            let mut total: Vec<Vec<f32>> = Vec::new();
            for k in 0..steps {
                let alpha = (k as f32 + 0.5) / steps as f32;
                let point: Vec<f32> = from
                    .iter()
                    .zip(&to)
                    .map(|(a, b)| a + alpha * (b - a))
                    .collect();
                let point = super::value_to_write(model, embeddings, point, &shape)?;
                let requests = wanted.clone().set(embeddings, Steps::At(0), point);
                let at_point = gradients_at(model, corrupt, &requests, metric, sites)?;
                if total.is_empty() {
                    total = vec![Vec::new(); at_point.len()];
                }
                for (sum, gradient) in total.iter_mut().zip(at_point) {
                    if sum.is_empty() {
                        *sum = vec![0.0; gradient.len()];
                    }
                    for (s, g) in sum.iter_mut().zip(gradient) {
                        *s += g / steps as f32;
                    }
                }
            }
            total
        }
    };
    let mut rows = Vec::new();
    for ((site, (position, head)), gradient) in sites.iter().zip(axes).zip(gradients) {
        let value = |saved: &Saved| -> Result<(Vec<f32>, Vec<usize>)> {
            let value = saved.require(*site, 0)?;
            Ok((f32_values(value.to_data())?, value.shape()))
        };
        let (clean_values, shape) = value(&clean_trace.saved)?;
        let (corrupt_values, _) = value(&corrupt_trace.saved)?;
        let products: Vec<f32> = clean_values
            .iter()
            .zip(&corrupt_values)
            .zip(&gradient)
            .map(|((c, x), g)| (c - x) * g)
            .collect();
        let table = sum_by(&products, &shape, position, head);
        let normalised = |values: Vec<f32>| values.into_iter().map(|v| v / span).collect();
        let whole: Vec<f32> = table.iter().map(|per_head| per_head.iter().sum()).collect();
        rows.push(AttributionRow {
            site: *site,
            head: None,
            scores: normalised(whole),
        });
        if head.is_some() {
            let heads = table.first().map_or(0, Vec::len);
            for h in 0..heads {
                rows.push(AttributionRow {
                    site: *site,
                    head: Some(h),
                    scores: normalised(table.iter().map(|per_head| per_head[h]).collect()),
                });
            }
        }
    }
    Ok(AttributionSweep {
        rows,
        positions: clean.len(),
        clean: clean_metric,
        corrupt: corrupt_metric,
    })
}

/// Each site's gradient of `metric` on the `ids` prompt call with `requests`, on the host.
fn gradients_at(
    model: &Model,
    ids: &[u32],
    requests: &Interventions,
    metric: GradMetric,
    sites: &[Site],
) -> Result<Vec<Vec<f32>>> {
    let mut trace = model.trace(&model.batch(vec![ids.to_vec()])?, requests)?;
    let value = metric.measure(&trace)?;
    let gradients = trace.gradients(&value)?;
    sites
        .iter()
        .map(|site| f32_values(gradients.require(*site, 0)?.to_data()))
        .collect()
}

/// The axis of `site` that indexes heads, if it has one.
fn head_axis(model: &Model, site: Site) -> Result<Option<usize>> {
    let shape = model.layout().symbolic_shape(site)?;
    Ok(shape
        .0
        .iter()
        .position(|dim| matches!(dim, Dim::NH | Dim::NKV | Dim::NV)))
}

/// `values` (row-major, of `shape`, batch 1) summed over every axis but `position` (and
/// `head`): `[position][head]` (one head column without a head axis).
fn sum_by(values: &[f32], shape: &[usize], position: usize, head: Option<usize>) -> Vec<Vec<f32>> {
    let heads = head.map_or(1, |axis| shape[axis]);
    let mut table = vec![vec![0.0f32; heads]; shape[position]];
    let mut index = vec![0usize; shape.len()];
    for value in values {
        let h = head.map_or(0, |axis| index[axis]);
        table[index[position]][h] += value;
        for axis in (0..shape.len()).rev() {
            index[axis] += 1;
            if index[axis] < shape[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
    table
}

/// Pearson's correlation of two equally long series; `None` when either is constant.
pub fn correlation(a: &[f32], b: &[f32]) -> Option<f32> {
    let n = a.len().min(b.len()) as f64;
    let mean = |v: &[f32]| v.iter().map(|x| f64::from(*x)).sum::<f64>() / n;
    let (ma, mb) = (mean(a), mean(b));
    let (mut ab, mut aa, mut bb) = (0.0, 0.0, 0.0);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (f64::from(*x) - ma, f64::from(*y) - mb);
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    (aa > 0.0 && bb > 0.0).then(|| (ab / (aa * bb).sqrt()) as f32)
}

//! Direct logit attribution (Elhage et al., "A Mathematical Framework for Transformer Circuits",
//! 2021; TransformerLens' `logit_attrs`): the last position's residual stream is the sum of the
//! embeddings and of what every block's parts added, so with the final norm's scale frozen at
//! the run's value the target logit is the sum of each part's logit through the head, plus the
//! final norm's bias and the head's bias.

use hookscope_core::burn::tensor::{Int, Tensor, TensorData};

use hookscope_core::hooks::{Interventions, Saved};
use hookscope_core::host::f32_values;
use hookscope_core::schema::{LayerSite, MixerSite, Site};
use hookscope_core::{Batch, Error, Model, Result};

/// What a block's sequence mixer added to the last position's logit.
#[derive(Debug, Clone, PartialEq)]
pub struct MixerAttribution {
    /// The whole `attention_output`.
    pub total: f32,
    /// Each head's write, where the mixer is softmax attention (`attention_head_writes`).
    pub heads: Option<Vec<f32>>,
    /// `attention_output` less the heads: the output projection's bias, and where the block
    /// norms its mixer's output (Gemma 2 and 3, OLMo-2) what that norm changes.
    pub rest: Option<f32>,
}

/// One block's parts.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerAttribution {
    /// The block's index.
    pub layer: usize,
    /// Its mixer's part.
    pub mixer: MixerAttribution,
    /// Its MLP's (`mlp_output`), where the block has one.
    pub mlp: Option<f32>,
}

/// The decomposition of one logit (or the difference of two) at the last position.
#[derive(Debug, Clone, PartialEq)]
pub struct LogitAttribution {
    /// The token whose logit is decomposed.
    pub target: u32,
    /// The token whose logit is subtracted, if any.
    pub versus: Option<u32>,
    /// The logit (difference) of the run, before any final soft-cap.
    pub logit: f32,
    /// What reached the residual stream before the first block (`layers.0.layer_input`: token
    /// embeddings, and learned positions where the model adds them).
    pub embeddings: f32,
    /// Every block's parts.
    pub layers: Vec<LayerAttribution>,
    /// The final norm's bias through the head (zero for RMSNorm).
    pub final_norm_bias: f32,
    /// The head's own bias (zero where it has none).
    pub head_bias: f32,
}

impl LogitAttribution {
    /// The sum of every part and both biases: the logit, up to rounding.
    pub fn sum(&self) -> f32 {
        let layers: f32 = self
            .layers
            .iter()
            .map(|layer| layer.mixer.total + layer.mlp.unwrap_or(0.0))
            .sum();
        self.embeddings + layers + self.final_norm_bias + self.head_bias
    }
}

/// The residual parts of the last position, in attribution order, and where each came from.
struct Parts {
    /// `[H]` each.
    vectors: Vec<Vec<f32>>,
    /// Per layer: where its heads, mixer total and MLP part are in `vectors`.
    layers: Vec<LayerParts>,
    /// The rows that sum to the residual stream: the embeddings, every mixer total and MLP.
    summands: Vec<i64>,
}

struct LayerParts {
    heads: Option<std::ops::Range<usize>>,
    rest: Option<usize>,
    total: usize,
    mlp: Option<usize>,
}

/// Decomposes the last-position logit of `target` (less that of `versus`) of the prompt call
/// over `batch` (one prompt), with `interventions` applied, into the embeddings, every head (or
/// mixer, where it has no heads) and MLP of every block, the final norm's bias and the head's.
pub fn logit_attribution(
    model: &Model,
    batch: &Batch,
    target: u32,
    versus: Option<u32>,
    interventions: &Interventions,
) -> Result<LogitAttribution> {
    let layout = model.layout();
    if let Some(token) = [Some(target), versus]
        .into_iter()
        .flatten()
        .find(|t| *t as usize >= layout.vocab)
    {
        return Err(Error::InvalidInput(format!(
            "token {token} is outside the vocabulary of {}",
            layout.vocab
        )));
    }
    if batch.ids.len() != 1 {
        return Err(Error::InvalidInput(format!(
            "direct logit attribution takes one prompt, not {}",
            batch.ids.len()
        )));
    }
    let layers = layout.layers.len();
    let Some(last_layer) = layers.checked_sub(1) else {
        return Err(Error::InvalidInput("the model has no layers".into()));
    };
    let mut sites = vec![
        Site::layer(0, LayerSite::LayerInput),
        Site::layer(last_layer, LayerSite::LayerOutput),
        Site::FinalNormOutput,
    ];
    for layer in 0..layers {
        for site in [
            LayerSite::Mixer(
                layout.layers[layer].mixer.namespace(),
                MixerSite::AttentionHeadWrites,
            ),
            LayerSite::AttentionOutput,
            LayerSite::MlpOutput,
        ] {
            let site = Site::layer(layer, site);
            if layout.has(site) {
                sites.push(site);
            }
        }
    }
    let saved = super::prompt_call_saving(model, batch, interventions, &sites)?;
    let parts = last_position_parts(model, &saved)?;
    let hidden = layout.hidden;
    let device = model.device();
    let vector = |values: Vec<f32>, rows: usize| -> Tensor<3> {
        Tensor::from_data(TensorData::new(values, [1, rows, hidden]), device)
    };
    let residual = last_row(&saved, Site::layer(last_layer, LayerSite::LayerOutput))?;
    let normed = last_row(&saved, Site::FinalNormOutput)?;
    let count = parts.vectors.len();
    let layers_places = parts.layers;
    let stacked: Tensor<4> = vector(parts.vectors.concat(), count).reshape([1, 1, count, hidden]);
    let linearised = model
        .output_head()
        .final_norm_linearised(vector(residual, 1), stacked);
    let linearised: Tensor<3> = linearised.reshape([1, count, hidden]);
    // The norm's bias: its output less the frozen-scale images of the parts.
    let summands = parts.summands.len();
    let summands: Tensor<1, Int> =
        Tensor::from_data(TensorData::new(parts.summands, [summands]), device);
    let linear_sum: Tensor<3> = linearised.clone().select(1, summands).sum_dim(1);
    let bias = vector(normed.clone(), 1) - linear_sum;
    let zeros = Tensor::<3>::zeros([1, 1, hidden], device);
    let rows = Tensor::cat(vec![linearised, bias, vector(normed, 1), zeros], 1);
    let logits = f32_values(model.output_head().head(rows).into_data())?;
    let vocab = layout.vocab;
    let read = |row: usize| -> f32 {
        let at = |token: u32| logits[row * vocab + token as usize];
        at(target) - versus.map_or(0.0, at)
    };
    let head_bias = read(count + 2);
    let part = |index: usize| read(index) - head_bias;
    let layers = layers_places
        .iter()
        .enumerate()
        .map(|(layer, places)| LayerAttribution {
            layer,
            mixer: MixerAttribution {
                total: part(places.total),
                heads: places.heads.clone().map(|range| range.map(part).collect()),
                rest: places.rest.map(part),
            },
            mlp: places.mlp.map(part),
        })
        .collect();
    Ok(LogitAttribution {
        target,
        versus,
        logit: read(count + 1),
        embeddings: part(0),
        layers,
        final_norm_bias: part(count),
        head_bias,
    })
}

/// The value of `site` at step 0 at the last position of batch row 0, `[H]`.
fn last_row(saved: &Saved, site: Site) -> Result<Vec<f32>> {
    let value = saved.require(site, 0)?;
    let shape = value.shape();
    let values = f32_values(value.to_data())?;
    let &[_, tokens, width] = shape.as_slice() else {
        return Err(Error::InvalidInput(format!(
            "`{site}` has shape {shape:?}, not [B, T, H]"
        )));
    };
    let start = (tokens - 1) * width;
    Ok(values[start..start + width].to_vec())
}

/// The embeddings, then per block its heads (and the rest of its mixer's output) or its whole
/// mixer output, then its MLP output: `[H]` rows of the last position. The mixer totals are
/// rows too, so each block's heads can be checked against them.
fn last_position_parts(model: &Model, saved: &Saved) -> Result<Parts> {
    let layout = model.layout();
    let hidden = layout.hidden;
    let mut vectors = vec![last_row(saved, Site::layer(0, LayerSite::LayerInput))?];
    let mut layers = Vec::with_capacity(layout.layers.len());
    for (layer, spec) in layout.layers.iter().enumerate() {
        let writes = Site::layer(
            layer,
            LayerSite::Mixer(spec.mixer.namespace(), MixerSite::AttentionHeadWrites),
        );
        let total_row = last_row(saved, Site::layer(layer, LayerSite::AttentionOutput))?;
        let (heads, rest) = match layout.has(writes) {
            true => {
                let value = saved.require(writes, 0)?;
                let shape = value.shape();
                let values = f32_values(value.to_data())?;
                let &[_, tokens, heads, _] = shape.as_slice() else {
                    return Err(Error::InvalidInput(format!(
                        "`{writes}` has shape {shape:?}, not [B, T, NH, H]"
                    )));
                };
                let first = vectors.len();
                let mut rest = total_row.clone();
                for head in 0..heads {
                    let start = ((tokens - 1) * heads + head) * hidden;
                    let row = values[start..start + hidden].to_vec();
                    rest.iter_mut().zip(&row).for_each(|(r, h)| *r -= h);
                    vectors.push(row);
                }
                vectors.push(rest);
                (Some(first..first + heads), Some(first + heads))
            }
            false => (None, None),
        };
        let total = vectors.len();
        vectors.push(total_row);
        let mlp_site = Site::layer(layer, LayerSite::MlpOutput);
        let mlp = match layout.has(mlp_site) {
            true => {
                vectors.push(last_row(saved, mlp_site)?);
                Some(vectors.len() - 1)
            }
            false => None,
        };
        layers.push(LayerParts {
            heads,
            rest,
            total,
            mlp,
        });
    }
    let summands = std::iter::once(0)
        .chain(
            layers
                .iter()
                .flat_map(|places| std::iter::once(places.total).chain(places.mlp)),
        )
        .map(|row| row as i64)
        .collect();
    Ok(Parts {
        vectors,
        layers,
        summands,
    })
}

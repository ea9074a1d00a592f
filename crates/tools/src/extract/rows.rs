//! Turning a batch's saved value into rows: one row per real token for sites with a token axis,
//! one row per prompt for the others.

use hookscope_core::schema::{CallDims, Dim, ModelLayout, Site};
use hookscope_core::{Error, Result};

/// What a row of a site's output stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RowKind {
    /// One row per real token.
    Token,
    /// One row per prompt.
    Prompt,
}

/// How one saved site becomes rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteRows {
    /// The site.
    pub site: Site,
    /// Token or prompt rows.
    pub kind: RowKind,
    /// The axis (of the site's shape, batch first) that runs over tokens, for token rows.
    axis: usize,
    /// The shape of one row (the site's shape without batch and token axes).
    pub row_shape: Vec<usize>,
}

impl SiteRows {
    /// The row layout of `site` on this model. A prompt call's token axis is `T` (or `S`, which
    /// equals `T` at the prompt call, for the key/value cache); a site with both (attention
    /// scores and probabilities, `[B, NH, T, S]`) has rows whose width depends on the batch's
    /// padded length and cannot be stacked: it is refused.
    pub fn of(layout: &ModelLayout, site: Site) -> Result<SiteRows> {
        let dims = layout.symbolic_shape(site)?.0;
        let axis_of = |wanted: Dim| dims.iter().position(|d| *d == wanted);
        let axis = match (axis_of(Dim::T), axis_of(Dim::S)) {
            (Some(_), Some(_)) => {
                return Err(Error::InvalidInput(format!(
                    "`{site}` has a row per query and a column per key position; its rows' \
                     width varies with each batch's padded length, so it cannot be extracted \
                     into one array (save it with `hookscope run` instead)"
                )));
            }
            (Some(axis), None) | (None, Some(axis)) => Some(axis),
            (None, None) => None,
        };
        // Sizes of the non-token axes do not depend on the call: resolve them at any size.
        let shape = layout.shape(
            site,
            CallDims {
                batch: 1,
                tokens: 1,
                positions: 1,
            },
        )?;
        let row_shape = shape
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 0 && Some(*i) != axis)
            .map(|(_, size)| *size)
            .collect();
        Ok(SiteRows {
            site,
            kind: if axis.is_some() {
                RowKind::Token
            } else {
                RowKind::Prompt
            },
            axis: axis.unwrap_or(0),
            row_shape,
        })
    }

    /// Elements in one row.
    pub fn row_len(&self) -> usize {
        self.row_shape.iter().product()
    }

    /// Appends the rows of a saved batch value (`values` in row-major order of `shape`) to
    /// `out`: for token rows, the real positions of each prompt (the last `lengths[b]` of the
    /// left-padded token axis), token-major; for prompt rows, one row per prompt.
    pub fn append(&self, values: &[f32], shape: &[usize], lengths: &[usize], out: &mut Vec<f32>) {
        let batch = shape[0];
        match self.kind {
            RowKind::Prompt => out.extend_from_slice(&values[..batch * self.row_len()]),
            RowKind::Token => {
                let tokens = shape[self.axis];
                let outer: usize = shape[1..self.axis].iter().product();
                let inner: usize = shape[self.axis + 1..].iter().product();
                for (b, length) in lengths.iter().enumerate() {
                    for t in tokens - length..tokens {
                        for o in 0..outer {
                            let start = ((b * outer + o) * tokens + t) * inner;
                            out.extend_from_slice(&values[start..start + inner]);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookscope_core::schema::{LayerSpec, MixerSite};

    fn layout() -> ModelLayout {
        ModelLayout::uniform(8, 11, LayerSpec::attention(2, 2, 4), 2)
    }

    #[test]
    fn token_rows_take_real_positions_along_any_axis() {
        let layout = layout();
        // `attention_queries` is `[B, NH, T, D]`: rows gather every head at one position.
        let queries = Site::self_attn(1, MixerSite::AttentionQueries);
        let rows = SiteRows::of(&layout, queries).unwrap();
        assert_eq!(rows.kind, RowKind::Token);
        let (batch, heads, tokens, dim) = (2, 2, 3, 2);
        let shape = [batch, heads, tokens, dim];
        let values: Vec<f32> = (0..batch * heads * tokens * dim)
            .map(|v| v as f32)
            .collect();
        let mut out = Vec::new();
        // Row 0 is fully real; row 1 has one real token (the last position).
        let row = |b: usize, t: usize| -> Vec<f32> {
            (0..heads)
                .flat_map(|h| {
                    let start = ((b * heads + h) * tokens + t) * dim;
                    values[start..start + dim].to_vec()
                })
                .collect()
        };
        assert_eq!(rows.row_shape, [2, 4]);
        rows.append(&values, &shape, &[3, 1], &mut out);
        let expected: Vec<f32> = [row(0, 0), row(0, 1), row(0, 2), row(1, 2)].concat();
        assert_eq!(out, expected);
    }

    #[test]
    fn attention_patterns_are_refused_and_probs_are_per_prompt() {
        let layout = layout();
        let scores = Site::self_attn(0, MixerSite::AttentionScores);
        assert!(SiteRows::of(&layout, scores).is_err());
        let probs = SiteRows::of(&layout, Site::NextTokenProbs).unwrap();
        assert_eq!(probs.kind, RowKind::Prompt);
        assert_eq!(probs.row_shape, [layout.vocab]);
        let keys = Site::self_attn(0, MixerSite::AttentionKeys);
        assert_eq!(SiteRows::of(&layout, keys).unwrap().kind, RowKind::Token);
    }
}

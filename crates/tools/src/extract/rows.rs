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
    /// The shape of one row (the site's shape without batch and token axes); for sparse rows,
    /// `[k]`.
    pub row_shape: Vec<usize>,
    /// Kept as the `k` largest non-zero entries of each row (their indices and values), not
    /// densely: dictionary features, whose dense rows (16k to 1M wide) would not fit.
    pub sparse: Option<usize>,
}

/// A site's rows gathered for one file: the values, and for sparse rows the indices beside them
/// (`-1` with value 0 where a row has fewer than `k` non-zero entries).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowBuffer {
    /// Row-major values.
    pub values: Vec<f32>,
    /// The index of each value in its dense row (sparse rows only).
    pub indices: Vec<i64>,
}

impl SiteRows {
    /// The row layout of `site` on this model. A prompt call's token axis is `T` (or `S`, which
    /// equals `T` at the prompt call, for the key/value cache); a site with both (attention
    /// scores and probabilities, `[B, NH, T, S]`) has rows whose width depends on the batch's
    /// padded length and cannot be stacked: it is refused.
    pub fn of(layout: &ModelLayout, site: Site) -> Result<SiteRows> {
        SiteRows::of_with(layout, site, None)
    }

    /// [`SiteRows::of`], keeping each token row of a `[B, T, X]` site as its `sparse` largest
    /// non-zero entries when given.
    pub fn of_with(layout: &ModelLayout, site: Site, sparse: Option<usize>) -> Result<SiteRows> {
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
        let row_shape: Vec<usize> = shape
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 0 && Some(*i) != axis)
            .map(|(_, size)| *size)
            .collect();
        let row_shape = match sparse {
            None => row_shape,
            Some(k) if k > 0 && axis.is_some() && row_shape.len() == 1 => vec![k.min(row_shape[0])],
            Some(k) => {
                return Err(Error::InvalidInput(format!(
                    "`{site}` cannot be kept as its {k} largest entries per token: sparse rows \
                     are for token rows of one axis (dictionary features), with k >= 1"
                )));
            }
        };
        Ok(SiteRows {
            sparse: sparse.map(|_| row_shape[0]),
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
    pub fn append(&self, values: &[f32], shape: &[usize], lengths: &[usize], out: &mut RowBuffer) {
        let Some(k) = self.sparse else {
            return self.append_dense(values, shape, lengths, &mut out.values);
        };
        let mut dense = Vec::new();
        self.append_dense(values, shape, lengths, &mut dense);
        let width = shape.last().copied().unwrap_or(0).max(1);
        for row in dense.chunks(width) {
            let active = crate::analysis::top_active(row, k);
            for slot in 0..k {
                let (index, value) = match active.get(slot) {
                    Some(&(index, value)) => (i64::try_from(index).unwrap_or(-1), value),
                    None => (-1, 0.0),
                };
                out.indices.push(index);
                out.values.push(value);
            }
        }
    }

    fn append_dense(&self, values: &[f32], shape: &[usize], lengths: &[usize], out: &mut Vec<f32>) {
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
    use hookscope_core::schema::{FeedForwardKind, LayerSpec, MixerSite};

    fn layout() -> ModelLayout {
        let layer = LayerSpec::attention(2, 2, 4, FeedForwardKind::Gated { inner: 12 });
        ModelLayout::uniform(8, 11, layer, 2)
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
        let mut out = RowBuffer::default();
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
        assert_eq!(out.values, expected);
        assert!(out.indices.is_empty());
    }

    #[test]
    fn sparse_rows_keep_the_largest_active_entries_of_real_tokens() {
        let layout = layout();
        let site = Site::layer(0, hookscope_core::schema::LayerSite::LayerOutput);
        let rows = SiteRows::of_with(&layout, site, Some(3)).unwrap();
        assert_eq!(
            (rows.row_shape.as_slice(), rows.sparse),
            (&[3][..], Some(3))
        );
        // Batch 2, two positions, width 8 (the layout's hidden size); row 1 has one real token.
        let mut values = vec![0.0f32; 2 * 2 * 8];
        values[3] = 1.0; // b0 t0: one active entry
        values[8 + 1] = 2.0; // b0 t1: four active entries
        values[8 + 4] = 5.0;
        values[8 + 6] = 2.0;
        values[8 + 7] = 0.5;
        values[16] = 9.0; // b1 t0: padding, dropped
        values[24 + 2] = -1.0; // b1 t1: a negative activation counts as active
        let mut out = RowBuffer::default();
        rows.append(&values, &[2, 2, 8], &[2, 1], &mut out);
        assert_eq!(out.indices, [3, -1, -1, 4, 1, 6, 2, -1, -1]);
        assert_eq!(out.values, [1.0, 0.0, 0.0, 5.0, 2.0, 2.0, -1.0, 0.0, 0.0]);
        assert!(SiteRows::of_with(&layout, Site::NextTokenProbs, Some(3)).is_err());
        assert!(SiteRows::of_with(&layout, site, Some(0)).is_err());
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

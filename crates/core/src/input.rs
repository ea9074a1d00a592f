//! Batches of prompts (left-padded, with an attention mask) and the per-call inputs derived from
//! the mask: position ids, the causal + padding attention mask and the token mask.

use std::ops::Range;

use burn::tensor::{Bool, Device, Int, Tensor, TensorData};

use crate::error::{Error, Result};

/// Prompts as token ids, left-padded to one length, with a mask of real (non-pad) positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// `[B][T]` token ids, pad ids on the left.
    pub ids: Vec<Vec<u32>>,
    /// `[B][T]`: true at real tokens, false at padding.
    pub mask: Vec<Vec<bool>>,
}

impl Batch {
    /// Left-pads `prompts` with `pad_id` to the longest one's length.
    pub fn left_padded(prompts: Vec<Vec<u32>>, pad_id: u32) -> Result<Batch> {
        if prompts.is_empty() {
            return Err(Error::InvalidInput("no prompts".into()));
        }
        if let Some(k) = prompts.iter().position(Vec::is_empty) {
            return Err(Error::InvalidInput(format!("prompt {k} has no tokens")));
        }
        let len = prompts.iter().map(Vec::len).max().unwrap_or_default();
        let (ids, mask) = prompts
            .into_iter()
            .map(|prompt| {
                let pad = len - prompt.len();
                let mut ids = vec![pad_id; pad];
                ids.extend(prompt);
                let mut mask = vec![false; pad];
                mask.resize(len, true);
                (ids, mask)
            })
            .unzip();
        Ok(Batch { ids, mask })
    }

    /// Rows `rows` alone, as they are padded here.
    pub fn rows(&self, rows: Range<usize>) -> Batch {
        Batch {
            ids: self.ids[rows.clone()].to_vec(),
            mask: self.mask[rows].to_vec(),
        }
    }

    /// Number of prompts.
    pub fn batch_size(&self) -> usize {
        self.ids.len()
    }

    /// Padded prompt length.
    pub fn len(&self) -> usize {
        self.ids.first().map_or(0, Vec::len)
    }

    /// Whether the prompts are empty (never true for a batch made by [`Batch::left_padded`]).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks that the batch is non-empty and rectangular, with a mask of the same shape, and
    /// that every token id is inside a vocabulary of `vocab` entries.
    pub fn validate(&self, vocab: usize) -> Result<()> {
        let len = self.len();
        let rectangular = self.ids.iter().all(|row| row.len() == len)
            && self.mask.len() == self.ids.len()
            && self.mask.iter().all(|row| row.len() == len);
        if self.ids.is_empty() || len == 0 || !rectangular {
            return Err(Error::InvalidInput(
                "a batch needs at least one token per prompt, equal lengths and a mask of the same shape".into(),
            ));
        }
        if let Some(bad) = self.ids.iter().flatten().find(|id| **id as usize >= vocab) {
            return Err(Error::InvalidInput(format!(
                "token id {bad} is outside the vocabulary (size {vocab})"
            )));
        }
        Ok(())
    }

    /// Whether any prompt is padded.
    pub fn is_padded(&self) -> bool {
        self.mask.iter().flatten().any(|real| !real)
    }
}

/// Position ids `[B, T]` of a call feeding the last `tokens` of `key_mask`'s positions
/// (`key_mask` is `[B][S]`: true at real tokens of the whole context so far). Positions count
/// real tokens; pads get position 1, as `transformers` does.
pub(crate) fn position_ids(
    key_mask: &[Vec<bool>],
    tokens: usize,
    device: &Device,
) -> Tensor<2, Int> {
    let batch = key_mask.len();
    let mut ids = Vec::with_capacity(batch * tokens);
    for row in key_mask {
        let past = row.len() - tokens;
        let mut seen: i64 = 0;
        for (position, real) in row.iter().enumerate() {
            seen += i64::from(*real);
            if position >= past {
                ids.push(if *real { seen - 1 } else { 1 });
            }
        }
    }
    Tensor::from_data(TensorData::new(ids, [batch, tokens]), device)
}

/// The attention mask `[B, 1, T, S]` of such a call, true where a query must not see a key. A
/// real query sees real keys at or before it; a pad query sees every key at or before it, which
/// keeps its row finite (its values are never used by a real position). With a `window`, a
/// query also sees no key `window` or more positions before it (transformers' sliding-window
/// mask: positions are indices on the key axis, pads included).
pub(crate) fn attention_mask(
    key_mask: &[Vec<bool>],
    tokens: usize,
    window: Option<usize>,
    device: &Device,
) -> Tensor<4, Bool> {
    let batch = key_mask.len();
    let positions = key_mask.first().map_or(0, Vec::len);
    let past = positions - tokens;
    let mut masked = Vec::with_capacity(batch * tokens * positions);
    for row in key_mask {
        for query in past..positions {
            let query_is_real = row[query];
            let first_in_window = window.map_or(0, |w| (query + 1).saturating_sub(w));
            masked.extend(
                (0..positions).map(|key| {
                    key > query || key < first_in_window || (query_is_real && !row[key])
                }),
            );
        }
    }
    Tensor::from_data(
        TensorData::new(masked, [batch, 1, tokens, positions]),
        device,
    )
}

/// The token mask `[B, T]` of such a call: 1.0 at real tokens, 0.0 at padding.
pub(crate) fn token_mask(key_mask: &[Vec<bool>], tokens: usize, device: &Device) -> Tensor<2> {
    let batch = key_mask.len();
    let real: Vec<f32> = key_mask
        .iter()
        .flat_map(|row| {
            row[row.len() - tokens..]
                .iter()
                .map(|r| f32::from(u8::from(*r)))
        })
        .collect();
    Tensor::from_data(TensorData::new(real, [batch, tokens]), device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn left_padding_and_masks() {
        let batch = Batch::left_padded(vec![vec![5, 6, 7], vec![8]], 0).unwrap();
        assert_eq!(batch.ids, [vec![5, 6, 7], vec![0, 0, 8]]);
        assert_eq!(batch.mask, [vec![true; 3], vec![false, false, true]]);
        let device = Device::default();
        let positions = position_ids(&batch.mask, 3, &device);
        let mask = attention_mask(&batch.mask, 3, None, &device);
        let real = token_mask(&batch.mask, 3, &device);
        assert_eq!(
            real.to_data().try_to_vec::<f32>().unwrap(),
            [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]
        );
        assert_eq!(
            positions
                .to_data()
                .convert::<i64>()
                .try_to_vec::<i64>()
                .unwrap(),
            [0, 1, 2, 1, 1, 0]
        );
        let mask = mask.to_data().try_to_vec::<bool>().unwrap();
        // Row 1, query 2 (the real token) sees only key 2.
        assert_eq!(&mask[9 + 6..9 + 9], &[true, true, false]);
        // Row 0 is plain causal.
        assert_eq!(
            &mask[..9],
            &[false, true, true, false, false, true, false, false, false]
        );
    }

    #[test]
    fn a_window_hides_keys_that_many_positions_back() {
        let batch = Batch::left_padded(vec![vec![5, 6, 7, 8], vec![9, 10]], 0).unwrap();
        let mask = attention_mask(&batch.mask, 4, Some(2), &Device::default());
        let mask = mask.to_data().try_to_vec::<bool>().unwrap();
        let visible =
            |row: &[bool]| -> Vec<usize> { (0..row.len()).filter(|&key| !row[key]).collect() };
        // Row 0: each query sees itself and the key before it.
        let rows: Vec<Vec<usize>> = mask[..16].chunks(4).map(visible).collect();
        assert_eq!(rows, [vec![0], vec![0, 1], vec![1, 2], vec![2, 3]]);
        // Row 1 (two pads): the window counts key-axis positions, pads included.
        let rows: Vec<Vec<usize>> = mask[16..].chunks(4).map(visible).collect();
        assert_eq!(rows, [vec![0], vec![0, 1], vec![2], vec![2, 3]]);
    }

    #[test]
    fn empty_prompts_are_rejected() {
        assert!(Batch::left_padded(vec![], 0).is_err());
        assert!(Batch::left_padded(vec![vec![1], vec![]], 0).is_err());
    }
}

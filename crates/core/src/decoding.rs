//! Choosing the next token from `next_token_probs`: greedy or sampled, as the checkpoint's
//! `generation_config.json` says unless overridden.

use serde_json::Value;

use crate::error::{Error, Result};

/// How each step picks its token.
#[derive(Debug, Clone, PartialEq)]
pub enum Decoding {
    /// The most likely token (the lowest id among ties, like `argmax`).
    Greedy,
    /// A draw from the distribution, reshaped by temperature, top-k and top-p.
    Sample {
        /// Divides the logits (1.0: unchanged).
        temperature: f32,
        /// Keep the `k` most likely tokens (0: all).
        top_k: usize,
        /// Keep the smallest set of most likely tokens whose mass reaches `p` (1.0: all).
        top_p: f32,
        /// Seed of the random stream: the same seed gives the same tokens.
        seed: u64,
    },
}

/// Decoding settings of one generation.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationConfig {
    /// Greedy or sampled.
    pub decoding: Decoding,
    /// Tokens to generate (calls to make) at most.
    pub max_new_tokens: usize,
    /// Tokens that end a row.
    pub eos_token_ids: Vec<u32>,
    /// Token appended to rows that have ended.
    pub pad_token_id: u32,
    /// Feed only the new token at decode steps, reusing cached keys/values and state (true), or
    /// recompute the whole sequence at every step (false; for checking the cache).
    pub use_cache: bool,
}

impl GenerationConfig {
    /// The checkpoint's defaults: `generation_config.json`, then `config.json`, then the
    /// `transformers` defaults (greedy; when sampling, temperature 1, top-k 50, top-p 1).
    pub fn from_json(generation: Option<&Value>, config: &Value) -> Self {
        let sources: Vec<&Value> = generation.into_iter().chain([config]).collect();
        let field = |key: &str| {
            sources
                .iter()
                .find_map(|json| json.get(key).filter(|v| !v.is_null()))
        };
        let ids = |key: &str| -> Vec<u32> {
            match field(key) {
                Some(Value::Number(n)) => n.as_u64().map(|n| n as u32).into_iter().collect(),
                Some(Value::Array(list)) => list
                    .iter()
                    .filter_map(Value::as_u64)
                    .map(|n| n as u32)
                    .collect(),
                _ => Vec::new(),
            }
        };
        let number =
            |key: &str, default: f64| field(key).and_then(Value::as_f64).unwrap_or(default);
        let eos_token_ids = ids("eos_token_id");
        let pad_token_id = ids("pad_token_id")
            .first()
            .or(eos_token_ids.first())
            .copied()
            .unwrap_or(0);
        let decoding = if field("do_sample").and_then(Value::as_bool).unwrap_or(false) {
            Decoding::Sample {
                temperature: number("temperature", 1.0) as f32,
                top_k: number("top_k", 50.0) as usize,
                top_p: number("top_p", 1.0) as f32,
                seed: 0,
            }
        } else {
            Decoding::Greedy
        };
        GenerationConfig {
            decoding,
            max_new_tokens: number("max_new_tokens", 20.0) as usize,
            eos_token_ids,
            pad_token_id,
            use_cache: true,
        }
    }

    /// Checks the settings before anything runs.
    pub fn validate(&self) -> Result<()> {
        if let Decoding::Sample {
            temperature, top_p, ..
        } = self.decoding
        {
            if !(temperature > 0.0 && temperature.is_finite()) {
                return Err(Error::InvalidInput(format!(
                    "temperature must be positive, got {temperature}"
                )));
            }
            if !(top_p > 0.0 && top_p <= 1.0) {
                return Err(Error::InvalidInput(format!(
                    "top_p must be in (0, 1], got {top_p}"
                )));
            }
        }
        Ok(())
    }
}

/// Picks tokens from per-row distributions, holding the random stream across steps.
pub(crate) struct TokenPicker {
    decoding: Decoding,
    rng: fastrand::Rng,
}

impl TokenPicker {
    pub(crate) fn new(decoding: &Decoding) -> Self {
        let seed = match decoding {
            Decoding::Sample { seed, .. } => *seed,
            Decoding::Greedy => 0,
        };
        TokenPicker {
            decoding: decoding.clone(),
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    /// The token for one row's distribution `probs` (length V).
    pub(crate) fn pick(&mut self, probs: &[f32]) -> u32 {
        match &self.decoding {
            Decoding::Greedy => argmax(probs),
            Decoding::Sample {
                temperature,
                top_k,
                top_p,
                ..
            } => {
                let kept = warp(probs, *temperature, *top_k, *top_p);
                let total: f32 = kept.iter().map(|(_, p)| p).sum();
                let mut target = self.rng.f32() * total;
                for (id, p) in &kept {
                    if target < *p {
                        return *id;
                    }
                    target -= p;
                }
                kept.last().map_or_else(|| argmax(probs), |(id, _)| *id)
            }
        }
    }
}

/// Index of the largest value; the first among ties.
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] {
            best = i;
        }
    }
    best as u32
}

/// The candidates a sampled step draws from, most likely first, with unnormalised weights:
/// temperature (`p^(1/T)`, i.e. `softmax(logits / T)`), then top-k, then top-p, as the
/// `transformers` warpers apply them.
fn warp(probs: &[f32], temperature: f32, top_k: usize, top_p: f32) -> Vec<(u32, f32)> {
    let mut weighted: Vec<(u32, f32)> = probs
        .iter()
        .enumerate()
        .map(|(id, p)| (id as u32, p.max(0.0).powf(1.0 / temperature)))
        .collect();
    weighted.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if top_k > 0 {
        weighted.truncate(top_k.max(1));
    }
    let total: f32 = weighted.iter().map(|(_, w)| w).sum();
    if top_p < 1.0 && total > 0.0 {
        let mut mass = 0.0;
        let keep = weighted
            .iter()
            .position(|(_, w)| {
                mass += w / total;
                mass >= top_p
            })
            .map_or(weighted.len(), |last| last + 1);
        weighted.truncate(keep.max(1));
    }
    weighted
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_come_from_the_generation_config_first() {
        let generation = json!({"eos_token_id": [7, 9], "do_sample": true, "top_k": 3});
        let config = json!({"eos_token_id": 1, "pad_token_id": 2});
        let parsed = GenerationConfig::from_json(Some(&generation), &config);
        assert_eq!(parsed.eos_token_ids, [7, 9]);
        assert_eq!(parsed.pad_token_id, 2);
        assert!(matches!(parsed.decoding, Decoding::Sample { top_k: 3, .. }));
        let greedy = GenerationConfig::from_json(None, &json!({"eos_token_id": 5}));
        assert_eq!(greedy.decoding, Decoding::Greedy);
        assert_eq!(greedy.pad_token_id, 5);
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        assert_eq!(argmax(&[0.1, 0.4, 0.4, 0.1]), 1);
    }

    #[test]
    fn warpers_restrict_the_candidates() {
        let probs = [0.05, 0.5, 0.3, 0.15];
        let ids = |kept: Vec<(u32, f32)>| kept.into_iter().map(|(id, _)| id).collect::<Vec<_>>();
        assert_eq!(ids(warp(&probs, 1.0, 2, 1.0)), [1, 2]);
        assert_eq!(ids(warp(&probs, 1.0, 0, 0.75)), [1, 2]);
        assert_eq!(ids(warp(&probs, 1.0, 0, 0.1)), [1]);
        assert_eq!(ids(warp(&probs, 1.0, 0, 1.0)).len(), 4);
    }

    #[test]
    fn a_seed_makes_sampling_reproducible() {
        let sample = Decoding::Sample {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 42,
        };
        let probs = [0.25, 0.25, 0.25, 0.25];
        let draw = || {
            let mut picker = TokenPicker::new(&sample);
            (0..32).map(|_| picker.pick(&probs)).collect::<Vec<_>>()
        };
        let first = draw();
        assert_eq!(first, draw());
        assert!(first.iter().any(|id| *id != first[0]), "draws vary");
    }
}

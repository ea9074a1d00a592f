//! Choosing the next token from `next_token_probs`: greedy or sampled, as the checkpoint's
//! `generation_config.json` says unless overridden.

use std::path::Path;

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

/// The `k` largest entries of `row` as `(id, value)`, largest first (ties: lowest id).
pub fn top_k(row: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut ids: Vec<usize> = (0..row.len()).collect();
    let k = k.min(ids.len());
    if k == 0 {
        return Vec::new();
    }
    let order = |a: &usize, b: &usize| row[*b].total_cmp(&row[*a]).then(a.cmp(b));
    ids.select_nth_unstable_by(k - 1, order);
    ids.truncate(k);
    ids.sort_by(order);
    ids.into_iter().map(|id| (id, row[id])).collect()
}

/// A caller's decoding choices over a checkpoint's defaults (the CLI's flags, Python's keyword
/// arguments).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DecodingChoice {
    /// Sample (true) or pick greedily (false); `None`: as the checkpoint says.
    pub sample: Option<bool>,
    /// Sampling temperature; `None`: the checkpoint's, else 1.
    pub temperature: Option<f32>,
    /// Top-k; `None`: the checkpoint's, else 50.
    pub top_k: Option<usize>,
    /// Top-p; `None`: the checkpoint's, else 1.
    pub top_p: Option<f32>,
    /// Seed of the sampling stream.
    pub seed: u64,
}

impl DecodingChoice {
    /// The first sampling option this choice sets (meaningless under greedy decoding), by name.
    fn sampling_option(&self) -> Option<&'static str> {
        [
            ("temperature", self.temperature.is_some()),
            ("top_k", self.top_k.is_some()),
            ("top_p", self.top_p.is_some()),
        ]
        .into_iter()
        .find_map(|(option, given)| given.then_some(option))
    }
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
    /// These defaults for a generation of `max_new_tokens` with `choice` applied: sampling
    /// keeps the checkpoint's parameters unless overridden (`transformers`' 1, 50, 1 when the
    /// checkpoint decodes greedily). A sampling option under greedy decoding is refused, naming
    /// the option ([`Error::SamplingOptionUnderGreedy`]).
    pub fn with_choice(
        &self,
        max_new_tokens: usize,
        choice: &DecodingChoice,
    ) -> Result<GenerationConfig> {
        let mut config = self.clone();
        config.max_new_tokens = max_new_tokens;
        let (sampled, temperature, top_k, top_p) = match self.decoding {
            Decoding::Sample {
                temperature,
                top_k,
                top_p,
                ..
            } => (true, temperature, top_k, top_p),
            Decoding::Greedy => (false, 1.0, 50, 1.0),
        };
        config.decoding = match choice.sample.unwrap_or(sampled) {
            true => Decoding::Sample {
                temperature: choice.temperature.unwrap_or(temperature),
                top_k: choice.top_k.unwrap_or(top_k),
                top_p: choice.top_p.unwrap_or(top_p),
                seed: choice.seed,
            },
            false => Decoding::Greedy,
        };
        if let (Decoding::Greedy, Some(option)) = (&config.decoding, choice.sampling_option()) {
            return Err(Error::SamplingOptionUnderGreedy { option });
        }
        Ok(config)
    }

    /// The checkpoint's defaults: `generation_config.json`, then `config.json` (each given
    /// with its path, for messages), then the `transformers` defaults (greedy; when sampling,
    /// temperature 1, top-k 50, top-p 1). A value of the wrong type is an error naming the
    /// file and the key, never silently ignored.
    pub fn from_json(generation: Option<(&Path, &Value)>, config: (&Path, &Value)) -> Result<Self> {
        let sources: Vec<(&Path, &Value)> = generation.into_iter().chain([config]).collect();
        let field = |key: &'static str| {
            sources.iter().find_map(|(path, json)| {
                json.get(key)
                    .filter(|v| !v.is_null())
                    .map(|value| Field { path, key, value })
            })
        };
        let eos_token_ids = match field("eos_token_id") {
            None => Vec::new(),
            Some(f) => match f.value {
                Value::Array(list) => list
                    .iter()
                    .map(|id| token_id(id).ok_or_else(|| f.wrong("token ids")))
                    .collect::<Result<_>>()?,
                single => vec![token_id(single).ok_or_else(|| f.wrong("a token id or a list"))?],
            },
        };
        let pad_token_id = match field("pad_token_id") {
            Some(f) => token_id(f.value).ok_or_else(|| f.wrong("a token id"))?,
            None => eos_token_ids.first().copied().unwrap_or(0),
        };
        let number = |key: &'static str, default: f64| match field(key) {
            None => Ok(default),
            Some(f) => f.value.as_f64().ok_or_else(|| f.wrong("a number")),
        };
        let count = |key: &'static str, default: usize| match field(key) {
            None => Ok(default),
            Some(f) => f
                .value
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| f.wrong("a non-negative integer")),
        };
        let do_sample = match field("do_sample") {
            None => false,
            Some(f) => f.value.as_bool().ok_or_else(|| f.wrong("true or false"))?,
        };
        // Checked even when decoding greedily: a wrongly typed value is a mistake either way.
        let (temperature, top_k, top_p) = (
            number("temperature", 1.0)? as f32,
            count("top_k", 50)?,
            number("top_p", 1.0)? as f32,
        );
        let decoding = if do_sample {
            Decoding::Sample {
                temperature,
                top_k,
                top_p,
                seed: 0,
            }
        } else {
            Decoding::Greedy
        };
        Ok(GenerationConfig {
            decoding,
            max_new_tokens: count("max_new_tokens", 20)?,
            eos_token_ids,
            pad_token_id,
            use_cache: true,
        })
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

/// A generation setting found in one of the checkpoint's files.
struct Field<'a> {
    path: &'a Path,
    key: &'static str,
    value: &'a Value,
}

impl Field<'_> {
    /// The error for a value of the wrong type: names the file, the key and what was expected.
    fn wrong(&self, expected: &str) -> Error {
        Error::InvalidInput(format!(
            "{}: `{}` must be {expected}, got {}",
            self.path.display(),
            self.key,
            self.value
        ))
    }
}

/// A JSON token id (a non-negative integer that fits in 32 bits).
fn token_id(value: &Value) -> Option<u32> {
    value.as_u64().and_then(|id| u32::try_from(id).ok())
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

    /// The token for one row's distribution `probs` (length V), or why the row is not a
    /// distribution it can pick from: a NaN anywhere, or (when sampling) a negative or
    /// non-finite value or a total that is not positive.
    pub(crate) fn pick(&mut self, probs: &[f32]) -> Result<u32, String> {
        if let Some(id) = probs.iter().position(|p| p.is_nan()) {
            return Err(format!("it holds NaN (first at token id {id})"));
        }
        match &self.decoding {
            Decoding::Greedy => Ok(argmax(probs)),
            Decoding::Sample {
                temperature,
                top_k,
                top_p,
                ..
            } => {
                if let Some(id) = probs.iter().position(|p| *p < 0.0 || p.is_infinite()) {
                    return Err(format!(
                        "it holds {} at token id {id}; sampling needs finite non-negative \
                         probabilities",
                        probs[id]
                    ));
                }
                let kept = warp(probs, *temperature, *top_k, *top_p);
                let total: f32 = kept.iter().map(|(_, p)| p).sum();
                if !(total > 0.0 && total.is_finite()) {
                    return Err(format!(
                        "the probabilities kept for sampling sum to {total}, not a positive \
                         finite number"
                    ));
                }
                let mut target = self.rng.f32() * total;
                for (id, p) in &kept {
                    if target < *p {
                        return Ok(*id);
                    }
                    target -= p;
                }
                Ok(kept.last().map_or_else(|| argmax(probs), |(id, _)| *id))
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
        let (generation_path, config_path) = (Path::new("g.json"), Path::new("c.json"));
        let parsed = GenerationConfig::from_json(
            Some((generation_path, &generation)),
            (config_path, &config),
        )
        .unwrap();
        assert_eq!(parsed.eos_token_ids, [7, 9]);
        assert_eq!(parsed.pad_token_id, 2);
        assert!(matches!(parsed.decoding, Decoding::Sample { top_k: 3, .. }));
        let greedy =
            GenerationConfig::from_json(None, (config_path, &json!({"eos_token_id": 5}))).unwrap();
        assert_eq!(greedy.decoding, Decoding::Greedy);
        assert_eq!(greedy.pad_token_id, 5);
    }

    #[test]
    fn a_sampling_option_under_greedy_decoding_is_refused_by_name() {
        let path = Path::new("c.json");
        let greedy = GenerationConfig::from_json(None, (path, &json!({}))).unwrap();
        let top_p = DecodingChoice {
            top_p: Some(0.9),
            ..DecodingChoice::default()
        };
        let error = greedy.with_choice(3, &top_p).unwrap_err();
        assert!(
            matches!(error, Error::SamplingOptionUnderGreedy { option: "top_p" }),
            "{error}"
        );
        assert!(
            error
                .to_string()
                .starts_with("--top-p applies only when sampling")
        );
        let sampled = DecodingChoice {
            sample: Some(true),
            ..top_p
        };
        let config = greedy.with_choice(3, &sampled).unwrap();
        assert!(matches!(config.decoding, Decoding::Sample { top_p, .. } if top_p == 0.9));
    }

    #[test]
    fn wrongly_typed_values_name_the_file_and_key() {
        let path = Path::new("generation_config.json");
        let config = (Path::new("config.json"), &json!({}));
        for (bad, key) in [
            (json!({"eos_token_id": "five"}), "eos_token_id"),
            (json!({"eos_token_id": [1, -2]}), "eos_token_id"),
            (json!({"do_sample": "yes"}), "do_sample"),
            (json!({"temperature": "hot"}), "temperature"),
            (json!({"do_sample": true, "top_k": 2.5}), "top_k"),
            (json!({"pad_token_id": 1e20}), "pad_token_id"),
        ] {
            let error = GenerationConfig::from_json(Some((path, &bad)), config)
                .unwrap_err()
                .to_string();
            assert!(
                error.contains(&format!("generation_config.json: `{key}` must be")),
                "{error}"
            );
        }
    }

    #[test]
    fn degenerate_distributions_are_refused_when_sampling() {
        let sample = Decoding::Sample {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 1,
        };
        let mut picker = TokenPicker::new(&sample);
        let zeros = picker.pick(&[0.0; 4]).unwrap_err();
        assert!(zeros.contains("sum to 0"), "{zeros}");
        assert!(picker.pick(&[0.5, f32::NAN]).unwrap_err().contains("NaN"));
        assert!(picker.pick(&[0.5, -0.5]).unwrap_err().contains("-0.5"));
        assert!(picker.pick(&[0.5, f32::INFINITY]).is_err());
        let mut greedy = TokenPicker::new(&Decoding::Greedy);
        assert_eq!(
            greedy.pick(&[0.0; 4]),
            Ok(0),
            "greedy takes the first of equal values"
        );
        assert!(greedy.pick(&[0.5, f32::NAN]).is_err());
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
            (0..32)
                .map(|_| picker.pick(&probs).unwrap())
                .collect::<Vec<_>>()
        };
        let first = draw();
        assert_eq!(first, draw());
        assert!(first.iter().any(|id| *id != first[0]), "draws vary");
    }
}

//! `POST /v1/run`'s body: the CLI's `run` options as JSON, checked against the server's limits
//! before the model is touched. No request names a file on the server: operands come inline.

use hookscope::decoding::DecodingChoice;
use hookscope::hooks::{Operand, RequestSpecs};
use hookscope::{Batch, GenerationConfig, Interventions, Model, Steps};
use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::limits::Limits;

/// A trace (no `max_new_tokens`) or a generation, with reads and writes of sites.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// Prompts as text (a left-padded batch); or `input_ids`.
    #[serde(default)]
    pub prompts: Vec<String>,
    /// Prompts as token ids, instead of `prompts`.
    #[serde(default)]
    pub input_ids: Vec<Vec<u32>>,
    /// `PATTERN[INDEX][@STEPS]` to save (as `--save`).
    #[serde(default)]
    pub save: Vec<String>,
    /// `PATTERN[INDEX][@STEPS]` to zero (as `--zero`).
    #[serde(default)]
    pub zero: Vec<String>,
    /// Values to add (as `--add`).
    #[serde(default)]
    pub add: Vec<Write>,
    /// Values to set (as `--set`).
    #[serde(default)]
    pub set: Vec<Write>,
    /// Generate this many tokens; a single trace without it.
    pub max_new_tokens: Option<usize>,
    /// Pick the most likely token at every step.
    #[serde(default)]
    pub greedy: bool,
    /// Sample at every step.
    #[serde(default)]
    pub sample: bool,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Sample among the K most likely tokens.
    pub top_k: Option<usize>,
    /// Sample among the tokens holding probability mass P.
    pub top_p: Option<f32>,
    /// Seed of the sampling stream.
    #[serde(default)]
    pub seed: u64,
    /// Most likely next tokens reported per prompt (and step).
    #[serde(default = "default_top")]
    pub top: usize,
    /// `json` (default): saved values as arrays in the answer; `safetensors`: the answer is a
    /// safetensors file holding them, with the report in its metadata.
    #[serde(default)]
    pub format: Format,
}

fn default_top() -> usize {
    5
}

/// Most next tokens a report may list per prompt and step.
pub(crate) const MAX_TOP: usize = 100;

/// How saved values come back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// In the JSON answer, as `{"shape", "data"}`.
    #[default]
    Json,
    /// As a safetensors file (binary), the report in its metadata under `report`.
    Safetensors,
}

/// One write: its target (`PATTERN[INDEX][@STEPS]`) and a number or an inline tensor.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Write {
    /// What to write.
    pub target: String,
    /// One number for every selected element.
    pub value: Option<f32>,
    /// A tensor's values, row-major, with `shape` (broadcast as `--add`'s stored tensors are).
    pub values: Option<Vec<f32>>,
    /// The tensor's shape (default: one axis).
    pub shape: Option<Vec<usize>>,
}

impl Write {
    /// The operand, refusing a write that gives both or neither, or a shape its values do not
    /// fill.
    fn operand(&self, field: &str) -> Result<Operand, ApiError> {
        let (values, shape) = match (self.value, &self.values) {
            (Some(value), None) => (vec![value], vec![]),
            (None, Some(values)) => {
                let shape = self.shape.clone().unwrap_or_else(|| vec![values.len()]);
                let elements = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
                if elements != Some(values.len()) {
                    return Err(ApiError::bad_request(format!(
                        "`{field}` `{}`: shape {shape:?} does not hold {} values",
                        self.target,
                        values.len()
                    )));
                }
                (values.clone(), shape)
            }
            _ => {
                return Err(ApiError::bad_request(format!(
                    "`{field}` `{}`: give `value` (a number) or `values` (with `shape`), not \
                     both",
                    self.target
                )));
            }
        };
        Ok(Operand { values, shape })
    }
}

/// A checked request: the batch, the reads and writes, and the generation settings.
pub struct Prepared {
    /// The prompts as the report names them.
    pub prompts: Vec<String>,
    /// The batch.
    pub batch: Batch,
    /// The reads and writes.
    pub interventions: Interventions,
    /// The generation, if one is asked for.
    pub generation: Option<GenerationConfig>,
    /// What the saved values will hold at most, in bytes.
    pub saved_bytes: usize,
}

impl RunRequest {
    /// Checks the request against `limits` and `model` and builds what the run needs.
    pub fn prepare(&self, model: &Model, limits: &Limits) -> Result<Prepared, ApiError> {
        let (prompts, batch) = self.batch(model, limits)?;
        if self.top > MAX_TOP {
            return Err(ApiError::bad_request(format!(
                "`top` is {}; at most {MAX_TOP}",
                self.top
            )));
        }
        let generating = self.max_new_tokens.is_some();
        let decoding = self.greedy
            || self.sample
            || self.temperature.is_some()
            || self.top_k.is_some()
            || self.top_p.is_some()
            || self.seed != 0;
        if decoding && !generating {
            return Err(ApiError::bad_request(
                "`greedy`, `sample`, `temperature`, `top_k`, `top_p` and `seed` are for a \
                 generation: give `max_new_tokens`",
            ));
        }
        if let Some(new) = self.max_new_tokens
            && (new == 0 || new > limits.new_tokens)
        {
            return Err(ApiError::too_large(format!(
                "`max_new_tokens` is {new}; this server generates 1 to {}",
                limits.new_tokens
            )));
        }
        let writes = |writes: &[Write], field: &str| {
            writes
                .iter()
                .map(|write| Ok((write.target.clone(), write.operand(field)?)))
                .collect::<Result<Vec<_>, ApiError>>()
        };
        let specs = RequestSpecs {
            save: self.save.clone(),
            zero: self.zero.clone(),
            add_values: writes(&self.add, "add")?,
            set_values: writes(&self.set, "set")?,
            ..Default::default()
        };
        let default_steps = match generating {
            true => Steps::All,
            false => Steps::At(0),
        };
        let interventions =
            specs.interventions(model.layout(), &default_steps, generating, model.device())?;
        let steps = self.max_new_tokens.unwrap_or(1);
        let sizes = (batch.batch_size(), batch.len());
        let saved = interventions.saved_bytes(model.layout(), sizes, steps)?;
        let saved_bytes = match saved {
            Some(bytes) if bytes <= limits.saved_bytes => bytes,
            _ => {
                return Err(ApiError::too_large(format!(
                    "the saved values would hold {}; this server returns at most {} a request \
                     (save fewer sites or steps)",
                    saved.map_or("more than memory".into(), hookscope::error::human_bytes),
                    hookscope::error::human_bytes(limits.saved_bytes)
                )));
            }
        };
        let generation = match self.max_new_tokens {
            Some(new) => {
                let choice = DecodingChoice {
                    sample: match (self.sample, self.greedy) {
                        (true, true) => {
                            return Err(ApiError::bad_request(
                                "`greedy` and `sample` are both true",
                            ));
                        }
                        (true, false) => Some(true),
                        (false, true) => Some(false),
                        (false, false) => None,
                    },
                    temperature: self.temperature,
                    top_k: self.top_k,
                    top_p: self.top_p,
                    seed: self.seed,
                };
                Some(model.generation_config().with_choice(new, &choice)?)
            }
            None => None,
        };
        Ok(Prepared {
            prompts,
            batch,
            interventions,
            generation,
            saved_bytes,
        })
    }

    /// The prompts (as the report names them) and their batch, within the limits.
    pub(crate) fn batch(
        &self,
        model: &Model,
        limits: &Limits,
    ) -> Result<(Vec<String>, Batch), ApiError> {
        let count = self.prompts.len() + self.input_ids.len();
        if !(self.prompts.is_empty() || self.input_ids.is_empty()) || count == 0 {
            return Err(ApiError::bad_request(
                "give `prompts` (text) or `input_ids` (token ids), one of them",
            ));
        }
        if count > limits.prompts {
            return Err(ApiError::too_large(format!(
                "{count} prompts; this server takes at most {} a request",
                limits.prompts
            )));
        }
        let long = |tokens: usize| tokens > limits.prompt_tokens;
        if self.input_ids.iter().any(|ids| long(ids.len())) {
            return Err(ApiError::too_large(format!(
                "a prompt of `input_ids` is over {} tokens",
                limits.prompt_tokens
            )));
        }
        // A text's bytes bound its tokens from above for byte-level tokenizers; encode only
        // what could fit a generous bound, then count the tokens themselves.
        if self.prompts.iter().any(|text| long(text.len() / 16)) {
            return Err(ApiError::too_large(format!(
                "a prompt is far over {} tokens",
                limits.prompt_tokens
            )));
        }
        let (names, batch) = match self.input_ids.is_empty() {
            true => {
                let texts: Vec<&str> = self.prompts.iter().map(String::as_str).collect();
                (self.prompts.clone(), model.encode(&texts)?)
            }
            false => {
                let names = self
                    .input_ids
                    .iter()
                    .map(|ids| format!("{ids:?}"))
                    .collect();
                (names, model.batch(self.input_ids.clone())?)
            }
        };
        if long(batch.len()) {
            return Err(ApiError::too_large(format!(
                "a prompt is {} tokens; this server takes at most {}",
                batch.len(),
                limits.prompt_tokens
            )));
        }
        Ok((names, batch))
    }
}

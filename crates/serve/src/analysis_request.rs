//! The bodies of the analysis endpoints (`/v1/lens`, `/v1/attention`, `/v1/features`,
//! `/v1/dla`, `/v1/patch`): the CLI commands' options as JSON, on one prompt given as text
//! (`prompt`) or token ids (`input_ids`), checked against the server's limits before the model
//! is touched.

use hookscope::analysis::attention_sites;
use hookscope::schema::{CallDims, Site};
use hookscope::{Batch, Model};
use serde::Deserialize;

use crate::error::ApiError;
use crate::limits::Limits;
use crate::request::{MAX_TOP, RunRequest};

/// One prompt, as text or as token ids.
struct OnePrompt {
    prompt: Option<String>,
    input_ids: Option<Vec<u32>>,
}

impl OnePrompt {
    /// The prompt's batch of one row, within the limits.
    fn batch(&self, model: &Model, limits: &Limits) -> Result<Batch, ApiError> {
        let run = RunRequest {
            prompts: self.prompt.iter().cloned().collect(),
            input_ids: self.input_ids.iter().cloned().collect(),
            ..RunRequest::default()
        };
        Ok(run.batch(model, limits)?.1)
    }
}

/// Checks a `top_k` field: 1 to [`MAX_TOP`].
fn check_top_k(top_k: usize) -> Result<(), ApiError> {
    match (1..=MAX_TOP).contains(&top_k) {
        true => Ok(()),
        false => Err(ApiError::bad_request(format!(
            "`top_k` is {top_k}; 1 to {MAX_TOP}"
        ))),
    }
}

/// `POST /v1/lens`: the logit lens on one prompt.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LensRequest {
    /// The prompt as text.
    pub prompt: Option<String>,
    /// The prompt as token ids.
    pub input_ids: Option<Vec<u32>>,
    /// Tokens shown per layer and position.
    #[serde(default = "one")]
    pub top_k: usize,
}

fn one() -> usize {
    1
}

fn five() -> usize {
    5
}

impl LensRequest {
    /// The prompt's batch, `top_k` checked.
    pub fn batch(&self, model: &Model, limits: &Limits) -> Result<Batch, ApiError> {
        check_top_k(self.top_k)?;
        one_prompt(&self.prompt, &self.input_ids).batch(model, limits)
    }
}

fn one_prompt(prompt: &Option<String>, input_ids: &Option<Vec<u32>>) -> OnePrompt {
    OnePrompt {
        prompt: prompt.clone(),
        input_ids: input_ids.clone(),
    }
}

/// `POST /v1/attention`: the attention patterns of one prompt.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionRequest {
    /// The prompt as text.
    pub prompt: Option<String>,
    /// The prompt as token ids.
    pub input_ids: Option<Vec<u32>>,
    /// The layers to show (default: every softmax attention layer).
    pub layers: Option<Vec<usize>>,
}

impl AttentionRequest {
    /// The prompt's batch, refused when the patterns would hold more numbers than a JSON
    /// answer carries.
    pub fn batch(&self, model: &Model, limits: &Limits) -> Result<Batch, ApiError> {
        let batch = one_prompt(&self.prompt, &self.input_ids).batch(model, limits)?;
        let layout = model.layout();
        let sites = attention_sites(model, self.layers.as_deref())?;
        let dims = CallDims::at_step(1, batch.len(), 0);
        let mut numbers = 0usize;
        for site in sites {
            let shape = layout.shape(site, dims)?;
            let elements = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
            numbers = elements
                .and_then(|elements| numbers.checked_add(elements))
                .unwrap_or(usize::MAX);
        }
        if numbers > limits.json_values {
            return Err(ApiError::too_large(format!(
                "the patterns hold {numbers} numbers; an answer carries at most {}: ask fewer \
                 `layers` or a shorter prompt",
                limits.json_values
            )));
        }
        Ok(batch)
    }
}

/// `POST /v1/features`: the attached dictionaries' most active features on one prompt.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeaturesRequest {
    /// The prompt as text.
    pub prompt: Option<String>,
    /// The prompt as token ids.
    pub input_ids: Option<Vec<u32>>,
    /// Features shown per token.
    #[serde(default = "five")]
    pub top_k: usize,
}

impl FeaturesRequest {
    /// The prompt's batch, `top_k` checked.
    pub fn batch(&self, model: &Model, limits: &Limits) -> Result<Batch, ApiError> {
        check_top_k(self.top_k)?;
        one_prompt(&self.prompt, &self.input_ids).batch(model, limits)
    }
}

/// `POST /v1/dla`: direct logit attribution at one prompt's last position.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DlaRequest {
    /// The prompt as text.
    pub prompt: Option<String>,
    /// The prompt as token ids.
    pub input_ids: Option<Vec<u32>>,
    /// The token whose logit is decomposed: text (one token) or `#ID`.
    pub target: String,
    /// Decompose the target's logit minus this token's instead.
    pub vs: Option<String>,
}

impl DlaRequest {
    /// The prompt's batch.
    pub fn batch(&self, model: &Model, limits: &Limits) -> Result<Batch, ApiError> {
        one_prompt(&self.prompt, &self.input_ids).batch(model, limits)
    }
}

/// `POST /v1/patch`: the activation-patching sweep of `hookscope patch`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchRequest {
    /// The clean prompt.
    pub clean: String,
    /// The corrupt prompt (as many tokens).
    pub corrupt: String,
    /// The sites to patch: a pattern with a position axis, e.g. `layers.*.layer_output`.
    pub site: String,
    /// `logit-diff:A,B` or `prob:A`.
    pub metric: String,
}

impl PatchRequest {
    /// The clean and corrupt batches and the sites, refused when the sweep would run more
    /// rows than [`Limits::patch_rows`].
    pub fn prepare(
        &self,
        model: &Model,
        limits: &Limits,
    ) -> Result<(Batch, Batch, Vec<Site>), ApiError> {
        let text = |text: &String| OnePrompt {
            prompt: Some(text.clone()),
            input_ids: None,
        };
        let clean = text(&self.clean).batch(model, limits)?;
        let corrupt = text(&self.corrupt).batch(model, limits)?;
        let sites = model.layout().expand(&self.site)?;
        let rows = sites.len().saturating_mul(corrupt.len());
        if rows > limits.patch_rows {
            return Err(ApiError::too_large(format!(
                "the sweep patches {} sites at {} positions ({rows} runs); this server runs at \
                 most {} a request",
                sites.len(),
                corrupt.len(),
                limits.patch_rows
            )));
        }
        Ok((clean, corrupt, sites))
    }
}

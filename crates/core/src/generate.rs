//! Generation: one forward call for the prompt (step 0), then one per new token, with the
//! requested reads and writes applied at exactly the steps they name.

use crate::decoding::{GenerationConfig, TokenPicker, top_k};
use crate::error::{Error, Result};
use crate::hooks::{Interventions, Observer, Saved};
use crate::input::Batch;
use crate::model::{Feed, Model, Run};

/// The result of [`Model::generate`].
#[derive(Debug, Clone)]
pub struct Generation {
    /// Saved site values, by site and step.
    pub saved: Saved,
    /// `[B][prompt_len + new tokens]`: the (left-padded) prompts and the tokens generated.
    pub output_ids: Vec<Vec<u32>>,
    /// `[B][prompt_len + new tokens]`: false at left padding.
    pub attention_mask: Vec<Vec<bool>>,
    /// The padded prompt length.
    pub prompt_len: usize,
    /// Calls made (= tokens appended): fewer than `max_new_tokens` when every row hit EOS.
    pub steps: usize,
    /// `[B][step]`: the [`TOP_TOKENS_RECORDED`] most likely next tokens of each step's
    /// `next_token_probs` as `(id, probability)`, most likely first.
    pub top_next_tokens: Vec<Vec<Vec<(u32, f32)>>>,
}

/// How many of the most likely next tokens a generation records per step and row.
pub const TOP_TOKENS_RECORDED: usize = 5;

impl Generation {
    /// The tokens generated for row `row`.
    pub fn new_tokens(&self, row: usize) -> &[u32] {
        &self.output_ids[row][self.prompt_len..]
    }
}

/// Who watches a generation: an observer of every site served, and the check before each step.
struct Watch<'a, 'k> {
    observer: Option<&'a mut dyn Observer>,
    keep_going: &'k mut dyn FnMut(usize) -> bool,
}

impl Model {
    /// Generates up to `config.max_new_tokens` tokens after each prompt of `batch`.
    ///
    /// Step 0 is the prompt call (full logits `[B, prompt_len, V]`), each later step feeds the
    /// token the previous one chose. A read or write binds to exactly the steps it names; a
    /// write at step k reaches later steps only through the cache and the tokens it changes.
    /// A row that produces an EOS token is padded from then on; generation stops when every
    /// row has ended.
    pub fn generate(
        &self,
        batch: &Batch,
        interventions: &Interventions,
        config: &GenerationConfig,
    ) -> Result<Generation> {
        let watch = Watch {
            observer: None,
            keep_going: &mut |_| true,
        };
        self.run_generation(batch, interventions, config, watch)
    }

    /// Like [`Model::generate`], telling `observer` of every site each call serves, in order.
    pub fn generate_observed(
        &self,
        batch: &Batch,
        interventions: &Interventions,
        config: &GenerationConfig,
        observer: &mut dyn Observer,
    ) -> Result<Generation> {
        let watch = Watch {
            observer: Some(observer),
            keep_going: &mut |_| true,
        };
        self.run_generation(batch, interventions, config, watch)
    }

    /// Like [`Model::generate`], asking `keep_going(step)` before every call; a `false` ends
    /// the generation with [`Error::Interrupted`] (how a notebook's Ctrl-C stops a long run).
    pub fn generate_interruptible(
        &self,
        batch: &Batch,
        interventions: &Interventions,
        config: &GenerationConfig,
        keep_going: &mut dyn FnMut(usize) -> bool,
    ) -> Result<Generation> {
        let watch = Watch {
            observer: None,
            keep_going,
        };
        self.run_generation(batch, interventions, config, watch)
    }

    fn run_generation<'a>(
        &self,
        batch: &Batch,
        interventions: &'a Interventions,
        config: &GenerationConfig,
        watch: Watch<'a, '_>,
    ) -> Result<Generation> {
        let Watch {
            observer,
            keep_going,
        } = watch;
        config.validate()?;
        interventions.validate(self.layout())?;
        let vocab = self.layout().vocab;
        batch.validate(vocab)?;
        let prompt_len = batch.len();
        let longest = prompt_len
            .checked_add(config.max_new_tokens.saturating_sub(1))
            .ok_or_else(|| {
                Error::InvalidInput(format!(
                    "max_new_tokens {} is too large",
                    config.max_new_tokens
                ))
            })?;
        self.check_length(longest)?;
        if let Some(request) = interventions
            .requests()
            .iter()
            .find(|request| request.steps.first() >= config.max_new_tokens)
        {
            return Err(Error::StepsBeyondRun {
                site: request.site.to_string(),
                steps: request.steps.to_string(),
                run_steps: config.max_new_tokens,
            });
        }
        let mut ids = batch.ids.clone();
        let mut mask = batch.mask.clone();
        let mut ended = vec![false; batch.batch_size()];
        let mut picker = TokenPicker::new(&config.decoding);
        let mut top_next_tokens = vec![Vec::new(); batch.batch_size()];
        let mut run = Run {
            interventions,
            saved: Saved::default(),
            cache: self.network().new_cache(),
            observer,
            stop_early: false,
        };
        let mut steps = 0;
        while steps < config.max_new_tokens && !ended.iter().all(|e| *e) {
            if !keep_going(steps) {
                return Err(Error::Interrupted { step: steps });
            }
            let fed: Vec<Vec<u32>> = if steps == 0 || !config.use_cache {
                run.cache = self.network().new_cache();
                ids.clone()
            } else {
                ids.iter()
                    .map(|row| row[row.len() - 1..].to_vec())
                    .collect()
            };
            let feed = Feed {
                step: steps,
                ids: &fed,
                key_mask: &mask,
            };
            let (_, probs) = self.call(feed, &mut run)?;
            let probs = probs
                .to_data()
                .convert::<f32>()
                .try_into_vec::<f32>()
                .map_err(|e| Error::Backend(format!("{e:?}")))?;
            for (row, row_probs) in probs.chunks(vocab).enumerate() {
                let top = top_k(row_probs, TOP_TOKENS_RECORDED);
                top_next_tokens[row].push(top.into_iter().map(|(id, p)| (id as u32, p)).collect());
                let token = if ended[row] {
                    config.pad_token_id
                } else {
                    picker.pick(row_probs).map_err(|reason| {
                        Error::NonFinite(format!(
                            "step {steps}, row {row}: cannot pick a token from \
                             `next_token_probs`: {reason} (check the weights, the norm \
                             epsilons in config.json, and any write made at this step)"
                        ))
                    })?
                };
                ended[row] |= config.eos_token_ids.contains(&token);
                ids[row].push(token);
                mask[row].push(true);
            }
            steps += 1;
        }
        Ok(Generation {
            saved: run.saved,
            output_ids: ids,
            attention_mask: mask,
            prompt_len,
            steps,
            top_next_tokens,
        })
    }
}

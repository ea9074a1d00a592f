//! Running a model: [`Model::trace`] (one forward call) and [`Model::generate`] (one call per
//! token), both with one [`Run`] of options and the same engine: the checks before the first
//! call, the interruption check before each, and the engine's own sites around the adapter's
//! forward pass.

mod options;
mod outcome;

pub use options::Run;
pub use outcome::{Generation, TOP_TOKENS_RECORDED, Trace};

use burn::tensor::{Int, Tensor, TensorData};

use crate::cache::ModelCache;
use crate::call::Call;
use crate::decoding::{GenerationConfig, TokenPicker, top_k};
use crate::error::{Error, Result};
use crate::hooks::{Hooks, Interventions, ModelView, Observer, Saved};
use crate::input::Batch;
use crate::model::{Model, capped_logits};
use crate::schema::Site;

/// What one call feeds: its step, the newest tokens `[B][T]` and the whole context's
/// real-token mask `[B][S]`.
struct Feed<'a> {
    step: usize,
    ids: &'a [Vec<u32>],
    key_mask: &'a [Vec<bool>],
}

/// A call's `[B, T, V]` logits and `[B, V]` next-token distribution; `None` when it stopped
/// after its last requested site.
type Outputs = Option<(Tensor<3>, Tensor<2>)>;

/// A run in progress: the interruption check the caller's thread makes before each call, and
/// what the calls share.
struct Pass<'a> {
    interrupt: Option<&'a mut dyn FnMut(usize) -> bool>,
    state: RunState<'a>,
}

/// What every call of a run reads and fills: its requests, observer and stop, the values saved
/// so far and the carried state (`Send`: a call may move onto a worker thread).
struct RunState<'a> {
    interventions: &'a Interventions,
    observer: Option<&'a mut dyn Observer>,
    stop_after_last_request: bool,
    saved: Saved,
    cache: ModelCache,
}

impl Model {
    /// One forward call (step 0) over `batch`, making `run`'s reads and writes; interventions
    /// alone are a run (`model.trace(&batch, &requests)`).
    pub fn trace<'a>(&self, batch: &Batch, run: impl Into<Run<'a>>) -> Result<Trace> {
        let none = Interventions::new();
        let mut pass = self.start(batch, run.into(), &none)?;
        self.check_length(batch.len())?;
        let feed = Feed {
            step: 0,
            ids: &batch.ids,
            key_mask: &batch.mask,
        };
        let outputs = pass.call(self, feed)?;
        if let Some((logits, _)) = &outputs {
            let [batch_size, tokens, vocab] = logits.dims();
            check_finite_logits(
                &logits
                    .clone()
                    .slice_dim(1, tokens - 1..tokens)
                    .reshape([batch_size, vocab]),
            )?;
        }
        Ok(Trace {
            saved: pass.state.saved,
            batch: batch.clone(),
            outputs,
        })
    }

    /// Generates up to `config.max_new_tokens` tokens after each prompt of `batch`, making
    /// `run`'s reads and writes (interventions alone are a run).
    ///
    /// Step 0 is the prompt call (full logits `[B, prompt_len, V]`), each later step feeds the
    /// token the previous one chose (the whole sequence, from a fresh cache, where the model
    /// [recomputes](crate::CausalLm::recomputes) it). A read or write binds to exactly the steps it names; a
    /// write at step k reaches later steps only through the cache and the tokens it changes.
    /// A row that produces an EOS token is padded from then on; generation stops when every
    /// row has ended.
    pub fn generate<'a>(
        &self,
        batch: &Batch,
        run: impl Into<Run<'a>>,
        config: &GenerationConfig,
    ) -> Result<Generation> {
        let run = run.into();
        if run.stop_after_last_request {
            return Err(Error::RunOption {
                option: "Run::stop_after_last_request",
                reason: "a generation needs every step's next_token_probs to pick its token; \
                         stop early in a trace"
                    .into(),
            });
        }
        config.validate()?;
        if run.interventions.is_some_and(Interventions::has_gradients) {
            return Err(Error::RunOption {
                option: "a gradient request",
                reason: "gradients are kept on a prompt call: ask them of a trace".into(),
            });
        }
        let none = Interventions::new();
        let mut pass = self.start(batch, run, &none)?;
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
        if let Some(request) = pass
            .state
            .interventions
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
        let vocab = self.layout().vocab;
        let mut ids = batch.ids.clone();
        let mut mask = batch.mask.clone();
        let mut ended = vec![false; batch.batch_size()];
        let mut picker = TokenPicker::new(&config.decoding);
        let mut top_next_tokens = vec![Vec::new(); batch.batch_size()];
        let mut steps = 0;
        while steps < config.max_new_tokens && !ended.iter().all(|e| *e) {
            // Every row is as long as the others (ended rows are padded).
            let total = ids.first().map_or(0, Vec::len);
            let recompute = steps == 0
                || !config.use_cache
                || self.network().recomputes(total.saturating_sub(1), total);
            let fed: Vec<Vec<u32>> = if recompute {
                pass.state.cache = self.network().new_cache();
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
            let (_, probs) = pass.call(self, feed)?.ok_or(Error::NotComputed {
                value: "next_token_probs",
            })?;
            let probs = crate::host::f32_values(probs.into_data())?;
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
            saved: pass.state.saved,
            output_ids: ids,
            attention_mask: mask,
            prompt_len,
            steps,
            top_next_tokens,
        })
    }

    /// The checks every run makes before its first call (its requests fit the model, the batch
    /// its vocabulary), and the pass they start; `none` stands for the interventions of a run
    /// given none.
    fn start<'a: 'p, 'p>(
        &self,
        batch: &Batch,
        run: Run<'a>,
        none: &'p Interventions,
    ) -> Result<Pass<'p>> {
        let Run {
            interventions,
            observer,
            stop_after_last_request,
            interrupt,
        } = run;
        let interventions = interventions.unwrap_or(none);
        interventions.validate(self.layout())?;
        if interventions.has_gradients() && !self.device().is_autodiff() {
            return Err(Error::RunOption {
                option: "a gradient request",
                reason: "gradients need the model loaded on an autodiff device \
                         (`Model::load(&source, &device.autodiff())`; the CLI's `--grad` and \
                         Python's `grad=` load it so)"
                    .into(),
            });
        }
        batch.validate(self.layout().vocab)?;
        Ok(Pass {
            interrupt: interrupt.map(|check| -> &'p mut dyn FnMut(usize) -> bool { check }),
            state: RunState {
                interventions,
                observer: observer.map(|observer| -> &'p mut dyn Observer { observer }),
                stop_after_last_request,
                saved: Saved::default(),
                cache: self.network().new_cache(),
            },
        })
    }

    /// Refuses a run of `len` tokens longer than the model can position.
    fn check_length(&self, len: usize) -> Result<()> {
        match self.network().max_positions() {
            Some(max) if len > max => Err(Error::InvalidInput(format!(
                "sequence of {len} tokens exceeds the model's {max} positions"
            ))),
            _ => Ok(()),
        }
    }
}

impl Pass<'_> {
    /// One forward call of `model`, after the interruption check: its outputs, or `None` when
    /// the run stops after its last requested site. On the CPU backend the call runs on one of
    /// rayon's worker threads ([`crate::cpu::on_worker`]), where the kernels' parallel loops start
    /// at once; other backends keep the caller's thread (their streams are per thread).
    fn call(&mut self, model: &Model, feed: Feed<'_>) -> Result<Outputs> {
        if let Some(interrupted) = self.interrupt.as_deref_mut()
            && interrupted(feed.step)
        {
            return Err(Error::Interrupted { step: feed.step });
        }
        let state = &mut self.state;
        let outcome = match crate::device::is_cpu(model.device()) {
            true => crate::cpu::on_worker(|| state.call(model, feed)),
            false => state.call(model, feed),
        };
        // The stop signal ends here: no run returns it.
        match outcome {
            Ok(outputs) => Ok(Some(outputs)),
            Err(Error::StoppedEarly(_)) => Ok(None),
            Err(error) => Err(error),
        }
    }
}

impl RunState<'_> {
    /// [`Pass::call`]'s forward call, on the calling thread, serving the engine's model-level
    /// sites around the adapter's.
    fn call(&mut self, model: &Model, feed: Feed<'_>) -> Result<(Tensor<3>, Tensor<2>)> {
        let network = model.network();
        let layout = model.layout();
        // A reborrow for this call only (`as_deref_mut` would keep it for the whole run).
        let observer: Option<&mut dyn Observer> = match &mut self.observer {
            Some(observer) => Some(&mut **observer),
            None => None,
        };
        let view = ModelView {
            layout,
            dictionaries: model.dictionaries(),
        };
        let mut hooks = Hooks::for_call(
            view,
            self.interventions,
            feed.step,
            &mut self.saved,
            observer,
        );
        if self.stop_after_last_request {
            hooks.stop_after_last_request();
        }
        let batch = feed.ids.len();
        let tokens = feed.ids.first().map_or(0, Vec::len);
        let flat: Vec<i64> = feed.ids.iter().flatten().map(|id| i64::from(*id)).collect();
        let input_ids: Tensor<2, Int> =
            Tensor::from_data(TensorData::new(flat, [batch, tokens]), model.device());
        let written = hooks.writes(Site::InputIds);
        let input_ids = hooks.visit(Site::InputIds, input_ids)?;
        if written {
            check_ids(&input_ids, layout.vocab)?;
        }
        let mut call = Call::new(input_ids, feed.key_mask, &mut self.cache, hooks);
        let hidden = network.forward(&mut call)?;
        let head = network.output_head();
        let normed = call.visit(Site::FinalNormOutput, head.final_norm(hidden))?;
        let logits = call.visit(Site::Logits, capped_logits(head, normed))?;
        let [_, _, vocab] = logits.dims();
        let last: Tensor<2> = logits
            .clone()
            .slice_dim(1, tokens - 1..tokens)
            .reshape([batch, vocab]);
        let next_token_probs = call.visit(Site::NextTokenProbs, crate::nn::softmax_last(last))?;
        Ok((logits, next_token_probs))
    }
}

/// Refuses a trace's last-position logits holding NaN or `+inf`, or with no finite value in a
/// row: what broken weights, a negative norm epsilon or a corrupting write produce, which would
/// otherwise print meaningless tokens. `-inf` (a banned token) is allowed. (A generation step
/// needs no second pass: picking its token refuses a NaN in `next_token_probs`.)
fn check_finite_logits(last: &Tensor<2>) -> Result<()> {
    let [_, vocab] = last.dims();
    let values = crate::host::f32_values(last.to_data())?;
    for (row, logits) in values.chunks(vocab.max(1)).enumerate() {
        let bad = logits
            .iter()
            .position(|v| v.is_nan() || *v == f32::INFINITY)
            .map(|id| format!("{} at token id {id}", logits[id]))
            .or_else(|| {
                (!logits.iter().any(|v| v.is_finite())).then(|| "no finite value".to_string())
            });
        if let Some(bad) = bad {
            return Err(Error::NonFinite(format!(
                "row {row}: the logits at the last position hold {bad}; check the \
                 weights, the norm epsilons in config.json, and any write made at this step"
            )));
        }
    }
    Ok(())
}

/// Refuses token ids written to `input_ids` that fall outside the vocabulary, before they index
/// an embedding table (the batch's own ids were checked before the run).
fn check_ids(ids: &Tensor<2, Int>, vocab: usize) -> Result<()> {
    let [batch, tokens] = ids.dims();
    if batch * tokens == 0 {
        return Ok(());
    }
    let (min, max): (i64, i64) = (
        ids.clone().min().into_scalar(),
        ids.clone().max().into_scalar(),
    );
    if min < 0 || max >= vocab as i64 {
        let bad = if min < 0 { min } else { max };
        return Err(Error::InvalidInput(format!(
            "input_ids holds token id {bad}, outside the vocabulary (size {vocab})"
        )));
    }
    Ok(())
}

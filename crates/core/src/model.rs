//! The loaded [`Model`]: an adapter with its tokenizer and generation defaults, and the engine
//! around its forward pass (traces; generation is in `generate.rs`).

use std::path::PathBuf;

use burn::tensor::{Device, Int, Tensor, TensorData};

use crate::adapter::{Architecture, CausalLm};
use crate::cache::ModelCache;
use crate::call::Call;
use crate::checkpoint::auto_dtype;
use crate::config::{ArchConfig, parse_json};
use crate::decoding::GenerationConfig;
use crate::device::is_cpu;
use crate::error::{Error, Result};
use crate::hooks::{Hooks, Interventions, Observer, Saved};
use crate::input::Batch;
use crate::precision::{MatmulPrecision, WeightDtype};
use crate::registry;
use crate::schema::{ModelLayout, Site};
use crate::source::ModelSource;
use crate::tokenizer::Tokenizer;
use crate::weights::{LoadReport, WeightLoader};

/// The result of one forward trace.
#[derive(Debug, Clone)]
pub struct Trace {
    /// Saved site values (step 0).
    pub saved: Saved,
    /// `[B, T, V]` logits (after any write to `logits`).
    pub logits: Tensor<3>,
    /// `[B, V]` softmax of the last position's logits.
    pub next_token_probs: Tensor<2>,
    /// The batch that was run.
    pub batch: Batch,
}

/// What one call feeds: its step, the newest tokens `[B][T]` and the whole context's
/// real-token mask `[B][S]`.
pub(crate) struct Feed<'a> {
    pub(crate) step: usize,
    pub(crate) ids: &'a [Vec<u32>],
    pub(crate) key_mask: &'a [Vec<bool>],
}

/// What a trace or generation carries from call to call: the requests, the values saved so far,
/// the carried state, and an observer if one watches.
pub(crate) struct Run<'a> {
    pub(crate) interventions: &'a Interventions,
    pub(crate) saved: Saved,
    pub(crate) cache: ModelCache,
    pub(crate) observer: Option<&'a mut dyn Observer>,
    /// End each call right after the last site a request touches (no logits): [`Model::read`].
    pub(crate) stop_early: bool,
}

/// A loaded model: an adapter, its tokenizer and generation defaults, on a device.
pub struct Model {
    arch: &'static Architecture,
    network: Box<dyn CausalLm>,
    tokenizer: Option<Tokenizer>,
    generation: GenerationConfig,
    device: Device,
    load_report: LoadReport,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("arch", &self.arch.name)
            .field("layout", self.network.layout())
            .finish()
    }
}

/// How to load a model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// The precision weights are stored in; `None` is `auto`, as in transformers: the config's
    /// `dtype` (or `torch_dtype`), else the checkpoint's own. Products accumulate in f32 and
    /// sites are served in f32 whatever the storage.
    pub dtype: Option<WeightDtype>,
    /// The precision activations meet the weight matrices in: f32 (the default, exact
    /// products of the stored weights), or bf16 with bf16 weights on the CPU backend (see
    /// [`MatmulPrecision`]).
    pub matmul_precision: MatmulPrecision,
}

/// Refuses a matmul precision the load cannot honour: bf16 products need bf16 weights (a
/// product of two bf16 values) and the CPU kernels.
fn check_matmul_precision(
    precision: MatmulPrecision,
    dtype: WeightDtype,
    device: &Device,
) -> Result<()> {
    let reason = match precision {
        MatmulPrecision::F32 => return Ok(()),
        MatmulPrecision::Bf16 if dtype != WeightDtype::Bf16 => format!(
            "bf16 products need weights stored in bf16, and this load stores them in {dtype} \
             (add --dtype bf16)"
        ),
        MatmulPrecision::Bf16 if !is_cpu(device) => {
            "bf16 products run on the CPU backend only; other devices multiply in f32".to_string()
        }
        MatmulPrecision::Bf16 => return Ok(()),
    };
    Err(Error::LoadOption {
        option: "matmul precision",
        value: precision.to_string(),
        reason,
    })
}

impl Model {
    /// Loads a model with the default [`LoadOptions`] (weights in the checkpoint's precision).
    pub fn load(source: &ModelSource, device: &Device) -> Result<Model> {
        Model::load_with(source, device, LoadOptions::default())
    }

    /// Loads a model: picks the adapter from `config.json`, loads weights (reporting every
    /// missing or misshapen one) in the chosen precision, the tokenizer and generation
    /// defaults. Refuses before reading any weight when they would not fit in the memory
    /// available.
    pub fn load_with(source: &ModelSource, device: &Device, options: LoadOptions) -> Result<Model> {
        let config = source.config()?;
        let arch = registry::find(&config)?;
        let checkpoint = source.checkpoint()?;
        let dtype = options
            .dtype
            .unwrap_or_else(|| auto_dtype(&config.json, Some(&checkpoint)));
        crate::memory::ensure_fits(
            || format!("loading {} in {dtype}", source.origin().display()),
            checkpoint.bytes_as(dtype),
            match dtype {
                WeightDtype::F32 => "; a half-precision load (--dtype bf16) needs half as much",
                _ => "",
            },
        )?;
        check_matmul_precision(options.matmul_precision, dtype, device)?;
        let mut loader = WeightLoader::new(&checkpoint, device)
            .with_dtype(dtype)
            .with_matmul_precision(options.matmul_precision);
        let network = (arch.load)(&config, &mut loader)?;
        let mut load_report = loader.finish()?;
        let tokenizer = source.tokenizer()?;
        let vocab = network.layout().vocab;
        if let Some(known) = tokenizer.as_ref().map(Tokenizer::vocab_size)
            && known < vocab
        {
            load_report.notes.push(format!(
                "tokenizer.json knows {known} tokens but the model's vocabulary has {vocab}: ids \
                 {known}..{vocab} have no text and decode to nothing"
            ));
        }
        let generation_path = source.origin().join("generation_config.json");
        let generation_json = source.generation_config()?;
        let generation = GenerationConfig::from_json(
            generation_json
                .as_ref()
                .map(|json| (generation_path.as_path(), json)),
            (&config.path, &config.json),
        )?;
        Ok(Model {
            arch,
            network,
            tokenizer,
            generation,
            device: device.clone(),
            load_report,
        })
    }

    /// A model of `arch` built from its tiny config with seeded random weights: what the
    /// conformance suite checks, with no checkpoint or tokenizer.
    pub fn random(arch: &'static Architecture, seed: u64, device: &Device) -> Result<Model> {
        let path = PathBuf::from(format!("<tiny:{}>/config.json", arch.name));
        let config = ArchConfig {
            json: parse_json(&path, arch.tiny_config)?,
            path,
        };
        Model::random_with(arch, &config, seed, device)
    }

    /// A model of whatever registered architecture serves `config_json` (a `config.json`'s
    /// text), with seeded random weights: a real checkpoint's shapes without its weights.
    pub fn random_from_config(config_json: &str, seed: u64, device: &Device) -> Result<Model> {
        let path = PathBuf::from("<given>/config.json");
        let config = ArchConfig {
            json: parse_json(&path, config_json)?,
            path,
        };
        Model::random_with(registry::find(&config)?, &config, seed, device)
    }

    fn random_with(
        arch: &'static Architecture,
        config: &ArchConfig,
        seed: u64,
        device: &Device,
    ) -> Result<Model> {
        let mut loader = WeightLoader::random(seed, device);
        let network = (arch.load)(config, &mut loader)?;
        Ok(Model {
            arch,
            network,
            tokenizer: None,
            generation: GenerationConfig::from_json(None, (&config.path, &config.json))?,
            device: device.clone(),
            load_report: loader.finish()?,
        })
    }

    /// The adapter serving this model.
    pub fn architecture(&self) -> &'static Architecture {
        self.arch
    }

    /// The declared structure.
    pub fn layout(&self) -> &ModelLayout {
        self.network.layout()
    }

    /// The tokenizer, if the checkpoint has one.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// What loading did with the checkpoint's weights.
    pub fn load_report(&self) -> &LoadReport {
        &self.load_report
    }

    /// Bytes of weights held on the device, as stored: what a decode step streams from memory.
    pub fn weight_bytes(&self) -> usize {
        self.load_report.weight_bytes
    }

    /// The precision the weight matrices are stored in.
    pub fn dtype(&self) -> WeightDtype {
        self.load_report.dtype
    }

    /// The checkpoint's decoding defaults (`generation_config.json`), to copy and override.
    pub fn generation_config(&self) -> &GenerationConfig {
        &self.generation
    }

    /// The adapter's forward pass.
    pub(crate) fn network(&self) -> &dyn CausalLm {
        self.network.as_ref()
    }

    /// The device the model runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Tokenizes prompts into a left-padded batch.
    pub fn encode(&self, prompts: &[&str]) -> Result<Batch> {
        let tokenizer = self
            .tokenizer
            .as_ref()
            .ok_or_else(|| Error::Tokenize("this model has no tokenizer.json".into()))?;
        let ids = prompts
            .iter()
            .map(|prompt| tokenizer.encode(prompt))
            .collect::<Result<Vec<_>>>()?;
        self.batch(ids)
    }

    /// Left-pads token id prompts into a batch with the model's pad (or EOS) id.
    pub fn batch(&self, prompts: Vec<Vec<u32>>) -> Result<Batch> {
        let batch = Batch::left_padded(prompts, self.generation.pad_token_id)?;
        batch.validate(self.layout().vocab)?;
        Ok(batch)
    }

    /// Runs one forward call over `batch` with `interventions` at step 0.
    pub fn trace(&self, batch: &Batch, interventions: &Interventions) -> Result<Trace> {
        self.run_trace(batch, interventions, None)
    }

    /// Like [`Model::trace`], telling `observer` of every site served, in order.
    pub fn trace_observed(
        &self,
        batch: &Batch,
        interventions: &Interventions,
        observer: &mut dyn Observer,
    ) -> Result<Trace> {
        self.run_trace(batch, interventions, Some(observer))
    }

    fn run_trace<'a>(
        &self,
        batch: &Batch,
        interventions: &'a Interventions,
        observer: Option<&'a mut dyn Observer>,
    ) -> Result<Trace> {
        let (outcome, saved) = self.prompt_call(batch, interventions, observer, false)?;
        let (logits, next_token_probs) = outcome?;
        let [batch_size, tokens, vocab] = logits.dims();
        check_finite_logits(
            &logits
                .clone()
                .slice_dim(1, tokens - 1..tokens)
                .reshape([batch_size, vocab]),
        )?;
        Ok(Trace {
            saved,
            logits,
            next_token_probs,
            batch: batch.clone(),
        })
    }

    /// A residual stream `[B, T, H]` through the model's final norm and language-model head,
    /// `[B, T, V]` logits: what the forward pass applies after the last layer.
    pub fn unembed(&self, hidden: Tensor<3>) -> Tensor<3> {
        self.network.unembed(hidden)
    }

    /// Runs the prompt call over `batch` only as far as the last site `interventions` read or
    /// write, and returns what they saved: the layers after it and the language-model head are
    /// never computed (what dataset extraction needs; nnsight's `tracer.stop()`).
    pub fn read(&self, batch: &Batch, interventions: &Interventions) -> Result<Saved> {
        let (outcome, saved) = self.prompt_call(batch, interventions, None, true)?;
        match outcome {
            Ok(_) | Err(Error::StoppedEarly) => Ok(saved),
            Err(error) => Err(error),
        }
    }

    /// The prompt call (step 0) over `batch`, after the checks every entry point makes: the
    /// call's outcome (logits and next-token probabilities) and the values it saved.
    fn prompt_call<'a>(
        &self,
        batch: &Batch,
        interventions: &'a Interventions,
        observer: Option<&'a mut dyn Observer>,
        stop_early: bool,
    ) -> Result<(Result<(Tensor<3>, Tensor<2>)>, Saved)> {
        interventions.validate(self.layout())?;
        batch.validate(self.layout().vocab)?;
        self.check_length(batch.len())?;
        let mut run = Run {
            interventions,
            saved: Saved::default(),
            cache: self.network.new_cache(),
            observer,
            stop_early,
        };
        let feed = Feed {
            step: 0,
            ids: &batch.ids,
            key_mask: &batch.mask,
        };
        let outcome = self.call(feed, &mut run);
        Ok((outcome, run.saved))
    }

    pub(crate) fn check_length(&self, len: usize) -> Result<()> {
        match self.network.max_positions() {
            Some(max) if len > max => Err(Error::InvalidInput(format!(
                "sequence of {len} tokens exceeds the model's {max} positions"
            ))),
            _ => Ok(()),
        }
    }

    /// One forward call, serving the engine's model-level sites around the adapter's. On the CPU
    /// backend it runs on one of rayon's worker threads ([`crate::cpu::on_worker`]), where the
    /// kernels' parallel loops start at once; other backends keep the caller's thread (their
    /// streams are per thread).
    pub(crate) fn call(&self, feed: Feed<'_>, run: &mut Run<'_>) -> Result<(Tensor<3>, Tensor<2>)> {
        match is_cpu(&self.device) {
            true => crate::cpu::on_worker(|| self.call_here(feed, run)),
            false => self.call_here(feed, run),
        }
    }

    /// [`Model::call`], on the calling thread.
    fn call_here(&self, feed: Feed<'_>, run: &mut Run<'_>) -> Result<(Tensor<3>, Tensor<2>)> {
        let layout = self.network.layout();
        let observer: Option<&mut dyn Observer> = match &mut run.observer {
            Some(observer) => Some(&mut **observer),
            None => None,
        };
        let mut hooks = Hooks::for_call(
            layout,
            run.interventions,
            feed.step,
            &mut run.saved,
            observer,
        );
        if run.stop_early {
            hooks.stop_after_last_request();
        }
        let batch = feed.ids.len();
        let tokens = feed.ids.first().map_or(0, Vec::len);
        let flat: Vec<i64> = feed.ids.iter().flatten().map(|id| i64::from(*id)).collect();
        let input_ids: Tensor<2, Int> =
            Tensor::from_data(TensorData::new(flat, [batch, tokens]), &self.device);
        let written = hooks.writes(Site::InputIds);
        let input_ids = hooks.visit(Site::InputIds, input_ids)?;
        if written {
            check_ids(&input_ids, layout.vocab)?;
        }
        let mut call = Call::new(input_ids, feed.key_mask, &mut run.cache, hooks);
        let logits = self.network.forward(&mut call)?;
        let logits = call.visit(Site::Logits, logits)?;
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
    let values = last
        .to_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| Error::Backend(format!("{e:?}")))?;
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

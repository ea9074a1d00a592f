//! The adapter trait every architecture implements, and the loaded [`Model`] that runs traces.

use burn::tensor::{Device, Int, Tensor, TensorData, activation};

use crate::cache::ModelCache;
use crate::decoding::GenerationConfig;
use crate::error::{Error, Result};
use crate::hooks::{Hooks, Interventions, Saved};
use crate::input::{Batch, CallInput, call_masks};
use std::path::PathBuf;

use crate::loading::{ArchConfig, LoadReport, ModelSource, WeightLoader};
use crate::registry::{self, Architecture};
use crate::schema::{ModelLayout, Site};
use crate::tokenizer::Tokenizer;

/// An architecture's forward pass. Implementations serve every site they declare through
/// [`Hooks::visit`], in contract order, from `token_embeddings` to the last `layer_output`;
/// `input_ids`, `logits` and `next_token_probs` are served by the engine around them.
pub trait CausalLm {
    /// The declared structure: sizes and the mixer of each layer.
    fn layout(&self) -> &ModelLayout;

    /// The longest sequence the model can position, if it has a limit (none by default).
    fn max_positions(&self) -> Option<usize> {
        None
    }

    /// Empty carried state for a new batch: by default, derived from the declared layout.
    fn new_cache(&self) -> ModelCache {
        ModelCache::for_layout(self.layout())
    }

    /// One call: the final hidden states through the language-model head, `[B, T, V]`.
    fn forward(
        &self,
        input: &CallInput,
        cache: &mut ModelCache,
        hooks: &mut Hooks<'_>,
    ) -> Result<Tensor<3>>;
}

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
    /// The sites served, in order, when the trace recorded them.
    pub order: Vec<Site>,
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

impl Model {
    /// Loads a model: picks the adapter from `config.json`, loads weights (reporting every
    /// missing or misshapen one), the tokenizer and generation defaults.
    pub fn load(source: &ModelSource, device: &Device) -> Result<Model> {
        let config = source.config()?;
        let arch = registry::find(&config)?;
        let checkpoint = source.checkpoint()?;
        let mut loader = WeightLoader::new(&checkpoint, device);
        let network = (arch.load)(&config, &mut loader)?;
        let load_report = loader.finish()?;
        let generation =
            GenerationConfig::from_json(source.generation_config()?.as_ref(), &config.json);
        Ok(Model {
            arch,
            network,
            tokenizer: source.tokenizer()?,
            generation,
            device: device.clone(),
            load_report,
        })
    }

    /// A model of `arch` built from its tiny config with seeded random weights: what the
    /// conformance suite checks, with no checkpoint or tokenizer.
    pub fn random(arch: &'static Architecture, seed: u64, device: &Device) -> Result<Model> {
        let path = PathBuf::from(format!("<tiny:{}>/config.json", arch.name));
        let json = serde_json::from_str(arch.tiny_config).map_err(|source| Error::Json {
            path: path.clone(),
            source,
        })?;
        let config = ArchConfig { path, json };
        let mut loader = WeightLoader::random(seed, device);
        let network = (arch.load)(&config, &mut loader)?;
        Ok(Model {
            arch,
            network,
            tokenizer: None,
            generation: GenerationConfig::from_json(None, &config.json),
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

    /// Bytes of weights held on the device (f32): what a decode step streams from memory.
    pub fn weight_bytes(&self) -> usize {
        self.load_report.parameters * std::mem::size_of::<f32>()
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
        let vocab = self.layout().vocab;
        if let Some(bad) = prompts.iter().flatten().find(|id| **id as usize >= vocab) {
            return Err(Error::InvalidInput(format!(
                "token id {bad} is outside the vocabulary (size {vocab})"
            )));
        }
        Batch::left_padded(prompts, self.generation.pad_token_id)
    }

    /// Runs one forward call over `batch` with `interventions` at step 0.
    pub fn trace(&self, batch: &Batch, interventions: &Interventions) -> Result<Trace> {
        self.run_trace(batch, interventions, false)
    }

    /// Like [`Model::trace`], also recording every site served, in order (for conformance).
    pub fn trace_recording_order(
        &self,
        batch: &Batch,
        interventions: &Interventions,
    ) -> Result<Trace> {
        self.run_trace(batch, interventions, true)
    }

    fn run_trace(
        &self,
        batch: &Batch,
        interventions: &Interventions,
        record: bool,
    ) -> Result<Trace> {
        interventions.validate(self.layout())?;
        batch.validate()?;
        self.check_length(batch.len())?;
        let mut cache = self.network.new_cache();
        let mut saved = Saved::default();
        let mut order = Vec::new();
        let (logits, next_token_probs) = self.call(
            0,
            &batch.ids,
            &batch.mask,
            &mut cache,
            interventions,
            &mut saved,
            record.then_some(&mut order),
        )?;
        Ok(Trace {
            saved,
            logits,
            next_token_probs,
            batch: batch.clone(),
            order,
        })
    }

    pub(crate) fn check_length(&self, len: usize) -> Result<()> {
        match self.network.max_positions() {
            Some(max) if len > max => Err(Error::InvalidInput(format!(
                "sequence of {len} tokens exceeds the model's {max} positions"
            ))),
            _ => Ok(()),
        }
    }

    /// One forward call feeding `ids` (`[B][T]`, the newest tokens) with `key_mask` (`[B][S]`,
    /// the whole context's real-token mask), serving the engine's model-level sites around the
    /// adapter's.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn call(
        &self,
        step: usize,
        ids: &[Vec<u32>],
        key_mask: &[Vec<bool>],
        cache: &mut ModelCache,
        interventions: &Interventions,
        saved: &mut Saved,
        order: Option<&mut Vec<Site>>,
    ) -> Result<(Tensor<3>, Tensor<2>)> {
        let layout = self.network.layout();
        let mut hooks = Hooks::for_call(layout, interventions, step, saved, order);
        let batch = ids.len();
        let tokens = ids.first().map_or(0, Vec::len);
        let flat: Vec<i64> = ids.iter().flatten().map(|id| i64::from(*id)).collect();
        let input_ids: Tensor<2, Int> =
            Tensor::from_data(TensorData::new(flat, [batch, tokens]), &self.device);
        let input_ids = hooks.visit(Site::InputIds, input_ids)?;
        check_ids(&input_ids, layout.vocab)?;
        let (position_ids, attention_mask, token_mask) = call_masks(key_mask, tokens, &self.device);
        let input = CallInput {
            input_ids,
            position_ids,
            attention_mask,
            token_mask,
        };
        let logits = self.network.forward(&input, cache, &mut hooks)?;
        let logits = hooks.visit(Site::Logits, logits)?;
        let [_, _, vocab] = logits.dims();
        let last: Tensor<2> = logits
            .clone()
            .slice_dim(1, tokens - 1..tokens)
            .reshape([batch, vocab]);
        let next_token_probs = hooks.visit(Site::NextTokenProbs, activation::softmax(last, 1))?;
        Ok((logits, next_token_probs))
    }
}

/// Refuses token ids outside the vocabulary (e.g. written to `input_ids`) before they index an
/// embedding table.
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

//! The loaded [`Model`]: an adapter with its tokenizer and generation defaults, how it loads and
//! what it is. Running it (traces and generation) is in `run/`.

use std::path::PathBuf;
use std::sync::Arc;

use burn::tensor::{Device, Tensor};

use crate::adapter::{Architecture, CausalLm, OutputHead};
use crate::checkpoint::auto_dtype;
use crate::config::{ArchConfig, parse_json};
use crate::decoding::GenerationConfig;
use crate::device::is_cpu;
use crate::dictionary::{AttachOptions, Dictionary, Placed};
use crate::error::{Error, Result};
use crate::hooks::Attachment;
use crate::input::Batch;
use crate::precision::{MatmulPrecision, WeightDtype};
use crate::registry;
use crate::schema::{ModelLayout, Site};
use crate::source::ModelSource;
use crate::tokenizer::Tokenizer;
use crate::weights::{LoadReport, WeightLoader};

/// A loaded model: an adapter, its tokenizer and generation defaults, on a device.
///
/// A clone shares the weights (and the attached dictionaries): attaching a dictionary to a clone
/// leaves the original as it was.
#[derive(Clone)]
pub struct Model {
    arch: &'static Architecture,
    network: Arc<dyn CausalLm>,
    /// The adapter's layout, with the attached dictionaries' placements.
    layout: ModelLayout,
    /// The attached dictionaries, in the order of `layout.dictionaries`.
    dictionaries: Vec<Attachment>,
    tokenizer: Option<Tokenizer>,
    generation: GenerationConfig,
    device: Device,
    load_report: LoadReport,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("arch", &self.arch.name)
            .field("layout", &self.layout)
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
        crate::cpu::check_kernel_choice().map_err(Error::InvalidInput)?;
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
        let network: Arc<dyn CausalLm> = (arch.load)(&config, &mut loader)?.into();
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
            layout: network.layout().clone(),
            dictionaries: Vec::new(),
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
        crate::cpu::check_kernel_choice().map_err(Error::InvalidInput)?;
        let mut loader = WeightLoader::random(seed, device);
        let network: Arc<dyn CausalLm> = (arch.load)(config, &mut loader)?.into();
        Ok(Model {
            arch,
            layout: network.layout().clone(),
            dictionaries: Vec::new(),
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

    /// The declared structure, with the placements of any attached dictionaries.
    pub fn layout(&self) -> &ModelLayout {
        &self.layout
    }

    /// The attached dictionaries, in the order of [`ModelLayout::dictionaries`].
    pub fn dictionaries(&self) -> &[Attachment] {
        &self.dictionaries
    }

    /// Attaches `dictionary` at a site (see [`AttachOptions`]), replacing any dictionary
    /// attached there, and returns the site. Its values are then sites of this model
    /// (`SITE.sae.features`, ...). Refused, naming the site and the sizes, where the site is
    /// not one a dictionary can read (`[B, T, ...]` layer sites), a transcoder's input does not
    /// come before its output, or the widths differ.
    pub fn attach(&mut self, dictionary: Dictionary, options: AttachOptions) -> Result<Site> {
        let network = self.network.as_ref();
        let Placed {
            placement,
            input_norm,
        } = crate::dictionary::place(&self.layout, network, &dictionary, &options)?;
        let dictionary = dictionary.reading_normalised(input_norm);
        self.detach(placement.site);
        self.layout.dictionaries.push(placement);
        self.dictionaries.push(Attachment {
            dictionary: Arc::new(dictionary),
            error_term: !options.without_error,
        });
        Ok(placement.site)
    }

    /// Attaches every dictionary of a set ([`Dictionary::load_all`]) where its own config
    /// says, with `options`' splicing; returns their sites. A site named in `options` is for
    /// one dictionary alone: with more it is refused.
    pub fn attach_all(
        &mut self,
        dictionaries: Vec<Dictionary>,
        options: AttachOptions,
    ) -> Result<Vec<Site>> {
        if dictionaries.len() > 1 && (options.site.is_some() || options.input.is_some()) {
            let path = dictionaries[0].config().path.clone();
            return Err(Error::Dictionary {
                path,
                message: format!(
                    "is one of a set of {} dictionaries, each attached where its config says; \
                     a site can be named for one alone",
                    dictionaries.len()
                ),
            });
        }
        dictionaries
            .into_iter()
            .map(|dictionary| self.attach(dictionary, options.clone()))
            .collect()
    }

    /// Removes the dictionary attached at `site`, if any; whether there was one.
    pub fn detach(&mut self, site: Site) -> bool {
        let Some((place, _)) = self.layout.dictionary_at(site) else {
            return false;
        };
        self.layout.dictionaries.remove(place);
        self.dictionaries.remove(place);
        true
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

    /// What turns the last residual stream into logits: the final norm, the language-model
    /// head and any final soft-cap.
    pub fn output_head(&self) -> &dyn OutputHead {
        self.network.output_head()
    }

    /// A residual stream `[B, T, H]` through the model's final norm and language-model head,
    /// `[B, T, V]` logits: what the forward pass applies after the last layer.
    pub fn unembed(&self, hidden: Tensor<3>) -> Tensor<3> {
        let head = self.output_head();
        capped_logits(head, head.final_norm(hidden))
    }
}

/// The final norm's output through `head` and any final soft-cap: the logits.
pub(crate) fn capped_logits(head: &dyn OutputHead, normed: Tensor<3>) -> Tensor<3> {
    let logits = head.head(normed);
    match head.logit_softcap() {
        Some(cap) => crate::nn::soft_cap(logits, cap),
        None => logits,
    }
}

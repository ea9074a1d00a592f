//! Feature dictionaries: sparse autoencoders (Bricken et al. 2023, "Towards Monosemanticity";
//! TopK: Gao et al. 2024; JumpReLU: Rajamanoharan et al. 2024; gated: Rajamanoharan et al.
//! 2024) and transcoders (Dunefsky et al. 2024), loaded from the formats researchers download
//! and run exactly as SAELens runs them.
//!
//! A dictionary attached to a site ([`crate::Model::attach`]) serves three sites named under it,
//! `SITE.sae.features` `[B, T, F]`, `SITE.sae.reconstruction` and `SITE.sae.error`, which read
//! and write like any other site. With nothing written the model runs unchanged (the value that
//! flows on is the site's own, as SAELens' `use_error_term=True`); an edit of the features flows
//! on as the edited reconstruction plus the unedited error.

mod circuit_tracer;
mod config;
mod hook_names;
mod npz;
mod placement;

use std::path::{Path, PathBuf};

use burn::tensor::{Device, IndexingUpdateOp, Tensor};

pub use config::{Activation, DictionaryConfig, Normalization};
pub use hook_names::{HookSite, site_of_hook};
pub(crate) use placement::{Placed, place};

use crate::adapter::PlainNorm;
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::hooks::{Encoding, FeatureDictionary};
use crate::nn::Linear;
use crate::precision::WeightDtype;
use crate::weights::WeightLoader;

/// The layer-norm epsilon SAELens adds to the standard deviation.
const LAYER_NORM_EPS: f32 = 1e-5;

/// How a format names and lays out its tensors.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TensorNames {
    /// `W_enc` is stored `[F, d_in]` (torch's `[out, in]`, circuit-tracer) instead of
    /// `[d_in, F]` (SAELens, Gemma Scope).
    encoder_out_in: bool,
    /// The JumpReLU thresholds' key.
    threshold: &'static str,
}

/// SAELens' names, which Gemma Scope's `params.npz` shares.
const SAE_LENS: TensorNames = TensorNames {
    encoder_out_in: false,
    threshold: "threshold",
};

/// Resolves a hub file reference (`hf://owner/repo/path?revision=R`) a dictionary's config
/// names to a local file.
pub type HubFiles<'a> = &'a dyn Fn(&str) -> Result<PathBuf>;

/// A loaded feature dictionary.
#[derive(Debug, Clone)]
pub struct Dictionary {
    config: DictionaryConfig,
    /// `x -> pre-activations` (`W_enc`, `b_enc`), with `b_dec`'s subtraction and TopK's
    /// decoder-norm scaling folded in; the gate path of a gated dictionary.
    encoder: Linear,
    /// A gated dictionary's magnitude path (`W_enc * exp(r_mag)`, `b_mag`).
    magnitude: Option<Linear>,
    /// JumpReLU thresholds `[F]`.
    threshold: Option<Tensor<1>>,
    /// `features -> output` (`W_dec`, `b_dec`), divided by the decoder norms where TopK scaled
    /// by them.
    decoder: Linear,
    /// A transcoder's skip connection (`x W_skipᵀ`).
    skip: Option<Linear>,
    /// The norm applied to the site's value before anything else, where the dictionary reads
    /// a normalised value the model does not hold (`ln2.hook_normalized`); set on attaching.
    input_norm: Option<PlainNorm>,
}

impl Dictionary {
    /// Loads the one dictionary at `path`: a SAELens folder (`cfg.json` and
    /// `sae_weights.safetensors`), a Gemma Scope folder (`params.npz`) or `.npz` file, or one
    /// layer's file of a circuit-tracer transcoder set (a file in the folder of its
    /// `config.yaml` or one below it, e.g. `layer_3.safetensors` or `layer_3/params.npz`). A
    /// whole set is refused here: [`Dictionary::load_all`] loads it.
    pub fn load(path: &Path, device: &Device) -> Result<Dictionary> {
        let mut all = Dictionary::load_all(path, device)?;
        match all.len() {
            1 => Ok(all.remove(0)),
            n => Err(Error::Dictionary {
                path: path.to_path_buf(),
                message: format!(
                    "holds a set of {n} transcoders, one per layer: load it with \
                     `Dictionary::load_all` (the CLI's `--sae` and Python's `sae=` attach them \
                     all), or name one layer's file"
                ),
            }),
        }
    }

    /// Loads every dictionary at `path`: one for the formats [`Dictionary::load`] reads, one
    /// per layer for a circuit-tracer transcoder set (a folder holding `config.yaml`, or that
    /// file). Files its config names as `hf://` references are refused; see
    /// [`Dictionary::load_all_with`].
    pub fn load_all(path: &Path, device: &Device) -> Result<Vec<Dictionary>> {
        let local_only = |uri: &str| -> Result<PathBuf> {
            Err(Error::Dictionary {
                path: path.to_path_buf(),
                message: format!(
                    "names the hub file `{uri}`; load it through \
                     `ModelSource::load_dictionaries`, which fetches hub files"
                ),
            })
        };
        Dictionary::load_all_with(path, device, &local_only)
    }

    /// [`Dictionary::load_all`], resolving the `hf://` references of a transcoder set's
    /// config with `hub`.
    pub fn load_all_with(
        path: &Path,
        device: &Device,
        hub: HubFiles<'_>,
    ) -> Result<Vec<Dictionary>> {
        let error = |message: String| Error::Dictionary {
            path: path.to_path_buf(),
            message,
        };
        if path.is_file() {
            if let Some(config) = circuit_tracer::set_holding(path) {
                return Ok(vec![circuit_tracer::load_layer_file(
                    &config, path, device,
                )?]);
            }
            return match path.extension().and_then(|e| e.to_str()) {
                Some("npz") => Ok(vec![npz::load(path, device)?]),
                Some("yaml" | "yml") => circuit_tracer::load_set(path, device, hub),
                _ => Err(error(
                    "expected a folder (SAELens' cfg.json and sae_weights.safetensors, Gemma \
                     Scope's params.npz, or a circuit-tracer config.yaml), a .npz file, or a \
                     layer's file of a circuit-tracer set"
                        .into(),
                )),
            };
        }
        if !path.is_dir() {
            return Err(error("no such file or folder".into()));
        }
        let cfg = path.join("cfg.json");
        if cfg.is_file() {
            let config = DictionaryConfig::from_sae_lens(&cfg)?;
            let weights = path.join("sae_weights.safetensors");
            if !weights.is_file() {
                return Err(error(format!(
                    "{} is missing (cfg.json is SAELens' layout)",
                    weights.display()
                )));
            }
            let checkpoint = Checkpoint::open_file(&weights)?;
            return Ok(vec![Dictionary::from_checkpoint(
                config,
                &checkpoint,
                SAE_LENS,
                device,
            )?]);
        }
        let set = path.join(circuit_tracer::CONFIG);
        if set.is_file() {
            return circuit_tracer::load_set(&set, device, hub);
        }
        let params = path.join("params.npz");
        if params.is_file() {
            return Ok(vec![npz::load(&params, device)?]);
        }
        Err(error(
            "holds neither cfg.json (SAELens), config.yaml (circuit-tracer) nor params.npz \
             (Gemma Scope)"
                .into(),
        ))
    }

    /// Builds the dictionary `config` describes from the tensors of `checkpoint` (SAELens'
    /// names: `W_enc [d_in, F]`, `b_enc`, `W_dec [F, d_out]`, `b_dec`, `threshold`, `b_gate`,
    /// `r_mag`, `b_mag`, `W_skip [d_out, d_in]`; `names` says where a format differs). Every
    /// missing, misshapen or non-finite tensor is reported at once, naming the file and key;
    /// so is one the dictionary does not use.
    pub(crate) fn from_checkpoint(
        config: DictionaryConfig,
        checkpoint: &Checkpoint,
        names: TensorNames,
        device: &Device,
    ) -> Result<Dictionary> {
        let (d_in, d_out, f) = (config.d_in, config.d_out, config.features);
        let mut loader = WeightLoader::new(checkpoint, device);
        let w_enc: Tensor<2> = match names.encoder_out_in {
            true => loader.tensor::<2>("W_enc", [f, d_in])?.transpose(),
            false => loader.tensor("W_enc", [d_in, f])?,
        };
        let b_dec: Tensor<1> = loader.tensor("b_dec", [d_out])?;
        let gated = config.activation == Activation::Gated;
        let mut b_enc: Tensor<1> = loader.tensor(if gated { "b_gate" } else { "b_enc" }, [f])?;
        let threshold = match config.activation {
            Activation::JumpRelu => Some(loader.tensor(names.threshold, [f])?),
            _ => None,
        };
        let magnitude_path = match gated {
            true => Some((
                loader.tensor::<1>("r_mag", [f])?,
                loader.tensor::<1>("b_mag", [f])?,
            )),
            false => None,
        };
        let skip = match config.skip {
            true => Some(Linear::from_out_in(loader.tensor("W_skip", [d_out, d_in])?)),
            false => None,
        };
        // The decoder is used as stored (f32, bf16 or f16), except where TopK's decoder-norm
        // scaling is folded in (`pre * |W_dec row|`, decoding `features / |W_dec row|`, as
        // SAELens folds them when it saves such a dictionary for inference): those rows change,
        // so that decoder is held in f32. The encoder, which gets constants folded in, is f32.
        let (decoder, decoder_norms) = match config.rescale_by_decoder_norm {
            true => {
                let rows: Tensor<2> = loader.tensor("W_dec", [f, d_out])?;
                let norms = rows.clone().powf_scalar(2.0).sum_dim(1).sqrt().reshape([f]);
                let rows = rows / norms.clone().unsqueeze_dim::<2>(1);
                (Linear::from_in_out(rows, Some(b_dec.clone())), Some(norms))
            }
            false => {
                let stored = checkpoint.precision_of("W_dec").unwrap_or(WeightDtype::F32);
                loader = loader.with_dtype(stored);
                let decoder =
                    Linear::load_in_out(&mut loader, "W_dec", [f, d_out], Some(b_dec.clone()))?;
                (decoder, None)
            }
        };
        let report = loader.finish()?;
        if !report.unused.is_empty() {
            return Err(Error::Dictionary {
                path: checkpoint.origin.clone(),
                message: format!(
                    "holds tensors a {:?} dictionary does not use: {}",
                    config.activation,
                    report.unused.join(", ")
                ),
            });
        }
        let mut w_enc = w_enc;
        if let Some(norms) = decoder_norms {
            w_enc = w_enc * norms.clone().unsqueeze::<2>();
            b_enc = b_enc * norms;
        }
        // `(x - b_dec) W + b = x W + (b - b_dec W)`.
        let fold_b_dec = |w: &Tensor<2>, bias: Tensor<1>| match config.apply_b_dec_to_input {
            true => {
                bias - b_dec
                    .clone()
                    .unsqueeze::<2>()
                    .matmul(w.clone())
                    .reshape([f])
            }
            false => bias,
        };
        let encoder_bias = fold_b_dec(&w_enc, b_enc);
        let magnitude = magnitude_path.map(|(r_mag, b_mag)| {
            let w_mag = w_enc.clone() * r_mag.exp().unsqueeze::<2>();
            let bias = fold_b_dec(&w_mag, b_mag);
            Linear::from_in_out(w_mag, Some(bias))
        });
        Ok(Dictionary {
            encoder: Linear::from_in_out(w_enc, Some(encoder_bias)),
            magnitude,
            threshold,
            decoder,
            skip,
            input_norm: None,
            config,
        })
    }

    /// The same dictionary reading its input through `norm` first (placement decides it).
    pub(crate) fn reading_normalised(self, norm: Option<PlainNorm>) -> Dictionary {
        Dictionary {
            input_norm: norm,
            ..self
        }
    }

    /// Its settings.
    pub fn config(&self) -> &DictionaryConfig {
        &self.config
    }

    /// The precision its decoder is held in: as stored, except a TopK dictionary's whose rows
    /// are rescaled at load (f32).
    pub fn decoder_dtype(&self) -> WeightDtype {
        self.decoder.dtype()
    }

    /// `x` normalised as the config says, with the per-row scale and shift that undo it.
    fn normalize(&self, x: Tensor<2>) -> (Tensor<2>, Option<Tensor<2>>, Option<Tensor<2>>) {
        match self.config.normalization {
            Normalization::None => (x, None, None),
            Normalization::ConstantNormRescale => {
                let norm = x.clone().powf_scalar(2.0).sum_dim(1).sqrt();
                let factor = norm.recip() * (self.config.d_in as f32).sqrt();
                (x * factor.clone(), Some(factor.recip()), None)
            }
            Normalization::LayerNorm => {
                let width = self.config.d_in as f32;
                let mean = x.clone().mean_dim(1);
                let centred = x - mean.clone();
                let variance = centred.clone().powf_scalar(2.0).sum_dim(1) / (width - 1.0).max(1.0);
                let std = variance.sqrt();
                let x = centred / (std.clone() + LAYER_NORM_EPS);
                (x, Some(std), Some(mean))
            }
        }
    }
}

impl FeatureDictionary for Dictionary {
    fn features(&self) -> usize {
        self.config.features
    }

    fn source(&self) -> &Path {
        &self.config.path
    }

    fn encode(&self, input: Tensor<2>) -> Encoding {
        let input = match &self.input_norm {
            Some(norm) => norm.apply(input),
            None => input,
        };
        let (x, scale, shift) = self.normalize(input.clone());
        let pre = self.encoder.forward(x.clone());
        let features = match (self.config.activation, &self.threshold, &self.magnitude) {
            (Activation::TopK { k }, _, _) => {
                let (values, indices) = pre.clone().topk_with_indices(k, 1);
                pre.zeros_like()
                    .scatter(1, indices, values.clamp_min(0.0), IndexingUpdateOp::Add)
            }
            (Activation::JumpRelu, Some(threshold), _) => {
                let below =
                    (pre.clone() - threshold.clone().unsqueeze::<2>()).lower_equal_elem(0.0);
                pre.mask_fill(below, 0.0).clamp_min(0.0)
            }
            (Activation::Gated, _, Some(magnitude)) => {
                let closed = pre.lower_equal_elem(0.0);
                magnitude.forward(x).clamp_min(0.0).mask_fill(closed, 0.0)
            }
            _ => pre.clamp_min(0.0),
        };
        Encoding {
            features,
            input,
            scale,
            shift,
        }
    }

    fn decode(&self, features: Tensor<2>, encoding: &Encoding) -> Tensor<2> {
        let mut out = self.decoder.forward(features);
        if let Some(scale) = &encoding.scale {
            out = out * scale.clone();
        }
        if let Some(shift) = &encoding.shift {
            out = out + shift.clone();
        }
        match &self.skip {
            Some(skip) => out + skip.forward(encoding.input.clone()),
            None => out,
        }
    }
}

/// Where to attach a dictionary ([`crate::Model::attach`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttachOptions {
    /// The site (for a transcoder, the site it writes); by default the one its config names.
    pub site: Option<String>,
    /// A transcoder's input site; by default the one its config names.
    pub input: Option<String>,
    /// Replace the site by the reconstruction alone (no error term) at every call.
    pub without_error: bool,
}

impl AttachOptions {
    /// Parses `[SITE=]PATH` (the CLI's `--sae`, Python's `sae=`): the options it gives and the
    /// dictionary's path or hub path (see `ModelSource::resolve_dictionary`).
    pub fn parse(spec: &str, without_error: bool) -> (AttachOptions, String) {
        let (site, path) = match spec.split_once('=') {
            Some((site, path)) => (Some(site.trim().to_string()), path),
            None => (None, spec),
        };
        let options = AttachOptions {
            site,
            input: None,
            without_error,
        };
        (options, path.to_string())
    }
}

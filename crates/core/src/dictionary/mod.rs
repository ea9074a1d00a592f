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

mod config;
mod hook_names;
mod npz;
mod placement;

use std::path::Path;

use burn::tensor::{Device, IndexingUpdateOp, Tensor};

pub use config::{Activation, DictionaryConfig, Normalization};
pub use hook_names::site_of_hook;
pub(crate) use placement::place;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::hooks::{Encoding, FeatureDictionary};
use crate::nn::Linear;
use crate::weights::WeightLoader;

/// The layer-norm epsilon SAELens adds to the standard deviation.
const LAYER_NORM_EPS: f32 = 1e-5;

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
}

impl Dictionary {
    /// Loads a dictionary from `path`: a SAELens folder (`cfg.json` and
    /// `sae_weights.safetensors`), a Gemma Scope folder (`params.npz`), or a `.npz` file.
    pub fn load(path: &Path, device: &Device) -> Result<Dictionary> {
        let error = |message: String| Error::Dictionary {
            path: path.to_path_buf(),
            message,
        };
        if path.is_file() {
            return match path.extension().and_then(|e| e.to_str()) {
                Some("npz") => npz::load(path, device),
                _ => Err(error(
                    "expected a folder (SAELens' cfg.json and sae_weights.safetensors, or Gemma \
                     Scope's params.npz) or a .npz file"
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
            return Dictionary::from_checkpoint(config, &Checkpoint::open_file(&weights)?, device);
        }
        let params = path.join("params.npz");
        if params.is_file() {
            return npz::load(&params, device);
        }
        Err(error(
            "holds neither cfg.json (SAELens) nor params.npz (Gemma Scope)".into(),
        ))
    }

    /// Builds the dictionary `config` describes from the tensors of `checkpoint` (SAELens'
    /// names: `W_enc [d_in, F]`, `b_enc`, `W_dec [F, d_out]`, `b_dec`, `threshold`, `b_gate`,
    /// `r_mag`, `b_mag`, `W_skip [d_out, d_in]`). Every missing, misshapen or non-finite tensor
    /// is reported at once, naming the file and key; so is one the dictionary does not use.
    pub(crate) fn from_checkpoint(
        config: DictionaryConfig,
        checkpoint: &Checkpoint,
        device: &Device,
    ) -> Result<Dictionary> {
        let (d_in, d_out, f) = (config.d_in, config.d_out, config.features);
        let mut loader = WeightLoader::new(checkpoint, device);
        let w_enc: Tensor<2> = loader.tensor("W_enc", [d_in, f])?;
        let mut w_dec: Tensor<2> = loader.tensor("W_dec", [f, d_out])?;
        let b_dec: Tensor<1> = loader.tensor("b_dec", [d_out])?;
        let gated = config.activation == Activation::Gated;
        let mut b_enc: Tensor<1> = loader.tensor(if gated { "b_gate" } else { "b_enc" }, [f])?;
        let threshold = match config.activation {
            Activation::JumpRelu => Some(loader.tensor("threshold", [f])?),
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
        if config.rescale_by_decoder_norm {
            // TopK on `pre * |W_dec row|`, decoding `features / |W_dec row|`: folded into the
            // weights, as SAELens folds them when it saves such a dictionary for inference.
            let norms = w_dec
                .clone()
                .powf_scalar(2.0)
                .sum_dim(1)
                .sqrt()
                .reshape([f]);
            w_enc = w_enc * norms.clone().unsqueeze::<2>();
            b_enc = b_enc * norms.clone();
            w_dec = w_dec / norms.unsqueeze_dim::<2>(1);
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
            decoder: Linear::from_in_out(w_dec, Some(b_dec)),
            skip,
            config,
        })
    }

    /// Its settings.
    pub fn config(&self) -> &DictionaryConfig {
        &self.config
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

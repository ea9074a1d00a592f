//! The MODEL argument every model command takes.

use clap::{Args, ValueEnum};
use hookscope::prelude::*;
use hookscope::{AttachOptions, LoadOptions, MatmulPrecision, WeightDtype};

/// Which model a command runs on, and how its weights are stored.
#[derive(Debug, Args)]
pub struct ModelArg {
    /// A local Hugging Face directory or a hub id (see MODEL below); omitted: the embedded
    /// default model.
    #[arg(value_name = "MODEL")]
    model: Option<String>,
    /// Precision the weights are stored in (products accumulate in f32; sites are f32): auto is
    /// the config's `dtype`, else the checkpoint's own, as in transformers.
    #[arg(long, value_enum, default_value_t = DtypeArg::Auto)]
    dtype: DtypeArg,
    /// Precision activations meet the weight matrices in: f32 multiplies exactly what is
    /// stored; bf16 (with --dtype bf16, on the CPU) rounds the activations entering each
    /// product to bf16, about three times as fast on prompt calls with AMX (Intel Xeon since
    /// Sapphire Rapids), up to twice with AVX-512 BF16; sums stay f32.
    #[arg(long, value_enum, default_value_t = MatmulArg::F32)]
    matmul_precision: MatmulArg,
    /// Where the model runs: cpu, wgpu[:N], vulkan[:N], cuda[:N] or ndarray, among the backends
    /// this build has (`hookscope devices` lists them).
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    device: DeviceChoice,
    /// Attach a feature dictionary (a SAELens folder, a Gemma Scope params.npz folder or file)
    /// at SITE (a site or a TransformerLens hook name; for a transcoder, the site it writes;
    /// omitted: where its config says). Its values become sites: SITE.sae.features,
    /// SITE.sae.reconstruction, SITE.sae.error. Repeatable.
    #[arg(long, value_name = "[SITE=]PATH")]
    sae: Vec<String>,
    /// Replace each --sae site by the dictionary's reconstruction alone, without the error
    /// term (to measure what the dictionary loses); by default the model runs unchanged unless
    /// a dictionary value is edited.
    #[arg(long, requires = "sae")]
    sae_without_error: bool,
}

/// `--device`, parsed by the library so the CLI and Python say the same thing.
pub fn parse_device(text: &str) -> std::result::Result<DeviceChoice, String> {
    text.parse().map_err(|error: Error| error.to_string())
}

/// The `--dtype` choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DtypeArg {
    Auto,
    #[value(alias = "float32")]
    F32,
    #[value(alias = "bfloat16")]
    Bf16,
    #[value(alias = "float16")]
    F16,
}

/// The `--matmul-precision` choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum MatmulArg {
    #[value(alias = "float32", alias = "highest")]
    F32,
    #[value(alias = "bfloat16", alias = "medium")]
    Bf16,
}

impl ModelArg {
    fn options(&self) -> LoadOptions {
        let dtype = match self.dtype {
            DtypeArg::Auto => None,
            DtypeArg::F32 => Some(WeightDtype::F32),
            DtypeArg::Bf16 => Some(WeightDtype::Bf16),
            DtypeArg::F16 => Some(WeightDtype::F16),
        };
        let matmul_precision = match self.matmul_precision {
            MatmulArg::F32 => MatmulPrecision::F32,
            MatmulArg::Bf16 => MatmulPrecision::Bf16,
        };
        LoadOptions {
            dtype,
            matmul_precision,
        }
    }
}

impl ModelArg {
    /// The model as the user named it (`<embedded default>` when omitted).
    pub fn spec(&self) -> String {
        self.model
            .clone()
            .unwrap_or_else(|| "<embedded default>".to_string())
    }

    /// Loads the model on the chosen device, printing what the adapter noted about the load.
    pub fn load(&self) -> Result<Model> {
        self.load_on(self.device.open()?)
    }

    /// Loads the model on the chosen device with autodiff, for runs that take gradients (every
    /// product then runs as burn's tensor operations, which record the backward pass).
    pub fn load_for_gradients(&self) -> Result<Model> {
        self.load_on(self.device.open()?.autodiff())
    }

    fn load_on(&self, device: Device) -> Result<Model> {
        let source = match &self.model {
            Some(spec) => ModelSource::resolve(spec)?,
            None => hookscope::default_model(),
        };
        let mut model = Model::load_with(&source, &device, self.options())?;
        for note in &model.load_report().notes {
            eprintln!("note: {note}");
        }
        for spec in &self.sae {
            let (options, path) = AttachOptions::parse(spec, self.sae_without_error);
            let dictionaries = ModelSource::load_dictionaries(&path, model.device())?;
            model.attach_all(dictionaries, options)?;
        }
        Ok(model)
    }
}

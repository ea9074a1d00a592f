//! The typed errors of hookscope.

use std::path::PathBuf;

/// Every failure hookscope reports. Messages are written for the researcher who caused them.
///
/// New kinds of failure may be added: a `match` needs a `_` arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A site name that is not in the schema.
    #[error("unknown site `{name}`{}", suggestion_suffix(.suggestion))]
    UnknownSite {
        /// What was asked for.
        name: String,
        /// The closest valid site of this model, if any is close.
        suggestion: Option<String>,
    },
    /// A layer index past the model's last layer.
    #[error("`{name}`: layer {layer} is out of range; this model has {layers} layers (0..={})", .layers.saturating_sub(1))]
    LayerOutOfRange {
        /// What was asked for.
        name: String,
        /// The layer index asked for.
        layer: usize,
        /// The model's layer count.
        layers: usize,
    },
    /// A valid schema site that this model's layer does not have.
    #[error(
        "`{name}`: layer {layer} of this model is a {mixer} block, which has no such site; its sites are: {available}"
    )]
    SiteNotInArchitecture {
        /// What was asked for.
        name: String,
        /// The layer.
        layer: usize,
        /// The layer's mixer kind.
        mixer: &'static str,
        /// The sites the layer does have.
        available: String,
    },
    /// A site whose tabled shape names an axis the block serving it does not size: the schema's
    /// tables and a mixer's dimensions disagree.
    #[error("`{site}`: its shape has the axis `{dim}`, which {owner} does not size")]
    UnsizedAxis {
        /// The site.
        site: String,
        /// The symbolic axis (`NH`, `E`, ...).
        dim: String,
        /// What serves the site (`a softmax attention block`, `the model outside its blocks`).
        owner: String,
    },
    /// A glob pattern that matched no site.
    #[error("pattern `{0}` matches no site of this model (try `hookscope sites`)")]
    PatternMatchesNothing(String),
    /// A request whose steps all lie beyond the run.
    #[error(
        "`{site}@{steps}` never runs: this run has {run_steps} step(s), 0..={last} (raise --max-new-tokens or name an earlier step)",
        last = .run_steps.saturating_sub(1)
    )]
    StepsBeyondRun {
        /// The site requested.
        site: String,
        /// The steps requested.
        steps: String,
        /// Steps the run makes.
        run_steps: usize,
    },
    /// A steps specification that does not parse.
    #[error("invalid steps `{0}`: expected `K`, `A:B` (end exclusive) or `all`")]
    InvalidSteps(String),
    /// An edit that needs a value served later in the same call than the site it edits.
    #[error(
        "edit of `{site}` needs `{needed}`, which does not occur before it in the same call (contract order: `{site}` is site #{site_position}, `{needed}` is #{needed_position}); an edit can only read values served before the site it edits"
    )]
    OutOfOrder {
        /// The edited site.
        site: String,
        /// Its position in the call order.
        site_position: usize,
        /// The site it reads.
        needed: String,
        /// That site's position in the call order.
        needed_position: usize,
    },
    /// A site argument (`PATTERN[INDEX][@STEPS][=FILE:KEY[*SCALE]]`) that does not parse or
    /// does not fit the sites it names.
    #[error("`{spec}`: {message}")]
    InvalidSpec {
        /// The argument as given.
        spec: String,
        /// What is wrong.
        message: String,
    },
    /// An index that does not fit a site's value at some step.
    #[error("`{site}` at step {step}: {message}")]
    Index {
        /// The site and index, as requested.
        site: String,
        /// The step.
        step: usize,
        /// What is wrong, as numpy words it.
        message: String,
    },
    /// A write whose value does not broadcast to the site's shape.
    #[error(
        "write to `{site}` at step {step}: the value has shape {got:?}, which does not broadcast to the site's {expected:?}"
    )]
    WriteShapeMismatch {
        /// The site written.
        site: String,
        /// The step.
        step: usize,
        /// The site's shape.
        expected: Vec<usize>,
        /// The written value's shape.
        got: Vec<usize>,
    },
    /// A write whose value has the wrong kind (integer ids vs. float activations) or rank.
    #[error("write to `{site}`: value is {got}, the site holds {expected}")]
    WriteKindMismatch {
        /// The site written.
        site: String,
        /// What the site holds.
        expected: String,
        /// What was written.
        got: String,
    },
    /// Reading a file failed.
    #[error("cannot read {}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A JSON file that does not parse or lacks a required field.
    #[error("malformed {}: {source}", .path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: serde_json::Error,
    },
    /// A dictionary value asked for at a site no dictionary is attached to.
    #[error(
        "`{name}`: no dictionary is attached to `{site}`; attach one first (`--sae {site}=PATH`, \
         `Model::attach`)"
    )]
    NoDictionary {
        /// The name asked for.
        name: String,
        /// The site it is named under.
        site: String,
    },
    /// A feature dictionary that cannot be loaded or attached: a file, key or option at fault.
    #[error("dictionary {}: {message}", .path.display())]
    Dictionary {
        /// The folder or file it was loaded from.
        path: PathBuf,
        /// What is wrong, naming the file, key or site.
        message: String,
    },
    /// A config value of the wrong type, or a required one missing.
    #[error("{}: {}{source}", .path.display(), key_prefix(.key))]
    ConfigValue {
        /// The config file.
        path: PathBuf,
        /// The key, as a path (`rope_scaling.factor`; `.` for the whole file).
        key: String,
        /// What is wrong with it.
        source: serde_json::Error,
    },
    /// A config value that the adapter cannot run.
    #[error("{}: unsupported configuration: {message}", .path.display())]
    UnsupportedConfig {
        /// The config file.
        path: PathBuf,
        /// What is unsupported.
        message: String,
    },
    /// A safetensors file that does not parse (truncated, bad header, ...).
    #[error("malformed safetensors file {}: {message}", .path.display())]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// The cause.
        message: String,
    },
    /// A generation stopped on request (e.g. Ctrl-C) before step `step`.
    #[error("interrupted before step {step}")]
    Interrupted {
        /// The step that did not run.
        step: usize,
    },
    /// A tensor a safetensors file lacks, or holds in a form that cannot be used.
    #[error("{}: {message}", .path.display())]
    TensorInFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with which key.
        message: String,
    },
    /// Loading found missing, misshapen or unusable weights; every problem is listed.
    #[error("cannot load weights from {}:\n{}", .path.display(), .problems.join("\n"))]
    Weights {
        /// The checkpoint directory.
        path: PathBuf,
        /// One line per problem.
        problems: Vec<String>,
    },
    /// A tokenizer file that does not load.
    #[error("cannot load tokenizer {}: {message}", .path.display())]
    Tokenizer {
        /// The file.
        path: PathBuf,
        /// The cause.
        message: String,
    },
    /// Tokenizing or decoding failed, or the model has no tokenizer.
    #[error("tokenizer: {0}")]
    Tokenize(String),
    /// No registered architecture serves this checkpoint.
    #[error(
        "no registered architecture handles model_type `{model_type}` (architectures: {architectures:?}); registered: {registered}. An architecture built as a plugin library loads with --plugin PATH (Rust: `hookscope::plugin::load`)"
    )]
    UnknownArchitecture {
        /// `config.json`'s `model_type`.
        model_type: String,
        /// `config.json`'s `architectures`.
        architectures: Vec<String>,
        /// What is registered.
        registered: String,
    },
    /// A model given by path or hub id that cannot be found.
    #[error("model `{spec}` not found: {reason}")]
    ModelNotFound {
        /// The path or hub id.
        spec: String,
        /// Why.
        reason: String,
    },
    /// Input the engine cannot run (empty prompt, over-long sequence, ...).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A user edit function failed.
    #[error("edit of `{site}` failed: {message}")]
    Edit {
        /// The site edited.
        site: String,
        /// The cause.
        message: String,
    },
    /// A plugin library that cannot be used.
    #[error("plugin {}: {message}", .path.display())]
    Plugin {
        /// The library.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// Writing an output file failed.
    #[error("cannot write {}: {message}", .path.display())]
    Output {
        /// The file.
        path: PathBuf,
        /// The cause.
        message: String,
    },
    /// An adapter asked for a layer's carried state of another kind than the layer holds.
    #[error("layer {layer} carries {found}, but the forward pass asked for {expected}")]
    CarriedState {
        /// The layer.
        layer: usize,
        /// What the forward pass asked for.
        expected: &'static str,
        /// What the layer holds.
        found: &'static str,
    },
    /// A job that needs more memory than the machine has available.
    #[error(
        "{what} needs about {} of memory, and this machine has {} available{hint}",
        human_bytes(*.needed),
        human_bytes(*.available)
    )]
    InsufficientMemory {
        /// What would need the memory.
        what: String,
        /// Bytes it needs (an estimate).
        needed: usize,
        /// Bytes available (`MemAvailable`).
        available: usize,
        /// What the user can do about it (empty, or starting with `; `).
        hint: String,
    },
    /// Non-finite values where a distribution or logits must be finite.
    #[error("{0}")]
    NonFinite(String),
    /// The engine's signal that a call ended after the last site its requests touch
    /// ([`crate::Run::stop_after_last_request`]): it travels through an adapter's `?` like an
    /// error, and the engine turns it into the run's result. No public function returns it, and
    /// its value cannot be made outside the engine.
    #[doc(hidden)]
    #[error("internal: the forward call stopped after the last requested site")]
    StoppedEarly(StopSignal),
    /// Copying a tensor's values to the host failed on the device.
    #[error("tensor backend: {0}")]
    Backend(#[from] burn::tensor::DataError),
    /// A value the run should have served and saved is missing (an adapter that skipped a
    /// declared site).
    #[error("`{site}` was not served at step {step}")]
    NotServed {
        /// The site, as requested.
        site: String,
        /// The step.
        step: usize,
    },
    /// A value a run did not compute because it ended early
    /// ([`crate::Run::stop_after_last_request`]).
    #[error("`{value}` was not computed: the run stopped after its last requested site")]
    NotComputed {
        /// What was asked for (`logits`, `next_token_probs`).
        value: &'static str,
    },
    /// A sampling option given to a generation that decodes greedily.
    #[error(
        "--{} applies only when sampling, and this run decodes greedily: add --sample (Python: \
         pass greedy=False or drop {option})",
        .option.replace('_', "-")
    )]
    SamplingOptionUnderGreedy {
        /// The option (`temperature`, `top_k`, `top_p`).
        option: &'static str,
    },
    /// Run options that do not fit the call they are given to.
    #[error("{option}: {reason}")]
    RunOption {
        /// The option ([`crate::Run`]'s method).
        option: &'static str,
        /// Why it cannot be used here.
        reason: String,
    },
    /// A load option that does not fit the model, its weights or the device.
    #[error("{option} `{value}`: {reason}")]
    LoadOption {
        /// The option.
        option: &'static str,
        /// Its value, as the user gave it.
        value: String,
        /// Why it cannot be used, and what can.
        reason: String,
    },
    /// A device the user named cannot be used (unknown, not built, not on this machine).
    #[error("device `{device}`: {reason}")]
    Device {
        /// The device as the user wrote it.
        device: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
}

/// The value of [`Error::StoppedEarly`]: only the engine makes one, so no caller can raise the
/// signal, and matching it tells a caller nothing it could act on.
#[derive(Debug)]
pub struct StopSignal(());

impl StopSignal {
    /// The signal, raised by the hooks of a call told to stop.
    pub(crate) fn raise() -> Error {
        Error::StoppedEarly(StopSignal(()))
    }
}

/// `` `key`: `` before a config error, nothing for the whole file (`.`).
fn key_prefix(key: &str) -> String {
    match key {
        "." | "" => String::new(),
        key => format!("`{key}`: "),
    }
}

fn suggestion_suffix(suggestion: &Option<String>) -> String {
    match suggestion {
        Some(name) => format!("; did you mean `{name}`?"),
        None => String::new(),
    }
}

/// A byte count for messages: `1.8 GB`, `512.0 MB`, `900 bytes`.
pub fn human_bytes(bytes: usize) -> String {
    const UNITS: [(&str, f64); 3] = [("TB", 1e12), ("GB", 1e9), ("MB", 1e6)];
    UNITS
        .iter()
        .find(|(_, size)| bytes as f64 >= *size)
        .map_or_else(
            || format!("{bytes} bytes"),
            |(unit, size)| format!("{:.1} {unit}", bytes as f64 / size),
        )
}

/// hookscope's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

//! `hookscope`: run any registered model and read or write its internals by standard site names.

mod attention;
mod attrib;
mod bench;
mod dla;
mod extract;
mod features;
mod interrupt;
mod lens;
mod model_arg;
mod patch;
mod plot;
mod run;
mod scores;
mod serve;
mod sites;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// What MODEL, PATTERN and STEPS mean, shown under every `--help`.
const GLOSSARY: &str = "\
MODEL: a local Hugging Face directory (config.json, model.safetensors or a sharded index,
  tokenizer.json, generation_config.json), or a hub id (owner/name: from the local hub cache,
  downloaded if missing; HF_HUB_OFFLINE=1 uses the cache only). Omitted: the embedded default
  model (a small Llama trained on the King James Bible, with the real GPT-2 tokenizer; no
  network).
PATTERN[INDEX][@STEPS]: site names with `*` and `?` wildcards
  (`layers.*.self_attn.attention_keys`; `hookscope sites` lists them). INDEX is numpy basic
  indexing of the value (`[:, -1]` the last position, `[:, :, 3]` head 3 of `[B, T, NH, D]`,
  `[0, 2:5, ...]`): a save keeps that part, a write changes only it. STEPS is `K` (one step),
  `A:B` (steps A to B-1, end exclusive like `tracer.iter[A:B]`; either bound may be omitted) or
  `all`. Step 0 is the prompt call. Without @STEPS: step 0 for a single trace, every step under
  --max-new-tokens.";

/// Read and write the internals of language models under one standard set of site names.
#[derive(Debug, Parser)]
#[command(name = "hookscope", version, about, after_help = GLOSSARY)]
struct Cli {
    /// Load an architecture from a plugin library (repeatable), before running the command.
    #[arg(long, global = true, value_name = "PATH")]
    plugin: Vec<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a forward trace, print the top next tokens, and save requested sites.
    #[command(after_help = GLOSSARY)]
    Run(run::RunArgs),
    /// Save sites over every prompt of a file (or one shard of it) to safetensors files with a
    /// manifest; resumable; `--merge-manifests` joins the shards of a split job.
    #[command(after_help = GLOSSARY)]
    Extract(extract::ExtractArgs),
    /// The logit lens: every layer's output through the final norm and head, top tokens per
    /// layer and position.
    #[command(after_help = GLOSSARY)]
    Lens(lens::LensArgs),
    /// Direct logit attribution: the last position's logit of a token (or a difference of two)
    /// split into the embeddings, every head and MLP, and the biases.
    #[command(after_help = GLOSSARY)]
    Dla(dla::DlaArgs),
    /// Activation patching: for every matched site and position, run the corrupt prompt with
    /// that value from the clean run; the metric from 0 (corrupt) to 1 (clean).
    #[command(after_help = GLOSSARY)]
    Patch(patch::PatchArgs),
    /// Attribution patching: patch's sweep estimated from one forward and one backward pass
    /// (`(clean - corrupt) . dM/dsite` at the corrupt run; `--method ig` integrates the
    /// gradient), per site, position and head; `--compare` runs the exact sweep beside it.
    Attrib(attrib::AttribArgs),
    /// The most active features of every dictionary attached with --sae at each token of a
    /// prompt, with each dictionary's L0 and reconstruction error.
    #[command(after_help = GLOSSARY)]
    Features(features::FeaturesArgs),
    /// One layer's attention patterns as a heatmap image (--png) or a text view.
    #[command(after_help = GLOSSARY)]
    Attention(attention::AttentionArgs),
    /// Serve the model behind a local HTTP API (`/v1/model`, `/v1/sites`, `/v1/run`) until
    /// Ctrl-C.
    #[command(after_help = GLOSSARY)]
    Serve(serve::ServeArgs),
    /// List every site of a model with its shape at the prompt call and at a decode step.
    #[command(after_help = GLOSSARY)]
    Sites(sites::SitesArgs),
    /// List the registered architectures.
    #[command(after_help = GLOSSARY)]
    Archs,
    /// Time a forward trace with no hooks against one saving every site (JSON report).
    #[command(after_help = GLOSSARY)]
    Bench(bench::BenchArgs),
    /// Check every registered architecture against the contract, and parity with
    /// `transformers` where reference fixtures are given; exits non-zero on any failure.
    #[command(after_help = GLOSSARY)]
    Conformance {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Folder of reference fixtures made by `conformance/scripts/make_fixtures.py` (default:
        /// the folder HOOKSCOPE_FIXTURES names; without either, parity is skipped and says so).
        #[arg(long, value_name = "DIR")]
        fixtures: Option<PathBuf>,
        /// The device every model of the suite runs on (see `hookscope devices`).
        #[arg(long, default_value = "cpu", value_parser = model_arg::parse_device)]
        device: hookscope::DeviceChoice,
    },
    /// List the backends this build has (and the features that add the others) and the devices
    /// each finds on this machine.
    Devices,
}

fn main() -> ExitCode {
    interrupt::end_quietly_on_closed_pipe();
    let cli = Cli::parse();
    // Generation with saved sites allocates fresh buffers every step: keep freed memory.
    hookscope::memory::keep_freed_memory();
    // The server stops on its own signals, finishing the requests in flight.
    let serving = matches!(cli.command, Command::Serve(_));
    if !serving && let Err(error) = interrupt::remove_partial_output_on_interrupt() {
        eprintln!(
            "warning: cannot watch for interruption ({error}); an interrupted --out may leave a temporary file"
        );
    }
    for path in &cli.plugin {
        if let Err(error) = hookscope::plugin::load(path) {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    }
    let result = match cli.command {
        Command::Run(args) => run::run(&args).map(|()| ExitCode::SUCCESS),
        Command::Extract(args) => extract::extract(&args).map(|()| ExitCode::SUCCESS),
        Command::Lens(args) => lens::lens(&args).map(|()| ExitCode::SUCCESS),
        Command::Patch(args) => patch::patch(&args).map(|()| ExitCode::SUCCESS),
        Command::Attrib(args) => attrib::attrib(&args).map(|()| ExitCode::SUCCESS),
        Command::Dla(args) => dla::dla(&args).map(|()| ExitCode::SUCCESS),
        Command::Features(args) => features::features(&args).map(|()| ExitCode::SUCCESS),
        Command::Attention(args) => attention::attention(&args).map(|()| ExitCode::SUCCESS),
        Command::Sites(args) => sites::sites(&args).map(|()| ExitCode::SUCCESS),
        Command::Serve(args) => serve::serve(&args).map(|()| ExitCode::SUCCESS),
        Command::Archs => {
            archs();
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(args) => bench::bench(&args).map(|()| ExitCode::SUCCESS),
        Command::Conformance {
            json,
            fixtures,
            device,
        } => device
            .open()
            .map(|device| conformance(json, fixtures.as_deref(), &device)),
        Command::Devices => {
            devices();
            Ok(ExitCode::SUCCESS)
        }
    };
    result.unwrap_or_else(|error| {
        eprintln!("error: {error}");
        ExitCode::FAILURE
    })
}

/// Runs the suite over every registered architecture; failure if any check fails.
fn conformance(
    json: bool,
    fixtures: Option<&std::path::Path>,
    device: &hookscope::burn::tensor::Device,
) -> ExitCode {
    let fixtures = match hookscope_conformance::locate_fixtures(fixtures) {
        Ok(fixtures) => fixtures,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::FAILURE;
        }
    };
    let reports = hookscope_conformance::suite::run_all(fixtures.as_deref(), device);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&reports).unwrap_or_default()
        );
    } else {
        println!("{}", hookscope_conformance::report::table(&reports));
    }
    if fixtures.is_none() {
        eprintln!(
            "note: transformers parity was skipped (no fixtures): pass --fixtures DIR or set {}",
            hookscope_conformance::FIXTURES_ENV
        );
    }
    if reports.iter().all(|r| r.passed()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn archs() {
    for arch in hookscope::registry::registered() {
        println!(
            "{:<12} model_type: {:<24} architectures: {}",
            arch.name,
            arch.model_types.join(", "),
            arch.architectures.join(", ")
        );
    }
}

/// Every backend hookscope knows: the devices this machine has for each one built in, and the
/// feature that builds the others.
fn devices() {
    for choice in hookscope::DeviceChoice::ALL {
        let backend = choice.backend();
        if !choice.is_built() {
            println!(
                "{backend:<8} not in this build (cargo build --release -p hookscope-cli --features {backend})"
            );
            continue;
        }
        let found = choice.enumerate();
        if found.is_empty() {
            println!("{backend:<8} built, but this machine has no such device");
        }
        for (index, device) in found.iter().enumerate() {
            let name = choice.numbered(index).to_string();
            println!("{name:<8} {}", hookscope::device::describe(device));
        }
    }
}

//! `hookscope`: run any registered model and read or write its internals by standard site names.

mod bench;
mod embedded;
mod run;
mod sites;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use hookscope_core::burn::tensor::Device;
use hookscope_core::{Model, ModelSource};

// Built-in architectures: linking each crate is what registers it.
use hookscope_arch_gpt2 as _;
use hookscope_arch_llama as _;
use hookscope_arch_mamba as _;

/// Read and write the internals of language models under one standard set of site names.
#[derive(Debug, Parser)]
#[command(name = "hookscope", version, about)]
struct Cli {
    /// Load an architecture from a plugin library (repeatable), before running the command.
    #[arg(long, global = true, value_name = "PATH")]
    plugin: Vec<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a forward trace, print the top next tokens, and save requested sites.
    Run(run::RunArgs),
    /// List every site of a model with its shape at the prompt call and at a decode step.
    Sites(sites::SitesArgs),
    /// List the registered architectures.
    Archs,
    /// Time a forward trace with no hooks against one saving every site (JSON report).
    Bench(bench::BenchArgs),
    /// Check every registered architecture against the contract (and transformers parity
    /// where fixtures exist); exits non-zero on any failure.
    Conformance {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Folder of reference fixtures (default: the repository's `conformance/fixtures`).
        #[arg(long)]
        fixtures: Option<std::path::PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Generation with saved sites allocates fresh buffers every step: keep freed memory.
    hookscope_core::memory::keep_freed_memory();
    for path in &cli.plugin {
        if let Err(error) = hookscope_core::plugin::load(path) {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    }
    let result = match cli.command {
        Command::Run(args) => run::run(&args).map(|()| ExitCode::SUCCESS),
        Command::Sites(args) => sites::sites(&args).map(|()| ExitCode::SUCCESS),
        Command::Archs => {
            archs();
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(args) => bench::bench(&args).map(|()| ExitCode::SUCCESS),
        Command::Conformance { json, fixtures } => Ok(conformance(json, fixtures)),
    };
    result.unwrap_or_else(|error| {
        eprintln!("error: {error}");
        ExitCode::FAILURE
    })
}

/// Runs the suite over every registered architecture; failure if any check fails.
fn conformance(json: bool, fixtures: Option<std::path::PathBuf>) -> ExitCode {
    let fixtures = fixtures.unwrap_or_else(hookscope_conformance::fixtures_dir);
    let reports = hookscope_conformance::suite::run_all(&fixtures);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&reports).unwrap_or_default()
        );
    } else {
        println!("{}", hookscope_conformance::suite::table(&reports));
    }
    if reports.iter().all(|r| r.passed()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn archs() {
    for arch in hookscope_core::registry::registered() {
        println!(
            "{:<12} model_type: {:<24} architectures: {}",
            arch.name,
            arch.model_types.join(", "),
            arch.architectures.join(", ")
        );
    }
}

/// Loads MODEL (a directory or a cached hub id), or the embedded default model when omitted.
fn load_model(spec: Option<&str>) -> hookscope_core::Result<Model> {
    let source = match spec {
        Some(spec) => ModelSource::resolve(spec)?,
        None => ModelSource::Embedded(&embedded::DEFAULT_MODEL),
    };
    Model::load(&source, &Device::default())
}

//! `hookscope extract`: activations over a whole prompts file, streamed to safetensors files,
//! optionally one shard of the job; `--merge-manifests` checks and joins the shards.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use hookscope::extract::{ExtractJob, Manifest, Progress, Shard};
use hookscope::hooks::Selection;
use hookscope::{Error, Result, Steps};

/// Arguments of `hookscope extract`.
#[derive(Debug, Args)]
pub struct ExtractArgs {
    #[command(flatten)]
    model: crate::model_arg::ModelArg,
    /// The prompts: JSONL with a "text" (or token "ids") field per line (`.jsonl`), else plain
    /// text, one prompt per line. Blank lines are skipped.
    #[arg(long, value_name = "FILE", required_unless_present = "merge_manifests")]
    prompts: Option<PathBuf>,
    /// Sites to save at the prompt call (patterns as for `run`; repeatable).
    #[arg(
        long,
        value_name = "PATTERN",
        required_unless_present = "merge_manifests"
    )]
    save: Vec<String>,
    /// Folder for the files and the manifest (created if missing; a rerun resumes it).
    #[arg(long, value_name = "DIR")]
    out_dir: PathBuf,
    /// Prompts per forward call.
    #[arg(long, default_value_t = 8)]
    batch_size: usize,
    /// Process part I of N of the prompts (`0/4` ... `3/4`); the N parts cover every prompt
    /// exactly once.
    #[arg(long, value_name = "I/N")]
    shard: Option<String>,
    /// Dictionary features (`SITE.sae.features`, with `--sae`) are kept sparsely: each token's
    /// K largest non-zero features, as `SITE.sae.features.indices` (int64, -1 past the last
    /// active one) and `.values` (`[rows, K]`).
    #[arg(long, value_name = "K", default_value_t = 64)]
    feature_top_k: usize,
    /// Token rows per file (files hold whole batches); the rows of one file are held in
    /// memory until it is written.
    #[arg(long, default_value_t = 16_384)]
    max_rows_per_file: usize,
    /// Check that the shard manifests in --out-dir cover the job completely and disjointly,
    /// and write their union as manifest.json.
    #[arg(long, conflicts_with_all = ["prompts", "save", "shard"])]
    merge_manifests: bool,
}

/// Runs the extraction (or the merge) and reports where the files are.
pub fn extract(args: &ExtractArgs) -> Result<()> {
    if args.merge_manifests {
        let manifest = hookscope::extract::merge_manifests(&args.out_dir)?;
        return report(&manifest, &args.out_dir);
    }
    let model = args.model.load()?;
    let mut sites = Vec::new();
    for spec in &args.save {
        let selection = Selection::parse(model.layout(), spec, Steps::At(0))?;
        if selection.steps != Steps::At(0) {
            return Err(Error::InvalidInput(format!(
                "--save `{spec}`: extract runs prompt calls only (step 0)"
            )));
        }
        if !selection.index.is_full() {
            return Err(Error::InvalidInput(format!(
                "--save `{spec}`: extract saves whole sites as one row per token (batches mix \
                 prompts, so an index would select across them); select from the rows afterwards"
            )));
        }
        for site in selection.sites {
            if !sites.contains(&site) {
                sites.push(site);
            }
        }
    }
    let job = ExtractJob {
        model: args.model.spec(),
        prompts: args.prompts.clone().unwrap_or_default(),
        sites,
        out_dir: args.out_dir.clone(),
        batch_size: args.batch_size,
        max_rows_per_file: args.max_rows_per_file,
        feature_top_k: args.feature_top_k,
        shard: match &args.shard {
            Some(text) => Shard::parse(text)?,
            None => Shard::WHOLE,
        },
    };
    let mut display = ProgressDisplay::new();
    let manifest = hookscope::extract::extract(&model, &job, &mut |p| display.update(p))?;
    display.finish();
    report(&manifest, &args.out_dir)
}

fn report(manifest: &Manifest, dir: &std::path::Path) -> Result<()> {
    println!(
        "{} prompts, {} token rows in {} file(s) under {} (manifest: {})",
        manifest.prompts,
        manifest.tokens,
        manifest.files.len(),
        dir.display(),
        match manifest.shards.as_slice() {
            [Shard { index, count }] if *count > 1 => {
                format!("manifest.shard-{index:05}-of-{count:05}.json")
            }
            _ => "manifest.json".into(),
        }
    );
    Ok(())
}

/// A progress bar on a terminal; a plain line every 10 s otherwise (logs of batch jobs).
struct ProgressDisplay {
    bar: Option<indicatif::ProgressBar>,
    started: Instant,
    last_line: Instant,
}

impl ProgressDisplay {
    fn new() -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(0);
            let style = indicatif::ProgressStyle::with_template(
                "{bar:30} {pos}/{len} prompts, {msg}, ETA {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
            bar.set_style(style);
            bar
        });
        ProgressDisplay {
            bar,
            started: Instant::now(),
            last_line: Instant::now(),
        }
    }

    fn update(&mut self, progress: &Progress) {
        let elapsed = self.started.elapsed().as_secs_f64().max(1e-9);
        let rate = progress.tokens_run as f64 / elapsed;
        let message = format!("{} tokens, {rate:.0} tok/s", progress.tokens_run);
        match &self.bar {
            Some(bar) => {
                bar.set_length(progress.prompts_total as u64);
                bar.set_position(progress.prompts_done as u64);
                bar.set_message(message);
            }
            None if self.last_line.elapsed() >= Duration::from_secs(10) => {
                self.last_line = Instant::now();
                eprintln!(
                    "extract: {}/{} prompts, {message}",
                    progress.prompts_done, progress.prompts_total
                );
            }
            None => {}
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

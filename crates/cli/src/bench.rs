//! `hookscope bench`: time a forward trace with no hooks against one saving every site.
//!
//! Timing lives here, not in tests. `conformance/scripts/bench.py` runs this beside
//! `transformers` on the same machine and writes the ratios to BENCHMARKS.md.

use std::time::Instant;

use clap::Args;
use hookscope_core::{Error, Interventions, Result, Steps};
use serde_json::json;

/// Arguments of `hookscope bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Model directory or cached hub id (default: the embedded tiny GPT-2).
    model: Option<String>,
    /// Prompt length in tokens (ids drawn deterministically from the vocabulary).
    #[arg(long, default_value_t = 10)]
    prompt_len: usize,
    /// Timed repetitions of each variant.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Untimed repetitions first.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
}

/// Runs the benchmark and prints a JSON report (median and min milliseconds per variant).
pub fn bench(args: &BenchArgs) -> Result<()> {
    let model = crate::load_model(args.model.as_deref())?;
    let vocab = model.layout().vocab as u64;
    // A fixed linear-congruential sequence: the same prompt on every run and machine.
    let prompt: Vec<u32> = (0..args.prompt_len as u64)
        .map(|i| ((i * 6_364_136_223_846_793_005 + 1_442_695_040_888_963_407) >> 33) % vocab)
        .map(|id| id as u32)
        .collect();
    let batch = model.batch(vec![prompt])?;
    let save_all = model
        .layout()
        .call_order()
        .into_iter()
        .fold(Interventions::new(), |acc, site| {
            acc.save(site, Steps::At(0))
        });
    let variants = [
        ("no_hooks", Interventions::new()),
        ("save_every_site", save_all),
    ];
    let mut report = serde_json::Map::new();
    for (name, interventions) in &variants {
        let time_once = || -> Result<f64> {
            let start = Instant::now();
            let trace = model.trace(&batch, interventions)?;
            trace
                .next_token_probs
                .to_data()
                .convert::<f32>()
                .try_into_vec::<f32>()
                .map_err(|e| Error::Backend(format!("{e:?}")))?;
            Ok(start.elapsed().as_secs_f64() * 1e3)
        };
        for _ in 0..args.warmup {
            time_once()?;
        }
        let mut times = (0..args.iters.max(1))
            .map(|_| time_once())
            .collect::<Result<Vec<f64>>>()?;
        times.sort_by(f64::total_cmp);
        report.insert(
            (*name).to_string(),
            json!({"median_ms": times[times.len() / 2], "min_ms": times[0]}),
        );
    }
    report.insert("prompt_len".into(), json!(args.prompt_len));
    report.insert("sites".into(), json!(model.layout().call_order().len()));
    println!("{}", serde_json::Value::Object(report));
    Ok(())
}

//! `hookscope bench`: time a forward trace with no hooks against one saving every site.
//!
//! Timing lives here, not in tests. `conformance/scripts/bench.py` runs this beside
//! `transformers` on the same machine and writes the ratios to BENCHMARKS.md.

use std::time::Instant;

use clap::Args;
use hookscope::schema::DictionaryPart;
use hookscope::{Decoding, Interventions, LayerSite, Result, Site, Steps};
use serde_json::json;

/// Arguments of `hookscope bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    model: crate::model_arg::ModelArg,
    /// Prompt length in tokens (ids drawn deterministically from the vocabulary).
    #[arg(long, default_value_t = 10)]
    prompt_len: usize,
    /// Prompts per call, each of `--prompt-len` tokens (different ids per prompt).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    batch: u16,
    /// Timed repetitions of each variant.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Untimed repetitions first.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Time greedy generation of this many tokens instead of one forward call.
    #[arg(long)]
    new_tokens: Option<usize>,
    /// Time only the run without hooks (long contexts, where saving every site at every step
    /// would hold gigabytes of attention scores).
    #[arg(long)]
    unhooked_only: bool,
}

/// Buffer streamed by the bandwidth probes: larger than any cache.
const PROBE_BYTES: usize = 512 << 20;

/// Runs `pass` (one share of a buffer per thread, on every available thread) a few times and
/// returns the best rate in GB/s of `PROBE_BYTES` processed.
fn best_rate_gb_per_s(mut pass: impl FnMut(usize)) -> f64 {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    (0..5)
        .map(|_| {
            let start = Instant::now();
            pass(threads);
            PROBE_BYTES as f64 / start.elapsed().as_secs_f64() / 1e9
        })
        .fold(0.0, f64::max)
}

/// Memory copy bandwidth of this machine now, in bytes copied per second: the denominator of
/// the decode roofline.
fn copy_bandwidth_gb_per_s() -> f64 {
    let source = vec![1u8; PROBE_BYTES];
    let mut target = vec![0u8; PROBE_BYTES];
    best_rate_gb_per_s(|threads| {
        let chunk = PROBE_BYTES.div_ceil(threads);
        std::thread::scope(|scope| {
            for (from, to) in source.chunks(chunk).zip(target.chunks_mut(chunk)) {
                scope.spawn(move || to.copy_from_slice(from));
            }
        });
        std::hint::black_box(&target);
    })
}

/// Memory read bandwidth of this machine now (summing a buffer): what streaming the weights
/// once per token can reach at best, reported beside the roofline.
fn read_bandwidth_gb_per_s() -> f64 {
    // Enough independent sums that the adds never wait on each other, even with SSE2 alone.
    const LANES: usize = 32;
    let source = vec![1.0f32; PROBE_BYTES / 4];
    best_rate_gb_per_s(|threads| {
        let chunk = source.len().div_ceil(threads);
        std::thread::scope(|scope| {
            for part in source.chunks(chunk) {
                scope.spawn(move || {
                    let mut lanes = [0.0f32; LANES];
                    for values in part.chunks_exact(LANES) {
                        for (lane, value) in lanes.iter_mut().zip(values) {
                            *lane += value;
                        }
                    }
                    std::hint::black_box(lanes);
                });
            }
        });
    })
}

/// Multiply-add rounds per thread and pass of the peak probe (~1 G multiply-adds).
const PEAK_ROUNDS: usize = 2_500_000;

/// The CPU's model name (`/proc/cpuinfo`'s `model name` on Linux; the architecture elsewhere).
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("model name"))
                .and_then(|rest| rest.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// The f32 arithmetic peak of this machine now, in GFLOPS, at the vector level the kernels run
/// at (`HOOKSCOPE_CPU_KERNELS` caps both): fused multiply-adds on every thread, no memory
/// traffic. Prompt calls are reported as a fraction of it.
fn f32_peak_gflops() -> f64 {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    (0..5)
        .map(|_| {
            let start = Instant::now();
            let sums = std::thread::scope(|scope| {
                let probes: Vec<_> = (0..threads)
                    .map(|_| scope.spawn(|| hookscope::multiply_add_rounds(PEAK_ROUNDS)))
                    .collect();
                let results: Vec<_> = probes.into_iter().filter_map(|p| p.join().ok()).collect();
                std::hint::black_box(&results);
                results.first().map_or(0, |(_, sums)| *sums)
            });
            let flops = 2.0 * (threads * PEAK_ROUNDS * sums) as f64;
            flops / start.elapsed().as_secs_f64() / 1e9
        })
        .fold(0.0, f64::max)
}

/// Runs the benchmark and prints a JSON report (median and min milliseconds per variant).
pub fn bench(args: &BenchArgs) -> Result<()> {
    let loading = Instant::now();
    let model = args.model.load()?;
    let load_seconds = loading.elapsed().as_secs_f64();
    let vocab = model.layout().vocab as u64;
    // A fixed linear-congruential sequence: the same prompts on every run and machine.
    let prompt = |row: u64| -> Vec<u32> {
        (0..args.prompt_len as u64)
            .map(|i| {
                let mixed = (i + (row << 32))
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((mixed >> 33) % vocab.max(1)) as u32
            })
            .collect()
    };
    let batch = model.batch((0..u64::from(args.batch)).map(prompt).collect())?;
    let steps = if args.new_tokens.is_some() {
        Steps::All
    } else {
        Steps::At(0)
    };
    let save_all = model
        .layout()
        .call_order()
        .into_iter()
        .fold(Interventions::new(), |acc, site| {
            acc.save(site, steps.clone())
        });
    let middle_layer = Site::layer(model.layout().layers.len() / 2, LayerSite::LayerOutput);
    let mut variants = vec![
        ("no_hooks", Interventions::new()),
        (
            "save_one_site",
            Interventions::new().save(middle_layer, steps.clone()),
        ),
        ("save_every_site", save_all),
    ];
    let dictionary_features = model
        .layout()
        .dictionaries
        .iter()
        .filter_map(|placement| match placement.site {
            Site::Layer { layer, site } => Some(Site::Dictionary {
                layer,
                site,
                part: DictionaryPart::Features,
            }),
            _ => None,
        })
        .fold(Interventions::new(), |acc, site| {
            acc.save(site, steps.clone())
        });
    if !dictionary_features.is_empty() {
        variants.push(("save_dictionary_features", dictionary_features));
    }
    if args.unhooked_only {
        variants.truncate(1);
    }
    let mut config = model.generation_config().clone();
    config.decoding = Decoding::Greedy;
    config.eos_token_ids.clear();
    config.max_new_tokens = args.new_tokens.unwrap_or(0);
    let time_once = |interventions: &Interventions| -> Result<f64> {
        let start = Instant::now();
        if args.new_tokens.is_some() {
            model.generate(&batch, interventions, &config)?;
        } else {
            let trace = model.trace(&batch, interventions)?;
            hookscope::host::f32_values(trace.next_token_probs()?.to_data())?;
        }
        Ok(start.elapsed().as_secs_f64() * 1e3)
    };
    // Variants take turns, so that drift in the machine's speed hits them alike.
    let mut times = vec![Vec::with_capacity(args.iters); variants.len()];
    for round in 0..args.warmup + args.iters.max(1) {
        for (index, (_, interventions)) in variants.iter().enumerate() {
            let elapsed = time_once(interventions)?;
            if round >= args.warmup {
                times[index].push(elapsed);
            }
        }
    }
    let mut report = serde_json::Map::new();
    for ((name, _), mut times) in variants.iter().zip(times) {
        times.sort_by(f64::total_cmp);
        report.insert(
            (*name).to_string(),
            json!({"median_ms": times[times.len() / 2], "min_ms": times[0]}),
        );
    }
    report.insert("prompt_len".into(), json!(args.prompt_len));
    report.insert("batch".into(), json!(args.batch));
    report.insert("new_tokens".into(), json!(args.new_tokens));
    report.insert("weight_bytes".into(), json!(model.weight_bytes()));
    report.insert("dtype".into(), json!(model.dtype().to_string()));
    let matmul_precision = model.load_report().matmul_precision.to_string();
    report.insert("matmul_precision".into(), json!(matmul_precision));
    report.insert("load_seconds".into(), json!(load_seconds));
    report.insert("copy_gb_per_s".into(), json!(copy_bandwidth_gb_per_s()));
    report.insert("read_gb_per_s".into(), json!(read_bandwidth_gb_per_s()));
    report.insert("f32_peak_gflops".into(), json!(f32_peak_gflops()));
    let kernels = hookscope::product_kernels(model.load_report().matmul_precision, model.dtype());
    report.insert("cpu".into(), json!(cpu_model()));
    report.insert("product_kernels".into(), json!(kernels));
    report.insert("sites".into(), json!(model.layout().call_order().len()));
    println!("{}", serde_json::Value::Object(report));
    Ok(())
}

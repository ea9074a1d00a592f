//! `hookscope run`: a forward trace, or a generation with `--max-new-tokens`, with reads and
//! writes of standard sites at chosen steps.

use std::path::PathBuf;

use clap::Args;
use hookscope::analysis::GradMetric;
use hookscope::decoding::DecodingChoice;
use hookscope::hooks::RequestSpecs;
use hookscope::{
    Error, Generation, GenerationConfig, Interventions, Model, Result, Saved, Steps, Trace, report,
};
use serde_json::json;

/// Arguments of `hookscope run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    model: crate::model_arg::ModelArg,
    /// A prompt; repeat for a left-padded batch.
    #[arg(long = "prompt", required = true)]
    prompts: Vec<String>,
    /// Save the sites matching PATTERN at STEPS (`K`, `A:B` end exclusive, or `all`; default:
    /// step 0 for a trace, every step under --max-new-tokens), or only the part INDEX selects
    /// (numpy basic indexing: `[:, -1]`, `[0, 2:5, ...]`). Repeatable.
    #[arg(long, value_name = "PATTERN[INDEX][@STEPS]")]
    save: Vec<String>,
    /// Zero the sites matching PATTERN (or the part INDEX selects) at STEPS, e.g.
    /// `layers.0.self_attn.attention_head_outputs[:, :, 3]` ablates head 3; the change flows on
    /// through the rest of the call and, through the cache, later steps.
    #[arg(long, value_name = "PATTERN[INDEX][@STEPS]")]
    zero: Vec<String>,
    /// Add SCALE times a stored tensor to the sites (steering), or a number: a `[H]` tensor
    /// broadcasts over batch and positions, a full-shape one adds element-wise; `=4` adds 4 to
    /// every selected element (e.g. one SAE feature). Repeatable.
    #[arg(
        long,
        value_name = "PATTERN[INDEX][@STEPS]=FILE.safetensors:KEY[*SCALE]|NUMBER"
    )]
    add: Vec<String>,
    /// Replace the sites' values by a stored tensor (activation patching, e.g. a value saved
    /// by `--out` from another prompt) or a number, broadcast to their shape. Repeatable.
    #[arg(
        long,
        value_name = "PATTERN[INDEX][@STEPS]=FILE.safetensors:KEY|NUMBER"
    )]
    set: Vec<String>,
    /// Take the gradient of METRIC on the prompt call: `logit-diff:A,B`, `logit:A`, `prob:A`,
    /// `logprob:A` (tokens as text or `#ID`, each with an optional `@POS`, default the last
    /// position) or `loss` (mean next-token cross-entropy over the prompt); summed over the
    /// batch's rows. The model is loaded for gradients (tensor operations, slower).
    #[arg(long, value_name = "METRIC", conflicts_with = "max_new_tokens")]
    grad: Option<String>,
    /// Keep the gradient of --grad's metric at the sites matching PATTERN (or the part INDEX
    /// selects), written as `grad:{site}@0` beside the saved values. Repeatable.
    #[arg(long, value_name = "PATTERN[INDEX]", requires = "grad")]
    save_grad: Vec<String>,
    /// Write saved values to this safetensors file (`{site}@{step}`, `output_ids`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print a JSON report instead of text.
    #[arg(long)]
    json: bool,
    /// How many most likely next tokens to report per prompt (a trace) or per prompt and step
    /// (a generation under --json, at most 5).
    #[arg(long, default_value_t = 5)]
    top: usize,
    /// Run even when the saved values are estimated to exceed the memory available.
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    generation: GenerationArgs,
}

/// Generation options; decoding follows the checkpoint's `generation_config.json` unless
/// overridden here.
#[derive(Debug, Args)]
pub struct GenerationArgs {
    /// Generate this many tokens (one call per token) instead of a single trace.
    #[arg(long)]
    max_new_tokens: Option<usize>,
    /// Pick the most likely token at every step.
    #[arg(long, conflicts_with = "sample")]
    greedy: bool,
    /// Sample from the distribution at every step.
    #[arg(long)]
    sample: bool,
    /// Sampling temperature.
    #[arg(long)]
    temperature: Option<f32>,
    /// Sample among the K most likely tokens (0: all).
    #[arg(long)]
    top_k: Option<usize>,
    /// Sample among the most likely tokens holding probability mass P.
    #[arg(long)]
    top_p: Option<f32>,
    /// Seed of the sampling stream.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

impl GenerationArgs {
    /// The checkpoint's defaults with this command line's overrides (refusing sampling options
    /// under greedy decoding).
    fn config(
        &self,
        defaults: &GenerationConfig,
        max_new_tokens: usize,
    ) -> Result<GenerationConfig> {
        let sample = match (self.sample, self.greedy) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        };
        let choice = DecodingChoice {
            sample,
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed: self.seed,
        };
        defaults.with_choice(max_new_tokens, &choice)
    }
}

/// Runs the trace or generation and reports it.
pub fn run(args: &RunArgs) -> Result<()> {
    let model = match args.grad {
        Some(_) => args.model.load_for_gradients()?,
        None => args.model.load()?,
    };
    let prompts: Vec<&str> = args.prompts.iter().map(String::as_str).collect();
    let batch = model.encode(&prompts)?;
    // Under generation a selection without `@STEPS` means every step; in a trace, step 0.
    let default_steps = match args.generation.max_new_tokens {
        Some(_) => Steps::All,
        None => Steps::At(0),
    };
    let specs = RequestSpecs {
        save: args.save.clone(),
        zero: args.zero.clone(),
        add: args.add.clone(),
        set: args.set.clone(),
        save_grad: args.save_grad.clone(),
        ..Default::default()
    };
    let interventions = specs.interventions(
        model.layout(),
        &default_steps,
        args.generation.max_new_tokens.is_some(),
        model.device(),
    )?;
    check_saved_size(args, &model, &batch, &interventions)?;
    if let Some(max_new_tokens) = args.generation.max_new_tokens {
        let config = args
            .generation
            .config(model.generation_config(), max_new_tokens)?;
        let generation = model.generate(&batch, &interventions, &config)?;
        warn_of_steps_never_run(&interventions, generation.steps, max_new_tokens);
        if let Some(path) = &args.out {
            let ids = (&generation.output_ids, &generation.attention_mask);
            write_out(path, &generation.saved, ids)?;
        }
        return report_generation(&model, args, &generation);
    }
    let mut trace = model.trace(&batch, &interventions)?;
    let gradients = match &args.grad {
        Some(text) => Some(take_gradients(&model, &mut trace, text, &args.save_grad)?),
        None => None,
    };
    if let Some(path) = &args.out {
        let mut tensors = report::saved_tensors(&trace.saved, &trace.batch.ids, &trace.batch.mask);
        if let Some((_, gradients)) = &gradients {
            tensors.extend(report::gradient_tensors(gradients));
        }
        hookscope::output::write_safetensors(path, &tensors)?;
    }
    if args.json {
        let mut report = report::trace_json(&model, &args.prompts, &trace, args.top)?;
        if let Some((metric, gradients)) = &gradients {
            report["metric"] = json!({"name": args.grad, "value": metric});
            report["gradients"] = report::gradients_json(gradients);
        }
        report["out"] = json!(args.out);
        println!("{report:#}");
    } else {
        let top = report::top_next_tokens(&model, &trace, args.top)?;
        print_text(&prompts, &trace, &top, args.out.as_ref());
        if let Some((metric, gradients)) = &gradients {
            print_gradients(args.grad.as_deref().unwrap_or_default(), *metric, gradients);
        }
    }
    Ok(())
}

/// The metric named by `text` on `trace` and its gradients at the sites asked.
fn take_gradients(
    model: &Model,
    trace: &mut Trace,
    text: &str,
    save_grad: &[String],
) -> Result<(f32, Saved)> {
    let metric = GradMetric::parse(model, text)?.measure(trace)?;
    let value = hookscope::host::f32_values(metric.to_data())?[0];
    let gradients = match save_grad.is_empty() {
        true => Saved::default(),
        false => trace.gradients(&metric)?,
    };
    Ok((value, gradients))
}

fn print_gradients(metric: &str, value: f32, gradients: &Saved) {
    println!("metric {metric}: {value:.6}");
    for entry in gradients.iter() {
        let values = hookscope::host::f32_values(entry.to_data()).unwrap_or_default();
        let largest = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        println!(
            "  grad:{} {:?}  largest |gradient| {largest:.4e}",
            entry.key(),
            entry.shape()
        );
    }
}

/// Says on stderr which requested steps never ran because every row reached EOS early.
fn warn_of_steps_never_run(interventions: &Interventions, ran: usize, requested: usize) {
    let missed: Vec<String> = interventions
        .requests()
        .iter()
        .filter(|request| request.steps.overlaps(ran..requested))
        .map(|request| format!("{}@{}", request.site, request.steps))
        .collect();
    if let Some(first) = missed.first() {
        eprintln!(
            "warning: generation ended at EOS after {ran} of {requested} steps; steps \
             {ran}..{requested} never ran, so {first}{} saved or wrote nothing there",
            match missed.len() {
                1 => String::new(),
                n => format!(" and {} other request(s)", n - 1),
            }
        );
    }
}

/// Saved values above this size are announced before the run starts.
const LARGE_OUTPUT: usize = 1 << 30;

/// Estimates, from the shape table, what the requested saves will hold; says so on stderr when
/// it is large and refuses (unless `--force`) when it exceeds the memory available.
fn check_saved_size(
    args: &RunArgs,
    model: &Model,
    batch: &hookscope::Batch,
    interventions: &Interventions,
) -> Result<()> {
    let steps = args.generation.max_new_tokens.unwrap_or(1);
    let sizes = (batch.batch_size(), batch.len());
    let Some(bytes) = interventions.saved_bytes(model.layout(), sizes, steps)? else {
        return Err(Error::InvalidInput(
            "the saved values of this run would not fit in any memory (their size overflows)"
                .into(),
        ));
    };
    if bytes >= LARGE_OUTPUT {
        eprintln!(
            "note: the requested saves will hold about {} (at most; fewer if generation stops \
             early)",
            hookscope::error::human_bytes(bytes)
        );
    }
    if args.force {
        return Ok(());
    }
    hookscope::memory::ensure_fits(
        || "saving the requested sites".into(),
        bytes,
        "; save fewer sites or steps (e.g. `layers.*.layer_output@0`), or pass --force to try",
    )
}

/// Writes `{site}@{step}` for every saved value, `output_ids` and, for a padded batch,
/// `attention_mask` (both i64 `[B, len]`).
fn write_out(
    path: &std::path::Path,
    saved: &Saved,
    (ids, mask): (&Vec<Vec<u32>>, &Vec<Vec<bool>>),
) -> Result<()> {
    hookscope::output::write_safetensors(path, &report::saved_tensors(saved, ids, mask))
}

fn report_generation(model: &Model, args: &RunArgs, generation: &Generation) -> Result<()> {
    if args.json {
        let mut report = report::generation_json(model, &args.prompts, generation, args.top)?;
        report["out"] = json!(args.out);
        println!("{report:#}");
        return Ok(());
    }
    for (row, prompt) in args.prompts.iter().enumerate() {
        println!("{prompt}{}", report::continuation(model, generation, row)?);
    }
    if !generation.saved.is_empty() {
        let keep = match &args.out {
            Some(_) => "",
            None => " (add --out FILE.safetensors to keep them)",
        };
        println!(
            "saved {} values over {} steps{keep}:",
            generation.saved.len(),
            generation.steps
        );
        for line in saved_by_site(&generation.saved) {
            println!("  {line}");
        }
    }
    if let Some(path) = &args.out {
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// One line per saved site: its shape at each step, the middle steps elided past four.
fn saved_by_site(saved: &Saved) -> Vec<String> {
    let mut sites: Vec<(String, Vec<String>)> = Vec::new();
    let mut by_site: Vec<_> = saved.iter().collect();
    by_site.sort_by_key(|entry| (entry.site, entry.index.to_string(), entry.step));
    for entry in by_site {
        let name = format!("{}{}", entry.site, entry.index);
        let entry = format!("@{} {:?}", entry.step, entry.shape());
        match sites.last_mut() {
            Some((last, steps)) if *last == name => steps.push(entry),
            _ => sites.push((name, vec![entry])),
        }
    }
    sites
        .into_iter()
        .map(|(name, steps)| {
            let shown = match steps.len() {
                0..=4 => steps.join("  "),
                n => format!(
                    "{}  {}  ...  {} ({n} steps)",
                    steps[0],
                    steps[1],
                    steps[n - 1]
                ),
            };
            format!("{name}  {shown}")
        })
        .collect()
}

fn print_text(
    prompts: &[&str],
    trace: &Trace,
    top: &[Vec<report::Candidate>],
    out: Option<&PathBuf>,
) {
    for (prompt, candidates) in prompts.iter().zip(top) {
        println!("prompt: {prompt:?}");
        for candidate in candidates {
            println!(
                "  {:>8.4}  {:>6}  {:?}",
                candidate.probability, candidate.id, candidate.text
            );
        }
    }
    if !trace.saved.is_empty() {
        println!("saved {} values:", trace.saved.len());
        for entry in trace.saved.iter() {
            println!("  {} {:?}", entry.key(), entry.shape());
        }
    }
    if let Some(path) = out {
        println!("wrote {}", path.display());
    }
}

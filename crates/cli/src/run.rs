//! `hookscope run`: one forward trace with reads and writes of standard sites.

use std::path::PathBuf;

use clap::Args;
use hookscope_core::burn::tensor::TensorData;
use hookscope_core::hooks::{Action, Selection, Write};
use hookscope_core::{Error, Interventions, Model, Result, Steps, Trace};
use serde_json::json;

/// Arguments of `hookscope run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Model directory or cached hub id (default: the embedded tiny GPT-2).
    model: Option<String>,
    /// A prompt; repeat for a left-padded batch.
    #[arg(long = "prompt", required = true)]
    prompts: Vec<String>,
    /// Save the sites matching PATTERN (`*` wildcards), optionally `@STEPS`.
    #[arg(long, value_name = "PATTERN[@STEPS]")]
    save: Vec<String>,
    /// Zero the sites matching PATTERN, optionally `@STEPS`; the change flows on.
    #[arg(long, value_name = "PATTERN[@STEPS]")]
    zero: Vec<String>,
    /// Write saved values to this safetensors file (`{site}@{step}`, `output_ids`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print a JSON report instead of text.
    #[arg(long)]
    json: bool,
    /// How many most likely next tokens to print per prompt.
    #[arg(long, default_value_t = 5)]
    top: usize,
}

/// Runs the trace and reports it.
pub fn run(args: &RunArgs) -> Result<()> {
    let model = crate::load_model(args.model.as_deref())?;
    let prompts: Vec<&str> = args.prompts.iter().map(String::as_str).collect();
    let batch = model.encode(&prompts)?;
    let mut interventions = Interventions::new();
    for (specs, action) in [
        (&args.save, Action::Save),
        (&args.zero, Action::Write(Write::Zero)),
    ] {
        for spec in specs {
            let selection = Selection::parse(model.layout(), spec, Steps::At(0))?;
            if !selection.steps.contains(0) {
                return Err(Error::InvalidSteps(format!(
                    "{} (a single trace has only step 0)",
                    selection.steps
                )));
            }
            for site in selection.sites {
                interventions.push(site, Steps::At(0), action.clone());
            }
        }
    }
    let trace = model.trace(&batch, &interventions)?;
    let top = top_tokens(&model, &trace, args.top)?;
    if let Some(path) = &args.out {
        write_out(path, &trace)?;
    }
    if args.json {
        print_json(args, &trace, &top);
    } else {
        print_text(&prompts, &trace, &top, args.out.as_ref());
    }
    Ok(())
}

/// One candidate next token.
struct Candidate {
    id: usize,
    text: String,
    probability: f32,
}

fn top_tokens(model: &Model, trace: &Trace, k: usize) -> Result<Vec<Vec<Candidate>>> {
    let [_, vocab] = trace.next_token_probs.dims();
    let probs = trace
        .next_token_probs
        .to_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| Error::Backend(format!("{e:?}")))?;
    probs
        .chunks(vocab.max(1))
        .map(|row| {
            let mut ids: Vec<usize> = (0..row.len()).collect();
            ids.sort_by(|a, b| row[*b].total_cmp(&row[*a]));
            ids.into_iter()
                .take(k)
                .map(|id| {
                    let text = match model.tokenizer() {
                        Some(tokenizer) => tokenizer.decode(&[id as u32])?,
                        None => format!("<{id}>"),
                    };
                    Ok(Candidate {
                        id,
                        text,
                        probability: row[id],
                    })
                })
                .collect()
        })
        .collect()
}

fn write_out(path: &std::path::Path, trace: &Trace) -> Result<()> {
    let mut tensors: Vec<(String, TensorData)> = trace
        .saved
        .iter()
        .map(|(site, step, value)| (format!("{site}@{step}"), value.to_data()))
        .collect();
    let shape = [trace.batch.batch_size(), trace.batch.len()];
    let ids: Vec<i64> = trace
        .batch
        .ids
        .iter()
        .flatten()
        .map(|id| i64::from(*id))
        .collect();
    tensors.push(("output_ids".into(), TensorData::new(ids, shape)));
    if trace.batch.is_padded() {
        let mask: Vec<i64> = trace
            .batch
            .mask
            .iter()
            .flatten()
            .map(|m| i64::from(*m))
            .collect();
        tensors.push(("attention_mask".into(), TensorData::new(mask, shape)));
    }
    hookscope_core::output::write_safetensors(path, &tensors)
}

fn print_text(prompts: &[&str], trace: &Trace, top: &[Vec<Candidate>], out: Option<&PathBuf>) {
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
        for (site, step, value) in trace.saved.iter() {
            println!("  {site}@{step} {:?}", value.shape());
        }
    }
    if let Some(path) = out {
        println!("wrote {}", path.display());
    }
}

fn print_json(args: &RunArgs, trace: &Trace, top: &[Vec<Candidate>]) {
    let prompts: Vec<_> = args
        .prompts
        .iter()
        .zip(top)
        .zip(&trace.batch.ids)
        .map(|((prompt, candidates), ids)| {
            json!({
                "prompt": prompt,
                "input_ids": ids,
                "top_next_tokens": candidates.iter().map(|c| json!({
                    "id": c.id, "token": c.text, "probability": c.probability,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let saved: Vec<_> = trace
        .saved
        .iter()
        .map(|(site, step, value)| json!({"key": format!("{site}@{step}"), "shape": value.shape()}))
        .collect();
    let report = json!({"prompts": prompts, "saved": saved, "out": args.out});
    println!("{report:#}");
}

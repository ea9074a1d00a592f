//! `hookscope lens`: the logit lens, every layer's output read through the model's own final
//! norm and head, as a table of top tokens per layer and position, or JSON.

use clap::Args;
use hookscope::{Error, Interventions, Result};
use serde_json::json;

use hookscope::decoding::top_k;

use crate::tokens::{prompt_labels, token_text};

/// Arguments of `hookscope lens`.
#[derive(Debug, Args)]
pub struct LensArgs {
    #[command(flatten)]
    model: crate::model_arg::ModelArg,
    /// The prompt.
    #[arg(long)]
    prompt: String,
    /// Tokens shown per layer and position.
    #[arg(long, default_value_t = 1)]
    top_k: usize,
    /// Print JSON: `{"layers": [{"layer", "positions": [{"position", "top": [{"id", "token",
    /// "prob"}]}]}]}`.
    #[arg(long)]
    json: bool,
}

/// One layer's top tokens at every position: `[position][rank] = (id, text, prob)`.
type LayerTop = Vec<Vec<(usize, String, f32)>>;

/// Runs the lens and prints it.
pub fn lens(args: &LensArgs) -> Result<()> {
    if args.top_k == 0 {
        return Err(Error::InvalidInput("--top-k must be at least 1".into()));
    }
    let model = args.model.load()?;
    let batch = model.encode(&[args.prompt.as_str()])?;
    let lens = hookscope::analysis::logit_lens(&model, &batch, &Interventions::new())?;
    let mut layers: Vec<LayerTop> = Vec::with_capacity(lens.layers().min(1024));
    for layer in 0..lens.layers() {
        let probs = lens.probabilities(layer).ok_or_else(|| Error::NotServed {
            site: format!("layers.{layer}.layer_output"),
            step: 0,
        })?;
        let [_, _, vocab] = probs.dims();
        let values = hookscope::host::f32_values(probs.into_data())?;
        let positions = values
            .chunks(vocab.max(1))
            .map(|row| {
                top_k(row, args.top_k)
                    .into_iter()
                    .map(|(id, prob)| Ok((id, token_text(&model, id)?, prob)))
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        layers.push(positions);
    }
    let labels = prompt_labels(&model, &batch, 0)?;
    if args.json {
        print_json(&layers);
    } else {
        print_table(&labels, &layers);
    }
    Ok(())
}

fn print_json(layers: &[LayerTop]) {
    let layers: Vec<_> = layers
        .iter()
        .enumerate()
        .map(|(layer, positions)| {
            let positions: Vec<_> = positions
                .iter()
                .enumerate()
                .map(|(position, top)| {
                    let top: Vec<_> = top
                        .iter()
                        .map(|(id, token, prob)| json!({"id": id, "token": token, "prob": prob}))
                        .collect();
                    json!({"position": position, "top": top})
                })
                .collect();
            json!({"layer": layer, "positions": positions})
        })
        .collect();
    println!("{:#}", json!({ "layers": layers }));
}

/// Quoted, at most `width` characters.
fn cell(text: &str, width: usize) -> String {
    let quoted = format!("{text:?}");
    if quoted.chars().count() <= width {
        return quoted;
    }
    let kept: String = quoted.chars().take(width.saturating_sub(1)).collect();
    format!("{kept}…")
}

/// One line per layer, one column per position: the top token and its probability (more
/// tokens, under `--top-k`, on the following lines of the same layer).
fn print_table(labels: &[String], layers: &[LayerTop]) {
    const WIDTH: usize = 16;
    let header: String = labels
        .iter()
        .map(|label| format!("{:<WIDTH$}", cell(label, WIDTH - 1)))
        .collect();
    println!("{:<8}{header}", "layer");
    for (layer, positions) in layers.iter().enumerate() {
        let ranks = positions.iter().map(Vec::len).max().unwrap_or(0);
        for rank in 0..ranks {
            let name = if rank == 0 {
                layer.to_string()
            } else {
                String::new()
            };
            let line: String = positions
                .iter()
                .map(|top| match top.get(rank) {
                    Some((_, token, prob)) => {
                        let text = format!("{} {:.2}", cell(token, WIDTH - 6), prob);
                        format!("{text:<WIDTH$}")
                    }
                    None => " ".repeat(WIDTH),
                })
                .collect();
            println!("{name:<8}{}", line.trim_end());
        }
    }
}

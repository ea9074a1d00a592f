//! `hookscope attention`: one layer's attention patterns over a prompt, as a heatmap image with
//! token labels or a compact text view.

use std::path::PathBuf;

use clap::Args;
use hookscope::{Error, Interventions, Result, Run, SiteValue, Steps};

use crate::plot::{Palette, Panel, write_heatmaps};
use crate::tokens::prompt_labels;

/// Arguments of `hookscope attention`.
#[derive(Debug, Args)]
pub struct AttentionArgs {
    #[command(flatten)]
    model: crate::model_arg::ModelArg,
    /// The prompt.
    #[arg(long)]
    prompt: String,
    /// The layer (a softmax-attention layer).
    #[arg(long)]
    layer: usize,
    /// Show one head (default: every head).
    #[arg(long)]
    head: Option<usize>,
    /// Write a PNG heatmap (queries down, keys across) instead of the text view.
    #[arg(long, value_name = "FILE.png")]
    png: Option<PathBuf>,
}

/// Shades from no attention to all of it, for the text view.
const SHADES: [char; 10] = [' ', '.', ':', '-', '=', '+', '*', '#', '%', '@'];

/// Saves the layer's attention probabilities and shows them.
pub fn attention(args: &AttentionArgs) -> Result<()> {
    let model = args.model.load()?;
    let site = model.layout().resolve(&format!(
        "layers.{}.self_attn.attention_probabilities",
        args.layer
    ))?;
    let batch = model.encode(&[args.prompt.as_str()])?;
    let requests = Interventions::new().save(site, Steps::At(0));
    let run = Run::new()
        .interventions(&requests)
        .stop_after_last_request();
    let saved = model.trace(&batch, run)?.saved;
    let Some(SiteValue::Float4(probs)) = saved.get(site, 0) else {
        return Err(Error::NotServed {
            site: site.to_string(),
            step: 0,
        });
    };
    let [_, heads, queries, keys] = probs.dims();
    let values = hookscope::host::f32_values(probs.to_data())?;
    let shown: Vec<usize> = match args.head {
        Some(head) if head >= heads => {
            return Err(Error::InvalidInput(format!(
                "--head {head}: layer {} has {heads} heads (0..{heads})",
                args.layer
            )));
        }
        Some(head) => vec![head],
        None => (0..heads).collect(),
    };
    let labels = prompt_labels(&model, &batch, 0)?;
    let pattern = |head: usize| -> Vec<Vec<f32>> {
        (0..queries)
            .map(|q| values[(head * queries + q) * keys..][..keys].to_vec())
            .collect()
    };
    match &args.png {
        Some(path) => {
            let panels: Vec<Panel> = shown
                .iter()
                .map(|&head| Panel {
                    title: format!("layer {} head {head}", args.layer),
                    row_labels: labels.clone(),
                    column_labels: labels.clone(),
                    values: pattern(head),
                    range: (0.0, 1.0),
                    palette: Palette::Sequential,
                })
                .collect();
            write_heatmaps(path, &panels)?;
            println!("wrote {}", path.display());
        }
        None => {
            for head in shown {
                print_head(args.layer, head, &labels, &pattern(head));
            }
        }
    }
    Ok(())
}

/// The pattern as shaded characters, one line per query with its token, and each query's most
/// attended key.
fn print_head(layer: usize, head: usize, labels: &[String], pattern: &[Vec<f32>]) {
    println!("layer {layer} head {head} (rows: queries, columns: keys; ' ' = 0 .. '@' = 1)");
    let width = labels
        .iter()
        .map(|l| format!("{l:?}").len())
        .max()
        .unwrap_or(0);
    for (query, row) in pattern.iter().enumerate() {
        let shades: String = row
            .iter()
            .map(|p| SHADES[((p.clamp(0.0, 1.0) * 9.0).round()) as usize])
            .collect();
        let (top, prob) = row
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or((0, 0.0), |(k, p)| (k, *p));
        let label = labels
            .get(query)
            .map_or(String::new(), |l| format!("{l:?}"));
        let target = labels.get(top).map_or(String::new(), |l| format!("{l:?}"));
        println!("{query:>4} {label:<width$} |{shades}|  top: {top} {target} {prob:.2}");
    }
}

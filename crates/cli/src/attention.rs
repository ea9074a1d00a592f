//! `hookscope attention`: one layer's attention patterns over a prompt, as a heatmap image with
//! token labels or a compact text view.

use std::path::PathBuf;

use clap::Args;
use hookscope::analysis::attention_patterns;
use hookscope::report::prompt_labels;
use hookscope::{Error, Result};

use crate::plot::{Palette, Panel, write_heatmaps};

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
    let batch = model.encode(&[args.prompt.as_str()])?;
    let layers = attention_patterns(&model, &batch, Some(&[args.layer]))?;
    let Some(layer) = layers.first() else {
        return Err(Error::NotServed {
            site: format!("layers.{}.self_attn.attention_probabilities", args.layer),
            step: 0,
        });
    };
    let heads = layer.heads;
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
    match &args.png {
        Some(path) => {
            let panels: Vec<Panel> = shown
                .iter()
                .map(|&head| Panel {
                    title: format!("layer {} head {head}", args.layer),
                    row_labels: labels.clone(),
                    column_labels: labels.clone(),
                    values: layer.pattern(head),
                    range: (0.0, 1.0),
                    palette: Palette::Sequential,
                })
                .collect();
            write_heatmaps(path, &panels)?;
            println!("wrote {}", path.display());
        }
        None => {
            for head in shown {
                print_head(args.layer, head, &labels, &layer.pattern(head));
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

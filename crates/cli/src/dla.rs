//! `hookscope dla`: direct logit attribution. The last position's logit of a target token (or
//! its difference from another's) split into the embeddings, every head (or mixer) and MLP of
//! every block, and the final norm's and head's biases; a table, JSON, and a layer x head
//! heatmap.

use std::path::PathBuf;

use clap::Args;
use hookscope::analysis::{LogitAttribution, logit_attribution};
use hookscope::report::{attribution_json, single_token, token_text};
use hookscope::{Interventions, Result};
use serde_json::json;

use crate::plot::{Palette, Panel, write_heatmaps};

/// Arguments of `hookscope dla`.
#[derive(Debug, Args)]
pub struct DlaArgs {
    #[command(flatten)]
    model: crate::model_arg::ModelArg,
    /// The prompt; its last position is decomposed.
    #[arg(long)]
    prompt: String,
    /// The token whose logit is decomposed: text (one token, e.g. ` Paris`) or `#ID`.
    #[arg(long)]
    target: String,
    /// Decompose the target's logit minus this token's instead.
    #[arg(long, value_name = "TOKEN")]
    vs: Option<String>,
    /// Print JSON: `{"target", "versus", "logit", "embeddings", "layers": [{"layer",
    /// "mixer", "heads", "mixer_rest", "mlp"}], "final_norm_bias", "head_bias", "sum"}`.
    #[arg(long)]
    json: bool,
    /// Also write the heads' attributions as a layer x head heatmap.
    #[arg(long, value_name = "FILE.png")]
    png: Option<PathBuf>,
}

/// Runs the attribution and reports it.
pub fn dla(args: &DlaArgs) -> Result<()> {
    let model = args.model.load()?;
    let target = single_token(&model, &args.target)?;
    let versus = args
        .vs
        .as_deref()
        .map(|token| single_token(&model, token))
        .transpose()?;
    let batch = model.encode(&[args.prompt.as_str()])?;
    let attribution = logit_attribution(&model, &batch, target, versus, &Interventions::new())?;
    let label =
        |id: u32| -> Result<String> { Ok(format!("{:?}", token_text(&model, id as usize)?)) };
    let metric = match versus {
        Some(versus) => format!("logit {} - logit {}", label(target)?, label(versus)?),
        None => format!("logit {}", label(target)?),
    };
    if args.json {
        print_json(&attribution, args.png.as_ref());
    } else {
        print_table(&attribution, &metric);
    }
    if let Some(path) = &args.png {
        write_heatmaps(path, &[heads_panel(&attribution, &metric)])?;
        if !args.json {
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}

fn print_table(attribution: &LogitAttribution, metric: &str) {
    println!(
        "{metric} at the last position: {:.4} (before any final soft-cap)",
        attribution.logit
    );
    println!("{:<28} {:>10}", "part", "attribution");
    println!("{:<28} {:>10.4}", "embeddings", attribution.embeddings);
    for layer in &attribution.layers {
        let i = layer.layer;
        println!(
            "{:<28} {:>10.4}",
            format!("layers.{i} mixer"),
            layer.mixer.total
        );
        if let Some(heads) = &layer.mixer.heads {
            for (head, value) in heads.iter().enumerate() {
                println!("{:<28} {:>10.4}", format!("  head {head}"), value);
            }
        }
        if let Some(rest) = layer.mixer.rest {
            println!("{:<28} {:>10.4}", "  rest (bias, post-norm)", rest);
        }
        if let Some(mlp) = layer.mlp {
            println!("{:<28} {:>10.4}", format!("layers.{i} mlp"), mlp);
        }
    }
    println!(
        "{:<28} {:>10.4}",
        "final norm bias", attribution.final_norm_bias
    );
    println!("{:<28} {:>10.4}", "head bias", attribution.head_bias);
    println!("{:<28} {:>10.4}", "sum", attribution.sum());
}

fn print_json(attribution: &LogitAttribution, png: Option<&PathBuf>) {
    let mut report = attribution_json(attribution);
    report["png"] = json!(png);
    println!("{report:#}");
}

/// Layers down, heads across (a layer without heads, e.g. Mamba's, shows its mixer in the first
/// column), on a diverging scale symmetric around zero.
fn heads_panel(attribution: &LogitAttribution, metric: &str) -> Panel {
    let width = attribution
        .layers
        .iter()
        .map(|layer| layer.mixer.heads.as_ref().map_or(1, Vec::len))
        .max()
        .unwrap_or(1);
    let values: Vec<Vec<f32>> = attribution
        .layers
        .iter()
        .map(|layer| {
            let mut row = layer
                .mixer
                .heads
                .clone()
                .unwrap_or_else(|| vec![layer.mixer.total]);
            row.resize(width, f32::NAN);
            row
        })
        .collect();
    let largest = values
        .iter()
        .flatten()
        .filter(|v| v.is_finite())
        .fold(0.0f32, |m, v| m.max(v.abs()))
        .max(f32::MIN_POSITIVE);
    Panel {
        title: format!("direct logit attribution: {metric}"),
        row_labels: attribution
            .layers
            .iter()
            .map(|layer| format!("layer {}", layer.layer))
            .collect(),
        column_labels: (0..width).map(|head| format!("head {head}")).collect(),
        values,
        range: (-largest, largest),
        palette: Palette::Diverging,
    }
}

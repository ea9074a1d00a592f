//! `hookscope patch`: the activation-patching sweep. For every site matching a pattern and every
//! position, the corrupt prompt runs with that one value taken from the clean run; the metric is
//! reported normalised to 0 (corrupt) .. 1 (clean), as a table or JSON, and as a heatmap.

use std::path::PathBuf;

use clap::Args;
use hookscope::Result;
use hookscope::analysis::{PatchingSweep, activation_patching};
use hookscope::report::{self, patch_json, patch_labels};
use serde_json::json;

use crate::plot::{Palette, Panel, write_heatmaps};

/// Arguments of `hookscope patch`.
#[derive(Debug, Args)]
pub struct PatchArgs {
    #[command(flatten)]
    model: crate::model_arg::ModelArg,
    /// The clean prompt.
    #[arg(long)]
    clean: String,
    /// The corrupt prompt (same number of tokens).
    #[arg(long)]
    corrupt: String,
    /// The sites to patch (a pattern with a position axis, e.g. `layers.*.layer_output`).
    #[arg(long, value_name = "PATTERN")]
    site: String,
    /// `logit-diff:A,B` (logit of token A minus token B at the last position) or `prob:A`;
    /// tokens as text (one token each, e.g. ` Mary`) or `#ID`.
    #[arg(long)]
    metric: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write the sweep as a heatmap (sites down, positions across).
    #[arg(long, value_name = "FILE.png")]
    png: Option<PathBuf>,
}

/// Runs the sweep and reports it.
pub fn patch(args: &PatchArgs) -> Result<()> {
    let model = args.model.load()?;
    let metric = report::metric(&model, &args.metric)?;
    let sites = model.layout().expand(&args.site)?;
    let clean = model.encode(&[args.clean.as_str()])?;
    let corrupt = model.encode(&[args.corrupt.as_str()])?;
    let sweep = activation_patching(&model, &clean.ids[0], &corrupt.ids[0], &sites, metric)?;
    let labels = patch_labels(&model, &clean, &corrupt)?;
    if args.json {
        print_json(&sweep, &labels, &args.metric, args.png.as_ref());
    } else {
        print_table(&sweep, &labels);
    }
    if let Some(path) = &args.png {
        let panel = Panel {
            title: format!("activation patching: {}", args.metric),
            row_labels: sweep.sites.iter().map(ToString::to_string).collect(),
            column_labels: labels,
            values: sweep.scores.clone(),
            range: (-1.0, 1.0),
            palette: Palette::Diverging,
        };
        write_heatmaps(path, &[panel])?;
        if !args.json {
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}

fn print_json(sweep: &PatchingSweep, labels: &[String], metric: &str, png: Option<&PathBuf>) {
    let mut report = patch_json(sweep, labels, metric);
    report["png"] = json!(png);
    println!("{report:#}");
}

fn print_table(sweep: &PatchingSweep, labels: &[String]) {
    println!(
        "metric: clean {:.4}, corrupt {:.4}; scores: 0 = corrupt, 1 = clean",
        sweep.clean, sweep.corrupt
    );
    let width = sweep
        .sites
        .iter()
        .map(|s| s.to_string().len())
        .max()
        .unwrap_or(4);
    let header: String = labels
        .iter()
        .map(|label| {
            let shown: String = format!("{label:?}").chars().take(9).collect();
            format!("{shown:>10}")
        })
        .collect();
    println!("{:<width$}{header}", "site");
    for (site, scores) in sweep.sites.iter().zip(&sweep.scores) {
        let row: String = scores.iter().map(|s| format!("{s:>10.3}")).collect();
        println!("{:<width$}{row}", site.to_string());
    }
}

//! `hookscope patch`: the activation-patching sweep. For every site matching a pattern and every
//! position, the corrupt prompt runs with that one value taken from the clean run; the metric is
//! reported normalised to 0 (corrupt) .. 1 (clean), as a table or JSON, and as a heatmap.

use std::path::PathBuf;

use clap::Args;
use hookscope::Result;
use hookscope::analysis::{PatchingSweep, activation_patching};
use hookscope::report::{self, patch_json, patch_labels};
use serde_json::json;

use crate::scores::{ContrastArgs, ScoreTable};

/// Arguments of `hookscope patch`.
#[derive(Debug, Args)]
pub struct PatchArgs {
    #[command(flatten)]
    model: crate::model_arg::ModelArg,
    #[command(flatten)]
    contrast: ContrastArgs,
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
    let sites = model.layout().expand(&args.contrast.site)?;
    let clean = model.encode(&[args.contrast.clean.as_str()])?;
    let corrupt = model.encode(&[args.contrast.corrupt.as_str()])?;
    let sweep = activation_patching(&model, &clean.ids[0], &corrupt.ids[0], &sites, metric)?;
    let labels = patch_labels(&model, &clean, &corrupt)?;
    let table = ScoreTable {
        clean: sweep.clean,
        corrupt: sweep.corrupt,
        positions: &labels,
        rows: sweep
            .sites
            .iter()
            .map(ToString::to_string)
            .zip(sweep.scores.clone())
            .collect(),
    };
    if args.json {
        print_json(&sweep, &labels, &args.metric, args.png.as_ref());
    } else {
        table.print();
    }
    if let Some(path) = &args.png {
        table.write_png(path, format!("activation patching: {}", args.metric))?;
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

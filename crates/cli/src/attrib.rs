//! `hookscope attrib`: attribution patching, the first-order estimate of `hookscope patch`'s
//! sweep from one forward and one backward pass (or N, with integrated gradients), per site,
//! position and head; `--compare` also runs the exact sweep and says how well they agree.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use hookscope::analysis::{
    AttributionMethod, GradMetric, Metric, PromptPair, activation_patching, attribution_patching,
    correlation,
};
use hookscope::report::{attribution_patching_json, patch_json, patch_labels};
use hookscope::{Error, Result};
use serde_json::json;

use crate::scores::{ContrastArgs, ScoreTable};

/// Arguments of `hookscope attrib`.
#[derive(Debug, Args)]
pub struct AttribArgs {
    #[command(flatten)]
    model: crate::model_arg::ModelArg,
    #[command(flatten)]
    contrast: ContrastArgs,
    /// `logit-diff:A,B`, `logit:A`, `prob:A`, `logprob:A` (optional `@POS`) or `loss`; tokens as
    /// text (one token each) or `#ID`.
    #[arg(long)]
    metric: String,
    /// `atp`: the gradient at the corrupt run; `ig`: averaged over --steps points between the
    /// corrupt and clean embeddings.
    #[arg(long, value_enum, default_value_t = MethodArg::Atp)]
    method: MethodArg,
    /// Points on the path for `--method ig`.
    #[arg(long, default_value_t = 16)]
    steps: usize,
    /// Also run the exact activation-patching sweep (`logit-diff` and `prob` metrics at the
    /// last position) and print both and their correlation.
    #[arg(long)]
    compare: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write the estimates as a heatmap (rows down, positions across).
    #[arg(long, value_name = "FILE.png")]
    png: Option<PathBuf>,
}

/// The `--method` choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum MethodArg {
    Atp,
    Ig,
}

/// Runs the estimate (and the exact sweep with --compare) and reports it.
pub fn attrib(args: &AttribArgs) -> Result<()> {
    let (method, method_name) = match args.method {
        MethodArg::Atp => (AttributionMethod::Atp, "atp".to_string()),
        MethodArg::Ig => (
            AttributionMethod::IntegratedGradients { steps: args.steps },
            format!("ig ({} steps)", args.steps),
        ),
    };
    let model = args.model.load_for_gradients()?;
    let metric = GradMetric::parse(&model, &args.metric)?;
    let sites = model.layout().expand(&args.contrast.site)?;
    let clean = model.encode(&[args.contrast.clean.as_str()])?;
    let corrupt = model.encode(&[args.contrast.corrupt.as_str()])?;
    let (clean_ids, corrupt_ids) = (&clean.ids[0], &corrupt.ids[0]);
    let prompts = PromptPair {
        clean: clean_ids,
        corrupt: corrupt_ids,
    };
    let sweep = attribution_patching(&model, prompts, &sites, metric, method)?;
    let labels = patch_labels(&model, &clean, &corrupt)?;
    let label = |row: &hookscope::analysis::AttributionRow| match row.head {
        None => row.site.to_string(),
        Some(head) => format!("{} head {head}", row.site),
    };
    let table = ScoreTable {
        clean: sweep.clean,
        corrupt: sweep.corrupt,
        positions: &labels,
        rows: sweep
            .rows
            .iter()
            .map(|row| (label(row), row.scores.clone()))
            .collect(),
    };
    let mut report = attribution_patching_json(&sweep, &labels, &args.metric, &method_name);
    if args.compare {
        let exact = activation_patching(
            &model,
            clean_ids,
            corrupt_ids,
            &sites,
            patching_metric(metric)?,
        )?;
        let estimates: Vec<f32> = sweep
            .site_rows()
            .flat_map(|row| row.scores.clone())
            .collect();
        let exact_scores: Vec<f32> = exact.scores.iter().flatten().copied().collect();
        let r = correlation(&estimates, &exact_scores);
        if !args.json {
            println!("estimate ({method_name}):");
            table.print();
            println!("\nexact activation patching:");
            let exact_rows = exact.sites.iter().map(ToString::to_string);
            ScoreTable {
                clean: exact.clean,
                corrupt: exact.corrupt,
                positions: &labels,
                rows: exact_rows.zip(exact.scores.clone()).collect(),
            }
            .print();
            match r {
                Some(r) => println!("\ncorrelation of the estimate with the exact sweep: {r:.4}"),
                None => println!("\ncorrelation undefined: one of the sweeps is constant"),
            }
        }
        report["patching"] = patch_json(&exact, &labels, &args.metric);
        report["correlation"] = json!(r);
    } else if !args.json {
        table.print();
    }
    if args.json {
        report["png"] = json!(args.png);
        println!("{report:#}");
    }
    if let Some(path) = &args.png {
        let title = format!("attribution patching ({method_name}): {}", args.metric);
        table.write_png(path, title)?;
        if !args.json {
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// The exact sweep's metric for a gradient metric at the last position.
fn patching_metric(metric: GradMetric) -> Result<Metric> {
    match metric {
        GradMetric::LogitDiff { a, b, position: -1 } => Ok(Metric::LogitDiff {
            correct: a,
            wrong: b,
        }),
        GradMetric::Probability {
            token,
            position: -1,
        } => Ok(Metric::Probability { token }),
        _ => Err(Error::InvalidInput(
            "--compare runs `hookscope patch`, which measures `logit-diff:A,B` or `prob:A` at \
             the last position"
                .into(),
        )),
    }
}

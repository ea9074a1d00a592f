//! `hookscope features`: for every dictionary attached with `--sae`, the most active features
//! at each token of a prompt, and the dictionary's L0 and reconstruction error on it.

use clap::Args;
use hookscope::analysis::{FeatureReport, feature_report};
use hookscope::report::{features_json, prompt_labels};
use hookscope::{Error, Result};

/// Arguments of `hookscope features`.
#[derive(Debug, Args)]
pub struct FeaturesArgs {
    #[command(flatten)]
    model: crate::model_arg::ModelArg,
    /// The prompt.
    #[arg(long)]
    prompt: String,
    /// Features shown per token (the most active ones).
    #[arg(long, default_value_t = 5)]
    top_k: usize,
    /// Print JSON: `{"dictionaries": [{"site", "path", "width", "l0", "mse",
    /// "fraction_unexplained", "tokens": [{"position", "token", "features": [{"index",
    /// "activation"}]}]}]}`.
    #[arg(long)]
    json: bool,
}

/// Runs the prompt and prints the features.
pub fn features(args: &FeaturesArgs) -> Result<()> {
    if args.top_k == 0 {
        return Err(Error::InvalidInput("--top-k must be at least 1".into()));
    }
    let model = args.model.load()?;
    let batch = model.encode(&[args.prompt.as_str()])?;
    let reports = feature_report(&model, &batch, args.top_k)?;
    let labels = prompt_labels(&model, &batch, 0)?;
    match args.json {
        true => println!("{}", features_json(&reports, &labels)),
        false => print_table(&reports, &labels),
    }
    Ok(())
}

fn print_table(reports: &[FeatureReport], labels: &[String]) {
    for report in reports {
        println!(
            "{} ({} features, {}): L0 {:.1}, MSE {:.4}, variance unexplained {:.3}",
            report.site,
            report.width,
            report.path.display(),
            report.l0,
            report.mse,
            report.fraction_unexplained
        );
        for (position, (top, token)) in report.top.iter().zip(labels).enumerate() {
            let features: Vec<String> = top
                .iter()
                .map(|(index, activation)| format!("{index}:{activation:.3}"))
                .collect();
            println!("{position:>5} {token:<16} {}", features.join("  "));
        }
    }
}

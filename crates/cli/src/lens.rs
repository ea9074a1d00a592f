//! `hookscope lens`: the logit lens, every layer's output read through the model's own final
//! norm and head, as a table of top tokens per layer and position, or JSON.

use clap::Args;
use hookscope::report::{self, LensLayer};
use hookscope::{Error, Result};

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

/// Runs the lens and prints it.
pub fn lens(args: &LensArgs) -> Result<()> {
    if args.top_k == 0 {
        return Err(Error::InvalidInput("--top-k must be at least 1".into()));
    }
    let model = args.model.load()?;
    let batch = model.encode(&[args.prompt.as_str()])?;
    let layers = report::lens_top(&model, &batch, args.top_k)?;
    if args.json {
        println!("{:#}", report::lens_json(&layers));
    } else {
        print_table(&report::prompt_labels(&model, &batch, 0)?, &layers);
    }
    Ok(())
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
fn print_table(labels: &[String], layers: &[LensLayer]) {
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
                    Some(candidate) => {
                        let token = &candidate.text;
                        let text =
                            format!("{} {:.2}", cell(token, WIDTH - 6), candidate.probability);
                        format!("{text:<WIDTH$}")
                    }
                    None => " ".repeat(WIDTH),
                })
                .collect();
            println!("{name:<8}{}", line.trim_end());
        }
    }
}

//! `hookscope sites`: the shape table of one model.

use clap::Args;
use hookscope::schema::CallDims;

/// Arguments of `hookscope sites`.
#[derive(Debug, Args)]
pub struct SitesArgs {
    #[command(flatten)]
    model: crate::model_arg::ModelArg,
    /// Prompt length used to resolve the shapes.
    #[arg(long, default_value_t = 10)]
    prompt_len: usize,
    /// Batch size used to resolve the shapes.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// The decode step shown beside the prompt call.
    #[arg(long, default_value_t = 1)]
    step: usize,
    /// Print the schema's tables for every mixer kind as Markdown (as `docs/SCHEMA.md` holds
    /// them) instead of one model's sites.
    #[arg(long, conflicts_with = "model")]
    markdown: bool,
}

/// Prints every site in call order with its symbolic and concrete shapes.
pub fn sites(args: &SitesArgs) -> hookscope::Result<()> {
    if args.markdown {
        print!("{}", hookscope::schema::markdown());
        return Ok(());
    }
    let step = args.step.max(1);
    if args.prompt_len.checked_add(step).is_none() {
        return Err(hookscope::Error::InvalidInput(format!(
            "--prompt-len {} plus --step {step} overflows",
            args.prompt_len
        )));
    }
    let model = args.model.load()?;
    let layout = model.layout();
    let prompt = CallDims::at_step(args.batch, args.prompt_len, 0);
    let decode = CallDims::at_step(args.batch, args.prompt_len, args.step.max(1));
    println!(
        "{:<46} {:<16} {:<22} step {}",
        "site",
        "shape",
        "step 0",
        args.step.max(1)
    );
    for site in layout.call_order() {
        println!(
            "{:<46} {:<16} {:<22} {:?}",
            site.to_string(),
            layout.symbolic_shape(site)?.to_string(),
            format!("{:?}", layout.shape(site, prompt)?),
            layout.shape(site, decode)?
        );
    }
    Ok(())
}

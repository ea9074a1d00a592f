//! Activation patching's report (`hookscope patch --json`, `POST /v1/patch`), and the metric a
//! sweep measures, read from `logit-diff:A,B` or `prob:A`.

use hookscope_core::{Batch, Error, Model, Result};
use serde_json::{Value, json};

use super::{prompt_labels, single_token};
use crate::analysis::{AttributionRow, AttributionSweep, Metric, PatchingSweep};

/// `logit-diff:A,B` (logit of A minus logit of B at the last position) or `prob:A`, tokens as
/// text (one token each, e.g. ` Mary`) or `#ID`.
pub fn metric(model: &Model, text: &str) -> Result<Metric> {
    let invalid = || {
        Error::InvalidInput(format!(
            "metric `{text}`: expected `logit-diff:A,B` or `prob:A` (tokens as text or `#ID`)"
        ))
    };
    let (kind, tokens) = text.split_once(':').ok_or_else(invalid)?;
    match kind {
        "logit-diff" => {
            let (a, b) = tokens.split_once(',').ok_or_else(invalid)?;
            Ok(Metric::LogitDiff {
                correct: single_token(model, a)?,
                wrong: single_token(model, b)?,
            })
        }
        "prob" => Ok(Metric::Probability {
            token: single_token(model, tokens)?,
        }),
        _ => Err(invalid()),
    }
}

/// Each position's label: its token, or `clean/corrupt` where the two prompts differ there.
pub fn patch_labels(model: &Model, clean: &Batch, corrupt: &Batch) -> Result<Vec<String>> {
    let clean = prompt_labels(model, clean, 0)?;
    let corrupt = prompt_labels(model, corrupt, 0)?;
    Ok(corrupt
        .iter()
        .zip(&clean)
        .map(|(corrupt, clean)| match corrupt == clean {
            true => corrupt.clone(),
            false => format!("{clean}/{corrupt}"),
        })
        .collect())
}

/// `{"metric", "clean", "corrupt", "positions", "sites": [{"site", "scores"}]}`: the metric on
/// both runs and each site's normalised score per position (0 corrupt, 1 clean).
pub fn patch_json(sweep: &PatchingSweep, labels: &[String], metric: &str) -> Value {
    let sites: Vec<Value> = sweep
        .sites
        .iter()
        .zip(&sweep.scores)
        .map(|(site, scores)| json!({"site": site.to_string(), "scores": scores}))
        .collect();
    json!({
        "metric": metric,
        "clean": sweep.clean,
        "corrupt": sweep.corrupt,
        "positions": labels,
        "sites": sites,
    })
}

/// Attribution patching's report (`hookscope attrib --json`): patching's shape (`sites`, one
/// row per site) with the method and, for head-indexed sites, `heads` (`{"site", "head",
/// "scores"}`).
pub fn attribution_patching_json(
    sweep: &AttributionSweep,
    labels: &[String],
    metric: &str,
    method: &str,
) -> Value {
    let row = |row: &AttributionRow| match row.head {
        None => json!({"site": row.site.to_string(), "scores": row.scores}),
        Some(head) => json!({"site": row.site.to_string(), "head": head, "scores": row.scores}),
    };
    let (heads, sites): (Vec<&AttributionRow>, Vec<&AttributionRow>) =
        sweep.rows.iter().partition(|r| r.head.is_some());
    json!({
        "metric": metric,
        "method": method,
        "clean": sweep.clean,
        "corrupt": sweep.corrupt,
        "positions": labels,
        "sites": sites.into_iter().map(row).collect::<Vec<_>>(),
        "heads": heads.into_iter().map(row).collect::<Vec<_>>(),
    })
}

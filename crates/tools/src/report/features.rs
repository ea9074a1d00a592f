//! The attached dictionaries' report (`hookscope features --json`, `POST /v1/features`).

use serde_json::{Value, json};

use crate::analysis::FeatureReport;

/// `{"dictionaries": [{"site", "path", "width", "l0", "mse", "fraction_unexplained", "tokens":
/// [{"position", "token", "features": [{"index", "activation"}]}]}]}`, `labels` naming each
/// position's token.
pub fn features_json(reports: &[FeatureReport], labels: &[String]) -> Value {
    let dictionaries: Vec<Value> = reports
        .iter()
        .map(|report| {
            let tokens: Vec<Value> = report
                .top
                .iter()
                .zip(labels)
                .enumerate()
                .map(|(position, (top, token))| {
                    let features: Vec<Value> = top
                        .iter()
                        .map(
                            |(index, activation)| json!({"index": index, "activation": activation}),
                        )
                        .collect();
                    json!({"position": position, "token": token, "features": features})
                })
                .collect();
            json!({
                "site": report.site.to_string(),
                "path": report.path.display().to_string(),
                "width": report.width,
                "l0": report.l0,
                "mse": report.mse,
                "fraction_unexplained": report.fraction_unexplained,
                "tokens": tokens,
            })
        })
        .collect();
    json!({ "dictionaries": dictionaries })
}

//! Direct logit attribution's report (`hookscope dla --json`, `POST /v1/dla`).

use serde_json::{Value, json};

use crate::analysis::LogitAttribution;

/// `{"target", "versus", "logit", "embeddings", "layers": [{"layer", "mixer", "heads",
/// "mixer_rest", "mlp"}], "final_norm_bias", "head_bias", "sum"}`.
pub fn attribution_json(attribution: &LogitAttribution) -> Value {
    let layers: Vec<Value> = attribution
        .layers
        .iter()
        .map(|layer| {
            json!({
                "layer": layer.layer,
                "mixer": layer.mixer.total,
                "heads": layer.mixer.heads,
                "mixer_rest": layer.mixer.rest,
                "mlp": layer.mlp,
            })
        })
        .collect();
    json!({
        "target": attribution.target,
        "versus": attribution.versus,
        "logit": attribution.logit,
        "embeddings": attribution.embeddings,
        "layers": layers,
        "final_norm_bias": attribution.final_norm_bias,
        "head_bias": attribution.head_bias,
        "sum": attribution.sum(),
    })
}

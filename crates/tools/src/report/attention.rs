//! The attention patterns' report (`POST /v1/attention`).

use serde_json::{Value, json};

use crate::analysis::AttentionLayer;

/// `{"tokens", "layers": [{"layer", "heads": [[[probability; keys]; queries]; heads]}]}`.
pub fn attention_json(layers: &[AttentionLayer], labels: &[String]) -> Value {
    let layers: Vec<Value> = layers
        .iter()
        .map(|layer| {
            let heads: Vec<Vec<Vec<f32>>> = (0..layer.heads).map(|h| layer.pattern(h)).collect();
            json!({"layer": layer.layer, "heads": heads})
        })
        .collect();
    json!({"tokens": labels, "layers": layers})
}

//! What one request may ask of the server, checked before any work starts.

use std::time::Duration;

/// The server's limits; each refusal is a 4xx naming the limit and the field at fault.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Largest request body, in bytes.
    pub body_bytes: usize,
    /// Most prompts in one request (the batch).
    pub prompts: usize,
    /// Most tokens in one prompt.
    pub prompt_tokens: usize,
    /// Most new tokens a generation may ask for.
    pub new_tokens: usize,
    /// Most bytes the saved values of one request may hold (the shape table's estimate).
    pub saved_bytes: usize,
    /// Most saved elements a JSON answer carries (a larger one is asked as safetensors).
    pub json_values: usize,
    /// Most patched runs (sites x positions) one patching sweep may make.
    pub patch_rows: usize,
    /// Longest a request may take, from its first byte to its answer, queueing included.
    pub request_time: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            body_bytes: 8 << 20,
            prompts: 32,
            prompt_tokens: 2048,
            new_tokens: 512,
            saved_bytes: 512 << 20,
            json_values: 1 << 20,
            patch_rows: 8192,
            request_time: Duration::from_secs(120),
        }
    }
}

impl Limits {
    /// As JSON, for `GET /v1/model`.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "body_bytes": self.body_bytes,
            "prompts": self.prompts,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "saved_bytes": self.saved_bytes,
            "json_values": self.json_values,
            "patch_rows": self.patch_rows,
            "request_seconds": self.request_time.as_secs_f64(),
        })
    }
}

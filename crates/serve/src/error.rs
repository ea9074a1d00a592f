//! Answers to requests that cannot be served: a status and `{"error": MESSAGE}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// A refused or failed request.
#[derive(Debug, Clone)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    /// A request the client must change (400).
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// A request over one of the server's limits (413).
    pub fn too_large(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, message)
    }

    /// A request with `status`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

impl From<hookscope::Error> for ApiError {
    /// The library's errors are the request's fault (an unknown site, a bad index, a prompt
    /// out of the vocabulary), except an interrupted run, which ran out of time.
    fn from(error: hookscope::Error) -> Self {
        match error {
            hookscope::Error::Interrupted { .. } => ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "the request ran past the server's time limit",
            ),
            other => ApiError::bad_request(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({"error": self.message}))).into_response()
    }
}

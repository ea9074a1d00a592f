//! Bearer-token authentication, compared in constant time.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::Server;
use crate::error::ApiError;

/// Lets a request through when the server has no token or the request carries it as
/// `Authorization: Bearer TOKEN`; answers 401 otherwise.
pub(crate) async fn require_token(
    State(server): State<Arc<Server>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = &server.token else {
        return next.run(request).await;
    };
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    match given {
        Some(given) if bool::from(given.as_bytes().ct_eq(token.as_bytes())) => {
            next.run(request).await
        }
        Some(_) => ApiError::new(StatusCode::UNAUTHORIZED, "wrong bearer token").into_response(),
        None => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "this server requires `Authorization: Bearer TOKEN`",
        )
        .into_response(),
    }
}

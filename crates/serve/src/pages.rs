//! The browser view at `/`: a page, its script and its style, compiled into the binary (no
//! network, no CDN). They hold no model data, so they are served without the token; the page
//! asks for it when the API answers 401.

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

/// Only this server's own files, scripts and connections.
const CONTENT_SECURITY_POLICY: &str =
    "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:";

/// `/`, `/app.js` and `/style.css`.
pub(crate) fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/",
            get(|| page(include_str!("../web/index.html"), "text/html")),
        )
        .route(
            "/app.js",
            get(|| page(include_str!("../web/app.js"), "text/javascript")),
        )
        .route(
            "/style.css",
            get(|| page(include_str!("../web/style.css"), "text/css")),
        )
}

async fn page(body: &'static str, kind: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, format!("{kind}; charset=utf-8")),
            (
                header::CONTENT_SECURITY_POLICY,
                CONTENT_SECURITY_POLICY.to_string(),
            ),
        ],
        body,
    )
}

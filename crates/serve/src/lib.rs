//! # hookscope-serve
//!
//! A loaded model behind a local HTTP API (`hookscope serve`): the model is loaded once and
//! every request is the CLI's language as JSON (prompts, generation options, `save` / `zero` /
//! `add` / `set` with inline operands). No code crosses the wire and no request names a file on
//! the server. Saved values come back in the JSON answer or, for large ones, as a safetensors
//! file (binary, never base64).
//!
//! | endpoint | what |
//! | --- | --- |
//! | `GET /` | the browser view: generation, attention, the lens, patching, features |
//! | `GET /v1/model` | the model: architecture, sizes, attached dictionaries, the limits |
//! | `GET /v1/sites?prompt_len=N&step=S&batch=B` | every site in call order with its shapes |
//! | `POST /v1/run` | a trace or a generation ([`RunRequest`]) |
//! | `POST /v1/lens` | the logit lens on one prompt ([`LensRequest`]), as `hookscope lens --json` |
//! | `POST /v1/attention` | attention patterns per layer and head ([`AttentionRequest`]) |
//! | `POST /v1/features` | the attached dictionaries' features per token ([`FeaturesRequest`]) |
//! | `POST /v1/dla` | direct logit attribution ([`DlaRequest`]), as `hookscope dla --json` |
//! | `POST /v1/patch` | the activation-patching sweep ([`PatchRequest`]), as `hookscope patch --json` |
//!
//! Requests run one at a time, in the order they arrive (the CPU kernels use every core), except
//! that traces waiting together share one call where their requests allow it (see
//! `batching`: the same reads and writes, prompts of the same padded length); each
//! is bounded by [`Limits`] before any work starts, and a request past its time limit is
//! answered 408 and its generation stopped at the next step. A server bound to anything but a
//! loopback address requires a bearer token, compared in constant time.

mod analyses;
mod analysis_request;
mod auth;
mod batching;
mod error;
mod limits;
mod pages;
mod request;
mod routes;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use hookscope::Model;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

pub use analysis_request::{
    AttentionRequest, DlaRequest, FeaturesRequest, LensRequest, PatchRequest,
};
pub use batching::BATCH_HEADER;
pub use error::ApiError;
pub use limits::Limits;
pub use request::{Format, RunRequest, Write};

/// What `hookscope serve` is asked for.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Where to listen.
    pub addr: SocketAddr,
    /// The bearer token every request must carry; required off loopback.
    pub token: Option<String>,
    /// What one request may ask.
    pub limits: Limits,
}

impl ServeOptions {
    /// Refuses a server reachable from other machines without a token, or with an empty one.
    pub fn check(&self) -> Result<(), String> {
        match &self.token {
            Some(token) if token.is_empty() => Err("--token is empty".into()),
            None if !self.addr.ip().is_loopback() => Err(format!(
                "{} is reachable from other machines: give --token TOKEN, which every request \
                 must then carry as `Authorization: Bearer TOKEN`",
                self.addr
            )),
            _ => Ok(()),
        }
    }
}

/// The state every request shares.
pub(crate) struct Server {
    pub(crate) model: Model,
    pub(crate) limits: Limits,
    pub(crate) token: Option<String>,
    /// One permit: the model runs one call at a time, first come first served.
    pub(crate) queue: Arc<Semaphore>,
    /// Traces waiting for the model, which may share one call.
    pub(crate) batcher: batching::Batcher,
}

/// The API's routes over `model`, with its limits and token.
pub fn router(model: Model, token: Option<String>, limits: Limits) -> axum::Router {
    routes::router(Arc::new(Server {
        model,
        limits,
        token,
        queue: Arc::new(Semaphore::new(1)),
        batcher: batching::Batcher::default(),
    }))
}

/// Serves `router` on `listener` until `shutdown` completes, then finishes the requests in
/// flight.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Runs the server for `model` as `options` say, until SIGINT or SIGTERM; `ready` is told the
/// address it listens on.
pub fn run(
    model: Model,
    options: ServeOptions,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), String> {
    options.check()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the server's runtime: {e}"))?;
    runtime.block_on(async move {
        let listener = TcpListener::bind(options.addr)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", options.addr))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        ready(addr);
        let router = router(model, options.token, options.limits);
        serve(listener, router, stop_signal())
            .await
            .map_err(|e| format!("the server stopped: {e}"))
    })
}

/// Completes on SIGINT or SIGTERM.
async fn stop_signal() {
    let interrupt = tokio::signal::ctrl_c();
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(_) => {
                let _ = interrupt.await;
                return;
            }
        };
    tokio::select! {
        _ = interrupt => {}
        _ = terminate.recv() => {}
    }
}

//! The endpoints, and the layers every request passes: the body limit, the time limit and the
//! token.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hookscope::burn::tensor::{DType, TensorData};
use hookscope::schema::CallDims;
use hookscope::{Run, Trace, report};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::Server;
use crate::auth::require_token;
use crate::batching::run_group;
use crate::error::ApiError;
use crate::request::{Format, RunRequest};
use crate::{analyses, pages};

/// The API version in every path.
const VERSION: u32 = 1;

/// The routes over `server`.
pub(crate) fn router(server: Arc<Server>) -> Router {
    let api = Router::new()
        .route("/v1/model", get(model))
        .route("/v1/sites", get(sites))
        .route("/v1/run", post(run))
        .route("/v1/lens", post(analyses::lens))
        .route("/v1/attention", post(analyses::attention))
        .route("/v1/features", post(analyses::features))
        .route("/v1/dla", post(analyses::dla))
        .route("/v1/patch", post(analyses::patch))
        .fallback(|| async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "no such endpoint: /v1/model, /v1/sites, /v1/run, /v1/lens, /v1/attention, \
                 /v1/features, /v1/dla and /v1/patch are served",
            )
        })
        .layer(middleware::from_fn_with_state(
            server.clone(),
            require_token,
        ));
    Router::new()
        .merge(pages::router())
        .merge(api)
        .layer(middleware::from_fn_with_state(server.clone(), time_limit))
        .layer(DefaultBodyLimit::max(server.limits.body_bytes))
        .with_state(server)
}

/// Answers 408 when a request (reading its body, waiting its turn and running) outlasts the
/// server's time limit; dropping the request stops its run (see [`Cancel`]).
async fn time_limit(State(server): State<Arc<Server>>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(server.limits.request_time, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request took over the server's limit of {} s",
                server.limits.request_time.as_secs_f64()
            ),
        )
        .into_response(),
    }
}

/// `GET /v1/model`.
async fn model(State(server): State<Arc<Server>>) -> Json<Value> {
    let model = &server.model;
    let layout = model.layout();
    let dictionaries: Vec<Value> = layout
        .dictionaries
        .iter()
        .zip(model.dictionaries())
        .map(|(placement, attached)| {
            json!({
                "site": placement.site.to_string(),
                "input": placement.input.to_string(),
                "features": placement.features,
                "source": attached.dictionary.source().display().to_string(),
            })
        })
        .collect();
    Json(json!({
        "api_version": VERSION,
        "architecture": model.architecture().name,
        "layers": layout.layers.len(),
        "hidden": layout.hidden,
        "vocab": layout.vocab,
        "dtype": model.dtype().to_string(),
        "tokenizer": model.tokenizer().is_some(),
        "dictionaries": dictionaries,
        "limits": server.limits.to_json(),
    }))
}

/// `GET /v1/sites`'s query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SitesQuery {
    #[serde(default = "ten")]
    prompt_len: usize,
    #[serde(default = "one")]
    step: usize,
    #[serde(default = "one")]
    batch: usize,
}

fn ten() -> usize {
    10
}

fn one() -> usize {
    1
}

/// `GET /v1/sites`: every site in call order as Python's `Model.sites` lists it: `{"name",
/// "shape", "step0", "decode"}`, the symbolic shape and the shapes at the prompt call and at
/// decode step `step`.
async fn sites(
    State(server): State<Arc<Server>>,
    query: Result<Query<SitesQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let limits = &server.limits;
    if query.prompt_len > limits.prompt_tokens
        || query.batch > limits.prompts
        || query.step > limits.new_tokens
    {
        return Err(ApiError::bad_request(format!(
            "`prompt_len`, `batch` and `step` are at most {}, {} and {} here",
            limits.prompt_tokens, limits.prompts, limits.new_tokens
        )));
    }
    let step = query.step.max(1);
    let layout = server.model.layout();
    let prompt = CallDims::at_step(query.batch, query.prompt_len, 0);
    let decode = CallDims::at_step(query.batch, query.prompt_len, step);
    let sites = layout
        .call_order()
        .into_iter()
        .map(|site| {
            Ok(json!({
                "name": site.to_string(),
                "shape": layout.symbolic_shape(site)?.to_string(),
                "step0": layout.shape(site, prompt)?,
                "decode": layout.shape(site, decode)?,
            }))
        })
        .collect::<hookscope::Result<Vec<_>>>()?;
    Ok(Json(json!({"step": step, "sites": sites})))
}

/// Sets its flag when dropped: a request dropped before its run ends (past its time limit, or
/// its client gone) stops that run at its next step.
struct Cancel(Arc<AtomicBool>);

impl Drop for Cancel {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// `POST /v1/run`: a generation waits its turn alone; a trace may share its call with other
/// traces waiting (see [`crate::batching`]).
async fn run(
    State(server): State<Arc<Server>>,
    body: Result<Json<RunRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let request = analyses::body(body)?;
    match request.max_new_tokens {
        Some(_) => {
            queued(server, move |server, cancelled| {
                generate(server, &request, cancelled)
            })
            .await
        }
        None => batched_trace(server, request).await,
    }
}

/// A trace: checked now, then queued with the traces that can share its call; run by whichever
/// of them gets the model first.
async fn batched_trace(server: Arc<Server>, request: RunRequest) -> Result<Response, ApiError> {
    let prepared = request.prepare(&server.model, &server.limits)?;
    if !prepared.interventions.rows_independent() {
        return queued(server, move |server, _cancelled| {
            let run = Run::new().interventions(&prepared.interventions);
            let trace = server.model.trace(&prepared.batch, run)?;
            trace_answer(server, &request, &prepared.prompts, &trace)
        })
        .await;
    }
    let (id, mut answered) = server.batcher.enqueue(request, prepared);
    let _leave = LeaveQueue(server.clone(), id);
    let lost = |_| Err(internal_error());
    tokio::select! {
        biased;
        answer = &mut answered => answer.unwrap_or_else(lost),
        permit = server.queue.clone().acquire_owned() => {
            let permit = permit.map_err(|_| stopping())?;
            let Some(group) = server.batcher.take_group(id, &server.limits) else {
                // Another trace's call took this one: its answer is on the way.
                drop(permit);
                return answered.await.unwrap_or_else(lost);
            };
            let worker = server.clone();
            let work = tokio::task::spawn_blocking(move || {
                let _permit = permit;
                run_group(&worker, group, |request, prompts, trace| {
                    trace_answer(&worker, request, prompts, trace)
                })
            });
            work.await.map_err(|_| internal_error())?
        }
    }
}

/// Takes a trace out of the queue when its request is dropped before its call took it.
struct LeaveQueue(Arc<Server>, u64);

impl Drop for LeaveQueue {
    fn drop(&mut self) {
        self.0.batcher.leave(self.1);
    }
}

fn stopping() -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is stopping")
}

fn internal_error() -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the run failed inside the server",
    )
}

/// Runs `work` on the model when its turn comes (one request at a time, in arrival order), on
/// a blocking thread, which holds the model until `work` ends even if the request is dropped
/// meanwhile; `work` is told when it is (see [`Cancel`]).
pub(crate) async fn queued(
    server: Arc<Server>,
    work: impl FnOnce(&Server, &AtomicBool) -> Result<Response, ApiError> + Send + 'static,
) -> Result<Response, ApiError> {
    let permit = server
        .queue
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| stopping())?;
    let cancelled = Arc::new(AtomicBool::new(false));
    let _cancel = Cancel(cancelled.clone());
    let worker = server.clone();
    let answer = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        work(&worker, &cancelled)
    });
    answer.await.map_err(|_| internal_error())?
}

/// Runs one generation on the model, then its answer.
fn generate(
    server: &Server,
    request: &RunRequest,
    cancelled: &AtomicBool,
) -> Result<Response, ApiError> {
    let model = &server.model;
    let prepared = request.prepare(model, &server.limits)?;
    let mut interrupted = |_step: usize| cancelled.load(Ordering::Relaxed);
    let run = Run::new()
        .interventions(&prepared.interventions)
        .interrupt_when(&mut interrupted);
    let config = prepared.generation.as_ref().ok_or_else(internal_error)?;
    let generation = model.generate(&prepared.batch, run, config)?;
    let report = report::generation_json(model, &prepared.prompts, &generation, request.top)?;
    let ids = (&generation.output_ids, &generation.attention_mask);
    let tensors = report::saved_tensors(&generation.saved, ids.0, ids.1);
    answer(server, request.format, report, &tensors)
}

/// A trace's answer: its report and saved values in the request's format.
pub(crate) fn trace_answer(
    server: &Server,
    request: &RunRequest,
    prompts: &[String],
    trace: &Trace,
) -> Result<Response, ApiError> {
    let report = report::trace_json(&server.model, prompts, trace, request.top)?;
    let batch = &trace.batch;
    let tensors = report::saved_tensors(&trace.saved, &batch.ids, &batch.mask);
    answer(server, request.format, report, &tensors)
}

fn answer(
    server: &Server,
    format: Format,
    report: Value,
    tensors: &[(String, TensorData)],
) -> Result<Response, ApiError> {
    match format {
        Format::Json => json_answer(report, tensors, server.limits.json_values),
        Format::Safetensors => safetensors_answer(&report, tensors),
    }
}

/// The report with every saved value (and `output_ids`) under `values`, as
/// `{"shape", "dtype", "data"}`, where they hold at most `limit` elements.
fn json_answer(
    mut report: Value,
    tensors: &[(String, TensorData)],
    limit: usize,
) -> Result<Response, ApiError> {
    let elements: usize = tensors.iter().map(|(_, data)| data.num_elements()).sum();
    if elements > limit {
        return Err(ApiError::too_large(format!(
            "the saved values hold {elements} numbers; a JSON answer carries at most {limit}: \
             ask `\"format\": \"safetensors\"`"
        )));
    }
    let mut values = serde_json::Map::new();
    for (name, data) in tensors {
        let (dtype, numbers) = match data.dtype() {
            DType::F32 => ("f32", data.try_to_vec::<f32>().map(|v| json!(v))),
            _ => ("i64", data.try_to_vec::<i64>().map(|v| json!(v))),
        };
        let numbers = numbers.map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("`{name}` could not be read back: {e:?}"),
            )
        })?;
        values.insert(
            name.clone(),
            json!({"shape": data.shape().to_vec(), "dtype": dtype, "data": numbers}),
        );
    }
    report["values"] = Value::Object(values);
    Ok(Json(report).into_response())
}

/// A safetensors file of the saved values and `output_ids`, the report in its metadata under
/// `report`.
fn safetensors_answer(
    report: &Value,
    tensors: &[(String, TensorData)],
) -> Result<Response, ApiError> {
    let metadata = HashMap::from([("report".to_string(), report.to_string())]);
    let bytes = hookscope::output::safetensors_bytes(tensors, metadata)?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

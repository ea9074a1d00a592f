//! The analysis endpoints: each checks its request, runs the library's analysis when its turn
//! comes and answers the report the CLI's `--json` prints, with the prompt's tokens.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::response::{IntoResponse, Response};
use hookscope::analysis::{
    activation_patching, attention_patterns, feature_report, logit_attribution,
};
use hookscope::{Interventions, report};
use serde_json::json;

use crate::Server;
use crate::analysis_request::{
    AttentionRequest, DlaRequest, FeaturesRequest, LensRequest, PatchRequest,
};
use crate::error::ApiError;
use crate::routes::queued;

/// The request's JSON body, or the 4xx naming what is wrong with it.
pub(crate) fn body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    body.map(|Json(request)| request)
        .map_err(|e| ApiError::new(e.status(), e.body_text()))
}

/// `POST /v1/lens`: `hookscope lens --json`'s report.
pub(crate) async fn lens(
    State(server): State<Arc<Server>>,
    request: Result<Json<LensRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let request = body(request)?;
    queued(server, move |server, _cancelled| {
        let model = &server.model;
        let batch = request.batch(model, &server.limits)?;
        let mut answer = report::lens_json(&report::lens_top(model, &batch, request.top_k)?);
        answer["tokens"] = json!(report::prompt_labels(model, &batch, 0)?);
        Ok(Json(answer).into_response())
    })
    .await
}

/// `POST /v1/attention`: every (or each asked) attention layer's pattern, per head.
pub(crate) async fn attention(
    State(server): State<Arc<Server>>,
    request: Result<Json<AttentionRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let request = body(request)?;
    queued(server, move |server, _cancelled| {
        let model = &server.model;
        let batch = request.batch(model, &server.limits)?;
        let layers = attention_patterns(model, &batch, request.layers.as_deref())?;
        let labels = report::prompt_labels(model, &batch, 0)?;
        Ok(Json(report::attention_json(&layers, &labels)).into_response())
    })
    .await
}

/// `POST /v1/features`: `hookscope features --json`'s report.
pub(crate) async fn features(
    State(server): State<Arc<Server>>,
    request: Result<Json<FeaturesRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let request = body(request)?;
    queued(server, move |server, _cancelled| {
        let model = &server.model;
        let batch = request.batch(model, &server.limits)?;
        let reports = feature_report(model, &batch, request.top_k)?;
        let labels = report::prompt_labels(model, &batch, 0)?;
        let mut answer = report::features_json(&reports, &labels);
        answer["tokens"] = json!(labels);
        Ok(Json(answer).into_response())
    })
    .await
}

/// `POST /v1/dla`: `hookscope dla --json`'s report.
pub(crate) async fn dla(
    State(server): State<Arc<Server>>,
    request: Result<Json<DlaRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let request = body(request)?;
    queued(server, move |server, _cancelled| {
        let model = &server.model;
        let batch = request.batch(model, &server.limits)?;
        let target = report::single_token(model, &request.target)?;
        let versus = request
            .vs
            .as_deref()
            .map(|token| report::single_token(model, token))
            .transpose()?;
        let attribution = logit_attribution(model, &batch, target, versus, &Interventions::new())?;
        let mut answer = report::attribution_json(&attribution);
        answer["tokens"] = json!(report::prompt_labels(model, &batch, 0)?);
        Ok(Json(answer).into_response())
    })
    .await
}

/// `POST /v1/patch`: `hookscope patch --json`'s report.
pub(crate) async fn patch(
    State(server): State<Arc<Server>>,
    request: Result<Json<PatchRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let request = body(request)?;
    queued(server, move |server, _cancelled| {
        let model = &server.model;
        let (clean, corrupt, sites) = request.prepare(model, &server.limits)?;
        let metric = report::metric(model, &request.metric)?;
        let sweep = activation_patching(model, &clean.ids[0], &corrupt.ids[0], &sites, metric)?;
        let labels = report::patch_labels(model, &clean, &corrupt)?;
        Ok(Json(report::patch_json(&sweep, &labels, &request.metric)).into_response())
    })
    .await
}

//! Traces queued together run as one batch. A trace request waits in [`Batcher`] for the model;
//! when its turn comes it takes every waiting trace that can share its call (the same reads,
//! writes and answer format, prompts padded to the same length, every row read and written
//! alone: [`hookscope::Interventions::rows_independent`]) up to the server's limits on prompts
//! and saved bytes, runs them in one call, and answers each with its own rows
//! ([`hookscope::Trace::rows`]), as if it had run alone. The others, answered, never run.
//! Each answer says in [`BATCH_HEADER`] how many requests shared its call.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::HeaderValue;
use axum::response::Response;
use hookscope::{Run, Trace};
use tokio::sync::oneshot;

use crate::Server;
use crate::error::ApiError;
use crate::limits::Limits;
use crate::request::{Prepared, RunRequest};

/// The answer header saying how many requests shared the call (1: it ran alone).
pub const BATCH_HEADER: &str = "x-hookscope-batch";

/// What makes two traces able to share a call.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BatchKey {
    /// The request without its prompts, as JSON: the reads, writes, `top` and format.
    options: String,
    /// The padded prompt length.
    len: usize,
}

impl BatchKey {
    /// The key of `request`, whose prompts were padded to `len` tokens.
    fn of(request: &RunRequest, len: usize) -> BatchKey {
        let options = RunRequest {
            prompts: Vec::new(),
            input_ids: Vec::new(),
            ..request.clone()
        };
        BatchKey {
            options: serde_json::to_string(&options).unwrap_or_default(),
            len,
        }
    }
}

/// One trace waiting for the model.
pub(crate) struct Waiting {
    /// Its place in the queue.
    id: u64,
    key: BatchKey,
    request: RunRequest,
    prepared: Prepared,
    /// Where its answer goes when another request's call serves it.
    reply: oneshot::Sender<Result<Response, ApiError>>,
}

/// The traces waiting for the model, in arrival order.
#[derive(Default)]
pub(crate) struct Batcher {
    waiting: Mutex<Vec<Waiting>>,
    next_id: AtomicU64,
}

impl Batcher {
    /// Puts a checked trace in the queue: its place, and where its answer will come from if
    /// another trace's call serves it.
    pub(crate) fn enqueue(
        &self,
        request: RunRequest,
        prepared: Prepared,
    ) -> (u64, oneshot::Receiver<Result<Response, ApiError>>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let key = BatchKey::of(&request, prepared.batch.len());
        let (reply, answered) = oneshot::channel();
        self.lock().push(Waiting {
            id,
            key,
            request,
            prepared,
            reply,
        });
        (id, answered)
    }

    /// Takes trace `id` out of the queue (its request was dropped), if it is still there.
    pub(crate) fn leave(&self, id: u64) {
        self.lock().retain(|waiting| waiting.id != id);
    }

    /// Takes trace `id` and every waiting trace that can share its call, in arrival order,
    /// within `limits`; `None` when `id` is no longer waiting (another call took it).
    pub(crate) fn take_group(&self, id: u64, limits: &Limits) -> Option<Vec<Waiting>> {
        let mut waiting = self.lock();
        let leader = waiting.iter().position(|w| w.id == id)?;
        let leader = waiting.remove(leader);
        let mut prompts = leader.prepared.batch.batch_size();
        let mut saved = leader.prepared.saved_bytes;
        let mut group = vec![leader];
        let mut index = 0;
        while index < waiting.len() {
            let candidate = &waiting[index];
            let rows = prompts + candidate.prepared.batch.batch_size();
            let bytes = saved.saturating_add(candidate.prepared.saved_bytes);
            if candidate.key == group[0].key
                && rows <= limits.prompts
                && bytes <= limits.saved_bytes
            {
                (prompts, saved) = (rows, bytes);
                group.push(waiting.remove(index));
            } else {
                index += 1;
            }
        }
        Some(group)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Waiting>> {
        // A panic while the lock was held left the queue itself intact.
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Runs `group` (the leader first) in one call and answers every member but the leader through
/// its `reply`; the leader's answer is returned. `answer` turns a member's own rows into its
/// answer.
pub(crate) fn run_group(
    server: &Server,
    group: Vec<Waiting>,
    answer: impl Fn(&RunRequest, &[String], &Trace) -> Result<Response, ApiError>,
) -> Result<Response, ApiError> {
    let model = &server.model;
    let traced = (|| -> Result<Trace, ApiError> {
        let ids: Vec<Vec<u32>> = group
            .iter()
            .flat_map(|member| unpadded(&member.prepared.batch))
            .collect();
        let batch = model.batch(ids)?;
        let run = Run::new().interventions(&group[0].prepared.interventions);
        Ok(model.trace(&batch, run)?)
    })();
    let size = HeaderValue::from(group.len());
    let mut start = 0;
    let mut leader = None;
    for member in group {
        let rows = start..start + member.prepared.batch.batch_size();
        start = rows.end;
        let own = match &traced {
            Ok(trace) => trace
                .rows(rows)
                .map_err(ApiError::from)
                .and_then(|trace| answer(&member.request, &member.prepared.prompts, &trace)),
            Err(error) => Err(error.clone()),
        };
        let own = own.map(|mut response| {
            response.headers_mut().insert(BATCH_HEADER, size.clone());
            response
        });
        match leader {
            None => leader = Some(own),
            // A member whose request was dropped meanwhile has no one to answer.
            Some(_) => drop(member.reply.send(own)),
        }
    }
    leader.unwrap_or_else(|| Err(ApiError::bad_request("an empty batch")))
}

/// The batch's prompts without their left padding.
fn unpadded(batch: &hookscope::Batch) -> Vec<Vec<u32>> {
    batch
        .ids
        .iter()
        .zip(&batch.mask)
        .map(|(ids, mask)| {
            ids.iter()
                .zip(mask)
                .filter(|(_, real)| **real)
                .map(|(id, _)| *id)
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use hookscope::{DeviceChoice, Model};
    use serde_json::{Value, json};
    use tokio::sync::Semaphore;

    use super::*;
    use crate::routes::trace_answer;

    fn server() -> Server {
        let device = DeviceChoice::Cpu.open().unwrap();
        Server {
            model: Model::load(&hookscope::default_model(), &device).unwrap(),
            limits: Limits::default(),
            token: None,
            queue: Arc::new(Semaphore::new(1)),
            batcher: Batcher::default(),
        }
    }

    fn request(prompts: &[&str], save: &[&str]) -> RunRequest {
        serde_json::from_value(json!({"prompts": prompts, "save": save, "top": 3})).unwrap()
    }

    /// Queues `request`; its place and its reply's receiver.
    fn enqueue(
        server: &Server,
        request: RunRequest,
    ) -> (u64, oneshot::Receiver<Result<Response, ApiError>>) {
        let prepared = request.prepare(&server.model, &server.limits).unwrap();
        server.batcher.enqueue(request, prepared)
    }

    fn body(response: Response) -> (Option<String>, Value) {
        let batch = response
            .headers()
            .get(BATCH_HEADER)
            .map(|v| v.to_str().unwrap().to_string());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let bytes = runtime
            .block_on(axum::body::to_bytes(response.into_body(), usize::MAX))
            .unwrap();
        (batch, serde_json::from_slice(&bytes).unwrap())
    }

    /// The answer of `request` traced alone.
    fn alone(server: &Server, request: &RunRequest) -> Value {
        let prepared = request.prepare(&server.model, &server.limits).unwrap();
        let run = Run::new().interventions(&prepared.interventions);
        let trace = server.model.trace(&prepared.batch, run).unwrap();
        body(trace_answer(server, request, &prepared.prompts, &trace).unwrap()).1
    }

    /// Equal up to `1e-5` in every number.
    fn close(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => {
                (x.as_f64().unwrap() - y.as_f64().unwrap()).abs() < 1e-5
            }
            (Value::Array(x), Value::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(x, y)| close(x, y))
            }
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| close(v, w)))
            }
            _ => a == b,
        }
    }

    #[test]
    fn waiting_traces_that_can_share_a_call_are_answered_from_one_call_as_if_alone() {
        let server = server();
        let save = ["layers.1.layer_output[:, -1]", "layers.0.mlp_output"];
        // Three prompts of four tokens each over two requests, one of another length, one
        // saving something else, and one of four tokens again.
        let requests = [
            request(&["In the beginning"], &save),
            request(&["And God said", "Let there be"], &save),
            request(&["In the beginning God created"], &save),
            request(&["In the beginning"], &["layers.2.layer_output"]),
            request(&["And the earth"], &save),
        ];
        let lengths: Vec<usize> = requests
            .iter()
            .map(|r| {
                r.prepare(&server.model, &server.limits)
                    .unwrap()
                    .batch
                    .len()
            })
            .collect();
        assert_eq!(lengths[0], lengths[1]);
        assert_eq!(lengths[0], lengths[4]);
        assert_ne!(lengths[0], lengths[2]);
        let (ids, mut receivers): (Vec<u64>, Vec<_>) =
            requests.iter().map(|r| enqueue(&server, r.clone())).unzip();

        let group = server.batcher.take_group(ids[0], &server.limits).unwrap();
        let members: Vec<u64> = group.iter().map(|w| w.id).collect();
        assert_eq!(members, [ids[0], ids[1], ids[4]]);
        assert!(server.batcher.take_group(ids[1], &server.limits).is_none());

        let leader = run_group(&server, group, |request, prompts, trace| {
            trace_answer(&server, request, prompts, trace)
        })
        .unwrap();
        let mut answers = vec![(0, body(leader))];
        for index in [1, 4] {
            let answer = receivers[index].try_recv().unwrap().unwrap();
            answers.push((index, body(answer)));
        }
        for (index, (batch, answer)) in &answers {
            assert_eq!(batch.as_deref(), Some("3"), "request {index}");
            let expected = alone(&server, &requests[*index]);
            assert!(
                close(answer, &expected),
                "request {index}: {answer} != {expected}"
            );
        }
        // The two left (another length, other saves) each lead a call of their own.
        for index in [2, 3] {
            let group = server
                .batcher
                .take_group(ids[index], &server.limits)
                .unwrap();
            assert_eq!(group.len(), 1, "request {index}");
        }
        assert!(receivers[2].try_recv().is_err());
    }
}

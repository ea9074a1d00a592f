//! The HTTP API against a server on 127.0.0.1 with an ephemeral port, serving the embedded
//! demo model: every endpoint's answer equals the same request run through the library; bad
//! requests get a clear 4xx and the next request is served; the token is enforced; a stalled
//! body times out; concurrent clients each get their own request's values.

use std::io::{Read, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hookscope::decoding::DecodingChoice;
use hookscope::hooks::RequestSpecs;
use hookscope::{DeviceChoice, Interventions, Model, Steps, report};
use hookscope_serve::{Limits, ServeOptions};
use safetensors::SafeTensors;
use serde_json::{Value, json};

/// A server on its own thread and runtime, stopped (gracefully) when dropped.
struct TestServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn demo_model() -> Model {
    let device = DeviceChoice::Cpu.open().unwrap();
    Model::load(&hookscope::default_model(), &device).unwrap()
}

fn start(token: Option<&str>, limits: Limits) -> TestServer {
    let model = demo_model();
    let token = token.map(str::to_string);
    let (ready, addr) = mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            ready.send(listener.local_addr().unwrap()).unwrap();
            let router = hookscope_serve::router(model, token, limits);
            let shutdown = async {
                let _ = stopped.await;
            };
            hookscope_serve::serve(listener, router, shutdown)
                .await
                .unwrap();
        });
    });
    TestServer {
        addr: addr.recv().unwrap(),
        stop: Some(stop),
        thread: Some(thread),
    }
}

/// One answer: the status, the headers (lower-cased names) and the body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }

    fn error(&self) -> String {
        self.json()["error"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

/// Sends `head` (request line and headers) and `body` over a fresh connection; reads the
/// whole answer (the server closes after it: `Connection: close`).
fn exchange(addr: SocketAddr, head: &str, body: &[u8]) -> Answer {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    parse(&raw)
}

fn parse(raw: &[u8]) -> Answer {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v == "chunked")
    {
        body = unchunk(&body);
    }
    Answer {
        status,
        headers,
        body,
    }
}

fn unchunk(mut raw: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let end = raw.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = usize::from_str_radix(std::str::from_utf8(&raw[..end]).unwrap(), 16).unwrap();
        if size == 0 {
            return body;
        }
        body.extend_from_slice(&raw[end + 2..end + 2 + size]);
        raw = &raw[end + 4 + size..];
    }
}

fn request(addr: SocketAddr, method: &str, path: &str, token: Option<&str>, body: &[u8]) -> Answer {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n{auth}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    exchange(addr, &head, body)
}

fn post(addr: SocketAddr, body: &Value) -> Answer {
    request(addr, "POST", "/v1/run", None, body.to_string().as_bytes())
}

/// The library's own answer to a run request: the report and the saved tensors.
fn library_run(
    model: &Model,
    prompts: &[&str],
    specs: &RequestSpecs,
    new: Option<usize>,
) -> (Value, Vec<(String, Vec<f32>)>) {
    let batch = model.encode(prompts).unwrap();
    let steps = match new {
        Some(_) => Steps::All,
        None => Steps::At(0),
    };
    let interventions: Interventions = specs
        .interventions(model.layout(), &steps, new.is_some(), model.device())
        .unwrap();
    let names: Vec<String> = prompts.iter().map(|p| p.to_string()).collect();
    let (report, tensors) = match new {
        Some(new) => {
            let choice = DecodingChoice {
                sample: Some(false),
                ..Default::default()
            };
            let config = model.generation_config().with_choice(new, &choice).unwrap();
            let generation = model.generate(&batch, &interventions, &config).unwrap();
            let report = report::generation_json(model, &names, &generation, 5).unwrap();
            let ids = (&generation.output_ids, &generation.attention_mask);
            (
                report,
                report::saved_tensors(&generation.saved, ids.0, ids.1),
            )
        }
        None => {
            let trace = model.trace(&batch, &interventions).unwrap();
            let report = report::trace_json(model, &names, &trace, 5).unwrap();
            let tensors = report::saved_tensors(&trace.saved, &trace.batch.ids, &trace.batch.mask);
            (report, tensors)
        }
    };
    // As it reads back from text (what a client parses), for comparing answers.
    let report = serde_json::from_str(&report.to_string()).unwrap();
    // Each value after its shape's sizes (as `json_values` reads an answer).
    let tensors = tensors
        .into_iter()
        .map(|(name, data)| {
            let values: Vec<f32> = match data.dtype() {
                hookscope::burn::tensor::DType::F32 => data.try_to_vec::<f32>().unwrap(),
                _ => data
                    .try_to_vec::<i64>()
                    .unwrap()
                    .into_iter()
                    .map(|v| v as f32)
                    .collect(),
            };
            let shape = data.shape().iter().map(|&d| d as f32);
            (name, shape.chain(values).collect())
        })
        .collect();
    (report, tensors)
}

/// `values` of a JSON answer as f32 lists by name, each after its shape's sizes.
fn json_values(answer: &Value) -> Vec<(String, Vec<f32>)> {
    let mut values: Vec<(String, Vec<f32>)> = answer["values"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, value)| {
            let shape = value["shape"].as_array().unwrap().iter();
            let data = value["data"].as_array().unwrap().iter();
            let numbers = shape.chain(data).map(|v| v.as_f64().unwrap() as f32);
            (name.clone(), numbers.collect())
        })
        .collect();
    values.sort_by(|a, b| a.0.cmp(&b.0));
    values
}

fn sorted(mut values: Vec<(String, Vec<f32>)>) -> Vec<(String, Vec<f32>)> {
    values.sort_by(|a, b| a.0.cmp(&b.0));
    values
}

#[test]
fn every_endpoint_answers_what_the_library_computes() {
    let server = start(None, Limits::default());
    let model = demo_model();
    let layout = model.layout();

    let answer = request(server.addr, "GET", "/v1/model", None, b"");
    assert_eq!(answer.status, 200);
    let info = answer.json();
    assert_eq!(info["architecture"], model.architecture().name);
    assert_eq!(info["layers"], layout.layers.len());
    assert_eq!(info["vocab"], layout.vocab);

    let answer = request(
        server.addr,
        "GET",
        "/v1/sites?prompt_len=4&step=2",
        None,
        b"",
    );
    assert_eq!(answer.status, 200);
    let sites = answer.json()["sites"].as_array().unwrap().clone();
    assert_eq!(sites.len(), layout.call_order().len());
    let keys = layout.resolve("layers.0.self_attn.attention_keys").unwrap();
    let entry = sites
        .iter()
        .find(|s| s["name"] == keys.to_string())
        .unwrap();
    let kv_heads = layout.fixed_shape(keys).unwrap()[1].unwrap();
    assert_eq!(entry["step0"][2], 4, "{entry}");
    assert_eq!(entry["decode"][2], 6, "{entry}");
    assert_eq!(entry["decode"][1], kv_heads, "{entry}");

    // The logit lens: `hookscope lens --json`'s report, with the prompt's tokens.
    let prompt = "In the beginning God";
    let answer = request(
        server.addr,
        "POST",
        "/v1/lens",
        None,
        json!({"prompt": prompt, "top_k": 2}).to_string().as_bytes(),
    );
    assert_eq!(answer.status, 200);
    let batch = model.encode(&[prompt]).unwrap();
    let mut lens = report::lens_json(&report::lens_top(&model, &batch, 2).unwrap());
    lens["tokens"] = json!(report::prompt_labels(&model, &batch, 0).unwrap());
    let lens: Value = serde_json::from_str(&lens.to_string()).unwrap();
    assert_eq!(answer.json(), lens);
    let zero = br#"{"prompt": "a", "top_k": 0}"#;
    let answer = request(server.addr, "POST", "/v1/lens", None, zero);
    assert_eq!(answer.status, 400);
    assert!(answer.error().contains("top_k"));

    // A trace saving two sites, with a head ablated: the JSON answer is the library's.
    let prompts = ["In the beginning", "And God said"];
    let specs = RequestSpecs {
        save: vec!["layers.1.layer_output".into(), "logits[:, -1]".into()],
        zero: vec!["layers.0.self_attn.attention_head_outputs[:, :, 1]".into()],
        ..Default::default()
    };
    let answer = post(
        server.addr,
        &json!({"prompts": prompts, "save": specs.save, "zero": specs.zero}),
    );
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let served = answer.json();
    let (report, values) = library_run(&model, &prompts, &specs, None);
    assert_eq!(served["prompts"], report["prompts"]);
    assert_eq!(served["saved"], report["saved"]);
    assert_eq!(json_values(&served), sorted(values));

    // A greedy generation with a steering write, as safetensors: the file holds the library's
    // values and output ids, its metadata the library's report.
    let (target, value) = ("layers.1.layer_output[:, -1]", 0.5f32);
    let operand = hookscope::hooks::Operand {
        values: vec![value],
        shape: vec![],
    };
    let specs = RequestSpecs {
        save: vec!["layers.0.attention_output@1:3".into()],
        add_values: vec![(target.to_string(), operand)],
        ..Default::default()
    };
    let body = json!({
        "prompts": prompts, "max_new_tokens": 4, "greedy": true, "save": specs.save,
        "add": [{"target": target, "value": value}], "format": "safetensors",
    });
    let answer = post(server.addr, &body);
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let (_, metadata) = SafeTensors::read_metadata(&answer.body).unwrap();
    let served_report: Value =
        serde_json::from_str(&metadata.metadata().as_ref().unwrap()["report"]).unwrap();
    let file = SafeTensors::deserialize(&answer.body).unwrap();
    let (report, values) = library_run(&model, &prompts, &specs, Some(4));
    assert_eq!(served_report, report);
    let mut served_values: Vec<(String, Vec<f32>)> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let values: Vec<f32> = match view.dtype() {
                safetensors::Dtype::F32 => view
                    .data()
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .collect(),
                _ => view
                    .data()
                    .chunks_exact(8)
                    .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as f32)
                    .collect(),
            };
            let shape = view.shape().iter().map(|&d| d as f32);
            (name, shape.chain(values).collect())
        })
        .collect();
    served_values.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(served_values, sorted(values));
    assert!(
        served_values
            .iter()
            .any(|(name, _)| name == "layers.0.attention_output@2")
    );
}

#[test]
fn bad_requests_get_a_clear_4xx_and_the_next_request_is_served() {
    let limits = Limits {
        body_bytes: 4096,
        saved_bytes: 1 << 16,
        ..Limits::default()
    };
    let server = start(None, limits);
    let good = json!({"prompts": ["In the beginning"], "save": ["layers.0.layer_output"]});
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"{\"prompts\": [".to_vec(), 400, "JSON"),
        (br#"{"prompts": "text"}"#.to_vec(), 422, "prompts"),
        (br#"{"prompts": ["a"], "colour": 1}"#.to_vec(), 422, "colour"),
        (br#"{"prompts": ["a"], "save": ["layers.99.nothing"]}"#.to_vec(), 400, "layers.99"),
        (br#"{"prompts": ["a"], "max_new_tokens": 100000000}"#.to_vec(), 413, "max_new_tokens"),
        (br#"{"prompts": ["a"], "max_new_tokens": 1e400}"#.to_vec(), 400, "max_new_tokens"),
        (br#"{"prompts": ["a"], "max_new_tokens": -1}"#.to_vec(), 422, "max_new_tokens"),
        (br#"{"prompts": ["a"], "top": 100000}"#.to_vec(), 400, "top"),
        (br#"{"input_ids": [[4294967295]]}"#.to_vec(), 400, "vocabulary"),
        (br#"{"prompts": []}"#.to_vec(), 400, "prompts"),
        (
            br#"{"prompts": ["a"], "greedy": true, "sample": true, "max_new_tokens": 2}"#.to_vec(),
            400,
            "greedy",
        ),
        (br#"{"prompts": ["a"], "temperature": 0.5}"#.to_vec(), 400, "max_new_tokens"),
        (
            br#"{"prompts": ["a"], "add": [{"target": "layers.0.layer_output", "values": [1, 2], "shape": [3]}]}"#
                .to_vec(),
            400,
            "shape",
        ),
        (
            br#"{"prompts": ["a"], "save": ["layers.*.layer_output"], "max_new_tokens": 100}"#
                .to_vec(),
            413,
            "saved values",
        ),
        (vec![b' '; 5000], 413, ""),
    ];
    for (body, status, says) in cases {
        let answer = request(server.addr, "POST", "/v1/run", None, &body);
        let shown = String::from_utf8_lossy(&body[..body.len().min(80)]).to_string();
        assert_eq!(
            answer.status,
            status,
            "{shown}: {}",
            String::from_utf8_lossy(&answer.body)
        );
        if !says.is_empty() {
            let message = String::from_utf8_lossy(&answer.body);
            assert!(message.contains(says), "{shown}: {message}");
        }
        let next = post(server.addr, &good);
        assert_eq!(next.status, 200, "after {shown}");
    }
    let answer = request(server.addr, "GET", "/v2/run", None, b"");
    assert_eq!(answer.status, 404);
    assert!(answer.error().contains("/v1/run"));
    let answer = request(
        server.addr,
        "GET",
        "/v1/sites?prompt_len=99999999999",
        None,
        b"",
    );
    assert_eq!(answer.status, 400);
}

#[test]
fn the_token_is_required_where_one_is_set() {
    let server = start(Some("s3cret"), Limits::default());
    let path = "/v1/model";
    assert_eq!(request(server.addr, "GET", path, None, b"").status, 401);
    let wrong = request(server.addr, "GET", path, Some("s3cret-not"), b"");
    assert_eq!(wrong.status, 401);
    assert!(wrong.error().contains("wrong"));
    assert_eq!(
        request(server.addr, "GET", path, Some("s3cret"), b"").status,
        200
    );

    let options = |addr: &str, token: Option<&str>| ServeOptions {
        addr: addr.parse().unwrap(),
        token: token.map(str::to_string),
        limits: Limits::default(),
    };
    assert!(options("127.0.0.1:7878", None).check().is_ok());
    assert!(options("[::1]:7878", None).check().is_ok());
    let message = options("0.0.0.0:7878", None).check().unwrap_err();
    assert!(message.contains("--token"), "{message}");
    assert!(options("0.0.0.0:7878", Some("t")).check().is_ok());
    assert!(options("127.0.0.1:7878", Some("")).check().is_err());
}

#[test]
fn a_client_that_stalls_mid_body_is_answered_408_in_time() {
    let limits = Limits {
        request_time: Duration::from_millis(800),
        ..Limits::default()
    };
    let server = start(None, limits);
    let started = Instant::now();
    let head = "POST /v1/run HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\
                Content-Type: application/json\r\nContent-Length: 100\r\n\r\n";
    let answer = exchange(server.addr, head, b"{\"prompts\":");
    assert_eq!(
        answer.status,
        408,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(answer.error().contains("limit"));
    let next = post(server.addr, &json!({"prompts": ["In the beginning"]}));
    assert_eq!(next.status, 200);
    assert!(answer.headers.iter().any(|(k, _)| k == "content-type"));
}

#[test]
fn concurrent_clients_each_get_their_own_requests_values() {
    let server = start(None, Limits::default());
    let model = demo_model();
    let prompts = [
        "In the beginning",
        "And God said",
        "Let there be light",
        "The LORD is",
    ];
    let expected: Vec<Vec<(String, Vec<f32>)>> = prompts
        .iter()
        .map(|prompt| {
            let specs = RequestSpecs {
                save: vec!["layers.1.mlp_output[:, -1]".into()],
                ..Default::default()
            };
            sorted(library_run(&model, &[prompt], &specs, Some(2)).1)
        })
        .collect();
    let addr = server.addr;
    let clients: Vec<_> = (0..4)
        .map(|client| {
            let expected = expected.clone();
            std::thread::spawn(move || {
                for round in 0..5 {
                    let which = (client + round) % prompts.len();
                    let body = json!({
                        "prompts": [prompts[which]], "max_new_tokens": 2, "greedy": true,
                        "save": ["layers.1.mlp_output[:, -1]"],
                    });
                    let answer = post(addr, &body);
                    assert_eq!(answer.status, 200);
                    assert_eq!(
                        json_values(&answer.json()),
                        expected[which],
                        "client {client}"
                    );
                }
            })
        })
        .collect();
    for client in clients {
        client.join().unwrap();
    }
}

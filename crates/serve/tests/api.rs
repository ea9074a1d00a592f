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
    start_with(demo_model(), token, limits)
}

fn start_with(model: Model, token: Option<&str>, limits: Limits) -> TestServer {
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

/// `POST path` with a JSON body, without a token.
fn post_to(addr: SocketAddr, path: &str, body: &Value) -> Answer {
    request(addr, "POST", path, None, body.to_string().as_bytes())
}

/// `value` through a JSON round trip (as the server's answer reads: f32s as JSON numbers).
fn round_trip(value: &Value) -> Value {
    serde_json::from_str(&value.to_string()).unwrap()
}

/// A SAELens SAE (`standard`, 16 features) on `layers.1.layer_output` of the demo model,
/// written under `folder`.
fn write_demo_sae(folder: &std::path::Path) {
    let (hidden, width) = (64usize, 16usize);
    let numbers = |count: usize, seed: u32| -> Vec<u8> {
        (0..count)
            .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32)
            .flat_map(|n| (n / 1000.0 - 0.45).to_le_bytes())
            .collect()
    };
    let tensors = [
        ("W_enc", vec![hidden, width], numbers(hidden * width, 1)),
        ("b_enc", vec![width], numbers(width, 2)),
        ("W_dec", vec![width, hidden], numbers(width * hidden, 3)),
        ("b_dec", vec![hidden], numbers(hidden, 4)),
    ];
    let views: Vec<(&str, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                    .unwrap();
            (*name, view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, &folder.join("sae_weights.safetensors")).unwrap();
    let config = json!({
        "architecture": "standard", "d_in": hidden, "d_sae": width, "dtype": "float32",
        "apply_b_dec_to_input": true, "normalize_activations": "none",
        "metadata": {"hook_name": "blocks.1.hook_resid_post"},
    });
    std::fs::write(folder.join("cfg.json"), config.to_string()).unwrap();
}

#[test]
fn the_analysis_endpoints_and_the_page_answer_what_the_library_computes() {
    let folder = tempfile::tempdir().unwrap();
    write_demo_sae(folder.path());
    let mut model = demo_model();
    let device = model.device().clone();
    let dictionary = hookscope::Dictionary::load(folder.path(), &device).unwrap();
    model
        .attach(dictionary.clone(), hookscope::AttachOptions::default())
        .unwrap();
    let mut library = demo_model();
    library
        .attach(dictionary, hookscope::AttachOptions::default())
        .unwrap();
    let server = start_with(model, Some("secret"), Limits::default());
    let model = library;
    let prompt = "Speak unto the children of";
    let batch = model.encode(&[prompt]).unwrap();
    let labels = report::prompt_labels(&model, &batch, 0).unwrap();
    let with_token = |path: &str, body: &Value| {
        request(
            server.addr,
            "POST",
            path,
            Some("secret"),
            body.to_string().as_bytes(),
        )
    };

    // The page and its assets need no token (they hold no data); the API does.
    for (path, kind) in [
        ("/", "text/html"),
        ("/app.js", "text/javascript"),
        ("/style.css", "text/css"),
    ] {
        let answer = request(server.addr, "GET", path, None, b"");
        assert_eq!(answer.status, 200, "{path}");
        let content_type = answer
            .headers
            .iter()
            .find(|(name, _)| name == "content-type");
        assert!(
            content_type.is_some_and(|(_, value)| value.starts_with(kind)),
            "{path}"
        );
        assert!(
            answer
                .headers
                .iter()
                .any(|(name, value)| name == "content-security-policy"
                    && value.contains("default-src 'self'"))
        );
    }
    let page = String::from_utf8(request(server.addr, "GET", "/", None, b"").body).unwrap();
    assert!(page.contains("attention-grid") && page.contains("/app.js"));
    let script = request(server.addr, "GET", "/app.js", None, b"").body;
    for endpoint in [
        "/v1/run",
        "/v1/lens",
        "/v1/attention",
        "/v1/patch",
        "/v1/features",
    ] {
        assert!(
            String::from_utf8_lossy(&script).contains(endpoint),
            "{endpoint}"
        );
    }
    let refused = post_to(server.addr, "/v1/attention", &json!({"prompt": prompt}));
    assert_eq!(refused.status, 401);

    // Attention: every layer's pattern per head, the library's.
    let answer = with_token("/v1/attention", &json!({"prompt": prompt}));
    assert_eq!(answer.status, 200, "{}", answer.error());
    let layers = hookscope::analysis::attention_patterns(&model, &batch, None).unwrap();
    assert_eq!(layers.len(), 4);
    assert_eq!(
        answer.json(),
        round_trip(&report::attention_json(&layers, &labels))
    );
    // One layer alone: the same pattern (layers 0 and 1 then run their fused kernel, so equal
    // within rounding).
    let one = with_token("/v1/attention", &json!({"prompt": prompt, "layers": [2]}));
    let numbers = |value: &Value| -> Vec<f64> {
        let heads = value["heads"].as_array().unwrap();
        let rows = heads.iter().flat_map(|head| head.as_array().unwrap());
        let cells = rows.flat_map(|row| row.as_array().unwrap());
        cells.map(|p| p.as_f64().unwrap()).collect()
    };
    let (alone, among) = (
        numbers(&one.json()["layers"][0]),
        numbers(&answer.json()["layers"][2]),
    );
    assert_eq!(one.json()["layers"][0]["layer"], 2);
    assert_eq!(alone.len(), among.len());
    assert!(alone.iter().zip(&among).all(|(a, b)| (a - b).abs() < 1e-5));
    let bad_layer = with_token("/v1/attention", &json!({"prompt": prompt, "layers": [9]}));
    assert_eq!(bad_layer.status, 400);
    assert!(
        bad_layer.error().contains("layers.9"),
        "{}",
        bad_layer.error()
    );

    // Direct logit attribution.
    let answer = with_token(
        "/v1/dla",
        &json!({"prompt": prompt, "target": " Israel", "vs": " the"}),
    );
    assert_eq!(answer.status, 200, "{}", answer.error());
    let target = report::single_token(&model, " Israel").unwrap();
    let versus = report::single_token(&model, " the").unwrap();
    let attribution = hookscope::analysis::logit_attribution(
        &model,
        &batch,
        target,
        Some(versus),
        &Interventions::new(),
    )
    .unwrap();
    let mut expected = report::attribution_json(&attribution);
    expected["tokens"] = json!(labels);
    assert_eq!(answer.json(), round_trip(&expected));
    let two_tokens = with_token(
        "/v1/dla",
        &json!({"prompt": prompt, "target": " Israel the"}),
    );
    assert_eq!(two_tokens.status, 400);
    assert!(
        two_tokens.error().contains("not one"),
        "{}",
        two_tokens.error()
    );

    // The activation-patching sweep (the README's example).
    let body = json!({
        "clean": prompt, "corrupt": "Speak unto the daughters of",
        "site": "layers.*.layer_output", "metric": "logit-diff: Israel, the",
    });
    let answer = with_token("/v1/patch", &body);
    assert_eq!(answer.status, 200, "{}", answer.error());
    let corrupt = model.encode(&["Speak unto the daughters of"]).unwrap();
    let metric = report::metric(&model, "logit-diff: Israel, the").unwrap();
    let sites = model.layout().expand("layers.*.layer_output").unwrap();
    let sweep = hookscope::analysis::activation_patching(
        &model,
        &batch.ids[0],
        &corrupt.ids[0],
        &sites,
        metric,
    )
    .unwrap();
    let labels_patch = report::patch_labels(&model, &batch, &corrupt).unwrap();
    assert_eq!(
        answer.json(),
        round_trip(&report::patch_json(
            &sweep,
            &labels_patch,
            "logit-diff: Israel, the"
        ))
    );
    let mut unequal = body.clone();
    unequal["corrupt"] = json!("Speak unto the daughters of Zion and");
    let answer = with_token("/v1/patch", &unequal);
    assert_eq!(answer.status, 400);
    assert!(answer.error().contains("same length"), "{}", answer.error());
    let mut kl = body.clone();
    kl["metric"] = json!("kl");
    assert!(with_token("/v1/patch", &kl).error().contains("metric `kl`"));

    // The attached dictionary's features per token.
    let answer = with_token("/v1/features", &json!({"prompt": prompt, "top_k": 3}));
    assert_eq!(answer.status, 200, "{}", answer.error());
    let reports = hookscope::analysis::feature_report(&model, &batch, 3).unwrap();
    let mut expected = report::features_json(&reports, &labels);
    expected["tokens"] = json!(labels);
    assert_eq!(answer.json(), round_trip(&expected));
    assert!(
        reports[0].top.iter().any(|top| !top.is_empty()),
        "some feature fires"
    );
}

#[test]
fn a_patching_sweep_over_the_limit_and_features_without_a_dictionary_are_refused() {
    let limits = Limits {
        patch_rows: 10,
        ..Limits::default()
    };
    let server = start(None, limits);
    let body = json!({
        "clean": "Speak unto the children of", "corrupt": "Speak unto the daughters of",
        "site": "layers.*.layer_output", "metric": "logit-diff: Israel, the",
    });
    let answer = post_to(server.addr, "/v1/patch", &body);
    assert_eq!(answer.status, 413);
    assert!(answer.error().contains("at most 10"), "{}", answer.error());
    let answer = post_to(server.addr, "/v1/features", &json!({"prompt": "Speak"}));
    assert_eq!(answer.status, 400);
    assert!(
        answer.error().contains("no dictionary"),
        "{}",
        answer.error()
    );
    let answer = post_to(
        server.addr,
        "/v1/attention",
        &json!({"prompt": "Speak unto", "layers": [0, 1, 2, 3, 0, 1, 2, 3]}),
    );
    assert_eq!(answer.status, 200);
    let small = Limits {
        json_values: 100,
        ..Limits::default()
    };
    drop(server);
    let server = start(None, small);
    let answer = post_to(
        server.addr,
        "/v1/attention",
        &json!({"prompt": "Speak unto the children of"}),
    );
    assert_eq!(answer.status, 413);
    assert!(answer.error().contains("layers"), "{}", answer.error());
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

#[test]
fn concurrent_traces_share_calls_and_each_gets_its_own_rows() {
    let server = start(None, Limits::default());
    let model = demo_model();
    let prompts = [
        "In the beginning",
        "And God said",
        "Let there be",
        "And the earth",
    ];
    let lengths: Vec<usize> = prompts
        .iter()
        .map(|p| model.encode(&[p]).unwrap().len())
        .collect();
    assert!(lengths.iter().all(|&len| len == lengths[0]), "{lengths:?}");
    let save = "layers.2.layer_output[:, -1]";
    let specs = RequestSpecs {
        save: vec![save.into()],
        zero: vec!["layers.0.self_attn.attention_head_outputs[:, :, 1]".into()],
        ..Default::default()
    };
    let expected: Vec<Vec<(String, Vec<f32>)>> = prompts
        .iter()
        .map(|prompt| sorted(library_run(&model, &[prompt], &specs, None).1))
        .collect();
    let addr = server.addr;
    // One client keeps the model busy with generations, so the traces queue up behind them.
    let busy = std::thread::spawn(move || {
        for _ in 0..4 {
            let body = json!({"prompts": ["In the beginning"], "max_new_tokens": 48});
            assert_eq!(post(addr, &body).status, 200);
        }
    });
    let clients: Vec<_> = (0..6)
        .map(|client| {
            let expected = expected.clone();
            let specs = specs.clone();
            std::thread::spawn(move || {
                let mut shared = 0;
                for round in 0..8 {
                    let which = (client + round) % prompts.len();
                    let body =
                        json!({"prompts": [prompts[which]], "save": specs.save, "zero": specs.zero});
                    let answer = post(addr, &body);
                    assert_eq!(answer.status, 200, "{}", answer.error());
                    let batch = answer.headers.iter().find(|(name, _)| name == "x-hookscope-batch");
                    let batch: usize = batch.map(|(_, v)| v.parse().unwrap()).unwrap();
                    shared += usize::from(batch > 1);
                    let served = json_values(&answer.json());
                    assert_eq!(served.len(), expected[which].len());
                    for ((name, got), (expected_name, want)) in served.iter().zip(&expected[which]) {
                        assert_eq!(name, expected_name);
                        let diff = got.iter().zip(want).map(|(a, b)| (a - b).abs());
                        assert!(diff.fold(0.0, f32::max) < 1e-5, "client {client}: {name}");
                    }
                }
                shared
            })
        })
        .collect();
    let shared: usize = clients.into_iter().map(|c| c.join().unwrap()).sum();
    busy.join().unwrap();
    assert!(shared > 0, "no two traces ever shared a call");
}

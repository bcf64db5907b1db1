//! Traces against real parts: spans exported over OTLP/HTTP to a real receiver (a small
//! stand-in decoding with the `opentelemetry-proto` package), `traceparent` as the
//! downstream sees it, a trace kept across a restart, and JSON log lines.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::downstream::{Downstream, TRACED_ANSWER};
use crate::support::{config, send, wait_for, wait_for_blocking, wait_status, TestDb, TestServer};

const WAIT: Duration = Duration::from_secs(20);
const CALLER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// The OTLP receiver, killed when dropped.
struct Receiver {
    child: Child,
    port: u16,
    out: String,
    dir: String,
}

impl Receiver {
    fn start() -> Receiver {
        let tools = std::env::var("CLAMP_PY_TOOLS")
            .unwrap_or_else(|_| format!("{}/target/py-tools", env!("CARGO_MANIFEST_DIR")));
        let python = format!("{tools}/bin/python");
        assert!(
            std::path::Path::new(&python).exists(),
            "{python} is missing: run scripts/services.sh py-tools (scripts/test.sh does)"
        );
        let dir = format!("/tmp/clamp-otlp-{}", uuid::Uuid::new_v4());
        std::fs::create_dir_all(&dir).unwrap();
        let (port_file, out) = (format!("{dir}/port"), format!("{dir}/spans.jsonl"));
        let child = Command::new(python)
            .arg(format!(
                "{}/tests/otlp/receiver.py",
                env!("CARGO_MANIFEST_DIR")
            ))
            .args(["--port", "0", "--port-file", &port_file, "--out", &out])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the receiver starts");
        // A blocking wait: this constructor is not async.
        let port = wait_for_blocking(
            "the receiver to write its port",
            Duration::from_secs(20),
            || {
                std::fs::read_to_string(&port_file)
                    .ok()?
                    .trim()
                    .parse()
                    .ok()
            },
        );
        Receiver {
            child,
            port,
            out,
            dir,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/v1/traces", self.port)
    }

    fn spans(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a span per line"))
            .collect()
    }

    /// Waits until the spans of `trace` satisfy `done`.
    async fn wait_trace(
        &self,
        trace: &str,
        what: &str,
        done: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        wait_for(what, WAIT, || async {
            let spans: Vec<Value> = self
                .spans()
                .into_iter()
                .filter(|s| s["traceId"] == trace)
                .collect();
            done(&spans).then_some(spans)
        })
        .await
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A test configuration exporting every span to `r`, in batches a tenth of a second apart.
fn traced(db: &str, r: &Receiver) -> clamp::config::Config {
    let mut c = config(db);
    c.trace = Some(clamp::telemetry::TraceSettings {
        endpoint: r.endpoint(),
        protocol: clamp::telemetry::Protocol::Protobuf,
        timeout: Duration::from_secs(5),
        service_name: "clamp-test".into(),
        sampler: clamp::telemetry::SamplerSpec::ParentBasedOn,
        queue_size: 2048,
        batch_size: 512,
        schedule_delay: Duration::from_millis(100),
    });
    c
}

/// A database, a receiver, a downstream, and a server exporting its spans to the receiver.
async fn traced_server() -> (TestDb, Receiver, Downstream, TestServer) {
    let db = TestDb::new();
    let r = Receiver::start();
    let d = Downstream::start().await;
    let s = TestServer::start(traced(&db.url, &r)).await;
    (db, r, d, s)
}

fn step(name: &str, method: &str, url: String) -> Value {
    json!({"name": name, "mode": "HTTP", "val": {"method": method, "url": url}})
}

async fn create_traced(s: &TestServer, workflow: &str, traceparent: &str) -> String {
    let r = send(
        s.addr,
        hyper::Method::POST,
        &format!("/serviceRequest/{workflow}"),
        Some(b"{}".to_vec()),
        &[
            ("content-type", "application/json"),
            ("traceparent", traceparent),
            ("tracestate", "congo=t61rcWkgMzE"),
        ],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["serviceRequestId"].as_str().unwrap().to_string()
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

fn by_id(spans: &[Value]) -> HashMap<String, &Value> {
    spans
        .iter()
        .map(|s| (s["spanId"].as_str().unwrap().to_string(), s))
        .collect()
}

/// The parent id in a `traceparent` header value.
fn parent_in(tp: &str) -> &str {
    &tp[36..52]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_step_request_with_a_retried_step_is_one_trace() {
    let (_db, r, d, s) = traced_server().await;
    let mut flaky = step("reserve", "POST", d.url("/flaky/503"));
    flaky["retry"] = json!({"maxAttempts": 3, "initialIntervalMs": 20});
    let then = step("confirm", "POST", d.url("/traced"));
    s.create_workflow(&json!({"name": "traced", "steps": [flaky, then]}))
        .await;
    let id = create_traced(&s, "traced", CALLER).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");

    let spans = r
        .wait_trace(CALLER_TRACE, "the request's spans", |spans| {
            spans.iter().any(|s| s["name"] == "service request traced")
                && named(spans, "POST").len() == 3
        })
        .await;
    let ids = by_id(&spans);
    // The create's server span is a child of the caller's span.
    let server = named(&spans, "POST /serviceRequest/{workflow}");
    assert_eq!(server.len(), 1, "{spans:#?}");
    let server = server[0];
    assert_eq!(server["kind"], "SPAN_KIND_SERVER");
    assert_eq!(server["parentSpanId"], CALLER_SPAN);
    assert_eq!(server["attributes"]["http.response.status_code"], 200);
    assert_eq!(server["resource"]["service.name"], "clamp-test");
    // The request's span hangs from the server span, from the create to COMPLETED.
    let request = named(&spans, "service request traced")[0];
    assert_eq!(request["parentSpanId"], server["spanId"]);
    assert_eq!(
        request["attributes"]["clamp.service_request.id"],
        id.as_str()
    );
    assert_eq!(
        request["attributes"]["clamp.service_request.status"],
        "COMPLETED"
    );
    // Three client spans under it: the failed attempt (with its retry event), the
    // retried one, and the second step.
    let mut attempts = named(&spans, "POST");
    attempts.sort_by_key(|s| s["startTimeUnixNano"].as_u64());
    for a in &attempts {
        assert_eq!(a["kind"], "SPAN_KIND_CLIENT");
        assert_eq!(a["parentSpanId"], request["spanId"], "{a}");
        assert_eq!(a["attributes"]["http.request.method"], "POST");
    }
    let (first, second, third) = (attempts[0], attempts[1], attempts[2]);
    assert_eq!(first["attributes"]["clamp.step.attempt"], 1);
    assert_eq!(first["attributes"]["http.response.status_code"], 503);
    assert_eq!(first["attributes"]["error.type"], "503");
    assert_eq!(first["status"]["code"], "STATUS_CODE_ERROR");
    assert_eq!(first["events"][0]["name"], "retry");
    assert_eq!(
        first["events"][0]["attributes"]["clamp.retry.cause"],
        "status"
    );
    assert_eq!(second["attributes"]["clamp.step.attempt"], 2);
    assert_eq!(second["attributes"]["http.request.resend_count"], 1);
    assert_eq!(second["attributes"]["http.response.status_code"], 200);
    assert_eq!(
        second["attributes"]["url.full"],
        d.url("/flaky/503").as_str()
    );
    assert_eq!(third["attributes"]["clamp.step.name"], "confirm");
    // The downstream answered with a traceparent of its own: linked.
    assert_eq!(third["links"][0]["spanId"], parent_in(TRACED_ANSWER));
    // Each call carried a traceparent whose parent is its attempt's span, and the
    // caller's tracestate.
    let mut calls = d.received("/flaky/503");
    calls.extend(d.received("/traced"));
    assert_eq!(calls.len(), 3);
    for (call, attempt) in calls.iter().zip([first, second, third]) {
        let tp = &call.headers["traceparent"];
        assert_eq!(&tp[3..35], CALLER_TRACE, "{tp}");
        assert_eq!(parent_in(tp), attempt["spanId"].as_str().unwrap());
        assert!(ids.contains_key(parent_in(tp)));
        assert_eq!(call.headers["tracestate"], "congo=t61rcWkgMzE");
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tracing_the_callers_traceparent_goes_on_as_it_came() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "plain", "steps": [step("a", "POST", d.url("/api/echo"))]}))
        .await;
    let id = create_traced(&s, "plain", CALLER).await;
    wait_status(&s, &id, &["COMPLETED"], WAIT).await;
    // Malformed: ignored (created, and no traceparent goes on), never a 4xx.
    let bad = create_traced(&s, "plain", "00-not-a-trace-01").await;
    wait_status(&s, &bad, &["COMPLETED"], WAIT).await;
    let calls = d.received("/api/echo");
    assert_eq!(calls.len(), 2);
    let with: Vec<_> = calls
        .iter()
        .filter_map(|c| c.headers.get("traceparent"))
        .collect();
    assert_eq!(
        with,
        [CALLER],
        "one call carries the caller's traceparent, unchanged"
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_traceparent_starts_a_new_trace_when_tracing_is_on() {
    let (_db, r, d, s) = traced_server().await;
    s.create_workflow(&json!({"name": "fresh", "steps": [step("a", "POST", d.url("/api/echo"))]}))
        .await;
    let id = create_traced(
        &s,
        "fresh",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    )
    .await;
    wait_status(&s, &id, &["COMPLETED"], WAIT).await;
    d.wait_for("/api/echo").await;
    let tp = d.received("/api/echo")[0].headers["traceparent"].clone();
    let trace = tp[3..35].to_string();
    assert_ne!(trace, "00000000000000000000000000000000");
    let spans = r
        .wait_trace(&trace, "a new trace", |s| {
            s.iter().any(|s| s["name"] == "service request fresh")
        })
        .await;
    let server = named(&spans, "POST /serviceRequest/{workflow}")[0];
    assert_eq!(
        server["parentSpanId"], "",
        "a root: the caller's header was ignored"
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_paused_across_a_restart_keeps_its_trace() {
    let (db, r, d, s) = traced_server().await;
    let mut ask = step("ask", "POST", d.url("/api/accepted"));
    ask["type"] = json!("ASYNC");
    let then = step("use", "POST", d.url("/api/echo"));
    s.create_workflow(&json!({"name": "pausing", "steps": [ask, then]}))
        .await;
    let id = create_traced(&s, "pausing", CALLER).await;
    wait_status(&s, &id, &["PAUSED"], WAIT).await;
    s.shutdown().await;

    // Another process (here: a new server on the same database) gets the answer.
    let s = TestServer::start(traced(&db.url, &r)).await;
    // The service answers with a traceparent of its own: the resume links to it.
    let resp = send(
        s.addr,
        hyper::Method::POST,
        "/stepResponse",
        Some(
            json!({"serviceRequestId": id, "stepId": 1, "response": {"ok": true}})
                .to_string()
                .into_bytes(),
        ),
        &[
            ("content-type", "application/json"),
            ("traceparent", TRACED_ANSWER),
        ],
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let spans = r
        .wait_trace(CALLER_TRACE, "both steps' spans and the resume", |s| {
            named(s, "POST").len() == 2
                && !named(s, "resume").is_empty()
                && !named(s, "service request pausing").is_empty()
        })
        .await;
    let request = named(&spans, "service request pausing")[0];
    let mut attempts = named(&spans, "POST");
    attempts.sort_by_key(|s| s["startTimeUnixNano"].as_u64());
    assert_eq!(attempts[0]["events"][0]["name"], "pause");
    assert_eq!(
        named(&spans, "resume")[0]["links"][0]["spanId"],
        parent_in(TRACED_ANSWER)
    );
    for a in attempts.iter().chain(named(&spans, "resume").iter()) {
        assert_eq!(a["parentSpanId"], request["spanId"], "{a}");
    }
    let after = &d.received("/api/echo")[0].headers["traceparent"];
    assert_eq!(&after[3..35], CALLER_TRACE);
    assert_eq!(parent_in(after), attempts[1]["spanId"].as_str().unwrap());
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_ends_the_requests_span_with_its_event() {
    let (_db, r, d, s) = traced_server().await;
    let mut ask = step("ask", "POST", d.url("/api/accepted"));
    ask["type"] = json!("ASYNC");
    s.create_workflow(&json!({"name": "cancelled", "steps": [ask]}))
        .await;
    let id = create_traced(&s, "cancelled", CALLER).await;
    wait_status(&s, &id, &["PAUSED"], WAIT).await;
    let c = s
        .post_json(
            &format!("/serviceRequest/{id}/cancel"),
            &json!({"reason": "no longer needed"}),
        )
        .await;
    assert_eq!(c.status, 200, "{}", c.text());
    let spans = r
        .wait_trace(CALLER_TRACE, "the cancelled request's span", |s| {
            !named(s, "service request cancelled").is_empty()
        })
        .await;
    let request = named(&spans, "service request cancelled")[0];
    assert_eq!(
        request["attributes"]["clamp.service_request.status"],
        "CANCELLED"
    );
    assert_eq!(request["events"][0]["name"], "cancel");
    assert_eq!(
        request["events"][0]["attributes"]["clamp.cancel.reason"],
        "no longer needed"
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_log_lines_parse_and_name_the_request_step_and_trace() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let port = crate::support::free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_clamp"))
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--database-url", &db.url, "--threads", "1"])
        .args(["--log-format", "json"])
        .env("LOG_LEVEL", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("binary starts");
    let stdout = child.stdout.take().unwrap();
    let lines = std::thread::spawn(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });
    let child = crate::support::Spawned(child);
    crate::support::wait_healthy(port).await;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let wf = json!({"name": "logged", "steps": [step("down", "POST", d.url("/status/500"))]});
    let r = send(
        addr,
        hyper::Method::POST,
        "/workflow",
        Some(wf.to_string().into_bytes()),
        &[("content-type", "application/json")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send(
        addr,
        hyper::Method::POST,
        "/serviceRequest/logged",
        Some(b"{}".to_vec()),
        &[
            ("content-type", "application/json"),
            ("traceparent", CALLER),
        ],
    )
    .await;
    let id = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    wait_for("the request to fail", WAIT, || async {
        let v = send(
            addr,
            hyper::Method::GET,
            &format!("/serviceRequest/{id}"),
            None,
            &[],
        )
        .await;
        (v.json()["status"] == "FAILED").then_some(())
    })
    .await;
    // SIGTERM: it shuts down and closes its output.
    unsafe {
        libc::kill(child.0.id() as i32, libc::SIGTERM);
    }
    let lines = lines.join().unwrap();
    drop(child);
    assert!(lines.len() > 3, "{lines:?}");
    let parsed: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    for p in &parsed {
        assert!(
            p["timestamp"].is_string() && p["level"].is_string() && p["message"].is_string(),
            "{p}"
        );
    }
    let about = parsed
        .iter()
        .find(|p| p["service_request_id"] == id.as_str())
        .unwrap_or_else(|| panic!("no line names {id}: {lines:#?}"));
    assert_eq!(about["step_id"], 1, "{about}");
    assert_eq!(about["trace_id"], CALLER_TRACE, "{about}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_request_continues_its_trace() {
    let (_db, r, d, s) = traced_server().await;
    s.create_workflow(
        &json!({"name": "again", "steps": [step("a", "POST", d.url("/until-fixed"))]}),
    )
    .await;
    let id = create_traced(&s, "again", CALLER).await;
    wait_status(&s, &id, &["FAILED"], WAIT).await;
    d.fix();
    let retried = s
        .post_json(&format!("/serviceRequest/{id}/retry"), &json!({}))
        .await;
    assert_eq!(retried.status, 200, "{}", retried.text());
    wait_status(&s, &id, &["COMPLETED"], WAIT).await;
    let spans = r
        .wait_trace(
            CALLER_TRACE,
            "both runs' request spans and the retry",
            |s| named(s, "service request again").len() == 2 && !named(s, "retry").is_empty(),
        )
        .await;
    let mut runs = named(&spans, "service request again");
    runs.sort_by_key(|s| s["endTimeUnixNano"].as_u64());
    assert_eq!(
        runs[0]["attributes"]["clamp.service_request.status"],
        "FAILED"
    );
    assert_eq!(
        runs[1]["attributes"]["clamp.service_request.status"],
        "COMPLETED"
    );
    assert_eq!(runs[1]["attributes"]["clamp.service_request.retries"], 1);
    assert_ne!(runs[0]["spanId"], runs[1]["spanId"]);
    assert_eq!(runs[0]["parentSpanId"], runs[1]["parentSpanId"]);
    // Every call, before and after the retry, is in the caller's trace.
    let calls = d.received("/until-fixed");
    assert!(calls.len() >= 2);
    for c in &calls {
        assert_eq!(&c.headers["traceparent"][3..35], CALLER_TRACE);
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_branch_of_a_fan_out_is_traced_under_the_request() {
    let (_db, r, d, s) = traced_server().await;
    // A WAIT of no time ends each branch: the branches run as child requests.
    let rest = json!({"name": "rest", "mode": "WAIT", "val": {"duration": "PT0S"}});
    s.create_workflow(&json!({"name": "fan", "steps": [
        {"name": "both", "mode": "PARALLEL", "val": {"branches": [
            {"name": "a", "steps": [step("ask", "POST", d.url("/api/echo")), rest.clone()]},
            {"name": "b", "steps": [step("ask", "POST", d.url("/api/echo")), rest]}]}}]}))
        .await;
    let id = create_traced(&s, "fan", CALLER).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let spans = r
        .wait_trace(CALLER_TRACE, "the fan-out's spans", |spans| {
            !named(spans, "service request fan").is_empty()
                && named(spans, "POST").len() == 2
                && !named(spans, "service request fan/1/a").is_empty()
                && !named(spans, "service request fan/1/b").is_empty()
        })
        .await;
    let ids = by_id(&spans);
    let request = named(&spans, "service request fan")[0];
    // Each branch's request span, and its step's span under it, lead up to the request's.
    for branch in ["fan/1/a", "fan/1/b"] {
        let own = named(&spans, &format!("service request {branch}"))[0];
        let mut up = own;
        let mut hops = 0;
        while up["spanId"] != request["spanId"] {
            let parent = up["parentSpanId"].as_str().unwrap_or_default();
            up = ids
                .get(parent)
                .unwrap_or_else(|| panic!("{branch}: {parent} not in the trace: {spans:#?}"));
            hops += 1;
            assert!(
                hops < 5,
                "{branch} does not lead to the request: {spans:#?}"
            );
        }
        let call = named(&spans, "POST")
            .into_iter()
            .find(|c| c["parentSpanId"] == own["spanId"]);
        assert!(call.is_some(), "{branch}'s step under its span: {spans:#?}");
    }
    s.shutdown().await;
}

/// Branches that only call run as lanes of the request: each branch step's span hangs
/// under the PARALLEL step's span, which hangs under the request's, and names its branch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_lane_step_is_traced_under_its_parallel_step() {
    let (_db, r, d, s) = traced_server().await;
    s.create_workflow(&json!({"name": "lanes", "steps": [
        {"name": "both", "mode": "PARALLEL", "val": {"branches": [
            {"name": "a", "steps": [step("ask", "POST", d.url("/api/echo"))]},
            {"name": "b", "steps": [step("ask", "POST", d.url("/api/echo"))]}]}}]}))
        .await;
    let id = create_traced(&s, "lanes", CALLER).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let spans = r
        .wait_trace(CALLER_TRACE, "the lanes' spans", |spans| {
            !named(spans, "service request lanes").is_empty()
                && named(spans, "POST").len() == 2
                && !named(spans, "fan out 2 branches").is_empty()
        })
        .await;
    let request = named(&spans, "service request lanes")[0];
    let fan = named(&spans, "fan out 2 branches")[0];
    assert_eq!(fan["parentSpanId"], request["spanId"], "{spans:#?}");
    let mut branches: Vec<&str> = named(&spans, "POST")
        .into_iter()
        .map(|c| {
            assert_eq!(c["parentSpanId"], fan["spanId"], "{spans:#?}");
            assert_eq!(c["attributes"]["clamp.fan.step.id"], 1, "{c}");
            c["attributes"]["clamp.fan.branch"].as_str().unwrap()
        })
        .collect();
    branches.sort_unstable();
    assert_eq!(branches, ["a", "b"]);
    // Each call carried its own span's context, of the request's trace.
    for call in d.received("/api/echo") {
        let tp = call.headers.get("traceparent").unwrap();
        assert!(tp.contains(CALLER_TRACE), "{tp}");
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_a_step_names_is_in_no_span() {
    const VALUE: &str = "sk_span_secret_93c1e0";
    let db = TestDb::new();
    let r = Receiver::start();
    let d = Downstream::start().await;
    let dir = std::env::temp_dir().join(format!("clamp-secrets-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("SPAN_KEY"), VALUE).unwrap();
    let mut cfg = traced(&db.url, &r);
    cfg.secrets = std::sync::Arc::new(clamp::secrets::Secrets::new(Some(dir.clone())));
    let s = TestServer::start(cfg).await;
    let mut pay = step(
        "pay",
        "POST",
        format!("{}?key={{{{secret:SPAN_KEY}}}}", d.url("/api/echo")),
    );
    pay["val"]["headers"] = json!("Authorization:Bearer {{secret:SPAN_KEY}};");
    s.create_workflow(&json!({"name": "secretive", "steps": [pay]}))
        .await;
    let id = create_traced(&s, "secretive", CALLER).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(
        d.received("/api/echo")[0].headers["authorization"],
        format!("Bearer {VALUE}")
    );
    // Every span this server exported (its receiver is its own).
    let spans = wait_for("the request's and the step's spans", WAIT, || async {
        let spans = r.spans();
        (named(&spans, "service request secretive").len() == 1 && named(&spans, "POST").len() == 1)
            .then_some(spans)
    })
    .await;
    let all = serde_json::to_string(&spans).unwrap();
    assert!(!all.contains(VALUE), "{all}");
    // The step's span names the URL with the reference, not the value.
    assert!(all.contains("secret:SPAN_KEY"), "{all}");
    s.shutdown().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivered_events_traceparent_is_linked_from_the_resume() {
    let (_db, r, d, s) = traced_server().await;
    let approval = json!({"name": "approval", "mode": "EVENT",
        "val": {"event": "claim.approved", "key": "approval.request.claim"}});
    let then = step("use", "POST", d.url("/api/echo"));
    s.create_workflow(&json!({"name": "approving", "steps": [approval, then]}))
        .await;
    let r0 = send(
        s.addr,
        hyper::Method::POST,
        "/serviceRequest/approving",
        Some(br#"{"claim": "C-9"}"#.to_vec()),
        &[
            ("content-type", "application/json"),
            ("traceparent", CALLER),
        ],
    )
    .await;
    let id = r0.json()["serviceRequestId"].as_str().unwrap().to_string();
    wait_status(&s, &id, &["PAUSED"], WAIT).await;
    // The event comes from another trace: the resume links to it.
    let resp = send(
        s.addr,
        hyper::Method::POST,
        "/events/claim.approved",
        Some(br#"{"key": "C-9", "payload": {"approved": true}}"#.to_vec()),
        &[
            ("content-type", "application/json"),
            ("traceparent", TRACED_ANSWER),
        ],
    )
    .await;
    assert_eq!(resp.json()["matched"], 1, "{}", resp.text());
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let spans = r
        .wait_trace(CALLER_TRACE, "the resume and the next step", |s| {
            !named(s, "resume").is_empty() && named(s, "POST").len() == 1
        })
        .await;
    let resume = named(&spans, "resume")[0];
    assert_eq!(
        resume["links"][0]["spanId"],
        parent_in(TRACED_ANSWER),
        "{resume}"
    );
    assert_eq!(
        resume["links"][0]["traceId"],
        &TRACED_ANSWER[3..35],
        "{resume}"
    );
    assert!(
        resume.to_string().contains("claim.approved"),
        "the resume names its event: {resume}"
    );
    s.shutdown().await;
}

/// A WAIT's sleep and a deadline's end are on the request's trace: the WAIT step's span
/// marks its pause and a second span its end, then the next step's; a request that a
/// deadline ended while it slept ends its span FAILED, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_and_a_deadline_end_are_traced() {
    let (_db, r, d, s) = traced_server().await;
    let nap = json!({"name": "nap", "mode": "WAIT", "val": {"duration": "PT1S"}});
    s.create_workflow(&json!({"name": "napping",
        "steps": [nap, step("use", "POST", d.url("/api/echo"))]}))
        .await;
    let long = json!({"name": "long", "mode": "WAIT", "val": {"duration": "PT1H"}});
    s.create_workflow(&json!({"name": "bounded", "deadline": "PT1S",
        "steps": [long, step("use", "POST", d.url("/api/echo"))]}))
        .await;
    let id = create_traced(&s, "napping", CALLER).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let spans = r
        .wait_trace(CALLER_TRACE, "the sleep, its end and the next step", |s| {
            named(s, "wait 1000 ms").len() == 2
                && named(s, "POST").len() == 1
                && !named(s, "service request napping").is_empty()
        })
        .await;
    let waits = named(&spans, "wait 1000 ms");
    let paused: Vec<_> = waits
        .iter()
        .filter(|w| {
            w["events"]
                .as_array()
                .is_some_and(|e| e.iter().any(|e| e["name"] == "pause"))
        })
        .collect();
    assert_eq!(paused.len(), 1, "one span marks the sleep: {waits:?}");
    assert_eq!(
        named(&spans, "service request napping")[0]["attributes"]["clamp.service_request.status"],
        "COMPLETED"
    );

    const OTHER: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let id = create_traced(&s, "bounded", OTHER).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    let spans = r
        .wait_trace(
            &OTHER[3..35],
            "the request's span, ended by its deadline",
            |s| !named(s, "service request bounded").is_empty(),
        )
        .await;
    let request = named(&spans, "service request bounded")[0];
    assert_eq!(
        request["attributes"]["clamp.service_request.status"], "FAILED",
        "{request}"
    );
    assert!(
        request["attributes"]["clamp.service_request.reason"]
            .as_str()
            .unwrap()
            .contains("deadline passed"),
        "{request}"
    );
    assert!(
        named(&spans, "POST").is_empty(),
        "nothing ran after the deadline"
    );
    s.shutdown().await;
}

//! The front door: early answers that keep keep-alive connections usable, a readable 413,
//! separate header and idle timeouts, bearer tokens, idempotent creates and cancel.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(15);

/// One response read off a raw connection.
struct Raw {
    status: u16,
    head: String,
    body: Vec<u8>,
}

/// Reads one response (a head, then a Content-Length body); `buf` keeps what follows it.
async fn read_response(c: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Raw> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let n = tokio::time::timeout_at(deadline, c.read(&mut chunk))
                    .await
                    .ok()?
                    .ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            let body = buf[end + 4..end + 4 + len].to_vec();
            buf.drain(..end + 4 + len);
            let status = head.get(9..12)?.parse().ok()?;
            return Some(Raw { status, head, body });
        }
        let n = tokio::time::timeout_at(deadline, c.read(&mut chunk))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn request(method: &str, path: &str, extra: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

#[tokio::test]
async fn early_answers_keep_the_keep_alive_connection() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&simple_workflow("wf")).await;
    // 14 KB bodies the handlers never need to read.
    let big = format!("{{\"pad\": \"{}\"}}", "x".repeat(14 * 1024)).into_bytes();
    let cases: [(&str, &str, u16); 5] = [
        ("POST", "/serviceRequest/no-such-workflow", 404),
        ("POST", "/no/such/route", 404),
        ("PUT", "/workflows", 405),
        ("POST", "/serviceRequest/wf/cancel", 400),
        ("POST", "/stepResponse", 400),
    ];
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let mut buf = Vec::new();
    for i in 0..20 {
        let (method, path, want) = cases[i % cases.len()];
        let body: &[u8] = if path == "/stepResponse" {
            b"[1]"
        } else {
            &big
        };
        // The head first, the body a moment later, as a client streaming its upload does:
        // the early answer is ready before the body has arrived.
        let req = request(method, path, "", body);
        let split = req.len() - body.len();
        c.write_all(&req[..split]).await.unwrap();
        // time is what is tested: a client whose body comes a moment after its head.
        tokio::time::sleep(Duration::from_millis(20)).await;
        if let Err(e) = c.write_all(&req[split..]).await {
            panic!("request {i} ({method} {path}): the body could not be sent: {e}");
        }
        let r = read_response(&mut c, &mut buf)
            .await
            .unwrap_or_else(|| panic!("request {i} ({method} {path}): the connection broke"));
        assert_eq!(r.status, want, "{method} {path}: {}", r.head);
        assert!(
            !r.head.to_ascii_lowercase().contains("connection: close"),
            "{}",
            r.head
        );
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["code"], want);
    }
    // And the same connection still creates.
    c.write_all(&request("POST", "/serviceRequest/wf", "", b"{}"))
        .await
        .unwrap();
    assert_eq!(read_response(&mut c, &mut buf).await.unwrap().status, 200);
    s.shutdown().await;
}

#[tokio::test]
async fn a_body_over_the_limit_gets_a_readable_413_then_a_close() {
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.body_limit = 64 * 1024;
    let s = TestServer::start(cfg).await;
    s.create_workflow(&simple_workflow("wf")).await;
    // Three times the limit: within what a lingering close reads (a few limits).
    let size = 3 * 64 * 1024;
    for chunked in [false, true] {
        let mut c = TcpStream::connect(s.addr).await.unwrap();
        let head = if chunked {
            "POST /serviceRequest/wf HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
                .to_string()
        } else {
            format!("POST /serviceRequest/wf HTTP/1.1\r\nHost: localhost\r\nContent-Length: {size}\r\n\r\n")
        };
        // A plain client: it sends its whole upload, and only then reads the answer.
        let mut upload = head.into_bytes();
        let block = vec![b' '; 16 * 1024];
        for _ in 0..size / block.len() {
            if chunked {
                upload.extend_from_slice(format!("{:x}\r\n", block.len()).as_bytes());
                upload.extend_from_slice(&block);
                upload.extend_from_slice(b"\r\n");
            } else {
                upload.extend_from_slice(&block);
            }
        }
        if chunked {
            upload.extend_from_slice(b"0\r\n\r\n");
        }
        for part in upload.chunks(16 * 1024) {
            c.write_all(part)
                .await
                .unwrap_or_else(|e| panic!("chunked={chunked}: the upload was cut off: {e}"));
            // The server answers as soon as it sees the head; the rest keeps coming.
            // time is what is tested: a client that uploads slowly.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let mut got = Vec::new();
        let mut chunk = [0u8; 8192];
        let closed = loop {
            match tokio::time::timeout(Duration::from_secs(10), c.read(&mut chunk)).await {
                Ok(Ok(0)) => break true,
                Ok(Ok(n)) => got.extend_from_slice(&chunk[..n]),
                Ok(Err(e)) => panic!(
                    "chunked={chunked}: {e} after {:?}",
                    String::from_utf8_lossy(&got)
                ),
                Err(_) => break false,
            }
        };
        let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
        assert!(
            text.starts_with("http/1.1 413"),
            "chunked={chunked}: {text}"
        );
        assert!(text.contains("connection: close"), "{text}");
        assert!(text.contains("larger than 65536 bytes"), "{text}");
        assert!(closed, "the connection stayed open");
    }
    assert_eq!(db.count("SELECT count(*) FROM service_requests").await, 0);
    s.shutdown().await;
}

#[tokio::test]
async fn tokens_guard_every_route_but_health_and_ready() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let (a, b) = ("token-a-0123456789abcdef", "token-b-0123456789abcdef");
    let mut cfg = config(&db.url);
    cfg.api_tokens = clamp::tokens::ApiTokens::from_list(&[a, b]);
    let s = TestServer::start(cfg).await;
    let call = |method: hyper::Method, path: String, body: Option<Value>, token: Option<&str>| {
        let auth = token.map(|t| format!("Bearer {t}"));
        let addr = s.addr;
        async move {
            let headers: Vec<(&str, &str)> =
                auth.iter().map(|a| ("authorization", a.as_str())).collect();
            send(
                addr,
                method,
                &path,
                body.map(|b| b.to_string().into_bytes()),
                &headers,
            )
            .await
        }
    };
    use hyper::Method as M;
    for open in ["/health", "/ready"] {
        assert_eq!(
            call(M::GET, open.into(), None, None).await.status,
            200,
            "{open}"
        );
    }
    for token in [a, b] {
        let t = Some(token);
        let wf = format!("wf-{}", &token[6..7]);
        let r = call(
            M::POST,
            "/workflow".into(),
            Some(
                json!({"name": wf, "steps": [{"name": "s", "mode": "HTTP", "type": "ASYNC",
                "val": {"method": "POST", "url": d.url("/api/accepted")}}]}),
            ),
            None,
        )
        .await;
        let msg = r.expect_error(401);
        assert!(msg.contains("bearer token"), "{msg}");
        assert_eq!(r.headers["www-authenticate"], r#"Bearer realm="clamp""#);
        let wrong = call(
            M::GET,
            "/workflows?pageNumber=1&pageSize=5".into(),
            None,
            Some("token-c-0123456789abcdef"),
        )
        .await;
        wrong.expect_error(401);
        assert!(wrong.headers["www-authenticate"]
            .to_str()
            .unwrap()
            .contains("invalid_token"));
        let r = call(
            M::POST,
            "/workflow".into(),
            Some(
                json!({"name": wf, "steps": [{"name": "s", "mode": "HTTP", "type": "ASYNC",
                "val": {"method": "POST", "url": d.url("/api/accepted")}}]}),
            ),
            t,
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
        let paths: Vec<(M, String, Option<Value>)> = vec![
            (M::GET, format!("/workflow/{wf}"), None),
            (M::GET, "/workflows?pageNumber=1&pageSize=5".into(), None),
            (M::GET, "/metrics".into(), None),
            (M::GET, "/openapi.json".into(), None),
        ];
        for (m, p, body) in paths {
            call(m.clone(), p.clone(), body.clone(), None)
                .await
                .expect_error(401);
            let r = call(m, p.clone(), body, t).await;
            assert_eq!(r.status, 200, "{p}: {}", r.text());
        }
        // A create, its status, its list, its step response and a cancel.
        let path = format!("/serviceRequest/{wf}");
        call(M::POST, path.clone(), Some(json!({})), None)
            .await
            .expect_error(401);
        let r = call(M::POST, path, Some(json!({"n": 1})), t).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let id = r.json()["serviceRequestId"].as_str().unwrap().to_string();
        let status = format!("/serviceRequest/{id}");
        call(M::GET, status.clone(), None, None)
            .await
            .expect_error(401);
        wait_for("the request to pause", WAIT, || async {
            let v = call(M::GET, status.clone(), None, t).await.json();
            (v["status"] == "PAUSED").then_some(())
        })
        .await;
        let list = format!("/serviceRequests/{wf}?pageNumber=0&pageSize=5");
        call(M::GET, list.clone(), None, None)
            .await
            .expect_error(401);
        assert_eq!(call(M::GET, list, None, t).await.status, 200);
        let reply = json!({"serviceRequestId": id, "stepId": 1, "response": {"ok": true}});
        call(M::POST, "/stepResponse".into(), Some(reply.clone()), None)
            .await
            .expect_error(401);
        let r = call(M::POST, "/stepResponse".into(), Some(reply), t).await;
        assert_eq!(r.status, 200, "{}", r.text());
        // Cancel a second one.
        let r = call(M::POST, format!("/serviceRequest/{wf}"), Some(json!({})), t).await;
        let id2 = r.json()["serviceRequestId"].as_str().unwrap().to_string();
        let cancel = format!("/serviceRequest/{id2}/cancel");
        call(M::POST, cancel.clone(), None, None)
            .await
            .expect_error(401);
        let r = call(M::POST, cancel, None, t).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // The token was neither stored with the requests nor sent to the steps.
    assert_eq!(
        db.count("SELECT count(*) FROM service_requests WHERE headers ILIKE '%token-%'")
            .await,
        0
    );
    assert!(d
        .received("/api/accepted")
        .iter()
        .all(|r| !r.headers.contains_key("authorization")));
    s.shutdown().await;
}

#[tokio::test]
async fn metrics_can_be_left_open_when_tokens_are_on() {
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.api_tokens = clamp::tokens::ApiTokens::from_list(&["token-a-0123456789abcdef"]);
    cfg.metrics_open = true;
    let s = TestServer::start(cfg).await;
    assert_eq!(s.get("/metrics").await.status, 200);
    s.get("/workflows?pageNumber=1&pageSize=1")
        .await
        .expect_error(401);
    s.shutdown().await;
}

/// Creates with an `Idempotency-Key`.
async fn keyed(s: &TestServer, workflow: &str, key: &str, body: &Value) -> Resp {
    send(
        s.addr,
        hyper::Method::POST,
        &format!("/serviceRequest/{workflow}"),
        Some(body.to_string().into_bytes()),
        &[("idempotency-key", key)],
    )
    .await
}

#[tokio::test]
async fn an_idempotency_key_returns_the_original_request() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let mut cfg = config(&db.url);
    // Keyed creates are answered after commit even where others are answered on enqueue.
    cfg.ack = clamp::config::AckMode::Accept;
    let s = TestServer::start(cfg).await;
    let wf = |name: &str| {
        json!({"name": name, "steps": [{"name": "s", "mode": "HTTP",
        "val": {"method": "POST", "url": d.url("/api/echo")}}]})
    };
    s.create_workflow(&wf("orders")).await;
    s.create_workflow(&wf("refunds")).await;
    let first = keyed(&s, "orders", "order-42", &json!({"amount": 10})).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let id = first.json()["serviceRequestId"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(first.json()["status"], "NEW");
    assert!(!first.headers.contains_key("idempotent-replayed"));
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM service_requests WHERE id = '{id}'"
        ))
        .await,
        1,
        "answered before its commit"
    );
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED");
    // The same key and payload: the original request, with its status now.
    let again = keyed(&s, "orders", "order-42", &json!({"amount": 10})).await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.json()["serviceRequestId"], id.as_str());
    assert_eq!(again.json()["status"], "COMPLETED");
    assert_eq!(again.json()["pollUrl"], format!("/serviceRequest/{id}"));
    assert_eq!(again.headers["idempotent-replayed"], "true");
    // Another payload under the same key: refused.
    let other = keyed(&s, "orders", "order-42", &json!({"amount": 11})).await;
    let msg = other.expect_error(422);
    assert!(msg.contains(&id), "{msg}");
    // Keys are per workflow; no key, no deduplication.
    let r = keyed(&s, "refunds", "order-42", &json!({"amount": 10})).await;
    let refund = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    assert_ne!(refund, id);
    let a = create_request(&s, "orders", &json!({"amount": 10})).await;
    let b = create_request(&s, "orders", &json!({"amount": 10})).await;
    assert_ne!(a, b);
    // A bad key is refused.
    keyed(&s, "orders", &"k".repeat(300), &json!({}))
        .await
        .expect_error(400);
    for other in [&refund, &a, &b] {
        wait_status(&s, other, &["COMPLETED"], WAIT).await;
    }
    assert_eq!(
        d.received("/api/echo").len(),
        4,
        "one call per request, none for repeats"
    );
    s.shutdown().await;
}

#[tokio::test]
async fn a_key_past_its_window_creates_a_new_request() {
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.idempotency_window = Duration::from_millis(300);
    cfg.max_running = 0;
    let s = TestServer::start(cfg).await;
    s.create_workflow(&simple_workflow("wf")).await;
    let first = keyed(&s, "wf", "k1", &json!({})).await.json();
    let id = first["serviceRequestId"].as_str().unwrap().to_string();
    assert_eq!(
        keyed(&s, "wf", "k1", &json!({})).await.json()["serviceRequestId"],
        id.as_str()
    );
    // time is what is tested: the key's window; wait it out.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let later = keyed(&s, "wf", "k1", &json!({"changed": true})).await;
    assert_eq!(later.status, 200, "{}", later.text());
    assert_ne!(later.json()["serviceRequestId"], id.as_str());
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_on_two_instances_leave_one_request_per_key() {
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.max_running = 0;
    let one = TestServer::start(cfg.clone()).await;
    let two = TestServer::start(cfg).await;
    one.create_workflow(&simple_workflow("wf")).await;
    let addrs = [one.addr, two.addr];
    let mut tasks = Vec::new();
    for i in 0..1000usize {
        let addr = addrs[i % 2];
        tasks.push(tokio::spawn(async move {
            let key = format!("key-{}", i % 100);
            let body = json!({"key": key}).to_string().into_bytes();
            loop {
                let r = send(
                    addr,
                    hyper::Method::POST,
                    "/serviceRequest/wf",
                    Some(body.clone()),
                    &[("idempotency-key", &key)],
                )
                .await;
                match r.status.as_u16() {
                    200 => {
                        return (
                            key,
                            r.json()["serviceRequestId"].as_str().unwrap().to_string(),
                        )
                    }
                    // Overload under 1,000 clients at once is answered 503: try again.
                    // Not synchronisation: a client's back-off before it retries.
                    503 => tokio::time::sleep(Duration::from_millis(20)).await,
                    other => panic!("{other}: {}", r.text()),
                }
            }
        }));
    }
    let mut by_key: std::collections::HashMap<String, std::collections::HashSet<String>> =
        Default::default();
    for t in tasks {
        let (key, id) = t.await.unwrap();
        by_key.entry(key).or_default().insert(id);
    }
    assert_eq!(by_key.len(), 100);
    assert!(
        by_key.values().all(|ids| ids.len() == 1),
        "a key got two requests"
    );
    assert_eq!(db.count("SELECT count(*) FROM service_requests").await, 100);
    let c = db.client().await;
    for (key, ids) in &by_key {
        let id: uuid::Uuid = ids.iter().next().unwrap().parse().unwrap();
        let payload: String = c
            .query_one("SELECT payload FROM service_requests WHERE id = $1", &[&id])
            .await
            .unwrap()
            .get(0);
        assert!(payload.contains(key.as_str()), "{key}: {payload}");
    }
    one.shutdown().await;
    two.shutdown().await;
}

/// Calls to `path` that request `id` made (its steps' Idempotency-Keys are `{id}:{step}`).
fn calls_by(d: &Downstream, path: &str, id: &str) -> usize {
    let prefix = format!("{id}:");
    d.received(path)
        .iter()
        .filter(|r| {
            r.headers
                .get("idempotency-key")
                .is_some_and(|k| k.starts_with(&prefix))
        })
        .count()
}

async fn cancel(s: &TestServer, id: &str) -> Resp {
    s.post(
        &format!("/serviceRequest/{id}/cancel"),
        r#"{"reason": "changed my mind"}"#,
    )
    .await
}

#[tokio::test]
async fn cancel_racing_a_running_step_records_it_and_starts_nothing_after() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "slow", "steps": [
        {"name": "slow", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/slow/800")},
         "onFailure": [{"name": "undo", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]},
        {"name": "next", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/step1")}}]}))
        .await;
    let id = create_request(&s, "slow", &json!({})).await;
    // A twin left alone, its slow step running just behind the cancelled one's: once its
    // next step has been called, the cancelled one's would have been too.
    let twin = create_request(&s, "slow", &json!({})).await;
    wait_for("both slow steps to be running", WAIT, || async {
        (d.received("/slow/800").len() == 2).then_some(())
    })
    .await;
    let r = cancel(&s, &id).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["status"], "CANCELLED");
    // Cancelling again is fine.
    assert_eq!(cancel(&s, &id).await.status, 200);
    // The step in flight finishes and is recorded; nothing after it starts.
    let v = wait_for("the in-flight step to be recorded", WAIT, || async {
        let v = s.get(&format!("/serviceRequest/{id}")).await.json();
        (v["steps"].as_array().map_or(0, |a| a.len()) == 2).then_some(v)
    })
    .await;
    assert_eq!(v["status"], "CANCELLED", "{v}");
    assert_eq!(v["reason"], "changed my mind");
    assert_eq!(v["steps"][1]["status"], "COMPLETED", "{v}");
    let t = wait_status(&s, &twin, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(t["status"], "COMPLETED", "{t}");
    assert_eq!(
        calls_by(&d, "/api/step1", &twin),
        1,
        "the twin's next step ran"
    );
    assert_eq!(
        calls_by(&d, "/api/step1", &id),
        0,
        "a step ran after the cancel"
    );
    assert!(d.received("/api/echo").is_empty(), "onFailure ran");
    s.shutdown().await;
}

#[tokio::test]
async fn a_cancelled_paused_request_refuses_a_late_response() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "wait", "steps": [
        {"name": "ask", "mode": "HTTP", "type": "ASYNC", "val": {"method": "POST", "url": d.url("/api/accepted")}},
        {"name": "next", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}))
        .await;
    let id = create_request(&s, "wait", &json!({})).await;
    wait_status(&s, &id, &["PAUSED"], WAIT).await;
    assert_eq!(cancel(&s, &id).await.status, 200);
    let late = s
        .post_json(
            "/stepResponse",
            &json!({"serviceRequestId": id, "stepId": 1, "response": {"late": true}}),
        )
        .await;
    late.expect_error(409);
    let v = s.get(&format!("/serviceRequest/{id}")).await.json();
    assert_eq!(v["status"], "CANCELLED");
    assert!(d.received("/api/echo").is_empty());
    s.shutdown().await;
}

#[tokio::test]
async fn cancel_is_409_once_finished_and_404_for_unknown() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "quick", "steps": [
        {"name": "s", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}))
        .await;
    let id = create_request(&s, "quick", &json!({})).await;
    wait_status(&s, &id, &["COMPLETED"], WAIT).await;
    let msg = cancel(&s, &id).await.expect_error(409);
    assert!(msg.contains("COMPLETED"), "{msg}");
    cancel(&s, &uuid::Uuid::now_v7().to_string())
        .await
        .expect_error(404);
    cancel(&s, "not-a-uuid").await.expect_error(400);
    s.post(&format!("/serviceRequest/{id}/cancel"), "[1]")
        .await
        .expect_error(400);
    s.shutdown().await;
}

#[tokio::test]
async fn a_cancel_through_the_other_instance_stops_the_holder() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let runner = TestServer::start(config(&db.url)).await;
    let mut api = config(&db.url);
    api.max_running = 0;
    let api = TestServer::start(api).await;
    runner
        .create_workflow(&json!({"name": "two", "steps": [
            {"name": "slow", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/slow/600")}},
            {"name": "next", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/step1")}}]}))
        .await;
    let id = create_request(&runner, "two", &json!({})).await;
    // A twin left alone, just behind it: its next step being called shows when the
    // cancelled one's would have been.
    let twin = create_request(&runner, "two", &json!({})).await;
    wait_for("both slow steps to be running", WAIT, || async {
        (d.received("/slow/600").len() == 2).then_some(())
    })
    .await;
    assert_eq!(cancel(&api, &id).await.status, 200);
    let v = wait_for("the holder to record its step and stop", WAIT, || async {
        let v = api.get(&format!("/serviceRequest/{id}")).await.json();
        (v["steps"].as_array().map_or(0, |a| a.len()) == 2).then_some(v)
    })
    .await;
    assert_eq!(v["status"], "CANCELLED", "{v}");
    let t = wait_status(&api, &twin, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(t["status"], "COMPLETED", "{t}");
    assert_eq!(
        calls_by(&d, "/api/step1", &twin),
        1,
        "the twin's next step ran"
    );
    assert_eq!(
        calls_by(&d, "/api/step1", &id),
        0,
        "a step ran after the cancel"
    );
    runner.shutdown().await;
    api.shutdown().await;
}

#[tokio::test]
async fn a_pending_retry_does_not_run_after_a_cancel() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let mut cfg = config(&db.url);
    cfg.sweep_interval = Duration::from_millis(50);
    let s = TestServer::start(cfg).await;
    s.create_workflow(&json!({"name": "retry", "steps": [
        {"name": "s", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/flaky/503")},
         "retry": {"initialIntervalMs": 600, "maxIntervalMs": 600}}]}))
        .await;
    let id = create_request(&s, "retry", &json!({})).await;
    let v = wait_for("the retry to be pending", WAIT, || async {
        let v = s.get(&format!("/serviceRequest/{id}")).await.json();
        v.get("retrying").is_some().then_some(v)
    })
    .await;
    assert_eq!(v["retrying"]["attempts"], 1);
    assert_eq!(cancel(&s, &id).await.status, 200);
    // A marker made after the cancel fails the same way: its retry is due after the
    // cancelled one's, and claims take due retries oldest first. Once the marker's retry
    // has run, the cancelled one's would have been claimed too.
    let marker = create_request(&s, "retry", &json!({})).await;
    let v = wait_status(&s, &marker, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(
        d.calls_for_key(&format!("{marker}:1")),
        2,
        "the marker retried"
    );
    assert_eq!(d.calls_for_key(&format!("{id}:1")), 1, "the retry ran");
    let v = s.get(&format!("/serviceRequest/{id}")).await.json();
    assert_eq!(v["status"], "CANCELLED");
    assert!(v.get("retrying").is_none(), "{v}");
    s.shutdown().await;
}

/// Sends `head` (a request head without its final blank line) and `body` on a fresh
/// connection; the status and body.
async fn raw(addr: std::net::SocketAddr, head: &str, body: &[u8]) -> (u16, String) {
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut req = format!(
        "{head}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    c.write_all(&req).await.unwrap();
    let mut buf = Vec::new();
    let r = read_response(&mut c, &mut buf).await.expect("an answer");
    (r.status, String::from_utf8_lossy(&r.body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tokens_off_cross_site_requests_are_refused() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let mut cfg = config(&db.url);
    cfg.allowed_hosts = vec!["clamp".into(), ".corp.example".into()];
    let s = TestServer::start(cfg).await;
    let here = s.addr.to_string();
    let port = s.addr.port();
    let wf = json!({"name": "plain", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]});
    let define = wf.to_string();
    // A page of another site posting text/plain (no preflight), and a page whose name
    // was rebound to this address: refused, and nothing defined.
    for head in [
        format!("POST /workflow HTTP/1.1\r\nHost: {here}\r\nContent-Type: text/plain\r\nOrigin: https://evil.example"),
        "POST /workflow HTTP/1.1\r\nHost: attacker.example\r\nContent-Type: text/plain".to_string(),
        format!("POST /workflow HTTP/1.1\r\nHost: attacker.example:{port}\r\nOrigin: http://attacker.example:{port}"),
        format!("POST /workflow HTTP/1.1\r\nHost: {here}\r\nOrigin: null"),
        format!("POST /workflow HTTP/1.1\r\nHost: localhost:{port}\r\nOrigin: http://localhost:3000"),
    ] {
        let (status, body) = raw(s.addr, &head, define.as_bytes()).await;
        assert_eq!(status, 403, "{head}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["code"], 403, "{body}");
        assert!(
            v["message"].as_str().unwrap().contains("not this server's"),
            "{body}"
        );
    }
    assert_eq!(s.get("/workflow/plain").await.status, 404);
    // Reads and the console too: a rebinding page would read them as its own.
    for path in ["/serviceRequests", "/console", "/metrics"] {
        let (status, _) = raw(
            s.addr,
            &format!("GET {path} HTTP/1.1\r\nHost: attacker.example:{port}"),
            b"",
        )
        .await;
        assert_eq!(status, 403, "{path}");
    }
    // Health and readiness tell nothing: open whatever the Host.
    let (status, _) = raw(
        s.addr,
        "GET /health HTTP/1.1\r\nHost: attacker.example",
        b"",
    )
    .await;
    assert_eq!(status, 200);
    // curl -d (no Origin, any Content-Type), this server's own pages, loopback names and
    // the names the operator allowed: served as before.
    for head in [
        format!("POST /workflow HTTP/1.1\r\nHost: {here}\r\nContent-Type: application/x-www-form-urlencoded"),
        format!("PUT /workflow/plain HTTP/1.1\r\nHost: localhost:{port}\r\nContent-Type: text/plain\r\nOrigin: http://localhost:{port}"),
        format!("PUT /workflow/plain HTTP/1.1\r\nHost: clamp:{port}"),
        "PUT /workflow/plain HTTP/1.1\r\nHost: api.corp.example\r\nOrigin: https://console.corp.example".to_string(),
        "PUT /workflow/plain HTTP/1.0".to_string(),
    ] {
        let (status, body) = raw(s.addr, &head, define.as_bytes()).await;
        assert_eq!(status, 200, "{head}: {body}");
    }
    let (status, body) = raw(
        s.addr,
        &format!("POST /serviceRequest/plain HTTP/1.1\r\nHost: {here}\r\nContent-Type: text/plain"),
        b"{\"n\":1}",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = raw(
        s.addr,
        &format!("POST /serviceRequest/plain HTTP/1.1\r\nHost: {here}\r\nContent-Type: text/plain\r\nOrigin: https://evil.example"),
        b"{\"n\":2}",
    )
    .await;
    assert_eq!(status, 403);
    s.shutdown().await;
    // With tokens on, the token is the guard: a foreign Origin with a valid token is served.
    let mut cfg = config(&db.url);
    cfg.api_tokens = clamp::tokens::ApiTokens::from_list(&["cross-token-0123456789"]);
    let s = TestServer::start(cfg).await;
    let (status, body) = raw(
        s.addr,
        "GET /workflow/plain HTTP/1.1\r\nHost: attacker.example\r\nOrigin: https://evil.example\r\nAuthorization: Bearer cross-token-0123456789",
        b"",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    s.shutdown().await;
}

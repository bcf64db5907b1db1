//! `POST /serviceRequest/{workflow}`, `GET /serviceRequest/{id}`, `GET /serviceRequests/{workflow}`.

use hyper::Method;
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn creates_and_reads_service_requests() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&simple_workflow("wf")).await;

    let r = send(
        s.addr,
        Method::POST,
        "/serviceRequest/wf",
        Some(br#"{"claim": {"type": "MOTOR", "amount": 12.5}}"#.to_vec()),
        &[
            ("x-correlation-id", "c-1"),
            ("authorization", "Bearer secret"),
            ("cookie", "a=b"),
        ],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let id = v["serviceRequestId"].as_str().unwrap().to_string();
    assert_eq!(v["status"], "NEW");
    assert_eq!(v["pollUrl"], format!("/serviceRequest/{id}"));
    assert_eq!(uuid::Uuid::parse_str(&id).unwrap().get_version_num(), 7);

    let st = s.get(&format!("/serviceRequest/{id}")).await;
    assert_eq!(st.status, 200);
    let st = st.json();
    assert_eq!(st["service_request_id"], id);
    assert_eq!(st["workflow_name"], "wf");
    assert!(st["steps"].is_array());
    assert!(st["total_time_in_ms"].is_number());

    // The payload and the forwardable headers are stored; credentials are not.
    let c = db.client().await;
    let row = c
        .query_one(
            "SELECT payload, headers FROM service_requests WHERE id = $1",
            &[&uuid::Uuid::parse_str(&id).unwrap()],
        )
        .await
        .unwrap();
    let payload: serde_json::Value = serde_json::from_str(row.get(0)).unwrap();
    assert_eq!(payload, json!({"claim": {"type": "MOTOR", "amount": 12.5}}));
    let headers: serde_json::Value = serde_json::from_str(row.get(1)).unwrap();
    let text = headers.to_string();
    assert!(
        text.contains("x-correlation-id") && text.contains("c-1"),
        "{text}"
    );
    assert!(
        !text.contains("secret") && !text.contains("cookie") && !text.contains("\"host\""),
        "{text}"
    );

    // An empty body is an empty payload.
    let r = s.post("/serviceRequest/wf", "").await;
    assert_eq!(r.status, 200);
    s.shutdown().await;
}

#[tokio::test]
async fn rejects_bad_service_requests() {
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.body_limit = 1024;
    let s = TestServer::start(cfg).await;
    s.create_workflow(&simple_workflow("wf")).await;

    let msg = s
        .post("/serviceRequest/unknown", "{}")
        .await
        .expect_error(404);
    assert!(msg.contains("unknown"), "{msg}");
    s.post("/serviceRequest/wf", "{\"a\": ")
        .await
        .expect_error(400);
    s.post("/serviceRequest/wf", "not json at all")
        .await
        .expect_error(400);
    for non_object in ["[1,2]", "\"s\"", "12", "null", "true"] {
        let msg = s
            .post("/serviceRequest/wf", non_object)
            .await
            .expect_error(400);
        assert!(msg.contains("object"), "{non_object}: {msg}");
    }
    s.post("/serviceRequest/wf", r#"{"a": "\u0000"}"#)
        .await
        .expect_error(400);
    let big = format!("{{\"a\": \"{}\"}}", "x".repeat(2000));
    s.post("/serviceRequest/wf", &big).await.expect_error(413);

    s.get("/serviceRequest/not-a-uuid").await.expect_error(400);
    s.get("/serviceRequest/0190b8a0-0000-7000-8000-000000000000")
        .await
        .expect_error(404);
    s.get("/nothing/here").await.expect_error(404);
    send(s.addr, Method::DELETE, "/workflow/wf", None, &[])
        .await
        .expect_error(405);
    // Nothing bad was stored.
    assert_eq!(db.count("SELECT count(*) FROM service_requests").await, 0);
    s.shutdown().await;
}

#[tokio::test]
async fn pages_service_requests_from_zero() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&simple_workflow("wf")).await;
    s.create_workflow(&simple_workflow("other")).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let r = s.post_json("/serviceRequest/wf", &json!({"i": i})).await;
        let id = r.json()["serviceRequestId"].as_str().unwrap().to_string();
        // Ids order by their millisecond (UUIDv7): the next one must come from a later one.
        let made_ms = u64::from_str_radix(&id.replace('-', "")[..12], 16).unwrap();
        wait_for(
            "the clock to pass the millisecond of the last id",
            std::time::Duration::from_secs(1),
            || async {
                let now_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis() as u64;
                (now_ms > made_ms).then_some(())
            },
        )
        .await;
        ids.push(id);
    }
    s.post("/serviceRequest/other", "{}").await;
    let page = |n: i64| {
        let path = format!("/serviceRequests/wf?pageNumber={n}&pageSize=2");
        let s = &s;
        async move { s.get(&path).await }
    };
    let p0 = page(0).await.json();
    assert_eq!(p0["pageNumber"], 0);
    assert_eq!(p0["pageSize"], 2);
    let got: Vec<_> = p0["serviceRequests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect();
    // Newest first.
    assert_eq!(got, [ids[4].clone(), ids[3].clone()]);
    assert_eq!(p0["serviceRequests"][0]["payload"], json!({"i": 4}));
    assert_eq!(p0["serviceRequests"][0]["workflow_name"], "wf");
    assert!(p0["serviceRequests"][0]["status"].is_string());
    assert_eq!(
        page(2).await.json()["serviceRequests"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        page(3).await.json()["serviceRequests"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    s.get("/serviceRequests/wf?pageSize=2")
        .await
        .expect_error(400);
    s.get("/serviceRequests/wf?pageNumber=-1&pageSize=2")
        .await
        .expect_error(400);
    s.get("/serviceRequests/wf?pageNumber=0&pageSize=0")
        .await
        .expect_error(400);
    s.get("/serviceRequests/nope?pageNumber=0&pageSize=2")
        .await
        .expect_error(404);
    s.shutdown().await;
}

#[tokio::test]
async fn accept_mode_answers_on_enqueue_and_flushes_on_shutdown() {
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.ack = clamp::config::AckMode::Accept;
    let s = TestServer::start(cfg).await;
    s.create_workflow(&simple_workflow("wf")).await;
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let addr = s.addr;
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::open(addr).await;
            let mut ok = 0;
            for i in 0..50 {
                let r = c
                    .post("/serviceRequest/wf", &format!("{{\"i\":{i}}}"))
                    .await
                    .unwrap();
                assert_eq!(r.status, 200, "{}", r.text());
                ok += 1;
            }
            ok
        }));
    }
    let mut n_ok = 0;
    for t in tasks {
        n_ok += t.await.unwrap();
    }
    s.shutdown().await;
    assert_eq!(
        db.count("SELECT count(*) FROM service_requests").await,
        n_ok
    );
}

#[tokio::test]
async fn exposes_metrics_and_readiness() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&simple_workflow("wf")).await;
    s.post("/serviceRequest/wf", "{}").await;
    s.post("/serviceRequest/wf", "[]").await;
    assert_eq!(s.get("/health").await.status, 200);
    assert_eq!(s.get("/ready").await.status, 200);
    let m = s.get("/metrics").await;
    assert_eq!(m.status, 200);
    let text = m.text();
    for needle in [
        "create_service_request_handler_counter_total{status=\"2xx\"} 1",
        "create_service_request_handler_counter_total{status=\"4xx\"} 1",
        "create_service_request_handler_histogram_count 2",
        "create_workflow_request_handler_counter_total{status=\"2xx\"} 1",
        "clamp_write_batch_rows_count",
        "clamp_write_commit_seconds_bucket",
        "clamp_write_buffer_depth 0",
        "clamp_write_rows_total 1",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_authorization_is_never_clamps_own_token_and_never_shown() {
    let db = TestDb::new();
    let d = crate::downstream::Downstream::start().await;
    const TOKEN: &str = "forward-token-0123456789";
    // The operator forwards Authorization to steps (--forward-headers authorization).
    let mut cfg = config(&db.url);
    cfg.header_denylist.retain(|h| *h != "authorization");
    cfg.api_tokens = clamp::tokens::ApiTokens::from_list(&[TOKEN]);
    let s = TestServer::start(cfg).await;
    let auth = format!("Bearer {TOKEN}");
    let h = [("authorization", auth.as_str())];
    let wf = json!({"name": "fwd", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]});
    let r = send(
        s.addr,
        hyper::Method::POST,
        "/workflow",
        Some(wf.to_string().into_bytes()),
        &h,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send(
        s.addr,
        hyper::Method::POST,
        "/serviceRequest/fwd",
        Some(b"{}".to_vec()),
        &[("authorization", auth.as_str()), ("x-trace-me", "1")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    d.wait_for("/api/echo").await;
    let got = &d.received("/api/echo")[0];
    assert_eq!(got.headers.get("x-trace-me").map(String::as_str), Some("1"));
    assert!(
        !got.headers.contains_key("authorization"),
        "clamp's token went to a step"
    );
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM service_requests WHERE headers LIKE '%{TOKEN}%'"
        ))
        .await,
        0,
        "clamp's token was stored"
    );
    s.shutdown().await;
    // With tokens off, a downstream's own credentials go on, and the console hides them.
    let mut cfg = config(&db.url);
    cfg.header_denylist.retain(|h| *h != "authorization");
    let s = TestServer::start(cfg).await;
    let id = {
        let r = send(
            s.addr,
            hyper::Method::POST,
            "/serviceRequest/fwd",
            Some(b"{}".to_vec()),
            &[("authorization", "Bearer downstream-secret-77")],
        )
        .await;
        r.json()["serviceRequestId"].as_str().unwrap().to_string()
    };
    wait_status(&s, &id, &["COMPLETED"], std::time::Duration::from_secs(20)).await;
    let calls = d.received("/api/echo");
    assert_eq!(
        calls[1].headers.get("authorization").map(String::as_str),
        Some("Bearer downstream-secret-77")
    );
    let page = s
        .get(&format!("/console/serviceRequests/{id}"))
        .await
        .text();
    assert!(
        page.contains("authorization") && page.contains("(hidden)"),
        "{page}"
    );
    assert!(
        !page.contains("downstream-secret-77"),
        "the console showed a credential"
    );
    s.shutdown().await;
}

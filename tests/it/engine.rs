//! Executing service requests against a real downstream HTTP server.

use std::time::Duration;

use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(10);

fn step(name: &str, method: &str, url: String) -> Value {
    json!({"name": name, "mode": "HTTP", "val": {"method": method, "url": url}})
}

fn statuses(v: &Value) -> Vec<(i64, String)> {
    v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["id"].as_i64().unwrap(),
                s["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn runs_a_chain_passing_payloads_and_headers() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let mut s1 = step("fetch user", "POST", d.url("/api/step1"));
    s1["val"]["headers"] = json!("X-Step:one;X-Tenant:acme;");
    let s2 = step("echo", "POST", d.url("/api/echo"));
    let s3 = step("read", "GET", d.url("/api/step1"));
    s.create_workflow(&json!({"name": "chain", "steps": [s1, s2, s3]}))
        .await;

    let r = hyper::Method::POST;
    let resp = send(
        s.addr,
        r,
        "/serviceRequest/chain",
        Some(br#"{"claim": 42}"#.to_vec()),
        &[("x-correlation-id", "corr-9")],
    )
    .await;
    let id = resp.json()["serviceRequestId"]
        .as_str()
        .unwrap()
        .to_string();
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(
        statuses(&v),
        [
            (1, "STARTED"),
            (1, "COMPLETED"),
            (2, "STARTED"),
            (2, "COMPLETED"),
            (3, "STARTED"),
            (3, "COMPLETED")
        ]
        .map(|(i, s)| (i, s.to_string()))
    );
    assert_eq!(v["steps"][1]["payload"]["request"], json!({"claim": 42}));
    assert_eq!(
        v["steps"][3]["payload"]["response"],
        json!({"echo": {"user": {"id": 7, "ok": true}, "step": 1}})
    );

    let first = &d.received("/api/step1")[0];
    assert_eq!(first.method, "POST");
    assert_eq!(first.body, json!({"claim": 42}));
    assert_eq!(first.headers["x-step"], "one");
    assert_eq!(first.headers["x-tenant"], "acme");
    assert_eq!(first.headers["x-correlation-id"], "corr-9");
    assert_eq!(first.headers["idempotency-key"], format!("{id}:1"));
    // The second step receives the first step's response.
    let second = &d.received("/api/echo")[0];
    assert_eq!(
        second.body,
        json!({"user": {"id": 7, "ok": true}, "step": 1})
    );
    assert_eq!(second.headers["idempotency-key"], format!("{id}:2"));
    assert!(!second.headers.contains_key("x-step"));
    let third = &d.received("/api/step1")[1];
    assert_eq!(third.method, "GET");
    s.shutdown().await;
}

#[tokio::test]
async fn conditions_and_transforms() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let s1 = step("user lookup", "POST", d.url("/api/step1"));
    let mut s2 = step("motor", "POST", d.url("/api/echo"));
    s2["when"] = json!("user_lookup.request.claim.type == 'MOTOR' && user_lookup.response.user.ok");
    s2["transform"] = json!(true);
    s2["transformFormat"] = json!("JSON");
    s2["requestTransform"] = json!({"spec": {
        "customer.id": "user_lookup.response.user.id",
        "customer.claim.kind": "context.user_lookup.request.claim.type",
        "first": "user_lookup.request.items[0]"
    }});
    let mut s3 = step("home", "POST", d.url("/api/echo"));
    s3["when"] = json!("user_lookup.request.claim.type == 'HOME'");
    let mut s4 = step("missing field", "POST", d.url("/api/echo"));
    s4["when"] = json!("user_lookup.response.no.such.field == 1");
    s.create_workflow(&json!({"name": "cond", "steps": [s1, s2, s3, s4]}))
        .await;

    let id = create_request(
        &s,
        "cond",
        &json!({"claim": {"type": "MOTOR"}, "items": ["a", "b"]}),
    )
    .await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let st = statuses(&v);
    assert_eq!(st[3], (2, "COMPLETED".to_string()));
    assert_eq!(st[5], (3, "SKIPPED".to_string()), "{v}");
    assert_eq!(st[7], (4, "SKIPPED".to_string()), "{v}");
    let echoed = d.received("/api/echo");
    assert_eq!(echoed.len(), 1, "only the MOTOR step ran");
    assert_eq!(
        echoed[0].body,
        json!({"customer": {"id": 7, "claim": {"kind": "MOTOR"}}, "first": "a"})
    );
    s.shutdown().await;
}

#[tokio::test]
async fn downstream_failures_run_on_failure_steps() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let cases = [
        ("s500", d.url("/status/500"), "500"),
        ("s404", d.url("/status/404"), "404"),
        ("slow", d.url("/slow/3000"), "timed out"),
        (
            "down",
            "http://127.0.0.1:9/nothing".to_string(),
            "connection failed",
        ),
    ];
    for (name, url, _) in &cases {
        let mut bad = step("call", "POST", url.clone());
        bad["val"]["timeout_ms"] = json!(300);
        bad["onFailure"] = json!([
            step("notify", "POST", d.url("/api/echo")),
            step("audit", "POST", d.url("/api/echo"))
        ]);
        let after = step("after", "POST", d.url("/api/step1"));
        s.create_workflow(&json!({"name": name, "steps": [bad, after]}))
            .await;
    }
    for (name, _, needle) in &cases {
        let id = create_request(&s, name, &json!({"n": name})).await;
        let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(v["status"], "FAILED", "{name}: {v}");
        let reason = v["reason"].as_str().unwrap();
        assert!(
            reason.contains(needle) && reason.contains("call"),
            "{name}: {reason}"
        );
        let st = statuses(&v);
        assert_eq!(st[1], (1, "FAILED".to_string()), "{name}: {v}");
        assert_eq!(st[3], (2, "COMPLETED".to_string()), "{name}: {v}");
        assert_eq!(st[5], (3, "COMPLETED".to_string()), "{name}: {v}");
        assert_eq!(st.len(), 6, "the step after the failure never ran: {v}");
    }
    // Each onFailure step received the failed step's request.
    let echoed = d.received("/api/echo");
    assert_eq!(echoed.len(), 8);
    assert!(echoed.iter().all(|r| r.body["n"].is_string()));
    assert!(d.received("/api/step1").is_empty());
    s.shutdown().await;
}

#[tokio::test]
async fn async_steps_pause_and_resume_on_step_responses() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let mut a = step("ask", "POST", d.url("/api/accepted"));
    a["type"] = json!("ASYNC");
    a["onFailure"] = json!([step("cleanup", "POST", d.url("/api/echo"))]);
    let b = step("use answer", "POST", d.url("/api/echo"));
    s.create_workflow(&json!({"name": "asyncwf", "steps": [a, b]}))
        .await;

    let id = create_request(&s, "asyncwf", &json!({"q": 1})).await;
    let v = wait_status(&s, &id, &["PAUSED"], WAIT).await;
    assert_eq!(v["status"], "PAUSED", "{v}");
    assert_eq!(statuses(&v), [(1, "STARTED".to_string())]);

    // Malformed, unknown, and wrong-step responses change nothing.
    s.post("/stepResponse", "{bad json").await.expect_error(400);
    s.post_json(
        "/stepResponse",
        &json!({"serviceRequestId": "x", "stepId": 1, "response": {}}),
    )
    .await
    .expect_error(400);
    s.post_json(
        "/stepResponse",
        &json!({"serviceRequestId": id, "stepId": 1}),
    )
    .await
    .expect_error(400);
    s.post_json("/stepResponse", &json!({"serviceRequestId": "0190b8a0-0000-7000-8000-000000000000", "stepId": 1, "response": {}}))
        .await
        .expect_error(404);
    s.post_json(
        "/stepResponse",
        &json!({"serviceRequestId": id, "stepId": 2, "response": {}}),
    )
    .await
    .expect_error(409);

    let r = s
        .post_json(
            "/stepResponse",
            &json!({"serviceRequestId": id, "stepId": 1, "response": {"answer": 42}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"code": 200, "message": "success"}));
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(statuses(&v)[1], (1, "COMPLETED".to_string()));
    assert_eq!(v["steps"][1]["payload"]["response"], json!({"answer": 42}));
    // Resume continues at the next step, with the posted response as its request.
    assert_eq!(d.received("/api/echo")[0].body, json!({"answer": 42}));
    assert_eq!(
        d.received("/api/accepted").len(),
        1,
        "the async step was not repeated"
    );

    // A duplicate is harmless.
    let dup = s
        .post_json(
            "/stepResponse",
            &json!({"serviceRequestId": id, "stepId": 1, "response": {"answer": 43}}),
        )
        .await;
    assert_eq!(dup.status, 200);
    assert_eq!(dup.json()["message"], "duplicate response ignored");
    assert_eq!(d.received("/api/echo").len(), 1);

    // An error response fails the step, runs its onFailure steps, fails the request.
    let id2 = create_request(&s, "asyncwf", &json!({"q": 2})).await;
    wait_status(&s, &id2, &["PAUSED"], WAIT).await;
    let r = s
        .post_json("/stepResponse", &json!({"serviceRequestId": id2, "stepId": 1, "error": {"code": 502, "message": "upstream broke"}}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = wait_status(&s, &id2, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert!(
        v["reason"].as_str().unwrap().contains("upstream broke"),
        "{v}"
    );
    let st = statuses(&v);
    assert_eq!(
        st,
        [
            (1, "STARTED"),
            (1, "FAILED"),
            (2, "STARTED"),
            (2, "COMPLETED")
        ]
        .map(|(i, s)| (i, s.to_string()))
    );
    // The cleanup step received the async step's request.
    assert_eq!(d.received("/api/echo")[1].body, json!({"q": 2}));
    s.shutdown().await;
}

#[tokio::test]
async fn lists_requests_with_their_current_status() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "w", "steps": [step("a", "POST", d.url("/api/step1"))]}))
        .await;
    let id = create_request(&s, "w", &json!({})).await;
    wait_status(&s, &id, &["COMPLETED"], WAIT).await;
    let list = s
        .get("/serviceRequests/w?pageNumber=0&pageSize=10")
        .await
        .json();
    assert_eq!(list["serviceRequests"][0]["status"], "COMPLETED");
    s.shutdown().await;
}

#[tokio::test]
async fn a_step_response_hands_the_request_straight_to_the_executor() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let mut a = step("ask", "POST", d.url("/api/accepted"));
    a["type"] = json!("ASYNC");
    let b = step("use answer", "POST", d.url("/api/echo"));
    s.create_workflow(&json!({"name": "handoff", "steps": [a, b]}))
        .await;
    let id = create_request(&s, "handoff", &json!({})).await;
    wait_status(&s, &id, &["PAUSED"], WAIT).await;
    let r = s
        .post_json(
            "/stepResponse",
            &json!({"serviceRequestId": id, "stepId": 1, "response": {"ok": true}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    // Inserted leased, resumed leased: the sweeper never had to claim it.
    let claimed = s
        .server
        .as_ref()
        .unwrap()
        .app()
        .metrics
        .leases_claimed
        .get();
    assert_eq!(claimed, 0);
    s.shutdown().await;
}

#[tokio::test]
async fn conditions_and_transforms_after_a_pause_see_the_steps_before_it() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let first = step("login", "GET", d.url("/api/step1"));
    let mut wait = step("approve", "POST", d.url("/api/accepted"));
    wait["type"] = json!("ASYNC");
    let mut skipped = step("never", "POST", d.url("/api/echo"));
    skipped["when"] = json!("login.response.user.id == 8");
    let mut used = step("use", "POST", d.url("/api/echo"));
    used["when"] = json!("login.response.user.id == 7");
    used["transform"] = json!(true);
    used["requestTransform"] =
        json!({"spec": {"user": "login.response.user.id", "decision": "approve.response.ok"}});
    s.create_workflow(&json!({"name": "ctx", "steps": [first, wait, skipped, used]}))
        .await;
    let id = create_request(&s, "ctx", &json!({})).await;
    wait_status(&s, &id, &["PAUSED"], WAIT).await;
    // The request continues in a fresh server: what it knew of earlier steps is reloaded.
    s.shutdown().await;
    let s = TestServer::start(config(&db.url)).await;
    let r = s
        .post_json(
            "/stepResponse",
            &json!({"serviceRequestId": id, "stepId": 2, "response": {"ok": "yes"}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let echoed = d.received("/api/echo");
    assert_eq!(echoed.len(), 1, "the false condition did not skip");
    assert_eq!(echoed[0].body, json!({"user": 7, "decision": "yes"}));
    s.shutdown().await;
}

#[tokio::test]
async fn a_step_that_receives_the_payload_stores_it_once_and_reads_it_back() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let first = step("first", "POST", d.url("/api/echo"));
    let mut wait = step("approve", "POST", d.url("/api/accepted"));
    wait["type"] = json!("ASYNC");
    let mut used = step("use", "POST", d.url("/api/echo"));
    used["transform"] = json!(true);
    used["requestTransform"] = json!({"spec": {"claim": "first.request.claim"}});
    s.create_workflow(&json!({"name": "once", "steps": [first, wait, used]}))
        .await;
    let id = create_request(&s, "once", &json!({"claim": 42})).await;
    wait_status(&s, &id, &["PAUSED"], WAIT).await;
    // The first step's record marks its request as the payload instead of copying it; the
    // second's holds its own request (the first step's answer).
    let c = db.client().await;
    let uid: uuid::Uuid = id.parse().unwrap();
    let stored: Vec<Option<String>> = c
        .query(
            "SELECT request FROM steps_status WHERE service_request_id = $1 ORDER BY id",
            &[&uid],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(stored.len(), 2, "{stored:?}");
    assert_eq!(stored[0].as_deref(), Some(""));
    let second: Value = serde_json::from_str(stored[1].as_deref().unwrap()).unwrap();
    assert_eq!(second, json!({"echo": {"claim": 42}}));

    // A fresh server reads the records from Postgres alone: the answer shows the payload
    // as the first step's request, and the context it rebuilds has it too.
    s.shutdown().await;
    let s = TestServer::start(config(&db.url)).await;
    let v: Value = s.get(&format!("/serviceRequest/{id}")).await.json();
    for entry in &v["steps"].as_array().unwrap()[..2] {
        assert_eq!(entry["id"], 1, "{v}");
        assert_eq!(entry["payload"]["request"], json!({"claim": 42}), "{v}");
    }
    let r = s
        .post_json(
            "/stepResponse",
            &json!({"serviceRequestId": id, "stepId": 2, "response": {"ok": true}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let echoed = d.received("/api/echo");
    assert_eq!(echoed.len(), 2);
    assert_eq!(echoed[1].body, json!({"claim": 42}));

    // A rerun from the second step copies the first step's record: it shows the payload.
    let r = s
        .post_json(
            &format!("/serviceRequest/{id}/rerun"),
            &json!({"fromStep": 2}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let rerun = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    let v = wait_status(&s, &rerun, &["PAUSED", "COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["steps"][0]["id"], 1, "{v}");
    assert_eq!(
        v["steps"][0]["payload"]["request"],
        json!({"claim": 42}),
        "{v}"
    );
    s.shutdown().await;
}

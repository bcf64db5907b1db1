//! EVENT steps and `POST /events/{event}` (beyond Clamp): a request waits for an event
//! matched by a key from its context; a delivery resumes every request waiting on that
//! event and key, counts once by its id, and is kept for requests that reach their step
//! later; a timeout ends the wait, and an event racing it resolves once; a delivery
//! continues what it resumes while it has slots and leaves the rest to the sweepers; two
//! instances deliver one event once; waits survive a kill -9.

use std::time::Duration;

use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(30);

fn http(name: &str, url: String) -> Value {
    json!({"name": name, "mode": "HTTP", "val": {"method": "POST", "url": url}})
}

fn approval(timeout: Option<&str>) -> Value {
    let mut val = json!({"event": "claim.approved", "key": "approval.request.claim"});
    if let Some(t) = timeout {
        val["timeout"] = json!(t);
    }
    json!({"name": "approval", "mode": "EVENT", "val": val})
}

async fn deliver(s: &TestServer, key: &str, payload: Value, extra: Value) -> Value {
    let mut body = json!({"key": key, "payload": payload});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let r = s.post_json("/events/claim.approved", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_resumes_every_request_waiting_on_its_key_and_is_kept_for_later_ones() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "claim", "steps": [
        approval(None), http("after", d.url("/api/echo"))]}))
        .await;
    let a1 = create_request(&s, "claim", &json!({"claim": "A"})).await;
    let a2 = create_request(&s, "claim", &json!({"claim": "A"})).await;
    let b = create_request(&s, "claim", &json!({"claim": "B"})).await;
    for id in [&a1, &a2, &b] {
        let v = wait_status(&s, id, &["PAUSED"], WAIT).await;
        assert_eq!(
            v["awaitingEvent"],
            json!({"step_id": 1, "event": "claim.approved",
                   "key": if id == &b { "B" } else { "A" }}),
            "{v}"
        );
    }
    // Search finds the requests waiting for an event, and for one key of it.
    let ids_of = |v: Value| -> Vec<String> {
        v["serviceRequests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r["serviceRequestId"]
                    .as_str()
                    .or(r["id"].as_str())
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    let all = s
        .get("/serviceRequests?awaitingEvent=claim.approved")
        .await
        .json();
    let mut found = ids_of(all);
    found.sort();
    let mut want = vec![a1.clone(), a2.clone(), b.clone()];
    want.sort();
    assert_eq!(found, want);
    let one = s
        .get("/serviceRequests?awaitingEvent=claim.approved&eventKey=B")
        .await
        .json();
    assert_eq!(ids_of(one), vec![b.clone()]);
    // A step response does not answer an EVENT step.
    let r = s
        .post_json(
            "/stepResponse",
            &json!({"serviceRequestId": b, "stepId": 1, "response": {}}),
        )
        .await;
    assert_eq!(r.status, 409, "{}", r.text());

    let got = deliver(&s, "A", json!({"ok": true}), json!({"id": "e1"})).await;
    assert_eq!(got["matched"], 2, "{got}");
    for id in [&a1, &a2] {
        let v = wait_status(&s, id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
        assert_eq!(
            v["steps"][1]["payload"]["response"],
            json!({"ok": true}),
            "{v}"
        );
        assert_eq!(d.calls_for_key(&format!("{id}:2")), 1);
    }
    assert_eq!(d.received("/api/echo")[0].body, json!({"ok": true}));
    // The same event again (its id): counted once, nothing more runs.
    let dup = deliver(&s, "A", json!({"ok": "again"}), json!({"id": "e1"})).await;
    assert_eq!(dup["duplicate"], true, "{dup}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(d.received("/api/echo").len(), 2);
    let v = s.get(&format!("/serviceRequest/{b}")).await.json();
    assert_eq!(
        v["status"], "PAUSED",
        "another key's request still waits: {v}"
    );

    // Delivered before the wait: kept, and taken when the request reaches its step.
    let early = deliver(&s, "C", json!({"early": 1}), json!({})).await;
    assert_eq!(early["matched"], 0, "{early}");
    assert!(early["keptUntil"].is_string(), "{early}");
    let c = create_request(&s, "claim", &json!({"claim": "C"})).await;
    let v = wait_status(&s, &c, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(d.received("/api/echo")[2].body, json!({"early": 1}));
    // Not kept (a window of zero): a request that comes later waits.
    deliver(&s, "D", json!({"gone": 1}), json!({"keepFor": "PT0S"})).await;
    let late = create_request(&s, "claim", &json!({"claim": "D"})).await;
    let v = wait_status(&s, &late, &["PAUSED"], WAIT).await;
    assert_eq!(v["awaitingEvent"]["key"], "D", "{v}");

    // The console shows what `b` waits for and delivers its event from a form.
    let page = send(
        s.addr,
        hyper::Method::GET,
        &format!("/console/serviceRequests/{b}"),
        None,
        &[],
    )
    .await;
    let html = page.text();
    assert!(
        html.contains("Awaiting event") && html.contains("Deliver the event"),
        "{html}"
    );
    let csrf = page
        .headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("clamp_csrf="))
        .map(|v| v.split(';').next().unwrap().to_string())
        .expect("a csrf cookie");
    let value = csrf.split('=').nth(1).unwrap().to_string();
    let body = format!("csrf={value}&payload=%7B%22byHand%22%3Atrue%7D");
    let r = send(
        s.addr,
        hyper::Method::POST,
        &format!("/console/serviceRequests/{b}/event"),
        Some(body.into_bytes()),
        &[
            ("cookie", csrf.as_str()),
            ("content-type", "application/x-www-form-urlencoded"),
        ],
    )
    .await;
    assert_eq!(r.status, 303, "{}", r.text());
    let v = wait_status(&s, &b, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(
        v["steps"][1]["payload"]["response"],
        json!({"byHand": true}),
        "{v}"
    );

    // Malformed deliveries are 400s.
    for bad in [
        json!({"payload": 1}),
        json!({"key": ""}),
        json!({"key": "A", "keepFor": "soon"}),
    ] {
        let r = s.post_json("/events/claim.approved", &bad).await;
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
    }
    let m = s.get("/metrics").await.text();
    for (name, n) in [
        ("clamp_events_received_total", 4),
        ("clamp_events_duplicate_total", 1),
        ("clamp_events_resumed_total", 3),
        ("clamp_events_unmatched_total", 2),
        ("clamp_events_kept_taken_total", 1),
    ] {
        assert!(m.contains(&format!("{name} {n}")), "{name}: {m}");
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_step_past_its_timeout_fails_and_runs_its_on_failure_steps() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let mut step = approval(Some("PT1S"));
    step["onFailure"] = json!([http("escalate", d.url("/api/echo"))]);
    s.create_workflow(
        &json!({"name": "claim", "steps": [step, http("after", d.url("/api/step1"))]}),
    )
    .await;
    let id = create_request(&s, "claim", &json!({"claim": "T"})).await;
    let v = wait_status(&s, &id, &["PAUSED"], WAIT).await;
    assert!(v["awaitingEvent"]["timesOutAt"].is_string(), "{v}");
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .contains("no answer within PT1S"),
        "{v}"
    );
    assert_eq!(d.received("/api/echo").len(), 1, "escalated once");
    assert_eq!(d.received("/api/step1").len(), 0);
    // An event after the timeout finds no one (and is kept, harmlessly).
    let late = deliver(&s, "T", json!({}), json!({})).await;
    assert_eq!(late["matched"], 0, "{late}");
    s.shutdown().await;
}

/// Two instances share the database; the same event (one id) is delivered to both at
/// once: each waiting request resumes once, and its next step is called once.
/// A delivery continues the requests it resumes itself while it has free slots, and
/// leaves the rest to the sweepers: with two slots a thread, twelve resumed requests all
/// complete, each step called once, never more at once than the slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_beyond_the_free_slots_leaves_the_rest_to_the_sweepers() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let mut cfg = config(&db.url);
    cfg.max_running = 2;
    let threads = cfg.threads;
    let s = TestServer::start(cfg).await;
    s.create_workflow(&json!({"name": "claim", "steps": [
        approval(None), http("after", d.url("/slow/100"))]}))
        .await;
    let mut ids = Vec::new();
    for _ in 0..12 {
        ids.push(create_request(&s, "claim", &json!({"claim": "many"})).await);
    }
    for id in &ids {
        wait_status(&s, id, &["PAUSED"], WAIT).await;
    }
    let got = deliver(&s, "many", json!({"go": 1}), json!({})).await;
    assert_eq!(got["matched"], 12, "{got}");
    for id in &ids {
        let v = wait_status(&s, id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
        assert_eq!(d.calls_for_key(&format!("{id}:2")), 1, "{id}");
    }
    // Two slots on each of the server's threads (each runs its own executor).
    assert!(
        d.peak_in_flight() <= 2 * threads,
        "{threads} threads of two slots, yet {} calls at once",
        d.peak_in_flight()
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_deliver_one_event_once() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let a = TestServer::start(config(&db.url)).await;
    let b = TestServer::start(config(&db.url)).await;
    a.create_workflow(&json!({"name": "claim", "steps": [
        approval(None), http("after", d.url("/api/echo"))]}))
        .await;
    let mut ids = Vec::new();
    for n in 0..20 {
        let s = if n % 2 == 0 { &a } else { &b };
        ids.push(create_request(s, "claim", &json!({"claim": "shared"})).await);
    }
    for id in &ids {
        wait_status(&a, id, &["PAUSED"], WAIT).await;
    }
    let body = json!({"key": "shared", "payload": {"go": true}, "id": "once"});
    let (ra, rb) = tokio::join!(
        a.post_json("/events/claim.approved", &body),
        b.post_json("/events/claim.approved", &body)
    );
    let (ja, jb) = (ra.json(), rb.json());
    let matched = ja["matched"].as_i64().unwrap() + jb["matched"].as_i64().unwrap();
    assert_eq!(matched, 20, "{ja} {jb}");
    assert!(
        ja["duplicate"] == true || jb["duplicate"] == true,
        "{ja} {jb}"
    );
    for id in &ids {
        let v = wait_status(&a, id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
        assert_eq!(d.calls_for_key(&format!("{id}:2")), 1);
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_definitions_are_checked() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    for (val, needle) in [
        (json!({"key": "e.request.k"}), "val.event is required"),
        (json!({"event": "x"}), "val.key is required"),
        (
            json!({"event": "x", "key": "nope.request.k"}),
            "not a step of this workflow",
        ),
        (
            json!({"event": "x", "key": "e.request.k +"}),
            "does not compile",
        ),
        (
            json!({"event": "x", "key": "e.request.k", "timeout": "3 days"}),
            "not an ISO 8601 duration",
        ),
        (
            json!({"event": "x", "key": "e.request.k", "match": 1}),
            "not a field",
        ),
    ] {
        let r = s
            .post_json(
                "/workflow",
                &json!({"name": "w", "steps": [{"name": "e", "mode": "EVENT", "val": val.clone()}]}),
            )
            .await;
        assert_eq!(r.status, 400, "{val}: {}", r.text());
        assert!(r.text().contains(needle), "{val}: {}", r.text());
    }
    let ok = s
        .create_workflow(
            &json!({"name": "w", "steps": [{"name": "e", "mode": "EVENT",
            "val": {"event": "x", "key": "'k-' + e.request.k", "timeout": "P3D"}}]}),
        )
        .await;
    assert_eq!(ok["steps"][0]["type"], "ASYNC", "{ok}");
    s.shutdown().await;
}

/// A kill -9 of the instance that paused them loses no wait: requests paused at an EVENT
/// step are resumed by an event delivered to a new instance, and an ASYNC step's answer
/// deadline, set before the kill, fires on the new instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_survive_a_kill_of_the_instance_that_paused_them() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let port = free_port();
    let mut server = spawn_binary(&db.url, port);
    wait_healthy(port).await;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut ask = http("ask", d.url("/api/accepted"));
    ask["type"] = json!("ASYNC");
    ask["answerTimeout"] = json!("PT3S");
    ask["retry"] = json!({"maxAttempts": 1});
    for def in [
        json!({"name": "claim", "steps": [approval(None), http("after", d.url("/api/echo"))]}),
        json!({"name": "ask", "steps": [ask]}),
    ] {
        let r = send(
            addr,
            hyper::Method::POST,
            "/workflow",
            Some(def.to_string().into_bytes()),
            &[],
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let create = |workflow: &'static str, body: Value| async move {
        let r = send(
            addr,
            hyper::Method::POST,
            &format!("/serviceRequest/{workflow}"),
            Some(body.to_string().into_bytes()),
            &[],
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["serviceRequestId"].as_str().unwrap().to_string()
    };
    let mut waiting = Vec::new();
    for _ in 0..10 {
        waiting.push(create("claim", json!({"claim": "K"})).await);
    }
    let asked = create("ask", json!({"n": 1})).await;
    for id in waiting.iter().chain([&asked]) {
        wait_status_at(addr, id, &["PAUSED"], WAIT, &[]).await;
    }
    server.kill().unwrap();
    server.wait().unwrap();
    let port2 = free_port();
    let _again = spawn_binary(&db.url, port2);
    wait_healthy(port2).await;
    let addr2: std::net::SocketAddr = format!("127.0.0.1:{port2}").parse().unwrap();
    let r = send(
        addr2,
        hyper::Method::POST,
        "/events/claim.approved",
        Some(
            json!({"key": "K", "payload": {"ok": 1}})
                .to_string()
                .into_bytes(),
        ),
        &[],
    )
    .await;
    assert_eq!(r.json()["matched"], 10, "{}", r.text());
    for id in &waiting {
        let v = wait_status_at(addr2, id, &["COMPLETED", "FAILED"], WAIT, &[]).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
        assert_eq!(d.calls_for_key(&format!("{id}:2")), 1);
    }
    let v = wait_status_at(addr2, &asked, &["COMPLETED", "FAILED"], WAIT, &[]).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .contains("no answer within PT3S"),
        "{v}"
    );
    assert_eq!(
        d.calls_for_key(&format!("{asked}:1")),
        1,
        "sent once, before the kill"
    );
}

/// An event racing its wait's timeout resolves once: events delivered from just before to
/// just after the timeouts (and the look that fires them), each request either takes its
/// event (its step after called once) or fails by the timeout (never called), with one
/// final record of its EVENT step; a delivery that lost says it matched no one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_racing_its_timeout_resolves_once() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "claim", "steps": [
        approval(Some("PT1S")), http("after", d.url("/api/echo"))]}))
        .await;
    let mut ids = Vec::new();
    for n in 0..40 {
        ids.push(create_request(&s, "claim", &json!({"claim": format!("c{n}")})).await);
    }
    for id in &ids {
        wait_status(&s, id, &["PAUSED"], WAIT).await;
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    let deliveries = (0..ids.len()).map(|i| {
        let s = &s;
        async move {
            tokio::time::sleep(Duration::from_millis(40 * i as u64)).await;
            deliver(
                s,
                &format!("c{i}"),
                json!({"i": i}),
                json!({"keepFor": "PT0S"}),
            )
            .await
        }
    });
    let answers = futures_util::future::join_all(deliveries).await;
    let (mut completed, mut failed) = (0, 0);
    for (i, id) in ids.iter().enumerate() {
        let v = wait_status(&s, id, &["COMPLETED", "FAILED"], WAIT).await;
        let finals = final_entries(&v, 1);
        assert_eq!(finals.len(), 1, "one outcome of the EVENT step: {v}");
        match v["status"].as_str().unwrap() {
            "COMPLETED" => {
                completed += 1;
                assert_eq!(answers[i]["matched"], 1, "{}", answers[i]);
                assert_eq!(d.calls_for_key(&format!("{id}:2")), 1);
            }
            _ => {
                failed += 1;
                assert_eq!(answers[i]["matched"], 0, "{}", answers[i]);
                assert_eq!(d.calls_for_key(&format!("{id}:2")), 0);
            }
        }
    }
    eprintln!("event against timeout: {completed} took the event, {failed} timed out");
    assert_eq!(completed + failed, ids.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_resumes_a_request_at_most_once() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    // A two-person approval: two EVENT steps on the same event and key.
    let second = json!({"name": "second", "mode": "EVENT",
        "val": {"event": "claim.approved", "key": "approval.request.claim"}});
    s.create_workflow(&json!({"name": "two", "steps": [
        approval(None), second, http("after", d.url("/api/echo"))]}))
        .await;
    let id = create_request(&s, "two", &json!({"claim": "T"})).await;
    wait_status(&s, &id, &["PAUSED"], WAIT).await;
    deliver(&s, "T", json!({"by": "ann"}), json!({"id": "ann-1"})).await;
    // The first step is resumed; the second does not take the same event from the kept
    // window, and waits for its own.
    let v = wait_for_seen("the second approval step to wait", WAIT, || async {
        let v = s.get(&format!("/serviceRequest/{id}")).await.json();
        (v["status"] == "PAUSED" && v["awaitingEvent"]["step_id"] == 2)
            .then_some(v.clone())
            .ok_or(v)
    })
    .await;
    assert_eq!(
        v["steps"][1]["payload"]["response"],
        json!({"by": "ann"}),
        "{v}"
    );
    // The same delivery again counts once, and resumes nothing.
    let again = deliver(&s, "T", json!({"by": "ann"}), json!({"id": "ann-1"})).await;
    assert_eq!(
        (&again["duplicate"], &again["matched"]),
        (&json!(true), &json!(0)),
        "{again}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        d.received("/api/echo").is_empty(),
        "one approval was enough"
    );
    deliver(&s, "T", json!({"by": "bob"}), json!({"id": "bob-1"})).await;
    let v = wait_status(&s, &id, &["COMPLETED"], WAIT).await;
    assert_eq!(response_of(&v, "second"), json!({"by": "bob"}), "{v}");
    assert_eq!(d.received("/api/echo").len(), 1);
    // Both approvals kept before a request reaches its steps: each step takes one, the
    // latest first.
    deliver(&s, "E", json!({"by": "cy"}), json!({"id": "cy-1"})).await;
    deliver(&s, "E", json!({"by": "di"}), json!({"id": "di-1"})).await;
    let early = create_request(&s, "two", &json!({"claim": "E"})).await;
    let v = wait_status(&s, &early, &["COMPLETED"], WAIT).await;
    assert_eq!(response_of(&v, "approval"), json!({"by": "di"}), "{v}");
    assert_eq!(response_of(&v, "second"), json!({"by": "cy"}), "{v}");
    s.shutdown().await;
}

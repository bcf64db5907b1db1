//! Request deadlines (beyond Clamp): a workflow's `deadline`, or a create's own, ends the
//! request when it passes: the step it is at fails (a call in flight is dropped, a pause,
//! a sleep or an event wait ends, children are cancelled), its onFailure steps run, no
//! further step starts, and the request ends FAILED saying why; a retry renews it; a
//! kill -9 loses none.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(30);

fn http(name: &str, url: String) -> Value {
    json!({"name": name, "mode": "HTTP", "val": {"method": "POST", "url": url}})
}

fn reason(v: &Value) -> &str {
    v["reason"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_abandons_the_step_in_flight_runs_on_failure_and_starts_nothing_after() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let mut slow = http("slow", d.url("/held"));
    slow["onFailure"] = json!([http("undo", d.url("/api/echo"))]);
    s.create_workflow(&json!({"name": "bounded", "deadline": "PT1S", "steps": [
        slow, http("after", d.url("/api/step1"))]}))
        .await;
    let t0 = Instant::now();
    let id = create_request(&s, "bounded", &json!({"order": 1})).await;
    // Running, it shows its deadline.
    let v = s.get(&format!("/serviceRequest/{id}")).await.json();
    assert!(v["deadline"].is_string(), "{v}");
    let page = s
        .get(&format!("/console/serviceRequests/{id}"))
        .await
        .text();
    assert!(page.contains("Deadline (UTC)"), "{page}");
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    let took = t0.elapsed();
    assert_eq!(v["status"], "FAILED", "{v}");
    assert_eq!(
        reason(&v),
        "step 'slow' failed: the request's deadline passed",
        "{v}"
    );
    assert!(took >= Duration::from_millis(900), "ended after {took:?}");
    assert!(took < Duration::from_secs(10), "ended after {took:?}");
    let slow = step_entry(&v, "slow", "FAILED");
    assert_eq!(slow["reason"], "the request's deadline passed", "{v}");
    // Its onFailure step ran, with the failed step's request; the next step never did.
    assert_eq!(d.received("/api/echo").len(), 1, "{v}");
    assert_eq!(d.received("/api/echo")[0].body, json!({"order": 1}));
    assert!(d.received("/api/step1").is_empty(), "{v}");
    // The call in flight was dropped, not left to run: the downstream saw it go.
    wait_for_seen("the held call to be abandoned", WAIT, || async {
        (d.abandoned() == 1).then_some(()).ok_or(d.abandoned())
    })
    .await;
    assert_eq!(d.received("/held").len(), 1, "called once");
    let m = s.get("/metrics").await.text();
    assert_eq!(metric(&m, "clamp_request_deadlines_passed_total"), 1.0);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_ends_a_paused_an_event_waiting_and_a_sleeping_request() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let mut answer = http("answer", d.url("/api/accepted"));
    answer["type"] = json!("ASYNC");
    answer["onFailure"] = json!([http("undo", d.url("/api/echo"))]);
    let event = json!({"name": "approval", "mode": "EVENT",
        "val": {"event": "ok", "key": "approval.request.k"}});
    let nap = json!({"name": "nap", "mode": "WAIT", "val": {"duration": "PT1H"}});
    for (name, step) in [("paused", answer), ("event", event), ("asleep", nap)] {
        s.create_workflow(&json!({"name": name, "deadline": "PT2S", "steps": [
            step, http("after", d.url("/api/step1"))]}))
            .await;
    }
    let t0 = Instant::now();
    let paused = create_request(&s, "paused", &json!({"k": "p"})).await;
    let event = create_request(&s, "event", &json!({"k": "e"})).await;
    let asleep = create_request(&s, "asleep", &json!({"k": "a"})).await;
    for (id, step) in [(&paused, "answer"), (&event, "approval"), (&asleep, "nap")] {
        let v = wait_status(&s, id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(v["status"], "FAILED", "{v}");
        assert_eq!(
            reason(&v),
            format!("step '{step}' failed: the request's deadline passed"),
            "{v}"
        );
        // The step's attempt (its pause or sleep) ends FAILED, once.
        let e = step_entry(&v, step, "FAILED");
        assert_eq!(e["reason"], "the request's deadline passed", "{v}");
        let failed = v["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["status"] == "FAILED")
            .count();
        assert_eq!(failed, 1, "{v}");
        assert!(
            v.get("awaitingEvent").is_none() && v.get("waiting").is_none(),
            "{v}"
        );
    }
    assert!(t0.elapsed() >= Duration::from_secs(2), "{:?}", t0.elapsed());
    // The paused step's onFailure step ran; no step after any of them did.
    assert_eq!(d.received("/api/echo").len(), 1);
    assert!(d.received("/api/step1").is_empty());
    // An answer or an event coming late changes nothing.
    let r = s
        .post(
            "/stepResponse",
            &String::from_utf8(step_reply(&paused, json!({"late": true}))).unwrap(),
        )
        .await;
    assert!(r.text().contains("ignored"), "{}", r.text());
    let r = s
        .post_json(
            "/events/ok",
            &json!({"key": "e", "payload": {"late": true}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["matched"], 0, "{}", r.text());
    let v = s.get(&format!("/serviceRequest/{event}")).await.json();
    assert_eq!(v["status"], "FAILED", "{v}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_sets_its_own_deadline_and_a_retry_renews_it() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "open", "steps": [http("slow", d.url("/held"))]}))
        .await;
    for bad in ["soon", "P1M", "PT0S", "P400D"] {
        let r = s
            .post_json(&format!("/serviceRequest/open?deadline={bad}"), &json!({}))
            .await;
        let msg = r.expect_error(400);
        assert!(msg.contains("deadline"), "{msg}");
    }
    // Without one, the workflow has none: the answer shows none.
    let free = create_request(&s, "open", &json!({})).await;
    let v = s.get(&format!("/serviceRequest/{free}")).await.json();
    assert!(v.get("deadline").is_none(), "{v}");
    let r = s
        .post_json("/serviceRequest/open?deadline=PT1S", &json!({"n": 1}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let id = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert!(reason(&v).contains("deadline passed"), "{v}");
    let first = v["deadline"].as_str().unwrap().to_string();
    // A retry runs it again within a deadline as long, from the retry.
    d.release();
    let r = s.post(&format!("/serviceRequest/{id}/retry"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert!(v["deadline"].as_str().unwrap() > first.as_str(), "{v}");
    // The request without a deadline was never ended by one.
    let v = wait_status(&s, &free, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_cancels_the_children_of_the_step_it_ends() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    // A child workflow's own deadline ends the child, which fails its parent's step.
    s.create_workflow(&json!({"name": "child", "deadline": "PT1S",
        "steps": [http("slow", d.url("/held"))]}))
        .await;
    s.create_workflow(&json!({"name": "parent", "steps": [
        {"name": "sub", "mode": "WORKFLOW", "val": {"workflow": "child"}}]}))
        .await;
    // A MAP whose items outlast the request's deadline: all of them are cancelled.
    s.create_workflow(&json!({"name": "batch", "deadline": "PT2S", "steps": [
        {"name": "lines", "mode": "MAP", "val": {"items": "lines.request.items",
            "maxConcurrency": 2, "steps": [http("ship", d.url("/held"))]}},
        http("after", d.url("/api/step1"))]}))
        .await;
    let parent = create_request(&s, "parent", &json!({})).await;
    let batch = create_request(&s, "batch", &json!({"items": [1, 2, 3, 4, 5]})).await;
    let v = wait_status(&s, &parent, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert!(reason(&v).contains("step 'sub' failed"), "{v}");
    let v = wait_status(&s, &batch, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert_eq!(
        reason(&v),
        "step 'lines' failed: the request's deadline passed",
        "{v}"
    );
    let c = db.client().await;
    let kids: Vec<(String, String)> = c
        .query(
            "SELECT status, reason FROM service_requests WHERE parent_id = $1",
            &[&batch.parse::<uuid::Uuid>().unwrap()],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(kids.len(), 5, "{kids:?}");
    for (status, why) in &kids {
        assert_eq!(status, "CANCELLED", "{kids:?}");
        assert_eq!(why, "its parent's deadline passed", "{kids:?}");
    }
    // Only the two items let in were called; nothing after the MAP was.
    assert_eq!(d.received("/held").len(), 3, "1 child + 2 items");
    assert!(d.received("/api/step1").is_empty());
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_definitions_are_checked_and_kept() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    let step = json!({"name": "a", "mode": "HTTP", "val": {"method": "GET", "url": "http://127.0.0.1:9/x"}});
    for (deadline, needle) in [
        (json!("an hour"), "not an ISO 8601 duration"),
        (json!("P1Y"), "years or months"),
        (json!("PT0S"), "longer than nothing"),
        (json!("P400D"), "longest wait"),
    ] {
        let r = s
            .post_json(
                "/workflow",
                &json!({"name": "w", "deadline": deadline, "steps": [step]}),
            )
            .await;
        let msg = r.expect_error(400);
        assert!(msg.contains("deadline") && msg.contains(needle), "{msg}");
    }
    s.create_workflow(&json!({"name": "w", "deadline": "PT90M", "steps": [step]}))
        .await;
    let v = s.get("/workflow/w").await.json();
    assert_eq!(v["deadline"], "PT90M", "{v}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_outlives_a_kill_and_ends_the_request_where_it_stood() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let port = free_port();
    let mut server = spawn_binary(&db.url, port);
    wait_healthy(port).await;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut slow = http("slow", d.url("/held"));
    slow["onFailure"] = json!([http("undo", d.url("/api/echo"))]);
    let def = json!({"name": "bounded", "deadline": "PT2S", "steps": [slow]});
    let r = send(
        addr,
        hyper::Method::POST,
        "/workflow",
        Some(def.to_string().into_bytes()),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send(
        addr,
        hyper::Method::POST,
        "/serviceRequest/bounded",
        Some(b"{}".to_vec()),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let id = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    d.wait_for("/held").await;
    server.kill().unwrap();
    server.wait().unwrap();
    // The deadline passes while no instance runs; the next one ends the request when it
    // claims it, without calling the step again, and runs its onFailure step once.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let port2 = free_port();
    let _again = spawn_binary(&db.url, port2);
    wait_healthy(port2).await;
    let addr2: std::net::SocketAddr = format!("127.0.0.1:{port2}").parse().unwrap();
    let v = wait_status_at(addr2, &id, &["COMPLETED", "FAILED"], WAIT, &[]).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert_eq!(
        reason(&v),
        "step 'slow' failed: the request's deadline passed",
        "{v}"
    );
    assert_eq!(d.received("/held").len(), 1, "not called again");
    assert_eq!(d.received("/api/echo").len(), 1, "onFailure once");
}

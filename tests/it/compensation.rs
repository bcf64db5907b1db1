//! Compensation (beyond Clamp): when a request fails for good, the `compensate` steps of
//! its completed main steps run after the failed step's onFailure steps, the last to
//! complete first, each once, each receiving what its step answered; one that fails is
//! recorded and named in the reason, and the others still run; a kill -9 between them
//! resumes where they were; a passed deadline compensates too.

use std::time::Duration;

use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(30);

fn http(name: &str, url: String) -> Value {
    json!({"name": name, "mode": "HTTP", "val": {"method": "POST", "url": url}})
}

/// reserve → label → (skipped) → charge, whose call `charge_url` decides; reserve and
/// label each have a compensation (label's is `label_undo`).
fn saga(d: &Downstream, name: &str, charge_url: &str, label_undo: Vec<Value>) -> Value {
    let mut reserve = http("reserve", d.url("/api/echo"));
    reserve["compensate"] = json!([http("unreserve", d.url("/undo/reserve"))]);
    let mut label = http("label", d.url("/api/step1"));
    label["compensate"] = Value::Array(label_undo);
    let mut skipped = http("gift wrap", d.url("/api/echo"));
    skipped["when"] = json!("reserve.response.echo.gift == true");
    skipped["compensate"] = json!([http("unwrap", d.url("/undo/wrap"))]);
    let mut charge = http("charge", d.url(charge_url));
    charge["retry"] = json!({"maxAttempts": 1});
    charge["onFailure"] = json!([http("tell", d.url("/undo/tell"))]);
    json!({"name": name, "steps": [reserve, label, skipped, charge]})
}

fn paths(d: &Downstream) -> Vec<String> {
    let mut all: Vec<_> = ["/undo/reserve", "/undo/label", "/undo/wrap", "/undo/tell"]
        .iter()
        .flat_map(|p| d.received(p))
        .collect();
    all.sort_by_key(|r| r.at);
    all.into_iter().map(|r| r.path).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_saga_undoes_its_completed_steps_once_each_in_reverse_order() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let created = s
        .create_workflow(&saga(
            &d,
            "order",
            "/status/500",
            vec![http("void label", d.url("/undo/label"))],
        ))
        .await;
    assert_eq!(created["steps"][0]["compensate"][0]["id"], 2, "{created}");
    let id = create_request(&s, "order", &json!({"sku": "A1"})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    let reason = v["reason"].as_str().unwrap();
    assert!(reason.starts_with("step 'charge' failed"), "{reason}");
    assert!(!reason.contains("compensation failed"), "{reason}");
    // onFailure first, then label's, then reserve's; the skipped step's never.
    assert_eq!(paths(&d), ["/undo/tell", "/undo/label", "/undo/reserve"]);
    // Each receives what its step answered.
    assert_eq!(
        d.received("/undo/reserve")[0].body,
        json!({"echo": {"sku": "A1"}})
    );
    assert_eq!(
        d.received("/undo/label")[0].body,
        json!({"user": {"id": 7, "ok": true}, "step": 1})
    );
    for name in ["void label", "unreserve"] {
        step_entry(&v, name, "COMPLETED");
    }

    // A completed request compensates nothing.
    s.create_workflow(&saga(
        &d,
        "paid",
        "/api/echo",
        vec![http("void label", d.url("/undo/label"))],
    ))
    .await;
    let ok = create_request(&s, "paid", &json!({"sku": "B2"})).await;
    let v = wait_status(&s, &ok, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(paths(&d).len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_compensation_is_named_and_the_others_still_run() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    // 503 is retried (a 500 is called once, as in Clamp).
    let mut void = http("void label", d.url("/status/503"));
    void["retry"] = json!({"maxAttempts": 2, "initialIntervalMs": 50});
    s.create_workflow(&saga(&d, "order", "/status/500", vec![void]))
        .await;
    let id = create_request(&s, "order", &json!({"sku": "A1"})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("step 'charge' failed")
            && reason.ends_with("; compensation failed: 'void label'"),
        "{reason}"
    );
    // Retried by its own policy, then the next compensation ran.
    assert_eq!(d.received("/status/503").len(), 2);
    assert_eq!(paths(&d), ["/undo/tell", "/undo/reserve"]);
    step_entry(&v, "void label", "FAILED");
    step_entry(&v, "unreserve", "COMPLETED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passed_deadline_compensates_too() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let mut def = saga(
        &d,
        "order",
        "/slow/5000",
        vec![http("void label", d.url("/undo/label"))],
    );
    def["deadline"] = json!("PT1S");
    s.create_workflow(&def).await;
    let id = create_request(&s, "order", &json!({"sku": "A1"})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert!(v["reason"].as_str().unwrap().contains("deadline"), "{v}");
    assert_eq!(paths(&d), ["/undo/tell", "/undo/label", "/undo/reserve"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compensations_are_checked_at_definition() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    let call = json!({"name": "a", "mode": "HTTP",
                      "val": {"method": "POST", "url": "http://127.0.0.1:9/a"}});
    let mut nested = call.clone();
    nested["name"] = json!("undo");
    nested["compensate"] = json!([{"name": "undo2", "mode": "HTTP",
                                   "val": {"method": "POST", "url": "http://127.0.0.1:9/b"}}]);
    let child = json!({"name": "undo", "mode": "WORKFLOW", "val": {"workflow": "x"}});
    for (undo, needle) in [
        (nested, "cannot have onFailure or compensate steps"),
        (child, "cannot be a compensate step"),
    ] {
        let mut step = call.clone();
        step["compensate"] = json!([undo]);
        let r = s
            .post_json("/workflow", &json!({"name": "w", "steps": [step]}))
            .await;
        assert_eq!(r.status, 400, "{}", r.text());
        assert!(r.text().contains(needle), "{}", r.text());
    }
}

/// kill -9 between the two compensations (label's ends with a WAIT the kill lands in):
/// the next instance goes on at that WAIT, then reserve's, each called once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_between_compensations_resumes_them_where_they_were() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let port = free_port();
    let mut server = spawn_binary(&db.url, port);
    wait_healthy(port).await;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let def = saga(
        &d,
        "order",
        "/status/500",
        vec![
            http("void label", d.url("/undo/label")),
            json!({"name": "settle", "mode": "WAIT", "val": {"duration": "PT2S"}}),
        ],
    );
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
        "/serviceRequest/order",
        Some(br#"{"sku": "A1"}"#.to_vec()),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let id = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    d.wait_for("/undo/label").await;
    // Its call answered is not yet its record written: the kill lands in the 2 s WAIT.
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.kill().unwrap();
    server.wait().unwrap();
    assert_eq!(
        paths(&d),
        ["/undo/tell", "/undo/label"],
        "killed in the WAIT"
    );
    let port2 = free_port();
    let _again = spawn_binary(&db.url, port2);
    wait_healthy(port2).await;
    let addr2: std::net::SocketAddr = format!("127.0.0.1:{port2}").parse().unwrap();
    let v = wait_status_at(addr2, &id, &["COMPLETED", "FAILED"], WAIT, &[]).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert_eq!(paths(&d), ["/undo/tell", "/undo/label", "/undo/reserve"]);
    assert_eq!(d.max_calls_per_key(), 1, "no call made twice");
}

fn undoable(name: &str, url: String, undo: &str, d: &Downstream) -> Value {
    let mut s = http(name, url);
    s["compensate"] = json!([http(&format!("undo {name}"), d.url(undo))]);
    s
}

/// reserve → book (PARALLEL: hotel [room], flight `flight`) → `last`.
fn trip(d: &Downstream, name: &str, flight: Vec<Value>, last: Option<Value>) -> Value {
    let mut steps = vec![
        undoable("reserve", d.url("/api/echo"), "/undo/reserve", d),
        json!({"name": "book", "mode": "PARALLEL", "val": {"branches": [
            {"name": "hotel", "steps": [undoable("room", d.url("/api/echo"), "/undo/room", d)]},
            {"name": "flight", "steps": flight}]}}),
    ];
    steps.extend(last);
    json!({"name": name, "steps": steps})
}

fn undone(d: &Downstream) -> Vec<String> {
    let mut all: Vec<_> = ["/undo/reserve", "/undo/room", "/undo/seat"]
        .iter()
        .flat_map(|p| d.received(p))
        .collect();
    all.sort_by_key(|r| r.at);
    all.into_iter().map(|r| r.path).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_branch_steps_are_compensated_too() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let seat = undoable("seat", d.url("/api/step1"), "/undo/seat", &d);
    let mut pay = http("pay", d.url("/status/500"));
    pay["retry"] = json!({"maxAttempts": 1});
    // The flight branch fails after its seat (and after the hotel branch completed): it
    // undoes its seat as it fails; the hotel branch is asked to undo its room; then
    // reserve is undone.
    s.create_workflow(&trip(
        &d,
        "trip",
        vec![seat.clone(), http("slowly", d.url("/slow/300")), pay],
        None,
    ))
    .await;
    let id = create_request(&s, "trip", &json!({"to": "Oslo"})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .starts_with("step 'book' failed"),
        "{v}"
    );
    assert_eq!(undone(&d), ["/undo/seat", "/undo/room", "/undo/reserve"]);
    let c = s
        .get(&format!(
            "/serviceRequest/{id}/children?pageNumber=0&pageSize=10"
        ))
        .await
        .json();
    let status = |b: &str| {
        c["children"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["branch"] == b)
            .map(|c| c["status"].clone())
            .unwrap()
    };
    assert_eq!(status("flight"), "FAILED", "{c}");
    assert_eq!(status("hotel"), "CANCELLED", "compensated: {c}");

    // A PARALLEL that completed, then a later step failed: both branches undo theirs
    // (side by side), then reserve.
    let mut charge = http("charge", d.url("/status/500"));
    charge["retry"] = json!({"maxAttempts": 1});
    s.create_workflow(&trip(&d, "trip2", vec![seat], Some(charge)))
        .await;
    let id = create_request(&s, "trip2", &json!({"to": "Rome"})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    let after = &undone(&d)[3..];
    assert_eq!(after.len(), 3, "{after:?}");
    assert_eq!(after[2], "/undo/reserve", "{after:?}");
    assert!(after[..2].contains(&"/undo/room".to_string()), "{after:?}");
    assert!(after[..2].contains(&"/undo/seat".to_string()), "{after:?}");
    assert_eq!(d.max_calls_per_key(), 1, "no call made twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_fails_its_step_compensates() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let mut approve = http("approve", d.url("/api/accepted"));
    approve["type"] = json!("ASYNC");
    s.create_workflow(&json!({"name": "ask", "steps": [
        undoable("reserve", d.url("/api/echo"), "/undo/reserve", &d), approve]}))
        .await;
    let id = create_request(&s, "ask", &json!({})).await;
    wait_status(&s, &id, &["PAUSED"], WAIT).await;
    let r = s
        .post_json(
            "/stepResponse",
            &json!({"serviceRequestId": id, "stepId": 3,
                    "error": {"code": 400, "message": "refused"}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert_eq!(undone(&d), ["/undo/reserve"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_that_asks_compensates_then_ends_cancelled() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "hold", "steps": [
        undoable("reserve", d.url("/api/echo"), "/undo/reserve", &d),
        {"name": "approval", "mode": "EVENT", "val": {"event": "approved", "key": "reserve.response.echo.k"}}]}))
        .await;
    let asked = create_request(&s, "hold", &json!({"k": "a"})).await;
    let plain = create_request(&s, "hold", &json!({"k": "b"})).await;
    for id in [&asked, &plain] {
        wait_status(&s, id, &["PAUSED"], WAIT).await;
    }
    let r = s
        .post(
            &format!("/serviceRequest/{asked}/cancel?compensate=yes"),
            "",
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    let r = s
        .post_json(
            &format!("/serviceRequest/{asked}/cancel?compensate=true"),
            &json!({"reason": "customer changed their mind"}),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.json()["compensating"], true);
    let v = wait_status(&s, &asked, &["CANCELLED"], WAIT).await;
    assert_eq!(v["reason"], "customer changed their mind", "{v}");
    step_entry(&v, "undo reserve", "COMPLETED");
    assert_eq!(undone(&d), ["/undo/reserve"]);
    // Without the ask, nothing is undone.
    let r = s.post(&format!("/serviceRequest/{plain}/cancel"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    wait_status(&s, &plain, &["CANCELLED"], WAIT).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(undone(&d), ["/undo/reserve"]);
    // An event for the compensated request finds it waiting no more.
    let r = s
        .post_json("/events/approved", &json!({"key": "a", "payload": {}}))
        .await;
    assert_eq!(r.json()["matched"], 0, "{}", r.text());

    // A workflow that says compensateOnCancel: a cancel compensates unless it says not.
    s.create_workflow(&json!({"name": "hold2", "compensateOnCancel": true, "steps": [
        undoable("reserve", d.url("/api/echo"), "/undo/reserve", &d),
        {"name": "approval", "mode": "EVENT", "val": {"event": "approved", "key": "reserve.response.echo.k"}}]}))
        .await;
    let by_default = create_request(&s, "hold2", &json!({"k": "c"})).await;
    let told_not = create_request(&s, "hold2", &json!({"k": "d"})).await;
    for id in [&by_default, &told_not] {
        wait_status(&s, id, &["PAUSED"], WAIT).await;
    }
    let r = s
        .post(&format!("/serviceRequest/{by_default}/cancel"), "")
        .await;
    assert_eq!(r.status, 202, "{}", r.text());
    let r = s
        .post(
            &format!("/serviceRequest/{told_not}/cancel?compensate=false"),
            "",
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    wait_status(&s, &by_default, &["CANCELLED"], WAIT).await;
    wait_status(&s, &told_not, &["CANCELLED"], WAIT).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(undone(&d), ["/undo/reserve", "/undo/reserve"]);

    // A create that asks (its label): a plain cancel compensates it.
    let r = s
        .post_json(
            "/serviceRequest/hold?label=clamp.compensate:on-cancel",
            &json!({"k": "e"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let labelled = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    wait_status(&s, &labelled, &["PAUSED"], WAIT).await;
    let r = s
        .post(&format!("/serviceRequest/{labelled}/cancel"), "")
        .await;
    assert_eq!(r.status, 202, "{}", r.text());
    wait_status(&s, &labelled, &["CANCELLED"], WAIT).await;
    assert_eq!(undone(&d).len(), 3);
}

//! Pausing a workflow (beyond Clamp): while paused, creates on any instance are stored and
//! none starts, a running request finishes the step it is at and waits before its next;
//! after a resume on another instance every one of them runs, once. The pause is in
//! Postgres: a server started while it holds parks as the others do.

use std::time::Duration;

use serde_json::json;

use crate::downstream::Downstream;
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_workflow_keeps_its_requests_and_runs_them_all_after_resume() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s1 = TestServer::start(config(&db.url)).await;
    let s2 = TestServer::start(config(&db.url)).await;
    s1.create_workflow(&json!({"name": "paid", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/slow/1500")}},
        {"name": "b", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}))
        .await;
    // Running when the pause comes: it finishes step a, and waits before b.
    let first = create_request(&s1, "paid", &json!({"n": -1})).await;
    wait_for("step a called", Duration::from_secs(10), || async {
        (!d.received("/slow/1500").is_empty()).then_some(())
    })
    .await;
    let r = s1.post("/workflow/paid/pause", "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["paused"], true);
    assert_eq!(s2.get("/workflow/nope/pause").await.status, 405);
    assert_eq!(s2.post("/workflow/nope/pause", "").await.status, 404);
    // The other instance follows within a second.
    tokio::time::sleep(Duration::from_millis(1200)).await;

    let mut ids = Vec::new();
    let (mut c1, mut c2) = (Conn::open(s1.addr).await, Conn::open(s2.addr).await);
    for n in 0..1000 {
        let conn = if n % 2 == 0 { &mut c1 } else { &mut c2 };
        let r = conn
            .post("/serviceRequest/paid", &json!({"n": n}).to_string())
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        ids.push(r.json()["serviceRequestId"].as_str().unwrap().to_string());
    }
    assert_eq!(
        db.count("SELECT count(*) FROM service_requests").await,
        1001,
        "every create stored"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        d.received("/slow/1500").len(),
        1,
        "a paused request started"
    );
    assert!(
        d.received("/api/echo").is_empty(),
        "a step ran after the pause"
    );
    let one = s2.get(&format!("/serviceRequest/{}", ids[7])).await.json();
    assert_eq!(one["status"], "NEW", "{one}");
    assert_eq!(one["workflowPaused"], true, "{one}");
    let running = s1.get(&format!("/serviceRequest/{first}")).await.json();
    assert_eq!(running["workflowPaused"], true, "{running}");
    assert_eq!(s2.get("/workflow/paid").await.json()["paused"], true);
    let m = s1.get("/metrics").await.text();
    assert_eq!(
        metric(&m, r#"clamp_workflow_parked{workflow="paid"} "#),
        1001.0,
        "{m}"
    );

    // A server started now parks as the others do (it reads the pauses within a second).
    let s3 = TestServer::start(config(&db.url)).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let late = create_request(&s3, "paid", &json!({"n": 1000})).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(d.received("/slow/1500").len(), 1);

    let r = s2.post("/workflow/paid/resume", "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["wasPaused"], true);
    for id in ids.iter().chain([&first, &late]) {
        let v = wait_status(&s1, id, &["COMPLETED", "FAILED"], Duration::from_secs(90)).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
        assert!(v.get("workflowPaused").is_none(), "{v}");
    }
    // Each step of each request called once: the running one did not repeat step a.
    assert_eq!(d.received("/slow/1500").len(), 1002);
    assert_eq!(d.received("/api/echo").len(), 1002);
    assert!(s1
        .get("/workflow/paid")
        .await
        .json()
        .get("paused")
        .is_none());
    let c = db.client().await;
    let trail: Vec<(String, String)> = c
        .query(
            "SELECT action, target FROM audit_log WHERE action LIKE '% workflow' \
             AND action <> 'define workflow' ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        trail,
        [
            ("pause workflow".to_string(), "paid".to_string()),
            ("pause workflow".to_string(), "nope".to_string()),
            ("resume workflow".to_string(), "paid".to_string())
        ]
    );
    s3.shutdown().await;
    s2.shutdown().await;
    s1.shutdown().await;
}

/// A pause composes with flow control, deadlines and cancels: under a limit of one, the
/// request admitted before it parks keeps its slot (the next one waits for it, as
/// `waitingForSlot` says) and after the resume they run one at a time in creation order;
/// a cancel cancels a parked request; a deadline that passed while parked fails the
/// request unstarted when it runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_keeps_slots_and_lets_deadlines_and_cancels_through() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(
        &json!({"name": "one", "concurrency": {"limit": 1}, "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}),
    )
    .await;
    s.create_workflow(&json!({"name": "timed", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/traced")}}]}))
        .await;
    for w in ["one", "timed"] {
        let r = s.post(&format!("/workflow/{w}/pause"), "").await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(create_request(&s, "one", &json!({"n": n})).await);
    }
    let late = s
        .post("/serviceRequest/timed?deadline=PT1S", "{}")
        .await
        .json()["serviceRequestId"]
        .as_str()
        .unwrap()
        .to_string();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let first = s.get(&format!("/serviceRequest/{}", ids[0])).await.json();
    assert_eq!(first["workflowPaused"], true, "{first}");
    let second = s.get(&format!("/serviceRequest/{}", ids[1])).await.json();
    assert_eq!(
        second["waitingForSlot"]["ahead"], 0,
        "the parked one keeps its slot: {second}"
    );
    let r = s
        .post(&format!("/serviceRequest/{}/cancel", ids[2]), "{}")
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let parked = s.get(&format!("/serviceRequest/{late}")).await.json();
    assert_eq!(parked["workflowPaused"], true, "{parked}");
    assert!(d.received("/api/echo").is_empty());

    for w in ["one", "timed"] {
        let r = s.post(&format!("/workflow/{w}/resume"), "").await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    for id in &ids[..2] {
        let v = wait_status(&s, id, &["COMPLETED", "FAILED"], Duration::from_secs(20)).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
    }
    let order: Vec<i64> = d
        .received("/api/echo")
        .iter()
        .map(|r| r.body["n"].as_i64().unwrap())
        .collect();
    assert_eq!(
        order,
        [0, 1],
        "in creation order, the cancelled one not run"
    );
    let v = wait_status(&s, &late, &["COMPLETED", "FAILED"], Duration::from_secs(20)).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert!(v["reason"].as_str().unwrap().contains("deadline"), "{v}");
    assert!(
        d.received("/traced").is_empty(),
        "a step ran past its deadline"
    );
    s.shutdown().await;
}

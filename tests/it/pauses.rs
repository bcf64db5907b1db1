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

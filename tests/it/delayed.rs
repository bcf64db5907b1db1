//! Delayed service requests: `?delayMs=` / `?startAt=` on a create; nothing runs before
//! the time, then any instance's sweeper starts it.

use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::support::{config, wait_status, TestDb, TestServer};

const WAIT: Duration = Duration::from_secs(20);

fn one_step(name: &str, d: &Downstream) -> Value {
    json!({"name": name, "steps": [
        {"name": "remind", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]})
}

fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_request_is_not_called_before_its_time_and_is_after_it() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&one_step("later", &d)).await;

    let sent = Instant::now();
    let r = s
        .post("/serviceRequest/later?delayMs=1500", r#"{"n": 1}"#)
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let created = r.json();
    assert_eq!(created["status"], "NEW");
    let id = created["serviceRequestId"].as_str().unwrap().to_string();
    let start_at = created["startAt"].as_str().expect("startAt").to_string();
    // Reads, search and the count see it waiting, as NEW.
    let v = s.get(&format!("/serviceRequest/{id}")).await.json();
    assert_eq!(v["status"], "NEW", "{v}");
    assert_eq!(
        v["startAt"].as_str().map(|t| t.len() > 10),
        Some(true),
        "{v}"
    );
    let found = s.get("/serviceRequests?status=NEW").await.json();
    assert!(found.to_string().contains(&id), "{found}");
    // time is what is tested: 1.1 s into its 1.5 s delay it has not been called (the
    // call after its time, below, is this absence's twin).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(d.received("/api/echo").is_empty(), "called before its time");

    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let call = d.received("/api/echo").remove(0);
    let after = call.at.duration_since(sent);
    assert!(
        after >= Duration::from_millis(1500),
        "called after {after:?}"
    );
    // Within the sweep interval (250 ms here) and a generous margin for a busy machine.
    assert!(
        after < Duration::from_millis(1500 + 3000),
        "called after {after:?}"
    );
    assert_eq!(call.body, json!({"n": 1}));
    // The start is the create's time plus the delay.
    let start = chrono::DateTime::parse_from_rfc3339(&start_at).unwrap();
    let created_at =
        chrono::DateTime::parse_from_rfc3339(v["created_at"].as_str().unwrap()).unwrap();
    let delay = (start - created_at).num_milliseconds();
    assert!(
        (1400..=1600).contains(&delay),
        "{start_at} - {}: {delay} ms",
        v["created_at"]
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_at_names_the_time_and_a_past_time_starts_at_once() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&one_step("at", &d)).await;
    let when = SystemTime::now() + Duration::from_millis(1200);
    let q = rfc3339(when).replace('+', "%2B");
    let sent = Instant::now();
    let r = s
        .post(&format!("/serviceRequest/at?startAt={q}"), "{}")
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let id = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    wait_status(&s, &id, &["COMPLETED"], WAIT).await;
    let call = d.received("/api/echo").remove(0);
    // startAt has millisecond precision: the call is no earlier than that.
    assert!(call.at.duration_since(sent) >= Duration::from_millis(1100));

    let past = rfc3339(SystemTime::now() - Duration::from_secs(3600));
    let r = s
        .post(&format!("/serviceRequest/at?startAt={past}"), "{}")
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.json().get("startAt").is_none(),
        "a past time is a plain create"
    );
    let id = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    wait_status(&s, &id, &["COMPLETED"], Duration::from_secs(5)).await;
    s.shutdown().await;
}

/// A cancelled delayed request never runs, and a twin due at the same moment that was not
/// cancelled does: without it, "no call" would also pass if delayed requests never started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_request_cancelled_before_its_time_never_runs() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&one_step("cancelled", &d)).await;
    // Both due at one instant, 800 ms from now: one sweep finds both due.
    let due = rfc3339(SystemTime::now() + Duration::from_millis(800)).replace('+', "%2B");
    let delayed = |which: &'static str| {
        let path = format!("/serviceRequest/cancelled?startAt={due}");
        let s = &s;
        async move {
            let r = s.post(&path, &json!({ "which": which }).to_string()).await;
            assert_eq!(r.status, 200, "{}", r.text());
            r.json()["serviceRequestId"].as_str().unwrap().to_string()
        }
    };
    let id = delayed("cancelled").await;
    let kept = delayed("kept").await;
    let c = s
        .post(
            &format!("/serviceRequest/{id}/cancel"),
            r#"{"reason": "not needed"}"#,
        )
        .await;
    assert_eq!(c.status, 200, "{}", c.text());
    let cancelled = Instant::now();
    // The one left alone runs when due: its call arrives.
    let v = wait_status(&s, &kept, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(d.calls_for_key(&format!("{kept}:1")), 1);
    // time is what is tested: the cancelled one is also given 2 s from its cancel, well
    // past its start, to show a call it should never make.
    tokio::time::sleep_until((cancelled + Duration::from_millis(2000)).into()).await;
    assert_eq!(
        d.calls_for_key(&format!("{id}:1")),
        0,
        "the cancelled one ran"
    );
    let calls = d.received("/api/echo");
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].body, json!({"which": "kept"}));
    let v = s.get(&format!("/serviceRequest/{id}")).await.json();
    assert_eq!(v["status"], "CANCELLED", "{v}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_request_survives_a_restart_and_runs_on_the_next_instance() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&one_step("durable", &d)).await;
    let r = s.post("/serviceRequest/durable?delayMs=1000", "{}").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let id = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    s.shutdown().await;
    let s = TestServer::start(config(&db.url)).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(d.received("/api/echo").len(), 1);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_or_too_distant_starts_are_400() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&one_step("bad", &d)).await;
    for q in [
        "startAt=tomorrow",
        "startAt=2030-01-01T00:00:00",
        "delayMs=-1",
        "delayMs=1.5",
        "delayMs=1&startAt=2030-01-01T00:00:00Z",
        "delayMs=99999999999",
        "startAt=2999-01-01T00:00:00Z",
    ] {
        let msg = s
            .post(&format!("/serviceRequest/bad?{q}"), "{}")
            .await
            .expect_error(400);
        assert!(
            msg.contains("startAt") || msg.contains("delayMs"),
            "{q}: {msg}"
        );
    }
    let keyed = crate::support::send(
        s.addr,
        hyper::Method::POST,
        "/serviceRequest/bad?delayMs=100",
        Some(b"{}".to_vec()),
        &[("idempotency-key", "k-1")],
    )
    .await;
    assert_eq!(keyed.status, 400, "{}", keyed.text());
    assert!(d.received("/api/echo").is_empty(), "nothing ran");
    s.shutdown().await;
}

//! Notifications (beyond Clamp): a workflow's `notify` tells its requests' final statuses
//! to an HTTP target, from an outbox written in the finishing transaction. A target that
//! answers 503 for 10 s gets every outcome of 1,000 requests once it answers 200, exactly
//! once per notification id, signed, in order per request (a FAILED before the COMPLETED
//! of its retry); a request's notifications are read with it.

use std::collections::HashMap;
use std::time::Duration;

use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::downstream::Downstream;
use crate::support::*;

const KEY: &str = "notify-key-0123";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_outcome_is_told_once_after_an_outage_in_order_per_request() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let dir = std::env::temp_dir().join(format!("clamp-secrets-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("NOTE"), KEY).unwrap();
    let mut cfg = config(&db.url);
    cfg.secrets = std::sync::Arc::new(clamp::secrets::Secrets::new(Some(dir)));
    let s = TestServer::start(cfg).await;
    // Its one step fails at each request's first call and succeeds at the next (a retry).
    let created = s
        .create_workflow(&json!({"name": "paid", "steps": [
            {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/flaky/500")}}],
            "notify": [{"on": ["FAILED", "COMPLETED"],
                        "http": {"url": d.url("/unavailable-until-fixed"), "secret": "{{secret:NOTE}}"}}]}))
        .await;
    assert_eq!(created["notify"][0]["on"], json!(["FAILED", "COMPLETED"]));
    let started = std::time::Instant::now();
    let mut ids = Vec::new();
    let mut conn = Conn::open(s.addr).await;
    for n in 0..1000 {
        let r = conn
            .post("/serviceRequest/paid", &json!({"n": n}).to_string())
            .await
            .unwrap();
        ids.push(r.json()["serviceRequestId"].as_str().unwrap().to_string());
    }
    wait_for("1,000 FAILED", Duration::from_secs(60), || async {
        (db.count("SELECT count(*) FROM service_requests WHERE status = 'FAILED'")
            .await
            == 1000)
            .then_some(())
    })
    .await;
    // Ten of them retried: COMPLETED now, a second outcome each.
    for id in &ids[..10] {
        let r = s.post(&format!("/serviceRequest/{id}/retry"), "").await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    for id in &ids[..10] {
        wait_status(&s, id, &["COMPLETED"], Duration::from_secs(20)).await;
    }
    // The target answers 503 for its first 10 s.
    let down = Duration::from_secs(10).saturating_sub(started.elapsed());
    tokio::time::sleep(down).await;
    assert!(
        db.count("SELECT count(*) FROM notifications WHERE state = 'delivered'")
            .await
            == 0
    );
    d.fix();
    wait_for(
        "1,010 notifications delivered",
        Duration::from_secs(60),
        || async {
            (db.count("SELECT count(*) FROM notifications WHERE state = 'delivered'")
                .await
                == 1010)
                .then_some(())
        },
    )
    .await;

    let received = d.received("/unavailable-until-fixed");
    assert!(received.iter().any(|r| !r.fixed), "the outage was seen");
    let taken: Vec<_> = received.iter().filter(|r| r.fixed).collect();
    // Exactly once per notification id after the retries.
    let mut by_key: HashMap<&str, usize> = HashMap::new();
    for r in &taken {
        *by_key
            .entry(r.headers["idempotency-key"].as_str())
            .or_default() += 1;
    }
    assert_eq!(by_key.len(), 1010);
    assert!(
        by_key.values().all(|n| *n == 1),
        "a notification taken twice"
    );
    // Signed with the secret, over the body as sent.
    let r = taken[0];
    let mut mac = Hmac::<Sha256>::new_from_slice(KEY.as_bytes()).unwrap();
    mac.update(r.body.to_string().as_bytes());
    let want = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    assert_eq!(r.headers["x-clamp-signature-256"], want);
    // In order per request: each retried request's FAILED before its COMPLETED.
    for id in &ids[..10] {
        let told: Vec<&str> = taken
            .iter()
            .filter(|r| r.body["serviceRequestId"] == id.as_str())
            .map(|r| r.body["status"].as_str().unwrap())
            .collect();
        assert_eq!(told, ["FAILED", "COMPLETED"], "{id}");
    }
    let one = taken
        .iter()
        .find(|r| r.body["serviceRequestId"] == ids[500].as_str())
        .unwrap();
    assert_eq!(one.body["workflow"], "paid");
    assert_eq!(one.body["status"], "FAILED");
    assert!(one.body["reason"].as_str().unwrap().contains("500"));
    // Read with the request.
    let read: Value = s
        .get(&format!("/serviceRequest/{}/notifications", ids[0]))
        .await
        .json();
    let states: Vec<(&str, &str)> = read["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["status"].as_str().unwrap(), n["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        states,
        [("FAILED", "delivered"), ("COMPLETED", "delivered")]
    );
    let m = s.get("/metrics").await.text();
    assert_eq!(
        metric(&m, r#"clamp_notifications_total{outcome="delivered"} "#),
        1010.0
    );
    assert!(metric(&m, r#"clamp_notifications_total{outcome="retried"} "#) > 0.0);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_notify_writes_no_notification_and_bad_targets_are_refused() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "plain", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}))
        .await;
    let id = create_request(&s, "plain", &json!({})).await;
    wait_status(&s, &id, &["COMPLETED"], Duration::from_secs(20)).await;
    assert_eq!(db.count("SELECT count(*) FROM notifications").await, 0);
    assert_eq!(
        db.count("SELECT count(*) FROM service_requests WHERE notify IS NOT NULL")
            .await,
        0
    );
    // A cancel writes its notification in the cancel's own statement.
    s.create_workflow(&json!({"name": "later", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}],
        "notify": [{"on": ["CANCELLED"], "http": {"url": d.url("/api/echo")}}]}))
        .await;
    let later = s
        .post("/serviceRequest/later?delayMs=600000", "{}")
        .await
        .json();
    let later = later["serviceRequestId"].as_str().unwrap().to_string();
    let r = s
        .post(&format!("/serviceRequest/{later}/cancel"), "{}")
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    wait_for("the cancel told", Duration::from_secs(20), || async {
        (db.count(
            "SELECT count(*) FROM notifications WHERE status = 'CANCELLED' AND state = 'delivered'",
        )
        .await
            == 1)
            .then_some(())
    })
    .await;
    for (notify, field) in [
        (
            json!([{"on": ["NEW"], "http": {"url": d.url("/x")}}]),
            "notify[0].on",
        ),
        (
            json!([{"on": [], "http": {"url": d.url("/x")}}]),
            "notify[0].on",
        ),
        (
            json!([{"on": ["FAILED"]}]),
            "notify[0]: one of http, amqp and kafka",
        ),
        (
            json!([{"on": ["FAILED"], "http": {"url": d.url("/x")}, "kafka": {"connection_url": "127.0.0.1:9092", "topic_name": "t"}}]),
            "notify[0]: one of http, amqp and kafka",
        ),
        (
            json!([{"on": ["FAILED"], "amqp": {"connection_url": "amqp://127.0.0.1:5672/%2f"}}]),
            "notify[0].amqp needs queue_name or exchange_name",
        ),
        (
            json!([{"on": ["FAILED"], "amqp": {"connection_url": "amqp://127.0.0.1:5672/%2f", "queue_name": "q", "reply_to": "r"}}]),
            "notify[0].amqp.reply_to: unknown field",
        ),
        (
            json!([{"on": ["FAILED"], "kafka": {"connection_url": "127.0.0.1:9092", "topic_name": "a b"}}]),
            "notify[0].kafka.topic_name may hold only",
        ),
        (
            json!([{"on": ["FAILED"], "http": {"url": "ftp://x"}}]),
            "notify[0].http",
        ),
        (
            json!([{"on": ["FAILED"], "http": {"url": d.url("/x"), "secret": "plain"}}]),
            "notify[0].http.secret",
        ),
    ] {
        let why = s
            .post_json("/workflow", &json!({"name": "bad", "steps": [
                {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}],
                "notify": notify}))
            .await
            .expect_error(400);
        assert!(why.contains(field), "{notify}: {why}");
    }
    s.shutdown().await;
}

/// A kill -9 of an instance while its deliveries are in flight, and then Postgres cut off
/// for 5 s while the rest are answered, lose no notification: those whose outcome was
/// not stored come due again after their hold and are sent again, with the same id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_mid_delivery_and_a_postgres_outage_lose_no_notification() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let proxy = PgProxy::start().await;
    // The other instance: the real binary, killed -9 while the target holds its calls.
    let port = free_port();
    let mut other = spawn_binary(&db.url, port);
    wait_healthy(port).await;
    let s = TestServer::start(config(&proxy.url(&db.name))).await;
    s.create_workflow(&json!({"name": "told", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}],
        "notify": [{"on": ["COMPLETED"], "http": {"url": d.url("/held")}}]}))
        .await;
    let mut ids = Vec::new();
    for n in 0..200 {
        ids.push(create_request(&s, "told", &json!({"n": n})).await);
    }
    wait_for(
        "200 notifications written",
        Duration::from_secs(30),
        || async { (db.count("SELECT count(*) FROM notifications").await == 200).then_some(()) },
    )
    .await;
    // Both instances are delivering, their calls held by the target.
    wait_for("deliveries in flight", Duration::from_secs(20), || async {
        (d.received("/held").len() >= 100).then_some(())
    })
    .await;
    other.0.kill().unwrap();
    other.0.wait().unwrap();
    // This instance loses Postgres while the target answers the calls it holds.
    proxy.cut();
    d.release();
    tokio::time::sleep(Duration::from_secs(5)).await;
    proxy.restore();
    wait_for(
        "200 notifications delivered",
        Duration::from_secs(90),
        || async {
            (db.count("SELECT count(*) FROM notifications WHERE state = 'delivered'")
                .await
                == 200)
                .then_some(())
        },
    )
    .await;
    // Every request told, each by its one notification id (sent again, never anew).
    let received = d.received("/held");
    let mut told: HashMap<String, std::collections::HashSet<String>> = HashMap::new();
    for r in &received {
        told.entry(r.body["serviceRequestId"].as_str().unwrap().to_string())
            .or_default()
            .insert(r.headers["idempotency-key"].clone());
    }
    assert_eq!(told.len(), 200);
    assert!(told.values().all(|keys| keys.len() == 1));
    assert!(ids.iter().all(|id| told.contains_key(id)));
    s.shutdown().await;
}

/// Notifications delivered or failed go with the dead letters' age; pending ones stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn told_notifications_go_past_the_dead_letters_age() {
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.retention_interval = Duration::from_millis(100);
    cfg.housekeeping.dead_letters = Some(Duration::from_secs(86_400));
    let s = TestServer::start(cfg).await;
    db.client()
        .await
        .batch_execute(
            "INSERT INTO notifications (service_request_id, workflow_name, workflow_version, \
             status, state, finished_at, next_at) VALUES \
             (gen_random_uuid(), 'w', 1, 'COMPLETED', 'delivered', now() - interval '2 days', now()), \
             (gen_random_uuid(), 'w', 1, 'FAILED', 'failed', now() - interval '2 days', now()), \
             (gen_random_uuid(), 'w', 1, 'COMPLETED', 'delivered', now() - interval '1 hour', now()), \
             (gen_random_uuid(), 'w', 1, 'COMPLETED', 'pending', now() - interval '2 days', now() + interval '1 day')",
        )
        .await
        .unwrap();
    wait_for("the housekeeping pass", Duration::from_secs(20), || async {
        (db.count("SELECT count(*) FROM notifications").await == 2).then_some(())
    })
    .await;
    assert_eq!(
        db.count("SELECT count(*) FROM notifications WHERE state = 'pending' OR finished_at > now() - interval '1 day'")
            .await,
        2
    );
    s.shutdown().await;
}

/// A request is told as its own workflow tells, however it was started: a WORKFLOW
/// step's child, a MAP item over a stored workflow and a schedule's fire are told; the
/// parent, whose workflow names no target, is not, nor are a PARALLEL's branches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_map_items_and_schedule_fires_are_told_as_their_workflow_tells() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "told", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}],
        "notify": [{"on": ["COMPLETED"], "http": {"url": d.url("/api/accepted")}}]}))
        .await;
    s.create_workflow(&json!({"name": "parent", "steps": [
        {"name": "ask", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}},
        {"name": "child", "mode": "WORKFLOW", "val": {"workflow": "told"}},
        {"name": "lines", "mode": "MAP", "val": {"items": "ask.response.echo.items", "workflow": "told", "maxConcurrency": 2}},
        // Its branches run as child requests (a WAIT is no lane's).
        {"name": "both", "mode": "PARALLEL", "val": {"branches": [
            {"name": "x", "steps": [{"name": "rest", "mode": "WAIT", "val": {"duration": "PT0S"}}]},
            {"name": "y", "steps": [{"name": "rest", "mode": "WAIT", "val": {"duration": "PT0S"}}]}]}}]}))
        .await;
    let parent = create_request(&s, "parent", &json!({"items": [1, 2, 3]})).await;
    let v = wait_status(
        &s,
        &parent,
        &["COMPLETED", "FAILED"],
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let r = s
        .post_json(
            "/schedules",
            &json!({"name": "told-nightly", "workflow": "told", "cron": "0 30 2 * * *",
                    "payload": {"fired": true}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let r = s.post("/schedules/told-nightly/trigger", "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    // One child, three items and one fire.
    wait_for(
        "five notifications delivered",
        Duration::from_secs(30),
        || async {
            (db.count("SELECT count(*) FROM notifications WHERE state = 'delivered'")
                .await
                == 5)
                .then_some(())
        },
    )
    .await;
    let told = d.received("/api/accepted");
    let mut ids: Vec<&str> = told
        .iter()
        .map(|r| r.body["serviceRequestId"].as_str().unwrap())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 5, "{ids:?}");
    assert!(!ids.contains(&parent.as_str()), "the parent was told");
    assert!(told.iter().all(|r| r.body["workflow"] == "told"));
    let fired = told
        .iter()
        .filter(|r| r.body["response"]["echo"]["fired"] == true);
    assert_eq!(fired.count(), 1, "the schedule's request was not told");
    assert_eq!(
        db.count("SELECT count(*) FROM service_requests WHERE notify IS NOT NULL")
            .await,
        5,
        "the parent or a branch keeps a notify"
    );
    s.shutdown().await;
}

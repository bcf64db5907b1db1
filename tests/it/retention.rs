//! Retention: finished requests past the configured age go, with their step records;
//! everything else stays.

use std::time::{Duration, SystemTime};

use serde_json::json;
use uuid::Uuid;

use crate::downstream::Downstream;
use crate::support::*;

/// A UUIDv7 made `ago` in the past.
fn id_from(ago: Duration) -> Uuid {
    let mut b = *clamp::store::retention::v7_floor(SystemTime::now() - ago).as_bytes();
    b[9..].copy_from_slice(&Uuid::new_v4().as_bytes()[9..]);
    Uuid::from_bytes(b)
}

#[tokio::test]
async fn finished_requests_past_the_retention_are_deleted_and_nothing_else() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let mut cfg = config(&db.url);
    cfg.retention = Some(Duration::from_secs(3600));
    cfg.retention_interval = Duration::from_millis(100);
    let s = TestServer::start(cfg).await;
    s.create_workflow(&json!({"name": "kept", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}))
        .await;
    let fresh = create_request(&s, "kept", &json!({})).await;
    wait_status(&s, &fresh, &["COMPLETED"], Duration::from_secs(10)).await;

    let c = db.client().await;
    let two_hours = Duration::from_secs(7200);
    let rows = [
        // (created, status, finished minutes ago, expected to survive)
        (id_from(two_hours), "COMPLETED", Some(120), false),
        (id_from(two_hours), "FAILED", Some(120), false),
        // Created long ago but finished recently (it waited on a step): kept.
        (id_from(two_hours), "COMPLETED", Some(10), true),
        // Never finished: kept, however old.
        (id_from(two_hours), "PAUSED", None, true),
    ];
    for (id, status, finished, _) in &rows {
        let finished = finished.map(|m: i32| format!("now() - interval '{m} minutes'"));
        c.execute(
            &format!(
                "INSERT INTO service_requests (id, workflow_name, status, payload, finished_at) \
                 VALUES ($1, 'kept', $2, '{{}}', {})",
                finished.as_deref().unwrap_or("NULL")
            ),
            &[id, status],
        )
        .await
        .unwrap();
        c.execute(
            "INSERT INTO steps_status (service_request_id, step_id, step_name, status, started_at) \
             VALUES ($1, 1, 'a', 'COMPLETED', now())",
            &[id],
        )
        .await
        .unwrap();
    }
    // A retention pass has deleted (and then counted) the two it must.
    wait_for(
        "the retention pass to delete the old finished requests",
        Duration::from_secs(10),
        || async {
            let m = s.get("/metrics").await.text();
            let deleted = m
                .lines()
                .find_map(|l| l.strip_prefix("clamp_retention_deleted_total "))
                .and_then(|n| n.trim().parse::<f64>().ok())
                .unwrap_or(0.0);
            (deleted >= 2.0).then_some(())
        },
    )
    .await;
    for (id, status, _, survives) in &rows {
        let left = c
            .query_one(
                "SELECT (SELECT count(*) FROM service_requests WHERE id = $1) + \
                        (SELECT count(*) FROM steps_status WHERE service_request_id = $1)",
                &[id],
            )
            .await
            .unwrap()
            .get::<_, i64>(0);
        assert_eq!(left, if *survives { 2 } else { 0 }, "{status} {id}");
    }
    let v = s.get(&format!("/serviceRequest/{fresh}")).await.json();
    assert_eq!(v["status"], "COMPLETED", "a fresh request was deleted: {v}");
    let m = s.get("/metrics").await.text();
    assert!(m.contains("clamp_retention_deleted_total 2"), "{m}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_records_dead_letters_events_and_sessions_go_past_their_age() {
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.retention_interval = Duration::from_millis(100);
    cfg.housekeeping = clamp::config::Housekeeping {
        audit: Some(Duration::from_secs(2 * 86_400)),
        dead_letters: Some(Duration::from_secs(86_400)),
        events_after_keep: Duration::from_secs(3600),
    };
    cfg.session_idle = Duration::from_secs(600);
    cfg.session_max = Duration::from_secs(3600);
    let s = TestServer::start(cfg).await;
    let c = db.client().await;
    for sql in [
        "INSERT INTO audit_log (at, actor, action, target, outcome) VALUES \
         (now() - interval '3 days', 'a', 'old', 't', 'ok'), (now() - interval '1 day', 'a', 'kept', 't', 'ok')",
        "INSERT INTO dead_letters (source, topic, body, reason, created_at) VALUES \
         ('amqp', 'q', 'x', 'old', now() - interval '2 days'), ('amqp', 'q', 'y', 'kept', now() - interval '1 hour')",
        "INSERT INTO events (event, id, key, payload, keep_until) VALUES \
         ('e', 'old', 'k', '{}', now() - interval '2 hours'), ('e', 'kept', 'k', '{}', now() - interval '30 minutes')",
        "INSERT INTO console_sessions (id_hash, token_digest, created_at, seen_at) VALUES \
         ('\\x01', '\\x01', now() - interval '2 hours', now() - interval '1 minute'), \
         ('\\x02', '\\x02', now() - interval '30 minutes', now() - interval '20 minutes'), \
         ('\\x03', '\\x03', now() - interval '30 minutes', now() - interval '1 minute')",
    ] {
        c.batch_execute(sql).await.unwrap();
    }
    wait_for_seen("the housekeeping pass", Duration::from_secs(20), || async {
        let left = (
            db.count("SELECT count(*) FROM audit_log").await,
            db.count("SELECT count(*) FROM dead_letters").await,
            db.count("SELECT count(*) FROM events").await,
            db.count("SELECT count(*) FROM console_sessions").await,
        );
        (left == (1, 1, 1, 1))
            .then_some(())
            .ok_or(format!("{left:?}"))
    })
    .await;
    for (table, column, kept) in [
        ("audit_log", "action", "kept"),
        ("dead_letters", "reason", "kept"),
        ("events", "id", "kept"),
    ] {
        let row = c
            .query_one(&format!("SELECT {column} FROM {table}"), &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), kept, "{table}");
    }
    let m = s.get("/metrics").await.text();
    assert_eq!(metric(&m, "clamp_audit_deleted_total"), 1.0);
    assert_eq!(metric(&m, "clamp_dead_letters_deleted_total"), 1.0);
    assert_eq!(metric(&m, "clamp_events_expired_total"), 1.0);
    assert_eq!(metric(&m, "clamp_console_sessions_expired_total"), 2.0);
    s.shutdown().await;
}

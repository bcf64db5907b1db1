//! Retention: finished requests past the age that applies to them go with their whole
//! partition set, never row by row, and only when all of the set may go; a request still
//! open keeps its set (found and resumed as ever); a dropped set can be written out first.
//! And the housekeeping of what is kept besides requests.

use std::time::Duration;

use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::support::*;

/// A server whose partition sets are two seconds wide, kept by a keeper working every
/// 200 ms, with no allowance for clocks behind, and this retention.
fn partitioned(db: &TestDb, retention: clamp::config::Retention) -> clamp::config::Config {
    let mut cfg = config(&db.url);
    cfg.partitioning.min = Duration::from_secs(2);
    cfg.partitioning.max = Duration::from_secs(2);
    cfg.partitioning.ahead = Duration::from_secs(4);
    cfg.partitioning.every = Duration::from_millis(200);
    cfg.partitioning.skew = Duration::ZERO;
    cfg.retention = retention;
    cfg
}

/// Whether request `id` is still in the tables (its row, with its steps).
async fn stored(db: &TestDb, id: &str) -> bool {
    db.count(&format!(
        "SELECT count(*) FROM service_requests WHERE id = '{id}'"
    ))
    .await
        > 0
}

/// Waits until request `id` is gone from the tables (its set dropped).
async fn gone(db: &TestDb, id: &str, within: Duration) {
    wait_for_seen(&format!("{id} to be dropped"), within, || async {
        let steps = db
            .count(&format!(
                "SELECT count(*) FROM steps_status WHERE service_request_id = '{id}'"
            ))
            .await;
        match (stored(db, id).await, steps) {
            (false, 0) => Ok(()),
            left => Err(format!("{left:?}")),
        }
    })
    .await;
}

fn http_step(url: String) -> Value {
    json!({"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": url}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_goes_only_when_all_of_it_is_finished_and_past_every_age_that_applies() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    // COMPLETED and CANCELLED go 2 s after they finished, FAILED after 6 s; one workflow
    // keeps its COMPLETED ones forever.
    let s = TestServer::start(partitioned(
        &db,
        clamp::config::Retention {
            completed: Some(Duration::from_secs(2)),
            failed: Some(Duration::from_secs(6)),
            cancelled: Some(Duration::from_secs(2)),
            export_dir: None,
        },
    ))
    .await;
    for wf in [
        json!({"name": "quick", "steps": [http_step(d.url("/api/echo"))]}),
        json!({"name": "fails", "steps": [http_step(d.url("/status/500"))]}),
        json!({"name": "approve", "steps": [{"name": "ok", "mode": "EVENT",
            "val": {"event": "approved", "key": "ok.request.k"}}]}),
        json!({"name": "keep", "retention": {"COMPLETED": null},
               "steps": [http_step(d.url("/api/echo"))]}),
    ] {
        s.create_workflow(&wf).await;
    }
    let sets = || async {
        db.count("SELECT count(*) FROM pg_inherits WHERE inhparent = 'service_requests'::regclass")
            .await
    };
    let created_sets = sets().await;
    assert!(created_sets >= 3, "sets ahead at start: {created_sets}");
    // Each group in a set of its own (a set is 2 s wide; the groups are 2.5 s apart).
    let gap = || tokio::time::sleep(Duration::from_millis(2_500));
    let q1 = create_request(&s, "quick", &json!({})).await;
    gap().await;
    let q2 = create_request(&s, "quick", &json!({})).await;
    let paused = create_request(&s, "approve", &json!({"k": "A"})).await;
    gap().await;
    let failed = create_request(&s, "fails", &json!({})).await;
    gap().await;
    let kept = create_request(&s, "keep", &json!({})).await;
    wait_status(&s, &paused, &["PAUSED"], Duration::from_secs(10)).await;
    wait_status(&s, &failed, &["FAILED"], Duration::from_secs(10)).await;
    // The first set goes; the one with a paused request stays, found by id, and the
    // FAILED request (kept longer) stays too.
    gone(&db, &q1, Duration::from_secs(20)).await;
    // A read of a dropped request is a plain 404 (the server may not have seen the set go
    // yet: a statement aimed at it falls back to the tables).
    let r = s.get(&format!("/serviceRequest/{q1}")).await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(stored(&db, &q2).await && stored(&db, &paused).await);
    assert!(
        stored(&db, &failed).await,
        "a FAILED request went at COMPLETED's age"
    );
    assert_eq!(
        s.get(&format!("/serviceRequest/{paused}")).await.json()["status"],
        "PAUSED"
    );
    // The paused request in its old set is resumed by its event; then its set goes.
    let r = s
        .post_json(
            "/events/approved",
            &json!({"key": "A", "payload": {"yes": true}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    wait_status(&s, &paused, &["COMPLETED"], Duration::from_secs(10)).await;
    gone(&db, &paused, Duration::from_secs(20)).await;
    assert!(!stored(&db, &q2).await);
    gone(&db, &failed, Duration::from_secs(30)).await;
    // A workflow that keeps its requests forever keeps its set.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        stored(&db, &kept).await,
        "a request kept forever was dropped"
    );
    let m = s.get("/metrics").await.text();
    assert_eq!(metric(&m, "clamp_retention_deleted_total"), 4.0, "{m}");
    assert!(metric(&m, "clamp_partitions_dropped_total") >= 3.0);
    assert!(metric(&m, "clamp_partitions_created_total") >= 3.0);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_set_is_written_out_first_exactly() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let dir = std::env::temp_dir().join(format!("clamp-export-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let s = TestServer::start(partitioned(
        &db,
        clamp::config::Retention {
            completed: Some(Duration::from_secs(1)),
            failed: None,
            cancelled: None,
            export_dir: Some(dir.clone()),
        },
    ))
    .await;
    s.create_workflow(&json!({"name": "quick", "steps": [http_step(d.url("/api/echo"))]}))
        .await;
    s.create_workflow(&json!({"name": "fails", "steps": [http_step(d.url("/status/500"))]}))
        .await;
    let mut dropped = Vec::new();
    for i in 0..5 {
        dropped.push(create_request(&s, "quick", &json!({"i": i})).await);
    }
    // FAILED is kept forever: its set stays, and it is written nowhere.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let kept = create_request(&s, "fails", &json!({})).await;
    for id in &dropped {
        gone(&db, id, Duration::from_secs(20)).await;
    }
    let mut exported: Vec<Value> = Vec::new();
    for f in std::fs::read_dir(&dir).unwrap() {
        let p = f.unwrap().path();
        assert_eq!(
            p.extension().and_then(|e| e.to_str()),
            Some("jsonl"),
            "{p:?}"
        );
        for line in std::fs::read_to_string(&p).unwrap().lines() {
            exported.push(serde_json::from_str(line).unwrap());
        }
    }
    let mut ids: Vec<String> = exported
        .iter()
        .map(|e| e["request"]["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    dropped.sort();
    assert_eq!(ids, dropped, "the files hold exactly the dropped requests");
    for e in &exported {
        assert_eq!(e["request"]["status"], "COMPLETED");
        assert_eq!(e["steps"].as_array().unwrap().len(), 1, "{e}");
        assert_eq!(e["steps"][0]["status"], "COMPLETED");
    }
    assert!(stored(&db, &kept).await);
    s.shutdown().await;
    std::fs::remove_dir_all(&dir).unwrap();
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

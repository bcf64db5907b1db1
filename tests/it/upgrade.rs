//! Upgrading a database that holds requests in the batch layout of schema version 5 (plain
//! creates kept as one row per flush until their first transition): migration 6 turns
//! every request such a batch holds into a row, as the batch held it and with no lease,
//! keeps the rows that existed already, and drops the layout; then each request runs
//! once, and no step that ran before the upgrade runs again.

use std::time::Duration;

use serde_json::{json, Value};
use uuid::Uuid;

use crate::downstream::Downstream;
use crate::support::*;

/// Version 5's batch table and views, exactly as that version created them.
const SCHEMA_V5_BATCHES: &str = include_str!("fixtures/schema_v5_batches.sql");

/// Version 5's insert of one batch (store/intake.rs of that version), with the lease
/// given as a time.
const INSERT_V5_BATCH: &str = "INSERT INTO intake_batches \
     (id, lease_owner, lease_until, ids, workflows, payloads, headers, created) \
     VALUES ($1, $2, $3::text::timestamptz, $4, $5, $6, $7, $8::text[]::timestamptz[])";

/// Slot `slot` of batch `batch`, as version 5 made request ids: the batch id is a UUIDv7
/// with its low 12 bits zero, and the slot goes in those bits.
fn slot(batch: Uuid, slot: u128) -> Uuid {
    Uuid::from_u128(batch.as_u128() | slot)
}

fn new_batch_id() -> Uuid {
    Uuid::from_u128(Uuid::now_v7().as_u128() & !0xfff)
}

/// One request held by a batch: its id, payload, headers and creation time.
struct Held {
    id: Uuid,
    payload: Value,
    headers: &'static str,
    created: String,
}

async fn insert_batch(
    c: &tokio_postgres::Client,
    lease: Option<(Uuid, &str)>,
    requests: &[Held],
) -> Uuid {
    let batch = requests[0].id.as_u128() & !0xfff;
    let ids: Vec<Uuid> = requests.iter().map(|r| r.id).collect();
    let workflows: Vec<&str> = requests.iter().map(|_| "two").collect();
    let payloads: Vec<String> = requests.iter().map(|r| r.payload.to_string()).collect();
    let headers: Vec<&str> = requests.iter().map(|r| r.headers).collect();
    let created: Vec<String> = requests.iter().map(|r| r.created.clone()).collect();
    let (owner, until) = match lease {
        Some((owner, until)) => (Some(owner), until.to_string()),
        None => (None, "-infinity".to_string()),
    };
    c.execute(
        INSERT_V5_BATCH,
        &[
            &Uuid::from_u128(batch),
            &owner,
            &until,
            &ids,
            &workflows,
            &payloads,
            &headers,
            &created,
        ],
    )
    .await
    .expect("a version 5 batch inserts");
    Uuid::from_u128(batch)
}

fn held(batch: Uuid, n: u128, headers: &'static str) -> Held {
    Held {
        id: slot(batch, n),
        payload: json!({"n": n, "batch": batch.to_string()}),
        headers,
        created: format!("2026-11-30T10:00:0{n}.123456+00:00"),
    }
}

/// A database at the schema before the request tables were partitioned (migration 24),
/// holding the two-step workflow against `d`.
async fn at_24_with_two_steps(db: &TestDb, d: &Downstream) -> tokio_postgres::Client {
    migrate_to(db, 24).await;
    let c = db.client().await;
    insert_workflow(
        &c,
        &json!({"name": "two", "steps": [
            {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}},
            {"name": "b", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}),
    )
    .await;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_of_version_5_become_rows_and_each_request_runs_once() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    // A database at the schema before the request tables were partitioned (migration 24)
    // with the workflow, then put back to version 5 with requests waiting in batches, as a
    // version 5 server would have left it.
    let c = at_24_with_two_steps(&db, &d).await;
    c.batch_execute(SCHEMA_V5_BATCHES).await.unwrap();
    c.execute("DELETE FROM schema_migrations WHERE version > 5", &[])
        .await
        .unwrap();

    // An API-only instance's batch: never leased.
    let b1 = new_batch_id();
    let free: Vec<Held> = (0..3)
        .map(|n| held(b1, n, r#"[["x-tenant","acme"]]"#))
        .collect();
    insert_batch(&c, None, &free).await;
    // A batch whose owner died with its lease still running for an hour.
    let b2 = new_batch_id();
    let orphaned: Vec<Held> = (0..2).map(|n| held(b2, n, "[]")).collect();
    let dead_owner = Uuid::now_v7();
    insert_batch(
        &c,
        Some((dead_owner, "2999-01-01T00:00:00+00:00")),
        &orphaned,
    )
    .await;
    // A batch whose requests were partly settled: one ran its first step (its row was
    // written then, still leased to its dead owner, the lease run out), one was
    // cancelled, one has no row yet.
    let b3 = new_batch_id();
    let mixed: Vec<Held> = (0..3).map(|n| held(b3, n, "[]")).collect();
    insert_batch(&c, Some((dead_owner, "2999-01-01T00:00:00+00:00")), &mixed).await;
    let (ran_first, cancelled) = (&mixed[0], &mixed[1]);
    let step_a_response = json!({"echo": ran_first.payload});
    c.execute(
        "INSERT INTO service_requests (id, workflow_name, status, payload, headers, \
             current_step_id, step_request, lease_owner, lease_until, created_at) \
         VALUES ($1, 'two', 'NEW', $2, '[]', 2, $3, $4, now() - interval '1 second', $5::text::timestamptz)",
        &[
            &ran_first.id,
            &ran_first.payload.to_string(),
            &step_a_response.to_string(),
            &dead_owner,
            &ran_first.created,
        ],
    )
    .await
    .unwrap();
    c.execute(
        "INSERT INTO steps_status (service_request_id, step_id, step_name, status, request, \
             response, started_at, finished_at, time_taken_ms) \
         VALUES ($1, 1, 'a', 'COMPLETED', $2, $3, now(), now(), 1)",
        &[
            &ran_first.id,
            &ran_first.payload.to_string(),
            &step_a_response.to_string(),
        ],
    )
    .await
    .unwrap();
    c.execute(
        "INSERT INTO service_requests (id, workflow_name, status, payload, reason, created_at, finished_at) \
         VALUES ($1, 'two', 'CANCELLED', $2, 'not wanted', $3::text::timestamptz, now())",
        &[
            &cancelled.id,
            &cancelled.payload.to_string(),
            &cancelled.created,
        ],
    )
    .await
    .unwrap();

    // Upgrade, with an instance that runs nothing, to see what the migration wrote.
    let mut api_only = config(&db.url);
    api_only.max_running = 0;
    let api = TestServer::start(api_only).await;
    for relation in ["intake_batches", "intake_requests", "all_service_requests"] {
        let gone: bool = c
            .query_one("SELECT to_regclass($1) IS NULL", &[&relation])
            .await
            .unwrap()
            .get(0);
        assert!(gone, "{relation} is dropped");
    }
    assert_eq!(db.count("SELECT count(*) FROM service_requests").await, 8);
    let converted: Vec<&Held> = free
        .iter()
        .chain(&orphaned)
        .chain(std::iter::once(&mixed[2]))
        .collect();
    for r in &converted {
        let row = c
            .query_one(
                "SELECT workflow_name, status, payload, headers, current_step_id, lease_owner, \
                        lease_until = '-infinity', to_json(created_at) #>> '{}' \
                 FROM service_requests WHERE id = $1",
                &[&r.id],
            )
            .await
            .unwrap_or_else(|e| panic!("request {} has a row: {e}", r.id));
        assert_eq!(row.get::<_, &str>(0), "two");
        assert_eq!(row.get::<_, &str>(1), "NEW");
        let payload: Value = serde_json::from_str(row.get(2)).unwrap();
        assert_eq!(payload, r.payload);
        assert_eq!(row.get::<_, &str>(3), r.headers);
        assert_eq!(row.get::<_, i32>(4), 0);
        assert_eq!(row.get::<_, Option<Uuid>>(5), None, "its lease is cleared");
        assert!(row.get::<_, bool>(6), "its lease is cleared");
        assert_eq!(row.get::<_, &str>(7), r.created);
        // The API reads it as any new request.
        let v = api.get(&format!("/serviceRequest/{}", r.id)).await.json();
        assert_eq!(v["status"], "NEW", "{v}");
        assert_eq!(v["created_at"], r.created.as_str());
    }
    // The rows that existed are as they were.
    let kept = c
        .query_one(
            "SELECT current_step_id, lease_owner FROM service_requests WHERE id = $1",
            &[&ran_first.id],
        )
        .await
        .unwrap();
    assert_eq!(kept.get::<_, i32>(0), 2);
    assert_eq!(kept.get::<_, Option<Uuid>>(1), Some(dead_owner));
    let listed = api
        .get("/serviceRequests/two?pageNumber=0&pageSize=100")
        .await
        .json();
    assert_eq!(listed["serviceRequests"].as_array().map(Vec::len), Some(8));

    // An executor runs each request once, from where it stood.
    let runner = TestServer::start(config(&db.url)).await;
    for r in converted.iter().copied().chain(std::iter::once(ran_first)) {
        let id = r.id.to_string();
        let v = wait_status(
            &runner,
            &id,
            &["COMPLETED", "FAILED"],
            Duration::from_secs(20),
        )
        .await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
        assert_eq!(v["created_at"], r.created.as_str());
        let first_calls = if r.id == ran_first.id { 0 } else { 1 };
        assert_eq!(
            d.calls_for_key(&format!("{id}:1")),
            first_calls,
            "{id} step a"
        );
        assert_eq!(d.calls_for_key(&format!("{id}:2")), 1, "{id} step b");
    }
    // The headers the batch held are forwarded.
    let to_a = d.received("/api/echo");
    let forwarded = to_a
        .iter()
        .filter(|r| r.headers.get("x-tenant").map(String::as_str) == Some("acme"))
        .count();
    assert_eq!(
        forwarded,
        2 * free.len(),
        "both steps of each request of batch 1"
    );
    // The request that ran step a before the upgrade continued with that step's response.
    let b_of_first = to_a
        .iter()
        .find(|r| {
            r.headers.get("idempotency-key").map(String::as_str)
                == Some(format!("{}:2", ran_first.id).as_str())
        })
        .expect("step b of the request that had run step a");
    assert_eq!(b_of_first.body, step_a_response);
    // The cancelled request stays cancelled, and none of its steps ran.
    let id = cancelled.id.to_string();
    let v = runner.get(&format!("/serviceRequest/{id}")).await.json();
    assert_eq!(v["status"], "CANCELLED", "{v}");
    assert_eq!(d.calls_for_key(&format!("{id}:1")), 0);
    assert_eq!(d.max_calls_per_key(), 1, "no step ran twice");
    runner.shutdown().await;
    api.shutdown().await;
}

/// A million requests in every status, with two step records each, as a release before
/// migration 25 wrote them, spread over the day before now. Those not finished wait
/// (asleep a day, or paused at an event), so the server leaves them be.
const MILLION: &str = "
INSERT INTO service_requests (id, workflow_name, status, payload, headers, current_step_id,
    lease_until, created_at, updated_at, finished_at, workflow_version, wait_event, wait_key)
SELECT (lpad(to_hex((extract(epoch FROM t) * 1000)::bigint), 12, '0') || '7' ||
        substr(md5(g::text), 1, 3) || '8' || substr(md5(g::text), 4, 15))::uuid,
       'two', st, '{\"n\":1}', '[]', CASE WHEN st IN ('NEW', 'PAUSED') THEN 1 ELSE 2 END,
       CASE WHEN st = 'NEW' THEN now() + interval '1 day' ELSE '-infinity' END,
       t, t, CASE WHEN st IN ('COMPLETED', 'FAILED', 'CANCELLED') THEN t END, 1,
       CASE WHEN st = 'PAUSED' THEN 'legacy.event' END, CASE WHEN st = 'PAUSED' THEN g::text END
FROM (SELECT g, now() - interval '25 hours' + g * interval '80 milliseconds' AS t,
             (ARRAY['COMPLETED', 'COMPLETED', 'COMPLETED', 'FAILED', 'CANCELLED', 'NEW', 'PAUSED'])[1 + g % 7] AS st
      FROM generate_series(1, 1000000) g) s;
INSERT INTO steps_status (service_request_id, step_id, step_name, status, request, response,
    started_at, finished_at, time_taken_ms, attempts)
SELECT id, k, 'a', 'COMPLETED', '', '{\"ok\":true}', created_at, created_at, 1, 1
FROM service_requests, generate_series(1, 2) k;";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_populated_database_is_partitioned_online_keeping_every_row_while_creates_go_on() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let c = at_24_with_two_steps(&db, &d).await;
    c.batch_execute(MILLION).await.unwrap();
    c.batch_execute("VACUUM ANALYZE service_requests, steps_status")
        .await
        .unwrap();
    let by_status = "SELECT status, count(*), sum(current_step_id) FROM service_requests \
                     WHERE created_at < now() - interval '1 hour' GROUP BY status ORDER BY status";
    let census = |rows: Vec<tokio_postgres::Row>| -> Vec<(String, i64, i64)> {
        rows.iter()
            .map(|r| (r.get(0), r.get(1), r.get::<_, i64>(2)))
            .collect()
    };
    let before = census(c.query(by_status, &[]).await.unwrap());
    assert_eq!(before.iter().map(|r| r.1).sum::<i64>(), 1_000_000);
    let steps_before = db.count("SELECT count(*) FROM steps_status").await;

    let mut cfg = config(&db.url);
    cfg.partitioning.every = Duration::from_millis(200);
    cfg.partitioning.convert = Duration::from_secs(5);
    let s = TestServer::start(cfg).await;
    // Creates go on, one every 20 ms, while the keeper turns the tables.
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let addr = s.addr;
    let creator = tokio::spawn(async move {
        let (mut ids, mut refused) = (Vec::new(), Vec::new());
        while !*stopped.borrow() {
            let r = send(
                addr,
                hyper::Method::POST,
                "/serviceRequest/two",
                Some(b"{}".to_vec()),
                &[],
            )
            .await;
            if r.status == 200 {
                ids.push(r.json()["serviceRequestId"].as_str().unwrap().to_string());
            } else {
                refused.push(format!("{} {}", r.status, r.text()));
            }
            tokio::select! {
                _ = stopped.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
        (ids, refused)
    });
    wait_for_seen(
        "the tables to be partitioned",
        Duration::from_secs(240),
        || async {
            let kinds = db
                .count(
                    "SELECT count(*) FROM pg_class WHERE relkind = 'p' AND relname IN \
                    ('service_requests', 'steps_status', 'fan_joins', 'event_takes')",
                )
                .await;
            (kinds == 4).then_some(()).ok_or(kinds)
        },
    )
    .await;
    // And sets ahead of the first partition's bound, made by the keeper.
    wait_for_seen("sets after the first partition", Duration::from_secs(30), || async {
        let sets = db
            .count("SELECT count(*) FROM pg_inherits WHERE inhparent = 'service_requests'::regclass")
            .await;
        (sets >= 3).then_some(()).ok_or(sets)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.send(true).unwrap();
    let (ids, refused) = creator.await.unwrap();
    assert!(
        refused.is_empty(),
        "creates refused during the conversion: {refused:?}"
    );
    assert!(ids.len() > 20, "{} creates", ids.len());
    // Every row is there, as it was, in the first partition.
    assert_eq!(census(c.query(by_status, &[]).await.unwrap()), before);
    let legacy = db
        .count(
            "SELECT count(*) FROM service_requests_p0 WHERE created_at < now() - interval '1 hour'",
        )
        .await;
    assert_eq!(legacy, 1_000_000);
    assert_eq!(
        db.count("SELECT count(*) FROM steps_status WHERE started_at < now() - interval '1 hour'")
            .await,
        steps_before
    );
    // The requests created meanwhile ran, and an old paused one is resumed as ever.
    for id in ids.iter().step_by(10) {
        wait_status(&s, id, &["COMPLETED"], Duration::from_secs(30)).await;
    }
    let old_paused: String = c
        .query_one(
            "SELECT id::text FROM service_requests WHERE status = 'PAUSED' LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let key: String = c
        .query_one(
            "SELECT wait_key FROM service_requests WHERE id = $1::text::uuid",
            &[&old_paused],
        )
        .await
        .unwrap()
        .get(0);
    let r = s
        .post_json(
            "/events/legacy.event",
            &json!({"key": key, "payload": {"late": true}}),
        )
        .await;
    assert_eq!(r.json()["matched"], 1, "{}", r.text());
    s.shutdown().await;
}

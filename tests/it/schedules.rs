//! Schedules: definitions and their 400s, each fire once across instances and restarts,
//! the catch-up policies after an outage, overlap with a slow step, trigger, pause and
//! resume. Fire times across daylight-saving changes are the pure function's unit tests
//! (`workflow::schedule`), the one the runner and the reads call.

use std::time::Duration;

use chrono::{DateTime, Utc};
use hyper::Method;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::downstream::Downstream;
use crate::support::{config, metric, send, wait_for, wait_status, Resp, TestDb, TestServer};

const WAIT: Duration = Duration::from_secs(30);

fn one_step(name: &str, d: &Downstream, path: &str) -> Value {
    json!({"name": name, "steps": [
        {"name": "tick", "mode": "HTTP", "val": {"method": "POST", "url": d.url(path)}}]})
}

async fn put(s: &TestServer, path: &str, body: &Value) -> Resp {
    send(
        s.addr,
        Method::PUT,
        path,
        Some(body.to_string().into_bytes()),
        &[],
    )
    .await
}

async fn delete(s: &TestServer, path: &str) -> Resp {
    send(s.addr, Method::DELETE, path, None, &[]).await
}

async fn create(s: &TestServer, def: &Value) -> Value {
    let r = s.post_json("/schedules", def).await;
    assert_eq!(r.status, 201, "{}", r.text());
    r.json()
}

/// One fire as stored.
#[derive(Debug, Clone)]
struct Fire {
    at: DateTime<Utc>,
    request: Option<Uuid>,
    skipped: Option<String>,
    /// When the pass that made it ran (the database's clock).
    made: DateTime<Utc>,
}

async fn fires(db: &TestDb, schedule: &str) -> Vec<Fire> {
    db.client()
        .await
        .query(
            "SELECT fire_at, service_request_id, skipped, created_at FROM schedule_fires
             WHERE schedule = $1 ORDER BY fire_at",
            &[&schedule],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| Fire {
            at: r.get(0),
            request: r.get(1),
            skipped: r.get(2),
            made: r.get(3),
        })
        .collect()
}

async fn wait_fires(db: &TestDb, schedule: &str, n: usize, within: Duration) -> Vec<Fire> {
    wait_for(&format!("{n} fires of {schedule}"), within, || async {
        let f = fires(db, schedule).await;
        (f.len() >= n).then_some(f)
    })
    .await
}

/// True when the fire times are whole seconds one after another.
fn consecutive_seconds(f: &[Fire]) -> bool {
    f.iter().all(|x| x.at.timestamp_subsec_micros() == 0)
        && f.windows(2)
            .all(|w| w[1].at - w[0].at == chrono::Duration::seconds(1))
}

async fn db_now(db: &TestDb) -> DateTime<Utc> {
    db.client()
        .await
        .query_one("SELECT now()", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definitions_are_read_checked_and_managed() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&one_step("report", &d, "/api/echo"))
        .await;
    let def = json!({"name": "nightly report", "workflow": "report", "cron": "0 30 2 * * *",
        "timezone": "Europe/Berlin", "payload": {"kind": "daily"}});
    let v = create(&s, &def).await;
    assert_eq!(v["name"], "nightly report");
    assert_eq!(v["overlap"], "skip", "{v}");
    assert_eq!(v["catchUp"], "latest", "{v}");
    assert_eq!(v["paused"], false);
    assert_eq!(v["lastRuns"], json!([]));
    let next = v["nextFires"].as_array().unwrap();
    assert_eq!(next.len(), 5, "{v}");
    for f in next {
        // 02:30 on Berlin's wall clock (03:00 on a day that skips 02:00-03:00).
        let local = f["local"].as_str().unwrap();
        assert!(
            local.contains("T02:30:00+0") || local.contains("T03:00:00+02:00"),
            "{f}"
        );
        assert!(f["at"].as_str().unwrap().ends_with('Z'), "{f}");
    }
    let again = s.post_json("/schedules", &def).await;
    assert!(again.expect_error(409).contains("already exists"));
    let one = s.get("/schedules/nightly%20report").await;
    assert_eq!(one.status, 200, "{}", one.text());
    assert_eq!(one.json()["payload"], json!({"kind": "daily"}));
    let all = s.get("/schedules").await.json();
    assert_eq!(all["schedules"].as_array().unwrap().len(), 1, "{all}");
    assert_eq!(all["schedules"][0]["name"], "nightly report");

    // Refusals name the field.
    let base = json!({"name": "x", "workflow": "report", "every": "1m"});
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    let cases = [
        (
            with("timezone", json!("Mars/Base")),
            "timezone: unknown zone \"Mars/Base\"",
        ),
        (with("cron", json!("61 * * * * *")), "cron, every: "),
        (
            json!({"name": "x", "workflow": "report", "cron": "61 * * * * *"}),
            "cron: ",
        ),
        (json!({"name": "x", "workflow": "report"}), "cron, every: "),
        (with("every", json!("0s")), "every: "),
        (with("workflow", json!("nope")), "workflow: "),
        (with("version", json!(9)), "version: "),
        (with("version", json!(-1)), "version: "),
        (with("overlap", json!("maybe")), "overlap: "),
        (with("catchUp", json!("some")), "catchUp: "),
        (with("priority", json!(0)), "priority: "),
        (with("priority", json!(10)), "priority: "),
        (with("priority", json!(5.5)), "priority: "),
        (with("priority", json!("high")), "priority: "),
        (with("payload", json!("text")), "payload: "),
        (with("name", json!("a/b")), "name: "),
        (with("extra", json!(1)), "extra: unknown field"),
    ];
    for (body, starts) in cases {
        let msg = s.post_json("/schedules", &body).await.expect_error(400);
        assert!(msg.starts_with(starts), "{body}: {msg:?}");
    }
    assert_eq!(s.post("/schedules", "{not json").await.status, 400);
    assert_eq!(s.post("/schedules", "[1]").await.status, 400);
    let yearly = json!({"name": "x", "workflow": "report", "cron": "0 0 0 1 1 * 2020"});
    let msg = s.post_json("/schedules", &yearly).await.expect_error(400);
    assert!(msg.starts_with("cron: "), "{msg}");

    // Replaced: the name may be left to the path, and must agree with it.
    let r = put(
        &s,
        "/schedules/nightly%20report",
        &json!({"workflow": "report", "every": "1h", "overlap": "allow"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["every"], "1h");
    assert!(v.get("cron").is_none(), "{v}");
    assert_eq!(v["overlap"], "allow");
    let at =
        |i: usize| DateTime::parse_from_rfc3339(v["nextFires"][i]["at"].as_str().unwrap()).unwrap();
    assert_eq!((at(1) - at(0)).num_seconds(), 3600);
    assert_eq!(at(0).timestamp() % 3600, 0, "aligned to the epoch");
    let msg = put(
        &s,
        "/schedules/nightly%20report",
        &with("name", json!("other")),
    )
    .await
    .expect_error(400);
    assert!(msg.starts_with("name: "), "{msg}");
    let unnamed = json!({"workflow": "report", "every": "1m"});
    put(&s, "/schedules/nope", &unnamed).await.expect_error(404);

    // Paused: no next fires; resumed: five again.
    let p = s.post("/schedules/nightly%20report/pause", "").await;
    assert_eq!(p.status, 200, "{}", p.text());
    assert_eq!(p.json()["paused"], true);
    assert_eq!(p.json()["nextFires"], json!([]));
    let r = s
        .post("/schedules/nightly%20report/resume", "")
        .await
        .json();
    assert_eq!(r["paused"], false);
    assert_eq!(r["nextFires"].as_array().unwrap().len(), 5);
    // Created paused.
    let v = create(&s, &with("paused", json!(true))).await;
    assert_eq!(v["paused"], true);
    assert_eq!(v["nextFires"], json!([]));

    for path in [
        "/schedules/nope",
        "/schedules/nope/pause",
        "/schedules/nope/resume",
    ] {
        let r = if path.ends_with("nope") {
            s.get(path).await
        } else {
            s.post(path, "").await
        };
        r.expect_error(404);
    }
    s.post("/schedules/nope/trigger", "")
        .await
        .expect_error(404);
    assert_eq!(delete(&s, "/schedules/nightly%20report").await.status, 204);
    s.get("/schedules/nightly%20report").await.expect_error(404);
    delete(&s, "/schedules/nightly%20report")
        .await
        .expect_error(404);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_every_second_schedule_on_two_instances_fires_each_second_once() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let a = TestServer::start(config(&db.url)).await;
    let b = TestServer::start(config(&db.url)).await;
    a.create_workflow(&one_step("tick", &d, "/api/echo")).await;
    create(
        &b,
        &json!({"name": "each-second", "workflow": "tick", "every": "1s", "overlap": "allow",
                "catchUp": "all", "payload": {"from": "schedule"}}),
    )
    .await;
    wait_fires(&db, "each-second", 11, Duration::from_secs(25)).await;
    let p = a.post("/schedules/each-second/pause", "").await;
    assert_eq!(p.status, 200, "{}", p.text());
    let f = fires(&db, "each-second").await;
    assert!(f.len() >= 11, "{f:?}");
    assert!(consecutive_seconds(&f), "a gap or a duplicate: {f:?}");
    assert!(f.iter().all(|x| x.skipped.is_none() && x.request.is_some()));
    let ids: std::collections::HashSet<Uuid> = f.iter().filter_map(|x| x.request).collect();
    assert_eq!(ids.len(), f.len());
    let n_requests = db
        .count("SELECT count(*) FROM service_requests WHERE workflow_name = 'tick'")
        .await;
    assert_eq!(n_requests as usize, f.len());
    // Each request ran once, with the schedule's payload.
    for id in &ids {
        let v = wait_status(&a, &id.to_string(), &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
    }
    let calls = d.received("/api/echo");
    assert_eq!(calls.len(), f.len());
    assert!(calls.iter().all(|c| c.body == json!({"from": "schedule"})));
    assert_eq!(d.max_calls_per_key(), 1);
    // The two instances' counters add up to the fires: none counted twice.
    let started = |t: &str| metric(t, "clamp_schedule_fires_total{outcome=\"started\"}");
    let (ma, mb) = (
        a.get("/metrics").await.text(),
        b.get("/metrics").await.text(),
    );
    assert_eq!(started(&ma) + started(&mb), f.len() as f64, "{ma}\n{mb}");
    let v = a.get("/schedules/each-second").await.json();
    let runs = v["lastRuns"].as_array().unwrap();
    assert_eq!(runs.len(), 10, "{v}");
    assert_eq!(runs[0]["status"], "COMPLETED", "{v}");
    assert_eq!(
        runs[0]["serviceRequestId"],
        f.last().unwrap().request.unwrap().to_string()
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// Fires made before a stop, and after a restart `down` later, of an every-second
/// schedule with `catch_up`.
async fn across_a_restart(catch_up: &str, down: Duration) -> (Vec<Fire>, Vec<Fire>) {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&one_step("tick", &d, "/api/echo")).await;
    let name = format!("restart-{catch_up}");
    create(
        &s,
        &json!({"name": name, "workflow": "tick", "every": "1s", "overlap": "allow",
                "catchUp": catch_up}),
    )
    .await;
    wait_fires(&db, &name, 2, WAIT).await;
    s.shutdown().await;
    let before = fires(&db, &name).await;
    // time is what is tested: how long no instance runs (see the callers).
    tokio::time::sleep(down).await;
    let restarted = db_now(&db).await;
    let s = TestServer::start(config(&db.url)).await;
    wait_for("regular fires after the restart", WAIT, || async {
        let regular = fires(&db, &name)
            .await
            .iter()
            .filter(|f| f.at > restarted + chrono::Duration::seconds(2))
            .count();
        (regular >= 1).then_some(())
    })
    .await;
    s.shutdown().await;
    let after = fires(&db, &name).await[before.len()..].to_vec();
    let n_requests = db.count("SELECT count(*) FROM service_requests").await;
    assert_eq!(n_requests as usize, before.len() + after.len());
    (before, after)
}

/// The fires the first pass after the restart made (one transaction: one `made` time).
fn first_pass(after: &[Fire]) -> Vec<Fire> {
    let first = after.iter().map(|f| f.made).min().unwrap();
    after.iter().filter(|f| f.made == first).cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_catch_up_none_makes_up_nothing_older_than_the_grace() {
    let (before, after) = across_a_restart("none", Duration::from_secs(9)).await;
    let last_before = before.last().unwrap().at;
    let made = first_pass(&after);
    // Only fires at most 5 s late (the grace of a live runner) were made.
    assert!(!made.is_empty());
    for f in &made {
        assert!(
            f.made - f.at <= chrono::Duration::milliseconds(5200),
            "{f:?}"
        );
    }
    // The older ones were not: a gap of at least the downtime less the grace.
    let gap = after[0].at - last_before;
    assert!(
        gap >= chrono::Duration::seconds(3),
        "gap {gap}: {before:?} {after:?}"
    );
    assert!(consecutive_seconds(&after), "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_catch_up_latest_makes_up_the_most_recent_fire_only() {
    let (before, after) = across_a_restart("latest", Duration::from_secs(5)).await;
    let made = first_pass(&after);
    assert_eq!(made.len(), 1, "{after:?}");
    let gap = after[0].at - before.last().unwrap().at;
    assert!(
        gap >= chrono::Duration::seconds(4),
        "gap {gap}: {before:?} {after:?}"
    );
    assert!(consecutive_seconds(&after), "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_catch_up_all_makes_up_every_missed_fire_once() {
    let (before, after) = across_a_restart("all", Duration::from_secs(5)).await;
    let all: Vec<Fire> = before.iter().chain(&after).cloned().collect();
    assert!(consecutive_seconds(&all), "a gap or a duplicate: {all:?}");
    // The missed ones were made late, by the first pass after the restart.
    let made = first_pass(&after);
    assert!(made.len() >= 4, "{made:?}");
    assert!(
        made[0].made - made[0].at >= chrono::Duration::seconds(4),
        "{made:?}"
    );
    assert!(all.iter().all(|f| f.request.is_some()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_skip_starts_nothing_while_the_previous_run_is_unfinished() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&one_step("slow", &d, "/slow/3000")).await;
    create(
        &s,
        &json!({"name": "slow-skip", "workflow": "slow", "every": "1s"}),
    )
    .await;
    // The first run takes 3 s: the fires meanwhile are skipped; then one starts again.
    let f = wait_for("a second run", WAIT, || async {
        let f = fires(&db, "slow-skip").await;
        (f.iter().filter(|x| x.request.is_some()).count() >= 2).then_some(f)
    })
    .await;
    s.post("/schedules/slow-skip/pause", "").await;
    assert!(consecutive_seconds(&f), "{f:?}");
    let runs: Vec<&Fire> = f.iter().filter(|x| x.request.is_some()).collect();
    let skipped = f
        .iter()
        .filter(|x| x.skipped.as_deref() == Some("overlap"))
        .count();
    assert!(skipped >= 2, "{f:?}");
    // The second run started after the first had finished: the slow step never overlapped.
    assert!(
        runs[1].at - runs[0].at >= chrono::Duration::seconds(3),
        "{f:?}"
    );
    assert_eq!(d.peak_in_flight(), 1);
    // A trigger while a run is unfinished is refused, and recorded as skipped.
    let first = runs[1].request.unwrap().to_string();
    let busy = s.get(&format!("/serviceRequest/{first}")).await.json();
    if busy["status"] != "COMPLETED" {
        let msg = s
            .post("/schedules/slow-skip/trigger", "")
            .await
            .expect_error(409);
        assert!(msg.starts_with("overlap: "), "{msg}");
    }
    let v = s.get("/schedules/slow-skip").await.json();
    assert!(
        v["lastRuns"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["skipped"] == "overlap" && r["serviceRequestId"].is_null()),
        "{v}"
    );
    let m = s.get("/metrics").await.text();
    assert!(
        metric(&m, "clamp_schedule_fires_total{outcome=\"skipped\"}") >= 2.0,
        "{m}"
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_allow_starts_runs_side_by_side() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&one_step("slow", &d, "/slow/3000")).await;
    create(
        &s,
        &json!({"name": "slow-allow", "workflow": "slow", "every": "1s", "overlap": "allow"}),
    )
    .await;
    wait_for("runs side by side", WAIT, || async {
        (d.peak_in_flight() >= 2).then_some(())
    })
    .await;
    s.post("/schedules/slow-allow/pause", "").await;
    let f = fires(&db, "slow-allow").await;
    assert!(
        f.iter().all(|x| x.skipped.is_none() && x.request.is_some()),
        "{f:?}"
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trigger_runs_now_and_pause_stops_fires_until_resume() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&one_step("tick", &d, "/api/echo")).await;
    // Yearly and paused: only the trigger runs it.
    create(
        &s,
        &json!({"name": "yearly", "workflow": "tick", "cron": "0 0 0 1 1 *", "paused": true,
                "payload": {"n": 1}}),
    )
    .await;
    let r = s.post("/schedules/yearly/trigger", "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let t = r.json();
    let id = t["serviceRequestId"].as_str().unwrap().to_string();
    assert_eq!(t["pollUrl"], format!("/serviceRequest/{id}"));
    wait_status(&s, &id, &["COMPLETED"], WAIT).await;
    assert_eq!(d.received("/api/echo")[0].body, json!({"n": 1}));
    let v = s.get("/schedules/yearly").await.json();
    assert_eq!(v["lastRuns"][0]["serviceRequestId"], id.as_str(), "{v}");
    assert_eq!(v["lastRuns"][0]["status"], "COMPLETED", "{v}");
    assert_eq!(v["lastRuns"][0]["fireAt"], t["fireAt"], "{v}");

    // Every second: paused, nothing fires; resumed, it fires again from then on, with
    // nothing made up for the paused time.
    create(
        &s,
        &json!({"name": "ticker", "workflow": "tick", "every": "1s",
        "overlap": "allow", "catchUp": "all"}),
    )
    .await;
    wait_fires(&db, "ticker", 2, WAIT).await;
    s.post("/schedules/ticker/pause", "").await;
    let paused = fires(&db, "ticker").await;
    // time is what is tested: two and a half fire intervals pass paused with no fire (the
    // fires after the resume, below, are this absence's twin).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(fires(&db, "ticker").await.len(), paused.len());
    let resumed_at = db_now(&db).await;
    let r = s.post("/schedules/ticker/resume", "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let f = wait_fires(&db, "ticker", paused.len() + 2, WAIT).await;
    let after = &f[paused.len()..];
    assert!(after[0].at > resumed_at, "{after:?} after {resumed_at}");
    assert!(after[0].at - paused.last().unwrap().at >= chrono::Duration::seconds(3));
    s.shutdown().await;
}

//! Crashes, several instances, and lost leases: nothing acknowledged is lost, no step is
//! run by two instances, and an instance that lost a lease changes nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::json;
use uuid::Uuid;

use crate::downstream::Downstream;
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_load_loses_no_acknowledged_request() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let port = free_port();
    let mut child = spawn_binary(&db.url, port);
    wait_healthy(port).await;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let wf = json!({"name": "crash", "steps": [
        {"name": "slow", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/slow/150")}},
        {"name": "echo", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]});
    let r = send(
        addr,
        hyper::Method::POST,
        "/workflow",
        Some(wf.to_string().into_bytes()),
        &[],
    )
    .await;
    assert_eq!(r.status, 200);

    let acked: Arc<Mutex<Vec<Uuid>>> = Arc::default();
    let mut clients = Vec::new();
    for c in 0..8 {
        let acked = acked.clone();
        clients.push(tokio::spawn(async move {
            let mut conn = Conn::open(addr).await;
            for i in 0.. {
                match conn
                    .post("/serviceRequest/crash", &format!("{{\"c\":{c},\"i\":{i}}}"))
                    .await
                {
                    Ok(r) if r.status == 200 => {
                        let id = Uuid::parse_str(r.json()["serviceRequestId"].as_str().unwrap())
                            .unwrap();
                        acked.lock().push(id);
                    }
                    Ok(_) => {}
                    Err(_) => return,
                }
            }
        }));
    }
    // Killed under load: plenty acknowledged, and steps running downstream.
    wait_for("load before the kill", Duration::from_secs(30), || async {
        (acked.lock().len() > 100 && !d.received("/api/echo").is_empty()).then_some(())
    })
    .await;
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    for c in clients {
        let _ = c.await;
    }
    let acked: Vec<Uuid> = acked.lock().clone();
    assert!(
        acked.len() > 50,
        "too little load before the kill: {}",
        acked.len()
    );
    let c = db.client().await;
    let done_before: i64 = c
        .query_one(
            "SELECT count(*) FROM service_requests WHERE status = 'COMPLETED'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        (done_before as usize) < acked.len(),
        "nothing was in flight at the kill"
    );
    // Every request stored and not finished at the kill, acknowledged or not: a create
    // committed whose answer the kill cut off has its first step running too.
    let unfinished: i64 = c
        .query_one(
            "SELECT count(*) FROM service_requests WHERE status <> 'COMPLETED'",
            &[],
        )
        .await
        .unwrap()
        .get(0);

    // Restart: the expired leases are claimed and every acknowledged request finishes.
    let port2 = free_port();
    let mut child2 = spawn_binary(&db.url, port2);
    wait_healthy(port2).await;
    wait_for(
        "every acknowledged request to complete (none lost)",
        Duration::from_secs(60),
        || async {
            let completed = c
                .query_one(
                    "SELECT count(*) FROM service_requests WHERE id = ANY($1) AND status = 'COMPLETED'",
                    &[&acked],
                )
                .await
                .unwrap()
                .get::<_, i64>(0);
            (completed as usize == acked.len()).then_some(())
        },
    )
    .await;
    child2.kill().ok();
    let _ = child2.wait();
    // At-least-once: only a step in flight at the kill may run again, and only once more.
    let unfinished = unfinished as usize;
    let log = d.log.lock();
    let repeats = log.by_key.values().filter(|&&n| n > 1).count();
    assert!(
        repeats <= unfinished,
        "{repeats} steps repeated, {unfinished} requests were unfinished"
    );
    assert!(
        log.by_key.values().all(|&n| n <= 2),
        "a step ran more than twice"
    );
}

#[tokio::test]
async fn two_instances_share_the_work_without_running_a_step_twice() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let mut small = config(&db.url);
    // A small executor leaves most rows unleased, for the sweepers of both to claim.
    small.max_running = 2;
    small.sweep_interval = Duration::from_millis(50);
    let mut other = config(&db.url);
    other.sweep_interval = Duration::from_millis(50);
    let a = TestServer::start(small).await;
    let b = TestServer::start(other).await;
    a.create_workflow(&json!({"name": "shared", "steps": [
        {"name": "one", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/slow/20")}}]}))
        .await;
    let mut ids = Vec::new();
    for i in 0..300 {
        let s = if i % 3 == 0 { &b } else { &a };
        ids.push(create_request(s, "shared", &json!({"i": i})).await);
    }
    let c = db.client().await;
    wait_for(
        "all 300 requests to complete",
        Duration::from_secs(60),
        || async {
            let done: i64 = c
                .query_one(
                    "SELECT count(*) FROM service_requests WHERE status = 'COMPLETED'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            (done == 300).then_some(())
        },
    )
    .await;
    assert_eq!(d.n_keys(), 300);
    assert_eq!(d.max_calls_per_key(), 1, "a step ran twice");
    let claimed_a = a
        .server
        .as_ref()
        .unwrap()
        .app()
        .metrics
        .leases_claimed
        .get();
    let claimed_b = b
        .server
        .as_ref()
        .unwrap()
        .app()
        .metrics
        .leases_claimed
        .get();
    assert!(claimed_a + claimed_b > 0, "the sweepers claimed nothing");
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn an_instance_that_lost_its_lease_writes_nothing() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let mut cfg = config(&db.url);
    cfg.lease = Duration::from_millis(900);
    let s = TestServer::start(cfg).await;
    s.create_workflow(&json!({"name": "fenced", "steps": [
        {"name": "slow", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/slow/1500")}},
        {"name": "next", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}))
        .await;
    let id = create_request(&s, "fenced", &json!({})).await;
    let uid = Uuid::parse_str(&id).unwrap();
    d.wait_for("/slow/1500").await;
    assert_eq!(d.received("/slow/1500").len(), 1);
    // Another instance takes the lease while this one is mid-step (as after a long pause).
    let thief = Uuid::now_v7();
    let c = db.client().await;
    c.execute(
        "UPDATE service_requests SET lease_owner = $2, lease_until = now() + interval '1 hour' WHERE id = $1",
        &[&uid, &thief],
    )
    .await
    .unwrap();
    // It finds out (at a lease renewal, or when its step's result is refused) and stops
    // running the request: past that point it could have written nothing more.
    let app = s.server.as_ref().unwrap().app();
    wait_for(
        "the instance to find its lease lost and stop running the request",
        Duration::from_secs(10),
        || async {
            (app.metrics.leases_lost.get() >= 1 && !app.running.contains(&uid)).then_some(())
        },
    )
    .await;
    let n_records: i64 = c
        .query_one(
            "SELECT count(*) FROM steps_status WHERE service_request_id = $1",
            &[&uid],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        n_records, 0,
        "the instance that lost the lease recorded a step"
    );
    let row = c
        .query_one(
            "SELECT lease_owner, status FROM service_requests WHERE id = $1",
            &[&uid],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, Option<Uuid>>(0), Some(thief));
    assert_eq!(row.get::<_, String>(1), "NEW");
    assert!(
        d.received("/api/echo").is_empty(),
        "the next step ran without the lease"
    );
    assert!(s.server.as_ref().unwrap().app().metrics.leases_lost.get() >= 1);
    s.shutdown().await;
}

#[tokio::test]
async fn graceful_shutdown_finishes_running_steps_or_releases_their_leases() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    // A deadline long enough for the step: the request completes during shutdown.
    let mut cfg = config(&db.url);
    cfg.shutdown_timeout = Duration::from_secs(5);
    let s = TestServer::start(cfg).await;
    s.create_workflow(&json!({"name": "drain", "steps": [
        {"name": "slow", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/slow/400")}},
        {"name": "after", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}))
        .await;
    let id = Uuid::parse_str(&create_request(&s, "drain", &json!({})).await).unwrap();
    d.wait_for("/slow/400").await;
    s.shutdown().await;
    let c = db.client().await;
    let status: String = c
        .query_one("SELECT status FROM service_requests WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "COMPLETED");

    // A deadline shorter than the step: the lease is given back for another instance.
    let mut cfg = config(&db.url);
    cfg.shutdown_timeout = Duration::from_millis(100);
    let s = TestServer::start(cfg).await;
    s.create_workflow(&json!({"name": "cut", "steps": [
        {"name": "slow", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/slow/3000")}}]}))
        .await;
    let id = Uuid::parse_str(&create_request(&s, "cut", &json!({})).await).unwrap();
    d.wait_for("/slow/3000").await;
    let started = Instant::now();
    s.shutdown().await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "shutdown took {:?}",
        started.elapsed()
    );
    let row = c
        .query_one(
            "SELECT status, lease_owner, lease_until < now() FROM service_requests WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "NEW");
    assert_eq!(
        row.get::<_, Option<Uuid>>(1),
        None,
        "the lease was not released"
    );
    assert!(row.get::<_, bool>(2));
    // Another instance picks it up at once and finishes it.
    let s2 = TestServer::start(config(&db.url)).await;
    let v = wait_status(
        &s2,
        &id.to_string(),
        &["COMPLETED", "FAILED"],
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    s2.shutdown().await;
}

#[tokio::test]
async fn reclaiming_its_own_expired_lease_does_not_start_a_second_run() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let mut cfg = config(&db.url);
    cfg.sweep_interval = Duration::from_millis(50);
    // Two runtimes, so the re-claim may come from the runtime that is not running the job.
    cfg.threads = 2;
    let s = TestServer::start(cfg).await;
    s.create_workflow(&json!({"name": "once", "steps": [
        {"name": "slow", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/slow/1200")}}]}))
        .await;
    let id = create_request(&s, "once", &json!({})).await;
    d.wait_for("/slow/1200").await;
    // As if renewals had failed for a while: the lease has run out under the running job.
    let c = db.client().await;
    c.execute(
        "UPDATE service_requests SET lease_until = now() - interval '1 second' WHERE id = $1",
        &[&Uuid::parse_str(&id).unwrap()],
    )
    .await
    .unwrap();
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], Duration::from_secs(10)).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert!(
        s.server
            .as_ref()
            .unwrap()
            .app()
            .metrics
            .leases_claimed
            .get()
            >= 1,
        "the sweeper did not re-claim it"
    );
    assert_eq!(d.received("/slow/1200").len(), 1, "the step ran twice");
    s.shutdown().await;
}

#[tokio::test]
async fn new_rows_are_leased_to_a_local_executor_with_room_or_left_free() {
    // A row inserted leased must carry the whole lease on the database's clock (every
    // instance compares leases with the database's now()), or another instance could take
    // a request that is still running here; a row nobody here will run must be free.
    let db = TestDb::new();
    let d = Downstream::start().await;
    let mut cfg = config(&db.url);
    cfg.lease = Duration::from_secs(60);
    let s = TestServer::start(cfg).await;
    s.create_workflow(&json!({"name": "held", "steps": [
        {"name": "slow", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/slow/1500")}}]}))
        .await;
    let id = create_request(&s, "held", &json!({})).await;
    let uid = Uuid::parse_str(&id).unwrap();
    let c = db.client().await;
    let row = c
        .query_one(
            "SELECT lease_owner, extract(epoch FROM lease_until - now())::float8 FROM service_requests WHERE id = $1",
            &[&uid],
        )
        .await
        .unwrap();
    let owner: Option<Uuid> = row.get(0);
    let left: f64 = row.get(1);
    assert_eq!(owner, Some(s.server.as_ref().unwrap().app().instance_id));
    assert!(
        (58.0..=60.5).contains(&left),
        "lease ends {left:.3} s from the database's now(), not about 60 s"
    );
    s.shutdown().await;
    // Free rows (nobody here to run them) are claimable at once.
    let mut cfg = config(&db.url);
    cfg.max_running = 0;
    let api_only = TestServer::start(cfg).await;
    let free = Uuid::parse_str(&create_request(&api_only, "held", &json!({})).await).unwrap();
    let row = c
        .query_one(
            "SELECT lease_owner, lease_until = '-infinity' FROM service_requests WHERE id = $1",
            &[&free],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, Option<Uuid>>(0), None);
    assert!(row.get::<_, bool>(1));
    api_only.shutdown().await;
}

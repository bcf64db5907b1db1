//! Nothing acknowledged is lost, and outages answer 503 quickly instead of hanging.

use std::time::{Duration, Instant};

use hyper::header::RETRY_AFTER;
use uuid::Uuid;

use crate::support::*;

#[tokio::test]
async fn every_commit_ack_is_in_the_table_when_it_arrives() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&simple_workflow("wf")).await;
    let mut tasks = Vec::new();
    for t in 0..16 {
        let addr = s.addr;
        let db_url = db.url.clone();
        tasks.push(tokio::spawn(async move {
            let (check, conn) = tokio_postgres::connect(&db_url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            let mut c = Conn::open(addr).await;
            let mut n_checked = 0;
            for i in 0..40 {
                let r = c
                    .post("/serviceRequest/wf", &format!("{{\"t\":{t},\"i\":{i}}}"))
                    .await
                    .unwrap();
                assert_eq!(r.status, 200, "{}", r.text());
                let id = Uuid::parse_str(r.json()["serviceRequestId"].as_str().unwrap()).unwrap();
                // The row must be visible to another connection the moment the 200 arrived.
                let n: i64 = check
                    .query_one(
                        "SELECT count(*) FROM service_requests WHERE id = $1",
                        &[&id],
                    )
                    .await
                    .unwrap()
                    .get(0);
                assert_eq!(n, 1, "acknowledged {id} is not in the table");
                n_checked += 1;
            }
            n_checked
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, 640);
    let batches = s.server.as_ref().unwrap().app().metrics.batch_rows.count();
    assert!(batches >= 1);
    s.shutdown().await;
}

/// Posts until a response arrives that satisfies `ok`, for at most `within` (then panics).
async fn post_until(s: &TestServer, within: Duration, ok: impl Fn(&Resp) -> bool) -> Resp {
    wait_for("a create to be answered as expected", within, || async {
        let r = s.post("/serviceRequest/wf", "{}").await;
        ok(&r).then_some(r)
    })
    .await
}

#[tokio::test]
async fn unreachable_database_answers_503_quickly_and_recovers() {
    let db = TestDb::new();
    let proxy = PgProxy::start().await;
    let s = TestServer::start(config(&proxy.url(&db.name))).await;
    s.create_workflow(&simple_workflow("wf")).await;
    assert_eq!(s.post("/serviceRequest/wf", "{}").await.status, 200);

    proxy.cut();
    for _ in 0..5 {
        let started = Instant::now();
        let r = s.post("/serviceRequest/wf", "{}").await;
        let msg = r.expect_error(503);
        assert!(r.headers.contains_key(RETRY_AFTER), "{msg}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "503 took {:?}",
            started.elapsed()
        );
    }
    assert_eq!(s.get("/ready").await.status, 503);
    // Reads fail as 503 too, never 400 or 500.
    s.get("/serviceRequest/0190b8a0-0000-7000-8000-000000000000")
        .await
        .expect_error(503);

    proxy.restore();
    let r = post_until(&s, Duration::from_secs(10), |r| r.status == 200).await;
    assert_eq!(r.status, 200, "did not recover: {}", r.text());
    // Readiness is answered by either runtime, and the one the create above did not go
    // through may still hold connections the cut closed: it must look past them.
    for _ in 0..4 {
        assert_eq!(s.get("/ready").await.status, 200);
    }
    s.shutdown().await;
    // Exactly the acknowledged rows are stored.
    assert_eq!(db.count("SELECT count(*) FROM service_requests").await, 2);
}

#[tokio::test]
async fn a_locked_table_fails_the_batch_with_503_and_writes_nothing() {
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.flush_timeout = Duration::from_millis(800);
    let s = TestServer::start(cfg).await;
    s.create_workflow(&simple_workflow("wf")).await;
    assert_eq!(s.post("/serviceRequest/wf", "{}").await.status, 200);

    let mut locker = db.client().await;
    let tx = locker.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE service_requests IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let started = Instant::now();
    let mut pending = Vec::new();
    for _ in 0..4 {
        let addr = s.addr;
        pending.push(tokio::spawn(async move {
            send(
                addr,
                hyper::Method::POST,
                "/serviceRequest/wf",
                Some(b"{}".to_vec()),
                &[],
            )
            .await
        }));
    }
    for p in pending {
        let r = p.await.unwrap();
        r.expect_error(503);
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(4), "stalled flush took {took:?}");
    tx.rollback().await.unwrap();
    let r = post_until(&s, Duration::from_secs(5), |r| r.status == 200).await;
    assert_eq!(r.status, 200);
    s.shutdown().await;
    // The 503s were truthful: only the two acknowledged rows exist.
    assert_eq!(db.count("SELECT count(*) FROM service_requests").await, 2);
}

/// One slow batch does not hold up every create behind it: with one batch in flight at a
/// time (`store::flights`), a batch waiting on a lock (a keyed create, whose key table
/// another transaction holds) is relieved by a second batch once it has been in flight
/// for long, and the creates of that second batch are answered while the lock is held.
#[tokio::test]
async fn a_stalled_batch_does_not_hold_up_the_creates_behind_it() {
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    // One thread: one flusher, which every create below goes through.
    cfg.threads = 1;
    cfg.flush_timeout = Duration::from_secs(20);
    let s = TestServer::start(cfg).await;
    s.create_workflow(&simple_workflow("wf")).await;
    for _ in 0..10 {
        assert_eq!(s.post("/serviceRequest/wf", "{}").await.status, 200);
    }
    let mut locker = db.client().await;
    let tx = locker.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE idempotency_keys IN EXCLUSIVE MODE")
        .await
        .unwrap();
    let addr = s.addr;
    let keyed = tokio::spawn(async move {
        send(
            addr,
            hyper::Method::POST,
            "/serviceRequest/wf",
            Some(b"{}".to_vec()),
            &[("idempotency-key", "stalled")],
        )
        .await
    });
    // Its batch is in flight once its statement waits for the lock.
    let watcher = db.client().await;
    let name = db.name.clone();
    wait_for("the keyed batch to wait on the lock", Duration::from_secs(10), || {
        let (watcher, name) = (&watcher, &name);
        async move {
            let waiting: i64 = watcher
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'",
                    &[name],
                )
                .await
                .unwrap()
                .get(0);
            (waiting > 0).then_some(())
        }
    })
    .await;
    let started = Instant::now();
    for _ in 0..3 {
        let r = s.post("/serviceRequest/wf", "{}").await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let took = started.elapsed();
    assert!(
        !keyed.is_finished(),
        "the keyed create did not wait for the lock"
    );
    assert!(
        took < Duration::from_secs(5),
        "creates behind a stalled batch took {took:?}"
    );
    tx.rollback().await.unwrap();
    let r = keyed.await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    s.shutdown().await;
    assert_eq!(db.count("SELECT count(*) FROM service_requests").await, 14);
}

#[tokio::test]
async fn a_hung_connection_answers_503_within_the_bound() {
    let db = TestDb::new();
    let proxy = PgProxy::start().await;
    let mut cfg = config(&proxy.url(&db.name));
    cfg.flush_timeout = Duration::from_millis(500);
    let s = TestServer::start(cfg).await;
    s.create_workflow(&simple_workflow("wf")).await;
    assert_eq!(s.post("/serviceRequest/wf", "{}").await.status, 200);
    proxy.stall();
    let started = Instant::now();
    s.post("/serviceRequest/wf", "{}").await.expect_error(503);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    proxy.restore();
    let r = post_until(&s, Duration::from_secs(10), |r| r.status == 200).await;
    assert_eq!(r.status, 200, "did not recover: {}", r.text());
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_mid_run_answers_503_and_loses_nothing() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = format!("/tmp/clamp-it-pg-{}-{port}", std::process::id());
    let url = DevCluster::start(&dir, port);
    let cluster = DevCluster { dir: dir.clone() };
    let mut cfg = config(&url);
    cfg.max_running = 0;
    let s = TestServer::start(cfg).await;
    s.create_workflow(&simple_workflow("wf")).await;

    let acked = std::sync::Arc::new(parking_lot::Mutex::new(Vec::<Uuid>::new()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen_503 = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (acked, stop, seen_503, addr) = (acked.clone(), stop.clone(), seen_503.clone(), s.addr);
        clients.push(tokio::spawn(async move {
            let mut n_503 = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = send(
                    addr,
                    hyper::Method::POST,
                    "/serviceRequest/wf",
                    Some(b"{}".to_vec()),
                    &[],
                )
                .await;
                match r.status.as_u16() {
                    200 => acked.lock().push(
                        Uuid::parse_str(r.json()["serviceRequestId"].as_str().unwrap()).unwrap(),
                    ),
                    503 => {
                        n_503 += 1;
                        seen_503.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    other => panic!("unexpected {other}: {}", r.text()),
                }
            }
            n_503
        }));
    }
    // Under load: creates are being acknowledged when Postgres stops.
    wait_for(
        "creates to be acknowledged",
        Duration::from_secs(10),
        || async { (acked.lock().len() >= 20).then_some(()) },
    )
    .await;
    cluster.stop();
    // The server has noticed: the clients are answered 503.
    wait_for(
        "a 503 during the outage",
        Duration::from_secs(10),
        || async {
            seen_503
                .load(std::sync::atomic::Ordering::Relaxed)
                .then_some(())
        },
    )
    .await;
    // While Postgres is down every create is a quick 503.
    for _ in 0..3 {
        let started = Instant::now();
        let r = s.post("/serviceRequest/wf", "{}").await;
        r.expect_error(503);
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "503 took {:?}",
            started.elapsed()
        );
    }
    DevCluster::start(&dir, port);
    let r = post_until(&s, Duration::from_secs(15), |r| r.status == 200).await;
    assert_eq!(r.status, 200, "no recovery: {}", r.text());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut n_503 = 0;
    for c in clients {
        n_503 += c.await.unwrap();
    }
    assert!(n_503 > 0, "the outage was not seen");
    let acked: Vec<Uuid> = acked.lock().clone();
    s.shutdown().await;
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let stored: i64 = client
        .query_one(
            "SELECT count(*) FROM service_requests WHERE id = ANY($1)",
            &[&acked],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        stored as usize,
        acked.len(),
        "acknowledged requests were lost"
    );
    drop(client);
    drop(cluster);
}

#[tokio::test]
async fn connections_an_outage_closed_are_not_handed_out_after_it() {
    // One runtime, executing nothing: no background query clears the pool's dead
    // connections before a request meets them.
    let db = TestDb::new();
    let proxy = PgProxy::start().await;
    let mut cfg = config(&proxy.url(&db.name));
    cfg.threads = 1;
    cfg.max_running = 0;
    let s = TestServer::start(cfg).await;
    s.create_workflow(&simple_workflow("wf")).await;
    for probe in ["create", "ready"] {
        // Several requests at once leave several idle connections in the pool.
        let warm = futures_util::future::join_all((0..6).map(|_| s.get("/ready"))).await;
        assert!(warm.iter().all(|r| r.status == 200));
        // A short outage closes them all (the proxy drops each within 20 ms), and the
        // server's side of each sees the close (nothing uses them meanwhile).
        proxy.cut();
        wait_for(
            "the outage to close the pooled connections",
            Duration::from_secs(5),
            || async { (proxy.client_sockets_open() == 0).then_some(()) },
        )
        .await;
        proxy.restore();
        let r = match probe {
            "ready" => s.get("/ready").await,
            _ => s.post("/serviceRequest/wf", "{}").await,
        };
        assert_eq!(r.status, 200, "{probe} after the outage: {}", r.text());
    }
    s.shutdown().await;
    assert_eq!(db.count("SELECT count(*) FROM service_requests").await, 1);
}

/// However batches queue behind a stalled one, no create waits longer than the flush
/// timeout plus the enqueue wait (and the documented margin): an exclusive lock held for
/// 8 s under 64 creating clients, the defaults (3 s and 200 ms). The machine is this
/// test's alone: what it bounds is the server, not the tests that would share two cores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_create_waits_past_the_stall_bound_while_a_lock_is_held() {
    /// Beyond flush timeout + enqueue wait: docs/configuration.md states 0.25 s and a
    /// round trip; these clients are 64 tasks of a debug build on a shared 2-core
    /// machine, whose answers were seen 3.03 to 3.23 s here (alone, and beside two busy
    /// loops) and once past 3.7 s on a slower one. The behaviour this test was written
    /// against answered in 4.7 s (batches queued behind the stalled one), which this
    /// bound still fails.
    const MARGIN: Duration = Duration::from_millis(1000);
    let db = TestDb::alone();
    let cfg = config(&db.url);
    let bound = cfg.flush_timeout + cfg.enqueue_wait + MARGIN;
    let s = TestServer::start(cfg).await;
    s.create_workflow(&simple_workflow("wf")).await;
    for _ in 0..10 {
        assert_eq!(s.post("/serviceRequest/wf", "{}").await.status, 200);
    }
    // They settle first: a step write aimed at a partition set locks that partition
    // before its parent the first time a connection meets the set, and against this
    // lock (parent first) the two deadlock (docs/decisions.md, partitioned layout).
    wait_for(
        "the first requests to settle",
        Duration::from_secs(60),
        || async {
            let settled = db
                .count("SELECT count(*) FROM service_requests WHERE finished_at IS NOT NULL")
                .await;
            (settled == 10).then_some(())
        },
    )
    .await;
    let mut locker = db.client().await;
    let tx = locker.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE service_requests IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let locked = Instant::now();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..64)
        .map(|c| {
            let (addr, stop) = (s.addr, stop.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let sent = Instant::now();
                    let r = send(
                        addr,
                        hyper::Method::POST,
                        "/serviceRequest/wf",
                        Some(format!("{{\"c\":{c},\"i\":{i}}}").into_bytes()),
                        &[],
                    )
                    .await;
                    let ok = r.status == 200;
                    answers.push((r.status.as_u16(), sent.elapsed()));
                    i += 1;
                    if !ok {
                        // Not a hot loop against the stall.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                answers
            })
        })
        .collect();
    // time is what is tested: the lock is held for 8 s under load.
    tokio::time::sleep_until((locked + Duration::from_secs(8)).into()).await;
    tx.rollback().await.unwrap();
    // A little load after the lock, then stop (half a second of it, on purpose).
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut all = Vec::new();
    for c in clients {
        all.extend(c.await.unwrap());
    }
    let slowest = all.iter().map(|(_, took)| *took).max().unwrap();
    let acked = all.iter().filter(|(st, _)| *st == 200).count();
    let refused = all.iter().filter(|(st, _)| *st == 503).count();
    eprintln!(
        "stall: {} answers ({acked} acknowledged, {refused} 503), the slowest in {slowest:?} (bound {bound:?})",
        all.len()
    );
    assert!(all.iter().all(|(st, _)| *st == 200 || *st == 503));
    assert!(refused > 0, "the lock refused nothing");
    let mut by_time: Vec<_> = all.iter().collect();
    by_time.sort_by_key(|(_, took)| std::cmp::Reverse(*took));
    assert!(
        slowest <= bound,
        "a create waited {slowest:?} (bound {bound:?}); the slowest five: {:?}",
        &by_time[..by_time.len().min(5)]
    );
    s.shutdown().await;
    // Every 503 was truthful: exactly the acknowledged rows (and the ten before) are stored.
    assert_eq!(
        db.count("SELECT count(*) FROM service_requests").await as usize,
        acked + 10,
        "stored rows against acknowledged ones (+10 before the lock): a 503 that was \
         stored, or an acknowledgement that was not"
    );
}

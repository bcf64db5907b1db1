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

/// Posts until a response arrives that satisfies `ok`, for at most `within`.
async fn post_until(s: &TestServer, within: Duration, ok: impl Fn(&Resp) -> bool) -> Resp {
    let deadline = Instant::now() + within;
    loop {
        let r = s.post("/serviceRequest/wf", "{}").await;
        if ok(&r) || Instant::now() > deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
    assert_eq!(s.get("/ready").await.status, 200);
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

//! Expired idempotency keys are deleted by the server itself, so the keys table holds one
//! window's worth of keys, not every key ever sent.

use std::time::Duration;

use serde_json::json;

use crate::support::{config, simple_workflow, wait_for, TestDb, TestServer};

#[tokio::test]
async fn keys_past_their_window_are_deleted() {
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.idempotency_window = Duration::from_millis(500);
    cfg.retention_interval = Duration::from_millis(100);
    cfg.max_running = 0;
    let s = TestServer::start(cfg).await;
    s.create_workflow(&simple_workflow("wf")).await;
    for k in 0..5 {
        let r = crate::support::send(
            s.addr,
            hyper::Method::POST,
            "/serviceRequest/wf",
            Some(json!({ "k": k }).to_string().into_bytes()),
            &[("idempotency-key", &format!("key-{k}"))],
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(db.count("SELECT count(*) FROM idempotency_keys").await, 5);
    // Deleted once expired: the table empties while the requests stay.
    wait_for(
        "the expired keys to be deleted",
        Duration::from_secs(10),
        || async { (db.count("SELECT count(*) FROM idempotency_keys").await == 0).then_some(()) },
    )
    .await;
    assert_eq!(db.count("SELECT count(*) FROM service_requests").await, 5);
    s.shutdown().await;
}

//! Requests finished, in `/metrics` (beyond Clamp): by workflow and final status, with
//! their time from create to finish as a histogram per workflow.

use std::time::Duration;

use serde_json::json;

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_requests_are_counted_by_workflow_and_status() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let step =
        |url: String| json!([{"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": url}}]);
    s.create_workflow(&json!({"name": "good", "steps": step(d.url("/api/echo"))}))
        .await;
    s.create_workflow(&json!({"name": "bad", "steps": step(d.url("/status/500"))}))
        .await;
    for _ in 0..3 {
        let id = create_request(&s, "good", &json!({})).await;
        wait_status(&s, &id, &["COMPLETED"], WAIT).await;
    }
    for _ in 0..2 {
        let id = create_request(&s, "bad", &json!({})).await;
        wait_status(&s, &id, &["FAILED"], WAIT).await;
    }
    let later = s
        .post("/serviceRequest/good?delayMs=600000", "{}")
        .await
        .json();
    let later = later["serviceRequestId"].as_str().unwrap().to_string();
    let r = s
        .post(&format!("/serviceRequest/{later}/cancel"), "{}")
        .await;
    assert_eq!(r.status, 200, "{}", r.text());

    let m = s.get("/metrics").await.text();
    let finished = |wf: &str, status: &str| {
        metric(
            &m,
            &format!(r#"clamp_requests_finished_total{{workflow="{wf}",status="{status}"}} "#),
        )
    };
    assert_eq!(finished("good", "COMPLETED"), 3.0, "{m}");
    assert_eq!(finished("good", "CANCELLED"), 1.0, "{m}");
    assert_eq!(finished("good", "FAILED"), 0.0, "{m}");
    assert_eq!(finished("bad", "FAILED"), 2.0, "{m}");
    assert_eq!(finished("bad", "COMPLETED"), 0.0, "{m}");
    // Every finish has its duration; each of these took well under ten seconds.
    let count = |wf: &str| {
        metric(
            &m,
            &format!(r#"clamp_request_duration_seconds_count{{workflow="{wf}"}} "#),
        )
    };
    assert_eq!(count("good"), 4.0, "{m}");
    assert_eq!(count("bad"), 2.0, "{m}");
    assert_eq!(
        metric(
            &m,
            r#"clamp_request_duration_seconds_bucket{le="10.0",workflow="bad"} "#
        ),
        2.0,
        "{m}"
    );
    // Clamp's own counters go on as they were.
    assert_eq!(
        metric(&m, "completed_service_request_handler_counter_total "),
        3.0
    );
    s.shutdown().await;
}

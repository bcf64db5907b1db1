//! Status reads: final answers from memory are byte for byte the database's, reads see
//! every acknowledged write on any instance, and long polls answer when the status
//! changes.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(20);

fn step(name: &str, url: String) -> Value {
    json!({"name": name, "mode": "HTTP", "val": {"method": "POST", "url": url}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_from_memory_are_the_database_answers_byte_for_byte() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    // The request runs on one instance and is read through the other, which executes nothing.
    let runner = TestServer::start(config(&db.url)).await;
    let mut api = config(&db.url);
    api.max_running = 0;
    let api = TestServer::start(api).await;
    let mut skip = step("skipped", d.url("/api/echo"));
    skip["when"] = json!("first.response.step == 2");
    let mut shaped = step("shaped", d.url("/api/echo"));
    shaped["transform"] = json!(true);
    shaped["requestTransform"] = json!({"spec": {"user.id": "first.response.user.id"}});
    runner
        .create_workflow(&json!({"name": "mixed", "steps": [
            step("first", d.url("/api/step1")), skip, shaped, step("last", d.url("/api/echo"))]}))
        .await;
    let mut failing = step("failing", d.url("/status/500"));
    failing["onFailure"] = json!([step("undo", d.url("/api/echo"))]);
    runner
        .create_workflow(&json!({"name": "failing", "steps": [failing]}))
        .await;
    let mut flaky = step("flaky", d.url("/flaky/503"));
    flaky["retry"] = json!({"initialIntervalMs": 10});
    runner
        .create_workflow(
            &json!({"name": "flaky", "steps": [flaky, step("after", d.url("/api/echo"))]}),
        )
        .await;
    let mut ids = Vec::new();
    for i in 0..30 {
        for wf in ["mixed", "failing", "flaky"] {
            ids.push(
                create_request(
                    &runner,
                    wf,
                    &json!({"i": i, "unicode": "é\u{1F600}", "n": 1.5e3}),
                )
                .await,
            );
        }
    }
    let c = db.client().await;
    let uuids: Vec<uuid::Uuid> = ids.iter().map(|i| i.parse().unwrap()).collect();
    wait_for("every request to finish", WAIT, || async {
        let left: i64 = c
            .query_one(
                "SELECT count(*) FROM service_requests WHERE id = ANY($1) AND status NOT IN ('COMPLETED', 'FAILED')",
                &[&uuids],
            )
            .await
            .unwrap()
            .get(0);
        (left == 0).then_some(())
    })
    .await;
    for id in &ids {
        let path = format!("/serviceRequest/{id}");
        let mine = runner.get(&path).await;
        let theirs = api.get(&path).await;
        assert_eq!(mine.status, 200);
        assert_eq!(
            mine.text(),
            theirs.text(),
            "the runner's answer differs from the database's"
        );
        // And the runner's second answer (from memory for sure) is the same too.
        assert_eq!(runner.get(&path).await.body, mine.body);
    }
    let m = runner.get("/metrics").await.text();
    let from_memory = metric(&m, "clamp_status_reads_total{source=\"memory\"}");
    // Every request read twice on the runner: those it ran from the first step to the
    // end and COMPLETED ("mixed") from memory both times; the retried ones ("flaky") the
    // second time, from the cache the first read filled; the FAILED ones never, since a
    // FAILED request may be retried (on any instance) and its answer change.
    assert!(from_memory >= 90.0, "{from_memory} reads from memory\n{m}");
    let from_database = metric(&m, "clamp_status_reads_total{source=\"database\"}");
    assert!(
        from_database >= 60.0,
        "{from_database} reads from Postgres\n{m}"
    );
    let m = api.get("/metrics").await.text();
    assert_eq!(
        metric(&m, "clamp_status_reads_total{source=\"database\"}"),
        ids.len() as f64
    );
    runner.shutdown().await;
    api.shutdown().await;
}

#[tokio::test]
async fn reads_on_any_instance_see_every_acknowledged_write() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let a = TestServer::start(config(&db.url)).await;
    let b = TestServer::start(config(&db.url)).await;
    let mut ask = step("ask", d.url("/api/accepted"));
    ask["type"] = json!("ASYNC");
    a.create_workflow(&json!({"name": "wait", "steps": [ask, step("next", d.url("/slow/300"))]}))
        .await;
    for _ in 0..5 {
        // Created on one, read on the other at once.
        let id = create_request(&a, "wait", &json!({})).await;
        let v = b.get(&format!("/serviceRequest/{id}")).await;
        assert_eq!(v.status, 200, "{}", v.text());
        wait_status(&b, &id, &["PAUSED"], WAIT).await;
        // Resumed through one: the other shows it resumed at once.
        let r = b
            .post_json(
                "/stepResponse",
                &json!({"serviceRequestId": id, "stepId": 1, "response": {"ok": true}}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
        let v = a.get(&format!("/serviceRequest/{id}")).await.json();
        assert_ne!(v["status"], "PAUSED", "{v}");
        // Cancelled through the other while it runs: the first shows it at once.
        let r = a.post(&format!("/serviceRequest/{id}/cancel"), "").await;
        assert_eq!(r.status, 200, "{}", r.text());
        for s in [&a, &b] {
            let v = s.get(&format!("/serviceRequest/{id}")).await.json();
            assert_eq!(v["status"], "CANCELLED", "{v}");
        }
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn a_long_poll_answers_when_the_status_changes_or_the_wait_ends() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let other = TestServer::start(config(&db.url)).await;
    let mut ask = step("ask", d.url("/api/accepted"));
    ask["type"] = json!("ASYNC");
    s.create_workflow(&json!({"name": "wait", "steps": [ask]}))
        .await;
    let id = create_request(&s, "wait", &json!({})).await;
    wait_status(&s, &id, &["PAUSED"], WAIT).await;
    // Nothing happens: the answer comes when the wait ends, unchanged.
    let started = Instant::now();
    let v = s
        .get(&format!("/serviceRequest/{id}?waitMs=300"))
        .await
        .json();
    let took = started.elapsed();
    assert_eq!(v["status"], "PAUSED");
    assert!(
        took >= Duration::from_millis(280) && took < Duration::from_secs(3),
        "{took:?}"
    );
    // A change comes long before the wait ends: the answer comes with it, on the instance
    // that made the change and on another one.
    for reader in [&s, &other] {
        let id = create_request(&s, "wait", &json!({})).await;
        wait_status(&s, &id, &["PAUSED"], WAIT).await;
        let addr = reader.addr;
        let path = format!("/serviceRequest/{id}?waitMs=10000");
        let reads_before = metric(
            &reader.get("/metrics").await.text(),
            "clamp_status_reads_total{source=\"database\"}",
        );
        let poll = tokio::spawn(async move {
            let started = Instant::now();
            let r = send(addr, hyper::Method::GET, &path, None, &[]).await;
            (r, started.elapsed())
        });
        // The poll is waiting before the change is made.
        wait_for("the long poll to wait", WAIT, || async {
            let m = reader.get("/metrics").await.text();
            (metric(&m, "clamp_status_reads_total{source=\"database\"}") > reads_before)
                .then_some(())
        })
        .await;
        let r = s
            .post_json(
                "/stepResponse",
                &json!({"serviceRequestId": id, "stepId": 1, "response": {"ok": true}}),
            )
            .await;
        assert_eq!(r.status, 200);
        let (r, took) = poll.await.unwrap();
        assert_eq!(r.status, 200);
        assert_ne!(r.json()["status"], "PAUSED", "{}", r.text());
        assert!(took < Duration::from_secs(5), "{took:?}");
    }
    s.get(&format!("/serviceRequest/{id}?waitMs=999999"))
        .await
        .expect_error(400);
    s.get(&format!("/serviceRequest/{id}?waitMs=soon"))
        .await
        .expect_error(400);
    s.shutdown().await;
    other.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_of_running_requests_are_the_database_answers_byte_for_byte() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let runner = TestServer::start(config(&db.url)).await;
    let mut api = config(&db.url);
    api.max_running = 0;
    let api = TestServer::start(api).await;
    runner
        .create_workflow(&json!({"name": "running", "steps": [
            step("first", d.url("/api/step1")), step("slow", d.url("/slow/400")),
            step("last", d.url("/api/echo"))]}))
        .await;
    let mut compared = 0;
    for i in 0..12 {
        let id = create_request(&runner, "running", &json!({"i": i})).await;
        let path = format!("/serviceRequest/{id}");
        // While the slow step runs: the runner answers from its row and its step rows.
        let key = format!("{id}:2");
        wait_for("the slow step to start", WAIT, || async {
            (d.calls_for_key(&key) == 1).then_some(())
        })
        .await;
        let before = runner.get(&path).await.text();
        let theirs = api.get(&path).await.text();
        let after = runner.get(&path).await.text();
        if before == after {
            // Nothing committed between the reads: all three show the same state.
            assert_eq!(before, theirs);
            assert!(before.contains("IN_PROGRESS"), "{before}");
            compared += 1;
        }
        wait_status(&runner, &id, &["COMPLETED"], WAIT).await;
    }
    assert!(compared >= 6, "only {compared} states compared");
    let m = runner.get("/metrics").await.text();
    assert!(
        metric(&m, "clamp_status_reads_total{source=\"row\"}") >= compared as f64 * 2.0,
        "{m}"
    );
    runner.shutdown().await;
    api.shutdown().await;
}

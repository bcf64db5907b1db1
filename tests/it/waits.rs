//! WAIT steps (beyond Clamp): a request sleeps in Postgres for a duration or until a time
//! in its context, shows what it waits for, goes on no earlier than its time and exactly
//! once, across a kill -9 of the instance that started the wait.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use uuid::Uuid;

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(30);

fn http(name: &str, url: String) -> Value {
    json!({"name": name, "mode": "HTTP", "val": {"method": "POST", "url": url}})
}

fn wait(name: &str, val: Value) -> Value {
    json!({"name": name, "mode": "WAIT", "val": val})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_sleeps_for_its_duration_shows_it_and_passes_its_request_on() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "cool-off", "steps": [
        wait("cool", json!({"duration": "PT2S"})),
        http("after", d.url("/api/echo"))]}))
        .await;
    let t0 = Instant::now();
    let id = create_request(&s, "cool-off", &json!({"order": 7})).await;
    let v = wait_for_seen("the request to show its wait", WAIT, || async {
        let v = s.get(&format!("/serviceRequest/{id}")).await.json();
        v.get("waiting").is_some().then_some(v.clone()).ok_or(v)
    })
    .await;
    assert_eq!(v["waiting"]["step_id"], 1, "{v}");
    assert_eq!(v["status"], "IN_PROGRESS", "{v}");
    assert!(v["waiting"]["until"].is_string(), "{v}");
    assert!(v.get("retrying").is_none(), "a wait is not a retry: {v}");
    assert_eq!(v["steps"][0]["status"], "STARTED", "{v}");
    // The console says so too.
    let page = s
        .get(&format!("/console/serviceRequests/{id}"))
        .await
        .text();
    assert!(page.contains("sleeps until"), "{page}");
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert!(
        t0.elapsed() >= Duration::from_secs(2),
        "went on after {:?}",
        t0.elapsed()
    );
    // Its response is its request, which the next step receives.
    let cool = step_entry(&v, "cool", "COMPLETED");
    assert_eq!(cool["payload"]["response"], json!({"order": 7}), "{v}");
    assert_eq!(cool["attempts"], 1, "{v}");
    let got = d.received("/api/echo");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body, json!({"order": 7}));
    assert!(v.get("waiting").is_none(), "{v}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_until_a_time_in_the_context_goes_on_then_or_at_once_when_past() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "remind", "steps": [
        wait("until", json!({"until": "until.request.at"})),
        http("after", d.url("/api/echo"))]}))
        .await;
    let at = |ms: i64| {
        (chrono::Utc::now() + chrono::Duration::milliseconds(ms))
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    };
    // In the past: at once.
    let t0 = Instant::now();
    let past = create_request(&s, "remind", &json!({"at": at(-60_000)})).await;
    let v = wait_status(&s, &past, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    // Ahead: no earlier than the time.
    let t0 = Instant::now();
    let ahead = create_request(&s, "remind", &json!({"at": at(1_500)})).await;
    let v = wait_status(&s, &ahead, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert!(
        t0.elapsed() >= Duration::from_millis(1_400),
        "{:?}",
        t0.elapsed()
    );
    // Not a time, or missing: the step fails with a reason that says so.
    for (payload, needle) in [
        (json!({"at": "tomorrow"}), "not an RFC 3339 time"),
        (json!({"when": 1}), "not a time in the context"),
    ] {
        let id = create_request(&s, "remind", &payload).await;
        let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(v["status"], "FAILED", "{v}");
        assert!(v["reason"].as_str().unwrap().contains(needle), "{v}");
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_definitions_are_checked() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    for (val, needle) in [
        (json!({}), "exactly one of duration"),
        (
            json!({"duration": "10 minutes"}),
            "not an ISO 8601 duration",
        ),
        (json!({"duration": "P1M"}), "months"),
        (json!({"duration": "P400D"}), "longest wait"),
        (json!({"duration": "PT1S", "until": "a.b"}), "exactly one"),
        (json!({"until": "a..b"}), "dotted path"),
        (
            json!({"duration": "PT1S", "timeout": "PT1S"}),
            "not a field",
        ),
    ] {
        let r = s
            .post_json(
                "/workflow",
                &json!({"name": "w", "steps": [wait("w1", val.clone())]}),
            )
            .await;
        assert_eq!(r.status, 400, "{val}: {}", r.text());
        assert!(r.text().contains(needle), "{val}: {}", r.text());
    }
    let mut asynchronous = wait("w1", json!({"duration": "PT1S"}));
    asynchronous["type"] = json!("ASYNC");
    let r = s
        .post_json("/workflow", &json!({"name": "w", "steps": [asynchronous]}))
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    // An answer timeout: on ASYNC steps that wait for an answer, as an ISO 8601 duration.
    let d = Downstream::start().await;
    let mut sync_step = http("s", d.url("/api/echo"));
    sync_step["answerTimeout"] = json!("PT1M");
    let mut bad_duration = http("s", d.url("/api/echo"));
    bad_duration["type"] = json!("ASYNC");
    bad_duration["answerTimeout"] = json!("an hour");
    let mut on_wait = wait("w1", json!({"duration": "PT1S"}));
    on_wait["answerTimeout"] = json!("PT1M");
    for (step, needle) in [
        (sync_step, "applies to ASYNC"),
        (bad_duration, "not an ISO 8601 duration"),
        (on_wait, "applies to ASYNC"),
    ] {
        let r = s
            .post_json("/workflow", &json!({"name": "w", "steps": [step]}))
            .await;
        assert_eq!(r.status, 400, "{}", r.text());
        assert!(r.text().contains(needle), "{}", r.text());
    }
    let ok = s
        .create_workflow(&json!({"name": "w", "steps": [wait("w1", json!({"duration": "P3D"}))]}))
        .await;
    assert_eq!(ok["steps"][0]["type"], "SYNC", "{ok}");
    s.shutdown().await;
}

/// 1,000 requests sleep; the instance that put them to sleep is killed with SIGKILL; a
/// new one continues every one of them once, none before its time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_waits_across_a_kill_each_go_on_once_and_not_early() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let port = free_port();
    let mut server = spawn_binary(&db.url, port);
    wait_healthy(port).await;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let def = json!({"name": "sleepy", "steps": [
        wait("nap", json!({"duration": "PT4S"})),
        http("after", d.url("/api/echo"))]});
    let r = send(
        addr,
        hyper::Method::POST,
        "/workflow",
        Some(def.to_string().into_bytes()),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let mut ids = Vec::new();
    for chunk in 0..10 {
        let sends = (0..100).map(|i| async move {
            let body = json!({"n": chunk * 100 + i}).to_string().into_bytes();
            let r = send(
                addr,
                hyper::Method::POST,
                "/serviceRequest/sleepy",
                Some(body),
                &[],
            )
            .await;
            assert_eq!(r.status, 200, "{}", r.text());
            r.json()["serviceRequestId"].as_str().unwrap().to_string()
        });
        ids.extend(futures_util::future::join_all(sends).await);
    }
    // Every one asleep (its wait written), then the kill.
    let c = db.client().await;
    wait_for_seen("every request to be asleep", WAIT, || async {
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM steps_status WHERE step_id = 1 AND status = 'STARTED'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        (n == 1000).then_some(()).ok_or(n)
    })
    .await;
    assert_eq!(d.received("/api/echo").len(), 0, "none went on early");
    server.kill().unwrap();
    server.wait().unwrap();
    let port2 = free_port();
    let _again = spawn_binary(&db.url, port2);
    wait_healthy(port2).await;
    let addr2: std::net::SocketAddr = format!("127.0.0.1:{port2}").parse().unwrap();
    for id in &ids {
        let v = wait_status_at(
            addr2,
            id,
            &["COMPLETED", "FAILED"],
            Duration::from_secs(60),
            &[],
        )
        .await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
    }
    for id in &ids {
        assert_eq!(d.calls_for_key(&format!("{id}:2")), 1, "{id}");
    }
    // No step after a wait started before the wait's time (its start plus 4 s).
    let early: i64 = c
        .query_one(
            "SELECT count(*) FROM steps_status a JOIN steps_status w
               ON w.service_request_id = a.service_request_id AND w.step_id = 1 AND w.status = 'STARTED'
             WHERE a.step_id = 2 AND a.started_at < w.started_at + interval '4 seconds'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(early, 0, "steps started before their wait ended");
    let ids: Vec<Uuid> = ids.iter().map(|i| Uuid::parse_str(i).unwrap()).collect();
    let completed: i64 = c
        .query_one(
            "SELECT count(*) FROM service_requests WHERE id = ANY($1) AND status = 'COMPLETED'",
            &[&ids],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(completed, 1000);
}

/// A cancel ends a sleeping request at once, and its time passing starts nothing; a WAIT
/// in one PARALLEL branch sleeps that branch only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_request_is_cancelled_and_a_wait_in_a_branch_sleeps_only_it() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "nap", "steps": [
        wait("nap", json!({"duration": "PT1S"})),
        http("after", d.url("/api/echo"))]}))
        .await;
    let id = create_request(&s, "nap", &json!({"n": 1})).await;
    wait_for_seen("the request to sleep", WAIT, || async {
        let v = s.get(&format!("/serviceRequest/{id}")).await.json();
        v.get("waiting").is_some().then_some(()).ok_or(v)
    })
    .await;
    let r = s.post(&format!("/serviceRequest/{id}/cancel"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    let v = s.get(&format!("/serviceRequest/{id}")).await.json();
    assert_eq!(v["status"], "CANCELLED", "{v}");
    assert_eq!(
        d.received("/api/echo").len(),
        0,
        "nothing ran after the cancel"
    );

    s.create_workflow(&json!({"name": "split", "steps": [
        {"name": "both", "mode": "PARALLEL", "val": {"branches": [
            {"name": "later", "steps": [wait("hold", json!({"duration": "PT1.5S"})), http("l", d.url("/api/step1"))]},
            {"name": "now", "steps": [http("n", d.url("/api/echo"))]}]}}]}))
    .await;
    let t0 = Instant::now();
    let id = create_request(&s, "split", &json!({"n": 2})).await;
    d.wait_for("/api/echo").await;
    assert!(
        t0.elapsed() < Duration::from_millis(1_500),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(d.received("/api/step1").len(), 0);
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert!(
        t0.elapsed() >= Duration::from_millis(1_500),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(d.received("/api/step1").len(), 1);
    s.shutdown().await;
}

/// An ASYNC step that names an `answerTimeout`: its request shows when the answer is
/// due; without an answer by then the attempt fails with a timeout and, its policy
/// allowing one attempt, the onFailure steps run; a late answer changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_step_not_answered_in_time_fails_and_runs_its_on_failure_steps() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let mut ask = http("ask", d.url("/api/accepted"));
    ask["type"] = json!("ASYNC");
    ask["answerTimeout"] = json!("PT1S");
    ask["retry"] = json!({"maxAttempts": 1});
    ask["onFailure"] = json!([http("cleanup", d.url("/api/echo"))]);
    let wf = s
        .create_workflow(
            &json!({"name": "approve", "steps": [ask, http("after", d.url("/api/step1"))]}),
        )
        .await;
    assert_eq!(wf["steps"][0]["answerTimeout"], "PT1S", "{wf}");
    let id = create_request(&s, "approve", &json!({"claim": 1})).await;
    let v = wait_status(&s, &id, &["PAUSED"], WAIT).await;
    assert_eq!(v["answerDue"]["step_id"], 1, "{v}");
    assert!(v["answerDue"]["by"].is_string(), "{v}");
    let page = s
        .get(&format!("/console/serviceRequests/{id}"))
        .await
        .text();
    assert!(page.contains("times out at"), "{page}");
    let t0 = Instant::now();
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .contains("no answer within PT1S"),
        "{v}"
    );
    let ask = step_entry(&v, "ask", "FAILED");
    assert_eq!(ask["payload"]["response"]["errors"]["code"], 504, "{v}");
    assert_eq!(d.received("/api/echo").len(), 1, "cleanup ran once");
    assert_eq!(d.received("/api/step1").len(), 0);
    assert_eq!(d.received("/api/accepted").len(), 1, "sent once");
    // A late answer changes nothing.
    let late = s
        .post_json(
            "/stepResponse",
            &json!({"serviceRequestId": id, "stepId": 1, "response": {"ok": true}}),
        )
        .await;
    assert_ne!(late.json()["message"], "success", "{}", late.text());
    let again = s.get(&format!("/serviceRequest/{id}")).await.json();
    assert_eq!(again["status"], "FAILED", "{again}");
    assert_eq!(again["steps"], v["steps"], "{again}");
    let m = s.get("/metrics").await.text();
    assert!(m.contains("clamp_answer_timeouts_total 1"), "{m}");
    s.shutdown().await;
}

/// A timeout is retried as the step's policy says: the step is sent again (same
/// Idempotency-Key), and an answer to the new attempt completes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_answer_is_sent_again_by_its_retry_policy_then_answered() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let mut ask = http("ask", d.url("/api/accepted"));
    ask["type"] = json!("ASYNC");
    ask["answerTimeout"] = json!("PT1S");
    ask["retry"] = json!({"maxAttempts": 3});
    s.create_workflow(
        &json!({"name": "approve", "steps": [ask, http("after", d.url("/api/echo"))]}),
    )
    .await;
    let id = create_request(&s, "approve", &json!({"claim": 2})).await;
    wait_for_seen("the step to be sent a second time", WAIT, || async {
        let n = d.calls_for_key(&format!("{id}:1"));
        (n >= 2).then_some(()).ok_or(n)
    })
    .await;
    let v = wait_status(&s, &id, &["PAUSED"], WAIT).await;
    assert!(v.get("answerDue").is_some(), "{v}");
    let r = s
        .post_json(
            "/stepResponse",
            &json!({"serviceRequestId": id, "stepId": 1, "response": {"approved": true}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(d.calls_for_key(&format!("{id}:1")), 2, "{v}");
    assert_eq!(d.received("/api/echo")[0].body, json!({"approved": true}));
    let failed: Vec<&Value> = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "ask" && e["status"] == "FAILED")
        .collect();
    assert_eq!(failed.len(), 1, "{v}");
    assert!(
        failed[0]["reason"]
            .as_str()
            .unwrap()
            .contains("no answer within PT1S"),
        "{v}"
    );
    s.shutdown().await;
}

/// An answer posted at the moment its step times out: each request ends one way, with
/// one final record of the step, whichever won.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_racing_its_timeout_resolves_once() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let mut ask = http("ask", d.url("/api/accepted"));
    ask["type"] = json!("ASYNC");
    ask["answerTimeout"] = json!("PT1S");
    ask["retry"] = json!({"maxAttempts": 1});
    s.create_workflow(&json!({"name": "race", "steps": [ask, http("after", d.url("/api/echo"))]}))
        .await;
    let mut ids = Vec::new();
    for n in 0..40 {
        ids.push(create_request(&s, "race", &json!({"n": n})).await);
    }
    for id in &ids {
        wait_status(&s, id, &["PAUSED"], WAIT).await;
    }
    // Answers from just before to just after the deadlines and the look that fires them.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let answers = ids.iter().enumerate().map(|(i, id)| {
        let s = &s;
        async move {
            tokio::time::sleep(Duration::from_millis(40 * i as u64)).await;
            s.post_json(
                "/stepResponse",
                &json!({"serviceRequestId": id, "stepId": 1, "response": {"i": i}}),
            )
            .await
        }
    });
    futures_util::future::join_all(answers).await;
    let (mut completed, mut failed) = (0, 0);
    for id in &ids {
        let v = wait_status(&s, id, &["COMPLETED", "FAILED"], WAIT).await;
        let finals = final_entries(&v, 1);
        assert_eq!(finals.len(), 1, "one outcome of the step: {v}");
        match v["status"].as_str().unwrap() {
            "COMPLETED" => {
                completed += 1;
                assert_eq!(finals[0]["status"], "COMPLETED", "{v}");
                assert_eq!(d.calls_for_key(&format!("{id}:2")), 1);
            }
            _ => {
                failed += 1;
                assert!(
                    v["reason"].as_str().unwrap().contains("no answer within"),
                    "{v}"
                );
                assert_eq!(d.calls_for_key(&format!("{id}:2")), 0);
            }
        }
    }
    assert_eq!(completed + failed, ids.len());
}

/// The timer metrics: the gauges count the requests asleep when /metrics is read (a
/// scrape counts them, at most every 30 s), and each WAIT that ends is observed in the
/// fire-lateness histogram, late by no more than the sweeps that take it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleeping_requests_are_counted_and_each_fire_is_timed() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "later", "steps": [
        wait("nap", json!({"duration": "PT1H"}))]}))
        .await;
    s.create_workflow(&json!({"name": "soon", "steps": [
        wait("nap", json!({"duration": "PT1S"}))]}))
        .await;
    let mut sleeping = Vec::new();
    for n in 0..3 {
        sleeping.push(create_request(&s, "later", &json!({"n": n})).await);
    }
    for id in &sleeping {
        wait_for_seen("the request to sleep", WAIT, || async {
            let v = s.get(&format!("/serviceRequest/{id}")).await.json();
            v.get("waiting").is_some().then_some(()).ok_or(v)
        })
        .await;
    }
    // The first scrape counts.
    let m = s.get("/metrics").await.text();
    assert_eq!(metric(&m, "clamp_timers_pending "), 3.0, "{m}");
    assert_eq!(metric(&m, "clamp_timers_overdue_milliseconds "), 0.0);
    assert_eq!(metric(&m, "clamp_timer_fire_lateness_seconds_count "), 0.0);

    let mut short = Vec::new();
    for n in 0..4 {
        short.push(create_request(&s, "soon", &json!({"n": n})).await);
    }
    for id in &short {
        let v = wait_status(&s, id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
    }
    let m = s.get("/metrics").await.text();
    assert_eq!(
        metric(&m, "clamp_timer_fire_lateness_seconds_count "),
        4.0,
        "{m}"
    );
    let sum = metric(&m, "clamp_timer_fire_lateness_seconds_sum ");
    assert!((0.0..8.0).contains(&sum), "four fires, {sum} s late in all");
    // Within the period, the gauges are the last count's.
    assert_eq!(metric(&m, "clamp_timers_pending "), 3.0);
    s.shutdown().await;
}

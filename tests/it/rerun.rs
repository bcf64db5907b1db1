//! Rerun (`POST /serviceRequest/{id}/rerun`, beyond Clamp): a new request of the same
//! workflow; the steps before `fromStep` are the original's outcomes, recorded and not
//! called (the downstream counts calls per step key, which carries the request id); it
//! names its origin, and search lists the reruns of a request.

use std::time::Duration;

use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(20);

/// Three steps: a echoes the payload, b echoes what a answered, c fails until fixed.
fn three(d: &Downstream) -> Value {
    json!({"name": "three", "description": "rerun", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}},
        {"name": "b", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}},
        {"name": "c", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/until-fixed")}}]})
}

fn entries(v: &Value) -> Vec<(i64, String)> {
    v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["id"].as_i64().unwrap(),
                e["status"].as_str().unwrap().into(),
            )
        })
        .collect()
}

fn calls(d: &Downstream, id: &str, step: u32) -> usize {
    d.calls_for_key(&format!("{id}:{step}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerun_from_a_step_copies_the_earlier_outcomes_without_calling_them() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&three(&d)).await;
    let orig = create_request(&s, "three", &json!({"n": 1})).await;
    let v = wait_status(&s, &orig, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    d.fix();

    let r = s
        .post(
            &format!("/serviceRequest/{orig}/rerun"),
            r#"{"fromStep": 3}"#,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let a = r.json();
    let run = a["serviceRequestId"].as_str().unwrap().to_string();
    assert_ne!(run, orig);
    assert_eq!(a["status"], "NEW");
    assert_eq!(a["rerunOf"], orig.as_str());
    assert_eq!(a["pollUrl"], format!("/serviceRequest/{run}"));

    let v = wait_status(&s, &run, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(v["rerunOf"], orig.as_str());
    assert_eq!(v["workflow_name"], "three");
    // a and b are the original's outcomes, recorded as copies and never called for it.
    assert_eq!((calls(&d, &run, 1), calls(&d, &run, 2)), (0, 0));
    assert_eq!(calls(&d, &run, 3), 1);
    assert_eq!((calls(&d, &orig, 1), calls(&d, &orig, 2)), (1, 1));
    let want: Vec<(i64, String)> = [
        (1, "STARTED"),
        (1, "COMPLETED"),
        (2, "STARTED"),
        (2, "COMPLETED"),
        (3, "STARTED"),
        (3, "COMPLETED"),
    ]
    .iter()
    .map(|(i, s)| (*i, s.to_string()))
    .collect();
    assert_eq!(entries(&v), want, "{v}");
    let steps = v["steps"].as_array().unwrap();
    assert!(steps[1]["reason"].as_str().unwrap().contains(&orig), "{v}");
    assert_eq!(
        steps[3]["payload"]["response"],
        json!({"echo": {"echo": {"n": 1}}})
    );
    // c received what b answered in the original.
    let c_bodies: Vec<Value> = d
        .received("/until-fixed")
        .into_iter()
        .filter(|r| r.headers.get("idempotency-key") == Some(&format!("{run}:3")))
        .map(|r| r.body)
        .collect();
    assert_eq!(c_bodies, vec![json!({"echo": {"echo": {"n": 1}}})]);
    // The original is untouched and lists its rerun.
    let o = s.get(&format!("/serviceRequest/{orig}")).await.json();
    assert_eq!(o["status"], "FAILED");
    assert_eq!(o.get("rerunOf"), None);
    let found = s
        .get(&format!("/serviceRequests?rerunOf={orig}"))
        .await
        .json();
    let ids: Vec<&str> = found["serviceRequests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![run.as_str()]);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerun_starts_from_the_first_step_or_with_a_new_payload() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    d.fix();
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&three(&d)).await;
    let orig = create_request(&s, "three", &json!({"n": 2})).await;
    let v = wait_status(&s, &orig, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");

    // No body: every step again, with the original payload.
    let r = s.post(&format!("/serviceRequest/{orig}/rerun"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let all = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    let v = wait_status(&s, &all, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(v["rerunOf"], orig.as_str());
    assert_eq!(
        (calls(&d, &all, 1), calls(&d, &all, 2), calls(&d, &all, 3)),
        (1, 1, 1)
    );
    assert_eq!(
        v["steps"][1]["payload"]["response"],
        json!({"echo": {"n": 2}})
    );

    // From step 2 with a payload of its own: b receives it, a is copied.
    let r = s
        .post(
            &format!("/serviceRequest/{orig}/rerun"),
            r#"{"fromStep": 2, "payload": {"fixed": "by hand"}}"#,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let two = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    let v = wait_status(&s, &two, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(calls(&d, &two, 1), 0);
    assert_eq!(
        v["steps"][3]["payload"]["response"],
        json!({"echo": {"fixed": "by hand"}})
    );
    // A rerun's answer, cached once COMPLETED, still names its origin.
    let again = s.get(&format!("/serviceRequest/{two}")).await.json();
    assert_eq!(again["rerunOf"], orig.as_str());
    let found = s
        .get(&format!("/serviceRequests?rerunOf={orig}&limit=1"))
        .await
        .json();
    assert_eq!(found["serviceRequests"][0]["id"], two.as_str());
    assert!(found["nextCursor"].is_string(), "{found}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerun_is_refused_clearly() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "bfails", "description": "rerun", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}},
        {"name": "b", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/until-fixed")}},
        {"name": "c", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}))
        .await;
    let orig = create_request(&s, "bfails", &json!({})).await;
    wait_status(&s, &orig, &["COMPLETED", "FAILED"], WAIT).await;
    let path = format!("/serviceRequest/{orig}/rerun");
    // Step 2 failed: a rerun cannot take its outcome and start after it.
    let why = s.post(&path, r#"{"fromStep": 3}"#).await.expect_error(409);
    assert!(why.contains("step 2 failed"), "{why}");
    let why = s.post(&path, r#"{"fromStep": 4}"#).await.expect_error(400);
    assert!(why.starts_with("fromStep: 4"), "{why}");
    for bad in [
        r#"{"fromStep": 0}"#,
        r#"{"from": 1}"#,
        "[",
        r#"{"fromStep": "2"}"#,
    ] {
        s.post(&path, bad).await.expect_error(400);
    }
    s.post("/serviceRequest/not-a-uuid/rerun", "")
        .await
        .expect_error(400);
    let unknown = uuid::Uuid::now_v7();
    s.post(&format!("/serviceRequest/{unknown}/rerun"), "")
        .await
        .expect_error(404);
    let why = s
        .get("/serviceRequests?rerunOf=nope")
        .await
        .expect_error(400);
    assert!(why.starts_with("rerunOf:"), "{why}");
    s.shutdown().await;
}

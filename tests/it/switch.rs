//! SWITCH steps (beyond Clamp): the value of `on` over the context picks one path of
//! full steps, run as a child request; the step answers as the path's last step did, so
//! the next step receives that; the case taken is the child's branch. A value with no
//! case and no default fails the step naming the value; an `on` that does not compile or
//! reads no known step is refused at definition.

use std::time::Duration;

use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::support::*;

fn http(name: &str, url: String) -> Value {
    json!({"name": name, "mode": "HTTP", "val": {"method": "POST", "url": url}})
}

/// ask → route (SWITCH on the kind ask echoed) → after.
fn routed(d: &Downstream, name: &str, default: bool) -> Value {
    let mut sw = json!({"on": "ask.response.echo.kind", "cases": {
        "domestic": [http("dom", d.url("/api/echo"))],
        "international": [http("customs", d.url("/api/accepted")), http("duty", d.url("/api/echo"))],
        "slow": [{"name": "nap", "mode": "WAIT", "val": {"duration": "PT1S"}}, http("late", d.url("/api/echo"))]}});
    if default {
        sw["default"] = json!([http("fallback", d.url("/traced"))]);
    }
    json!({"name": name, "steps": [
        http("ask", d.url("/api/echo")),
        {"name": "route", "mode": "SWITCH", "val": sw},
        http("after", d.url("/api/echo"))]})
}

/// The request `after` received, once the request completed.
async fn after_got(s: &TestServer, id: &str) -> Value {
    let v = wait_status(s, id, &["COMPLETED", "FAILED"], Duration::from_secs(20)).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|st| st["name"] == "after" && st["status"] == "COMPLETED")
        .map(|st| st["payload"]["request"].clone())
        .unwrap_or_else(|| panic!("after did not run: {v}"))
}

async fn case_taken(s: &TestServer, id: &str) -> String {
    let c = s
        .get(&format!(
            "/serviceRequest/{id}/children?pageNumber=0&pageSize=10"
        ))
        .await
        .json();
    assert_eq!(c["totalChildren"], 1, "{c}");
    c["children"][0]["branch"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_case_and_the_default_run_one_path_and_a_value_without_one_fails() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let created = s.create_workflow(&routed(&d, "route", true)).await;
    assert_eq!(created["steps"][1]["mode"], "SWITCH");
    assert_eq!(
        created["steps"][1]["val"]["cases"]["international"][1]["id"], 2,
        "a path's steps are numbered as a workflow's: {created}"
    );
    s.create_workflow(&routed(&d, "strict", false)).await;

    let dom = create_request(&s, "route", &json!({"kind": "domestic"})).await;
    let intl = create_request(&s, "route", &json!({"kind": "international"})).await;
    let slow = create_request(&s, "route", &json!({"kind": "slow"})).await;
    let other = create_request(&s, "route", &json!({"kind": "pigeon"})).await;
    // The next step receives the path's last answer.
    assert_eq!(
        after_got(&s, &dom).await,
        json!({"echo": {"echo": {"kind": "domestic"}}})
    );
    assert_eq!(
        after_got(&s, &intl).await,
        json!({"echo": {"accepted": true}})
    );
    assert_eq!(
        after_got(&s, &slow).await,
        json!({"echo": {"echo": {"kind": "slow"}}})
    );
    assert_eq!(after_got(&s, &other).await, json!({"traced": true}));
    assert_eq!(case_taken(&s, &dom).await, "domestic");
    assert_eq!(case_taken(&s, &intl).await, "international");
    assert_eq!(case_taken(&s, &other).await, "*");
    // Exactly one path ran for each: customs was called once (international's).
    assert_eq!(d.received("/api/accepted").len(), 1);
    assert_eq!(d.received("/traced").len(), 1);

    // A path that fails fails the request; a retry runs it again from its failed step.
    s.create_workflow(&json!({"name": "flaky", "steps": [
        http("ask", d.url("/api/echo")),
        {"name": "route", "mode": "SWITCH", "val": {"on": "ask.response.echo.kind",
            "cases": {"x": [http("first", d.url("/api/accepted")), http("shaky", d.url("/flaky/500"))]}}}]}))
        .await;
    let f = create_request(&s, "flaky", &json!({"kind": "x"})).await;
    let v = wait_status(&s, &f, &["COMPLETED", "FAILED"], Duration::from_secs(20)).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert!(v["reason"].as_str().unwrap().contains("case \"x\""), "{v}");
    let r = s.post(&format!("/serviceRequest/{f}/retry"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = wait_status(&s, &f, &["COMPLETED"], Duration::from_secs(20)).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(case_taken(&s, &f).await, "x", "the path ran again in place");
    assert_eq!(d.received("/flaky/500").len(), 2);
    assert_eq!(
        d.received("/api/accepted").len(),
        2,
        "a step of the path that completed ran again"
    );

    let lost = create_request(&s, "strict", &json!({"kind": "pigeon"})).await;
    let v = wait_status(&s, &lost, &["COMPLETED", "FAILED"], Duration::from_secs(20)).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    let why = v["reason"].as_str().unwrap();
    assert!(
        why.contains("\"pigeon\"") && why.contains("no case"),
        "{why}"
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_that_cannot_be_read_is_refused_at_definition() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    let step = json!({"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": "http://127.0.0.1:9/"}});
    for (val, needle) in [
        (
            json!({"on": "ghost.response.kind", "cases": {"x": [step.clone()]}}),
            "steps[1].val.on",
        ),
        (
            json!({"on": "a.response.kind ==", "cases": {"x": [step.clone()]}}),
            "steps[1].val.on",
        ),
        (
            json!({"on": "a.response.kind", "cases": {}}),
            "steps[1].val.cases is required",
        ),
        (
            json!({"on": "a.response.kind", "cases": {"x": [{"name": "b", "mode": "NOPE"}]}}),
            "steps[1].val.cases.x.steps[0].mode",
        ),
    ] {
        let why = s
            .post_json(
                "/workflow",
                &json!({"name": "bad", "steps": [step.clone(),
                {"name": "sw", "mode": "SWITCH", "val": val}]}),
            )
            .await
            .expect_error(400);
        assert!(why.contains(needle), "{why}");
    }
    // Not as an onFailure step: nothing would wait for its path.
    let why = s
        .post_json(
            "/workflow",
            &json!({"name": "bad", "steps": [{"name": "a", "mode": "HTTP",
            "val": {"method": "POST", "url": "http://127.0.0.1:9/"},
            "onFailure": [{"name": "sw", "mode": "SWITCH",
                           "val": {"on": "a.response.kind", "cases": {"x": [step.clone()]}}}]}]}),
        )
        .await
        .expect_error(400);
    assert!(why.contains("cannot be an onFailure step"), "{why}");
    s.shutdown().await;
}

/// A path cancelled on its own (its child request cancelled directly) fails the step,
/// naming it: the step does not complete with a null answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_cancelled_on_its_own_fails_the_step() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "held", "steps": [
        {"name": "route", "mode": "SWITCH", "val": {"on": "route.request.kind", "cases": {
            "x": [{"name": "nap", "mode": "WAIT", "val": {"duration": "PT30S"}}]}}},
        http("after", d.url("/api/echo"))]}))
        .await;
    let id = create_request(&s, "held", &json!({"kind": "x"})).await;
    let child = wait_for("the path's child", Duration::from_secs(20), || async {
        let c = s
            .get(&format!(
                "/serviceRequest/{id}/children?pageNumber=0&pageSize=10"
            ))
            .await
            .json();
        c["children"][0]["serviceRequestId"]
            .as_str()
            .map(str::to_string)
    })
    .await;
    let r = s.post(&format!("/serviceRequest/{child}/cancel"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], Duration::from_secs(20)).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert!(v["reason"].as_str().unwrap().contains("CANCELLED"), "{v}");
    assert!(d.received("/api/echo").is_empty(), "after never ran");
    s.shutdown().await;
}

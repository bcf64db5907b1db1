//! Fan-out and fan-in (PARALLEL and MAP steps, beyond Clamp): branches run side by side
//! and join by name, a MAP runs its steps once per item in item order at most
//! `maxConcurrency` at a time, a failed branch fails the step (onFailure runs) and a retry
//! runs only what did not complete, fan-outs nest, an ASYNC step in one branch is resumed
//! while the other completes, a cancel stops every branch, and a kill -9 in the middle of
//! a MAP loses nothing and calls no item step more than its attempts. Each item, and each
//! branch with a step that waits, is a child request of the step (the tests find them by
//! their parent in the database); branches that only call run as lanes of the request,
//! their steps' records in its own answer.

use std::time::Duration;

use serde_json::{json, Value};
use uuid::Uuid;

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(30);

fn http(name: &str, url: String) -> Value {
    json!({"name": name, "mode": "HTTP", "val": {"method": "POST", "url": url}})
}

/// An HTTP step whose request is `{"line": <the MAP's item>}`.
fn echo_item(name: &str, d: &Downstream) -> Value {
    let mut s = http(name, d.url("/api/echo"));
    s["transform"] = json!(true);
    s["requestTransform"] = json!({"spec": {"line": "item"}});
    s
}

fn parallel(name: &str, branches: Value) -> Value {
    json!({"name": name, "mode": "PARALLEL", "val": {"branches": branches}})
}

fn map(name: &str, items: &str, steps: Value, max: u32) -> Value {
    json!({"name": name, "mode": "MAP",
           "val": {"items": items, "steps": steps, "maxConcurrency": max}})
}

/// The children of request `id`'s fan-out step, in branch or item order.
async fn children(db: &TestDb, id: &str) -> Vec<(Uuid, String)> {
    let c = db.client().await;
    c.query(
        "SELECT id, status FROM service_requests WHERE parent_id = $1 ORDER BY fan_index",
        &[&Uuid::parse_str(id).unwrap()],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// A PARALLEL's branches made to run as child requests: a WAIT of no time at each
/// branch's end (it passes its request on, so each branch answers the same) needs a row
/// to sleep in, so the step's branches cannot run as lanes of the request.
fn in_children(mut branches: Value) -> Value {
    for b in branches.as_array_mut().unwrap() {
        b["steps"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "rest", "mode": "WAIT", "val": {"duration": "PT0S"}}));
    }
    branches
}

/// The `Idempotency-Key` of a step of a PARALLEL branch run as a lane of request `id`.
fn lane_key(id: &str, fan: u32, branch: &str, step: u32) -> String {
    format!("{id}:{fan}/{branch}/{step}")
}

/// The final entries of a status answer's lane steps: (branch, PARALLEL step id, step
/// id in the branch, name, status), sorted.
fn lane_entries(v: &Value) -> Vec<(String, i64, i64, String, String)> {
    let mut out: Vec<_> = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["branch"].is_string() && e["status"] != "STARTED")
        .map(|e| {
            (
                e["branch"].as_str().unwrap().to_string(),
                e["fanStepId"].as_i64().unwrap(),
                e["id"].as_i64().unwrap(),
                e["name"].as_str().unwrap().to_string(),
                e["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

fn lane_entry(
    branch: &str,
    fan: i64,
    id: i64,
    name: &str,
    status: &str,
) -> (String, i64, i64, String, String) {
    (branch.into(), fan, id, name.into(), status.into())
}

/// The same PARALLEL joins alike whether its branches run as lanes of the request (they
/// only call) or as child requests (one waits), and each branch step is called once,
/// under a key that names its branch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parallel_step_joins_its_branches_by_name() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let branches = json!([
        {"name": "acme", "steps": [http("a1", d.url("/api/echo")), http("a2", d.url("/api/echo"))]},
        {"name": "globex", "steps": [http("g1", d.url("/api/echo"))]}]);
    s.create_workflow(&json!({"name": "quotes", "steps": [
        parallel("ask", branches.clone()), http("after", d.url("/api/echo"))]}))
        .await;
    s.create_workflow(&json!({"name": "quotes2", "steps": [
        parallel("ask", in_children(branches)), http("after", d.url("/api/echo"))]}))
        .await;
    let joined = json!({
        "acme": {"echo": {"echo": {"n": 1}}},
        "globex": {"echo": {"n": 1}}});

    // Lanes: no child request; the request's own answer lists each branch step.
    let id = create_request(&s, "quotes", &json!({"n": 1})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(response_of(&v, "ask"), joined, "{v}");
    assert_eq!(response_of(&v, "after"), json!({"echo": joined}));
    assert!(children(&db, &id).await.is_empty());
    for (branch, steps) in [("acme", 2), ("globex", 1)] {
        for step in 1..=steps {
            assert_eq!(d.calls_for_key(&lane_key(&id, 1, branch, step)), 1);
        }
    }
    assert_eq!(d.calls_for_key(&format!("{id}:2")), 1);
    assert_eq!(
        lane_entries(&v),
        [
            lane_entry("acme", 1, 1, "a1", "COMPLETED"),
            lane_entry("acme", 1, 2, "a2", "COMPLETED"),
            lane_entry("globex", 1, 1, "g1", "COMPLETED"),
        ],
        "{v}"
    );
    // A branch's second step received its first step's answer.
    let a2 = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "a2" && e["status"] == "COMPLETED")
        .unwrap();
    assert_eq!(a2["payload"]["request"], json!({"echo": {"n": 1}}));
    // Read from Postgres (another instance's view), the answer is the same.
    let other = TestServer::start(config(&db.url)).await;
    let read = other.get(&format!("/serviceRequest/{id}")).await.json();
    assert_eq!(lane_entries(&read), lane_entries(&v), "{read}");
    other.shutdown().await;

    // Child requests: the same answer, each branch a request of its own.
    let id = create_request(&s, "quotes2", &json!({"n": 1})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(response_of(&v, "ask"), joined, "{v}");
    assert_eq!(response_of(&v, "after"), json!({"echo": joined}));
    let kids = children(&db, &id).await;
    assert_eq!(kids.len(), 2);
    // Each branch step called once, under its own branch's key.
    for (k, steps) in kids.iter().zip([2, 1]) {
        assert_eq!(k.1, "COMPLETED");
        for step in 1..=steps {
            assert_eq!(d.calls_for_key(&format!("{}:{step}", k.0)), 1);
        }
    }
    assert_eq!(d.calls_for_key(&format!("{id}:2")), 1);
    // A branch's request names its parent and its branch.
    let c = s
        .get(&format!("/serviceRequest/{}", kids[1].0))
        .await
        .json();
    assert_eq!(
        (c["parentId"].as_str(), c["branch"].as_str()),
        (Some(id.as_str()), Some("globex")),
        "{c}"
    );
    assert_eq!(c["workflow_name"], "quotes2/1/globex");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_map_answers_in_item_order_with_at_most_max_concurrency_at_once() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "lines", "steps": [
        http("order", d.url("/api/echo")),
        map("each", "order.response.echo.lines",
            json!([http("wait", d.url("/slow/40")), echo_item("ship", &d)]), 8)]}))
        .await;
    let lines: Vec<i64> = (0..50).collect();
    let id = create_request(&s, "lines", &json!({"lines": lines})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let want: Vec<Value> = lines.iter().map(|l| json!({"echo": {"line": l}})).collect();
    assert_eq!(response_of(&v, "each"), Value::Array(want));
    let peak = d.peak_in_flight();
    assert!((2..=8).contains(&peak), "peak in flight {peak}");
    // Every item ran once, each step once.
    let kids = children(&db, &id).await;
    assert_eq!(kids.len(), 50);
    let c = s
        .get(&format!("/serviceRequest/{}", kids[7].0))
        .await
        .json();
    assert_eq!(c["index"], 7, "{c}");
    for (k, _) in &kids {
        assert_eq!(d.calls_for_key(&format!("{k}:1")), 1);
        assert_eq!(d.calls_for_key(&format!("{k}:2")), 1);
    }
    // An empty list is an empty answer at once; a missing one fails the step.
    let id = create_request(&s, "lines", &json!({"lines": []})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(response_of(&v, "each"), json!([]), "{v}");
    let id = create_request(&s, "lines", &json!({"rows": [1]})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert!(v["reason"].as_str().unwrap().contains("not a list"), "{v}");
    s.shutdown().await;
}

/// Many fan-outs at once: their children finish together, so one count statement takes
/// children of several joins (and releases held items of each); every request still
/// gets each item once, in item order, and no item step is called twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_fan_outs_at_once_are_each_joined_exactly() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "batch", "steps": [
        map("each", "each.request.lines", json!([echo_item("ship", &d)]), 3),
        parallel("pair", json!([
            {"name": "a", "steps": [http("a1", d.url("/api/echo"))]},
            {"name": "b", "steps": [http("b1", d.url("/api/echo"))]}]))]}))
        .await;
    let lines: Vec<i64> = (0..12).collect();
    let creates = (0..30).map(|n| {
        let s = &s;
        let mut lines = lines.clone();
        lines[0] = n;
        async move {
            (
                create_request(s, "batch", &json!({"lines": lines})).await,
                n,
            )
        }
    });
    let ids = futures_util::future::join_all(creates).await;
    for (id, n) in &ids {
        let v = wait_status(&s, id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
        let mut want: Vec<Value> = lines.iter().map(|l| json!({"echo": {"line": l}})).collect();
        want[0] = json!({"echo": {"line": n}});
        assert_eq!(response_of(&v, "each"), Value::Array(want), "{v}");
        // The items are child requests; the branches, which only call, lanes.
        let kids = children(&db, id).await;
        assert_eq!(kids.len(), 12, "12 items of {id}");
        for (k, status) in &kids {
            assert_eq!(status, "COMPLETED");
            assert_eq!(d.calls_for_key(&format!("{k}:1")), 1, "child {k}");
        }
        for branch in ["a", "b"] {
            assert_eq!(d.calls_for_key(&lane_key(id, 2, branch, 1)), 1, "{id}");
        }
    }
    let c = db.client().await;
    let open: i64 = c
        .query_one(
            "SELECT count(*) FROM fan_joins WHERE NOT done OR finished <> total",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(open, 0, "every join counted to its total and done");
    s.shutdown().await;
}

/// A failed branch fails the step (its onFailure steps run once), whether the branches
/// run as lanes or as child requests; a retry of the request then calls only the failed
/// branch again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_branch_fails_the_step_and_a_retry_runs_only_it_again() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let branches = json!([
        {"name": "fine", "steps": [http("f1", d.url("/api/echo"))]},
        // A slow first step: the fine branch has finished when this one fails (a failure
        // cancels the siblings still running).
        {"name": "broken", "steps": [http("pause", d.url("/slow/300")), http("b1", d.url("/until-fixed"))]}]);
    for (name, rows) in [("half", false), ("half2", true)] {
        let branches = if rows {
            in_children(branches.clone())
        } else {
            branches.clone()
        };
        let mut step = parallel("both", branches);
        step["onFailure"] = json!([http("tidy", d.url("/api/echo"))]);
        s.create_workflow(&json!({"name": name, "steps": [step]}))
            .await;
        let id = create_request(&s, name, &json!({"x": 1})).await;
        let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(v["status"], "FAILED", "{v}");
        assert!(
            v["reason"].as_str().unwrap().contains("branch broken")
                || v["reason"].as_str().unwrap().contains("branch 'broken'"),
            "{v}"
        );
        assert_eq!(d.calls_for_key(&format!("{id}:2")), 1, "onFailure ran once");
        // The keys of each branch's step.
        let (fine, broken) = if rows {
            let kids = children(&db, &id).await;
            assert_eq!(
                (kids[0].1.as_str(), kids[1].1.as_str()),
                ("COMPLETED", "FAILED")
            );
            (format!("{}:1", kids[0].0), format!("{}:2", kids[1].0))
        } else {
            assert!(children(&db, &id).await.is_empty());
            assert_eq!(
                lane_entries(&v),
                [
                    lane_entry("broken", 1, 1, "pause", "COMPLETED"),
                    lane_entry("broken", 1, 2, "b1", "FAILED"),
                    lane_entry("fine", 1, 1, "f1", "COMPLETED"),
                ],
                "{v}"
            );
            (lane_key(&id, 1, "fine", 1), lane_key(&id, 1, "broken", 2))
        };
        // A 500 is called once.
        assert_eq!(d.calls_for_key(&broken), 1);

        d.fix();
        let r = s.post(&format!("/serviceRequest/{id}/retry"), "").await;
        assert_eq!(r.status, 200, "{}", r.text());
        let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
        assert_eq!(
            response_of(&v, "both"),
            json!({"fine": {"echo": {"x": 1}}, "broken": {"echo": {"slow": true}}})
        );
        // Only the failed branch was called again.
        assert_eq!(d.calls_for_key(&fine), 1);
        assert_eq!(d.calls_for_key(&broken), 2);
        assert_eq!(
            children(&db, &id).await.len(),
            if rows { 2 } else { 0 },
            "no new children"
        );
        d.break_again();
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_map_nests_in_a_parallel_branch_and_sees_the_outer_context() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "nested", "steps": [
        http("order", d.url("/api/echo")),
        parallel("both", json!([
            {"name": "ship", "steps": [
                map("each", "order.response.echo.lines", json!([echo_item("one", &d)]), 2)]},
            {"name": "bill", "steps": [http("b1", d.url("/api/echo"))]}]))]}))
        .await;
    let id = create_request(&s, "nested", &json!({"lines": [1, 2, 3]})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let order = json!({"echo": {"lines": [1, 2, 3]}});
    assert_eq!(
        response_of(&v, "both"),
        json!({
            "ship": [{"echo": {"line": 1}}, {"echo": {"line": 2}}, {"echo": {"line": 3}}],
            "bill": {"echo": order}})
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_step_in_one_branch_is_resumed_while_the_other_completes() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let mut ask = http("ask", d.url("/api/accepted"));
    ask["type"] = json!("ASYNC");
    s.create_workflow(&json!({"name": "approve", "steps": [
        parallel("both", json!([
            {"name": "wait", "steps": [ask]},
            {"name": "go", "steps": [http("g1", d.url("/api/echo"))]}]))]}))
        .await;
    let id = create_request(&s, "approve", &json!({"k": 1})).await;
    wait_status(&s, &id, &["PAUSED"], WAIT).await;
    let kids = children(&db, &id).await;
    let (waiting, going) = (kids[0].0.to_string(), kids[1].0.to_string());
    wait_status(&s, &going, &["COMPLETED"], WAIT).await;
    wait_status(&s, &waiting, &["PAUSED"], WAIT).await;
    // Still waiting for the paused branch.
    assert_eq!(
        s.get(&format!("/serviceRequest/{id}")).await.json()["status"],
        "PAUSED"
    );
    let r = s
        .post_json(
            "/stepResponse",
            &json!({"serviceRequestId": waiting, "stepId": 1, "response": {"approved": true}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(
        response_of(&v, "both"),
        json!({"wait": {"approved": true}, "go": {"echo": {"k": 1}}})
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_in_the_middle_of_a_map_stops_every_item() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let items: Vec<i64> = (0..20).collect();
    s.create_workflow(&json!({"name": "held", "steps": [
        http("list", d.url("/api/echo")),
        map("each", "list.response.echo.items", json!([http("h", d.url("/held"))]), 2)]}))
        .await;
    let id = create_request(&s, "held", &json!({"items": items})).await;
    wait_for_seen("two items to call", WAIT, || async {
        let n = d.received("/held").len();
        (n >= 2).then_some(()).ok_or(n)
    })
    .await;
    // Items are running: the request, stored PAUSED at its MAP step, reads IN_PROGRESS.
    let v = s.get(&format!("/serviceRequest/{id}")).await.json();
    assert_eq!(v["status"], "IN_PROGRESS", "{v}");
    let r = s.post(&format!("/serviceRequest/{id}/cancel"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = wait_status(&s, &id, &["CANCELLED"], WAIT).await;
    assert_eq!(v["status"], "CANCELLED");
    let kids = children(&db, &id).await;
    assert_eq!(kids.len(), 20);
    assert!(
        kids.iter().all(|(_, st)| st == "CANCELLED"),
        "every item cancelled: {kids:?}"
    );
    d.release();
    // The two in flight answer; nothing starts after the cancel (a presence first: the
    // calls in flight did end, so a third would have been seen by now).
    wait_for_seen("the held calls to end", WAIT, || async {
        let f = d.in_flight();
        (f == 0).then_some(()).ok_or(f)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await; // time is what is tested
    assert_eq!(d.received("/held").len(), 2);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_during_a_map_loses_nothing_and_repeats_no_item_beyond_its_attempts() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let port = free_port();
    let mut server = spawn_binary(&db.url, port);
    wait_healthy(port).await;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let r = send(
        addr,
        hyper::Method::POST,
        "/workflow",
        Some(
            json!({"name": "batch", "steps": [
                http("order", d.url("/api/echo")),
                map("each", "order.response.echo.lines",
                    json!([http("wait", d.url("/slow/200")), echo_item("ship", &d)]), 8)]})
            .to_string()
            .into_bytes(),
        ),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let lines: Vec<i64> = (0..50).collect();
    let r = send(
        addr,
        hyper::Method::POST,
        "/serviceRequest/batch",
        Some(json!({"lines": lines}).to_string().into_bytes()),
        &[],
    )
    .await;
    let id = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    wait_for_seen("a dozen items to start", WAIT, || async {
        let n = d.received("/slow/200").len();
        (n >= 12).then_some(()).ok_or(n)
    })
    .await;
    server.kill().unwrap();
    server.wait().unwrap();
    let port2 = free_port();
    let _again = spawn_binary(&db.url, port2);
    wait_healthy(port2).await;
    let addr2: std::net::SocketAddr = format!("127.0.0.1:{port2}").parse().unwrap();
    let v = wait_status_at(
        addr2,
        &id,
        &["COMPLETED", "FAILED"],
        Duration::from_secs(60),
        &[],
    )
    .await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let want: Vec<Value> = lines.iter().map(|l| json!({"echo": {"line": l}})).collect();
    assert_eq!(response_of(&v, "each"), Value::Array(want));
    let kids = children(&db, &id).await;
    assert_eq!(kids.len(), 50, "one child per item");
    // Only a step running at the kill may have run twice; the rest once.
    let mut twice = 0;
    for (k, _) in &kids {
        let (a, b) = (
            d.calls_for_key(&format!("{k}:1")),
            d.calls_for_key(&format!("{k}:2")),
        );
        assert!((1..=2).contains(&a) && (1..=2).contains(&b), "{k}: {a} {b}");
        twice += (a == 2) as usize + (b == 2) as usize;
    }
    assert!(
        twice <= 8,
        "{twice} steps repeated; at most the 8 in flight"
    );
    assert_eq!(d.calls_for_key(&format!("{id}:1")), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_a_fan_out() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let a = TestServer::start(config(&db.url)).await;
    let b = TestServer::start(config(&db.url)).await;
    a.create_workflow(&json!({"name": "shared", "steps": [
        http("order", d.url("/api/echo")),
        map("each", "order.response.echo.lines",
            json!([http("wait", d.url("/slow/50")), echo_item("ship", &d)]), 16)]}))
        .await;
    let lines: Vec<i64> = (0..40).collect();
    let id = create_request(&a, "shared", &json!({"lines": lines})).await;
    let v = wait_status(&b, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let want: Vec<Value> = lines.iter().map(|l| json!({"echo": {"line": l}})).collect();
    assert_eq!(response_of(&v, "each"), Value::Array(want));
    for (k, _) in children(&db, &id).await {
        assert_eq!(d.calls_for_key(&format!("{k}:2")), 1);
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn fan_out_definitions_are_checked() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    let step = |v: Value| json!({"name": "w", "steps": [v]});
    let url = "http://127.0.0.1:1/x".to_string();
    for (bad, why) in [
        (parallel("p", json!([])), "branches is required"),
        (
            parallel(
                "p",
                json!([{"name": "a/b", "steps": [http("x", url.clone())]}]),
            ),
            "without '/'",
        ),
        (
            map("m", "", json!([http("x", url.clone())]), 4),
            "items is required",
        ),
        (
            map("m", "a", json!([http("x", url.clone())]), 0),
            "maxConcurrency",
        ),
        (
            parallel(
                "p",
                json!([{"name": "a", "steps": [
                {"name": "x", "mode": "HTTP", "val": {"url": "ftp://x"}}]}]),
            ),
            "steps[0].val.branches[0].steps[0]",
        ),
    ] {
        let r = s.post_json("/workflow", &step(bad.clone())).await;
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert!(r.text().contains(why), "{bad}: {}", r.text());
    }
    // Too deep: a MAP in a MAP in a MAP in a MAP.
    let mut deep = json!([http("x", url.clone())]);
    for _ in 0..4 {
        deep = json!([map("m", "item", deep, 2)]);
    }
    let r = s
        .post_json("/workflow", &json!({"name": "deep", "steps": deep}))
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("nest at most"), "{}", r.text());
    // Stored and served with the ids and types assigned inside.
    let r = s
        .post_json(
            "/workflow",
            &step(parallel(
                "p",
                json!([{"name": "a", "steps": [http("x", url.clone())]}]),
            )),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let w = s.get("/workflow/w").await.json();
    assert_eq!(
        w["steps"][0]["val"]["branches"][0]["steps"][0]["id"], 1,
        "{w}"
    );
    assert_eq!(w["steps"][0]["type"], "ASYNC");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_children_of_a_request_are_listed_with_their_branch_or_index() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "listed", "steps": [
        http("order", d.url("/api/echo")),
        parallel("both", in_children(json!([
            {"name": "x", "steps": [http("x1", d.url("/api/echo"))]},
            {"name": "y", "steps": [http("y1", d.url("/api/echo"))]}]))),
        map("each", "order.response.echo.lines", json!([echo_item("one", &d)]), 4)]}))
        .await;
    let id = create_request(&s, "listed", &json!({"lines": [10, 20, 30]})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let page = s
        .get(&format!(
            "/serviceRequest/{id}/children?pageNumber=0&pageSize=3"
        ))
        .await
        .json();
    assert_eq!(page["totalChildren"], 5, "{page}");
    let list = page["children"].as_array().unwrap();
    assert_eq!(list.len(), 3);
    assert_eq!(
        (list[0]["stepId"].as_i64(), list[0]["branch"].as_str()),
        (Some(2), Some("x"))
    );
    assert_eq!(
        (list[1]["stepId"].as_i64(), list[1]["branch"].as_str()),
        (Some(2), Some("y"))
    );
    assert_eq!(
        (list[2]["stepId"].as_i64(), list[2]["index"].as_i64()),
        (Some(3), Some(0))
    );
    assert!(list.iter().all(|c| c["status"] == "COMPLETED"), "{page}");
    let rest = s
        .get(&format!(
            "/serviceRequest/{id}/children?pageNumber=1&pageSize=3"
        ))
        .await
        .json();
    let idx: Vec<i64> = rest["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["index"].as_i64().unwrap())
        .collect();
    assert_eq!(idx, [1, 2]);
    // The console's page lists them too.
    let html = s.get(&format!("/console/serviceRequests/{id}")).await;
    let text = html.text();
    assert!(
        text.contains("branch x") && text.contains("index 2"),
        "{text}"
    );
    // Its timeline draws a lane per branch and item after the fan-out step's bars: the
    // step's records, then `↳ branch x`, `↳ branch y`, then the MAP's and its items.
    let svg = &text[text.find("<svg").unwrap()..text.find("</svg>").unwrap()];
    let at = |label: &str| {
        svg.find(&format!(">{label}<"))
            .unwrap_or_else(|| panic!("no lane {label} in {svg}"))
    };
    assert!(at("2 · both") < at("↳ branch x"), "{svg}");
    assert!(at("↳ branch x") < at("↳ branch y"), "{svg}");
    assert!(at("↳ branch y") < at("3 · each"), "{svg}");
    assert!(
        at("3 · each") < at("↳ index 0") && at("↳ index 0") < at("↳ index 2"),
        "{svg}"
    );
    // A request without children: an empty page; an unknown one: 404.
    let none = s
        .get(&format!(
            "/serviceRequest/{}/children?pageNumber=0&pageSize=10",
            list[0]["serviceRequestId"].as_str().unwrap()
        ))
        .await
        .json();
    assert_eq!(none["totalChildren"], 0, "{none}");
    let r = s
        .get(&format!(
            "/serviceRequest/{}/children?pageNumber=0&pageSize=10",
            uuid::Uuid::new_v4()
        ))
        .await;
    assert_eq!(r.status, 404, "{}", r.text());
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerun_after_a_fan_out_keeps_its_answer_and_one_from_it_fans_out_again() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "again", "steps": [
        parallel("both", json!([
            {"name": "x", "steps": [http("x1", d.url("/api/echo"))]},
            {"name": "y", "steps": [http("y1", d.url("/api/echo"))]}])),
        http("after", d.url("/api/echo"))]}))
        .await;
    let id = create_request(&s, "again", &json!({"r": 1})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let joined = response_of(&v, "both");
    // From the step after the fan-out: its answer is copied, no branch runs again.
    let r = s
        .post_json(
            &format!("/serviceRequest/{id}/rerun"),
            &json!({"fromStep": 2}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let after = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    let v = wait_status(&s, &after, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(response_of(&v, "after"), json!({"echo": joined}));
    assert!(children(&db, &after).await.is_empty());
    for b in ["x", "y"] {
        assert_eq!(d.calls_for_key(&lane_key(&after, 1, b, 1)), 0);
    }
    // Its lanes' records are not copied: the fan-out step's own holds their answer.
    assert!(lane_entries(&v).is_empty(), "{v}");
    // From the fan-out step: it fans out again, each branch called once more.
    let r = s
        .post_json(
            &format!("/serviceRequest/{id}/rerun"),
            &json!({"fromStep": 1}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let from = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    let v = wait_status(&s, &from, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(response_of(&v, "both"), joined);
    assert!(children(&db, &from).await.is_empty());
    for b in ["x", "y"] {
        assert_eq!(d.calls_for_key(&lane_key(&from, 1, b, 1)), 1);
        assert_eq!(d.calls_for_key(&lane_key(&id, 1, b, 1)), 1);
    }
    assert_eq!(lane_entries(&v).len(), 2, "{v}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn branch_steps_use_when_transforms_and_child_workflows_over_the_outer_context() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "leaf", "steps": [http("l1", d.url("/api/echo"))]}))
        .await;
    let mut skipped = http("skipped", d.url("/api/echo"));
    // The outer step's answer decides, inside the branch.
    skipped["when"] = json!("order.response.echo.kind == 'none'");
    let mut picked = http("picked", d.url("/api/echo"));
    picked["transform"] = json!(true);
    picked["requestTransform"] = json!({"spec": {"kind": "order.response.echo.kind"}});
    s.create_workflow(&json!({"name": "mixed", "steps": [
        http("order", d.url("/api/echo")),
        parallel("both", json!([
            {"name": "cond", "steps": [skipped, picked]},
            {"name": "sub", "steps": [
                {"name": "call", "mode": "WORKFLOW", "val": {"workflow": "leaf"}}]}]))]}))
        .await;
    let id = create_request(&s, "mixed", &json!({"kind": "box"})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let order = json!({"echo": {"kind": "box"}});
    assert_eq!(
        response_of(&v, "both"),
        json!({"cond": {"echo": {"kind": "box"}}, "sub": {"echo": order}})
    );
    let kids = children(&db, &id).await;
    // The skipped step made no call; the branch's child workflow is a request of its own.
    assert_eq!(d.calls_for_key(&format!("{}:1", kids[0].0)), 0);
    assert_eq!(d.calls_for_key(&format!("{}:2", kids[0].0)), 1);
    let page = s
        .get(&format!(
            "/serviceRequest/{}/children?pageNumber=0&pageSize=10",
            kids[1].0
        ))
        .await
        .json();
    assert_eq!(page["totalChildren"], 1, "{page}");
    assert_eq!(page["children"][0]["workflow_name"], "leaf");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_step_is_retried_by_its_own_policy() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let mut flaky = http("flaky", d.url("/flaky/503"));
    flaky["retry"] = json!({"maxAttempts": 3, "initialIntervalMs": 20});
    s.create_workflow(&json!({"name": "retried", "steps": [
        parallel("both", json!([
            {"name": "shaky", "steps": [flaky]},
            {"name": "calm", "steps": [http("c1", d.url("/api/echo"))]}]))]}))
        .await;
    let id = create_request(&s, "retried", &json!({"t": 1})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(
        response_of(&v, "both"),
        json!({"shaky": {"recovered": true}, "calm": {"echo": {"t": 1}}})
    );
    // The first attempt answered 503 and the policy tried again: two calls, one key.
    assert_eq!(d.calls_for_key(&lane_key(&id, 1, "shaky", 1)), 2);
    assert_eq!(d.calls_for_key(&lane_key(&id, 1, "calm", 1)), 1);
    let shaky: Vec<&Value> = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["branch"] == "shaky" && e["status"] != "STARTED")
        .collect();
    assert_eq!(shaky.len(), 1, "one final record: {v}");
    assert_eq!(shaky[0]["attempts"], 2, "{v}");
    s.shutdown().await;
}

/// A branch step's own onFailure steps run inside its branch; the branch's failure then
/// fails the fan-out step, whose onFailure steps run in the request (the step after it
/// does not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_failure_runs_in_the_branch_and_then_for_the_fan_out_step() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let mut bad = http("bad", d.url("/status/500"));
    bad["onFailure"] = json!([http("branch-cleanup", d.url("/api/echo"))]);
    let mut fan = parallel(
        "both",
        json!([
        {"name": "fine", "steps": [http("ok", d.url("/api/echo"))]},
        {"name": "fails", "steps": [bad]}]),
    );
    fan["onFailure"] = json!([http("step-cleanup", d.url("/api/echo"))]);
    s.create_workflow(
        &json!({"name": "onfail", "steps": [fan, http("after", d.url("/api/step1"))]}),
    )
    .await;
    let id = create_request(&s, "onfail", &json!({"n": 1})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert!(
        v["reason"].as_str().unwrap().contains("branch fails"),
        "{v}"
    );
    let names = |v: &Value| -> Vec<String> {
        v["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(names(&v).contains(&"step-cleanup".to_string()), "{v}");
    assert!(!names(&v).contains(&"after".to_string()), "{v}");
    let kids = children(&db, &id).await;
    let branch = s
        .get(&format!("/serviceRequest/{}", kids[1].0))
        .await
        .json();
    assert_eq!(branch["status"], "FAILED", "{branch}");
    assert!(
        names(&branch).contains(&"branch-cleanup".to_string()),
        "{branch}"
    );
    assert_eq!(
        d.received("/status/500").len(),
        1,
        "a step answered 500 is called once"
    );
    assert_eq!(d.received("/api/step1").len(), 0);
    s.shutdown().await;
}

/// A new version of the workflow stored while a request's branches run changes nothing
/// for them or for the rest of that request (it runs the version it was created with to
/// its end); requests created after it run the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_version_stored_during_a_fan_out_applies_to_later_requests() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let define = |after: &str| {
        json!({"name": "versioned", "steps": [
            parallel("both", json!([
                {"name": "slow", "steps": [http("wait", d.url("/held"))]},
                {"name": "quick", "steps": [http("ok", d.url("/api/echo"))]}])),
            http("after", d.url(after))]})
    };
    s.create_workflow(&define("/api/echo")).await;
    let id = create_request(&s, "versioned", &json!({"n": 1})).await;
    d.wait_for("/held").await;
    let r = send(
        s.addr,
        hyper::Method::PUT,
        "/workflow/versioned",
        Some(define("/api/step1").to_string().into_bytes()),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    d.release();
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(v["workflow_version"], 1, "{v}");
    assert_eq!(d.received("/api/step1").len(), 0, "version 2 did not run");
    let later = create_request(&s, "versioned", &json!({"n": 2})).await;
    let v = wait_status(&s, &later, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(v["workflow_version"], 2, "{v}");
    assert_eq!(d.received("/api/step1").len(), 1);
    s.shutdown().await;
}

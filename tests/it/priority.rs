//! Priorities (beyond Clamp): `POST /serviceRequest/{workflow}?priority=N` (1 to 9, 5 when
//! not given). Among requests waiting to run, a higher priority is claimed first, creation
//! order within one; a key's queue under a concurrency limit is in the same order; the
//! priority is kept by the request's children and reruns.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(60);

fn http(name: &str, url: String) -> Value {
    json!({"name": name, "mode": "HTTP", "val": {"method": "POST", "url": url}})
}

/// Creates a request of `workflow` with `query` (e.g. `?priority=9`); its id.
async fn create_with(s: &TestServer, workflow: &str, query: &str, payload: &Value) -> String {
    create_request(s, &format!("{workflow}{query}"), payload).await
}

/// The `n` of each call the peer received at `path`, in the order they arrived.
fn arrivals(d: &Downstream, path: &str) -> Vec<i64> {
    d.received(path)
        .iter()
        .map(|r| r.body["n"].as_i64().unwrap())
        .collect()
}

/// One runtime of one slot (a sweep every 50 ms), held by a request of `gate` at a step
/// that waits for the peer's release; `work` calls the peer's `/slow/5`. The database
/// (kept for the server's life), the server and the holding request's id.
async fn one_held_slot(d: &Downstream) -> (TestDb, TestServer, String) {
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.threads = 1;
    cfg.max_running = 1;
    cfg.sweep_interval = Duration::from_millis(50);
    let s = TestServer::start(cfg).await;
    s.create_workflow(&json!({"name": "gate", "steps": [http("hold", d.url("/held"))]}))
        .await;
    s.create_workflow(&json!({"name": "work", "steps": [http("call", d.url("/slow/5"))]}))
        .await;
    let gate = create_request(&s, "gate", &json!({})).await;
    d.wait_for("/held").await;
    (db, s, gate)
}

/// One slot, held by a request at a step that waits for the peer's release: requests
/// created meanwhile wait in Postgres and, once it is released, run one at a time in
/// the claim order: priority 9, then 5 (given or not), then 1, each in creation order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn higher_priorities_are_claimed_first_then_creation_order() {
    let d = Downstream::start().await;
    let (_db, s, gate) = one_held_slot(&d).await;
    let mut ids = Vec::new();
    for n in 0..30 {
        let query = match n % 4 {
            0 => "?priority=1",
            1 => "?priority=9",
            2 => "?priority=5",
            _ => "",
        };
        ids.push(create_with(&s, "work", query, &json!({"n": n})).await);
    }
    // Waiting, each shows the priority it was given (the default is not shown).
    let v = s.get(&format!("/serviceRequest/{}", ids[1])).await.json();
    assert_eq!(
        (v["status"].as_str(), &v["priority"]),
        (Some("NEW"), &json!(9))
    );
    for i in [2, 3] {
        let v = s.get(&format!("/serviceRequest/{}", ids[i])).await.json();
        assert!(v.get("priority").is_none(), "{v}");
    }
    let page = s
        .get(&format!("/console/serviceRequests/{}", ids[1]))
        .await
        .text();
    assert!(page.contains("<dt>Priority</dt><dd>9 "), "{page}");
    d.release();
    wait_status(&s, &gate, &["COMPLETED"], WAIT).await;
    for id in &ids {
        let v = wait_status(&s, id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
    }
    let band =
        |p: i64| (0..30).filter(move |n| (n % 4 == 1) == (p == 9) && (n % 4 == 0) == (p == 1));
    let want: Vec<i64> = band(9).chain(band(5)).chain(band(1)).collect();
    assert_eq!(arrivals(&d, "/slow/5"), want);
    // Finished, the answer still shows it.
    let v = s.get(&format!("/serviceRequest/{}", ids[0])).await.json();
    assert_eq!(v["priority"], 1, "{v}");
    s.shutdown().await;
}

/// A backlog of 2,000 low-priority requests on two slots: an urgent request created
/// behind it starts within a sweep and the calls that hold the slots (here under a
/// second), while most of the backlog is still waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_priority_backlog_does_not_delay_an_urgent_request() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let mut cfg = config(&db.url);
    cfg.threads = 1;
    cfg.max_running = 2;
    let s = TestServer::start(cfg).await;
    s.create_workflow(&json!({"name": "work", "steps": [http("call", d.url("/slow/50"))]}))
        .await;
    for burst in 0..20 {
        let creates =
            (0..100).map(|i| {
                let s = &s;
                async move {
                    create_with(s, "work", "?priority=1", &json!({"n": burst * 100 + i})).await
                }
            });
        futures_util::future::join_all(creates).await;
    }
    let before = d.received("/slow/50").len();
    let t0 = Instant::now();
    let urgent = create_with(&s, "work", "?priority=9", &json!({"n": -1})).await;
    wait_for(
        "the urgent request's call",
        Duration::from_secs(5),
        || async { arrivals(&d, "/slow/50").contains(&-1).then_some(()) },
    )
    .await;
    let waited = t0.elapsed();
    let order = arrivals(&d, "/slow/50");
    let at = order.iter().position(|n| *n == -1).unwrap();
    assert!(
        waited < Duration::from_secs(1),
        "the urgent request waited {waited:?} behind the backlog"
    );
    assert!(
        at < 1_000,
        "the urgent request was call {at} of the backlog's 2,000 (before it: {before})"
    );
    let v = wait_status(&s, &urgent, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    s.shutdown().await;
}

/// A backlog waiting in Postgres is claimed as slots free, not once per sweep: two slots,
/// a sweep every 30 s, 40 requests of a 50 ms step created at once: all complete within
/// 15 s (their calls take about 1 s; claimed two per sweep, they would take 10 minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_is_claimed_as_slots_free_not_once_per_sweep() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let mut cfg = config(&db.url);
    cfg.threads = 1;
    cfg.max_running = 2;
    cfg.sweep_interval = Duration::from_secs(30);
    let s = TestServer::start(cfg).await;
    s.create_workflow(&json!({"name": "work", "steps": [http("call", d.url("/slow/50"))]}))
        .await;
    let creates = (0..40).map(|i| {
        let s = &s;
        async move { create_with(s, "work", "", &json!({"n": i})).await }
    });
    let ids = futures_util::future::join_all(creates).await;
    let t0 = Instant::now();
    for id in &ids {
        let left = Duration::from_secs(15).saturating_sub(t0.elapsed());
        let v = wait_status(&s, id, &["COMPLETED", "FAILED"], left).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
    }
    assert!(d.peak_in_flight() <= 2, "{}", d.peak_in_flight());
    s.shutdown().await;
}

/// Under a concurrency limit, a key's queue is in the same order: a waiting request of
/// a higher priority is admitted first, and `waitingForSlot.ahead` counts in that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_queue_is_in_priority_order() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "one", "concurrency": {"limit": 1},
        "steps": [http("hold", d.url("/held")), http("after", d.url("/api/echo"))]}))
        .await;
    let first = create_request(&s, "one", &json!({"n": 0})).await;
    d.wait_for("/held").await;
    let low = create_with(&s, "one", "?priority=2", &json!({"n": 1})).await;
    let plain = create_with(&s, "one", "", &json!({"n": 2})).await;
    let high = create_with(&s, "one", "?priority=8", &json!({"n": 3})).await;
    let ahead = |v: Value| v["waitingForSlot"]["ahead"].as_i64();
    for (id, n) in [(&high, 0), (&plain, 1), (&low, 2)] {
        let v = s.get(&format!("/serviceRequest/{id}")).await.json();
        assert_eq!(ahead(v.clone()), Some(n), "{v}");
    }
    d.release();
    for id in [&first, &low, &plain, &high] {
        let v = wait_status(&s, id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
    }
    assert_eq!(arrivals(&d, "/held"), vec![0, 3, 2, 1]);
    s.shutdown().await;
}

/// A request's children (a WORKFLOW step's, a fan-out's) and its reruns run at its
/// priority; a delayed create keeps its priority; a priority outside 1 to 9 is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_and_reruns_keep_the_priority_and_bad_ones_are_refused() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "inner", "steps": [http("i", d.url("/api/echo"))]}))
        .await;
    s.create_workflow(&json!({"name": "outer", "steps": [
        {"name": "each", "mode": "MAP", "val": {"items": "each.request.items", "maxConcurrency": 3,
            "steps": [http("m", d.url("/api/echo"))]}},
        {"name": "sub", "mode": "WORKFLOW", "val": {"workflow": "inner"}}]}))
        .await;
    let id = create_with(&s, "outer", "?priority=7", &json!({"items": [1, 2, 3]})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(
        (v["status"].as_str(), &v["priority"]),
        (Some("COMPLETED"), &json!(7)),
        "{v}"
    );
    let c = db
        .count(&format!(
            "SELECT count(*) FROM service_requests WHERE parent_id = '{id}' AND priority = 7"
        ))
        .await;
    assert_eq!(c, 4, "the WORKFLOW step's child and the MAP's three items");
    let r = s.post(&format!("/serviceRequest/{id}/rerun"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let run = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    let v = wait_status(&s, &run, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["priority"], 7, "{v}");
    let later = create_with(&s, "inner", "?priority=3&delayMs=100", &json!({})).await;
    let v = wait_status(&s, &later, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(
        (v["status"].as_str(), &v["priority"]),
        (Some("COMPLETED"), &json!(3)),
        "{v}"
    );
    for bad in ["0", "10", "-1", "high", "5.5", ""] {
        let r = s
            .post_json(&format!("/serviceRequest/inner?priority={bad}"), &json!({}))
            .await;
        assert_eq!(r.status, 400, "priority={bad}: {}", r.text());
        assert!(r.text().contains("priority"), "{}", r.text());
    }
    s.shutdown().await;
}

/// The claim reads the claim-order index in order (one range of it), whatever the mix of
/// priorities: the statement spells the index's expression exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_is_one_range_of_the_claim_order_index() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    let claim = clamp::store::statements::all()
        .into_iter()
        .find(|(name, _)| *name == "leases::CLAIM")
        .expect("the claim is listed")
        .1
        .replace("$1", "'00000000-0000-0000-0000-000000000001'::uuid")
        .replace("$2", "10000")
        .replace("$3", "64");
    let c = db.client().await;
    c.batch_execute("SET enable_seqscan = off").await.unwrap();
    let plan: Vec<String> = c
        .query(&format!("EXPLAIN {claim}"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let plan = plan.join("\n");
    // Each partition's range of it, merged in order (a Merge Append on its sort key),
    // never a sort of the rows read.
    let sorts = plan.lines().any(|l| {
        let node = l.trim_start().trim_start_matches("->").trim_start();
        node.starts_with("Sort  (") || node.starts_with("Incremental Sort  (")
    });
    // The partitions' indexes of the claim order, by whatever names they were given.
    let parts = partitions_of(&c, "service_requests_claim_order").await;
    assert!(!parts.is_empty());
    assert!(
        parts
            .iter()
            .any(|p| plan.contains(&format!("Index Scan using {p} ")))
            && plan.contains("Index Cond")
            && !sorts,
        "{parts:?}\n{plan}"
    );
    s.shutdown().await;
}

/// Priorities order due rows too: one slot, held while six delayed requests fall due
/// (the lower priorities first) and a fresh priority-5 one is created; once the slot
/// frees they run priority 9, then 5, then 1, each in the order it fell due, and the
/// fresh one after every due one (the first half of every claim goes to due rows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_rows_are_claimed_by_priority_then_due_time() {
    let d = Downstream::start().await;
    let (_db, s, gate) = one_held_slot(&d).await;
    let mut ids = Vec::new();
    for (n, p) in [1, 5, 9, 1, 5, 9].into_iter().enumerate() {
        let query = format!("?priority={p}&delayMs={}", 100 * (n + 1));
        ids.push(create_with(&s, "work", &query, &json!({"n": n})).await);
    }
    ids.push(create_with(&s, "work", "?priority=5", &json!({"n": 6})).await);
    // All six are due (the last 600 ms after its create) before the slot frees.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(d.received("/slow/5").is_empty(), "the slot was held");
    d.release();
    wait_status(&s, &gate, &["COMPLETED"], WAIT).await;
    for id in &ids {
        let v = wait_status(&s, id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
    }
    assert_eq!(arrivals(&d, "/slow/5"), vec![2, 5, 1, 4, 0, 3, 6]);
    s.shutdown().await;
}

/// Timers are served while a backlog waits: two slots; a request sleeps 3 s at a WAIT
/// (room to make the backlog on a busy machine), and meanwhile 1,000 fresh requests of a
/// 50 ms step are created (about 25 s of work):
/// the step after the WAIT starts soon after its time (the first half of every claim
/// goes to rows due at a time), not after the backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_timer_is_not_kept_waiting_by_a_backlog() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let mut cfg = config(&db.url);
    cfg.threads = 1;
    cfg.max_running = 2;
    let s = TestServer::start(cfg).await;
    s.create_workflow(&json!({"name": "work", "steps": [http("call", d.url("/slow/50"))]}))
        .await;
    s.create_workflow(&json!({"name": "nap", "steps": [
        {"name": "sleep", "mode": "WAIT", "val": {"duration": "PT3S"}},
        http("after", d.url("/api/echo"))]}))
        .await;
    let t0 = Instant::now();
    let nap = create_with(&s, "nap", "", &json!({"n": -1})).await;
    wait_status(&s, &nap, &["IN_PROGRESS"], WAIT).await;
    for burst in 0..10 {
        let creates = (0..100).map(|i| {
            let s = &s;
            async move { create_with(s, "work", "", &json!({"n": burst * 100 + i})).await }
        });
        futures_util::future::join_all(creates).await;
    }
    assert!(
        d.received("/api/echo").is_empty() && t0.elapsed() < Duration::from_secs(3),
        "the backlog was made while the WAIT slept"
    );
    wait_for(
        "the step after the WAIT",
        Duration::from_secs(10),
        || async { (!d.received("/api/echo").is_empty()).then_some(()) },
    )
    .await;
    let took = t0.elapsed();
    let done = d.received("/slow/50").len();
    assert!(
        took < Duration::from_secs(4),
        "the step after a 3 s WAIT started {took:?} after the create"
    );
    assert!(
        done < 500,
        "{done} of the backlog's 1,000 ran first: it was not kept waiting by them"
    );
    s.shutdown().await;
}

//! Concurrency limits by key (beyond Clamp): a workflow's `concurrency: {key, limit}` lets
//! at most `limit` of its requests with the same key run at once across instances; the
//! others wait (NEW, `waitingForSlot` in their status) and start in creation order as
//! slots free. Tested against a peer that counts calls in flight per key.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(60);

fn http(name: &str, url: String) -> Value {
    json!({"name": name, "mode": "HTTP", "val": {"method": "POST", "url": url}})
}

/// The slot rows disagree with nothing the request rows say (migration 36: the statement
/// that changes a limited request writes its slot row; no trigger does): every request
/// with a key that waits for or holds a slot has its row, queued as it waits and ranked by
/// its priority, and no other row is there. Read in one snapshot.
async fn slots_agree(db: &TestDb) {
    let c = db.client().await;
    let wrong: Vec<String> = c
        .query(
            "SELECT coalesce(r.id, q.id)::text || ' request ' || coalesce(r.queued::text, '-') \
                 || ' slot ' || coalesce(q.queued::text, '-') \
             FROM (SELECT id, workflow_name, concurrency_key, \
                      concurrency_slot_state(status, lease_until) = 1 AS queued, \
                      (-coalesce(priority, 5))::int2 AS rank \
                   FROM service_requests WHERE concurrency_key IS NOT NULL \
                     AND concurrency_slot_state(status, lease_until) > 0) r \
             FULL JOIN concurrency_slots q ON q.id = r.id \
             WHERE r.id IS NULL OR q.id IS NULL \
                OR (r.workflow_name, r.concurrency_key, r.queued, r.rank) \
                   IS DISTINCT FROM (q.workflow_name, q.concurrency_key, q.queued, q.rank)",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(wrong.is_empty(), "slot rows that disagree: {wrong:?}");
}

/// Answers `id`'s ASYNC step 2 once it waits there, and waits for it to complete.
async fn answer(s: &TestServer, id: &str) {
    wait_status(s, id, &["PAUSED"], WAIT).await;
    let r = s
        .post_json(
            "/stepResponse",
            &json!({"serviceRequestId": id, "stepId": 2, "response": {"ok": true}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = wait_status(s, id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
}

/// Every statement that changes a limited request keeps its slot row, checked after each:
/// a create admitted and creates queued, a cancel of a waiting one, a compensating cancel
/// of a waiting one, a pause at an ASYNC step (it keeps its slot), the finish that its
/// answer makes (no step left: the slot goes with that write), the admission of the next,
/// and a rerun, which waits for a slot as a create does. At the end no slot row is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_of_a_limited_request_keeps_its_slot_row() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let mut ask = http("ask", d.url("/api/echo"));
    ask["type"] = json!("ASYNC");
    s.create_workflow(
        &json!({"name": "slots", "concurrency": {"key": "payload.k", "limit": 1},
        "steps": [http("hold", d.url("/held")), ask]}),
    )
    .await;
    let first = create_request(&s, "slots", &json!({"k": "x", "n": 0})).await;
    d.wait_for("/held").await;
    let mut waiting = Vec::new();
    for n in 1..4 {
        waiting.push(create_request(&s, "slots", &json!({"k": "x", "n": n})).await);
    }
    slots_agree(&db).await;
    assert_eq!(
        db.count("SELECT count(*) FROM concurrency_slots WHERE queued")
            .await,
        3
    );

    let r = s
        .post(&format!("/serviceRequest/{}/cancel", waiting[1]), "")
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    slots_agree(&db).await;
    let r = s
        .post(
            &format!("/serviceRequest/{}/cancel?compensate=true", waiting[2]),
            "",
        )
        .await;
    assert!(r.status == 200 || r.status == 202, "{}", r.text());
    wait_status(&s, &waiting[2], &["CANCELLED"], WAIT).await;
    slots_agree(&db).await;

    d.release();
    wait_status(&s, &first, &["PAUSED"], WAIT).await;
    slots_agree(&db).await;
    answer(&s, &first).await;
    answer(&s, &waiting[0]).await;
    slots_agree(&db).await;

    let r = s
        .post(&format!("/serviceRequest/{first}/rerun"), "{}")
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let run = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    wait_status(&s, &run, &["PAUSED"], WAIT).await;
    slots_agree(&db).await;
    answer(&s, &run).await;
    slots_agree(&db).await;
    assert_eq!(db.count("SELECT count(*) FROM concurrency_slots").await, 0);
    assert_eq!(d.peak_in_flight(), 1);
    s.shutdown().await;
}

/// Two instances share 400 requests over 10 keys with a limit of 2: the peer never sees
/// more than 2 calls of one key at once, each key reaches its limit, and every request
/// completes with its step called once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_keep_each_keys_limit() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let a = TestServer::start(config(&db.url)).await;
    let b = TestServer::start(config(&db.url)).await;
    a.create_workflow(
        &json!({"name": "ledger", "concurrency": {"key": "payload.k", "limit": 2},
        "steps": [http("post", d.url("/per-key/30"))]}),
    )
    .await;
    // Created in bursts of 40 at once, half on each instance.
    let mut ids = Vec::new();
    for burst in 0..10 {
        let creates = (0..40).map(|i| {
            let n = burst * 40 + i;
            let s = if n % 2 == 0 { &a } else { &b };
            async move {
                create_request(s, "ledger", &json!({"k": format!("k{}", n % 10), "n": n})).await
            }
        });
        ids.extend(futures_util::future::join_all(creates).await);
    }
    for id in &ids {
        let v = wait_status(&a, id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
        assert_eq!(d.calls_for_key(&format!("{id}:1")), 1, "{id}");
    }
    let peaks = d.peak_per_key();
    assert_eq!(peaks.len(), 10, "{peaks:?}");
    for (k, peak) in &peaks {
        assert!(*peak <= 2, "key {k} had {peak} calls at once");
    }
    assert!(
        peaks.values().any(|p| *p == 2),
        "some key reached its limit: {peaks:?}"
    );
    a.shutdown().await;
    slots_agree(&db).await;
    b.shutdown().await;
}

/// A create admitted at once is handed to its runtime's executor after its commit, as a
/// plain create is: no claim looks for it (the claim's write was most of what a limit
/// cost); one that waited is claimed once admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admitted_creates_start_without_a_claim() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(
        &json!({"name": "tenant", "concurrency": {"key": "payload.k", "limit": 1},
        "steps": [http("post", d.url("/per-key/5"))]}),
    )
    .await;
    let mut ids = Vec::new();
    for n in 0..40 {
        ids.push(create_request(&s, "tenant", &json!({"k": format!("k{}", n % 8), "n": n})).await);
    }
    for id in &ids {
        let v = wait_status(&s, id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
        assert_eq!(d.calls_for_key(&format!("{id}:1")), 1, "{id}");
    }
    let m = s.get("/metrics").await.text();
    let waited = metric(&m, "clamp_concurrency_waits_total ");
    let claimed = metric(&m, "clamp_leases_claimed_total ");
    assert_eq!(
        claimed, waited,
        "only the creates that waited for a slot are claimed: {m}"
    );
    assert!(waited < 40.0, "most creates were admitted at once: {m}");
    slots_agree(&db).await;
    s.shutdown().await;
}

/// A request waiting for a slot says so (its key, how many wait before it), starts when
/// a slot frees, in creation order; a cancel takes one out of the queue; a workflow
/// without a key is one queue; definitions are checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_requests_are_shown_start_in_order_and_can_be_cancelled() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "one", "concurrency": {"limit": 1},
        "steps": [http("hold", d.url("/held")), http("after", d.url("/api/echo"))]}))
        .await;
    let first = create_request(&s, "one", &json!({"n": 0})).await;
    d.wait_for("/held").await;
    let second = create_request(&s, "one", &json!({"n": 1})).await;
    let third = create_request(&s, "one", &json!({"n": 2})).await;
    let fourth = create_request(&s, "one", &json!({"n": 3})).await;
    let v = s.get(&format!("/serviceRequest/{fourth}")).await.json();
    assert_eq!(v["status"], "NEW", "{v}");
    assert_eq!(v["waitingForSlot"], json!({"key": "", "ahead": 2}), "{v}");
    let v = s.get(&format!("/serviceRequest/{second}")).await.json();
    assert_eq!(v["waitingForSlot"]["ahead"], 0, "{v}");
    // The running one shows no wait.
    let v = s.get(&format!("/serviceRequest/{first}")).await.json();
    assert!(v.get("waitingForSlot").is_none(), "{v}");
    // Search finds the requests waiting for a slot, of a key if asked.
    let found = |v: Value| -> Vec<String> {
        let mut ids: Vec<String> = v["serviceRequests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    };
    let mut want = vec![second.clone(), third.clone(), fourth.clone()];
    want.sort();
    let v = s.get("/serviceRequests?waitingForSlot=true").await.json();
    assert_eq!(found(v), want);
    let v = s
        .get("/serviceRequests?slotKey=other&workflow=one")
        .await
        .json();
    assert!(found(v).is_empty());
    // The console shows the wait: on the workflow's page by key, on the request's page.
    let page = s.get("/console/workflows/one").await.text();
    assert!(page.contains("Flow control"), "{page}");
    assert!(page.contains("at most 1 running at once"), "{page}");
    assert!(page.contains("3 waiting</a> under 1 key"), "{page}");
    assert!(
        page.contains(r#"<td class="num">3</td>"#),
        "three waiting under the one key: {page}"
    );
    // The workflows' list counts them; the requests' page lists them.
    let page = s.get("/console/workflows").await.text();
    assert!(
        page.contains(r#"<a href="/console?workflow=one&amp;waitingForSlot=true">3</a>"#),
        "{page}"
    );
    let page = s
        .get("/console?workflow=one&waitingForSlot=true")
        .await
        .text();
    for id in [&second, &third, &fourth] {
        assert!(page.contains(id.as_str()), "{id} listed: {page}");
    }
    assert!(
        !page.contains(first.as_str()),
        "the running one is not: {page}"
    );
    let page = s
        .get(&format!("/console/serviceRequests/{fourth}"))
        .await
        .text();
    assert!(page.contains("Waiting for a slot"), "{page}");
    // The metrics: three creates waited for a slot, none for a rate; three wait now, by
    // workflow.
    let m = s.get("/metrics").await.text();
    assert_eq!(metric(&m, "clamp_concurrency_waits_total "), 3.0, "{m}");
    assert_eq!(metric(&m, "clamp_rate_limited_starts_total "), 0.0, "{m}");
    assert_eq!(
        metric(&m, r#"clamp_concurrency_waiting{workflow="one"} "#),
        3.0,
        "{m}"
    );
    // A waiting request cancelled never runs.
    let r = s.post(&format!("/serviceRequest/{third}/cancel"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    d.release();
    for id in [&first, &second, &fourth] {
        let v = wait_status(&s, id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
    }
    let v = s.get(&format!("/serviceRequest/{third}")).await.json();
    assert_eq!(v["status"], "CANCELLED", "{v}");
    // One at a time, in creation order: each `hold` call came after the previous
    // request's last step.
    let holds: Vec<i64> = d
        .received("/held")
        .iter()
        .map(|r| r.body["n"].as_i64().unwrap())
        .collect();
    assert_eq!(holds, [0, 1, 3]);
    assert_eq!(d.peak_in_flight(), 1);

    // Definitions.
    for (bad, why) in [
        (json!({"limit": 0}), "concurrency.limit"),
        (json!({"limit": 2, "key": ""}), "concurrency.key"),
        (json!({"limit": 2, "key": "payload.k +"}), "concurrency.key"),
        (json!({"limit": 2, "key": "order.k"}), "concurrency.key"),
        (json!({"key": "payload.k"}), "limit"),
    ] {
        let r = s
            .post_json(
                "/workflow",
                &json!({"name": "bad", "concurrency": bad, "steps": [http("s", d.url("/api/echo"))]}),
            )
            .await;
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert!(r.text().contains(why), "{bad}: {}", r.text());
    }
    // A delayed or keyed create of a limited workflow is refused, clearly.
    let r = s
        .post_json("/serviceRequest/one?delayMs=1000", &json!({"n": 9}))
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    slots_agree(&db).await;
    s.shutdown().await;
}

/// A backlog of 50,000 requests on one key (limit 1) does not hold up another key's
/// request: it is admitted at its create and runs at the next claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_on_one_key_does_not_delay_another_key() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(
        &json!({"name": "tenant", "concurrency": {"key": "payload.k", "limit": 1},
        "steps": [http("work", d.url("/per-key/50"))]}),
    )
    .await;
    // The backlog: a few through the API, then 50,000 waiting rows as a limited create
    // stores them (NEW, held, with their key, and their slot rows queued).
    for n in 0..5 {
        create_request(&s, "tenant", &json!({"k": "big", "n": n})).await;
    }
    let c = db.client().await;
    c.execute(
        "WITH r AS (INSERT INTO service_requests (id, workflow_name, payload, headers, \
         lease_owner, lease_until, concurrency_key) \
         SELECT (lpad(to_hex(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') \
                 || '7' || substr(md5(g::text), 1, 3) || '8' || substr(md5(g::text), 4, 15))::uuid, \
                'tenant', '{\"k\":\"big\"}', '[]', NULL, 'infinity', 'big' \
         FROM generate_series(1, 50000) g RETURNING id) \
         INSERT INTO concurrency_slots (id, workflow_name, concurrency_key, queued, rank) \
         SELECT id, 'tenant', 'big', true, -5 FROM r",
        &[],
    )
    .await
    .unwrap();
    let t0 = Instant::now();
    let small = create_request(&s, "tenant", &json!({"k": "small"})).await;
    let v = wait_status(&s, &small, &["COMPLETED", "FAILED"], WAIT).await;
    let took = t0.elapsed();
    assert_eq!(v["status"], "COMPLETED", "{v}");
    // The documented bound: a sweep interval and the call itself, with room for a
    // loaded machine.
    assert!(took < Duration::from_secs(3), "took {took:?}");
    let peaks = d.peak_per_key();
    assert_eq!(peaks.get("big"), Some(&1), "{peaks:?}");
    let waiting: i64 = c
        .query_one(
            "SELECT count(*) FROM service_requests WHERE concurrency_key = 'big' \
             AND lease_until = 'infinity' AND status = 'NEW'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(waiting > 49_000, "the backlog still waits: {waiting}");
    slots_agree(&db).await;
    s.shutdown().await;
}

/// A failed request of a limited workflow, retried, waits for a slot again; the slots
/// its failure and its retry free are counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_request_waits_for_a_slot_again() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(
        &json!({"name": "acct", "concurrency": {"key": "payload.k", "limit": 1},
        "steps": [http("try", d.url("/until-fixed")), http("hold", d.url("/held"))]}),
    )
    .await;
    let failed = create_request(&s, "acct", &json!({"k": "a"})).await;
    let v = wait_status(&s, &failed, &["FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    d.fix();
    // Another request of the key takes the slot its failure freed, and holds it.
    let running = create_request(&s, "acct", &json!({"k": "a", "second": true})).await;
    d.wait_for("/held").await;
    let r = s.post(&format!("/serviceRequest/{failed}/retry"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    tokio::time::sleep(Duration::from_millis(1500)).await; // a pass and more: time is what is tested
    let v = s.get(&format!("/serviceRequest/{failed}")).await.json();
    assert_eq!(v["waitingForSlot"]["key"], "a", "{v}");
    assert_eq!(d.received("/held").len(), 1);
    slots_agree(&db).await;
    d.release();
    for id in [&running, &failed] {
        let v = wait_status(&s, id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
    }
    assert_eq!(d.peak_in_flight(), 1);
    slots_agree(&db).await;
    s.shutdown().await;
}

/// One of two instances is killed (SIGKILL) while its requests hold slots: the other
/// continues them once their leases run out, admits the rest, and never lets a key run
/// more than its limit; every request completes, and no slot stays taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_loses_no_slot_for_longer_than_a_lease() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let port = free_port();
    let mut killed = spawn_binary(&db.url, port);
    wait_healthy(port).await;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(
        &json!({"name": "dev", "concurrency": {"key": "payload.k", "limit": 2},
        "steps": [http("work", d.url("/per-key/300"))]}),
    )
    .await;
    // Created on the instance that is killed, so it admits and runs them first.
    let creates = (0..40).map(|n| async move {
        let r = send(
            addr,
            hyper::Method::POST,
            "/serviceRequest/dev",
            Some(
                json!({"k": format!("k{}", n % 4), "n": n})
                    .to_string()
                    .into_bytes(),
            ),
            &[],
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["serviceRequestId"].as_str().unwrap().to_string()
    });
    let ids = futures_util::future::join_all(creates).await;
    wait_for_seen("calls in flight on the instance killed", WAIT, || async {
        let n = d.received("/per-key/300").len();
        (n >= 4).then_some(()).ok_or(n)
    })
    .await;
    killed.kill().unwrap();
    killed.wait().unwrap();
    let t0 = Instant::now();
    for id in &ids {
        let v = wait_status(&s, id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
    }
    // 40 requests of 0.3 s, 2 at a time over 4 keys: 1.5 s of work, after a 1 s lease.
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t0.elapsed()
    );
    for (k, peak) in d.peak_per_key() {
        assert!(peak <= 2, "key {k} had {peak} calls at once");
    }
    let c = db.client().await;
    let held: i64 = c
        .query_one(
            "SELECT count(*) FROM service_requests WHERE concurrency_key IS NOT NULL \
             AND status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(held, 0, "no request holds or waits for a slot");
    slots_agree(&db).await;
    s.shutdown().await;
}

/// `rateLimit` of 100 per second: of 2,000 requests created at once, about 1,000 start in
/// the first 10 s (tolerance ±10%: admissions come at each pass, every 100 ms, as the
/// window slides), and no second-long window ever holds more than 100 starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_bounds_starts_per_second() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "paced", "rateLimit": {"perSecond": 100},
        "steps": [http("go", d.url("/api/echo"))]}))
        .await;
    for burst in 0..50 {
        let creates = (0..40).map(|i| {
            let s = &s;
            async move { create_request(s, "paced", &json!({"n": burst * 40 + i})).await }
        });
        futures_util::future::join_all(creates).await;
    }
    let c = db.client().await;
    let first: std::time::SystemTime = c
        .query_one(
            "SELECT min(admitted_at) FROM service_requests WHERE workflow_name = 'paced'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let wait = first + Duration::from_secs(10) + Duration::from_millis(300);
    if let Ok(left) = wait.duration_since(std::time::SystemTime::now()) {
        tokio::time::sleep(left).await; // time is what is tested
    }
    let started: i64 = c
        .query_one(
            "SELECT count(*) FROM service_requests WHERE workflow_name = 'paced' \
             AND admitted_at < (SELECT min(admitted_at) FROM service_requests \
                                WHERE workflow_name = 'paced') + interval '10 seconds'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!((900..=1100).contains(&started), "{started} started in 10 s");
    // Those that waited are counted as waiting for the rate, not for a slot; those still
    // waiting, under the workflow.
    let m = s.get("/metrics").await.text();
    let rated = metric(&m, "clamp_rate_limited_starts_total ");
    assert!(
        (1800.0..=1900.0).contains(&rated),
        "{rated} waited for the rate: {m}"
    );
    assert_eq!(metric(&m, "clamp_concurrency_waits_total "), 0.0, "{m}");
    let waiting = metric(&m, r#"clamp_concurrency_waiting{workflow="paced"} "#);
    assert!(
        (800.0..=1100.0).contains(&waiting),
        "{waiting} waiting: {m}"
    );
    let page = s.get("/console/workflows/paced").await.text();
    assert!(page.contains("at most 100 starts per second"), "{page}");
    assert!(page.contains("waiting</a> under 1 key"), "{page}");
    // No window of a second holds more than 100 starts.
    let most: i64 = c
        .query_one(
            "SELECT max(n) FROM (SELECT count(*) OVER (ORDER BY admitted_at \
               RANGE BETWEEN interval '999 milliseconds' PRECEDING AND CURRENT ROW) AS n \
             FROM service_requests WHERE workflow_name = 'paced' AND admitted_at IS NOT NULL) w",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(most <= 100, "{most} starts within a second");
    // Definitions.
    for (bad, why) in [
        (
            json!({"rateLimit": {"perSecond": 1, "perMinute": 1}}),
            "exactly one of",
        ),
        (json!({"rateLimit": {"perSecond": 0}}), "exactly one of"),
        (
            json!({"rateLimit": {"perSecond": 5, "key": "payload.a"},
                   "concurrency": {"limit": 2, "key": "payload.b"}}),
            "rateLimit.key must be concurrency.key",
        ),
    ] {
        let mut def = json!({"name": "bad", "steps": [http("s", d.url("/api/echo"))]});
        for (k, v) in bad.as_object().unwrap() {
            def[k] = v.clone();
        }
        let r = s.post_json("/workflow", &def).await;
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert!(r.text().contains(why), "{bad}: {}", r.text());
    }
    slots_agree(&db).await;
    s.shutdown().await;
}

/// A new version's limit applies to the admissions after it: raised from 1 to 3, two
/// waiting requests start beside the one running and the fourth still waits; a version
/// without `concurrency` admits it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_versions_limit_applies_to_admissions_after_it() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let steps = json!([http("hold", d.url("/held"))]);
    s.create_workflow(&json!({"name": "cap", "concurrency": {"limit": 1}, "steps": steps}))
        .await;
    let mut ids = Vec::new();
    for n in 0..4 {
        ids.push(create_request(&s, "cap", &json!({"n": n})).await);
    }
    d.wait_for("/held").await;
    let put = |def: Value| {
        let addr = s.addr;
        async move {
            let r = send(
                addr,
                hyper::Method::PUT,
                "/workflow/cap",
                Some(def.to_string().into_bytes()),
                &[],
            )
            .await;
            assert_eq!(r.status, 200, "{}", r.text());
        }
    };
    put(json!({"name": "cap", "concurrency": {"limit": 3}, "steps": steps})).await;
    wait_for("three calls in flight", Duration::from_secs(5), || async {
        (d.received("/held").len() == 3).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await; // a pass and more: nothing more starts
    assert_eq!(d.received("/held").len(), 3);
    let v = s.get(&format!("/serviceRequest/{}", ids[3])).await.json();
    assert_eq!(v["waitingForSlot"]["ahead"], 0, "{v}");
    put(json!({"name": "cap", "steps": steps})).await;
    wait_for("the fourth call", Duration::from_secs(5), || async {
        (d.received("/held").len() == 4).then_some(())
    })
    .await;
    d.release();
    for id in &ids {
        let v = wait_status(&s, id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
    }
    assert_eq!(d.peak_in_flight(), 4);
    slots_agree(&db).await;
    s.shutdown().await;
}

/// A schedule's runs of a limited workflow wait for a slot as creates do: with limit 1
/// and `overlap: allow`, a fire every second never runs two at once; the later fires and
/// a trigger wait in the key's queue (shown as waiting, with the schedule's priority),
/// and all run, one at a time, once the first finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedules_runs_wait_for_a_slot_like_creates() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(
        &json!({"name": "nightly", "concurrency": {"key": "payload.acct", "limit": 1},
        "steps": [http("hold", d.url("/held"))]}),
    )
    .await;
    let r = s
        .post_json(
            "/schedules",
            &json!({"name": "each-second", "workflow": "nightly", "every": "1s",
                    "overlap": "allow", "payload": {"acct": "a1"}, "priority": 7}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["priority"], 7, "{}", r.text());
    d.wait_for("/held").await;
    let c = db.client().await;
    let fired = || async {
        c.query(
            "SELECT service_request_id FROM schedule_fires WHERE schedule = 'each-second' \
             AND service_request_id IS NOT NULL ORDER BY fire_at",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<_, uuid::Uuid>(0).to_string())
        .collect::<Vec<String>>()
    };
    let ids = wait_for("three fires", WAIT, || async {
        let ids = fired().await;
        (ids.len() >= 3).then_some(ids)
    })
    .await;
    let t = s.post("/schedules/each-second/trigger", "").await;
    assert_eq!(t.status, 200, "{}", t.text());
    let triggered = t.json()["serviceRequestId"].as_str().unwrap().to_string();
    s.post("/schedules/each-second/pause", "").await;
    // One runs; the others wait under the payload's key, at the schedule's priority. (The
    // trigger is a fire too.)
    let runs = fired().await;
    assert!(runs.contains(&triggered), "{runs:?}");
    let mut waiting = 0;
    for id in &runs {
        let v = s.get(&format!("/serviceRequest/{id}")).await.json();
        assert_eq!(v["priority"], 7, "{v}");
        if v["status"] == "NEW" {
            assert_eq!(v["waitingForSlot"]["key"], "a1", "{v}");
            waiting += 1;
        }
    }
    assert!(waiting >= 3, "{waiting} waiting");
    // Each run that waited is counted as a create that waited for a slot.
    wait_for("the waits counted", WAIT, || async {
        let m = s.get("/metrics").await.text();
        (metric(&m, "clamp_concurrency_waits_total ") == waiting as f64).then_some(())
    })
    .await;
    assert_eq!(d.received("/held").len(), 1);
    assert_eq!(d.peak_in_flight(), 1);
    d.release();
    for id in &runs {
        let v = wait_status(&s, id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
    }
    assert!(ids.len() >= 3);
    assert_eq!(d.peak_in_flight(), 1, "one at a time");
    slots_agree(&db).await;
    s.shutdown().await;
}

/// Requests that wait for or hold a slot when a database is upgraded to migration 34 (a
/// key's slots in rows of their own) keep their places: the one holding the key's only
/// slot keeps it, the one waiting waits behind it, a finished one holds none; then both
/// run, one at a time, and leave no slot row behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_held_and_waited_for_survive_the_upgrade_to_slot_rows() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    migrate_to(&db, 33).await;
    let c = db.client().await;
    insert_workflow(
        &c,
        &json!({"name": "ledger", "concurrency": {"key": "payload.k", "limit": 1},
        "steps": [http("post", d.url("/per-key/300"))]}),
    )
    .await;
    // In creation order, an hour ago (the one set before the server's first start holds
    // the past): finished, holding the slot, waiting for it.
    let hour_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 3600;
    let ids: Vec<uuid::Uuid> = (0..3)
        .map(|ms| {
            let ts = uuid::Timestamp::from_unix(uuid::NoContext, hour_ago, ms * 1_000_000);
            uuid::Uuid::new_v7(ts)
        })
        .collect();
    let rows = [
        (ids[0], "COMPLETED", "-infinity"),
        (ids[1], "NEW", "-infinity"),
        (ids[2], "NEW", "infinity"),
    ];
    for (id, status, lease_until) in rows {
        c.execute(
            "INSERT INTO service_requests (id, workflow_name, status, payload, headers, \
                 current_step_id, lease_until, created_at, updated_at, finished_at, \
                 workflow_version, concurrency_key, admitted_at) \
             VALUES ($1, 'ledger', $2, '{\"k\":\"x\"}', '[]', 1, $3::text::timestamptz, now(), \
                 now(), CASE WHEN $2 = 'COMPLETED' THEN now() END, 1, 'x', \
                 CASE WHEN $3 <> 'infinity' THEN now() END)",
            &[&id, &status, &lease_until],
        )
        .await
        .unwrap();
    }
    migrate_to(&db, 34).await;
    let slots: Vec<(uuid::Uuid, bool)> = c
        .query("SELECT id, queued FROM concurrency_slots ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(slots, vec![(ids[1], false), (ids[2], true)]);

    let s = TestServer::start(config(&db.url)).await;
    for id in &ids[1..] {
        wait_status(&s, &id.to_string(), &["COMPLETED"], WAIT).await;
    }
    assert_eq!(d.received("/per-key/300").len(), 2);
    assert_eq!(
        d.peak_per_key().get("x"),
        Some(&1),
        "{:?}",
        d.peak_per_key()
    );
    assert_eq!(db.count("SELECT count(*) FROM concurrency_slots").await, 0);
    slots_agree(&db).await;
    s.shutdown().await;
}

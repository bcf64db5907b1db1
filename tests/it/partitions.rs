//! The request tables' partitions (beyond Clamp; `store::partitions`): sets of them are
//! created ahead when the server starts and as time goes, requests land in the set of
//! their time, and every read that names a request (by id) or a time range touches only
//! the partitions that can hold it: the plans, as the server's prepared statements run
//! them (generic plans), are checked here. Everything that reads requests keeps working
//! across sets.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;
use uuid::Uuid;

use crate::downstream::Downstream;
use crate::support::*;

/// A server whose sets are two seconds wide, made four seconds ahead, kept every 200 ms.
fn two_second_sets(db: &TestDb) -> clamp::config::Config {
    let mut cfg = config(&db.url);
    cfg.partitioning.min = Duration::from_secs(2);
    cfg.partitioning.max = Duration::from_secs(2);
    cfg.partitioning.ahead = Duration::from_secs(4);
    cfg.partitioning.every = Duration::from_millis(200);
    cfg
}

fn statement(name: &str) -> &'static str {
    clamp::store::statements::all()
        .into_iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no statement {name}"))
        .1
}

/// The lines of statement `name`'s generic plan with `params`, as the server's sessions
/// run it (`store::connect::session`; the looks' connections plan only generically);
/// `analyze` is "ANALYZE, " to run it, or "".
async fn generic_plan(
    c: &tokio_postgres::Client,
    name: &str,
    params: &str,
    analyze: &str,
) -> Vec<String> {
    let tag = name.replace("::", "_").to_lowercase();
    c.batch_execute(&format!(
        "SET enable_seqscan = off; SET plan_cache_mode = force_generic_plan; DEALLOCATE ALL; \
         PREPARE {tag} AS {}",
        statement(name)
    ))
    .await
    .unwrap();
    c.query(
        &format!("EXPLAIN ({analyze}COSTS OFF, TIMING OFF, SUMMARY OFF) EXECUTE {tag}({params})"),
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// The partitions of service_requests a statement's generic plan reads for the
/// request-side alias (`r` or `s`), with `params` as its parameters.
async fn partitions_read(c: &tokio_postgres::Client, name: &str, params: &str) -> BTreeSet<String> {
    partitions_read_as(c, name, params, &["r", "s"], true).await
}

/// The same, for the scans of the given aliases; with `executed_only` false, every
/// partition the plan kept when it started (those a run-time look skipped too).
async fn partitions_read_as(
    c: &tokio_postgres::Client,
    name: &str,
    params: &str,
    aliases: &[&str],
    executed_only: bool,
) -> BTreeSet<String> {
    let plan = generic_plan(c, name, params, "ANALYZE, ").await;
    let re = |line: &str| -> Option<String> {
        let at = line.find(" on service_requests_p")?;
        let rest = &line[at + 4..];
        let (part, alias) = rest.split_once(' ')?;
        let alias = alias.split(['_', ' ']).next()?;
        // Only the request itself: not the derived status's look at fan-out children.
        aliases.contains(&alias).then(|| part.to_string())
    };
    let read: BTreeSet<String> = plan
        .iter()
        .filter(|l| !executed_only || !l.contains("never executed"))
        .filter_map(|l| re(l))
        .collect();
    assert!(!read.is_empty(), "{name}: {}", plan.join("\n"));
    if std::env::var("SHOW_PLANS").is_ok() {
        eprintln!("{name}:\n{}", plan.join("\n"));
    }
    read
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sets_are_made_ahead_and_reads_touch_only_the_partitions_that_hold_what_they_name() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(two_second_sets(&db)).await;
    let sets = || async {
        db.count("SELECT count(*) FROM pg_inherits WHERE inhparent = 'service_requests'::regclass")
            .await
    };
    // Made before the server served: the first set and at least two ahead.
    let at_start = sets().await;
    assert!(at_start >= 3, "{at_start} sets at start");
    s.create_workflow(&json!({"name": "quick", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}))
        .await;
    let mut ids = Vec::new();
    for i in 0..14 {
        ids.push(create_request(&s, "quick", &json!({"i": i})).await);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for id in &ids {
        wait_status(&s, id, &["COMPLETED"], Duration::from_secs(20)).await;
    }
    assert!(sets().await > at_start, "no set made as time went");
    let c = db.client().await;
    // The requests are in the sets of their time: several of them.
    let holding = db
        .count(
            "SELECT count(DISTINCT tableoid) FROM service_requests WHERE workflow_name = 'quick'",
        )
        .await;
    assert!(holding >= 3, "{holding} partitions hold the requests");
    let steps_holding = db
        .count("SELECT count(DISTINCT tableoid) FROM steps_status")
        .await;
    assert_eq!(
        steps_holding, holding,
        "steps are kept in their requests' sets"
    );

    // A read by id touches one partition.
    let id = &ids[7];
    let read = partitions_read(&c, "status::GET_HEADS", &format!("ARRAY['{id}'::uuid]")).await;
    assert_eq!(read.len(), 1, "{read:?}");
    let own: String = c
        .query_one(
            &format!("SELECT tableoid::regclass::text FROM service_requests WHERE id = '{id}'"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(read.contains(&own), "{read:?} {own}");
    // A search and counts over a time range touch the partitions of that range only.
    let (lo, hi) = (
        Uuid::parse_str(&ids[4]).unwrap(),
        Uuid::parse_str(&ids[6]).unwrap(),
    );
    let range = db
        .count(&format!(
            "SELECT count(DISTINCT tableoid) FROM service_requests WHERE id >= '{lo}' AND id <= '{hi}'"
        ))
        .await as usize;
    let search = partitions_read(
        &c,
        "search::SEARCH_ALL",
        &format!("'{lo}', '{hi}', NULL, NULL, NULL, 100"),
    )
    .await;
    assert!(
        search.len() <= range + 1,
        "{search:?} for a range in {range}"
    );
    let counts = partitions_read(
        &c,
        "stats::COUNTS",
        &format!("'{lo}', '{hi}', '-infinity', 'infinity', NULL"),
    )
    .await;
    assert!(
        counts.len() <= range + 1,
        "{counts:?} for a range in {range}"
    );
    // Across sets, every read works as before.
    let found = s
        .get("/serviceRequests?workflow=quick&limit=100")
        .await
        .json();
    assert_eq!(
        found["serviceRequests"].as_array().unwrap().len(),
        ids.len(),
        "{found}"
    );
    let v = s.get("/serviceRequestCounts?workflow=quick").await.json();
    assert_eq!(v["counts"]["COMPLETED"], ids.len(), "{v}");
    let page = s
        .get("/serviceRequests/quick?pageNumber=0&pageSize=100")
        .await
        .json();
    assert_eq!(page["serviceRequests"].as_array().unwrap().len(), ids.len());
    for id in [&ids[0], &ids[13]] {
        assert_eq!(
            s.get(&format!("/console/serviceRequests/{id}"))
                .await
                .status,
            200
        );
    }
    s.shutdown().await;
}

/// A key's looks (its queue, its slot holders) read its slot rows (`concurrency_slots`,
/// migration 34), never a set of the requests: their cost does not grow with the sets
/// kept, and a generic plan made on fresh sets (no statistics) cannot stray onto another
/// index of theirs (as a key's queue probe once read the fan-out's held index, every
/// held row of every key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_looks_read_its_slot_rows_not_the_sets() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    let c = db.client().await;
    let keyed_looks = |plan: &[String]| -> Vec<String> {
        plan.iter()
            .filter(|l| l.contains(" q") || l.contains(" h"))
            .filter(|l| l.contains(" on "))
            .cloned()
            .collect()
    };
    // A key's admission: its queue (`q`) and its slot holders (`h`).
    let admit = generic_plan(&c, "slots::ADMIT", "'w', 'k', 4, NULL, 1000", "").await;
    // A finish's look for its key's queue.
    let ids = format!("'{{{}}}'", Uuid::now_v7());
    let keys_of = generic_plan(&c, "slots::KEYS_OF", &ids, "").await;
    for plan in [&admit, &keys_of] {
        let looks = keyed_looks(plan);
        assert!(!looks.is_empty(), "{}", plan.join("\n"));
        for l in &looks {
            assert!(
                l.contains("concurrency_slots_queue") || l.contains("concurrency_slots_held"),
                "a key's look not on its slot rows: {l}\n{}",
                plan.join("\n")
            );
        }
        assert!(
            !plan.iter().any(|l| l.contains("fan_held")),
            "{}",
            plan.join("\n")
        );
    }
    s.shutdown().await;
}

/// Limited creates go to the partition that holds their ids (`slots::insert`; plain ones
/// through the partitioned table), and a batch whose ids straddle a set's edge to the
/// partitioned table:
/// creates, most of them limited, sent at a steady pace across an edge, until two edges were
/// crossed (the batches there take ids from both sides; aimed at one partition, Postgres
/// would refuse them), are each answered and stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_across_a_sets_edge_are_all_stored() {
    let db = TestDb::new();
    let s = TestServer::start(two_second_sets(&db)).await;
    s.create_workflow(&simple_workflow("plain")).await;
    let mut limited = simple_workflow("limited");
    limited["concurrency"] = json!({"key": "payload.k", "limit": 2});
    s.create_workflow(&limited).await;
    let c = db.client().await;
    let mut ids = Vec::new();
    let mut straddled = 0;
    // Up to six edges, until two were crossed by the creates around them.
    for edge in 0..6 {
        // The next set's start (the creation time its lowest id carries), from now by the
        // database's clock (sets are made ahead).
        let wait_ms: f64 = c
            .query_one(
                "SELECT (min(lo) - extract(epoch FROM clock_timestamp()) * 1000)::float8 FROM ( \
                   SELECT ('x' || substr(replace(split_part(pg_get_expr(c.relpartbound, c.oid), '''', 2), \
                                                 '-', ''), 1, 12))::bit(48)::bigint AS lo \
                   FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
                   WHERE i.inhparent = 'service_requests'::regclass \
                     AND c.relname <> 'service_requests_p0') s \
                 WHERE lo > extract(epoch FROM clock_timestamp()) * 1000 + 300",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        // A create every 0.1 ms from 50 ms before the edge to 50 ms after it, each on a
        // task of its own (a burst sent at once arrives as one lump): more than the server
        // writes one at a time, so its batches fill as they go.
        tokio::time::sleep(Duration::from_millis((wait_ms - 50.0).max(0.0) as u64)).await;
        let mut tasks = Vec::new();
        let mut pace = tokio::time::interval(Duration::from_micros(100));
        for i in 0..1000 {
            pace.tick().await;
            let (wf, k) = if i % 4 == 0 {
                ("plain", 0)
            } else {
                ("limited", i % 7)
            };
            let body = json!({"k": format!("k{k}"), "edge": edge}).to_string();
            let addr = s.addr;
            tasks.push(tokio::spawn(async move {
                let path = format!("/serviceRequest/{wf}");
                send(
                    addr,
                    hyper::Method::POST,
                    &path,
                    Some(body.into_bytes()),
                    &[],
                )
                .await
            }));
        }
        for t in tasks {
            let r = t.await.unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
            ids.push(r.json()["serviceRequestId"].as_str().unwrap().to_string());
        }
        // Stored on both sides of the edge: the batches around it took ids of both.
        let sides = db
            .count(&format!(
                "SELECT count(DISTINCT tableoid) FROM service_requests \
                 WHERE payload::jsonb ->> 'edge' = '{edge}'"
            ))
            .await;
        straddled += (sides >= 2) as usize;
        if straddled == 2 {
            break;
        }
    }
    assert_eq!(straddled, 2, "the creates did not cross two sets' edges");
    let list = ids
        .iter()
        .map(|id| format!("'{id}'"))
        .collect::<Vec<_>>()
        .join(",");
    let stored = db
        .count(&format!(
            "SELECT count(*) FROM service_requests WHERE id IN ({list})"
        ))
        .await;
    assert_eq!(
        stored as usize,
        ids.len(),
        "every answered create is stored"
    );
    s.shutdown().await;
}

//! Search (`GET /serviceRequests?…`, beyond Clamp): every filter alone and combined,
//! newest first, keyset pages that stay exact while requests are created between them,
//! and a 400 naming the parameter for every bad filter.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(20);

fn one_step(name: &str, url: String) -> Value {
    json!({"name": name, "description": "search", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": url}}]})
}

fn ids(page: &Value) -> Vec<String> {
    page["serviceRequests"]
        .as_array()
        .unwrap_or_else(|| panic!("a page: {page}"))
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect()
}

async fn search(s: &TestServer, query: &str) -> Value {
    let r = s.get(&format!("/serviceRequests?{query}")).await;
    assert_eq!(r.status, 200, "{query}: {}", r.text());
    r.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_combine_newest_first() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&one_step("good", d.url("/api/echo")))
        .await;
    s.create_workflow(&one_step("bad", d.url("/status/500")))
        .await;
    // Created one after another, so that their order is their creation order.
    let mut created = Vec::new();
    for (i, wf) in ["good", "bad", "good", "bad", "good"].iter().enumerate() {
        let id = create_request(&s, wf, &json!({"n": i})).await;
        wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
        created.push(id);
        // Not a wait for a condition: creation times a few milliseconds apart, so that the
        // order by creation time is the order made.
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let newest_first: Vec<String> = created.iter().rev().cloned().collect();

    let all = search(&s, "").await;
    assert_eq!(ids(&all), newest_first);
    assert_eq!(all["nextCursor"], Value::Null);
    // Items are shaped as the workflow listing's are.
    let listed = s
        .get("/serviceRequests/good?pageNumber=0&pageSize=10")
        .await
        .json();
    assert_eq!(all["serviceRequests"][0], listed["serviceRequests"][0]);

    let good = search(&s, "workflow=good").await;
    assert_eq!(
        ids(&good),
        vec![created[4].clone(), created[2].clone(), created[0].clone()]
    );
    let failed = search(&s, "status=FAILED").await;
    assert_eq!(ids(&failed), vec![created[3].clone(), created[1].clone()]);
    assert!(failed["serviceRequests"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["status"] == "FAILED" && r["workflow_name"] == "bad"));
    assert_eq!(
        ids(&search(&s, "status=FAILED&workflow=good").await).len(),
        0
    );
    assert_eq!(
        ids(&search(&s, "status=completed,FAILED").await),
        newest_first
    );
    assert_eq!(
        ids(&search(&s, "status=COMPLETED&status=FAILED&workflow=bad").await),
        ids(&failed)
    );
    assert_eq!(ids(&search(&s, "workflow=nobody").await).len(), 0);

    // Time bounds are exclusive, to the microsecond of each request's created_at.
    let third = s
        .get(&format!("/serviceRequest/{}", created[2]))
        .await
        .json();
    let at = third["created_at"].as_str().unwrap().to_string();
    let enc = |t: &str| t.replace('+', "%2B");
    let after = search(&s, &format!("createdAfter={}", enc(&at))).await;
    assert_eq!(ids(&after), vec![created[4].clone(), created[3].clone()]);
    let before = search(&s, &format!("createdBefore={}", enc(&at))).await;
    assert_eq!(ids(&before), vec![created[1].clone(), created[0].clone()]);
    let first = s
        .get(&format!("/serviceRequest/{}", created[0]))
        .await
        .json();
    let between = search(
        &s,
        &format!(
            "createdAfter={}&createdBefore={}&workflow=good",
            enc(first["created_at"].as_str().unwrap()),
            enc(&at)
        ),
    )
    .await;
    // Between the first and the third, exclusive: only the second, which is not "good".
    assert_eq!(ids(&between).len(), 0, "{between}");
    let between = search(
        &s,
        &format!(
            "createdAfter={}&createdBefore=2999-01-01T00:00:00Z&workflow=good",
            enc(first["created_at"].as_str().unwrap())
        ),
    )
    .await;
    assert_eq!(ids(&between), vec![created[4].clone(), created[2].clone()]);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_stay_exact_while_requests_are_created_between_them() {
    let db = TestDb::new();
    let mut api = config(&db.url);
    api.max_running = 0; // they stay NEW: nothing changes under the pages but creates
    let s = TestServer::start(api).await;
    s.create_workflow(&simple_workflow("wf")).await;
    let mut before = HashSet::new();
    for i in 0..7 {
        before.insert(create_request(&s, "wf", &json!({"n": i})).await);
    }
    let mut seen: Vec<String> = Vec::new();
    let mut page = search(&s, "limit=3&status=NEW").await;
    let mut pages = 0;
    loop {
        pages += 1;
        let got = ids(&page);
        assert!(got.len() <= 3);
        seen.extend(got);
        // New requests arrive between pages: they are newer than any cursor, so they
        // neither shift nor repeat what the later pages hold.
        create_request(&s, "wf", &json!({"late": pages})).await;
        let Some(cursor) = page["nextCursor"].as_str() else {
            break;
        };
        page = search(&s, &format!("limit=3&status=NEW&cursor={cursor}")).await;
    }
    assert_eq!(pages, 3);
    assert_eq!(seen.len(), 7, "{seen:?}");
    assert_eq!(seen.iter().cloned().collect::<HashSet<_>>(), before);
    let mut sorted = seen.clone();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(seen, sorted, "newest first");
    // A full page at the end of the matches says there is no next page only when there
    // is none: 10 requests now, in pages of 5.
    let p1 = search(&s, "limit=5").await;
    let p2 = search(
        &s,
        &format!("limit=5&cursor={}", p1["nextCursor"].as_str().unwrap()),
    )
    .await;
    assert_eq!(ids(&p2).len(), 5);
    assert_eq!(p2["nextCursor"], Value::Null);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_filter_is_a_400_that_names_it() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    for (query, param) in [
        ("status=DONE", "status"),
        ("workflow=", "workflow"),
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("createdAfter=yesterday", "createdAfter"),
        ("createdBefore=2026-13-01T00:00:00Z", "createdBefore"),
        ("cursor=not-a-cursor", "cursor"),
        ("pageNumber=0", "pageNumber"),
        ("workflow=a&workflow=b", "workflow"),
        (
            "createdAfter=2026-12-02T00:00:00Z&createdBefore=2026-12-01T00:00:00Z",
            "createdAfter",
        ),
    ] {
        let why = s
            .get(&format!("/serviceRequests?{query}"))
            .await
            .expect_error(400);
        assert!(why.starts_with(&format!("{param}:")), "{query}: {why}");
    }
    s.shutdown().await;
}

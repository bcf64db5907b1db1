//! Labels (beyond Clamp): a create's `?label=` and `Clamp-Labels` are stored on every
//! create path (batched, keyed, delayed, limited), kept by children (WORKFLOW and MAP) and
//! reruns, and found by search, one label or several ANDed, newest first in keyset pages;
//! a request without labels stores NULL and its items keep Clamp's shape.

use std::time::Duration;

use hyper::Method;
use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(20);

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

/// Creates a request of `workflow` with `query` and `headers`; its id.
async fn create(s: &TestServer, workflow: &str, query: &str, headers: &[(&str, &str)]) -> String {
    let r = send(
        s.addr,
        Method::POST,
        &format!("/serviceRequest/{workflow}{query}"),
        Some(br#"{"n": 1}"#.to_vec()),
        headers,
    )
    .await;
    assert_eq!(r.status, 200, "{workflow}{query}: {}", r.text());
    r.json()["serviceRequestId"].as_str().unwrap().to_string()
}

async fn stored_labels(db: &TestDb, id: &str) -> Option<Vec<String>> {
    let c = db.client().await;
    let id = uuid::Uuid::parse_str(id).unwrap();
    c.query_one("SELECT labels FROM service_requests WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_create_path_stores_labels_and_search_finds_them() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let step = json!({"name": "a", "mode": "HTTP",
                      "val": {"method": "POST", "url": d.url("/api/echo")}});
    s.create_workflow(&json!({"name": "orders", "steps": [step.clone()]}))
        .await;
    s.create_workflow(&json!({"name": "ledger", "steps": [step],
                              "concurrency": {"key": "payload.n", "limit": 5}}))
        .await;

    let plain = create(&s, "orders", "", &[]).await;
    let by_query = create(&s, "orders", "?label=tenant:acme&label=order:4711", &[]).await;
    let by_header = create(
        &s,
        "orders",
        "?label=tenant:acme",
        &[("Clamp-Labels", "order:4712, region:eu")],
    )
    .await;
    let keyed = create(
        &s,
        "orders",
        "?label=tenant:acme&label=order:4713",
        &[("Idempotency-Key", "k-1")],
    )
    .await;
    let delayed = create(&s, "orders", "?delayMs=1&label=tenant:acme", &[]).await;
    let limited = create(&s, "ledger", "?label=tenant:acme&label=order:4714", &[]).await;
    for id in [&plain, &by_query, &by_header, &keyed, &delayed, &limited] {
        wait_status(&s, id, &["COMPLETED"], WAIT).await;
    }
    // The header is the request's labels, not a header its steps get.
    assert!(d
        .received("/api/echo")
        .iter()
        .all(|r| !r.headers.contains_key("clamp-labels")));
    // A request without labels stores none; each path stores them sorted.
    assert_eq!(stored_labels(&db, &plain).await, None);
    let stored = |l: &[&str]| Some(l.iter().map(|x| x.to_string()).collect::<Vec<_>>());
    assert_eq!(
        stored_labels(&db, &by_query).await,
        stored(&["order:4711", "tenant:acme"])
    );
    assert_eq!(
        stored_labels(&db, &by_header).await,
        stored(&["order:4712", "region:eu", "tenant:acme"])
    );
    assert_eq!(
        stored_labels(&db, &keyed).await,
        stored(&["order:4713", "tenant:acme"])
    );
    assert_eq!(stored_labels(&db, &delayed).await, stored(&["tenant:acme"]));
    assert_eq!(
        stored_labels(&db, &limited).await,
        stored(&["order:4714", "tenant:acme"])
    );

    // One label: newest first, the unlabelled request not among them.
    let acme = search(&s, "label=tenant:acme").await;
    assert_eq!(
        ids(&acme),
        [&limited, &delayed, &keyed, &by_header, &by_query].map(String::clone)
    );
    assert_eq!(
        acme["serviceRequests"][0]["labels"],
        json!(["order:4714", "tenant:acme"])
    );
    // Two, ANDed, in either order; with a workflow; with a status.
    assert_eq!(
        ids(&search(&s, "label=order:4711&label=tenant:acme").await),
        [by_query.as_str()]
    );
    assert_eq!(
        ids(&search(&s, "label=tenant:acme&label=order:4711").await),
        [by_query.as_str()]
    );
    assert!(ids(&search(&s, "label=order:4711&label=region:eu").await).is_empty());
    assert_eq!(
        ids(&search(&s, "label=tenant:acme&workflow=ledger").await),
        [limited.as_str()]
    );
    assert_eq!(
        ids(&search(&s, "label=tenant:acme&status=COMPLETED&limit=100").await).len(),
        5
    );
    assert!(ids(&search(&s, "label=tenant:acme&status=FAILED").await).is_empty());
    // Keyset pages of one.
    let mut cursor = String::new();
    let mut paged = Vec::new();
    loop {
        let page = search(&s, &format!("label=tenant:acme&limit=2{cursor}")).await;
        paged.extend(ids(&page));
        match page["nextCursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(paged, ids(&acme));
    // Items without labels keep Clamp's shape: no `labels` field.
    let all = search(&s, "workflow=orders&limit=100").await;
    let item = all["serviceRequests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == plain.as_str())
        .unwrap()
        .clone();
    assert!(item.get("labels").is_none(), "{item}");
    // The console filters by labels, and links each label it shows.
    let page = s.get("/console?labels=order:4711,+tenant:acme").await;
    assert_eq!(page.status, 200, "{}", page.text());
    let html = page.text();
    assert!(html.contains(&by_query), "{html}");
    assert!(!html.contains(&by_header) && !html.contains(&plain));
    assert!(
        html.contains(r#"href="/console?labels=order%3A4711""#),
        "{html}"
    );
    // The request's own page shows them.
    let page = s
        .get(&format!("/console/serviceRequests/{by_header}"))
        .await
        .text();
    assert!(
        page.contains(r#"href="/console?labels=region%3Aeu""#),
        "{page}"
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_and_reruns_keep_their_parents_labels() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let echo = |name: &str| json!({"name": name, "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}});
    s.create_workflow(&json!({"name": "inner", "steps": [echo("i")]}))
        .await;
    s.create_workflow(&json!({"name": "outer", "steps": [
        echo("first"),
        {"name": "child", "mode": "WORKFLOW", "val": {"workflow": "inner"}},
        {"name": "each", "mode": "MAP",
         "val": {"items": "first.response.echo.items", "steps": [echo("e")], "maxConcurrency": 2}}
    ]}))
    .await;
    let r = send(
        s.addr,
        Method::POST,
        "/serviceRequest/outer?label=order:9",
        Some(br#"{"items": [1, 2]}"#.to_vec()),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let parent = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    wait_status(&s, &parent, &["COMPLETED"], WAIT).await;
    // The parent, its WORKFLOW child and its two MAP children.
    let found = search(&s, "label=order:9&limit=100").await;
    assert_eq!(ids(&found).len(), 4, "{found}");
    assert_eq!(ids(&found).last().unwrap(), &parent);
    assert_eq!(
        ids(&search(&s, "label=order:9&workflow=inner").await).len(),
        1
    );

    let r = s.post(&format!("/serviceRequest/{parent}/rerun"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let run = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    wait_status(&s, &run, &["COMPLETED"], WAIT).await;
    let found = search(&s, "label=order:9&workflow=outer").await;
    assert_eq!(ids(&found), [run, parent]);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_label_is_a_400_that_names_it() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&simple_workflow("w")).await;
    for query in [
        "?label=nokey",
        "?label=:v",
        "?label=k:",
        "?label=k%20k:v",
        "?label=k:a%0Ab",
    ] {
        let r = s.post(&format!("/serviceRequest/w{query}"), "{}").await;
        let why = r.expect_error(400);
        assert!(why.contains("label"), "{query}: {why}");
    }
    let many: String = (0..17).map(|i| format!("&label=k:{i}")).collect();
    let why = s
        .post(&format!("/serviceRequest/w?x=1{many}"), "{}")
        .await
        .expect_error(400);
    assert!(why.contains("at most 16"), "{why}");
    let r = send(
        s.addr,
        Method::POST,
        "/serviceRequest/w",
        Some(b"{}".to_vec()),
        &[("Clamp-Labels", "a:b, c")],
    )
    .await;
    assert!(r.expect_error(400).contains("label"));
    for (query, param) in [
        ("label=nokey", "label"),
        (
            "label=k:v&rerunOf=0192f3d4-0000-7000-8000-000000000000",
            "label",
        ),
    ] {
        let why = s
            .get(&format!("/serviceRequests?{query}"))
            .await
            .expect_error(400);
        assert!(why.starts_with(param), "{query}: {why}");
    }
    s.shutdown().await;
}

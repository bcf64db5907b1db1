//! `POST /workflow`, `GET /workflow/{name}`, `GET /workflows`: success and every error.

use serde_json::{json, Value};

use crate::support::*;

fn http_step(name: &str) -> Value {
    json!({"name": name, "mode": "HTTP", "val": {"method": "GET", "url": "http://127.0.0.1:9/x"}})
}

#[tokio::test]
async fn creates_reads_and_rejects_duplicates() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    let mut a = http_step("auth");
    a["onFailure"] = json!([http_step("notify")]);
    let def = json!({"name": "claims", "description": "d", "steps": [a,
        {"name": "publish", "mode": "AMQP", "val": {"connection_url": "amqp://guest:guest@127.0.0.1:5672/", "queue_name": "q"}},
        {"name": "last", "mode": "HTTP", "type": "ASYNC", "val": {"method": "POST", "url": "http://127.0.0.1:9/y", "headers": "X-A:1;"}}]});
    let created = s.create_workflow(&def).await;
    assert_eq!(created["name"], "claims");
    assert!(created["id"].as_str().unwrap().len() == 36);
    assert!(created["created_at"].as_str().unwrap().starts_with("20"));
    let steps = created["steps"].as_array().unwrap();
    assert_eq!(steps[0]["id"], 1);
    assert_eq!(steps[0]["type"], "SYNC");
    assert_eq!(steps[0]["onFailure"][0]["id"], 2);
    assert_eq!(steps[1]["id"], 3);
    assert_eq!(steps[1]["type"], "ASYNC");
    assert_eq!(steps[2]["id"], 4);
    assert_eq!(steps[2]["type"], "ASYNC");

    let got = s.get("/workflow/claims").await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json(), created);

    let dup = s.post_json("/workflow", &def).await;
    let msg = dup.expect_error(409);
    assert!(msg.contains("claims"), "{msg}");

    let msg = s.get("/workflow/nothere").await.expect_error(404);
    assert!(msg.contains("nothere"), "{msg}");
    // A name with a space, percent-encoded in the path.
    s.create_workflow(&json!({"name": "with space", "steps": [http_step("a")]}))
        .await;
    assert_eq!(s.get("/workflow/with%20space").await.status, 200);
    s.shutdown().await;
}

#[tokio::test]
async fn rejects_invalid_definitions() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    let cases: Vec<(Value, &str)> = vec![
        (json!({"steps": [http_step("a")]}), "name is required"),
        (
            json!({"name": "", "steps": [http_step("a")]}),
            "name is required",
        ),
        (json!({"name": "w"}), "steps is required"),
        (json!({"name": "w", "steps": []}), "steps is required"),
        (
            json!({"name": "w", "steps": [{"mode": "HTTP", "val": {"method": "GET", "url": "http://h/"}}]}),
            "steps[0].name is required",
        ),
        (
            json!({"name": "w", "steps": [{"name": "a", "val": {"method": "GET", "url": "http://h/"}}]}),
            "mode is required",
        ),
        (
            json!({"name": "w", "steps": [{"name": "a", "mode": "SMTP", "val": {}}]}),
            "HTTP, AMQP, KAFKA, WORKFLOW, PARALLEL, MAP, SWITCH, LOOP, WAIT or EVENT",
        ),
        (
            json!({"name": "w", "steps": [{"name": "a", "mode": "HTTP"}]}),
            "val is required",
        ),
        (
            json!({"name": "w", "steps": [{"name": "a", "mode": "HTTP", "val": {"url": "http://h/"}}]}),
            "method is required",
        ),
        (
            json!({"name": "w", "steps": [{"name": "a", "mode": "HTTP", "val": {"method": "HEAD", "url": "http://h/"}}]}),
            "method",
        ),
        (
            json!({"name": "w", "steps": [{"name": "a", "mode": "HTTP", "val": {"method": "GET"}}]}),
            "url is required",
        ),
        (
            json!({"name": "w", "steps": [{"name": "a", "mode": "HTTP", "val": {"method": "GET", "url": "::nope"}}]}),
            "url",
        ),
        (
            json!({"name": "w", "steps": [{"name": "a", "mode": "AMQP", "val": {"queue_name": "q"}}]}),
            "connection_url is required",
        ),
        (
            json!({"name": "w", "steps": [{"name": "a", "mode": "AMQP", "val": {"connection_url": "amqp://h/"}}]}),
            "queue_name or exchange_name",
        ),
        (
            json!({"name": "w", "steps": [{"name": "a", "mode": "KAFKA", "val": {"topic_name": "t"}}]}),
            "connection_url is required",
        ),
        (
            json!({"name": "w", "steps": [{"name": "a", "mode": "KAFKA", "val": {"connection_url": "h:9092"}}]}),
            "topic_name is required",
        ),
        (
            json!({"name": "w", "steps": [http_step("a"), http_step("a")]}),
            "unique",
        ),
        (
            json!({"name": "w", "steps": [{"name": "a", "mode": "HTTP", "when": "a.request.x ==",
            "val": {"method": "GET", "url": "http://h/"}}]}),
            "does not compile",
        ),
        (
            json!({"name": "w", "steps": [{"name": "a", "mode": "HTTP", "when": "ghost.response.ok",
            "val": {"method": "GET", "url": "http://h/"}}]}),
            "not a step",
        ),
        (
            json!({"name": "w", "steps": [{"name": "a", "mode": "HTTP", "transform": true,
            "val": {"method": "GET", "url": "http://h/"}}]}),
            "requestTransform.spec is required",
        ),
        (
            json!({"name": "w", "steps": "nope"}),
            "invalid workflow definition",
        ),
    ];
    for (def, needle) in cases {
        let r = s.post_json("/workflow", &def).await;
        let msg = r.expect_error(400);
        assert!(msg.contains(needle), "{def} → {msg} (expected {needle:?})");
    }
    assert!(s
        .post("/workflow", "{not json")
        .await
        .expect_error(400)
        .contains("not valid JSON"));
    assert!(s
        .post("/workflow", "[1,2]")
        .await
        .expect_error(400)
        .contains("JSON object"));
    assert_eq!(db.count("SELECT count(*) FROM workflows").await, 0);
    s.shutdown().await;
}

#[tokio::test]
async fn pages_and_sorts_workflows() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    for name in ["delta", "alpha", "charlie", "bravo", "echo"] {
        s.create_workflow(&simple_workflow(name)).await;
    }
    let names = |v: &Value| -> Vec<String> {
        v["workflows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["name"].as_str().unwrap().to_string())
            .collect()
    };
    let r = s
        .get("/workflows?pageNumber=1&pageSize=2&sortBy=name:asc")
        .await
        .json();
    assert_eq!(names(&r), ["alpha", "bravo"]);
    assert_eq!(r["totalWorkflowsCount"], 5);
    assert_eq!(r["pageNumber"], 1);
    assert_eq!(r["pageSize"], 2);
    let r = s
        .get("/workflows?pageNumber=3&pageSize=2&sortBy=name:asc")
        .await
        .json();
    assert_eq!(names(&r), ["echo"]);
    let r = s
        .get("/workflows?pageNumber=1&pageSize=10&sortBy=name:desc")
        .await
        .json();
    assert_eq!(names(&r), ["echo", "delta", "charlie", "bravo", "alpha"]);
    let r = s
        .get("/workflows?pageNumber=1&pageSize=10&sortBy=created_at:desc,name:asc")
        .await
        .json();
    assert_eq!(names(&r), ["echo", "bravo", "charlie", "alpha", "delta"]);
    let r = s.get("/workflows?pageNumber=1&pageSize=10").await.json();
    assert_eq!(r["workflows"].as_array().unwrap().len(), 5);
    let r = s.get("/workflows?pageNumber=9&pageSize=10").await.json();
    assert_eq!(r["workflows"].as_array().unwrap().len(), 0);

    for bad in [
        "/workflows",
        "/workflows?pageSize=10",
        "/workflows?pageNumber=1",
        "/workflows?pageNumber=0&pageSize=10",
        "/workflows?pageNumber=1&pageSize=0",
        "/workflows?pageNumber=x&pageSize=10",
        "/workflows?pageNumber=1&pageSize=100000",
        "/workflows?pageNumber=1&pageSize=10&sortBy=description:asc",
        "/workflows?pageNumber=1&pageSize=10&sortBy=name:sideways",
    ] {
        s.get(bad).await.expect_error(400);
    }
    s.shutdown().await;
}

#[tokio::test]
async fn finds_workflows_created_by_another_instance() {
    let db = TestDb::new();
    let a = TestServer::start(config(&db.url)).await;
    let b = TestServer::start(config(&db.url)).await;
    // b has looked for it (and remembered the miss) before a creates it.
    b.post("/serviceRequest/shared", "{}")
        .await
        .expect_error(404);
    a.create_workflow(&simple_workflow("shared")).await;
    // The miss is remembered briefly, then Postgres is asked again.
    // time is what is tested: the negative cache entry must expire after NEGATIVE_TTL.
    tokio::time::sleep(
        clamp::store::workflow_map::NEGATIVE_TTL + std::time::Duration::from_millis(100),
    )
    .await;
    assert_eq!(b.post("/serviceRequest/shared", "{}").await.status, 200);
    assert_eq!(b.get("/workflow/shared").await.status, 200);
    // A restarted instance loads every workflow at startup.
    a.shutdown().await;
    let c = TestServer::start(config(&db.url)).await;
    assert_eq!(c.server.as_ref().unwrap().app().workflows.len(), 1);
    b.shutdown().await;
    c.shutdown().await;
}

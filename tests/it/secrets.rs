//! Secrets by reference (beyond Clamp): a step's headers, URL query and broker
//! connection string name `{{secret:NAME}}`, resolved when the call is made from a
//! directory of files (read at each call: a changed file is used by the next call) or
//! `CLAMP_SECRET_NAME`; every read of the workflow and the request, the console, the step
//! records and the logs hold only the reference.

use std::process::{Command, Stdio};
use std::time::Duration;

use hyper::Method;
use serde_json::json;

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(30);
const FIRST: &str = "sk_live_first_7f3a9c";
const SECOND: &str = "sk_live_second_41d2e8";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_reaches_the_call_and_no_read_and_a_changed_file_is_used_next() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let dir = std::env::temp_dir().join(format!("clamp-secrets-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("PAY_KEY"), format!("{FIRST}\n")).unwrap();
    let port = free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_clamp"));
    cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--database-url", &db.url, "--threads", "1"])
        .args([
            "--secrets-dir",
            dir.to_str().unwrap(),
            "--log-format",
            "json",
        ])
        .env("LOG_LEVEL", "debug")
        .env_remove("CLAMP_API_TOKENS")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = Spawned(cmd.spawn().unwrap());
    let stdout = child.0.stdout.take().unwrap();
    let logs = std::thread::spawn(move || {
        use std::io::Read;
        let mut s = String::new();
        let _ = std::io::BufReader::new(stdout).read_to_string(&mut s);
        s
    });
    wait_healthy(port).await;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let call = |method: Method, path: String, body: Option<serde_json::Value>| async move {
        send(
            addr,
            method,
            &path,
            body.map(|b| b.to_string().into_bytes()),
            &[],
        )
        .await
    };
    let step = |headers: &str, url: String| {
        json!({"name": "pay", "mode": "HTTP",
               "val": {"method": "POST", "url": url, "headers": headers}})
    };
    // A secret that does not exist is refused at definition, named (never a value).
    let r = call(
        Method::POST,
        "/workflow".into(),
        Some(json!({"name": "w", "steps": [step("Authorization:Bearer {{secret:NOPE_KEY};", d.url("/api/echo"))]})),
    )
    .await;
    assert!(r.expect_error(400).contains("not closed"));
    let r = call(
        Method::POST,
        "/workflow".into(),
        Some(json!({"name": "w", "steps": [step("Authorization:Bearer {{secret:NOPE_KEY}};", d.url("/api/echo"))]})),
    )
    .await;
    assert!(r.expect_error(400).contains("secret NOPE_KEY is not set"));
    let r = call(
        Method::POST,
        "/workflow".into(),
        Some(json!({"name": "w", "steps": [step("", d.url("/{{secret:PAY_KEY}}/x"))]})),
    )
    .await;
    assert!(r.expect_error(400).contains("query only"));
    // Named in a header and in the URL's query.
    let r = call(
        Method::POST,
        "/workflow".into(),
        Some(json!({"name": "w", "steps": [step(
            "Authorization:Bearer {{secret:PAY_KEY}};X-Tenant:acme;",
            format!("{}?key={{{{secret:PAY_KEY}}}}", d.url("/api/echo")),
        )]})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let mut reads = vec![r.text()];
    let run = |n: u32| async move {
        let r = call(
            Method::POST,
            "/serviceRequest/w".into(),
            Some(json!({"n": n})),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
        let id = r.json()["serviceRequestId"].as_str().unwrap().to_string();
        let v = wait_status_at(addr, &id, &["COMPLETED", "FAILED"], WAIT, &[]).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
        id
    };
    let id = run(1).await;
    let got = d.received("/api/echo");
    assert_eq!(got[0].headers["authorization"], format!("Bearer {FIRST}"));
    assert_eq!(got[0].headers["x-tenant"], "acme");
    // The file changed: the next call uses the new value, no restart.
    std::fs::write(dir.join("PAY_KEY"), SECOND).unwrap();
    let id2 = run(2).await;
    let got = d.received("/api/echo");
    assert_eq!(got[1].headers["authorization"], format!("Bearer {SECOND}"));
    // Every read holds the reference and neither value.
    for path in [
        "/workflow/w".to_string(),
        format!("/serviceRequest/{id}"),
        format!("/serviceRequest/{id2}"),
        "/console/workflows/w".to_string(),
        format!("/console/serviceRequests/{id}"),
    ] {
        reads.push(call(Method::GET, path, None).await.text());
    }
    assert!(reads[0].contains("{{secret:PAY_KEY}}"), "{}", reads[0]);
    // `clamp workflows export` writes the reference too.
    let out = dir.join("export");
    let exported = Command::new(env!("CARGO_BIN_EXE_clamp"))
        .args([
            "workflows",
            "export",
            "--url",
            &format!("http://127.0.0.1:{port}"),
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(exported.status.success(), "{exported:?}");
    let file = std::fs::read_to_string(out.join("w.json")).unwrap();
    assert!(file.contains("{{secret:PAY_KEY}}"), "{file}");
    reads.push(file);
    let c = db.client().await;
    for r in c
        .query("SELECT coalesce(request, '') || coalesce(response, '') || coalesce(reason, '') FROM steps_status", &[])
        .await
        .unwrap()
    {
        reads.push(r.get(0));
    }
    let stored: String = c
        .query_one(
            "SELECT definition::text FROM workflows WHERE name = 'w'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    reads.push(stored);
    let _ = child.0.kill();
    let _ = child.0.wait();
    let logs = logs.join().unwrap();
    assert!(
        logs.contains("\"level\":\"DEBUG\"") || logs.contains("DEBUG"),
        "debug logs were on"
    );
    reads.push(logs);
    for text in &reads {
        assert!(
            !text.contains(FIRST) && !text.contains(SECOND),
            "a secret leaked: {text}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_removed_after_definition_fails_the_step_by_name() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let dir = std::env::temp_dir().join(format!("clamp-secrets-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("GONE_KEY"), FIRST).unwrap();
    let mut cfg = config(&db.url);
    cfg.secrets = std::sync::Arc::new(clamp::secrets::Secrets::new(Some(dir.clone())));
    let s = TestServer::start(cfg).await;
    s.create_workflow(&json!({"name": "w", "steps": [{"name": "pay", "mode": "HTTP",
        "val": {"method": "POST", "url": d.url("/api/echo"), "headers": "X-Key:{{secret:GONE_KEY}};"}}]}))
        .await;
    std::fs::remove_file(dir.join("GONE_KEY")).unwrap();
    let id = create_request(&s, "w", &json!({})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .contains("secret GONE_KEY is not set"),
        "{v}"
    );
    assert!(d.received("/api/echo").is_empty());
    s.shutdown().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

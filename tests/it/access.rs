//! Secure defaults (beyond Clamp): a server without tokens serves this host only unless
//! told otherwise; tokens have roles (read, operate, admin) that every route and the
//! console respect, from a file read again on SIGHUP.

use std::process::{Command, Stdio};
use std::time::Duration;

use hyper::Method;
use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(30);
const READ: &str = "read-token-0123456789";
const OPERATE: &str = "operate-token-0123456789";
const ADMIN: &str = "admin-token-0123456789";

fn tokens_file(dir: &std::path::Path, text: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join("tokens");
    std::fs::write(&p, text).unwrap();
    p
}

/// A server whose tokens come from a file of `text` (in a scratch directory, returned for
/// the test to remove).
async fn with_tokens_file(db: &TestDb, text: &str) -> (TestServer, std::path::PathBuf) {
    let dir = scratch();
    let file = tokens_file(&dir, text);
    let mut cfg = config(&db.url);
    cfg.api_tokens = std::sync::Arc::new(
        clamp::tokens::ApiTokens::new(clamp::tokens::Tokens::default(), Some(file)).unwrap(),
    );
    (TestServer::start(cfg).await, dir)
}

fn scratch() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("clamp-access-{}", uuid::Uuid::new_v4()))
}

async fn as_role(
    s: &TestServer,
    token: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Resp {
    let auth = format!("Bearer {token}");
    send(
        s.addr,
        method,
        path,
        body.map(|b| b.to_string().into_bytes()),
        &[("authorization", &auth)],
    )
    .await
}

/// What a spawned server logged, once stopped.
fn logs_of(mut child: Spawned) -> String {
    use std::io::Read;
    let _ = child.0.kill();
    let _ = child.0.wait();
    let mut s = String::new();
    if let Some(mut o) = child.0.stdout.take() {
        let _ = o.read_to_string(&mut s);
    }
    if let Some(mut e) = child.0.stderr.take() {
        let _ = e.read_to_string(&mut s);
    }
    s
}

#[test]
fn no_tokens_and_a_wider_bind_is_refused_with_what_to_set() {
    let db = TestDb::new();
    let out = Command::new(env!("CARGO_BIN_EXE_clamp"))
        .args([
            "--bind",
            "0.0.0.0",
            "--port",
            "0",
            "--database-url",
            &db.url,
        ])
        .env_remove("CLAMP_API_TOKENS")
        .env_remove("CLAMP_TOKENS_FILE")
        .env_remove("CLAMP_ALLOW_UNAUTHENTICATED")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--bind 0.0.0.0") && err.contains("CLAMP_ALLOW_UNAUTHENTICATED=true"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tokens_the_default_is_this_host_and_saying_so_opens_it() {
    let db = TestDb::new();
    // No --bind and no tokens: loopback only.
    let port = free_port();
    let mut quiet = Command::new(env!("CARGO_BIN_EXE_clamp"));
    quiet
        .args(["--port", &port.to_string(), "--database-url", &db.url])
        .env_remove("CLAMP_API_TOKENS")
        .env_remove("CLAMP_BIND")
        .env_remove("CLAMP_ALLOW_UNAUTHENTICATED")
        .env("CLAMP_LOG_FORMAT", "json")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = Spawned(quiet.spawn().unwrap());
    wait_healthy(port).await;
    let logs = logs_of(child);
    assert!(logs.contains(&format!("127.0.0.1:{port}")), "{logs}");
    assert!(logs.contains("no API tokens are set"), "{logs}");
    // Told to serve other hosts without tokens: every interface.
    let port = free_port();
    let mut open = Command::new(env!("CARGO_BIN_EXE_clamp"));
    open.args(["--port", &port.to_string(), "--database-url", &db.url])
        .env_remove("CLAMP_API_TOKENS")
        .env_remove("CLAMP_BIND")
        .env("CLAMP_ALLOW_UNAUTHENTICATED", "true")
        .env("CLAMP_LOG_FORMAT", "json")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = Spawned(open.spawn().unwrap());
    wait_healthy(port).await;
    let logs = logs_of(child);
    assert!(logs.contains(&format!("0.0.0.0:{port}")), "{logs}");
}

/// Every route, with what it needs: (method, path, body, role needed, status when allowed).
fn routes(
    id: &str,
    failed: &str,
    fresh: &str,
) -> Vec<(Method, String, Option<Value>, &'static str, u16)> {
    let wf = json!({"name": "w2", "steps": [{"name": "a", "mode": "HTTP",
        "val": {"method": "GET", "url": "http://127.0.0.1:9/x"}}]});
    let sched = json!({"name": "s1", "workflow": "w", "every": "1h", "paused": true});
    vec![
        (
            Method::GET,
            format!("/serviceRequest/{id}"),
            None,
            "read",
            200,
        ),
        (
            Method::GET,
            format!("/serviceRequest/{id}/children?pageNumber=1&pageSize=10"),
            None,
            "read",
            200,
        ),
        (
            Method::GET,
            "/serviceRequests/w?pageNumber=1&pageSize=10".into(),
            None,
            "read",
            200,
        ),
        (
            Method::GET,
            "/serviceRequests?status=FAILED".into(),
            None,
            "read",
            200,
        ),
        (
            Method::GET,
            "/serviceRequestCounts".into(),
            None,
            "read",
            200,
        ),
        (Method::GET, "/workflow/w".into(), None, "read", 200),
        (
            Method::GET,
            "/workflow/w/versions".into(),
            None,
            "read",
            200,
        ),
        (
            Method::GET,
            "/workflows?pageNumber=1&pageSize=10".into(),
            None,
            "read",
            200,
        ),
        (Method::GET, "/schedules".into(), None, "read", 200),
        (Method::GET, "/metrics".into(), None, "read", 200),
        (Method::GET, "/audit".into(), None, "admin", 200),
        (Method::GET, "/openapi.json".into(), None, "read", 200),
        (
            Method::POST,
            "/serviceRequest/w".into(),
            Some(json!({})),
            "operate",
            200,
        ),
        (
            Method::POST,
            format!("/serviceRequest/{fresh}/cancel"),
            Some(json!({})),
            "operate",
            200,
        ),
        (
            Method::POST,
            format!("/serviceRequest/{failed}/retry"),
            Some(json!({})),
            "operate",
            200,
        ),
        (
            Method::POST,
            format!("/serviceRequest/{id}/rerun"),
            Some(json!({})),
            "operate",
            200,
        ),
        (
            Method::POST,
            "/serviceRequests/retry".into(),
            Some(json!({"workflow": "none"})),
            "operate",
            200,
        ),
        (
            Method::POST,
            "/stepResponse".into(),
            Some(json!({"serviceRequestId": id, "stepId": 1, "response": {}})),
            "operate",
            409,
        ),
        (
            Method::POST,
            "/events/ok".into(),
            Some(json!({"key": "k", "payload": {}})),
            "operate",
            200,
        ),
        (
            Method::POST,
            "/workflow".into(),
            Some(wf.clone()),
            "admin",
            200,
        ),
        (Method::PUT, "/workflow/w2".into(), Some(wf), "admin", 200),
        (
            Method::POST,
            "/schedules".into(),
            Some(sched.clone()),
            "admin",
            201,
        ),
        (
            Method::PUT,
            "/schedules/s1".into(),
            Some(sched),
            "admin",
            200,
        ),
        (
            Method::POST,
            "/schedules/s1/pause".into(),
            None,
            "admin",
            200,
        ),
        (
            Method::POST,
            "/schedules/s1/resume".into(),
            None,
            "admin",
            200,
        ),
        (
            Method::POST,
            "/schedules/s1/trigger".into(),
            None,
            "admin",
            200,
        ),
        (Method::DELETE, "/schedules/s1".into(), None, "admin", 204),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_against_every_route() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let (s, dir) = with_tokens_file(
        &db,
        &format!("# roles\ndash:read:{READ}\noncall:operate:{OPERATE}\nops:admin:{ADMIN}\n"),
    )
    .await;
    let step = |path: &str| json!({"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url(path)}});
    for (name, path) in [
        ("w", "/api/echo"),
        ("bad", "/status/500"),
        ("slow", "/held"),
    ] {
        let def = json!({"name": name, "steps": [step(path)]});
        let r = as_role(&s, ADMIN, Method::POST, "/workflow", Some(def)).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let create = |wf: &'static str| {
        let s = &s;
        async move {
            let r = as_role(
                s,
                OPERATE,
                Method::POST,
                &format!("/serviceRequest/{wf}"),
                Some(json!({})),
            )
            .await;
            assert_eq!(r.status, 200, "{}", r.text());
            r.json()["serviceRequestId"].as_str().unwrap().to_string()
        }
    };
    let auth = format!("Bearer {ADMIN}");
    let headers = [("authorization", auth.as_str())];
    for (who, token, rank) in [("dash", READ, 0), ("oncall", OPERATE, 1), ("ops", ADMIN, 2)] {
        let id = create("w").await;
        let failed = create("bad").await;
        let fresh = create("slow").await;
        wait_status_at(s.addr, &id, &["COMPLETED"], WAIT, &headers).await;
        wait_status_at(s.addr, &failed, &["FAILED"], WAIT, &headers).await;
        if rank < 2 {
            // The schedule routes need one to act on.
            let r = as_role(
                &s,
                ADMIN,
                Method::POST,
                "/schedules",
                Some(json!({"name": "s1", "workflow": "w", "every": "1h", "paused": true})),
            )
            .await;
            assert!(r.status == 201 || r.status == 409, "{}", r.text());
        } else {
            let _ = as_role(&s, ADMIN, Method::DELETE, "/schedules/s1", None).await;
        }
        for (method, path, body, needs, ok) in routes(&id, &failed, &fresh) {
            let need = ["read", "operate", "admin"]
                .iter()
                .position(|r| *r == needs)
                .unwrap();
            let r = as_role(&s, token, method.clone(), &path, body).await;
            if rank < need {
                assert_eq!(r.status, 403, "{who} {method} {path}: {}", r.text());
                let msg = r.json()["message"].as_str().unwrap().to_string();
                assert!(
                    msg.contains(&format!("needs the {needs} role"))
                        && msg.contains(&format!("'{who}'")),
                    "{msg}"
                );
            } else {
                assert_eq!(r.status, ok, "{who} {method} {path}: {}", r.text());
            }
        }
    }
    // No token, or one not accepted: 401 whatever the route.
    let r = send(s.addr, Method::GET, "/workflows", None, &[]).await;
    assert_eq!(r.status, 401);
    let r = as_role(
        &s,
        "not-a-token-0123456789",
        Method::GET,
        "/workflows",
        None,
    )
    .await;
    assert_eq!(r.status, 401);
    s.shutdown().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_offers_a_read_token_no_action_and_refuses_its_posts() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let (s, dir) = with_tokens_file(&db, &format!("dash:read:{READ}\nops:admin:{ADMIN}\n")).await;
    let mut wait = json!({"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/accepted")}});
    wait["type"] = json!("ASYNC");
    let r = as_role(
        &s,
        ADMIN,
        Method::POST,
        "/workflow",
        Some(json!({"name": "w", "steps": [wait]})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = as_role(
        &s,
        ADMIN,
        Method::POST,
        "/serviceRequest/w",
        Some(json!({})),
    )
    .await;
    let id = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    let auth = format!("Bearer {ADMIN}");
    wait_status_at(s.addr, &id, &["PAUSED"], WAIT, &[("authorization", &auth)]).await;
    let page = |token: &'static str| {
        let s = &s;
        let id = id.clone();
        async move {
            as_role(
                s,
                token,
                Method::GET,
                &format!("/console/serviceRequests/{id}"),
                None,
            )
            .await
            .text()
        }
    };
    let admin = page(ADMIN).await;
    assert!(admin.contains("/cancel\""), "{admin}");
    let read = page(READ).await;
    assert!(read.contains(&id), "{read}");
    for action in ["/cancel\"", "/retry\"", "/rerun\"", "/event\""] {
        assert!(!read.contains(action), "{action} offered to read: {read}");
    }
    // A post made by hand is refused all the same, before anything is done.
    let csrf = "0123456789abcdef0123456789abcdef";
    let r = send(
        s.addr,
        Method::POST,
        &format!("/console/serviceRequests/{id}/cancel"),
        Some(format!("csrf={csrf}&reason=x").into_bytes()),
        &[
            ("authorization", &format!("Bearer {READ}")),
            ("cookie", &format!("clamp_csrf={csrf}")),
            ("content-type", "application/x-www-form-urlencoded"),
        ],
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.text().contains("needs the operate role"), "{}", r.text());
    let v = wait_status_at(s.addr, &id, &["PAUSED"], WAIT, &[("authorization", &auth)]).await;
    assert_eq!(v["status"], "PAUSED");
    s.shutdown().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hangup_reads_the_tokens_file_again() {
    let db = TestDb::new();
    let dir = scratch();
    let file = tokens_file(&dir, &format!("dash:read:{READ}\n"));
    let port = free_port();
    // Its logs are read at the end (warnings and errors only: the pipe never fills).
    let server = Spawned(
        Command::new(env!("CARGO_BIN_EXE_clamp"))
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--database-url", &db.url, "--threads", "1"])
            .args(["--tokens-file", file.to_str().unwrap()])
            .env_remove("CLAMP_API_TOKENS")
            .env("LOG_LEVEL", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    wait_healthy(port).await;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let get = |token: &'static str| async move {
        send(
            addr,
            Method::GET,
            "/schedules",
            None,
            &[("authorization", &format!("Bearer {token}"))],
        )
        .await
        .status
    };
    assert_eq!(get(READ).await, 200);
    assert_eq!(get(OPERATE).await, 401);
    std::fs::write(&file, format!("oncall:operate:{OPERATE}\n")).unwrap();
    let pid = server.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
    wait_for_seen("the new token to be accepted", WAIT, || async {
        let (new, old) = (get(OPERATE).await, get(READ).await);
        (new == 200 && old == 401)
            .then_some(())
            .ok_or(format!("{new} {old}"))
    })
    .await;
    // A file that does not parse leaves the tokens in force.
    std::fs::write(&file, "oncall:root:nope\n").unwrap();
    assert!(Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(get(OPERATE).await, 200);
    // An emptied file (a mistaken `: > tokens` during a rotation) would turn tokens off:
    // it is refused too, and nothing is served without a token afterwards.
    for emptied in ["", "# rotating\n"] {
        std::fs::write(&file, emptied).unwrap();
        assert!(Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success());
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(get(OPERATE).await, 200, "the token in force stays");
        let anyone = send(addr, Method::GET, "/audit", None, &[]).await;
        assert_eq!(anyone.status, 401, "{}", anyone.text());
        let define = send(
            addr,
            Method::POST,
            "/workflow",
            Some(br#"{"name":"open","steps":[]}"#.to_vec()),
            &[],
        )
        .await;
        assert_eq!(define.status, 401, "{}", define.text());
    }
    let logs = logs_of(server);
    assert!(
        logs.contains("would turn authentication off"),
        "the refusal is logged: {logs}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_trail_lists_changes_with_the_tokens_name() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let (s, dir) = with_tokens_file(
        &db,
        &format!("dash:read:{READ}\noncall:operate:{OPERATE}\nops:admin:{ADMIN}\n"),
    )
    .await;
    let def = json!({"name": "pay", "steps": [{"name": "a", "mode": "HTTP",
        "val": {"method": "POST", "url": d.url("/until-fixed")}}]});
    let r = as_role(&s, ADMIN, Method::POST, "/workflow", Some(def)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = as_role(
        &s,
        OPERATE,
        Method::POST,
        "/serviceRequest/pay",
        Some(json!({})),
    )
    .await;
    let id = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    let auth = format!("Bearer {ADMIN}");
    wait_status_at(s.addr, &id, &["FAILED"], WAIT, &[("authorization", &auth)]).await;
    d.fix();
    let r = as_role(
        &s,
        OPERATE,
        Method::POST,
        &format!("/serviceRequest/{id}/retry"),
        None,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = as_role(
        &s,
        READ,
        Method::POST,
        &format!("/serviceRequest/{id}/cancel"),
        None,
    )
    .await;
    assert_eq!(r.status, 403);
    // Creates and reads are traffic, not changes: not in the trail.
    let r = as_role(&s, OPERATE, Method::GET, "/audit", None).await;
    assert_eq!(r.status, 403, "the trail is for admins: {}", r.text());
    let v = as_role(&s, ADMIN, Method::GET, "/audit", None).await.json();
    let rows: Vec<(String, String, String, String)> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["actor"].as_str().unwrap().to_string(),
                e["action"].as_str().unwrap().to_string(),
                e["target"].as_str().unwrap().to_string(),
                e["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(rows.len(), 3, "{rows:?}");
    // Newest first.
    assert_eq!(rows[0].0, "dash");
    assert_eq!(
        (rows[0].1.as_str(), rows[0].2.as_str()),
        ("cancel", id.as_str())
    );
    assert!(
        rows[0].3.starts_with("403: this needs the operate role"),
        "{rows:?}"
    );
    assert_eq!(
        rows[1],
        ("oncall".into(), "retry".into(), id.clone(), "ok".into())
    );
    assert_eq!(
        rows[2],
        (
            "ops".into(),
            "define workflow".into(),
            "pay".into(),
            "ok".into()
        )
    );
    let text = serde_json::to_string(&v).unwrap();
    for token in [READ, OPERATE, ADMIN] {
        assert!(!text.contains(token), "a token in the trail: {text}");
    }
    assert!(v["entries"][0]["at"].is_string(), "{v}");
    s.shutdown().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

//! The console (`/console`, beyond Clamp): HTML pages with a strict policy, user data
//! shown as text, token sign-in once per browser session, actions refused unless they
//! come from the console's own forms; and, in a real headless browser (chromium driven
//! by Selenium, `tests/browser/console.py`), every page for real requests (completed,
//! failed after retries, paused, waiting to retry, holding markup), with a cancel, a
//! retry and a rerun performed in the page. `GET /serviceRequestCounts` beside it.

use std::process::Command;
use std::time::Duration;

use hyper::Method;
use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::support::*;

const TOKEN: &str = "console-token-0123456789abcdef";
const WAIT: Duration = Duration::from_secs(20);
const XSS: &str = "<img src=x onerror=window.xssRan=1><script>window.xssRan=1</script>";

/// A request with the token.
async fn call(s: &TestServer, method: Method, path: &str, body: Option<&str>) -> Resp {
    let auth = format!("Bearer {TOKEN}");
    send(
        s.addr,
        method,
        path,
        body.map(|b| b.as_bytes().to_vec()),
        &[("authorization", &auth)],
    )
    .await
}

async fn create(s: &TestServer, workflow: &str, payload: &Value) -> String {
    create_with(s, workflow, payload, &[]).await
}

async fn create_with(
    s: &TestServer,
    workflow: &str,
    payload: &Value,
    headers: &[(&str, &str)],
) -> String {
    let auth = format!("Bearer {TOKEN}");
    let mut h = vec![("authorization", auth.as_str())];
    h.extend_from_slice(headers);
    let r = send(
        s.addr,
        Method::POST,
        &format!("/serviceRequest/{workflow}"),
        Some(payload.to_string().into_bytes()),
        &h,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["serviceRequestId"].as_str().unwrap().to_string()
}

/// `wait_status` with the token (the API asks for it here).
async fn wait_status_with_token(s: &TestServer, id: &str, want: &[&str]) -> Value {
    let auth = format!("Bearer {TOKEN}");
    wait_status_at(s.addr, id, want, WAIT, &[("authorization", &auth)]).await
}

fn workflows(d: &Downstream) -> Vec<Value> {
    let step = |name: &str, path: &str| json!({"name": name, "mode": "HTTP", "val": {"method": "POST", "url": d.url(path)}});
    let mut flaky = step("charge", "/status/503");
    flaky["retry"] = json!({"maxAttempts": 3, "initialIntervalMs": 20});
    let mut later = step("charge", "/status/503");
    later["retry"] = json!({"maxAttempts": 5, "initialIntervalMs": 600000});
    let mut wait = step("approve", "/api/accepted");
    wait["type"] = json!("ASYNC");
    vec![
        json!({"name": "claims", "description": format!("claims {XSS}"),
               "steps": [step("validate", "/api/echo"), step("pay", "/until-fixed")]}),
        json!({"name": "orders", "description": "orders",
               "steps": [step("reserve", "/api/echo"), step("ship", "/api/echo")]}),
        json!({"name": "flaky", "description": "fails after retries", "steps": [flaky]}),
        json!({"name": "later", "description": "retries in ten minutes", "steps": [later]}),
        json!({"name": "approval", "description": "waits for a response", "steps": [wait]}),
    ]
}

/// A server with tokens on, its workflows, and the requests the browser looks at.
async fn scene(d: &Downstream, db: &TestDb) -> (TestServer, Value) {
    let mut cfg = config(&db.url);
    cfg.api_tokens = clamp::tokens::ApiTokens::from_list(&[TOKEN]);
    let s = TestServer::start(cfg).await;
    for w in workflows(d) {
        let r = call(&s, Method::POST, "/workflow", Some(&w.to_string())).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let completed = create(&s, "orders", &json!({"order": 1})).await;
    let fixable = create(&s, "claims", &json!({"claim": 1})).await;
    let xss = create_with(&s, "claims", &json!({"note": XSS}), &[("x-note", XSS)]).await;
    let failed_after_retries = create(&s, "flaky", &json!({})).await;
    let retry_pending = create(&s, "later", &json!({})).await;
    let paused = create(&s, "approval", &json!({})).await;
    wait_status_with_token(&s, &completed, &["COMPLETED"]).await;
    wait_status_with_token(&s, &fixable, &["FAILED"]).await;
    wait_status_with_token(&s, &xss, &["FAILED"]).await;
    wait_status_with_token(&s, &failed_after_retries, &["FAILED"]).await;
    wait_status_with_token(&s, &paused, &["PAUSED"]).await;
    wait_for_seen(
        &format!("a pending retry of {retry_pending}"),
        WAIT,
        || async {
            let v = call(
                &s,
                Method::GET,
                &format!("/serviceRequest/{retry_pending}"),
                None,
            )
            .await
            .json();
            v.get("retrying").map(|_| ()).ok_or(v)
        },
    )
    .await;
    let ids = json!({
        "completed": completed, "fixable": fixable, "xss": xss,
        "failed_after_retries": failed_after_retries, "retry_pending": retry_pending,
        "paused": paused,
    });
    (s, ids)
}

fn python() -> String {
    let dir = std::env::var("CLAMP_PY_TOOLS")
        .unwrap_or_else(|_| format!("{}/target/py-tools", env!("CARGO_MANIFEST_DIR")));
    let path = format!("{dir}/bin/python");
    assert!(
        std::path::Path::new(&path).exists(),
        "{path} is missing: run scripts/services.sh py-tools (scripts/test.sh does)"
    );
    for tool in ["chromium", "chromedriver"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            found,
            "{tool} is missing: run scripts/services.sh browser (scripts/test.sh does)"
        );
    }
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_works_in_a_real_browser() {
    let python = python();
    let db = TestDb::new();
    let d = Downstream::start().await;
    let (s, ids) = scene(&d, &db).await;
    // The claims downstream is fixed now: the retry in the page goes through.
    d.fix();
    // CLAMP_CONSOLE_SHOTS=docs/console keeps the screenshots (docs/operating.md's come from here).
    let shots = std::env::var("CLAMP_CONSOLE_SHOTS")
        .unwrap_or_else(|_| format!("{}/console-shots", std::env::temp_dir().display()));
    std::fs::create_dir_all(&shots).unwrap();
    let args = json!({
        "base": format!("http://127.0.0.1:{}", s.addr.port()),
        "token": TOKEN, "ids": ids, "workflow": "claims", "shots": shots,
    });
    let script = format!("{}/tests/browser/console.py", env!("CARGO_MANIFEST_DIR"));
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(script)
            .arg(args.to_string())
            .output()
            .expect("the browser script runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the console failed in the browser:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // What the page did, seen through the API.
    let id = |k: &str| ids[k].as_str().unwrap().to_string();
    let v = wait_status_with_token(&s, &id("paused"), &["CANCELLED"]).await;
    assert!(v["reason"].as_str().unwrap().contains("<b>now</b>"), "{v}");
    let v = wait_status_with_token(&s, &id("fixable"), &["COMPLETED"]).await;
    assert_eq!(v["retries"], 1);
    assert_eq!(d.calls_for_key(&format!("{}:1", id("fixable"))), 1);
    let last: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let rerun = last["rerun"].as_str().unwrap();
    let v = wait_status_with_token(&s, rerun, &["COMPLETED"]).await;
    assert_eq!(v["rerunOf"], id("completed").as_str());
    assert_eq!(d.calls_for_key(&format!("{rerun}:1")), 0);
    assert_eq!(d.calls_for_key(&format!("{rerun}:2")), 1);
    s.shutdown().await;
}

/// The cookie pair of a `Set-Cookie` header (`name=value`).
fn set_cookie(r: &Resp, name: &str) -> String {
    r.headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with(&format!("{name}=")))
        .map(|v| v.split(';').next().unwrap().to_string())
        .unwrap_or_else(|| panic!("no {name} cookie in {:?}", r.headers))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_asks_for_a_token_and_refuses_forged_actions() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let (s, ids) = scene(&d, &db).await;
    let paused = ids["paused"].as_str().unwrap();
    let host = s.addr.to_string();
    let get = |path: String, headers: Vec<(&'static str, String)>| {
        let addr = s.addr;
        async move {
            let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            send(addr, Method::GET, &path, None, &h).await
        }
    };
    // Not signed in: sent to sign in, and told where it was going.
    let r = get("/console/workflows".into(), vec![]).await;
    assert_eq!(r.status, 303);
    assert_eq!(
        r.headers["location"],
        "/console/login?next=%2Fconsole%2Fworkflows"
    );
    let login = get("/console/login".into(), vec![]).await;
    assert_eq!(login.status, 200);
    let csrf = set_cookie(&login, "clamp_csrf");
    let csrf_value = csrf.split('=').nth(1).unwrap().to_string();
    assert!(login.text().contains(&format!("value=\"{csrf_value}\"")));
    let post = |path: String, body: String, headers: Vec<(&'static str, String)>| {
        let addr = s.addr;
        async move {
            let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            send(addr, Method::POST, &path, Some(body.into_bytes()), &h).await
        }
    };
    let form = |pairs: &[(&str, &str)]| {
        form_urlencoded::Serializer::new(String::new())
            .extend_pairs(pairs)
            .finish()
    };
    let wrong = post(
        "/console/login".into(),
        form(&[("csrf", &csrf_value), ("token", "guess")]),
        vec![("cookie", csrf.clone())],
    )
    .await;
    assert_eq!(wrong.status, 401);
    let ok = post(
        "/console/login?next=%2Fconsole%2Fworkflows".into(),
        form(&[("csrf", &csrf_value), ("token", TOKEN)]),
        vec![("cookie", csrf.clone())],
    )
    .await;
    assert_eq!(ok.status, 303, "{}", ok.text());
    assert_eq!(ok.headers["location"], "/console/workflows");
    let session = set_cookie(&ok, "clamp_console");
    assert!(!session.contains(TOKEN));
    let cookies = format!("{session}; {csrf}");

    // Signed in: pages are HTML under a policy that runs no script.
    for path in [
        "/console".to_string(),
        "/console/workflows".into(),
        "/console/workflows/claims".into(),
        format!("/console/serviceRequests/{}", ids["xss"].as_str().unwrap()),
    ] {
        let r = get(path.clone(), vec![("cookie", cookies.clone())]).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(r.headers["content-type"], "text/html; charset=utf-8");
        let csp = r.headers["content-security-policy"].to_str().unwrap();
        assert!(
            csp.contains("default-src 'none'") && !csp.contains("script-src"),
            "{csp}"
        );
        let html = r.text();
        assert!(
            !html.contains("<img src=x") && !html.contains("<script>window"),
            "{path}"
        );
    }
    let page = get(
        format!("/console/serviceRequests/{}", ids["xss"].as_str().unwrap()),
        vec![("cookie", cookies.clone())],
    )
    .await
    .text();
    assert!(
        page.contains("&lt;img src=x onerror=window.xssRan=1&gt;"),
        "{page}"
    );

    // Forged actions change nothing: no form value, another origin, another site.
    let cancel = format!("/console/serviceRequests/{paused}/cancel");
    let origin = format!("http://{host}");
    for (body, headers) in [
        (form(&[("reason", "x")]), vec![("cookie", cookies.clone())]),
        (
            form(&[("csrf", "0123456789abcdef0123456789abcdef")]),
            vec![("cookie", cookies.clone())],
        ),
        (
            form(&[("csrf", &csrf_value)]),
            vec![
                ("cookie", cookies.clone()),
                ("origin", "http://evil.example".into()),
            ],
        ),
        (
            form(&[("csrf", &csrf_value)]),
            vec![
                ("cookie", cookies.clone()),
                ("sec-fetch-site", "cross-site".into()),
            ],
        ),
        (
            form(&[("csrf", &csrf_value)]),
            vec![("cookie", csrf.clone())],
        ),
    ] {
        let r = post(cancel.clone(), body, headers).await;
        assert!(
            matches!(r.status.as_u16(), 401 | 403),
            "{}: {}",
            r.status,
            r.text()
        );
    }
    let v = call(&s, Method::GET, &format!("/serviceRequest/{paused}"), None)
        .await
        .json();
    assert_eq!(v["status"], "PAUSED", "{v}");
    // The console's own form goes through.
    let r = post(
        cancel,
        form(&[("csrf", &csrf_value), ("reason", "from the console")]),
        vec![
            ("cookie", cookies.clone()),
            ("origin", origin),
            ("sec-fetch-site", "same-origin".into()),
        ],
    )
    .await;
    assert_eq!(r.status, 303, "{}", r.text());
    assert!(r.headers["location"].to_str().unwrap().contains("done="));
    wait_status_with_token(&s, paused, &["CANCELLED"]).await;
    // The operation recorded itself, as the API's would: once, done; the forged posts
    // never became an operation, so they are not in the trail.
    let trail = call(&s, Method::GET, "/audit", None).await.json();
    let cancels: Vec<&Value> = trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "cancel")
        .collect();
    assert_eq!(cancels.len(), 1, "{trail}");
    assert_eq!(cancels[0]["target"], paused, "{trail}");
    assert_eq!(cancels[0]["outcome"], "ok", "{trail}");
    // Cancelling a finished request from the console: the same operation, refused, and
    // recorded with the status and message the API answers.
    let finished = ids["completed"].as_str().unwrap();
    let again = post(
        format!("/console/serviceRequests/{finished}/cancel"),
        form(&[("csrf", &csrf_value)]),
        vec![("cookie", cookies.clone())],
    )
    .await;
    let trail = call(&s, Method::GET, "/audit?limit=1", None).await.json();
    let last = &trail["entries"][0];
    assert_eq!(last["action"], "cancel", "{trail}");
    assert_eq!(last["target"], finished, "{trail}");
    let outcome = last["outcome"].as_str().unwrap();
    assert!(
        again.status == 409 && outcome.starts_with("409: "),
        "{}: {trail}",
        again.status
    );
    // Signing out ends it.
    let out = post(
        "/console/logout".into(),
        form(&[("csrf", &csrf_value)]),
        vec![("cookie", cookies.clone())],
    )
    .await;
    assert_eq!(out.status, 303);
    assert!(out.headers["set-cookie"]
        .to_str()
        .unwrap()
        .contains("Max-Age=0"));
    // On the server too: the old cookie is no longer a session.
    let r = get(
        "/console/workflows".into(),
        vec![("cookie", cookies.clone())],
    )
    .await;
    assert_eq!(r.status, 303, "{}", r.text());
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_are_by_status_and_minute_in_a_window() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    for w in workflows(&d).into_iter().take(2) {
        s.create_workflow(&w).await;
    }
    let before = chrono::Utc::now() - chrono::Duration::seconds(2);
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(create_request(&s, "orders", &json!({"i": i})).await);
    }
    ids.push(create_request(&s, "claims", &json!({})).await);
    for id in &ids {
        wait_status(&s, id, &["COMPLETED", "FAILED"], WAIT).await;
    }
    let v = s.get("/serviceRequestCounts").await;
    assert_eq!(v.status, 200, "{}", v.text());
    let v = v.json();
    assert_eq!(v["counts"], json!({"COMPLETED": 3, "FAILED": 1}), "{v}");
    let per_minute: i64 = v["perMinute"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["counts"].as_object().unwrap().values())
        .map(|n| n.as_i64().unwrap())
        .sum();
    assert_eq!(per_minute, 4);
    let v = s.get("/serviceRequestCounts?workflow=claims").await.json();
    assert_eq!(v["counts"], json!({"FAILED": 1}));
    let after = before.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let v = s
        .get(&format!("/serviceRequestCounts?createdBefore={after}"))
        .await
        .json();
    assert_eq!(v["counts"], json!({}));
    for (q, field) in [
        (
            "createdAfter=2026-01-01T00:00:00Z&createdBefore=2026-01-03T00:00:00Z",
            "createdBefore:",
        ),
        ("status=FAILED", "status:"),
        ("createdAfter=soon", "createdAfter:"),
    ] {
        let why = s
            .get(&format!("/serviceRequestCounts?{q}"))
            .await
            .expect_error(400);
        assert!(why.starts_with(field), "{q}: {why}");
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_pages_newest_first() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&workflows(&d)[1]).await;
    let mut ids = Vec::new();
    for i in 0..55 {
        ids.push(create_request(&s, "orders", &json!({"i": i})).await);
    }
    let first = s.get("/console?workflow=orders").await;
    assert_eq!(first.status, 200);
    let html = first.text();
    // Newest first: the last created is on the first page, the first created is not.
    assert!(html.contains(&ids[54]) && !html.contains(&ids[0]));
    let older = html
        .split("href=\"")
        .filter_map(|h| h.split('"').next())
        .find(|h| h.contains("cursor="))
        .expect("a link to older requests")
        .replace("&amp;", "&");
    let second = s.get(&older).await.text();
    for id in &ids[..5] {
        assert!(second.contains(id.as_str()), "{older}");
    }
    assert!(!second.contains(&ids[54]));
    // A filter the API refuses is shown, not a crash.
    let bad = s.get("/console?status=SOMETIMES").await;
    assert_eq!(bad.status, 400);
    assert!(bad
        .text()
        .contains("status: &quot;SOMETIMES&quot; is not a status"));
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schedules_page_shows_next_fires_and_runs_and_acts_through_its_forms() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&workflows(&d)[1]).await;
    let r = s
        .post_json(
            "/schedules",
            &json!({"name": "<b>nightly", "workflow": "orders", "cron": "0 30 2 * * *",
                    "timezone": "Europe/Berlin"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let page = s.get("/console/schedules").await;
    assert_eq!(page.status, 200, "{}", page.text());
    let csrf = page
        .headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("clamp_csrf="))
        .map(|v| v.split(';').next().unwrap().to_string())
        .expect("a csrf cookie");
    let html = page.text();
    assert!(html.contains("&lt;b&gt;nightly") && !html.contains("<b>nightly"));
    assert!(
        html.contains("T02:30:00+0") || html.contains("T03:00:00+02:00"),
        "{html}"
    );
    let action = "/console/schedules/%3Cb%3Enightly/trigger";
    assert!(html.contains(action), "{html}");
    // Run now through the form: the request starts, and the page shows it.
    let token = csrf.split('=').nth(1).unwrap().to_string();
    let post = |path: &'static str, csrf_field: String| {
        let (addr, cookie) = (s.addr, csrf.clone());
        async move {
            let body = format!("csrf={csrf_field}").into_bytes();
            send(addr, Method::POST, path, Some(body), &[("cookie", &cookie)]).await
        }
    };
    let forged = post(action, "wrong".into()).await;
    assert_eq!(forged.status, 403);
    let done = post(action, token.clone()).await;
    assert_eq!(done.status, 303, "{}", done.text());
    let to = done.headers["location"].to_str().unwrap().to_string();
    assert!(to.starts_with("/console/schedules?done="), "{to}");
    let runs = db.count("SELECT count(*) FROM schedule_fires").await;
    assert_eq!(runs, 1);
    let after = s.get(&to).await.text();
    assert!(after.contains("started"), "{after}");
    assert!(after.contains("/console/serviceRequests/"), "{after}");
    // Pause, then the page offers resume and shows no next fires.
    let paused = post("/console/schedules/%3Cb%3Enightly/pause", token).await;
    assert_eq!(paused.status, 303);
    let html = s.get("/console/schedules").await.text();
    assert!(
        html.contains("none while paused") && html.contains("Resume"),
        "{html}"
    );
    s.shutdown().await;
}

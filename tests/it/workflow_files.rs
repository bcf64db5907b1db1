//! `clamp workflows apply|export` (definitions kept as files), run as the binary is run:
//! every file validated before any is applied; created, versioned or unchanged per file;
//! re-applying and applying an export change nothing; through a server or the database.

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use crate::support::*;

fn clamp(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_clamp"))
        .arg("workflows")
        .args(args)
        .output()
        .expect("clamp runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn write(dir: &Path, file: &str, v: &Value) {
    std::fs::write(dir.join(file), serde_json::to_string_pretty(v).unwrap()).unwrap();
}

fn def(name: &str, url: &str) -> Value {
    json!({"name": name, "description": format!("{name} from a file"),
           "steps": [{"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": url}}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_validates_everything_first_then_creates_versions_or_leaves_alone() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    let url = format!("http://{}", s.addr);
    let dir = tempdir("apply");
    write(
        &dir,
        "claims.json",
        &def("claims", "http://127.0.0.1:9/claims"),
    );
    write(
        &dir,
        "refunds.json",
        &def("refunds", "http://127.0.0.1:9/refunds"),
    );
    write(&dir, "broken.json", &json!({"name": "broken", "steps": []}));
    std::fs::write(dir.join("notes.txt"), "not a definition").unwrap();
    let d = dir.to_str().unwrap();

    let (code, out, err) = clamp(&["apply", "--url", &url, d]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("broken.json: error: steps is required"),
        "{err}"
    );
    assert!(err.contains("nothing applied"), "{err}");
    s.get("/workflow/claims").await.expect_error(404);

    std::fs::remove_file(dir.join("broken.json")).unwrap();
    let (code, out, err) = clamp(&["apply", "--url", &url, d]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("claims.json: created (version 1)"), "{out}");
    assert!(out.contains("refunds.json: created (version 1)"), "{out}");

    let (code, out, _) = clamp(&["apply", "--url", &url, d]);
    assert_eq!(code, 0);
    assert_eq!(out.matches("unchanged (version 1)").count(), 2, "{out}");

    write(
        &dir,
        "refunds.json",
        &def("refunds", "http://127.0.0.1:9/refunds-v2"),
    );
    let (_, out, _) = clamp(&["apply", "--dry-run", "--url", &url, d]);
    assert!(
        out.contains("refunds.json: would become version 2"),
        "{out}"
    );
    assert_eq!(s.get("/workflow/refunds").await.json()["version"], 1);
    let (code, out, _) = clamp(&["apply", "--url", &url, d]);
    assert_eq!(code, 0);
    assert!(out.contains("refunds.json: new version 2"), "{out}");
    assert!(out.contains("claims.json: unchanged (version 1)"), "{out}");
    let v = s.get("/workflow/refunds").await.json();
    assert_eq!(v["steps"][0]["val"]["url"], "http://127.0.0.1:9/refunds-v2");

    // An export, applied again (here straight to the database), changes nothing.
    let out_dir = tempdir("export");
    let (code, out, err) = clamp(&["export", "--url", &url, out_dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let exported: Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("refunds.json")).unwrap()).unwrap();
    assert_eq!(exported.get("version"), None);
    assert_eq!(
        exported["steps"][0]["val"]["url"],
        "http://127.0.0.1:9/refunds-v2"
    );
    let (code, out, err) = clamp(&[
        "apply",
        "--database-url",
        &db.url,
        out_dir.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("claims.json: unchanged (version 1)"), "{out}");
    assert!(out.contains("refunds.json: unchanged (version 2)"), "{out}");
    // A circle among the files (or with stored workflows), or an unknown one, applies
    // nothing, through either target.
    let circle = tempdir("circle");
    let sub = |n: &str, to: &str| json!({"name": n, "steps": [{"name": "s", "mode": "WORKFLOW", "val": {"workflow": to}}]});
    write(&circle, "x.json", &sub("x", "y"));
    write(&circle, "y.json", &sub("y", "x"));
    for target in [["--url", url.as_str()], ["--database-url", db.url.as_str()]] {
        let (code, _, err) = clamp(&["apply", target[0], target[1], circle.to_str().unwrap()]);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains("x → y → x") && err.contains("nothing applied"),
            "{err}"
        );
    }
    write(&circle, "y.json", &sub("y", "nowhere"));
    let (code, _, err) = clamp(&["apply", "--database-url", &db.url, circle.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("includes workflow nowhere"), "{err}");
    s.get("/workflow/x").await.expect_error(404);
    // Included workflows are applied first, whatever their files' order.
    write(&circle, "y.json", &sub("y", "claims"));
    write(&circle, "x.json", &sub("x", "y"));
    let (code, out, err) = clamp(&["apply", "--url", &url, circle.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.find("y.json").unwrap() < out.find("x.json").unwrap(),
        "{out}"
    );
    // Two files with one name are refused.
    write(
        &out_dir,
        "copy.json",
        &def("claims", "http://127.0.0.1:9/other"),
    );
    let (code, _, err) = clamp(&["apply", "--url", &url, out_dir.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("is defined in"), "{err}");
    s.shutdown().await;
}

fn tempdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("clamp-files-{tag}-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Definitions with the steps beyond Clamp (PARALLEL with a WORKFLOW branch, MAP over a
/// child workflow, WAIT, EVENT, an ASYNC step's answerTimeout) apply from files, re-apply
/// as unchanged, and export to files that apply as unchanged too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_with_fan_outs_waits_and_events_apply_and_reapply_unchanged() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    let url = format!("http://{}", s.addr);
    let dir = tempdir("beyond");
    write(&dir, "leaf.json", &def("leaf", "http://127.0.0.1:9/leaf"));
    let http = |name: &str| json!({"name": name, "mode": "HTTP", "val": {"method": "POST", "url": "http://127.0.0.1:9/x"}});
    let mut ask = http("ask");
    ask["type"] = json!("ASYNC");
    ask["answerTimeout"] = json!("PT30M");
    write(
        &dir,
        "orders.json",
        &json!({"name": "orders", "description": "beyond Clamp", "steps": [
            ask,
            {"name": "both", "mode": "PARALLEL", "val": {"branches": [
                {"name": "a", "steps": [http("a1")]},
                {"name": "b", "steps": [{"name": "child", "mode": "WORKFLOW", "val": {"workflow": "leaf"}}]}]}},
            {"name": "lines", "mode": "MAP", "val": {"items": "ask.response.lines", "workflow": "leaf", "maxConcurrency": 4}},
            {"name": "cool", "mode": "WAIT", "val": {"duration": "PT10M"}},
            {"name": "approval", "mode": "EVENT", "val": {"event": "order.approved", "key": "ask.request.id", "timeout": "P3D"}}]}),
    );
    let d = dir.to_str().unwrap();
    let (code, out, err) = clamp(&["apply", "--url", &url, d]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("orders.json: created (version 1)"), "{out}");
    let (code, out, err) = clamp(&["apply", "--url", &url, d]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.matches("unchanged (version 1)").count(), 2, "{out}");
    let served = s.get("/workflow/orders").await.json();
    assert_eq!(served["steps"][0]["answerTimeout"], "PT30M", "{served}");
    assert_eq!(served["steps"][4]["type"], "ASYNC", "{served}");

    let exported = tempdir("beyond-export");
    let e = exported.to_str().unwrap();
    let (code, out, err) = clamp(&["export", "--url", &url, e]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = clamp(&["apply", "--url", &url, e]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.matches("unchanged (version 1)").count(), 2, "{out}");
    s.shutdown().await;
}

/// `clamp workflows …` with extra environment (the server's settings).
fn clamp_with_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_clamp"))
        .arg("workflows")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("clamp runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_through_the_database_refuses_what_the_api_refuses() {
    let db = TestDb::new();
    let secrets = tempdir("apply-secrets");
    std::fs::write(secrets.join("PAY_KEY"), "k").unwrap();
    // The server's settings, as the API has them, in the environment apply reads.
    let env = [
        ("CLAMP_DENY_DESTINATIONS", "10.0.0.0/8"),
        ("CLAMP_SECRETS_DIR", secrets.to_str().unwrap()),
    ];
    let mut cfg = config(&db.url);
    cfg.destinations = std::sync::Arc::new(
        clamp::destinations::Destinations::new::<&str>(&[], &["10.0.0.0/8"]).unwrap(),
    );
    cfg.secrets = std::sync::Arc::new(clamp::secrets::Secrets::new(Some(secrets.clone())));
    let s = TestServer::start(cfg).await;
    let amqp = |name: &str, url: &str| {
        json!({"name": name, "steps": [{"name": "a", "mode": "AMQP",
            "val": {"connection_url": url, "queue_name": "q"}}]})
    };
    let http_header = |name: &str, header: &str| {
        json!({"name": name, "steps": [{"name": "a", "mode": "HTTP",
            "val": {"method": "POST", "url": "http://payments.example/x", "headers": header}}]})
    };
    for (file, def, needle) in [
        (
            "denied.json",
            json!({"name": "denied", "steps": [{"name": "a", "mode": "HTTP",
            "val": {"method": "POST", "url": "http://10.1.2.3/x"}}]}),
            "10.0.0.0/8",
        ),
        (
            "metadata.json",
            amqp("metadata", "amqp://g:g@169.254.169.254:5672/"),
            "169.254",
        ),
        (
            "file.json",
            amqp("file", "amqp://g:{{secret:/etc/hostname}}@rabbit:5672/"),
            "not a secret name",
        ),
        (
            "missing.json",
            http_header("missing", "X-Key:{{secret:NOPE_9}};"),
            "NOPE_9",
        ),
    ] {
        let api = s.post_json("/workflow", &def).await.expect_error(400);
        assert!(api.contains(needle), "the API: {api}");
        let dir = tempdir("apply-refused");
        write(&dir, file, &def);
        let (code, out, err) = clamp_with_env(
            &["apply", "--database-url", &db.url, dir.to_str().unwrap()],
            &env,
        );
        assert_eq!(code, 1, "{file} was applied: {out}{err}");
        assert!(err.contains(needle), "{file}: {err}");
        assert!(err.contains("nothing applied"), "{err}");
    }
    assert_eq!(db.count("SELECT count(*) FROM workflows").await, 0);
    // What the API accepts, apply accepts.
    let dir = tempdir("apply-accepted");
    write(
        &dir,
        "ok.json",
        &http_header("ok", "X-Key:{{secret:PAY_KEY}};"),
    );
    let (code, out, err) = clamp_with_env(
        &["apply", "--database-url", &db.url, dir.to_str().unwrap()],
        &env,
    );
    assert_eq!(code, 0, "{out}{err}");
    s.shutdown().await;
}

/// Through the database, a file is stored by the operations `POST /workflow` and `PUT
/// /workflow/{name}` run: each change is in the audit trail under the command's name, the
/// server sees the versions, and what the operations refuse is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_through_the_database_is_audited_as_the_api_is() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    let dir = tempdir("apply-audited");
    let d = dir.to_str().unwrap();
    let apply = || {
        clamp_with_env(
            &["apply", "--database-url", &db.url, d],
            &[("USER", "ops-bot")],
        )
    };
    write(
        &dir,
        "claims.json",
        &def("claims", "http://127.0.0.1:9/claims"),
    );
    let (code, out, err) = apply();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("claims.json: created (version 1)"), "{out}");
    write(
        &dir,
        "claims.json",
        &def("claims", "http://127.0.0.1:9/claims-v2"),
    );
    let (code, out, err) = apply();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("claims.json: new version 2"), "{out}");
    let (code, out, err) = apply();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("claims.json: unchanged (version 2)"), "{out}");

    let c = db.client().await;
    let rows = c
        .query(
            "SELECT actor, action, target, outcome FROM audit_log ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    let trail: Vec<(String, String, String, String)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let who = "clamp workflows apply (ops-bot)".to_string();
    let entry = |outcome: &str| {
        (
            who.clone(),
            "define workflow".to_string(),
            "claims".to_string(),
            outcome.to_string(),
        )
    };
    assert_eq!(
        trail,
        vec![
            entry("ok"),
            entry("version 2"),
            entry("unchanged (version 2)")
        ]
    );
    // The server reads what was stored as its own.
    let got = s.get("/workflow/claims").await;
    assert_eq!(got.status, 200, "{}", got.text());
    let v2 = got.json();
    assert_eq!(v2["version"], 2, "{v2}");
    s.shutdown().await;
}

/// Triggers are files too: applied after the workflows they start, left alone when
/// unchanged (a pause made meanwhile stays), replaced when changed, through a server or
/// the database (audited as the API is); an export writes them under `triggers/`, and
/// applying it changes nothing; a trigger starting an unknown workflow refuses the lot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triggers_apply_and_export_beside_their_workflows() {
    let db = TestDb::new();
    let secrets = tempdir("apply-trigger-secrets");
    std::fs::write(secrets.join("HOOK"), "hook-key").unwrap();
    let mut cfg = config(&db.url);
    cfg.secrets = std::sync::Arc::new(clamp::secrets::Secrets::new(Some(secrets.clone())));
    let s = TestServer::start(cfg).await;
    let url = format!("http://{}", s.addr);
    let dir = tempdir("apply-triggers");
    let d = dir.to_str().unwrap();
    std::fs::create_dir_all(dir.join("triggers")).unwrap();
    let hook = json!({"name": "orders-hook", "workflow": "orders",
        "source": {"webhook": {"verify": "github", "secret": "{{secret:HOOK}}"}}});
    write(&dir, "triggers/orders-hook.json", &hook);
    write(
        &dir,
        "orders.json",
        &def("orders", "http://127.0.0.1:9/orders"),
    );

    let (code, out, err) = clamp(&["apply", "--url", &url, d]);
    assert_eq!(code, 0, "{out}{err}");
    let created = out.find("orders.json: created (version 1)");
    let hooked = out.find("orders-hook.json: trigger created");
    assert!(created.is_some() && hooked > created, "{out}");
    assert_eq!(s.get("/triggers/orders-hook").await.status, 200);

    // Paused meanwhile: applying the same files leaves it as it is.
    let r = s.post("/triggers/orders-hook/pause", "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let (code, out, err) = clamp(&["apply", "--url", &url, d]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("orders-hook.json: trigger unchanged"), "{out}");
    assert_eq!(s.get("/triggers/orders-hook").await.json()["paused"], true);

    // Changed, through the database: replaced, audited, still paused.
    let mut changed = hook.clone();
    changed["when"] = json!("body.amount > 0");
    write(&dir, "triggers/orders-hook.json", &changed);
    let env = [
        ("CLAMP_SECRETS_DIR", secrets.to_str().unwrap()),
        ("USER", "ops-bot"),
    ];
    let (code, out, err) = clamp_with_env(&["apply", "--database-url", &db.url, d], &env);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("orders-hook.json: trigger replaced"), "{out}");
    let now = s.get("/triggers/orders-hook").await.json();
    assert_eq!(now["when"], "body.amount > 0", "{now}");
    assert_eq!(now["paused"], true, "{now}");
    assert_eq!(
        db.count(
            "SELECT count(*) FROM audit_log WHERE action = 'change trigger' \
             AND actor = 'clamp workflows apply (ops-bot)' AND target = 'orders-hook'"
        )
        .await,
        1
    );

    // An export applied again changes nothing.
    let out_dir = tempdir("export-triggers");
    let (code, out, err) = clamp(&["export", "--url", &url, out_dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let text = std::fs::read_to_string(out_dir.join("triggers/orders-hook.json")).unwrap();
    let exported: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(exported, changed, "{text}");
    let (code, out, err) = clamp(&["apply", "--url", &url, out_dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("orders-hook.json: trigger unchanged"), "{out}");
    assert!(out.contains("orders.json: unchanged (version 1)"), "{out}");

    // A trigger of a workflow known nowhere: nothing applied.
    let bad = tempdir("apply-triggers-bad");
    write(&bad, "a.json", &def("a-new", "http://127.0.0.1:9/a"));
    let mut stray = hook.clone();
    stray["name"] = json!("stray");
    stray["workflow"] = json!("nowhere");
    write(&bad, "stray.json", &stray);
    let (code, out, err) = clamp(&["apply", "--url", &url, bad.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("starts workflow nowhere"), "{err}");
    assert!(err.contains("nothing applied"), "{err}");
    assert_eq!(s.get("/workflow/a-new").await.status, 404);
    s.shutdown().await;
}

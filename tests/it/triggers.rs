//! Triggers (beyond Clamp): a webhook verified by its HMAC (GitHub's and Stripe's forms)
//! starts one request per delivery, answered after the commit; a redelivery starts
//! nothing new; a bad signature and a replayed Stripe delivery are 401 and counted; a
//! delivery that can never start a request is dead-lettered and acknowledged; `when`
//! filters, `transform` shapes the payload, `labels` label it; the resource is defined,
//! paused, resumed, replaced and deleted through the audited API.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use hyper::Method;
use serde_json::{json, Value};
use sha2::Sha256;

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(20);
const KEY: &str = "hook-key-0123456789";

fn sign(parts: &[&[u8]]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(KEY.as_bytes()).unwrap();
    for p in parts {
        mac.update(p);
    }
    hex::encode(mac.finalize().into_bytes())
}

/// A server whose secrets directory holds `HOOK` = `KEY`, with workflow `deploy`.
async fn server(db: &TestDb, d: &Downstream) -> TestServer {
    let dir = std::env::temp_dir().join(format!("clamp-secrets-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("HOOK"), format!("{KEY}\n")).unwrap();
    let mut cfg = config(&db.url);
    cfg.secrets = std::sync::Arc::new(clamp::secrets::Secrets::new(Some(dir)));
    let s = TestServer::start(cfg).await;
    s.create_workflow(&json!({"name": "deploy", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}))
        .await;
    s
}

fn github_trigger() -> Value {
    json!({"name": "gh", "workflow": "deploy",
           "source": {"webhook": {"verify": "github", "secret": "{{secret:HOOK}}"}},
           "when": "body.ref == 'refs/heads/main'",
           "transform": {"repo": "body.repository.full_name", "commit": "body.after",
                         "delivery": "key"},
           "labels": {"repo": "body.repository.name"}})
}

async fn github_hook(s: &TestServer, body: &[u8], delivery: &str, signature: &str) -> Resp {
    send(
        s.addr,
        Method::POST,
        "/hooks/gh",
        Some(body.to_vec()),
        &[
            ("X-GitHub-Delivery", delivery),
            ("X-Hub-Signature-256", signature),
            ("Content-Type", "application/json"),
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_github_delivery_starts_one_request_and_a_redelivery_none() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = server(&db, &d).await;
    let r = s.post_json("/triggers", &github_trigger()).await;
    assert_eq!(r.status, 201, "{}", r.text());

    let push = br#"{"ref": "refs/heads/main", "after": "abc123",
                    "repository": {"name": "clamp", "full_name": "acme/clamp"}}"#;
    let sig = format!("sha256={}", sign(&[push]));
    let r = github_hook(&s, push, "d-1", &sig).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let a = r.json();
    assert_eq!(a["started"], true);
    assert_eq!(a["duplicate"], false);
    let id = a["serviceRequestId"].as_str().unwrap().to_string();
    // Answered after the commit: the request is there at once.
    assert_eq!(s.get(&format!("/serviceRequest/{id}")).await.status, 200);
    let done = wait_status(&s, &id, &["COMPLETED"], WAIT).await;
    assert_eq!(
        response_of(&done, "a"),
        json!({"echo": {"repo": "acme/clamp", "commit": "abc123", "delivery": "d-1"}})
    );
    // Labelled by the trigger, and by its own labels.
    let found = s
        .get("/serviceRequests?label=trigger:gh&label=repo:clamp")
        .await
        .json();
    assert_eq!(found["serviceRequests"][0]["id"], id.as_str(), "{found}");

    // The same delivery again: the same request, nothing new.
    let again = github_hook(&s, push, "d-1", &sig).await.json();
    assert_eq!(again["serviceRequestId"], id.as_str());
    assert_eq!(again["duplicate"], true);
    // A bad signature, or none: 401, counted, nothing started.
    let bad = github_hook(&s, push, "d-2", &format!("sha256={}", "00".repeat(32))).await;
    assert!(bad.expect_error(401).contains("signature"));
    let tampered = br#"{"ref": "refs/heads/main", "after": "evil"}"#;
    assert_eq!(github_hook(&s, tampered, "d-3", &sig).await.status, 401);
    // A label that cannot be read (no repository): dead-lettered with the reason.
    let bare = br#"{"ref": "refs/heads/main"}"#;
    let r = github_hook(&s, bare, "d-6", &format!("sha256={}", sign(&[bare]))).await;
    assert_eq!(r.status, 202, "{}", r.text());
    assert!(r.json()["reason"]
        .as_str()
        .unwrap()
        .starts_with("labels.repo"));
    // Filtered by `when`: acknowledged, nothing started.
    let other = br#"{"ref": "refs/heads/dev"}"#;
    let r = github_hook(&s, other, "d-4", &format!("sha256={}", sign(&[other]))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"started": false, "filtered": true}));
    // Signed but not JSON: kept as a dead letter with the reason, and acknowledged.
    let junk = b"not json";
    let r = github_hook(&s, junk, "d-5", &format!("sha256={}", sign(&[junk]))).await;
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.json()["deadLettered"], true);
    let kept = db
        .count("SELECT count(*) FROM dead_letters WHERE source = 'webhook' AND topic = 'gh' AND body = 'not json' AND reason LIKE 'the body is not JSON%'")
        .await;
    assert_eq!(kept, 1);

    assert_eq!(
        db.count("SELECT count(*) FROM service_requests").await,
        1,
        "one request in all"
    );
    let m = s.get("/metrics").await.text();
    let hooks = |o: &str| {
        metric(
            &m,
            &format!(r#"clamp_trigger_deliveries_total{{source="webhook",outcome="{o}"}} "#),
        )
    };
    assert_eq!(hooks("started"), 1.0, "{m}");
    assert_eq!(hooks("duplicate"), 1.0);
    assert_eq!(hooks("refused"), 2.0);
    assert_eq!(hooks("filtered"), 1.0);
    assert_eq!(hooks("dead_lettered"), 2.0);
    s.shutdown().await;
}

fn stripe_signature(body: &[u8], at: u64) -> String {
    let t = at.to_string();
    format!("t={t},v1={}", sign(&[t.as_bytes(), b".", body]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripe_delivery_is_verified_with_its_time_and_keyed_by_its_event() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = server(&db, &d).await;
    let r = s
        .post_json(
            "/triggers",
            &json!({"name": "stripe", "workflow": "deploy",
                    "source": {"webhook": {"verify": "stripe", "secret": "{{secret:HOOK}}"}}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let body = br#"{"id": "evt_42", "type": "payment_intent.succeeded"}"#;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let post = |sig: String| async move {
        send(
            s.addr,
            Method::POST,
            "/hooks/stripe",
            Some(body.to_vec()),
            &[("Stripe-Signature", sig.as_str())],
        )
        .await
    };
    // A replay: signed correctly, ten minutes ago.
    let old = post(stripe_signature(body, now - 600)).await;
    assert!(old.expect_error(401).contains("tolerance"));
    let r = post(stripe_signature(body, now)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let id = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    wait_status(&s, &id, &["COMPLETED"], WAIT).await;
    // Stripe delivers an event again with a new signature: the event's id keys it.
    let again = post(stripe_signature(body, now + 1)).await.json();
    assert_eq!(again["serviceRequestId"], id.as_str());
    assert_eq!(again["duplicate"], true);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triggers_are_defined_paused_replaced_and_deleted_through_the_audited_api() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = server(&db, &d).await;
    for (def, field) in [
        (
            json!({"name": "x", "workflow": "nobody", "source": {"webhook": {"verify": "github", "secret": "{{secret:HOOK}}"}}}),
            "workflow:",
        ),
        (
            json!({"name": "x", "workflow": "deploy", "source": {"webhook": {"verify": "github", "secret": "{{secret:NOT_SET}}"}}}),
            "source.webhook.secret",
        ),
        (
            json!({"name": "x", "workflow": "deploy", "source": {"webhook": {"verify": "github", "secret": "plain"}}}),
            "source.webhook.secret",
        ),
        (
            json!({"name": "x", "workflow": "deploy", "source": {"kafka": {}}}),
            "source.kafka",
        ),
    ] {
        let why = s.post_json("/triggers", &def).await.expect_error(400);
        assert!(why.starts_with(field), "{def}: {why}");
    }
    assert_eq!(
        s.post_json("/triggers", &github_trigger()).await.status,
        201
    );
    assert_eq!(
        s.post_json("/triggers", &github_trigger()).await.status,
        409
    );
    let listed = s.get("/triggers").await.json();
    assert_eq!(listed["triggers"][0]["name"], "gh");
    assert_eq!(listed["triggers"][0]["paused"], false);

    // Paused: the sender is told to come back.
    let r = s.post("/triggers/gh/pause", "").await;
    assert_eq!(r.json()["paused"], true);
    let push = br#"{"ref": "refs/heads/main", "repository": {"name": "clamp"}}"#;
    let sig = format!("sha256={}", sign(&[push]));
    let paused = github_hook(&s, push, "p-1", &sig).await;
    assert_eq!(paused.status, 503);
    assert!(paused.headers.get("retry-after").is_some());
    assert_eq!(
        s.post("/triggers/gh/resume", "").await.json()["paused"],
        false
    );
    assert_eq!(github_hook(&s, push, "p-1", &sig).await.status, 200);

    // Replaced without its `when`: every ref starts a request.
    let mut replaced = github_trigger();
    replaced.as_object_mut().unwrap().remove("when");
    replaced.as_object_mut().unwrap().remove("name");
    let r = send(
        s.addr,
        Method::PUT,
        "/triggers/gh",
        Some(replaced.to_string().into_bytes()),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json().get("when").is_none());
    let dev = br#"{"ref": "refs/heads/dev", "repository": {"name": "clamp"}}"#;
    let r = github_hook(&s, dev, "p-2", &format!("sha256={}", sign(&[dev]))).await;
    assert_eq!(r.json()["started"], true, "{}", r.text());

    // The console lists it, with its source and a link to its requests.
    let page = s.get("/console/triggers").await;
    assert_eq!(page.status, 200, "{}", page.text());
    let html = page.text();
    assert!(
        html.contains("webhook POST /hooks/gh (github signature)"),
        "{html}"
    );
    assert!(
        html.contains(r#"href="/console?labels=trigger%3Agh""#),
        "{html}"
    );

    assert_eq!(
        send(s.addr, Method::DELETE, "/triggers/gh", None, &[])
            .await
            .status,
        204
    );
    assert_eq!(github_hook(&s, push, "p-3", &sig).await.status, 404);
    assert_eq!(s.get("/triggers/gh").await.status, 404);
    // Every change is in the audit trail.
    let audit = s.get("/audit").await.json();
    let changes = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "change trigger")
        .count();
    assert_eq!(changes, 10, "{audit}");
    s.shutdown().await;
}

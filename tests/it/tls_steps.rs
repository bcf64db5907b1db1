//! HTTPS steps against downstreams the tests serve over TLS with a CA of their own:
//! called with their headers, connections reused, and a certificate that fails a check
//! failing the step once with a reason that names the check (no retries: the next
//! attempt would meet the same certificate).

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::pki::Ca;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(20);

fn two_steps(name: &str, d: &Downstream) -> Value {
    json!({"name": name, "steps": [
        {"name": "first", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/step1")}},
        {"name": "second", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo"), "headers": "X-Tenant:acme;"}}]})
}

fn one_step(name: &str, d: &Downstream) -> Value {
    json!({"name": name, "steps": [
        {"name": "only", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_step_is_called_with_its_headers_over_reused_connections() {
    let ca = Ca::new("steps");
    let d = Downstream::start_tls(Ca::server_config(
        &ca.server("localhost", &["localhost", "127.0.0.1"]),
        None,
    ))
    .await;
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.tls.step_ca = Some(ca.ca_file());
    let s = TestServer::start(cfg).await;
    s.create_workflow(&two_steps("secure", &d)).await;
    let trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut ids = Vec::new();
    for i in 0..10 {
        let r = send(
            s.addr,
            hyper::Method::POST,
            "/serviceRequest/secure",
            Some(json!({"n": i}).to_string().into_bytes()),
            &[("traceparent", trace)],
        )
        .await;
        let id = r.json()["serviceRequestId"].as_str().unwrap().to_string();
        let v = wait_status(&s, &id, &["COMPLETED"], WAIT).await;
        assert_eq!(
            v["steps"][3]["payload"]["response"]["echo"]["user"]["id"], 7,
            "{v}"
        );
        ids.push(id);
    }
    for (i, id) in ids.iter().enumerate() {
        for (step, path) in [(1, "/api/step1"), (2, "/api/echo")] {
            let calls: Vec<_> = d
                .received(path)
                .into_iter()
                .filter(|r| r.headers.get("idempotency-key") == Some(&format!("{id}:{step}")))
                .collect();
            assert_eq!(calls.len(), 1, "request {i} step {step}");
            let h = &calls[0].headers;
            assert_eq!(h["host"], format!("localhost:{}", d.addr.port()));
            assert!(h["traceparent"].starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
            if step == 2 {
                assert_eq!(h["x-tenant"], "acme");
            }
        }
    }
    // Twenty calls, and far fewer handshakes: connections are kept and reused.
    let handshakes = d.handshakes.load(Ordering::Relaxed);
    assert!(handshakes <= 4, "{handshakes} TLS handshakes for 20 calls");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_that_fails_a_check_fails_the_step_once_with_the_check_named() {
    let ca = Ca::new("checks");
    let other = Ca::new("stranger");
    // A certificate for another host name, and one from a CA nobody here trusts.
    let wrong_host = Downstream::start_tls(Ca::server_config(
        &ca.server("wrong", &["wrong.example"]),
        None,
    ))
    .await;
    let unknown_ca = Downstream::start_tls(Ca::server_config(
        &other.server("localhost", &["localhost"]),
        None,
    ))
    .await;
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.tls.step_ca = Some(ca.ca_file());
    let s = TestServer::start(cfg).await;
    s.create_workflow(&one_step("wrong-host", &wrong_host))
        .await;
    s.create_workflow(&one_step("unknown-ca", &unknown_ca))
        .await;
    for (wf, reason) in [
        (
            "wrong-host",
            "is not valid for host name localhost (it names wrong.example",
        ),
        ("unknown-ca", "is not signed by a trusted CA"),
    ] {
        let id = create_request(&s, wf, &json!({})).await;
        let v = wait_status(&s, &id, &["FAILED"], WAIT).await;
        let why = v["reason"].as_str().unwrap();
        assert!(
            why.contains("TLS handshake with https://localhost:"),
            "{why}"
        );
        assert!(why.contains(reason), "{wf}: {why}");
        // One attempt: a certificate does not get better by trying again.
        assert_eq!(v["steps"][1]["attempts"], 1, "{v}");
    }
    assert!(wrong_host.received("/api/echo").is_empty());
    assert!(unknown_ca.received("/api/echo").is_empty());
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_presented_when_the_server_requires_one() {
    let ca = Ca::new("mtls");
    let clients = Ca::new("mtls-clients");
    let d = Downstream::start_tls(Ca::server_config(
        &ca.server("localhost", &["localhost"]),
        Some(&clients),
    ))
    .await;
    let client = clients.client("clamp-client", "clamp");

    // Without a client certificate: refused, and the reason says why.
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.tls.step_ca = Some(ca.ca_file());
    let s = TestServer::start(cfg.clone()).await;
    s.create_workflow(&one_step("mutual", &d)).await;
    let id = create_request(&s, "mutual", &json!({"who": "nobody"})).await;
    let v = wait_status(&s, &id, &["FAILED"], WAIT).await;
    let why = v["reason"].as_str().unwrap();
    assert!(why.contains("client certificate"), "{why}");
    s.shutdown().await;
    assert!(d.received("/api/echo").is_empty());

    // With one: called, and the server saw it.
    cfg.tls.step_client = Some((client.cert.clone(), client.key.clone()));
    let s = TestServer::start(cfg).await;
    let id = create_request(&s, "mutual", &json!({"who": "clamp"})).await;
    let v = wait_status(&s, &id, &["COMPLETED"], WAIT).await;
    assert_eq!(v["steps"][1]["payload"]["response"]["echo"]["who"], "clamp");
    let calls = d.received("/api/echo");
    assert_eq!(calls.len(), 1);
    assert!(calls[0].client_cert);
    s.shutdown().await;
}

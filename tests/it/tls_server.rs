//! clamp serving HTTPS (`--tls-cert`, `--tls-key`): the API over TLS, the console signing
//! in over it with `Secure` cookies, and a plain-text client refused.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request};
use serde_json::json;
use tokio::net::TcpStream;

use crate::pki::Ca;
use crate::support::*;

const TOKEN: &str = "https-token-0123456789abcdef";

/// One request over TLS (trusting `tls`'s roots, asking for `localhost`).
async fn send_tls(
    addr: SocketAddr,
    tls: &Arc<rustls::ClientConfig>,
    method: Method,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> Resp {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let stream = tokio_rustls::TlsConnector::from(tls.clone())
        .connect(name, tcp)
        .await
        .expect("TLS handshake with clamp");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", format!("localhost:{}", addr.port()));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or_default().to_string())))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Resp {
        status,
        headers,
        body,
    }
}

fn cookie(r: &Resp, name: &str) -> String {
    r.headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} cookie in {:?}", r.headers))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_and_the_console_are_served_over_https() {
    let ca = Ca::new("listener");
    let pair = ca.server("clamp", &["localhost", "127.0.0.1"]);
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.tls.server = Some((pair.cert.clone(), pair.key.clone()));
    cfg.api_tokens = clamp::tokens::ApiTokens::from_list(&[TOKEN]);
    let s = TestServer::start(cfg).await;
    let tls = ca.client_config();
    let auth = format!("Bearer {TOKEN}");

    let r = send_tls(s.addr, &tls, Method::GET, "/health", None, &[]).await;
    assert_eq!(r.status, 200);
    let r = send_tls(
        s.addr,
        &tls,
        Method::POST,
        "/workflow",
        Some(&simple_workflow("over-tls").to_string()),
        &[("authorization", &auth)],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send_tls(
        s.addr,
        &tls,
        Method::POST,
        "/serviceRequest/over-tls",
        Some(&json!({"a": 1}).to_string()),
        &[("authorization", &auth)],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());

    // The console: its cookies are Secure, and signing in over HTTPS works.
    let login = send_tls(s.addr, &tls, Method::GET, "/console/login", None, &[]).await;
    assert_eq!(login.status, 200);
    let csrf = cookie(&login, "clamp_csrf");
    assert!(csrf.contains("; Secure"), "{csrf}");
    let csrf_pair = csrf.split(';').next().unwrap().to_string();
    let csrf_value = csrf_pair.split('=').nth(1).unwrap();
    let form = form_urlencoded::Serializer::new(String::new())
        .extend_pairs([("csrf", csrf_value), ("token", TOKEN)])
        .finish();
    let origin = format!("https://localhost:{}", s.addr.port());
    let ok = send_tls(
        s.addr,
        &tls,
        Method::POST,
        "/console/login",
        Some(&form),
        &[
            ("cookie", &csrf_pair),
            ("content-type", "application/x-www-form-urlencoded"),
            ("origin", &origin),
        ],
    )
    .await;
    assert_eq!(ok.status, 303, "{}", ok.text());
    let session = cookie(&ok, "clamp_console");
    assert!(session.contains("; Secure"), "{session}");
    let cookies = format!("{}; {csrf_pair}", session.split(';').next().unwrap());
    let page = send_tls(
        s.addr,
        &tls,
        Method::GET,
        "/console/workflows",
        None,
        &[("cookie", &cookies)],
    )
    .await;
    assert_eq!(page.status, 200);
    assert!(page.text().contains("over-tls"));

    // Plain HTTP on the HTTPS port gets no HTTP answer.
    let stream = TcpStream::connect(s.addr).await.unwrap();
    let plain = async {
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let req = Request::get("/health")
            .header("host", "localhost")
            .body(Full::new(Bytes::new()))
            .unwrap();
        sender.send_request(req).await
    };
    assert!(
        plain.await.is_err(),
        "plain HTTP was answered on the HTTPS port"
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_that_does_not_fit_its_key_stops_startup() {
    let ca = Ca::new("mismatch");
    let a = ca.server("a", &["localhost"]);
    let b = ca.server("b", &["localhost"]);
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.tls.server = Some((a.cert.clone(), b.key.clone()));
    let e = match clamp::start(cfg).await {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a server started with another certificate's key"),
    };
    assert!(e.contains("do not belong together"), "{e}");
}

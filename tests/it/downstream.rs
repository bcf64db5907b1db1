//! A small downstream service for the steps to call: it records every request and
//! answers by path (fixed JSON, echo, a status code, a delay, an answer held until the
//! test releases it, a fault on the first call of each key), counting calls per Idempotency-Key so tests can prove no step ran twice, and
//! the calls in flight at once.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Request, Response};
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// The `traceparent` `/traced` answers with.
pub const TRACED_ANSWER: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// One request the downstream received.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: Value,
    pub at: std::time::Instant,
    /// Over HTTPS, whether the client presented a certificate.
    pub client_cert: bool,
    /// Whether the downstream was fixed when it came (`/until-fixed` and
    /// `/unavailable-until-fixed` answered it 200).
    pub fixed: bool,
}

#[derive(Default)]
pub struct Log {
    pub requests: Vec<Received>,
    pub by_key: HashMap<String, usize>,
    pub in_flight: usize,
    pub peak_in_flight: usize,
    /// `/until-fixed` answers 500 until `Downstream::fix` (a downstream that was down).
    pub fixed: bool,
    /// `/held` answers (as `/api/echo` does) only once `Downstream::release` was called.
    pub released: bool,
    /// Calls whose caller went away before they were answered (their connection closed).
    pub abandoned: usize,
    /// `/per-key/<ms>`: calls in flight now and at most, by the body's `k`.
    pub keyed: HashMap<String, (usize, usize)>,
}

/// One call being answered: counted out when it ends, answered or abandoned (dropped
/// with its connection).
struct Flight {
    log: Arc<Mutex<Log>>,
    answered: bool,
}

impl Drop for Flight {
    fn drop(&mut self) {
        let mut l = self.log.lock();
        l.in_flight -= 1;
        if !self.answered {
            l.abandoned += 1;
        }
    }
}

pub struct Downstream {
    pub addr: SocketAddr,
    pub log: Arc<Mutex<Log>>,
    /// Over HTTPS (as `localhost`), with this server configuration.
    tls: bool,
    /// TLS handshakes completed: fewer than calls when connections are reused.
    pub handshakes: Arc<std::sync::atomic::AtomicUsize>,
}

impl Downstream {
    pub async fn start() -> Downstream {
        Downstream::serve(None).await
    }

    /// The same service over HTTPS, at `https://localhost:<port>`.
    pub async fn start_tls(config: Arc<rustls::ServerConfig>) -> Downstream {
        Downstream::serve(Some(tokio_rustls::TlsAcceptor::from(config))).await
    }

    async fn serve(tls: Option<tokio_rustls::TlsAcceptor>) -> Downstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let log: Arc<Mutex<Log>> = Arc::default();
        let handshakes: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
        let (l, hs, is_tls) = (log.clone(), handshakes.clone(), tls.is_some());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (l, hs, tls) = (l.clone(), hs.clone(), tls.clone());
                tokio::spawn(async move {
                    let builder = hyper::server::conn::http1::Builder::new();
                    match tls {
                        None => {
                            let svc = service_fn(move |req| handle(l.clone(), false, req));
                            let _ = builder
                                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                                .await;
                        }
                        Some(acceptor) => {
                            // A client that fails the handshake just goes away.
                            let Ok(stream) = acceptor.accept(stream).await else {
                                return;
                            };
                            hs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let cert = stream.get_ref().1.peer_certificates().is_some();
                            let svc = service_fn(move |req| handle(l.clone(), cert, req));
                            let _ = builder
                                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                                .await;
                        }
                    }
                });
            }
        });
        Downstream {
            addr,
            log,
            tls: is_tls,
            handshakes,
        }
    }

    pub fn url(&self, path: &str) -> String {
        if self.tls {
            format!("https://localhost:{}{}", self.addr.port(), path)
        } else {
            format!("http://{}{}", self.addr, path)
        }
    }

    pub fn received(&self, path: &str) -> Vec<Received> {
        self.log
            .lock()
            .requests
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }

    /// Waits (up to 5 s, else panics) until a request for `path` has arrived.
    pub async fn wait_for(&self, path: &str) {
        crate::support::wait_for(
            &format!("a request for {path} downstream"),
            Duration::from_secs(5),
            || async { (!self.received(path).is_empty()).then_some(()) },
        )
        .await;
    }

    pub fn max_calls_per_key(&self) -> usize {
        self.log.lock().by_key.values().copied().max().unwrap_or(0)
    }

    pub fn n_keys(&self) -> usize {
        self.log.lock().by_key.len()
    }

    pub fn calls_for_key(&self, key: &str) -> usize {
        self.log.lock().by_key.get(key).copied().unwrap_or(0)
    }

    /// From now on `/until-fixed` answers as `/api/echo` does.
    pub fn fix(&self) {
        self.log.lock().fixed = true;
    }

    /// `/per-key/…` calls in flight at most, by key.
    pub fn peak_per_key(&self) -> HashMap<String, usize> {
        self.log
            .lock()
            .keyed
            .iter()
            .map(|(k, (_, peak))| (k.clone(), *peak))
            .collect()
    }

    /// From now on `/until-fixed` answers 500 again.
    pub fn break_again(&self) {
        self.log.lock().fixed = false;
    }

    /// Lets every `/held` call answer, those waiting and those to come.
    pub fn release(&self) {
        self.log.lock().released = true;
    }

    pub fn peak_in_flight(&self) -> usize {
        self.log.lock().peak_in_flight
    }

    /// Calls being answered now.
    pub fn in_flight(&self) -> usize {
        self.log.lock().in_flight
    }

    /// Calls whose caller closed the connection before the answer.
    pub fn abandoned(&self) -> usize {
        self.log.lock().abandoned
    }
}

async fn handle(
    log: Arc<Mutex<Log>>,
    client_cert: bool,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let headers: HashMap<String, String> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let bytes = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body: Value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or(Value::Null)
    };
    let mut first_for_key = true;
    let fixed;
    {
        let mut l = log.lock();
        fixed = l.fixed;
        if let Some(k) = headers.get("idempotency-key") {
            let n = l.by_key.entry(k.clone()).or_default();
            *n += 1;
            first_for_key = *n == 1;
        }
        l.in_flight += 1;
        l.peak_in_flight = l.peak_in_flight.max(l.in_flight);
        l.requests.push(Received {
            method,
            path: path.clone(),
            headers,
            body: body.clone(),
            at: std::time::Instant::now(),
            client_cert,
            fixed,
        });
    }
    let mut flight = Flight {
        log: log.clone(),
        answered: false,
    };
    let mut retry_after = None;
    let (status, out) = match path.as_str() {
        // The first call of each key answers this status; later ones succeed.
        p if p.starts_with("/flaky/") => {
            if first_for_key {
                (
                    p[7..].parse().unwrap_or(503),
                    json!({"error": "first call fails"}),
                )
            } else {
                (200, json!({"recovered": true}))
            }
        }
        // The first call of each key answers 503 with `Retry-After: <secs>`.
        p if p.starts_with("/flaky-retry-after/") => {
            if first_for_key {
                retry_after = Some(p[19..].to_string());
                (503, json!({"error": "come back later"}))
            } else {
                (200, json!({"recovered": true}))
            }
        }
        // A job that reports ready from its Nth call on (each call counted, whatever
        // its key): a LOOP polls it.
        p if p.starts_with("/ready-after/") => {
            let n: usize = p[13..].parse().unwrap_or(1);
            let calls = log.lock().requests.iter().filter(|r| r.path == p).count();
            let status = if calls >= n { "ready" } else { "pending" };
            (200, json!({"status": status, "call": calls}))
        }
        // Compensations' peers: each answers what it was sent.
        p if p.starts_with("/undo/") => (200, json!({"undone": body})),
        "/api/step1" => (200, json!({"user": {"id": 7, "ok": true}, "step": 1})),
        // Answers with a `traceparent` of its own (a peer that traces too).
        "/traced" => (200, json!({"traced": true})),
        "/api/echo" => (200, json!({"echo": body})),
        "/until-fixed" if fixed => (200, json!({"echo": body})),
        "/until-fixed" => (500, json!({"error": "down for now"})),
        "/unavailable-until-fixed" if fixed => (200, json!({"ok": true})),
        "/unavailable-until-fixed" => (503, json!({"error": "unavailable for now"})),
        // A peer that answers when the test says so, however long that takes (the peer's
        // side: the test bounds its own wait for what follows the release).
        "/held" => {
            while !log.lock().released {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (200, json!({"echo": body}))
        }
        "/api/accepted" => (202, json!({"accepted": true})),
        p if p.starts_with("/status/") => {
            (p[8..].parse().unwrap_or(500), json!({"error": "as asked"}))
        }
        // A peer that counts calls in flight per the body's `k` (its tenant, account…),
        // answering after the delay named.
        p if p.starts_with("/per-key/") => {
            let k = body["k"].as_str().unwrap_or("").to_string();
            {
                let mut l = log.lock();
                let e = l.keyed.entry(k.clone()).or_default();
                e.0 += 1;
                e.1 = e.1.max(e.0);
            }
            // Counted out however the call ends (a caller killed drops it midway).
            struct Out(Arc<Mutex<Log>>, String);
            impl Drop for Out {
                fn drop(&mut self) {
                    if let Some(e) = self.0.lock().keyed.get_mut(&self.1) {
                        e.0 -= 1;
                    }
                }
            }
            let _out = Out(log.clone(), k.clone());
            tokio::time::sleep(Duration::from_millis(p[9..].parse().unwrap_or(20))).await;
            (200, json!({"k": k}))
        }
        // A peer that answers late on purpose: its delay is what the tests use.
        p if p.starts_with("/slow/") => {
            tokio::time::sleep(Duration::from_millis(p[6..].parse().unwrap_or(100))).await;
            (200, json!({"slow": true}))
        }
        _ => (404, json!({"error": "no such path"})),
    };
    flight.answered = true;
    drop(flight);
    let mut r = Response::new(Full::new(Bytes::from(out.to_string())));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
    if path == "/traced" {
        r.headers_mut()
            .insert("traceparent", TRACED_ANSWER.parse().unwrap());
    }
    if let Some(secs) = retry_after {
        r.headers_mut().insert("retry-after", secs.parse().unwrap());
    }
    r.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    Ok(r)
}

//! The downstream mock: a small hyper server standing in for the services
//! a workflow's HTTP steps call, fast enough never to be the bottleneck.
//!
//! Routes (`content-type: application/json`):
//! `GET /api/step1` small JSON, `POST /api/step2` echoes the request body
//! (or `{}` if empty), `GET /health`, `GET /stats` with call counts and
//! `POST /stats/reset`. Any other GET also answers 200 so health-style load
//! can use any path; anything else is 404.
//!
//! Fault injection (`--fail-first-pct`): the first step call with a chosen
//! `Idempotency-Key` answers 503 (see `keys`), so a run can check that the
//! server retries exactly once per fault and never calls a step twice
//! otherwise.

use crate::keys::KeyCounts;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

const STEP1_BODY: &[u8] =
    br#"{"step":"step1","ok":true,"customer":{"id":"c-42","tier":"gold"},"score":0.87}"#;
const HEALTH_BODY: &[u8] = br#"{"status":"UP"}"#;
const FAULT_BODY: &[u8] = br#"{"error":"injected fault"}"#;
/// Echo bodies larger than this are cut: the mock must stay cheap.
const MAX_ECHO: usize = 64 * 1024;

/// Call counters, served as JSON on `GET /stats`.
#[derive(Debug, Default)]
pub struct MockStats {
    pub step1: AtomicU64,
    pub step2: AtomicU64,
    pub health: AtomicU64,
    pub other: AtomicU64,
    /// Step calls being answered now (the server's concurrency towards us).
    pub in_flight: AtomicU64,
    pub peak_in_flight: AtomicU64,
    /// Per-key counts; only when faults are injected or `--count-keys` is on,
    /// since a map insert per call would cost more than the rest of the mock.
    keys: Option<KeyCounts>,
}

/// Holds one unit of `in_flight` while a step call is answered; dropping it
/// (also when hyper drops the call because the client went away) gives it back.
struct InFlight<'a>(&'a MockStats);

impl<'a> InFlight<'a> {
    fn enter(stats: &'a MockStats) -> Self {
        let now = stats.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        stats.peak_in_flight.fetch_max(now, Ordering::Relaxed);
        Self(stats)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl MockStats {
    /// Counters, plus the per-key map when `count_keys`.
    pub fn new(count_keys: bool) -> Self {
        Self {
            keys: count_keys.then(KeyCounts::default),
            ..Self::default()
        }
    }

    pub fn snapshot(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "step1": self.step1.load(Ordering::Relaxed),
            "step2": self.step2.load(Ordering::Relaxed),
            "health": self.health.load(Ordering::Relaxed),
            "other": self.other.load(Ordering::Relaxed),
            "in_flight": self.in_flight.load(Ordering::Relaxed),
            "peak_in_flight": self.peak_in_flight.load(Ordering::Relaxed),
        });
        if let Some(keys) = &self.keys {
            let s = keys.summary();
            v["keys"] = s.keys.into();
            v["faults_injected"] = s.faults_injected.into();
            v["max_calls_per_key"] = s.max_calls_per_key.into();
            v["excess_calls"] = s.excess_calls.into();
            v["keys_called_more_than_needed"] = s.keys_called_more_than_needed.into();
        }
        v
    }

    /// Zeroes the counters and forgets every key. `in_flight` is a level, not
    /// a count, so it stays (calls still being answered will give theirs
    /// back); the peak restarts from it, which is 0 between runs.
    pub fn reset(&self) {
        for c in [&self.step1, &self.step2, &self.health, &self.other] {
            c.store(0, Ordering::Relaxed);
        }
        self.peak_in_flight
            .store(self.in_flight.load(Ordering::Relaxed), Ordering::Relaxed);
        if let Some(keys) = &self.keys {
            keys.clear();
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct MockConfig {
    pub addr: SocketAddr,
    pub threads: usize,
    /// Artificial service time added to step calls (not to health/stats).
    pub delay: Duration,
    /// Percent of distinct `Idempotency-Key`s whose first step call gets 503.
    pub fail_first_pct: u8,
    /// `Retry-After` seconds on an injected 503 (none if unset).
    pub retry_after: Option<u64>,
    /// Count calls per key even without faults (for `excess_calls`).
    pub count_keys: bool,
}

impl MockConfig {
    /// Plain mock: no faults, no key counting.
    pub fn plain(addr: SocketAddr, threads: usize, delay: Duration) -> Self {
        Self {
            addr,
            threads,
            delay,
            fail_first_pct: 0,
            retry_after: None,
            count_keys: false,
        }
    }

    fn stats(&self) -> MockStats {
        MockStats::new(self.count_keys || self.fail_first_pct > 0)
    }
}

fn json(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// `/api/step1` and `/api/step2`: counted, tracked in flight, maybe faulted.
async fn step(req: Request<Incoming>, stats: &MockStats, cfg: MockConfig) -> Response<Full<Bytes>> {
    let echo = req.method() == Method::POST;
    let counter = if echo { &stats.step2 } else { &stats.step1 };
    counter.fetch_add(1, Ordering::Relaxed);
    let _in_flight = InFlight::enter(stats);
    let faulted = match (&stats.keys, req.headers().get("idempotency-key")) {
        (Some(keys), Some(key)) => keys.record(key.as_bytes(), cfg.fail_first_pct),
        _ => false,
    };
    // Read the body even when faulting: an unread body costs the keep-alive.
    let body = if echo {
        match req.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => Bytes::new(),
        }
    } else {
        Bytes::new()
    };
    if faulted {
        // At once, as an overloaded service sheds load: no service time.
        let mut r = json(
            StatusCode::SERVICE_UNAVAILABLE,
            Bytes::from_static(FAULT_BODY),
        );
        if let Some(secs) = cfg.retry_after {
            r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        return r;
    }
    if !cfg.delay.is_zero() {
        tokio::time::sleep(cfg.delay).await;
    }
    if !echo {
        json(StatusCode::OK, Bytes::from_static(STEP1_BODY))
    } else if body.is_empty() || body.len() > MAX_ECHO {
        json(StatusCode::OK, Bytes::from_static(b"{}"))
    } else {
        json(StatusCode::OK, body)
    }
}

async fn handle(
    req: Request<Incoming>,
    stats: Arc<MockStats>,
    cfg: MockConfig,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let ok = StatusCode::OK;
    let resp = match (req.method(), req.uri().path()) {
        (&Method::GET, "/api/step1") | (&Method::POST, "/api/step2") => {
            step(req, &stats, cfg).await
        }
        (&Method::GET, "/health") => {
            stats.health.fetch_add(1, Ordering::Relaxed);
            json(ok, Bytes::from_static(HEALTH_BODY))
        }
        (&Method::GET, "/stats") => json(ok, Bytes::from(stats.snapshot().to_string())),
        (&Method::POST, "/stats/reset") => {
            stats.reset();
            json(ok, Bytes::from(stats.snapshot().to_string()))
        }
        (&Method::GET, _) => {
            stats.other.fetch_add(1, Ordering::Relaxed);
            json(ok, Bytes::from_static(HEALTH_BODY))
        }
        _ => {
            stats.other.fetch_add(1, Ordering::Relaxed);
            json(StatusCode::NOT_FOUND, Bytes::from_static(b"{}"))
        }
    };
    Ok(resp)
}

async fn serve(listener: TcpListener, stats: Arc<MockStats>, cfg: MockConfig) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of file descriptors or similar: pause instead of spinning.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let stats = stats.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| handle(req, stats.clone(), cfg));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
}

/// Runs the mock in the foreground until the process is killed.
pub fn run(cfg: MockConfig) -> anyhow::Result<()> {
    let rt = runtime(cfg.threads)?;
    rt.block_on(async {
        let listener = TcpListener::bind(cfg.addr).await?;
        eprintln!("mock listening on http://{}", listener.local_addr()?);
        serve(listener, Arc::new(cfg.stats()), cfg).await;
        Ok(())
    })
}

/// A mock running on a background thread for the rest of the process
/// (used by `e2e` when no `--downstream` is given).
pub struct Background {
    pub addr: SocketAddr,
    pub stats: Arc<MockStats>,
}

pub fn spawn(cfg: MockConfig) -> anyhow::Result<Background> {
    let rt = runtime(cfg.threads)?;
    let listener = rt.block_on(TcpListener::bind(cfg.addr))?;
    let addr = listener.local_addr()?;
    let stats = Arc::new(cfg.stats());
    let served = stats.clone();
    std::thread::spawn(move || rt.block_on(serve(listener, served, cfg)));
    Ok(Background { addr, stats })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Client, Endpoint};

    #[test]
    fn serves_steps_health_and_stats() {
        let bg = spawn(MockConfig::plain(
            "127.0.0.1:0".parse().unwrap(),
            1,
            Duration::ZERO,
        ))
        .unwrap();
        let ep = Arc::new(Endpoint {
            addr: bg.addr,
            host: "mock".into(),
            timeout: Duration::from_secs(5),
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut c = Client::new(ep);
            let r = c.get("/api/step1").await.unwrap();
            assert_eq!(r.status, 200);
            assert_eq!(&r.body[..], STEP1_BODY);
            let r = c.post("/api/step2", b"{\"a\":1}").await.unwrap();
            assert_eq!((r.status, &r.body[..]), (200, &b"{\"a\":1}"[..]));
            assert_eq!(c.get("/health").await.unwrap().status, 200);
            let r = c.get("/stats").await.unwrap();
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            assert_eq!(
                (v["step1"].as_u64(), v["step2"].as_u64()),
                (Some(1), Some(1))
            );
            assert_eq!(v["peak_in_flight"].as_u64(), Some(1));
            assert_eq!(v["in_flight"].as_u64(), Some(0));
            // No key counting unless asked for.
            assert!(v.get("excess_calls").is_none());
            let r = c.call("DELETE", "/x", b"").await.unwrap();
            assert_eq!(r.status, 404);
        });
    }

    /// One request with an `Idempotency-Key` (the load client sends none).
    async fn keyed_call(
        addr: SocketAddr,
        method: &str,
        path: &str,
        key: &str,
    ) -> crate::http1::Head {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: mock\r\nIdempotency-Key: {key}\r\n\
             Content-Length: 2\r\nConnection: close\r\n\r\n{{}}"
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.unwrap();
        crate::http1::parse_head(&buf).unwrap().unwrap()
    }

    #[test]
    fn faults_first_calls_of_chosen_keys_and_counts_excess() {
        let mut cfg = MockConfig::plain("127.0.0.1:0".parse().unwrap(), 1, Duration::ZERO);
        cfg.fail_first_pct = 50;
        cfg.retry_after = Some(2);
        let bg = spawn(cfg).unwrap();
        let keys: Vec<String> = (0..40).map(|i| format!("sr-{i}:1")).collect();
        let faulted = keys
            .iter()
            .find(|k| crate::keys::fails_first(k.as_bytes(), 50))
            .unwrap();
        let clean = keys
            .iter()
            .find(|k| !crate::keys::fails_first(k.as_bytes(), 50))
            .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let h = keyed_call(bg.addr, "GET", "/api/step1", faulted).await;
            assert_eq!((h.status, h.retry_after), (503, Some(2)));
            let h = keyed_call(bg.addr, "GET", "/api/step1", faulted).await;
            assert_eq!(h.status, 200);
            let h = keyed_call(bg.addr, "POST", "/api/step2", clean).await;
            assert_eq!(h.status, 200);
            let v = bg.stats.snapshot();
            assert_eq!(v["keys"], 2);
            assert_eq!(v["faults_injected"], 1);
            assert_eq!(v["max_calls_per_key"], 2);
            assert_eq!(v["excess_calls"], 0);
            // A duplicate call of a clean key is excess.
            keyed_call(bg.addr, "POST", "/api/step2", clean).await;
            let v = bg.stats.snapshot();
            assert_eq!(
                (
                    v["excess_calls"].as_u64(),
                    v["keys_called_more_than_needed"].as_u64()
                ),
                (Some(1), Some(1))
            );
            let h = keyed_call(bg.addr, "POST", "/stats/reset", "-").await;
            assert_eq!(h.status, 200);
            let v = bg.stats.snapshot();
            assert_eq!(
                (v["keys"].as_u64(), v["step2"].as_u64()),
                (Some(0), Some(0))
            );
            assert_eq!(v["peak_in_flight"], 0);
        });
    }
}

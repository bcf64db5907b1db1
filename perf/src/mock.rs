//! The downstream mock: a small hyper server standing in for the services
//! a workflow's HTTP steps call, fast enough never to be the bottleneck.
//!
//! Routes (all 200, `content-type: application/json`):
//! `GET /api/step1` small JSON, `POST /api/step2` echoes the request body
//! (or `{}` if empty), `GET /health`, and `GET /stats` with call counts.
//! Any other GET also answers 200 so health-style load can use any path;
//! anything else is 404.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
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
/// Echo bodies larger than this are cut: the mock must stay cheap.
const MAX_ECHO: usize = 64 * 1024;

/// Call counters, served as JSON on `GET /stats`.
#[derive(Debug, Default)]
pub struct MockStats {
    pub step1: AtomicU64,
    pub step2: AtomicU64,
    pub health: AtomicU64,
    pub other: AtomicU64,
}

impl MockStats {
    pub fn snapshot(&self) -> serde_json::Value {
        serde_json::json!({
            "step1": self.step1.load(Ordering::Relaxed),
            "step2": self.step2.load(Ordering::Relaxed),
            "health": self.health.load(Ordering::Relaxed),
            "other": self.other.load(Ordering::Relaxed),
        })
    }
}

#[derive(Clone, Copy, Debug)]
pub struct MockConfig {
    pub addr: SocketAddr,
    pub threads: usize,
    /// Artificial service time added to step calls (not to health/stats).
    pub delay: Duration,
}

fn json(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

async fn handle(
    req: Request<Incoming>,
    stats: Arc<MockStats>,
    delay: Duration,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let ok = StatusCode::OK;
    let resp = match (req.method(), req.uri().path()) {
        (&Method::GET, "/api/step1") => {
            stats.step1.fetch_add(1, Ordering::Relaxed);
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            json(ok, Bytes::from_static(STEP1_BODY))
        }
        (&Method::POST, "/api/step2") => {
            stats.step2.fetch_add(1, Ordering::Relaxed);
            let body = match req.into_body().collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => Bytes::new(),
            };
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let echo = if body.is_empty() || body.len() > MAX_ECHO {
                Bytes::from_static(b"{}")
            } else {
                body
            };
            json(ok, echo)
        }
        (&Method::GET, "/health") => {
            stats.health.fetch_add(1, Ordering::Relaxed);
            json(ok, Bytes::from_static(HEALTH_BODY))
        }
        (&Method::GET, "/stats") => json(ok, Bytes::from(stats.snapshot().to_string())),
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

async fn serve(listener: TcpListener, stats: Arc<MockStats>, delay: Duration) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of file descriptors or similar: pause instead of spinning.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let stats = stats.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| handle(req, stats.clone(), delay));
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
        serve(listener, Arc::new(MockStats::default()), cfg.delay).await;
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
    let stats = Arc::new(MockStats::default());
    let served = stats.clone();
    std::thread::spawn(move || rt.block_on(serve(listener, served, cfg.delay)));
    Ok(Background { addr, stats })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Client, Endpoint};

    #[test]
    fn serves_steps_health_and_stats() {
        let bg = spawn(MockConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
            threads: 1,
            delay: Duration::ZERO,
        })
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
            let r = c.call("DELETE", "/x", b"").await.unwrap();
            assert_eq!(r.status, 404);
        });
    }
}

//! Test support: fresh databases, servers started in-process, a small HTTP client, and a
//! TCP proxy that can cut or stall the server's Postgres connections on demand.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::HeaderValue;
use hyper::{Method, Request, StatusCode};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_postgres::NoTls;

/// Where the test Postgres is (a server URL without a database).
pub fn pg_base() -> String {
    std::env::var("CLAMP_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A database of this test's own, dropped when the value is dropped.
pub struct TestDb {
    pub name: String,
    pub url: String,
}

impl TestDb {
    /// A fresh, unique database name; the server creates it (which tests that path too).
    pub fn new() -> TestDb {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!(
            "clamp_it_{}_{}_{}",
            std::process::id(),
            n,
            fastrand::u32(..)
        );
        let url = format!("{}/{}", pg_base(), name);
        TestDb { name, url }
    }

    /// A direct connection, for checking what the server wrote.
    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.url, NoTls)
            .await
            .expect("test db connects");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        client
    }

    pub async fn count(&self, sql: &str) -> i64 {
        self.client()
            .await
            .query_one(sql, &[])
            .await
            .expect("count query")
            .get(0)
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop cannot be async; a short-lived runtime on its own thread does the cleanup.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok((c, conn)) =
                    tokio_postgres::connect(&format!("{}/postgres", pg_base()), NoTls).await
                {
                    tokio::spawn(conn);
                    let _ = c
                        .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                        .await;
                }
            });
        })
        .join();
    }
}

/// A test configuration for `url`.
pub fn config(url: &str) -> clamp::config::Config {
    clamp::config::Config::for_tests(url)
}

/// A server started in-process, and a client for it.
pub struct TestServer {
    pub server: Option<clamp::Server>,
    pub addr: SocketAddr,
}

impl TestServer {
    pub async fn start(config: clamp::config::Config) -> TestServer {
        // CLAMP_TEST_LOG=debug shows the servers' logs (off by default: tests print nothing).
        if let Ok(filter) = std::env::var("CLAMP_TEST_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_test_writer()
                .try_init();
        }
        let server = clamp::start(config).await.expect("server starts");
        let addr = server.local_addr();
        TestServer {
            server: Some(server),
            addr,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub async fn get(&self, path: &str) -> Resp {
        send(self.addr, Method::GET, path, None, &[]).await
    }

    pub async fn post(&self, path: &str, body: &str) -> Resp {
        send(
            self.addr,
            Method::POST,
            path,
            Some(body.as_bytes().to_vec()),
            &[],
        )
        .await
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Resp {
        self.post(path, &body.to_string()).await
    }

    /// Creates a workflow and asserts it was accepted.
    pub async fn create_workflow(&self, def: &Value) -> Value {
        let r = self.post_json("/workflow", def).await;
        assert_eq!(r.status, 200, "creating workflow: {}", r.text());
        r.json()
    }

    pub async fn shutdown(mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown().await;
        }
    }
}

/// A simple one-step HTTP workflow definition.
pub fn simple_workflow(name: &str) -> Value {
    serde_json::json!({
        "name": name,
        "description": "test",
        "steps": [{"name": "step1", "mode": "HTTP", "val": {"method": "GET", "url": "http://127.0.0.1:9/none"}}]
    })
}

/// A response, fully read.
#[derive(Debug)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.text()))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Asserts Clamp's error shape with this status, and returns the message.
    pub fn expect_error(&self, status: u16) -> String {
        assert_eq!(self.status.as_u16(), status, "{}", self.text());
        let v = self.json();
        assert_eq!(v["code"], status, "{v}");
        v["message"]
            .as_str()
            .expect("message is a string")
            .to_string()
    }
}

/// Sends one request on a fresh connection.
pub async fn send(
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
    headers: &[(&str, &str)],
) -> Resp {
    let stream = TcpStream::connect(addr).await.expect("connects");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    for (k, v) in headers {
        req = req.header(*k, HeaderValue::from_str(v).unwrap());
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .unwrap();
    let resp = sender.send_request(req).await.expect("response");
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    Resp {
        status,
        headers,
        body,
    }
}

/// A persistent keep-alive client connection.
pub struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    addr: SocketAddr,
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).await.expect("connects");
        let (sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .expect("handshake");
        tokio::spawn(conn);
        Conn { sender, addr }
    }

    pub async fn post(&mut self, path: &str, body: &str) -> Result<Resp, hyper::Error> {
        self.sender.ready().await?;
        let req = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header("host", self.addr.to_string())
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let resp = self.sender.send_request(req).await?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok(Resp {
            status,
            headers,
            body,
        })
    }
}

/// A TCP proxy in front of Postgres (or any server) that a test can cut (refuse and reset
/// every connection, like a dead server) or stall (keep connections open, forward nothing),
/// or arm to drop the one connection that sends a given statement.
pub struct PgProxy {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    stalled: Arc<AtomicBool>,
    generation: Arc<AtomicU64>,
    /// When set, the next connection whose client sends these bytes is dropped.
    trigger: Trigger,
}

type Trigger = Arc<parking_lot::Mutex<Option<Vec<u8>>>>;

impl PgProxy {
    pub async fn start() -> PgProxy {
        PgProxy::start_to("127.0.0.1:5432".parse().unwrap()).await
    }

    /// A proxy in front of `upstream`.
    pub async fn start_to(upstream: SocketAddr) -> PgProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let stalled = Arc::new(AtomicBool::new(false));
        let generation = Arc::new(AtomicU64::new(0));
        let trigger: Trigger = Arc::default();
        let (c, s, g, t) = (
            cut.clone(),
            stalled.clone(),
            generation.clone(),
            trigger.clone(),
        );
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    continue;
                };
                if c.load(Ordering::SeqCst) {
                    let _ = client.shutdown().await;
                    continue;
                }
                let (c, s, g, t) = (c.clone(), s.clone(), g.clone(), t.clone());
                let born = g.load(Ordering::SeqCst);
                let dropped = Arc::new(AtomicBool::new(false));
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let d = dropped.clone();
                    let alive = move || {
                        !c.load(Ordering::SeqCst)
                            && g.load(Ordering::SeqCst) == born
                            && !d.load(Ordering::SeqCst)
                    };
                    let s2 = s.clone();
                    let alive2 = alive.clone();
                    let up = tokio::spawn(async move {
                        pump(&mut cr, &mut sw, &s2, alive2, Some((&t, &dropped))).await
                    });
                    pump(&mut sr, &mut cw, &s, alive, None).await;
                    up.abort();
                });
            }
        });
        PgProxy {
            addr,
            cut,
            stalled,
            generation,
            trigger,
        }
    }

    /// Drops the next connection that sends a statement containing `sql` (once), as a
    /// network failure or a restarting server would, in the middle of that statement.
    pub fn drop_connection_on(&self, sql: &str) {
        *self.trigger.lock() = Some(sql.as_bytes().to_vec());
    }

    /// True once an armed trigger has fired.
    pub fn trigger_fired(&self) -> bool {
        self.trigger.lock().is_none()
    }

    /// A database URL through the proxy, in plain text (`drop_connection_on` reads the
    /// statements going by; the machine's cluster would otherwise be spoken to over TLS).
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@{}/{}?sslmode=disable", self.addr, db)
    }

    /// Cuts every connection and refuses new ones until `restore`.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Stops forwarding bytes (connections stay open) until `restore`.
    pub fn stall(&self) {
        self.stalled.store(true, Ordering::SeqCst);
    }

    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
        self.stalled.store(false, Ordering::SeqCst);
    }

    /// Connections to this proxy that their client (the server under test) still holds
    /// open: established, connecting, or closed by the proxy and not yet noticed by the
    /// client. Read from `/proc/net/tcp`, which lists the whole network namespace; the
    /// proxy's port is its own, so only its clients' sockets have it as remote address.
    pub fn client_sockets_open(&self) -> usize {
        let remote = format!("0100007F:{:04X}", self.addr.port());
        let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp is readable");
        table
            .lines()
            .skip(1)
            .filter(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                // 01 ESTABLISHED, 02 SYN_SENT, 08 CLOSE_WAIT (the peer closed, we did not).
                f.len() > 3 && f[2] == remote && matches!(f[3], "01" | "02" | "08")
            })
            .count()
    }
}

async fn pump<R, W>(
    r: &mut R,
    w: &mut W,
    stalled: &AtomicBool,
    alive: impl Fn() -> bool,
    trigger: Option<(&Trigger, &AtomicBool)>,
) where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // The proxy's own tick: an idle connection checks every 20 ms whether it was cut.
        let n = tokio::select! {
            r = r.read(&mut buf) => match r { Ok(0) | Err(_) => return, Ok(n) => n },
            _ = tokio::time::sleep(Duration::from_millis(20)) => {
                if !alive() { return; }
                continue;
            }
        };
        // Stalled: hold the bytes (a hung database is what is tested), checking every 10 ms.
        while stalled.load(Ordering::SeqCst) {
            if !alive() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if let Some((trigger, dropped)) = trigger {
            let mut armed = trigger.lock();
            let hit = armed
                .as_deref()
                .is_some_and(|p| buf[..n].windows(p.len()).any(|w| w == p));
            if hit {
                *armed = None;
                dropped.store(true, Ordering::SeqCst);
                return;
            }
        }
        if !alive() || w.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Polls `GET /serviceRequest/{id}` until its status is one of `want`, and returns it;
/// panics (with the last answer) when `within` passes first.
pub async fn wait_status(s: &TestServer, id: &str, want: &[&str], within: Duration) -> Value {
    let deadline = std::time::Instant::now() + within;
    loop {
        let v = s.get(&format!("/serviceRequest/{id}")).await.json();
        let st = v["status"].as_str().unwrap_or("").to_string();
        if want.contains(&st.as_str()) {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {within:?} waiting for {id} to be one of {want:?}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Creates a service request and returns its id.
pub async fn create_request(s: &TestServer, workflow: &str, payload: &Value) -> String {
    let r = s
        .post_json(&format!("/serviceRequest/{workflow}"), payload)
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["serviceRequestId"].as_str().unwrap().to_string()
}

/// A step response as the brokers carry it: `response` answers step 1 of request `id`.
pub fn step_reply(id: &str, response: Value) -> Vec<u8> {
    json!({"serviceRequestId": id, "stepId": 1, "response": response})
        .to_string()
        .into_bytes()
}

/// A throwaway cluster from `scripts/dev-postgres.sh`, stopped and removed on drop.
pub struct DevCluster {
    pub dir: String,
}

impl DevCluster {
    pub fn script() -> String {
        format!("{}/scripts/dev-postgres.sh", env!("CARGO_MANIFEST_DIR"))
    }

    pub fn start(dir: &str, port: u16) -> String {
        let out = std::process::Command::new(Self::script())
            .args(["start", dir, &port.to_string()])
            .output()
            .expect("dev-postgres.sh runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    pub fn stop(&self) {
        let out = std::process::Command::new(Self::script())
            .args(["stop", &self.dir])
            .output()
            .unwrap();
        assert!(out.status.success());
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The real binary as a child process, on `port`, with short leases (1 s) and sweeps.
pub fn spawn_binary(db_url: &str, port: u16) -> Spawned {
    spawn_binary_with(db_url, port, &[])
}

/// A child process killed when dropped, so a failing test leaves none behind.
pub struct Spawned(pub Child);

impl std::ops::Deref for Spawned {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Spawned {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `spawn_binary` with more flags.
pub fn spawn_binary_with(db_url: &str, port: u16, extra: &[&str]) -> Spawned {
    Spawned(
        Command::new(env!("CARGO_BIN_EXE_clamp"))
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--database-url",
                db_url,
            ])
            .args([
                "--threads",
                "2",
                "--lease-ms",
                "1000",
                "--sweep-interval-ms",
                "100",
            ])
            .args(extra)
            .env("LOG_LEVEL", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("binary starts"),
    )
}

/// Waits (up to 20 s) until the server on `port` answers `/health`.
pub async fn wait_healthy(port: u16) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    while std::time::Instant::now() < deadline {
        if tokio::net::TcpStream::connect(addr).await.is_ok()
            && send(addr, hyper::Method::GET, "/health", None, &[])
                .await
                .status
                == 200
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("server on {port} did not come up");
}

/// Polls `check` until it returns `Some` or `within` passes (then panics, naming `what`):
/// tests wait for the event they need, not for a fixed time.
pub async fn wait_for<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of the first line of a metrics exposition that starts with `line_start`
/// (0 when there is none).
pub fn metric(text: &str, line_start: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

//! Malformed, slow and greedy clients; graceful shutdown; startup failures of the binary,
//! and of a second server on a port one already listens on.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;

/// Reads until EOF or `limit`; returns what arrived and whether the peer closed.
async fn read_until_close(stream: &mut TcpStream, limit: Duration) -> (String, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&out).into_owned(), true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&out).into_owned(), false),
        }
    }
}

#[tokio::test]
async fn too_many_headers_get_431() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    let mut req = String::from("GET /health HTTP/1.1\r\nHost: localhost\r\n");
    for i in 0..150 {
        req.push_str(&format!("X-H{i}: v\r\n"));
    }
    req.push_str("\r\n");
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(req.as_bytes()).await.unwrap();
    let (text, _) = read_until_close(&mut c, Duration::from_secs(5)).await;
    assert!(text.starts_with("HTTP/1.1 431"), "{text}");
    // The server is fine afterwards.
    assert_eq!(s.get("/health").await.status, 200);
    s.shutdown().await;
}

#[tokio::test]
async fn slow_and_idle_clients_are_disconnected() {
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.header_timeout = Duration::from_millis(500);
    cfg.keep_alive_timeout = Duration::from_millis(1500);
    let s = TestServer::start(cfg).await;

    // Partial headers, then silence.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"POST /serviceRequest/wf HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let (_, closed) = read_until_close(&mut c, Duration::from_secs(5)).await;
    assert!(closed, "slow client was not disconnected");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(3),
        "took {took:?}"
    );

    // A head that trickles in is bounded from its first byte, not per byte.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let started = Instant::now();
    for b in b"GET /health HTTP/1.1\r\nHost: localhost\r\n".chunks(4) {
        if c.write_all(b).await.is_err() {
            break;
        }
        // time is what is tested: a client that trickles its head in.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, closed) = read_until_close(&mut c, Duration::from_secs(5)).await;
    assert!(closed && started.elapsed() < Duration::from_secs(3));

    // An idle keep-alive connection is closed after the idle timeout, not the header one.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let (text, closed) = read_until_close(&mut c, Duration::from_secs(5)).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(closed, "idle connection was not closed");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1300) && took < Duration::from_secs(4),
        "idle for {took:?}"
    );
    s.shutdown().await;
}

/// A create whose body stops arriving is answered 408 once the header timeout passed
/// (the body's bound), stores nothing, and leaves the server serving.
#[tokio::test]
async fn a_body_that_stops_arriving_gets_408() {
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.header_timeout = Duration::from_millis(500);
    let s = TestServer::start(cfg).await;
    s.create_workflow(&simple_workflow("wf")).await;
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(
        b"POST /serviceRequest/wf HTTP/1.1\r\nHost: localhost\r\nContent-Length: 20\r\n\r\n{\"a\":",
    )
    .await
    .unwrap();
    let started = Instant::now();
    let (text, _) = read_until_close(&mut c, Duration::from_secs(5)).await;
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(3),
        "took {took:?}"
    );
    assert_eq!(s.post("/serviceRequest/wf", "{}").await.status, 200);
    s.shutdown().await;
    assert_eq!(db.count("SELECT count(*) FROM service_requests").await, 1);
}

#[tokio::test]
async fn malformed_requests_get_400_and_harm_nothing() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    for garbage in [
        &b"THIS IS NOT HTTP\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nHost: localhost\r\nContent-Length: abc\r\n\r\n",
        b"\x00\x01\x02\x03\r\n\r\n",
    ] {
        let mut c = TcpStream::connect(s.addr).await.unwrap();
        c.write_all(garbage).await.unwrap();
        let (text, _) = read_until_close(&mut c, Duration::from_secs(3)).await;
        assert!(text.is_empty() || text.starts_with("HTTP/1.1 4"), "{text}");
    }
    // A body cut short: the client goes away mid-body.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"POST /workflow HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\n{\"na")
        .await
        .unwrap();
    drop(c);
    assert_eq!(s.get("/health").await.status, 200);
    s.shutdown().await;
}

/// A create of `wf` whose body is still arriving (its last 4 bytes, ` 1}\n`, unsent):
/// returned once its handler reads the body (hyper answers `100 Continue` when the body
/// is first asked for), so the request is in flight.
async fn create_mid_body(addr: std::net::SocketAddr) -> TcpStream {
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(
        b"POST /serviceRequest/wf HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\nContent-Length: 9\r\n\r\n{\"a\":",
    )
    .await
    .unwrap();
    let mut interim = Vec::new();
    let mut buf = [0u8; 256];
    while !interim.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
            .await
            .expect("no 100 Continue: the request is not being read")
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&interim));
        interim.extend_from_slice(&buf[..n]);
    }
    assert!(
        interim.starts_with(b"HTTP/1.1 100 Continue\r\n"),
        "{}",
        String::from_utf8_lossy(&interim)
    );
    c
}

/// Starts the server's shutdown; returns once it no longer accepts connections.
async fn begin_shutdown(s: TestServer) -> tokio::task::JoinHandle<()> {
    let addr = s.addr;
    let shutdown = tokio::spawn(s.shutdown());
    wait_for(
        "the server to stop listening",
        Duration::from_secs(5),
        || async { TcpStream::connect(addr).await.is_err().then_some(()) },
    )
    .await;
    shutdown
}

#[tokio::test]
async fn graceful_shutdown_answers_in_flight_requests() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&simple_workflow("wf")).await;
    let addr = s.addr;
    // Start a request whose body is still arriving when shutdown begins.
    let mut c = create_mid_body(addr).await;
    let shutdown = begin_shutdown(s).await;
    c.write_all(b" 1}\n").await.unwrap();
    let (text, _) = read_until_close(&mut c, Duration::from_secs(5)).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    shutdown.await.unwrap();
    assert_eq!(db.count("SELECT count(*) FROM service_requests").await, 1);
    // And nothing listens any more.
    assert!(TcpStream::connect(addr).await.is_err());
}

/// The runtimes share one create buffer: it must stay open until every runtime has
/// answered its creates in flight, not close when the first runtime is done. Creates on
/// eight connections (spread over both runtimes by the kernel) are mid-body when
/// shutdown begins; their bodies end one by one, and each is answered 200 and stored.
#[tokio::test]
async fn shutdown_keeps_the_shared_buffer_open_for_every_runtime() {
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.threads = 2;
    let s = TestServer::start(cfg).await;
    s.create_workflow(&simple_workflow("wf")).await;
    let addr = s.addr;
    let mut conns = Vec::new();
    for _ in 0..8 {
        conns.push(create_mid_body(addr).await);
    }
    let shutdown = begin_shutdown(s).await;
    for mut c in conns {
        tokio::time::sleep(Duration::from_millis(100)).await;
        c.write_all(b" 1}\n").await.unwrap();
        let (text, _) = read_until_close(&mut c, Duration::from_secs(5)).await;
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    }
    shutdown.await.unwrap();
    assert_eq!(db.count("SELECT count(*) FROM service_requests").await, 8);
}

#[test]
fn the_binary_explains_bad_configuration_and_missing_postgres() {
    let bin = env!("CARGO_BIN_EXE_clamp");
    let out = std::process::Command::new(bin)
        .args(["--max-batch", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--max-batch"), "{err}");

    let out = std::process::Command::new(bin)
        .args([
            "--port",
            "0",
            "--database-url",
            "postgres://clamp:hunter2@127.0.0.1:1/clamp",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("postgres://clamp:***@127.0.0.1:1/clamp"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
    assert!(err.contains("scripts/dev-postgres.sh"), "{err}");

    let out = std::process::Command::new(bin)
        .env(
            "CLAMP_DB_CONNECTION_STR",
            "host=127.0.0.1:1 user=u dbname=d password=p",
        )
        .env_remove("DATABASE_URL")
        .args(["--port", "0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("postgres://u:***@127.0.0.1:1/d"), "{err}");
}

/// A second server on a port another one listens on is refused, not started beside it:
/// SO_REUSEPORT would let it bind, and the kernel would then split the port's
/// connections between two servers (other tokens, another database).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_another_server_listens_on_is_refused() {
    let db = TestDb::new();
    let first = TestServer::start(config(&db.url)).await;
    let mut cfg = config(&db.url);
    cfg.listen = first.addr;
    let err = match clamp::start(cfg).await {
        Ok(_) => panic!("a second server started on {}", first.addr),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("cannot listen on") && err.contains(&first.addr.port().to_string()),
        "{err}"
    );
    assert_eq!(first.get("/health").await.status, 200);
    first.shutdown().await;
}

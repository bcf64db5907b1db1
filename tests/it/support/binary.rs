//! The real `clamp` binary as a child process (killed when dropped), a free port for it,
//! and waiting until it answers `/health`.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::http::send;
use super::waiting::wait_for;

/// A port nothing listens on right now, and never handed out before in this test
/// process. Servers bind with SO_REUSEPORT (a listener per runtime), so two servers given
/// one port would both start and split its connections between them; a port handed out
/// once is therefore not handed out again, and in-process servers take theirs from here
/// too (`TestServer::start`) instead of letting the kernel pick one that a test is about
/// to give a binary.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if GIVEN.lock().unwrap().insert(port) {
            return port;
        }
    }
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
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_for(
        &format!("the server on {port} to answer /health"),
        Duration::from_secs(20),
        || async {
            // Connected first: `send` panics on a refused connection.
            let up = tokio::net::TcpStream::connect(addr).await.is_ok()
                && send(addr, hyper::Method::GET, "/health", None, &[])
                    .await
                    .status
                    == 200;
            up.then_some(())
        },
    )
    .await;
}

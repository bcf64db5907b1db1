//! A Postgres socket that gives up on a server gone silent. A server whose process is
//! frozen (SIGSTOP, a hung host) still has a kernel that accepts bytes and acknowledges
//! TCP keepalives, and it never enforces its own `statement_timeout`: a statement sent to
//! it waits forever. `Watched` ends the connection instead once something was written and
//! nothing at all has been read back for `limit` (every statement of ours answers within
//! its `statement_timeout`, so a healthy server is never silent that long), and tells the
//! host's `Health` so that the pool drops the other connections to that host at once
//! rather than one `limit` each.
//!
//! It sits below TLS, so it sees only that bytes move, not which messages they carry: a
//! server that answers the first of several pipelined statements and then freezes is not
//! caught until the next write. Our statements are sent one at a time per connection.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio::time::{Instant, Sleep};

/// A connection's transport: TCP, or a Unix socket (which Postgres never encrypts).
pub enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Socket::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Socket::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_flush(cx),
            Socket::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Socket::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// What is known of one database host across its connections: when it was last found
/// silent or unreachable, in milliseconds since `epoch` (0: never).
pub struct Health {
    epoch: std::time::Instant,
    silent_at_ms: AtomicU64,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            epoch: std::time::Instant::now(),
            silent_at_ms: AtomicU64::new(0),
        }
    }
}

impl Health {
    /// Milliseconds since this host's epoch, never 0 (0 means "never").
    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// The host fell silent, or could not be connected to, now.
    pub fn mark_failed(&self) {
        self.silent_at_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// True when a connection opened at `opened_ms` predates the host's last silence:
    /// it is to the same frozen server, or was, and is not to be trusted.
    pub fn outlived(&self, opened_ms: u64) -> bool {
        self.silent_at_ms.load(Ordering::Relaxed) >= opened_ms
    }

    /// True when the host was found silent within `window`.
    pub fn silent_within(&self, window: Duration) -> bool {
        let at = self.silent_at_ms.load(Ordering::Relaxed);
        at != 0 && self.now_ms().saturating_sub(at) <= window.as_millis() as u64
    }
}

/// A socket that fails its reads once it has been silent too long after a write.
pub struct Watched {
    inner: Socket,
    guard: Option<Guard>,
}

struct Guard {
    limit: Duration,
    health: Arc<Health>,
    /// The first write not followed by any read.
    sent_at: Option<Instant>,
    /// Armed lazily: reset only when it fires, not at every write.
    timer: Pin<Box<Sleep>>,
    armed: bool,
}

impl Watched {
    /// `limit` None: never gives up (a connection whose statements may run long).
    pub fn new(inner: Socket, limit: Option<Duration>, health: Arc<Health>) -> Watched {
        Watched {
            inner,
            guard: limit.map(|limit| Guard {
                limit,
                health,
                sent_at: None,
                timer: Box::pin(tokio::time::sleep(limit)),
                armed: false,
            }),
        }
    }
}

impl Guard {
    fn wrote(&mut self) {
        if self.sent_at.is_none() {
            let now = Instant::now();
            self.sent_at = Some(now);
            if !self.armed {
                self.timer.as_mut().reset(now + self.limit);
                self.armed = true;
            }
        }
    }

    /// With nothing to read yet: an error once the silence has lasted `limit`.
    fn check(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        while self.armed {
            if self.timer.as_mut().poll(cx).is_pending() {
                return None;
            }
            match self.sent_at {
                None => self.armed = false,
                Some(t) if t.elapsed() >= self.limit => {
                    self.health.mark_failed();
                    return Some(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "no answer from the database for {} ms",
                            self.limit.as_millis()
                        ),
                    ));
                }
                Some(t) => self.timer.as_mut().reset(t + self.limit),
            }
        }
        None
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if let Some(g) = this.guard.as_mut() {
                    if buf.filled().len() > before {
                        g.sent_at = None;
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match this.guard.as_mut().and_then(|g| g.check(cx)) {
                Some(e) => Poll::Ready(Err(e)),
                None => Poll::Pending,
            },
            other => other,
        }
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let (Poll::Ready(Ok(n)), Some(g)) = (&r, this.guard.as_mut()) {
            if *n > 0 {
                g.wrote();
            }
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn pair(limit: Duration) -> (Watched, TcpStream, Arc<Health>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (server, _) = l.accept().await.unwrap();
        let health = Arc::new(Health::default());
        (
            Watched::new(Socket::Tcp(client), Some(limit), health.clone()),
            server,
            health,
        )
    }

    #[tokio::test]
    async fn a_silent_server_is_given_up_after_the_limit() {
        let (mut w, _server, health) = pair(Duration::from_millis(200)).await;
        let opened = health.now_ms();
        w.write_all(b"ping").await.unwrap();
        let t0 = std::time::Instant::now();
        let mut buf = [0u8; 8];
        let e = w.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let waited = t0.elapsed();
        assert!(
            waited >= Duration::from_millis(190) && waited < Duration::from_secs(2),
            "{waited:?}"
        );
        assert!(health.outlived(opened));
        assert!(health.silent_within(Duration::from_secs(5)));
    }

    #[tokio::test]
    async fn an_answering_server_and_an_idle_one_are_kept() {
        let (mut w, mut server, health) = pair(Duration::from_millis(200)).await;
        // Idle (nothing written): no limit applies.
        let mut buf = [0u8; 8];
        assert!(
            tokio::time::timeout(Duration::from_millis(400), w.read(&mut buf))
                .await
                .is_err()
        );
        // Each answer comes within the limit, though the exchange lasts longer.
        for _ in 0..4 {
            w.write_all(b"q").await.unwrap();
            let mut one = [0u8; 1];
            server.read_exact(&mut one).await.unwrap();
            tokio::time::sleep(Duration::from_millis(120)).await;
            server.write_all(b"a").await.unwrap();
            assert_eq!(w.read(&mut buf).await.unwrap(), 1);
        }
        assert!(!health.silent_within(Duration::from_secs(5)));
    }
}

//! A TCP proxy in front of Postgres (or any server) that a test can cut, stall, or arm to
//! drop the connection that sends a given statement: a dead, hung or restarting database
//! on demand, with the server under test none the wiser.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

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

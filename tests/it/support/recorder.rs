//! A listener that records who dialled it: the connections it accepted and every byte
//! their clients sent, forwarding them to an upstream when given one (a broker behind
//! it), so a test can tell whether the server under test reached an address at all, and
//! what it said there.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct Recorder {
    pub addr: SocketAddr,
    dialled: Arc<AtomicUsize>,
    heard: Arc<Mutex<Vec<u8>>>,
}

impl Recorder {
    /// Records on `at` (`127.0.0.1:0` for any port), forwarding to `upstream` if given
    /// (else the connection is held open, answering nothing).
    pub async fn start(at: &str, upstream: Option<SocketAddr>) -> Recorder {
        let listener = TcpListener::bind(at).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let dialled = Arc::new(AtomicUsize::new(0));
        let heard = Arc::new(Mutex::new(Vec::new()));
        let (d, h) = (dialled.clone(), heard.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                d.fetch_add(1, Ordering::SeqCst);
                let h = h.clone();
                tokio::spawn(relay(client, upstream, h));
            }
        });
        Recorder {
            addr,
            dialled,
            heard,
        }
    }

    /// Connections accepted so far.
    pub fn dialled(&self) -> usize {
        self.dialled.load(Ordering::SeqCst)
    }

    /// Whether any client sent `needle`.
    pub fn heard(&self, needle: &[u8]) -> bool {
        self.heard.lock().windows(needle.len()).any(|w| w == needle)
    }

    /// Forgets what was recorded so far.
    pub fn reset(&self) {
        self.dialled.store(0, Ordering::SeqCst);
        self.heard.lock().clear();
    }
}

async fn relay(client: TcpStream, upstream: Option<SocketAddr>, heard: Arc<Mutex<Vec<u8>>>) {
    let (mut from_client, mut to_client) = client.into_split();
    let Some(up) = upstream else {
        let mut buf = [0u8; 4096];
        while let Ok(n) = from_client.read(&mut buf).await {
            if n == 0 {
                break;
            }
            heard.lock().extend_from_slice(&buf[..n]);
        }
        return;
    };
    let Ok(server) = TcpStream::connect(up).await else {
        return;
    };
    let (mut from_server, mut to_server) = server.into_split();
    let up = async move {
        let mut buf = [0u8; 8192];
        while let Ok(n) = from_client.read(&mut buf).await {
            if n == 0 {
                break;
            }
            heard.lock().extend_from_slice(&buf[..n]);
            if to_server.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = to_server.shutdown().await;
    };
    let down = async move {
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
        let _ = to_client.shutdown().await;
    };
    tokio::join!(up, down);
}

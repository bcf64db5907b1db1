//! The relay a Kafka step's client reaches its brokers through. A Kafka client dials the
//! bootstrap brokers it is given, then whatever brokers the cluster's metadata names, and
//! resolves each name itself: a policy checked only on the bootstrap list would let a
//! cluster (or whoever runs one) send the client anywhere. So the client is given this
//! relay as its SOCKS5 proxy: for every connection it asks for, the relay judges the host
//! and each address it resolves to, dials a judged address, and refuses the rest before
//! anything is dialled, remembering why so that the step can say so.
//!
//! One relay per client, on 127.0.0.1 and an ephemeral port, living as long as the client
//! (dropping it stops accepting); a relayed connection lives as long as either end keeps
//! it open. Only what SOCKS5 needs for CONNECT without authentication is spoken (RFC 1928).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{Destinations, DialError, Refused};

/// How long one connection's SOCKS5 exchange and dial may take.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// SOCKS5 replies (RFC 1928, 6).
const SUCCEEDED: u8 = 0x00;
const GENERAL_FAILURE: u8 = 0x01;
const NOT_ALLOWED: u8 = 0x02;
const HOST_UNREACHABLE: u8 = 0x04;
const COMMAND_NOT_SUPPORTED: u8 = 0x07;

/// A running relay; dropping it stops it accepting.
pub struct Relay {
    addr: SocketAddr,
    refused: Arc<Mutex<Option<Refused>>>,
    accept: tokio::task::AbortHandle,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Relay {
    /// Binds a relay judging by `policy` and starts accepting on the current runtime.
    pub async fn start(policy: Arc<Destinations>) -> std::io::Result<Relay> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let refused = Arc::new(Mutex::new(None));
        let noted = refused.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    // Out of descriptors and the like: wait, as the server's own loop does.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let (policy, noted) = (policy.clone(), noted.clone());
                tokio::spawn(async move {
                    let upstream =
                        tokio::time::timeout(SETUP_TIMEOUT, setup(client, &policy, &noted)).await;
                    if let Ok(Some((mut client, mut upstream))) = upstream {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                    }
                });
            }
        })
        .abort_handle();
        Ok(Relay {
            addr,
            refused,
            accept,
        })
    }

    /// The proxy address the client is given.
    pub fn proxy(&self) -> String {
        self.addr.to_string()
    }

    /// Why the relay last refused a broker, if it has (taken: asked once per failure).
    pub fn take_refusal(&self) -> Option<Refused> {
        self.refused.lock().take()
    }
}

/// The SOCKS5 exchange: the target read, judged and dialled, and the reply sent. None when
/// the connection ends here (refused, unreachable, or not SOCKS5).
async fn setup(
    mut client: TcpStream,
    policy: &Destinations,
    refused: &Mutex<Option<Refused>>,
) -> Option<(TcpStream, TcpStream)> {
    // Greeting: version 5, the methods offered; "no authentication" is chosen.
    let mut head = [0u8; 2];
    client.read_exact(&mut head).await.ok()?;
    let mut methods = vec![0u8; usize::from(head[1])];
    client.read_exact(&mut methods).await.ok()?;
    if head[0] != 5 || !methods.contains(&0) {
        let _ = client.write_all(&[5, 0xff]).await;
        return None;
    }
    client.write_all(&[5, 0]).await.ok()?;
    // Request: version, command, reserved, then the target.
    let mut req = [0u8; 4];
    client.read_exact(&mut req).await.ok()?;
    let host = match req[3] {
        1 => {
            let mut a = [0u8; 4];
            client.read_exact(&mut a).await.ok()?;
            Ipv4Addr::from(a).to_string()
        }
        3 => {
            let mut len = [0u8; 1];
            client.read_exact(&mut len).await.ok()?;
            let mut name = vec![0u8; usize::from(len[0])];
            client.read_exact(&mut name).await.ok()?;
            String::from_utf8(name).ok()?
        }
        4 => {
            let mut a = [0u8; 16];
            client.read_exact(&mut a).await.ok()?;
            Ipv6Addr::from(a).to_string()
        }
        _ => return None,
    };
    let mut port = [0u8; 2];
    client.read_exact(&mut port).await.ok()?;
    let port = u16::from_be_bytes(port);
    if req[0] != 5 || req[1] != 1 {
        reply(&mut client, COMMAND_NOT_SUPPORTED).await;
        return None;
    }
    let addrs = match policy.addrs(&host, port).await {
        Ok(a) => a,
        Err(DialError::Refused(why)) => {
            *refused.lock() = Some(Refused(format!(
                "the broker {host}:{port} that the cluster named: {}",
                why.0
            )));
            reply(&mut client, NOT_ALLOWED).await;
            return None;
        }
        Err(DialError::Resolve { .. }) => {
            reply(&mut client, HOST_UNREACHABLE).await;
            return None;
        }
    };
    let Ok(upstream) = TcpStream::connect(&addrs[..]).await else {
        reply(&mut client, GENERAL_FAILURE).await;
        return None;
    };
    let _ = upstream.set_nodelay(true);
    let _ = client.set_nodelay(true);
    reply(&mut client, SUCCEEDED).await;
    Some((client, upstream))
}

/// A reply with an unspecified bound address (the client does not use it).
async fn reply(client: &mut TcpStream, code: u8) {
    let _ = client.write_all(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0]).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_denied_broker_is_refused_before_it_is_dialled_and_an_allowed_one_relayed() {
        let upstream = TcpListener::bind("127.0.0.2:0").await.unwrap();
        let port = upstream.local_addr().unwrap().port();
        let policy = Arc::new(Destinations::new::<&str>(&[], &["127.0.0.1/32", "::1"]).unwrap());
        let relay = Relay::start(policy).await.unwrap();
        let ask = |host: &'static [u8], port: u16| {
            let proxy = relay.proxy();
            async move {
                let mut c = TcpStream::connect(proxy).await.unwrap();
                c.write_all(&[5, 1, 0]).await.unwrap();
                let mut chosen = [0u8; 2];
                c.read_exact(&mut chosen).await.unwrap();
                assert_eq!(chosen, [5, 0]);
                let mut req = vec![5, 1, 0, 3, host.len() as u8];
                req.extend_from_slice(host);
                req.extend_from_slice(&port.to_be_bytes());
                c.write_all(&req).await.unwrap();
                let mut rep = [0u8; 10];
                c.read_exact(&mut rep).await.unwrap();
                (c, rep[1])
            }
        };
        let (_, code) = ask(b"localhost", port).await;
        assert_eq!(code, NOT_ALLOWED);
        let why = relay.take_refusal().unwrap();
        assert!(
            why.0.contains("localhost") && why.0.contains("127.0.0.1/32"),
            "{why}"
        );
        let (_, code) = ask(b"0.0.0.0", port).await;
        assert_eq!(code, NOT_ALLOWED);
        assert!(relay.take_refusal().unwrap().0.contains("0.0.0.0"));
        let (mut c, code) = ask(b"127.0.0.2", port).await;
        assert_eq!(code, SUCCEEDED);
        let (mut accepted, _) = upstream.accept().await.unwrap();
        c.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        accepted.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        assert!(relay.take_refusal().is_none());
    }
}

//! One HTTP/1.1 keep-alive connection, driven inside the calling task.
//!
//! hyper's client splits a connection into a request handle and a
//! connection future that is normally spawned as its own task; here the
//! connection future is polled alongside each request instead, so a request
//! costs no cross-task wake-ups and each virtual user is a single task.

use crate::recorder::ErrorKind;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper::header::{HeaderValue, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Uri};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::net::TcpStream;

type Io = TokioIo<TcpStream>;

/// Where and how to connect; shared by every virtual user.
#[derive(Debug)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub host: HeaderValue,
    pub timeout: Duration,
}

/// A response with its body fully read (which lets the connection be reused).
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: Bytes,
}

pub struct Conn {
    sender: SendRequest<Full<Bytes>>,
    driver: Pin<Box<Connection<Io, Full<Bytes>>>>,
}

impl Conn {
    pub async fn connect(ep: &Endpoint) -> Result<Self, ErrorKind> {
        let fut = async {
            let stream = TcpStream::connect(ep.addr).await.ok()?;
            // Requests are small and latency-bound: never wait for Nagle.
            stream.set_nodelay(true).ok()?;
            http1::handshake(TokioIo::new(stream)).await.ok()
        };
        match tokio::time::timeout(ep.timeout, fut).await {
            Ok(Some((sender, driver))) => Ok(Self {
                sender,
                driver: Box::pin(driver),
            }),
            Ok(None) => Err(ErrorKind::Connect),
            Err(_) => Err(ErrorKind::Timeout),
        }
    }

    /// Sends one request and reads the whole answer. Any error leaves the
    /// connection in an unknown state, so callers drop it. `Ok(None)` means
    /// the connection turned out to be closed before the request went out
    /// (an idle keep-alive connection the server dropped), so it is safe to
    /// retry on a new one.
    pub async fn send(
        &mut self,
        ep: &Endpoint,
        req: Request<Full<Bytes>>,
    ) -> Result<Option<Response>, ErrorKind> {
        let Self { sender, driver } = self;
        // Atomic rather than Cell so the future stays Send.
        let sent = AtomicBool::new(false);
        let exchange = async {
            sender.ready().await.map_err(|_| ErrorKind::Io)?;
            sent.store(true, Ordering::Relaxed);
            let resp = sender.send_request(req).await.map_err(|_| ErrorKind::Io)?;
            let status = resp.status().as_u16();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|_| ErrorKind::Io)?
                .to_bytes();
            Ok(Some(Response { status, body }))
        };
        let with_driver = async {
            tokio::select! {
                biased;
                r = exchange => r,
                // The driver only finishes when the connection closes.
                _ = driver.as_mut() => if sent.load(Ordering::Relaxed) {
                    Err(ErrorKind::Io)
                } else {
                    Ok(None)
                },
            }
        };
        tokio::time::timeout(ep.timeout, with_driver)
            .await
            .unwrap_or(Err(ErrorKind::Timeout))
    }
}

/// Builds a request; `uri` is a path (origin-form), the body may be empty.
pub fn request(ep: &Endpoint, method: Method, uri: Uri, body: Bytes) -> Request<Full<Bytes>> {
    let is_post = method == Method::POST;
    let mut req = Request::new(Full::new(body));
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    let headers = req.headers_mut();
    headers.insert(HOST, ep.host.clone());
    if is_post {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    req
}

/// A virtual user's connection slot: connects lazily, and reconnects after
/// any transport error.
pub struct Client {
    pub ep: std::sync::Arc<Endpoint>,
    conn: Option<Conn>,
}

impl Client {
    pub fn new(ep: std::sync::Arc<Endpoint>) -> Self {
        Self { ep, conn: None }
    }

    /// Opens the connection ahead of the run so set-up time is not measured.
    pub async fn warm(&mut self) -> Result<(), ErrorKind> {
        if self.conn.is_none() {
            self.conn = Some(Conn::connect(&self.ep).await?);
        }
        Ok(())
    }

    pub async fn call(
        &mut self,
        method: Method,
        uri: Uri,
        body: Bytes,
    ) -> Result<Response, ErrorKind> {
        // One retry, and only for a request that never left the client.
        for _ in 0..2 {
            self.warm().await?;
            let req = request(&self.ep, method.clone(), uri.clone(), body.clone());
            let conn = self.conn.as_mut().expect("connected above");
            match conn.send(&self.ep, req).await {
                Ok(Some(resp)) => return Ok(resp),
                Ok(None) => self.conn = None,
                Err(e) => {
                    self.conn = None;
                    return Err(e);
                }
            }
        }
        Err(ErrorKind::Io)
    }

    pub async fn get(&mut self, uri: Uri) -> Result<Response, ErrorKind> {
        self.call(Method::GET, uri, Bytes::new()).await
    }

    pub async fn post(&mut self, uri: Uri, body: Bytes) -> Result<Response, ErrorKind> {
        self.call(Method::POST, uri, body).await
    }
}

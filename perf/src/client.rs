//! One HTTP/1.1 keep-alive connection per virtual user, speaking the wire
//! format directly over a tokio `TcpStream` (see `http1` for why), with
//! request and read buffers reused across requests.

use crate::http1::{self, BodyKind};
use crate::recorder::ErrorKind;
use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Where and how to connect; shared by every virtual user.
#[derive(Debug)]
pub struct Endpoint {
    pub addr: SocketAddr,
    /// Host header value (`host:port`).
    pub host: String,
    pub timeout: Duration,
}

/// A response with its body fully read.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: Bytes,
    /// `Retry-After` in seconds, if the server sent one.
    pub retry_after: Option<u64>,
}

const INITIAL_READ_BUF: usize = 8 * 1024;
/// Larger answers are treated as broken: nothing in the API is this big.
const MAX_RESPONSE: usize = 16 * 1024 * 1024;

enum Failure {
    /// The server had closed the connection before answering anything:
    /// an idle keep-alive connection it dropped; safe to retry once.
    ClosedBeforeAnswer,
    Error(ErrorKind),
}

impl From<http1::Malformed> for Failure {
    fn from(_: http1::Malformed) -> Self {
        Failure::Error(ErrorKind::BadResponse)
    }
}

fn io_error(_: std::io::Error) -> Failure {
    Failure::Error(ErrorKind::Io)
}

/// Reads more bytes into `buf[filled..]`, growing it when full.
async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>, filled: usize) -> Result<usize, Failure> {
    if filled == buf.len() {
        if buf.len() >= MAX_RESPONSE {
            return Err(Failure::Error(ErrorKind::BadResponse));
        }
        buf.resize(buf.len() * 2, 0);
    }
    stream.read(&mut buf[filled..]).await.map_err(io_error)
}

/// Writes one request and reads one response; returns it and whether the
/// connection may be reused.
async fn exchange(
    stream: &mut TcpStream,
    rbuf: &mut Vec<u8>,
    chunked: &mut Vec<u8>,
    request: &[u8],
) -> Result<(Response, bool), Failure> {
    if stream.write_all(request).await.is_err() {
        return Err(Failure::ClosedBeforeAnswer);
    }
    let mut filled = 0;
    let head = loop {
        if let Some(h) = http1::parse_head(&rbuf[..filled])? {
            break h;
        }
        match fill(stream, rbuf, filled).await {
            Ok(0) if filled == 0 => return Err(Failure::ClosedBeforeAnswer),
            Ok(0) => return Err(Failure::Error(ErrorKind::Io)),
            Ok(n) => filled += n,
            // A reset before any answer is the same idle-close race.
            Err(_) if filled == 0 => return Err(Failure::ClosedBeforeAnswer),
            Err(e) => return Err(e),
        }
    };
    let body = match head.body {
        BodyKind::Length(n) => {
            let end = head.len + n;
            if end > MAX_RESPONSE {
                return Err(Failure::Error(ErrorKind::BadResponse));
            }
            if rbuf.len() < end {
                rbuf.resize(end, 0);
            }
            while filled < end {
                match fill(stream, rbuf, filled).await? {
                    0 => return Err(Failure::Error(ErrorKind::Io)),
                    n => filled += n,
                }
            }
            Bytes::copy_from_slice(&rbuf[head.len..end])
        }
        BodyKind::Chunked => loop {
            if http1::decode_chunked(&rbuf[head.len..filled], chunked)?.is_some() {
                break Bytes::copy_from_slice(chunked);
            }
            match fill(stream, rbuf, filled).await? {
                0 => return Err(Failure::Error(ErrorKind::Io)),
                n => filled += n,
            }
        },
        BodyKind::UntilClose => loop {
            match fill(stream, rbuf, filled).await? {
                0 => break Bytes::copy_from_slice(&rbuf[head.len..filled]),
                n => filled += n,
            }
        },
    };
    let response = Response {
        status: head.status,
        body,
        retry_after: head.retry_after,
    };
    Ok((response, head.keep_alive))
}

/// A virtual user's connection: connects lazily and reconnects after any
/// transport error or a `Connection: close`.
pub struct Client {
    pub ep: Arc<Endpoint>,
    stream: Option<TcpStream>,
    /// Whether the open connection already carried a request.
    reused: bool,
    wbuf: Vec<u8>,
    rbuf: Vec<u8>,
    chunked: Vec<u8>,
}

impl Client {
    pub fn new(ep: Arc<Endpoint>) -> Self {
        Self {
            ep,
            stream: None,
            reused: false,
            wbuf: Vec::with_capacity(1024),
            rbuf: vec![0; INITIAL_READ_BUF],
            chunked: Vec::new(),
        }
    }

    /// Opens the connection (ahead of the run, so set-up is not measured).
    pub async fn warm(&mut self) -> Result<(), ErrorKind> {
        if self.stream.is_some() {
            return Ok(());
        }
        let stream =
            match tokio::time::timeout(self.ep.timeout, TcpStream::connect(self.ep.addr)).await {
                Ok(Ok(s)) => s,
                Ok(Err(_)) => return Err(ErrorKind::Connect),
                Err(_) => return Err(ErrorKind::Timeout),
            };
        // Requests are small and latency-bound: never wait for Nagle.
        let _ = stream.set_nodelay(true);
        self.stream = Some(stream);
        self.reused = false;
        Ok(())
    }

    pub async fn call(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<Response, ErrorKind> {
        self.call_with(method, path, None, body).await
    }

    /// `call` with one extra request header.
    pub async fn call_with(
        &mut self,
        method: &str,
        path: &str,
        extra: Option<(&str, &str)>,
        body: &[u8],
    ) -> Result<Response, ErrorKind> {
        http1::encode_request(&mut self.wbuf, method, path, &self.ep.host, extra, body);
        // One retry, and only when a reused connection turned out closed.
        loop {
            self.warm().await?;
            let stream = self.stream.as_mut().expect("connected above");
            let fut = exchange(stream, &mut self.rbuf, &mut self.chunked, &self.wbuf);
            let result = tokio::time::timeout(self.ep.timeout, fut).await;
            let was_reused = self.reused;
            match result {
                Ok(Ok((resp, keep_alive))) => {
                    if keep_alive {
                        self.reused = true;
                    } else {
                        self.stream = None;
                    }
                    return Ok(resp);
                }
                Ok(Err(Failure::ClosedBeforeAnswer)) if was_reused => self.stream = None,
                Ok(Err(Failure::ClosedBeforeAnswer)) => {
                    self.stream = None;
                    return Err(ErrorKind::Io);
                }
                Ok(Err(Failure::Error(kind))) => {
                    self.stream = None;
                    return Err(kind);
                }
                Err(_) => {
                    self.stream = None;
                    return Err(ErrorKind::Timeout);
                }
            }
        }
    }

    pub async fn get(&mut self, path: &str) -> Result<Response, ErrorKind> {
        self.call("GET", path, b"").await
    }

    pub async fn post(&mut self, path: &str, body: &[u8]) -> Result<Response, ErrorKind> {
        self.call("POST", path, body).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A scripted server: answers each request on one connection with the
    /// next canned reply, then closes.
    async fn scripted(replies: Vec<&'static [u8]>) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            for r in replies {
                let _ = s.read(&mut buf).await.unwrap();
                s.write_all(r).await.unwrap();
            }
        });
        addr
    }

    fn client(addr: SocketAddr, timeout: Duration) -> Client {
        Client::new(Arc::new(Endpoint {
            addr,
            host: "test".into(),
            timeout,
        }))
    }

    #[tokio::test]
    async fn keep_alive_chunked_and_status() {
        let addr = scripted(vec![
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            b"HTTP/1.1 503 Busy\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n",
        ])
        .await;
        let mut c = client(addr, Duration::from_secs(5));
        let r = c.get("/a").await.unwrap();
        assert_eq!((r.status, &r.body[..]), (200, &b"{}"[..]));
        let r = c.post("/b", b"{\"x\":1}").await.unwrap();
        assert_eq!(&r.body[..], b"abc");
        let r = c.get("/c").await.unwrap();
        assert_eq!((r.status, r.retry_after), (503, Some(1)));
    }

    #[tokio::test]
    async fn timeout_and_connect_errors() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        // Accepts but never answers.
        let _keep = tokio::spawn(async move {
            let (_s, _) = l.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        let mut c = client(addr, Duration::from_millis(100));
        assert_eq!(c.get("/").await.unwrap_err(), ErrorKind::Timeout);
        let free = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let mut c = client(free, Duration::from_secs(1));
        assert_eq!(c.get("/").await.unwrap_err(), ErrorKind::Connect);
    }

    #[tokio::test]
    async fn reused_connection_closed_by_server_is_retried() {
        // First connection answers once and closes; the retry lands on a
        // second connection.
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            for _ in 0..2 {
                let (mut s, _) = l.accept().await.unwrap();
                let _ = s.read(&mut buf).await.unwrap();
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx")
                    .await
                    .unwrap();
                // wait for the client to send its next request, then close
                let _ = s.read(&mut buf).await;
            }
        });
        let mut c = client(addr, Duration::from_secs(5));
        assert_eq!(c.get("/").await.unwrap().status, 200);
        assert_eq!(c.get("/").await.unwrap().status, 200);
    }
}

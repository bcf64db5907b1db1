//! A small HTTP/1.1 client for talking to servers under test: one request on a fresh
//! connection (`send`), or a keep-alive connection (`Conn`); answers read whole (`Resp`).

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::HeaderValue;
use hyper::{Method, Request, StatusCode};
use serde_json::Value;
use tokio::net::TcpStream;

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

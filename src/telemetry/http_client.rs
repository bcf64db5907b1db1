//! The exporter's HTTP client: hyper's HTTP/1 client, the one the steps use, behind
//! `opentelemetry-http`'s `HttpClient` trait. (That crate's own hyper client turns on
//! hyper's HTTP/2 support for the whole binary, which made every step call dearer
//! with tracing off: docs/decisions.md.)

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Request, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use opentelemetry_http::{HttpClient, HttpError};

/// Largest export answer read (an OTLP answer is a few bytes, or a partial-success note).
const MAX_ANSWER: usize = 1 << 20;

#[derive(Debug, Clone)]
pub struct ExportClient {
    client: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

impl ExportClient {
    pub fn new(timeout: Duration) -> ExportClient {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        connector.set_nodelay(true);
        ExportClient {
            client: Client::builder(TokioExecutor::new())
                .pool_timer(TokioTimer::new())
                .timer(TokioTimer::new())
                .build(connector),
            timeout,
        }
    }
}

#[async_trait::async_trait]
impl HttpClient for ExportClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let request = Request::from_parts(parts, Full::new(body));
        tokio::time::timeout(self.timeout, async {
            let response = self.client.request(request).await?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, MAX_ANSWER).collect().await?.to_bytes();
            Ok(Response::from_parts(parts, body))
        })
        .await
        .map_err(|_| -> HttpError { "the OTLP export timed out".into() })?
    }
}

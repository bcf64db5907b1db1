//! Running an HTTP step: one pooled hyper client per runtime (`http://` and `https://`,
//! connections and TLS sessions reused per scheme, host and port), connect and total
//! timeouts, a response size cap, and the headers a step sends.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE, HOST, RETRY_AFTER};
use hyper::Request;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::call::{parse_retry_after, CallError, CallErrorKind};
use super::doc::Doc;
use super::step_trace::StepTrace;
use crate::destinations::{Destinations, Refused, Resolver};
use crate::secrets::{self, Secrets};
use crate::workflow::HttpVal;

/// The pooled client a runtime's steps share.
#[derive(Clone)]
pub struct HttpClient {
    client: Client<HttpsConnector<HttpConnector<Resolver>>, Full<Bytes>>,
    /// Where steps may call: names are checked by the resolver, literal addresses here.
    policy: Arc<Destinations>,
    /// Where the secrets a step refers to come from, read at each call that needs one.
    secrets: Arc<Secrets>,
    timeout: Duration,
    max_response: usize,
}

impl HttpClient {
    /// `tls` checks `https://` servers (`outbound::tls`: chain and host name, always); its
    /// session cache is shared by every runtime's client.
    pub fn new(
        s: &crate::config::HttpSettings,
        tls: Arc<rustls::ClientConfig>,
        policy: Arc<Destinations>,
        secrets: Arc<Secrets>,
    ) -> HttpClient {
        let mut http = HttpConnector::new_with_resolver(Resolver::new(policy.clone()));
        http.set_connect_timeout(Some(s.connect_timeout));
        http.set_nodelay(true);
        // The TLS layer hands `https://` URIs down to this connector.
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config((*tls).clone())
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(s.max_idle_per_host)
            .build(connector);
        HttpClient {
            client,
            policy,
            secrets,
            timeout: s.timeout,
            max_response: s.max_response_bytes,
        }
    }

    /// Calls the step once. Any 2xx is success; the response body is kept as it came
    /// when it is JSON (a body that is not JSON becomes a JSON string, an empty one
    /// `null`). A failure says what kind it was, for the step's retry policy, and why.
    pub async fn call(
        &self,
        val: &HttpVal,
        body: &Doc,
        forwarded: &[(HeaderName, HeaderValue)],
        idempotency_key: HeaderValue,
        trace: Option<&mut StepTrace>,
    ) -> Result<Doc, CallError> {
        let req = self.request(val, body, forwarded, idempotency_key, trace.as_deref())?;
        let timeout = val.timeout_ms.map_or(self.timeout, Duration::from_millis);
        let (status, retry_after, bytes) =
            tokio::time::timeout(timeout, self.exchange(req, val, trace))
                .await
                .map_err(|_| {
                    CallError::new(
                        CallErrorKind::Timeout,
                        format!("timed out after {} ms", timeout.as_millis()),
                    )
                })??;
        if status.is_success() {
            return Ok(Doc::from_response(bytes));
        }
        let snippet = String::from_utf8_lossy(&bytes[..bytes.len().min(256)]).into_owned();
        Err(CallError {
            kind: CallErrorKind::Status(status.as_u16()),
            message: format!(
                "HTTP {} {} answered {}: {}",
                val.method,
                val.url,
                status.as_u16(),
                snippet
            ),
            retry_after,
        })
    }

    /// The request of one attempt: its address judged by the policy (a literal one; a
    /// name is judged by the addresses it resolves to), its secrets filled in, its
    /// headers (forwarded, the step's, `Host`, `Idempotency-Key`, the trace's) and body.
    fn request(
        &self,
        val: &HttpVal,
        body: &Doc,
        forwarded: &[(HeaderName, HeaderValue)],
        idempotency_key: HeaderValue,
        trace: Option<&StepTrace>,
    ) -> Result<Request<Full<Bytes>>, CallError> {
        if let Some(ip) = val
            .url
            .host()
            .and_then(|h| h.trim_matches(['[', ']']).parse::<std::net::IpAddr>().ok())
        {
            self.policy
                .check_addr(None, ip)
                .map_err(|e| CallError::new(CallErrorKind::Other, e.to_string()))?;
        }
        // A URL whose query names a secret is made for this call only.
        let uri = match &val.secret_url {
            None => val.url.clone(),
            Some(t) => self
                .with_secrets(t, secrets::for_url)?
                .parse()
                .map_err(|_| {
                    CallError::new(
                        CallErrorKind::Other,
                        "the URL is not valid with its secrets filled in",
                    )
                })?,
        };
        let mut req = Request::builder().method(val.method.clone()).uri(uri);
        let headers = req.headers_mut().expect("builder has no error yet");
        self.headers(headers, val, forwarded, trace)?;
        headers.insert(HeaderName::from_static("idempotency-key"), idempotency_key);
        let payload = if val.method == hyper::Method::GET {
            Bytes::new()
        } else {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            body.to_bytes()
        };
        req.body(Full::new(payload))
            .map_err(|e| CallError::new(CallErrorKind::Other, format!("cannot build request: {e}")))
    }

    /// Forwarded client headers first, so the step's own headers win (both parsed once:
    /// a clone here is a reference count), the step's secrets filled in, `Host`, and the
    /// trace's `traceparent` and `tracestate`.
    fn headers(
        &self,
        headers: &mut hyper::HeaderMap,
        val: &HttpVal,
        forwarded: &[(HeaderName, HeaderValue)],
        trace: Option<&StepTrace>,
    ) -> Result<(), CallError> {
        for (k, v) in forwarded.iter().chain(val.headers.iter()) {
            headers.insert(k.clone(), v.clone());
        }
        if val.secret_headers {
            for (k, v) in &val.headers {
                let Some(t) = v.to_str().ok().filter(|t| secrets::refers(t)) else {
                    continue;
                };
                let mut filled = HeaderValue::from_str(&self.with_secrets(t, secrets::as_is)?)
                    .map_err(|_| {
                        CallError::new(
                            CallErrorKind::Other,
                            format!("header {k} is not valid with its secrets filled in"),
                        )
                    })?;
                filled.set_sensitive(true);
                headers.insert(k.clone(), filled);
            }
        }
        // Set here, as the client would, unless a step's header names it; the client
        // would format it again on every call.
        headers.entry(HOST).or_insert_with(|| val.host.clone());
        if let Some(t) = trace {
            headers.insert(
                HeaderName::from_static("traceparent"),
                HeaderValue::from_bytes(&t.header).expect("hex is header-safe"),
            );
            if let Some(v) = t
                .tracestate
                .as_deref()
                .and_then(|v| HeaderValue::from_str(v).ok())
            {
                headers.insert(HeaderName::from_static("tracestate"), v);
            }
        }
        Ok(())
    }

    /// Sends `req` and reads the answer (up to the response limit): its status, its
    /// `Retry-After`, its body. The trace learns the status and the downstream's span.
    async fn exchange(
        &self,
        req: Request<Full<Bytes>>,
        val: &HttpVal,
        trace: Option<&mut StepTrace>,
    ) -> Result<(hyper::StatusCode, Option<Duration>, Bytes), CallError> {
        let resp = self
            .client
            .request(req)
            .await
            .map_err(|e| describe(&e, &val.host_key))?;
        let status = resp.status();
        if let Some(t) = trace {
            t.status = Some(status.as_u16());
            t.answered = resp
                .headers()
                .get("traceparent")
                .and_then(|v| crate::telemetry::TraceParent::parse(v.as_bytes()));
        }
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        let bytes = Limited::new(resp.into_body(), self.max_response)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    CallError::new(
                        CallErrorKind::Other,
                        format!("response larger than {} bytes", self.max_response),
                    )
                } else {
                    CallError::new(CallErrorKind::Broken, format!("reading response: {e}"))
                }
            })?
            .to_bytes();
        // A copy of its own: the answer is kept (step records, the next step's request,
        // cached status answers) long after the connection's read buffer, which it would
        // otherwise pin, has moved on.
        Ok((status, retry_after, Bytes::copy_from_slice(&bytes)))
    }
}

impl HttpClient {
    /// `text` with its secrets filled in; a secret gone since the workflow was defined
    /// fails the step, permanently, naming it (never its value).
    fn with_secrets(&self, text: &str, encode: fn(&str) -> String) -> Result<String, CallError> {
        self.secrets
            .resolve(text, encode)
            .map_err(|e| CallError::new(CallErrorKind::Other, e.to_string()))
    }
}

/// A client error as a failed attempt: a connection that could not be made, one that
/// broke during the exchange, a TLS handshake that failed a check, or an answer that was
/// not HTTP (the last two are what retrying cannot fix); the reason carries the whole
/// cause (connection refused, …), or for TLS which check failed.
fn describe(e: &hyper_util::client::legacy::Error, host: &str) -> CallError {
    if let Some(t) = crate::tls::find(e) {
        return CallError::new(
            CallErrorKind::Tls,
            format!(
                "TLS handshake with {host} failed: {}",
                crate::tls::reason(t)
            ),
        );
    }
    let mut message = if e.is_connect() {
        "connection failed".to_string()
    } else {
        "request failed".to_string()
    };
    let mut kind = if e.is_connect() {
        CallErrorKind::Connect
    } else {
        CallErrorKind::Broken
    };
    for c in crate::error_chain::sources(e).skip(1) {
        // Refused before any connection: permanent, and said as the policy says it.
        if let Some(r) = c.downcast_ref::<Refused>() {
            return CallError::new(CallErrorKind::Other, r.to_string());
        }
        if let Some(h) = c.downcast_ref::<hyper::Error>() {
            if h.is_parse() || h.is_parse_status() || h.is_parse_too_large() {
                kind = CallErrorKind::Other;
            }
        }
        message.push_str(": ");
        message.push_str(&c.to_string());
    }
    CallError::new(kind, message)
}

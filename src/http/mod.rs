//! The HTTP front end: a plain `match` on method and path (no router framework, no
//! allocation), one file per resource, body limits, and errors mapped to responses.

// Handlers return a ready response as their error; boxing it would only add an allocation.
#![allow(clippy::result_large_err)]

pub mod body;
pub mod ops;
pub mod response;
pub mod service_requests;
pub mod step_response;
pub mod workflows;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};

use crate::metrics::Route;
use crate::state::Core;
use response::{error, Resp};

/// Answers one request and records it in the route's metrics.
pub async fn handle(core: Arc<Core>, req: Request<Incoming>) -> Resp {
    let started = Instant::now();
    let (route, resp) = dispatch(&core, req).await;
    core.app
        .metrics
        .record(route, resp.status().as_u16(), started.elapsed());
    resp
}

async fn dispatch(core: &Core, req: Request<Incoming>) -> (Route, Resp) {
    // The Uri clone shares its bytes (no allocation), so path segments can be borrowed
    // while the request itself moves into a handler.
    let uri = req.uri().clone();
    // Split the path once; every route has at most two segments.
    let path = uri.path();
    let trimmed = path.strip_prefix('/').unwrap_or(path);
    let (first, rest) = match trimmed.split_once('/') {
        Some((a, b)) => (a, Some(b)),
        None => (trimmed, None),
    };
    let method = req.method();
    match (first, rest) {
        ("serviceRequest", Some(arg)) if !arg.is_empty() && !arg.contains('/') => {
            if method == Method::POST {
                let name = decode(arg).into_owned();
                (
                    Route::CreateServiceRequest,
                    service_requests::create(core, &name, req).await,
                )
            } else if method == Method::GET {
                let id = arg.to_owned();
                (
                    Route::GetServiceRequest,
                    service_requests::get(core, &id).await,
                )
            } else {
                (Route::CreateServiceRequest, not_allowed())
            }
        }
        ("serviceRequests", Some(arg))
            if !arg.is_empty() && !arg.contains('/') && method == Method::GET =>
        {
            let name = decode(arg).into_owned();
            (
                Route::ListServiceRequests,
                service_requests::list(core, &name, req.uri().query()).await,
            )
        }
        ("workflow", None) if method == Method::POST => {
            (Route::CreateWorkflow, workflows::create(core, req).await)
        }
        ("workflow", Some(arg))
            if !arg.is_empty() && !arg.contains('/') && method == Method::GET =>
        {
            let name = decode(arg);
            (Route::GetWorkflow, workflows::get(core, &name).await)
        }
        ("workflows", None) if method == Method::GET => (
            Route::ListWorkflows,
            workflows::list(core, req.uri().query()).await,
        ),
        ("stepResponse", None) if method == Method::POST => {
            (Route::StepResponse, step_response::post(core, req).await)
        }
        ("health", None) if method == Method::GET => (Route::Health, ops::health()),
        ("ready", None) if method == Method::GET => (Route::Ready, ops::ready(core).await),
        ("metrics", None) if method == Method::GET => (Route::Metrics, ops::metrics(core)),
        (
            "serviceRequest" | "serviceRequests" | "workflow" | "workflows" | "stepResponse"
            | "health" | "ready" | "metrics",
            _,
        ) if is_known_shape(first, rest) => (Route::NotFound, not_allowed()),
        _ => (
            Route::NotFound,
            error(StatusCode::NOT_FOUND, "no such route"),
        ),
    }
}

/// True when the path names a route that exists with another method.
fn is_known_shape(first: &str, rest: Option<&str>) -> bool {
    match (first, rest) {
        ("workflow", None) | ("workflows", None) | ("stepResponse", None) => true,
        ("health" | "ready" | "metrics", None) => true,
        ("serviceRequest" | "serviceRequests" | "workflow", Some(a)) => {
            !a.is_empty() && !a.contains('/')
        }
        _ => false,
    }
}

fn not_allowed() -> Resp {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this route",
    )
}

/// Percent-decodes a path segment; borrows when there is nothing to decode.
pub fn decode(seg: &str) -> Cow<'_, str> {
    if !seg.contains('%') {
        return Cow::Borrowed(seg);
    }
    let b = seg.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// Reads `key`'s value from a query string (first occurrence, percent-decoded).
pub fn query_param<'q>(query: Option<&'q str>, key: &str) -> Option<Cow<'q, str>> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| decode(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_segments() {
        assert_eq!(decode("plain"), "plain");
        assert_eq!(decode("a%20b"), "a b");
        assert_eq!(decode("bad%zzx"), "bad%zzx");
        assert_eq!(decode("end%2"), "end%2");
        assert_eq!(decode("%41"), "A");
    }

    #[test]
    fn reads_query_params() {
        let q = Some("pageNumber=1&pageSize=10&sortBy=name:asc%2Ccreated_at:desc");
        assert_eq!(query_param(q, "pageNumber").unwrap(), "1");
        assert_eq!(
            query_param(q, "sortBy").unwrap(),
            "name:asc,created_at:desc"
        );
        assert!(query_param(q, "nope").is_none());
        assert!(query_param(None, "x").is_none());
    }
}

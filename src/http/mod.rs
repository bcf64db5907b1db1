//! The HTTP front end: one route table (method, path pattern, handler), matched without
//! allocating; one file per resource; bearer tokens; body limits and early answers that
//! keep the connection usable; errors mapped to responses in one place.

// Handlers return a ready response as their error; boxing it would only add an allocation.
#![allow(clippy::result_large_err)]

pub(crate) mod answers;
pub(crate) mod audit;
mod auth;
pub(crate) mod body;
pub(crate) mod conn;
pub(crate) mod console;
pub(crate) mod counts;
pub(crate) mod delayed;
pub(crate) mod events;
mod origin;
pub(crate) mod outage;
pub(crate) mod rerun;
pub(crate) mod response;
pub(crate) mod retry;
pub(crate) mod schedules;
pub(crate) mod search;
pub(crate) mod service_requests;
pub(crate) mod step_response;
pub(crate) mod system;
pub(crate) mod workflows;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW};
use hyper::http::request::Parts;
use hyper::{Method, Request, StatusCode};

use crate::metrics::Route;
use crate::state::Core;
use body::Body;
use conn::ConnState;
use response::{error, Resp};

/// One segment of a route's path.
enum Seg {
    /// This text exactly.
    Lit(&'static str),
    /// Any non-empty segment, handed to the handler (percent-decoded where it is a name).
    Arg,
}

use Seg::{Arg, Lit};

/// A route: method, path, what answers it, and whether it is open without a token.
struct RouteDef {
    method: Method,
    path: &'static [Seg],
    route: Route,
    open: bool,
}

const fn route(method: Method, path: &'static [Seg], route: Route) -> RouteDef {
    RouteDef {
        method,
        path,
        route,
        open: false,
    }
}

/// A route open without a token.
const fn open(method: Method, path: &'static [Seg], route: Route) -> RouteDef {
    RouteDef {
        method,
        path,
        route,
        open: true,
    }
}

/// Every route, stated once: the router, `405 Allow` and the token check read this table.
const ROUTES: &[RouteDef] = &[
    route(
        Method::POST,
        &[Lit("serviceRequest"), Arg],
        Route::CreateServiceRequest,
    ),
    route(
        Method::GET,
        &[Lit("serviceRequest"), Arg],
        Route::GetServiceRequest,
    ),
    route(
        Method::POST,
        &[Lit("serviceRequest"), Arg, Lit("cancel")],
        Route::CancelServiceRequest,
    ),
    route(
        Method::POST,
        &[Lit("serviceRequest"), Arg, Lit("retry")],
        Route::RetryServiceRequest,
    ),
    route(
        Method::POST,
        &[Lit("serviceRequest"), Arg, Lit("rerun")],
        Route::RerunServiceRequest,
    ),
    route(
        Method::GET,
        &[Lit("serviceRequest"), Arg, Lit("children")],
        Route::ServiceRequestChildren,
    ),
    route(
        Method::GET,
        &[Lit("serviceRequests"), Arg],
        Route::ListServiceRequests,
    ),
    route(
        Method::GET,
        &[Lit("serviceRequests")],
        Route::SearchServiceRequests,
    ),
    route(
        Method::POST,
        &[Lit("serviceRequests"), Lit("retry")],
        Route::RetryServiceRequests,
    ),
    route(
        Method::GET,
        &[Lit("serviceRequestCounts")],
        Route::CountServiceRequests,
    ),
    route(Method::POST, &[Lit("workflow")], Route::CreateWorkflow),
    route(Method::GET, &[Lit("workflow"), Arg], Route::GetWorkflow),
    route(Method::PUT, &[Lit("workflow"), Arg], Route::PutWorkflow),
    route(
        Method::GET,
        &[Lit("workflow"), Arg, Lit("versions")],
        Route::WorkflowVersions,
    ),
    route(Method::GET, &[Lit("workflows")], Route::ListWorkflows),
    route(Method::POST, &[Lit("stepResponse")], Route::StepResponse),
    route(Method::POST, &[Lit("events"), Arg], Route::DeliverEvent),
    route(Method::POST, &[Lit("schedules")], Route::CreateSchedule),
    route(Method::GET, &[Lit("schedules")], Route::ListSchedules),
    route(Method::GET, &[Lit("schedules"), Arg], Route::GetSchedule),
    route(Method::PUT, &[Lit("schedules"), Arg], Route::PutSchedule),
    route(
        Method::DELETE,
        &[Lit("schedules"), Arg],
        Route::DeleteSchedule,
    ),
    route(
        Method::POST,
        &[Lit("schedules"), Arg, Lit("trigger")],
        Route::TriggerSchedule,
    ),
    route(
        Method::POST,
        &[Lit("schedules"), Arg, Lit("pause")],
        Route::PauseSchedule,
    ),
    route(
        Method::POST,
        &[Lit("schedules"), Arg, Lit("resume")],
        Route::ResumeSchedule,
    ),
    route(Method::GET, &[Lit("audit")], Route::Audit),
    open(Method::GET, &[Lit("health")], Route::Health),
    open(Method::GET, &[Lit("ready")], Route::Ready),
    route(Method::GET, &[Lit("metrics")], Route::Metrics),
    route(Method::GET, &[Lit("openapi.json")], Route::OpenApi),
];

/// Most segments any route has.
const MAX_SEGMENTS: usize = 3;

/// Why no route answers a request.
enum Miss {
    NotFound,
    /// The path exists with other methods (for `Allow`).
    MethodNotAllowed(Vec<&'static str>),
}

/// Finds the route for `method` and `path`, and the path's argument (empty if none).
fn resolve<'p>(method: &Method, path: &'p str) -> Result<(&'static RouteDef, &'p str), Miss> {
    let mut segs = [""; MAX_SEGMENTS];
    let mut n = 0;
    for s in path.strip_prefix('/').unwrap_or(path).split('/') {
        if n == MAX_SEGMENTS {
            return Err(Miss::NotFound);
        }
        segs[n] = s;
        n += 1;
    }
    let segs = &segs[..n];
    let mut allowed = Vec::new();
    for def in ROUTES {
        if def.path.len() != n {
            continue;
        }
        let mut arg = "";
        let fits = def.path.iter().zip(segs).all(|(p, s)| match p {
            Lit(l) => l == s,
            Arg => {
                arg = s;
                !s.is_empty()
            }
        });
        if !fits {
            continue;
        }
        if def.method == *method {
            return Ok((def, arg));
        }
        allowed.push(def.method.as_str());
    }
    if allowed.is_empty() {
        Err(Miss::NotFound)
    } else {
        Err(Miss::MethodNotAllowed(allowed))
    }
}

/// Answers one request, settles its body (drained, or the connection closed properly),
/// and records it in the route's metrics.
pub async fn handle(core: Arc<Core>, conn: Arc<ConnState>, req: Request<Incoming>) -> Resp {
    let started = Instant::now();
    let _in_flight = conn.begin();
    let (parts, body) = req.into_parts();
    let mut body = Body::new(body);
    // Tracing on: a server span per request, a child of the caller's when it sent one.
    let server = core.app.tracing.as_ref().map(|t| {
        t.server(
            parts.method.as_str(),
            crate::telemetry::incoming(&parts.headers),
        )
    });
    let (route, mut resp) = dispatch(&core, &conn, &parts, &mut body, server.as_ref()).await;
    if let (Some(t), Some(span)) = (&core.app.tracing, server.filter(|s| s.ctx.sampled())) {
        let template = template(route);
        t.end_server(
            span,
            format!("{} {template}", parts.method),
            vec![
                opentelemetry::KeyValue::new("http.request.method", parts.method.to_string()),
                opentelemetry::KeyValue::new("http.route", template),
                opentelemetry::KeyValue::new("url.path", parts.uri.path().to_string()),
                opentelemetry::KeyValue::new("url.scheme", "http"),
                opentelemetry::KeyValue::new("network.protocol.version", "1.1"),
            ],
            resp.status().as_u16(),
        );
    }
    let cfg = &core.app.config;
    body.settle(
        &parts.headers,
        &mut resp,
        &conn,
        cfg.body_limit,
        cfg.header_timeout,
    )
    .await;
    core.app
        .metrics
        .record(route, resp.status().as_u16(), started.elapsed());
    resp
}

/// The operation a route carries, for the role it needs (`ops::access`).
fn op(route: Route) -> crate::ops::access::Op {
    use crate::ops::access::Op;
    match route {
        Route::CreateServiceRequest => Op::Create,
        Route::CancelServiceRequest => Op::Cancel,
        Route::RetryServiceRequest => Op::Retry,
        Route::RetryServiceRequests => Op::BulkRetry,
        Route::RerunServiceRequest => Op::Rerun,
        Route::StepResponse => Op::StepResponse,
        Route::DeliverEvent => Op::DeliverEvent,
        Route::CreateWorkflow | Route::PutWorkflow => Op::DefineWorkflow,
        Route::CreateSchedule
        | Route::PutSchedule
        | Route::DeleteSchedule
        | Route::TriggerSchedule
        | Route::PauseSchedule
        | Route::ResumeSchedule => Op::ChangeSchedule,
        Route::Audit => Op::ReadAudit,
        Route::GetServiceRequest
        | Route::ServiceRequestChildren
        | Route::ListServiceRequests
        | Route::SearchServiceRequests
        | Route::CountServiceRequests
        | Route::GetWorkflow
        | Route::WorkflowVersions
        | Route::ListWorkflows
        | Route::ListSchedules
        | Route::GetSchedule
        | Route::Health
        | Route::Ready
        | Route::Metrics
        | Route::OpenApi
        | Route::Console
        | Route::NotFound => Op::Read,
    }
}

/// The route as a template, for span names and `http.route`.
fn template(route: Route) -> &'static str {
    match route {
        Route::CreateWorkflow => "/workflow",
        Route::GetWorkflow | Route::PutWorkflow => "/workflow/{name}",
        Route::WorkflowVersions => "/workflow/{name}/versions",
        Route::ListWorkflows => "/workflows",
        Route::CreateServiceRequest => "/serviceRequest/{workflow}",
        Route::GetServiceRequest => "/serviceRequest/{id}",
        Route::CancelServiceRequest => "/serviceRequest/{id}/cancel",
        Route::RetryServiceRequest => "/serviceRequest/{id}/retry",
        Route::RerunServiceRequest => "/serviceRequest/{id}/rerun",
        Route::ServiceRequestChildren => "/serviceRequest/{id}/children",
        Route::ListServiceRequests => "/serviceRequests/{workflow}",
        Route::SearchServiceRequests => "/serviceRequests",
        Route::RetryServiceRequests => "/serviceRequests/retry",
        Route::CountServiceRequests => "/serviceRequestCounts",
        Route::StepResponse => "/stepResponse",
        Route::DeliverEvent => "/events/{event}",
        Route::CreateSchedule | Route::ListSchedules => "/schedules",
        Route::GetSchedule | Route::PutSchedule | Route::DeleteSchedule => "/schedules/{name}",
        Route::TriggerSchedule => "/schedules/{name}/trigger",
        Route::PauseSchedule => "/schedules/{name}/pause",
        Route::ResumeSchedule => "/schedules/{name}/resume",
        Route::Audit => "/audit",
        Route::Health => "/health",
        Route::Ready => "/ready",
        Route::Metrics => "/metrics",
        Route::OpenApi => "/openapi.json",
        Route::Console => "/console",
        Route::NotFound => "",
    }
}

async fn dispatch(
    core: &Core,
    conn: &ConnState,
    parts: &Parts,
    body: &mut Body,
    server: Option<&crate::telemetry::ServerSpan>,
) -> (Route, Resp) {
    // With no token to ask for, browsers' cross-site requests are refused (`origin`).
    let cross_site = || {
        if core.app.config.api_tokens.is_on() {
            return None;
        }
        origin::refused(&parts.headers, conn.local, &core.app.config.allowed_hosts)
            .map(|why| error(StatusCode::FORBIDDEN, &why))
    };
    // The console routes its own pages and signs its users in (`console::session`).
    if console::owns(parts.uri.path()) {
        if let Some(refused) = cross_site() {
            return (Route::Console, refused);
        }
        return (
            Route::Console,
            Box::pin(console::handle(core, conn, parts, body)).await,
        );
    }
    let (def, arg) = match resolve(&parts.method, parts.uri.path()) {
        Ok(found) => found,
        Err(Miss::NotFound) => {
            return (
                Route::NotFound,
                error(StatusCode::NOT_FOUND, "no such route"),
            )
        }
        Err(Miss::MethodNotAllowed(allowed)) => return (Route::NotFound, not_allowed(&allowed)),
    };
    let route = def.route;
    if !matches!(route, Route::Health | Route::Ready) {
        if let Some(refused) = cross_site() {
            return (route, refused);
        }
    }
    let open = def.open || (route == Route::Metrics && core.app.config.metrics_open);
    let mut caller = None;
    if !open {
        let tokens = core.app.config.api_tokens.current();
        let c = match auth::caller(&tokens, &parts.headers) {
            Ok(c) => c,
            Err(resp) => return (route, resp),
        };
        if let Err(e) = crate::ops::access::allow(&c, op(route)) {
            let resp = response::op_error(e);
            return (
                route,
                Box::pin(audit::after(core, &c, route, arg, resp)).await,
            );
        }
        caller = Some(c);
    }
    let query = parts.uri.query();
    // The handlers of the rare routes are boxed, so that the future every request
    // allocates (and zeroes) is as large as the hot routes' need, not the largest route's.
    let resp = match route {
        Route::CreateServiceRequest => {
            service_requests::create(core, &decode(arg), parts, body, server).await
        }
        Route::GetServiceRequest => service_requests::get(core, arg, query).await,
        Route::CancelServiceRequest => {
            Box::pin(service_requests::cancel(core, arg, parts, body)).await
        }
        Route::RetryServiceRequest => Box::pin(retry::retry(core, arg, parts, body)).await,
        Route::RerunServiceRequest => Box::pin(rerun::rerun(core, arg, parts, body)).await,
        Route::ServiceRequestChildren => {
            Box::pin(service_requests::children(core, arg, query)).await
        }
        Route::RetryServiceRequests => Box::pin(retry::retry_matching(core, parts, body)).await,
        Route::ListServiceRequests => {
            Box::pin(service_requests::list(core, &decode(arg), query)).await
        }
        Route::SearchServiceRequests => Box::pin(search::search(core, query)).await,
        Route::CountServiceRequests => Box::pin(counts::counts(core, query)).await,
        Route::CreateWorkflow => Box::pin(workflows::create(core, parts, body)).await,
        Route::GetWorkflow => Box::pin(workflows::get(core, &decode(arg), query)).await,
        Route::PutWorkflow => Box::pin(workflows::put(core, &decode(arg), parts, body)).await,
        Route::WorkflowVersions => Box::pin(workflows::versions(core, &decode(arg))).await,
        Route::ListWorkflows => Box::pin(workflows::list(core, query)).await,
        Route::StepResponse => step_response::post(core, parts, body).await,
        Route::DeliverEvent => Box::pin(events::post(core, parts, &decode(arg), body)).await,
        Route::CreateSchedule => Box::pin(schedules::create(core, parts, body)).await,
        Route::ListSchedules => Box::pin(schedules::list(core)).await,
        Route::GetSchedule => Box::pin(schedules::get(core, &decode(arg))).await,
        Route::PutSchedule => Box::pin(schedules::put(core, &decode(arg), parts, body)).await,
        Route::DeleteSchedule => Box::pin(schedules::delete(core, &decode(arg))).await,
        Route::TriggerSchedule => Box::pin(schedules::trigger(core, &decode(arg))).await,
        Route::PauseSchedule => Box::pin(schedules::pause(core, &decode(arg))).await,
        Route::ResumeSchedule => Box::pin(schedules::resume(core, &decode(arg))).await,
        Route::Audit => Box::pin(audit::list(core, query)).await,
        Route::Health => system::health(),
        Route::Ready => system::ready(core).await,
        Route::Metrics => system::metrics(core).await,
        Route::OpenApi => system::openapi(),
        // Answered above.
        Route::Console => error(StatusCode::NOT_FOUND, "no such route"),
        Route::NotFound => error(StatusCode::NOT_FOUND, "no such route"),
    };
    // A change an operator made is recorded, with its outcome (creates and answers are
    // not: they are the traffic, not changes).
    match caller {
        Some(c) if crate::ops::access::audited(op(route)).is_some() => (
            route,
            Box::pin(audit::after(core, &c, route, arg, resp)).await,
        ),
        _ => (route, resp),
    }
}

fn not_allowed(allowed: &[&str]) -> Resp {
    let mut r = error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this route",
    );
    if let Ok(v) = HeaderValue::from_str(&allowed.join(", ")) {
        r.headers_mut().insert(ALLOW, v);
    }
    r
}

/// Percent-decodes a path segment (`+` stays `+` in a path); borrows when there is
/// nothing to decode.
pub fn decode(seg: &str) -> Cow<'_, str> {
    percent_encoding::percent_decode_str(seg).decode_utf8_lossy()
}

/// A time as the answers show it: RFC 3339 in UTC, with milliseconds.
pub(crate) fn rfc3339(t: impl Into<chrono::DateTime<chrono::Utc>>) -> String {
    t.into()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Reads `key`'s value from a query string (the first occurrence, form-decoded: `%xx`
/// and `+` for a space).
pub fn query_param<'q>(query: Option<&'q str>, key: &str) -> Option<Cow<'q, str>> {
    form_urlencoded::parse(query?.as_bytes())
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_segments() {
        assert_eq!(decode("plain"), "plain");
        assert_eq!(decode("a%20b"), "a b");
        assert_eq!(decode("a+b"), "a+b");
        assert_eq!(decode("bad%zzx"), "bad%zzx");
        assert_eq!(decode("end%2"), "end%2");
        assert_eq!(decode("%41"), "A");
    }

    #[test]
    fn reads_query_params() {
        let q = Some("pageNumber=1&pageSize=10&sortBy=name:asc%2Ccreated_at:desc&q=a+b");
        assert_eq!(query_param(q, "pageNumber").unwrap(), "1");
        assert_eq!(
            query_param(q, "sortBy").unwrap(),
            "name:asc,created_at:desc"
        );
        assert_eq!(query_param(q, "q").unwrap(), "a b");
        assert!(query_param(q, "nope").is_none());
        assert!(query_param(None, "x").is_none());
    }

    #[test]
    fn the_openapi_document_has_every_route_and_no_other() {
        let doc: serde_json::Value =
            serde_json::from_str(include_str!("../../openapi.json")).unwrap();
        let mut documented: Vec<String> = Vec::new();
        for (path, ops) in doc["paths"].as_object().unwrap() {
            let mut norm = String::new();
            let mut in_param = false;
            for c in path.chars() {
                match c {
                    '{' => in_param = true,
                    '}' => {
                        in_param = false;
                        norm.push_str("{}");
                    }
                    _ if !in_param => norm.push(c),
                    _ => {}
                }
            }
            for method in ops.as_object().unwrap().keys() {
                documented.push(format!("{} {norm}", method.to_ascii_uppercase()));
            }
        }
        let mut routed: Vec<String> = ROUTES
            .iter()
            .map(|r| {
                let path: String = r
                    .path
                    .iter()
                    .map(|s| match s {
                        Lit(l) => format!("/{l}"),
                        Arg => "/{}".to_string(),
                    })
                    .collect();
                format!("{} {path}", r.method)
            })
            .collect();
        documented.sort();
        routed.sort();
        assert_eq!(documented, routed);
    }

    #[test]
    fn resolves_routes_from_the_one_table() {
        let found = |m: Method, p: &str| match resolve(&m, p) {
            Ok((def, arg)) => Some((def.route, arg.to_string())),
            Err(_) => None,
        };
        assert_eq!(
            found(Method::POST, "/serviceRequest/wf"),
            Some((Route::CreateServiceRequest, "wf".into()))
        );
        assert_eq!(
            found(Method::POST, "/serviceRequest/abc/cancel"),
            Some((Route::CancelServiceRequest, "abc".into()))
        );
        assert_eq!(
            found(Method::GET, "/health"),
            Some((Route::Health, "".into()))
        );
        assert_eq!(found(Method::GET, "/health/"), None);
        assert_eq!(found(Method::GET, "/serviceRequest/"), None);
        assert_eq!(found(Method::GET, "/a/b/c/d"), None);
        match resolve(&Method::DELETE, "/serviceRequest/x") {
            Err(Miss::MethodNotAllowed(m)) => assert_eq!(m, ["POST", "GET"]),
            _ => panic!("expected 405"),
        }
        assert!(matches!(
            resolve(&Method::GET, "/nope"),
            Err(Miss::NotFound)
        ));
    }
}

//! The HTTP front end: one route table (method, path pattern, handler), matched without
//! allocating; one file per resource; bearer tokens; body limits and early answers that
//! keep the connection usable; errors mapped to responses in one place.

// Handlers return a ready response as their error; boxing it would only add an allocation.
#![allow(clippy::result_large_err)]

/// The value of a `Result<T, Resp>`, or its response answered at once: the one prologue
/// the handlers share for reading their input (a body, an id, a form), and for an
/// operation's error once mapped (`.map_err(response::op_error)`).
macro_rules! or_answer {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(resp) => return resp,
        }
    };
}

pub(crate) mod answers;
pub(crate) mod audit;
mod auth;
pub(crate) mod body;
pub(crate) mod conn;
pub(crate) mod console;
pub(crate) mod counts;
pub(crate) mod events;
pub(crate) mod input;
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
pub(crate) mod triggers;
pub(crate) mod workflows;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW};
use hyper::http::request::Parts;
use hyper::{Method, Request, StatusCode};

use crate::routes::{Route, RouteDef, ROUTES};
use crate::state::Core;
use body::Body;
use conn::ConnState;
use response::{error, Resp};

/// One segment of a route's path.
#[derive(Debug, PartialEq)]
enum Seg {
    /// This text exactly.
    Lit(&'static str),
    /// Any non-empty segment, handed to the handler (percent-decoded where it is a name).
    Arg,
}

use Seg::{Arg, Lit};

/// A row of `crate::routes::ROUTES` made ready for matching: its method and segments.
struct Compiled {
    def: &'static RouteDef,
    method: Method,
    path: Vec<Seg>,
}

/// The routed rows of the one table (`crate::routes`), read once.
static ROUTER: std::sync::LazyLock<Vec<Compiled>> = std::sync::LazyLock::new(|| {
    ROUTES
        .iter()
        .filter(|d| !d.method.is_empty())
        .map(|def| Compiled {
            def,
            method: Method::from_bytes(def.method.as_bytes()).expect("a method in the table"),
            path: segments(def.template),
        })
        .collect()
});

/// A template's segments: `{name}` is an argument, the rest literal.
fn segments(template: &'static str) -> Vec<Seg> {
    template
        .strip_prefix('/')
        .unwrap_or(template)
        .split('/')
        .map(|s| if s.starts_with('{') { Arg } else { Lit(s) })
        .collect()
}

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
    for row in ROUTER.iter() {
        if row.path.len() != n {
            continue;
        }
        let mut arg = "";
        let fits = row.path.iter().zip(segs).all(|(p, s)| match p {
            Lit(l) => l == s,
            Arg => {
                arg = s;
                !s.is_empty()
            }
        });
        if !fits {
            continue;
        }
        if row.method == *method {
            return Ok((row.def, arg));
        }
        allowed.push(row.def.method);
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
        let template = route.template();
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
    // A webhook comes from another host by nature, and proves itself by its signature.
    if !matches!(route, Route::Health | Route::Ready | Route::Hook) {
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
        if let Err(e) = crate::ops::access::allow(&c, route.op()) {
            // Boxed: only a refusal records, and its future stays out of every request's.
            let target = decode(arg);
            let e = Box::pin(crate::ops::audit::refused(
                &core.pool,
                &c,
                route.op(),
                &target,
                e,
            ))
            .await;
            return (route, response::op_error(e));
        }
        caller = Some(c);
    }
    // Open routes change nothing whose author the audit trail records.
    let who = &caller.unwrap_or_else(crate::tokens::Caller::anonymous);
    let resp = to_handler(core, who, route, arg, parts, body, server).await;
    (route, resp)
}

/// The handler of `route`, given what dispatch found: the caller (`who`) and the path's
/// argument.
async fn to_handler(
    core: &Core,
    who: &crate::tokens::Caller,
    route: Route,
    arg: &str,
    parts: &Parts,
    body: &mut Body,
    server: Option<&crate::telemetry::ServerSpan>,
) -> Resp {
    let query = parts.uri.query();
    // The handlers of the rare routes are boxed, so that the future every request
    // allocates (and zeroes) is as large as the hot routes' need, not the largest route's.
    match route {
        Route::CreateServiceRequest => {
            service_requests::create(core, &decode(arg), parts, body, server).await
        }
        Route::GetServiceRequest => service_requests::get(core, arg, query).await,
        Route::CancelServiceRequest => {
            Box::pin(service_requests::cancel(core, who, arg, parts, body)).await
        }
        Route::RetryServiceRequest => Box::pin(retry::retry(core, who, arg, parts, body)).await,
        Route::RerunServiceRequest => Box::pin(rerun::rerun(core, who, arg, parts, body)).await,
        Route::ServiceRequestNotifications => {
            Box::pin(service_requests::notifications(core, arg)).await
        }
        Route::ServiceRequestChildren => {
            Box::pin(service_requests::children(core, arg, query)).await
        }
        Route::RetryServiceRequests => {
            Box::pin(retry::retry_matching(core, who, parts, body)).await
        }
        Route::ListServiceRequests => {
            Box::pin(service_requests::list(core, &decode(arg), query)).await
        }
        Route::SearchServiceRequests => Box::pin(search::search(core, query)).await,
        Route::CountServiceRequests => Box::pin(counts::counts(core, query)).await,
        Route::CreateWorkflow => Box::pin(workflows::create(core, who, parts, body)).await,
        Route::GetWorkflow => Box::pin(workflows::get(core, &decode(arg), query)).await,
        Route::PutWorkflow => Box::pin(workflows::put(core, who, &decode(arg), parts, body)).await,
        Route::WorkflowVersions => Box::pin(workflows::versions(core, &decode(arg))).await,
        Route::PauseWorkflow => Box::pin(workflows::pause(core, who, &decode(arg))).await,
        Route::ResumeWorkflow => Box::pin(workflows::resume(core, who, &decode(arg))).await,
        Route::ListWorkflows => Box::pin(workflows::list(core, query)).await,
        Route::StepResponse => step_response::post(core, parts, body).await,
        Route::DeliverEvent => Box::pin(events::post(core, parts, &decode(arg), body)).await,
        Route::CreateSchedule => Box::pin(schedules::create(core, who, parts, body)).await,
        Route::ListSchedules => Box::pin(schedules::list(core)).await,
        Route::GetSchedule => Box::pin(schedules::get(core, &decode(arg))).await,
        Route::PutSchedule => Box::pin(schedules::put(core, who, &decode(arg), parts, body)).await,
        Route::DeleteSchedule => Box::pin(schedules::delete(core, who, &decode(arg))).await,
        Route::TriggerSchedule => Box::pin(schedules::trigger(core, who, &decode(arg))).await,
        Route::PauseSchedule => Box::pin(schedules::pause(core, who, &decode(arg))).await,
        Route::ResumeSchedule => Box::pin(schedules::resume(core, who, &decode(arg))).await,
        Route::CreateTrigger => Box::pin(triggers::create(core, who, parts, body)).await,
        Route::ListTriggers => Box::pin(triggers::list(core)).await,
        Route::GetTrigger => Box::pin(triggers::get(core, &decode(arg))).await,
        Route::PutTrigger => Box::pin(triggers::put(core, who, &decode(arg), parts, body)).await,
        Route::DeleteTrigger => Box::pin(triggers::delete(core, who, &decode(arg))).await,
        Route::PauseTrigger => Box::pin(triggers::set_paused(core, who, &decode(arg), true)).await,
        Route::ResumeTrigger => {
            Box::pin(triggers::set_paused(core, who, &decode(arg), false)).await
        }
        Route::Hook => Box::pin(triggers::hook(core, &decode(arg), parts, body)).await,
        Route::Audit => Box::pin(audit::list(core, query)).await,
        Route::Health => system::health(),
        Route::Ready => system::ready(core).await,
        Route::Metrics => system::metrics(core).await,
        Route::OpenApi => system::openapi(),
        // Answered above.
        Route::Console => error(StatusCode::NOT_FOUND, "no such route"),
        Route::NotFound => error(StatusCode::NOT_FOUND, "no such route"),
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

/// Every value of a repeatable query parameter, in order (nothing allocated for none).
pub fn query_params<'q>(query: Option<&'q str>, key: &str) -> Vec<Cow<'q, str>> {
    match query {
        None => Vec::new(),
        Some(q) => form_urlencoded::parse(q.as_bytes())
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v)
            .collect(),
    }
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
        let mut routed: Vec<String> = ROUTER
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
        assert!(ROUTER.iter().all(|r| r.path.len() <= MAX_SEGMENTS));
        assert_eq!(
            ROUTER.len(),
            ROUTES.len() - 2,
            "all rows but the console's and none"
        );
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

//! The console (beyond Clamp): pages served by the binary itself, for people who run
//! clamp — requests by status, workflow and time; one request with its steps, timeline
//! and actions (retry, rerun, cancel); the workflows and their requests per minute; the
//! schedules with their next fires and last runs (run now, pause, resume); the triggers
//! with their sources and the requests they started (pause, resume).
//! Rendered on the server (maud, which escapes every value), no script, no asset from
//! another host; it reads and acts through the same code as the API. With
//! `--api-tokens` set, it asks for a token once per browser session (`session`).

mod actions;
mod layout;
mod request;
mod requests;
mod schedules;
mod session;
mod svg;
mod triggers;
mod workflows;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE, SET_COOKIE};
use hyper::http::request::Parts;
use hyper::{Method, Response, StatusCode};
use maud::html;

use super::body::Body;
use super::conn::ConnState;
use super::response::Resp;
use crate::ops::OpError;
use crate::state::Core;
use layout::Nav;
use session::Ctx;

/// Whether a path is the console's.
pub fn owns(path: &str) -> bool {
    path == "/console" || path.starts_with("/console/")
}

pub async fn handle(core: &Core, conn: &ConnState, parts: &Parts, body: &mut Body) -> Resp {
    let tokens = core.app.config.api_tokens.current();
    let mut ctx = session::context(
        &tokens,
        &parts.headers,
        core.app.config.tls.server.is_some(),
    );
    let path = parts.uri.path();
    let rest = path.strip_prefix("/console").unwrap_or("");
    let segs: Vec<&str> = rest.split('/').skip(1).collect();
    let method = &parts.method;
    match (method, segs.as_slice()) {
        (&Method::GET, ["console.css"]) => return asset(layout::CSS, "text/css; charset=utf-8"),
        (&Method::GET, ["favicon.svg"]) => return asset(layout::ICON, "image/svg+xml"),
        (&Method::GET, ["login"]) => return login_page(&ctx, parts.uri.query(), None),
        (&Method::POST, ["login"]) => return login(core, conn, &ctx, parts, body).await,
        _ => {}
    }
    let caller = match signed_in(core, &tokens, parts).await {
        Ok(c) => c,
        Err(e) => return op_problem(&ctx, e),
    };
    let Some(caller) = caller else {
        if method == Method::GET {
            let next = parts
                .uri
                .path_and_query()
                .map_or("/console", |p| p.as_str());
            return layout::see_other(&format!("/console/login?next={}", layout::q(next)), &ctx);
        }
        return layout::problem(
            StatusCode::UNAUTHORIZED,
            &ctx,
            "sign in first: the console needs a token",
        );
    };
    ctx.caller = caller;
    // An action the signed-in role may not take is refused as the API refuses it (the
    // pages do not offer it either).
    let wants = match (method, segs.as_slice()) {
        (&Method::POST, ["serviceRequests", _, action]) => actions::op(action),
        (&Method::POST, ["schedules", _, _]) => Some(crate::ops::access::Op::ChangeSchedule),
        (&Method::POST, ["triggers", _, _]) => Some(crate::ops::access::Op::ChangeTrigger),
        (&Method::POST, ["workflows", _, "pause"]) => Some(crate::ops::access::Op::PauseWorkflow),
        (&Method::POST, ["workflows", _, "resume"]) => Some(crate::ops::access::Op::ResumeWorkflow),
        _ => None,
    };
    if let Some(op) = wants {
        if let Err(e) = crate::ops::access::allow(&ctx.caller, op) {
            let target = super::decode(segs.get(1).copied().unwrap_or(""));
            let e = crate::ops::audit::refused(&core.pool, &ctx.caller, op, &target, e).await;
            return op_problem(&ctx, e);
        }
    }
    let query = parts.uri.query();
    match (method, segs.as_slice()) {
        (&Method::GET, []) | (&Method::GET, [""]) => requests::page(core, &ctx, query).await,
        (&Method::GET, ["serviceRequests", id]) => request::page(core, &ctx, id, query).await,
        (&Method::POST, ["serviceRequests", id, action]) => {
            actions::post(core, &ctx, id, action, parts, body).await
        }
        (&Method::GET, ["workflows"]) => workflows::list(core, &ctx).await,
        (&Method::GET, ["workflows", name]) => {
            workflows::page(core, &ctx, &super::decode(name)).await
        }
        (&Method::POST, ["workflows", name, action]) => {
            workflows::post(core, &ctx, &super::decode(name), action, parts, body).await
        }
        (&Method::GET, ["schedules"]) => schedules::page(core, &ctx, query).await,
        (&Method::POST, ["schedules", name, action]) => {
            schedules::post(core, &ctx, &super::decode(name), action, parts, body).await
        }
        (&Method::GET, ["triggers"]) => triggers::page(core, &ctx, query).await,
        (&Method::POST, ["triggers", name, action]) => {
            triggers::post(core, &ctx, &super::decode(name), action, parts, body).await
        }
        (&Method::POST, ["logout"]) => logout(core, &ctx, parts, body).await,
        _ => layout::problem(StatusCode::NOT_FOUND, &ctx, "no such page in the console"),
    }
}

/// Who the browser is signed in as: anyone with tokens off, else whom its session
/// (`ops::sessions`) or its bearer token names.
async fn signed_in(
    core: &Core,
    tokens: &crate::tokens::Tokens,
    parts: &Parts,
) -> Result<Option<crate::tokens::Caller>, OpError> {
    if !tokens.is_on() {
        return Ok(Some(crate::tokens::Caller::anonymous()));
    }
    if let Some(id) = session::cookie(&parts.headers, session::SESSION_COOKIE) {
        if let Some(c) = crate::ops::sessions::session(&core.app.config, &core.pool, id).await? {
            return Ok(Some(c));
        }
    }
    Ok(super::auth::caller(tokens, &parts.headers).ok())
}

/// A file built into the binary.
fn asset(body: &'static str, content_type: &'static str) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    layout::secure(r.headers_mut());
    r.headers_mut().insert(
        hyper::header::CACHE_CONTROL,
        HeaderValue::from_static("max-age=300"),
    );
    r
}

/// A page an operation could not serve: its status and message, as the API's answer
/// has them (`OpError`'s one table; a database failure logged where the API logs it,
/// once).
fn op_problem(ctx: &Ctx, e: OpError) -> Resp {
    let status = super::response::status_of(&e);
    let message = e.message();
    let api = super::response::op_error(e);
    let mut r = layout::problem(status, ctx, &message);
    if let Some(v) = api.headers().get(hyper::header::RETRY_AFTER) {
        r.headers_mut()
            .insert(hyper::header::RETRY_AFTER, v.clone());
    }
    r
}

/// Where to go after signing in: a console path of this server, nothing else.
fn next_page(query: Option<&str>) -> String {
    super::query_param(query, "next")
        .filter(|n| owns(n.split('?').next().unwrap_or("")) && !n.starts_with("//"))
        .map_or_else(|| "/console".to_string(), |n| n.into_owned())
}

fn login_page(ctx: &Ctx, query: Option<&str>, problem: Option<&str>) -> Resp {
    if !ctx.tokens_on {
        return layout::see_other("/console", ctx);
    }
    let next = next_page(query);
    let body = html! {
        h1 { "Sign in" }
        form.card method="post" action={ "/console/login?next=" (layout::q(&next)) } {
            @if let Some(p) = problem { p.flash.bad { (p) } }
            p.muted { "This server asks for an API token (one of --api-tokens or --tokens-file). It is kept for this browser session; its role decides which actions the pages offer." }
            input type="hidden" name="csrf" value=(ctx.csrf);
            label { "Token " input type="password" name="token" autocomplete="current-password" autofocus; }
            " "
            button type="submit" { "Sign in" }
        }
    };
    let status = if problem.is_some() {
        StatusCode::UNAUTHORIZED
    } else {
        StatusCode::OK
    };
    layout::html_resp(status, ctx, layout::page(ctx, Nav::None, "Sign in", body))
}

async fn login(core: &Core, conn: &ConnState, ctx: &Ctx, parts: &Parts, body: &mut Body) -> Resp {
    let form = or_answer!(actions::checked_form(core, ctx, parts, body).await);
    if !core.app.config.api_tokens.is_on() {
        return layout::see_other("/console", ctx);
    }
    let token = actions::field(&form, "token").unwrap_or("").trim();
    use crate::ops::sessions::SignIn;
    match crate::ops::sessions::sign_in(&core.app, &core.pool, conn.peer, token).await {
        Ok(SignIn::Started { session, .. }) => {
            let mut r = layout::see_other(&next_page(parts.uri.query()), ctx);
            r.headers_mut().append(
                SET_COOKIE,
                session::session_cookie(Some(&session), ctx.secure, core.app.config.session_max),
            );
            r
        }
        Ok(SignIn::Refused) => {
            login_page(ctx, parts.uri.query(), Some("That token is not accepted."))
        }
        Ok(SignIn::Limited(wait)) => {
            let mut r = login_page(
                ctx,
                parts.uri.query(),
                Some("Too many sign-in attempts from this address; wait a minute and try again."),
            );
            *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            let secs = wait.as_secs().max(1).to_string();
            if let Ok(v) = HeaderValue::from_str(&secs) {
                r.headers_mut().insert(hyper::header::RETRY_AFTER, v);
            }
            r
        }
        Err(e) => op_problem(ctx, e),
    }
}

async fn logout(core: &Core, ctx: &Ctx, parts: &Parts, body: &mut Body) -> Resp {
    if let Err(r) = actions::checked_form(core, ctx, parts, body).await {
        return r;
    }
    if let Some(id) = session::cookie(&parts.headers, session::SESSION_COOKIE) {
        if let Err(e) = crate::ops::sessions::sign_out(&core.pool, id).await {
            return op_problem(ctx, e);
        }
    }
    let mut r = layout::see_other("/console/login", ctx);
    r.headers_mut().append(
        SET_COOKIE,
        session::session_cookie(None, ctx.secure, core.app.config.session_max),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_in_goes_on_to_console_pages_only() {
        assert_eq!(
            next_page(Some("next=%2Fconsole%2Fworkflows")),
            "/console/workflows"
        );
        assert_eq!(
            next_page(Some("next=%2Fconsole%3Fstatus%3DFAILED")),
            "/console?status=FAILED"
        );
        assert_eq!(
            next_page(Some("next=https%3A%2F%2Fevil%2Fconsole")),
            "/console"
        );
        assert_eq!(next_page(Some("next=%2F%2Fevil%2Fconsole")), "/console");
        assert_eq!(next_page(Some("next=%2Fmetrics")), "/console");
        assert_eq!(next_page(None), "/console");
        assert!(owns("/console") && owns("/console/x") && !owns("/consoles"));
    }
}

//! `/console/schedules`: every schedule with its next fire times (on its own wall clock)
//! and its last runs (`ops::schedules`, as `GET /schedules/{name}` reads them), and forms
//! that run one now, pause or resume it through the same operations.

use hyper::http::request::Parts;
use hyper::StatusCode;
use maud::{html, Markup};

use super::actions::checked_form;
use super::layout::{self, seg, Nav};
use super::session::Ctx;
use crate::http::body::Body;
use crate::http::response::Resp;
use crate::ops::schedules::{self, Schedule};
use crate::state::Core;

/// An action that went through, by the code its redirect carries (`?done=`): the page
/// says it in a fixed sentence, never in text from the URL.
const DONE: [(&str, &str); 3] = [
    (
        "started",
        "Run started: it is the newest of the schedule's runs below.",
    ),
    ("paused", "Paused."),
    ("resumed", "Resumed."),
];

/// Last runs shown per schedule.
const RUNS: i64 = 5;

pub async fn page(core: &Core, ctx: &Ctx, query: Option<&str>) -> Resp {
    let done = crate::http::query_param(query, "done")
        .and_then(|d| DONE.iter().find(|(code, _)| *code == d).map(|(_, m)| *m));
    render(core, ctx, done.map(Ok), StatusCode::OK).await
}

/// The page with a sentence at its top (`Ok`: what was done, `Err`: why an action
/// failed), answered with `status`.
async fn render(
    core: &Core,
    ctx: &Ctx,
    flash: Option<Result<&str, String>>,
    status: StatusCode,
) -> Resp {
    let all = match schedules::list(core, Some(RUNS)).await {
        Ok(v) => v,
        Err(e) => return super::op_problem(ctx, e),
    };
    let body = html! {
        @match &flash {
            Some(Ok(m)) => p.flash { (m) },
            Some(Err(m)) => p.flash.bad { (m) },
            None => {}
        }
        h1 { "Schedules" }
        @if all.is_empty() {
            p.card.muted { "No schedule yet: create one with POST /schedules." }
        }
        @for s in &all { (schedule(ctx, s)) }
    };
    layout::html_resp(
        status,
        ctx,
        layout::page(ctx, Nav::Schedules, "Schedules", body),
    )
}

fn text<'v>(v: &'v serde_json::Value, key: &str) -> &'v str {
    v[key].as_str().unwrap_or("")
}

/// One schedule: what it runs and when, its next fires, its last runs, its actions.
fn schedule(ctx: &Ctx, sched: &Schedule) -> Markup {
    // The definition as stored: the fields it names.
    let s = &sched.stored.definition;
    let name = text(s, "name");
    let paused = sched.stored.paused;
    let when = match s["cron"].as_str() {
        Some(c) => format!("cron {c} ({})", text(s, "timezone")),
        None => format!("every {}", text(s, "every")),
    };
    let action = |a: &str| format!("/console/schedules/{}/{a}", seg(name));
    html! {
        section.card {
            h2 { (name) " " @if paused { span.badge.st-PAUSED { "paused" } } }
            dl.facts {
                dt { "Workflow" }
                dd {
                    a href={ "/console/workflows/" (seg(text(s, "workflow"))) } { (text(s, "workflow")) }
                    @if let Some(v) = s["version"].as_u64() { " (version " (v) ")" }
                }
                dt { "When" } dd.mono { (when) }
                dt { "Overlap" } dd { (text(s, "overlap")) }
                dt { "Catch-up" } dd { (text(s, "catchUp")) }
                dt { "Next fires" }
                dd {
                    @for (_, local) in &sched.next {
                        span.mono { (local) } " "
                    }
                    @if paused { span.muted { "none while paused" } }
                }
            }
            @let runs = sched.runs.as_deref().unwrap_or_default();
            @if !runs.is_empty() {
                div.scroll { table {
                    thead { tr { th { "Fired (UTC)" } th { "Request" } th { "Status" } } }
                    tbody {
                        @for r in runs {
                            tr {
                                td.mono { (layout::when(&crate::http::rfc3339(r.fire_at))) }
                                td.mono {
                                    @match r.service_request_id {
                                        Some(id) => a href={ "/console/serviceRequests/" (id) } { (id) },
                                        None => span.muted { "none" },
                                    }
                                }
                                td {
                                    @match (r.status, &r.skipped) {
                                        (Some(st), _) => (layout::status(st.as_str())),
                                        (None, Some(why)) => span.muted { "skipped (" (why) ")" },
                                        _ => span.muted { "deleted" },
                                    }
                                }
                            }
                        }
                    }
                } }
            }
            @if ctx.may(crate::ops::access::Op::ChangeSchedule) { div.buttons {
                form method="post" action=(action("trigger")) {
                    input type="hidden" name="csrf" value=(ctx.csrf);
                    button type="submit" { "Run now" }
                }
                @let (verb, label) = if paused { ("resume", "Resume") } else { ("pause", "Pause") };
                form method="post" action=(action(verb)) {
                    input type="hidden" name="csrf" value=(ctx.csrf);
                    button type="submit" { (label) }
                }
            } }
        }
    }
}

/// A schedule's action, posted by its form: done by its operation, then back to the
/// list with the code of what was done (or at once with why it was not).
pub async fn post(
    core: &Core,
    ctx: &Ctx,
    name: &str,
    action: &str,
    parts: &Parts,
    body: &mut Body,
) -> Resp {
    if let Err(r) = checked_form(core, ctx, parts, body).await {
        return r;
    }
    let done = match action {
        "trigger" => schedules::trigger(core, &ctx.caller, name)
            .await
            .map(|_| "started"),
        "pause" => schedules::pause(core, &ctx.caller, name)
            .await
            .map(|_| "paused"),
        "resume" => schedules::resume(core, &ctx.caller, name)
            .await
            .map(|_| "resumed"),
        _ => return layout::problem(StatusCode::NOT_FOUND, ctx, "no such action"),
    };
    match done {
        Ok(code) => layout::see_other(&format!("/console/schedules?done={code}"), ctx),
        Err(e) => {
            let status = crate::http::response::status_of(&e);
            let why = format!("{name}: {}", e.message());
            render(core, ctx, Some(Err(why)), status).await
        }
    }
}

//! `/console/schedules`: every schedule with its next fire times (on its own wall clock)
//! and its last runs, read as `GET /schedules/{name}` reads them, and forms that run one
//! now, pause or resume it through the API's own handlers.

use hyper::http::request::Parts;
use hyper::StatusCode;
use maud::{html, Markup};
use serde_json::Value;

use super::actions::{answer, checked_form};
use super::layout::{self, q, seg, Nav};
use super::session::Ctx;
use crate::http::body::Body;
use crate::http::response::Resp;
use crate::http::schedules;
use crate::state::Core;

/// Last runs shown per schedule.
const RUNS: i64 = 5;

pub async fn page(core: &Core, ctx: &Ctx, query: Option<&str>) -> Resp {
    let all = match schedules::views(core, RUNS).await {
        Ok(v) => v,
        Err(e) => return super::unavailable(ctx, e),
    };
    let done = crate::http::query_param(query, "done");
    let failed = crate::http::query_param(query, "failed");
    let body = html! {
        @if let Some(m) = &done { p.flash { (m) } }
        @if let Some(m) = &failed { p.flash.bad { (m) } }
        h1 { "Schedules" }
        @if all.is_empty() {
            p.card.muted { "No schedule yet: create one with POST /schedules." }
        }
        @for s in &all { (schedule(ctx, s)) }
    };
    layout::html_resp(
        StatusCode::OK,
        ctx,
        layout::page(ctx, Nav::Schedules, "Schedules", body),
    )
}

fn text<'v>(v: &'v Value, key: &str) -> &'v str {
    v[key].as_str().unwrap_or("")
}

/// One schedule: what it runs and when, its next fires, its last runs, its actions.
fn schedule(ctx: &Ctx, s: &Value) -> Markup {
    let name = text(s, "name");
    let paused = s["paused"].as_bool().unwrap_or(false);
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
                    @for f in s["nextFires"].as_array().into_iter().flatten() {
                        span.mono { (text(f, "local")) } " "
                    }
                    @if paused { span.muted { "none while paused" } }
                }
            }
            @let runs = s["lastRuns"].as_array().cloned().unwrap_or_default();
            @if !runs.is_empty() {
                div.scroll { table {
                    thead { tr { th { "Fired (UTC)" } th { "Request" } th { "Status" } } }
                    tbody {
                        @for r in &runs {
                            tr {
                                td.mono { (layout::when(text(r, "fireAt"))) }
                                td.mono {
                                    @match r["serviceRequestId"].as_str() {
                                        Some(id) => a href={ "/console/serviceRequests/" (seg(id)) } { (id) },
                                        None => span.muted { "none" },
                                    }
                                }
                                td {
                                    @match (r["status"].as_str(), r["skipped"].as_str()) {
                                        (Some(st), _) => (layout::status(st)),
                                        (None, Some(why)) => span.muted { "skipped (" (why) ")" },
                                        _ => span.muted { "deleted" },
                                    }
                                }
                            }
                        }
                    }
                } }
            }
            div.buttons {
                form method="post" action=(action("trigger")) {
                    input type="hidden" name="csrf" value=(ctx.csrf);
                    button type="submit" { "Run now" }
                }
                @let (verb, label) = if paused { ("resume", "Resume") } else { ("pause", "Pause") };
                form method="post" action=(action(verb)) {
                    input type="hidden" name="csrf" value=(ctx.csrf);
                    button type="submit" { (label) }
                }
            }
        }
    }
}

/// A schedule's action, posted by its form: done by the API's handler, then back to the list.
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
    let resp = match action {
        "trigger" => schedules::trigger(core, name).await,
        "pause" => schedules::pause(core, name).await,
        "resume" => schedules::resume(core, name).await,
        _ => return layout::problem(StatusCode::NOT_FOUND, ctx, "no such action"),
    };
    let (ok, v) = answer(resp).await;
    let flash = if ok {
        let what = match action {
            "trigger" => format!("{name}: started {}.", text(&v, "serviceRequestId")),
            "pause" => format!("{name}: paused."),
            _ => format!("{name}: resumed."),
        };
        format!("done={}", q(&what))
    } else {
        let why = v["message"].as_str().unwrap_or("the action failed");
        format!("failed={}", q(&format!("{name}: {why}")))
    };
    layout::see_other(&format!("/console/schedules?{flash}"), ctx)
}

//! `/console/workflows` and `/console/workflows/{name}`: the workflows (`ops::workflows`,
//! as `GET /workflows` lists them), one workflow's definition as steps, and its requests:
//! counts and requests per minute by status over the last hour, its newest requests
//! (`ops::lists`, as counts and search read them).

use std::time::{Duration, SystemTime};

use hyper::StatusCode;
use maud::{html, Markup};

use super::layout::{self, json_block, q, seg, Nav};
use super::requests::for_workflow;
use super::session::Ctx;
use super::svg;
use crate::http::response::Resp;
use crate::ops::lists;
use crate::ops::read::RequestRow;
use crate::ops::OpError;
use crate::state::Core;
use crate::workflow::model::Step;
use crate::workflow::Workflow;

pub async fn list(core: &Core, ctx: &Ctx) -> Resp {
    let (defs, total) =
        match crate::ops::workflows::list(&crate::ops::deps(core), 1, 1000, &[]).await {
            Ok(p) => (p.definitions, p.total),
            Err(e) => return super::op_problem(ctx, e),
        };
    // Beyond Clamp: requests waiting for a concurrency slot or a rate's room, by workflow
    // (a column only while some wait).
    let waiting: std::collections::HashMap<String, i64> = lists::waiting_for_slots(&core.pool)
        .await
        .into_iter()
        .collect();
    let body = html! {
        h1 { "Workflows" }
        @if defs.is_empty() {
            p.card.muted { "No workflow yet: create one with POST /workflow." }
        } @else {
            div.scroll { table {
                thead { tr {
                    th { "Name" } th { "Description" } th.num { "Steps" } th { "Enabled" }
                    @if !waiting.is_empty() { th.num { "Waiting" } }
                    th.hide-narrow { "Created (UTC)" }
                } }
                tbody {
                    @for d in &defs {
                        @let name = d["name"].as_str().unwrap_or("");
                        tr {
                            td {
                                a href={ "/console/workflows/" (seg(name)) } { (name) }
                                @if core.app.pauses.is(name) { " " span.badge.st-PAUSED { "paused" } }
                            }
                            td { (d["description"].as_str().unwrap_or("")) }
                            td.num { (d["steps"].as_array().map_or(0, Vec::len)) }
                            td { @if d["enabled"].as_bool().unwrap_or(true) { "yes" } @else { "no" } }
                            @if !waiting.is_empty() {
                                td.num { @match waiting.get(name) {
                                    Some(n) => a href={ "/console?workflow=" (q(name)) "&waitingForSlot=true" } { (n) },
                                    None => "0",
                                } }
                            }
                            td.mono.hide-narrow { (layout::when(d["created_at"].as_str().unwrap_or(""))) }
                        }
                    }
                }
            } }
            @if total > defs.len() as i64 { p.muted { "The first " (defs.len()) " of " (total) ", by name." } }
        }
    };
    layout::html_resp(
        StatusCode::OK,
        ctx,
        layout::page(ctx, Nav::Workflows, "Workflows", body),
    )
}

pub async fn page(core: &Core, ctx: &Ctx, name: &str) -> Resp {
    let wf = match crate::ops::create::workflow(core, name, None).await {
        Ok(wf) => wf,
        Err(OpError::NotFound(_)) => {
            return layout::problem(
                StatusCode::NOT_FOUND,
                ctx,
                &format!("no workflow named {name}"),
            )
        }
        Err(e) => return super::op_problem(ctx, e),
    };
    let now = SystemTime::now();
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    // The last 60 whole minutes and the current one.
    let first_minute = secs / 60 * 60 - 59 * 60;
    let window = lists::Window {
        workflow: Some(name.to_string()),
        after: SystemTime::UNIX_EPOCH + Duration::from_secs(first_minute as u64),
        before: now,
    };
    let buckets = match lists::counts(&core.pool, &window).await {
        Ok(b) => b,
        Err(e) => return super::op_problem(ctx, e),
    };
    let totals = lists::totals(&buckets);
    let recent = lists::Filter {
        workflow: Some(name.to_string()),
        limit: 20,
        ..Default::default()
    };
    let recent = match lists::search(&core.pool, &recent).await {
        Ok((items, _)) => items,
        Err(e) => return super::op_problem(ctx, e),
    };
    // Beyond Clamp: the requests waiting for a slot or a rate's room, by key.
    let waiting = match &wf.concurrency {
        None => lists::Waiting::default(),
        Some(_) => match lists::waiting_by_key(&core.pool, name, 20).await {
            Ok(w) => w,
            Err(e) => return super::op_problem(ctx, e),
        },
    };
    let def = &wf.def;
    // As stored, not as this instance last read it.
    let pause = match crate::ops::pauses::of(core, name).await {
        Ok(p) => p,
        Err(e) => return super::op_problem(ctx, e),
    };
    let body = html! {
        h1 { "Workflow " (def.name) @if pause.is_some() { " " span.badge.st-PAUSED { "paused" } } }
        (pausing(ctx, name, pause.as_ref()))
        div.card { dl.facts {
            dt { "Description" } dd { (def.description) }
            dt { "Version" } dd {
                (def.version) " (latest) · "
                a href={ "/workflow/" (seg(&def.name)) "/versions" } { "all versions" }
            }
            dt { "Enabled" } dd { @if def.enabled { "yes" } @else { "no" } }
            dt { "Created (UTC)" } dd.mono { (layout::when(&def.created_at)) }
            dt { "Definition" } dd { a href={ "/workflow/" (seg(&def.name)) } { "as JSON" } }
        } }
        @if wf.concurrency.is_some() { (flow_control(&wf, &waiting)) }
        h2 { "Steps" }
        (steps(&wf))
        h2 { "Requests per minute, last hour (UTC)" }
        div.legend {
            @for (s, n) in &totals {
                a href=(for_workflow(name, Some(s.as_str()))) { (layout::status(s.as_str())) " " (n) }
            }
            @if totals.is_empty() { span.muted { "No request in the last hour." } }
        }
        (svg::per_minute(&buckets, first_minute, 60))
        h2 { "Newest requests" }
        (newest(&recent))
        p { a href=(for_workflow(name, None)) { "All requests of this workflow" } }
    };
    layout::html_resp(
        StatusCode::OK,
        ctx,
        layout::page(ctx, Nav::Workflows, &def.name, body),
    )
}

/// Whether the workflow is paused, by whom and since when, and the button that pauses
/// or resumes it (for a caller whose role may).
fn pausing(ctx: &Ctx, name: &str, pause: Option<&crate::ops::pauses::Pause>) -> Markup {
    use crate::ops::access::Op;
    let (verb, label, op) = match pause {
        Some(_) => ("resume", "Resume", Op::ResumeWorkflow),
        None => ("pause", "Pause", Op::PauseWorkflow),
    };
    html! {
        @if let Some(p) = pause {
            p.card { "Paused by " (p.paused_by) " at " span.mono { (layout::when(&p.paused_at)) }
                ": its requests are stored and wait, parked, before their next step." }
        }
        @if ctx.may(op) { div.buttons {
            form method="post" action={ "/console/workflows/" (seg(name)) "/" (verb) } {
                input type="hidden" name="csrf" value=(ctx.csrf);
                button type="submit" { (label) " this workflow" }
            }
        } }
    }
}

/// A workflow's action (pause, resume), posted by its form: done by its operation, then
/// back to its page.
pub async fn post(
    core: &Core,
    ctx: &Ctx,
    name: &str,
    action: &str,
    parts: &hyper::http::request::Parts,
    body: &mut crate::http::body::Body,
) -> Resp {
    if let Err(r) = super::actions::checked_form(core, ctx, parts, body).await {
        return r;
    }
    let done = match action {
        "pause" => crate::ops::pauses::pause(core, &ctx.caller, name)
            .await
            .map(drop),
        "resume" => crate::ops::pauses::resume(core, &ctx.caller, name)
            .await
            .map(drop),
        _ => return layout::problem(StatusCode::NOT_FOUND, ctx, "no such action"),
    };
    match done {
        Ok(()) => layout::see_other(&format!("/console/workflows/{}", seg(name)), ctx),
        Err(e) => super::op_problem(ctx, e),
    }
}

/// A limited workflow's flow control: its limit and rate per key, and the keys with the
/// most requests waiting.
fn flow_control(wf: &Workflow, waiting: &lists::Waiting) -> Markup {
    let def = &wf.def;
    html! {
        h2 { "Flow control" }
        @let key = def.concurrency.as_ref().and_then(|c| c.key.as_ref())
            .or(def.rate_limit.as_ref().and_then(|r| r.key.as_ref()));
        p {
            "Per key "
            @match key { Some(k) => code { (k) }, None => "(one key for the whole workflow)" }
            ": "
            @if let Some(c) = &def.concurrency { "at most " (c.limit) " running at once" }
            @if let (Some(_), Some(_)) = (&def.concurrency, &def.rate_limit) { "; " }
            @if let Some(r) = &def.rate_limit {
                @match (r.per_second, r.per_minute) {
                    (Some(n), _) => { "at most " (n) " starts per second" },
                    (_, Some(n)) => { "at most " (n) " starts per minute" },
                    _ => {},
                }
            }
            "."
        }
        @if waiting.requests == 0 {
            p.muted { "No request waits for a slot or a rate's room." }
        } @else {
            p {
                a href={ "/console?workflow=" (q(&def.name)) "&waitingForSlot=true" } {
                    (waiting.requests) " waiting"
                }
                " under " (waiting.keys) @if waiting.keys == 1 { " key" } @else { " keys" }
                @if (waiting.top.len() as i64) < waiting.keys { "; the " (waiting.top.len()) " with the most:" } @else { ":" }
            }
            div.scroll { table {
                thead { tr { th { "Key" } th.num { "Waiting" } } }
                tbody {
                    @for (k, n) in &waiting.top {
                        tr { td.mono { (k) } td.num { (n) } }
                    }
                }
            } }
        }
    }
}

/// The newest requests of a workflow, one row each.
fn newest(recent: &[RequestRow]) -> Markup {
    html! {
        div.scroll { table {
            thead { tr { th { "Created (UTC)" } th { "Request" } th { "Status" } th.hide-narrow { "Reason" } } }
            tbody {
                @for it in recent {
                    tr {
                        td.mono { (layout::when(&it.created_at)) }
                        td.mono { a href={ "/console/serviceRequests/" (it.id) } { (it.id) } }
                        td { (layout::status(it.status.as_str())) }
                        td.hide-narrow { (it.reason.as_deref().unwrap_or("")) }
                    }
                }
            }
        } }
    }
}

/// The steps as defined, with the ids the server gave them: the main sequence in order,
/// each followed by its onFailure steps.
fn steps(wf: &Workflow) -> Markup {
    html! {
        div.scroll { table.definition {
            thead { tr {
                th.num { "Id" } th { "Step" } th { "Mode" } th { "Type" } th { "Calls" }
                th { "Condition (when)" } th { "Transform" } th { "Retry" }
            } }
            tbody {
                @for (i, step) in wf.def.steps.iter().enumerate() {
                    @let id = wf.main.get(i).copied();
                    (step_row(step, id, None))
                    @let failure_ids = id.and_then(|id| wf.step(id)).map(|c| c.on_failure.clone()).unwrap_or_default();
                    @for (j, f) in step.on_failure.iter().enumerate() {
                        (step_row(f, failure_ids.get(j).copied(), Some(&step.name)))
                    }
                }
            }
        } }
    }
}

fn step_row(s: &Step, id: Option<u32>, on_failure_of: Option<&str>) -> Markup {
    html! {
        tr {
            td.num { @if let Some(id) = id { (id) } }
            td {
                (s.name)
                @if let Some(parent) = on_failure_of { div.muted { "onFailure of " (parent) } }
            }
            td { (s.mode) }
            td { @if s.step_type.is_empty() { "SYNC" } @else { (s.step_type) } }
            td { (json_block(Some(&s.val.to_string()))) }
            td.mono { @if s.when.is_empty() { span.muted { "always" } } @else { (s.when) } }
            td {
                @match (&s.request_transform, s.transform) {
                    (Some(t), true) => (json_block(serde_json::to_string(&t.spec).ok().as_deref())),
                    _ => span.muted { "none" },
                }
            }
            td {
                @match &s.retry {
                    Some(r) => (json_block(serde_json::to_string(r).ok().as_deref())),
                    None => span.muted { "server default" },
                }
            }
        }
    }
}

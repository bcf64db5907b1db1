//! `/console/serviceRequests/{id}`: one request, read through the API's status reader
//! (the rows `GET /serviceRequest/{id}` renders) and the rerun's read of the original
//! (its payload); its reruns through search (`rerunOf`); its workflow from the workflow
//! map. Actions post to `actions.rs`.

use std::sync::Arc;

use hyper::StatusCode;
use maud::{html, Markup};
use uuid::Uuid;

use super::layout::{self, json_block, seg, Nav};
use super::session::Ctx;
use super::svg::{self, Bar};
use crate::http::response::Resp;
use crate::state::Core;
use crate::store::reader::{Found, Want};
use crate::store::status::StepRow;
use crate::workflow::Workflow;

/// Why a page was reached after an action, shown at its top.
pub enum Flash {
    Done(String),
    Failed(String),
}

pub async fn page(core: &Core, ctx: &Ctx, id: &str, query: Option<&str>) -> Resp {
    let Ok(id) = Uuid::parse_str(id) else {
        return layout::problem(
            StatusCode::BAD_REQUEST,
            ctx,
            "the service request id is not a valid UUID",
        );
    };
    let found = match core.reader.read(id, Want::Whole).await {
        Ok(Some(f)) => f,
        Ok(None) => {
            return layout::problem(
                StatusCode::NOT_FOUND,
                ctx,
                "no service request with this id",
            )
        }
        Err(e) => return super::unavailable(ctx, e),
    };
    let conn = match core.pool.get().await {
        Ok(c) => c,
        Err(e) => return super::unavailable(ctx, e.into()),
    };
    let (payload, headers) = match crate::store::rerun::source(&conn, id).await {
        Ok(Some(s)) => (
            Some(s.payload),
            crate::engine::job::parse_headers(s.headers.as_bytes()),
        ),
        Ok(None) => (None, Vec::new()),
        Err(e) => return super::unavailable(ctx, e),
    };
    let reruns = crate::store::search::Filter {
        rerun_of: Some(id),
        limit: 20,
        ..Default::default()
    };
    let reruns = match crate::store::search::search(&conn, &reruns).await {
        Ok((items, more)) => (items, more.is_some()),
        Err(e) => return super::unavailable(ctx, e),
    };
    drop(conn);
    let wf = core
        .app
        .workflows
        .get_or_load_version(
            &core.pool,
            &found.head.workflow_name,
            found.head.workflow_version.max(1) as u32,
        )
        .await
        .ok()
        .flatten();
    let flash = match (
        crate::http::query_param(query, "done"),
        crate::http::query_param(query, "failed"),
    ) {
        (Some(d), _) => Some(Flash::Done(d.into_owned())),
        (_, Some(f)) => Some(Flash::Failed(f.into_owned())),
        _ => None,
    };
    let body = html! {
        @match &flash {
            Some(Flash::Done(m)) => p.flash { (m) },
            Some(Flash::Failed(m)) => p.flash.bad { (m) },
            None => {}
        }
        h1 { "Request " span.mono { (id) } }
        (facts(id, &found, &reruns))
        h2 { "Timeline" }
        (svg::timeline(&bars(&found.steps), crate::engine::job::now_ms()))
        h2 { "Actions" }
        (actions(ctx, id, &found, wf.as_ref()))
        h2 { "Steps" }
        (steps(&found.steps))
        h2 { "Payload" }
        (json_block(payload.as_deref()))
        @if !headers.is_empty() {
            h2 { "Forwarded headers" }
            div.scroll { table.headers {
                tbody { @for (k, v) in &headers { tr { td.mono { (k) } td.mono { (v) } } } }
            } }
        }
    };
    layout::html_resp(
        StatusCode::OK,
        ctx,
        layout::page(ctx, Nav::Requests, &format!("Request {id}"), body),
    )
}

fn facts(id: Uuid, f: &Found, reruns: &(Vec<serde_json::Value>, bool)) -> Markup {
    let h = &f.head;
    let wf = &h.workflow_name;
    html! {
        div.card {
            dl.facts {
                dt { "Status" } dd { (layout::status(&h.status)) }
                dt { "Workflow" } dd { a href={ "/console/workflows/" (seg(wf)) } { (wf) } " · version " (h.workflow_version) }
                dt { "Created (UTC)" } dd.mono { (layout::when(&h.created_at)) }
                @if let Some(ms) = f.finished_ms {
                    dt { "Finished (UTC)" } dd.mono { (layout::ms_time(ms)) }
                }
                dt { "Current step" } dd { (h.current_step_id) }
                dt { "Reason" } dd { @if let Some(r) = h.reason.as_deref().filter(|r| !r.is_empty()) { (r) } @else { span.muted { "none" } } }
                @if h.retries > 0 {
                    dt { "Retried" } dd { (h.retries) @if h.retries == 1 { " time" } @else { " times" } }
                }
                @if h.step_attempts > 0 && !matches!(&*h.status, "COMPLETED" | "FAILED" | "CANCELLED") {
                    dt { "Pending retry" }
                    dd {
                        "step " (h.current_step_id) " after " (h.step_attempts)
                        @if h.step_attempts == 1 { " attempt" } @else { " attempts" }
                        @if let Some(at) = &h.retry_at { ", next at " span.mono { (layout::when(at)) } }
                        @if let Some(e) = &h.last_error { br; span.muted { "last error: " (e) } }
                    }
                }
                @if let Some(p) = h.parent_id {
                    dt { "Parent" } dd.mono { a href={ "/console/serviceRequests/" (p) } { (p) } }
                }
                @if let Some(of) = h.rerun_of {
                    dt { "Rerun of" } dd.mono { a href={ "/console/serviceRequests/" (of) } { (of) } }
                }
                @if !reruns.0.is_empty() {
                    dt { "Reruns" }
                    dd {
                        @for r in &reruns.0 {
                            @let rid = r["id"].as_str().unwrap_or("");
                            div {
                                a.mono href={ "/console/serviceRequests/" (rid) } { (rid) } " "
                                (layout::status(r["status"].as_str().unwrap_or("")))
                            }
                        }
                        @if reruns.1 { a href={ "/serviceRequests?rerunOf=" (id) } { "more…" } }
                    }
                }
            }
        }
    }
}

/// Whether a step record is a rerun's copy of the original's.
fn copied(s: &StepRow) -> bool {
    s.reason
        .as_deref()
        .is_some_and(|r| r.starts_with("copied from "))
}

fn bars(steps: &[StepRow]) -> Vec<Bar> {
    steps
        .iter()
        .map(|s| Bar {
            label: format!("{} · {}", s.step_id, s.name),
            status: s.status.to_string(),
            start_ms: s.started_ms,
            end_ms: if s.status == "STARTED" {
                None
            } else {
                s.finished_ms
            },
            copied: copied(s),
        })
        .collect()
}

fn text(b: &Option<bytes::Bytes>) -> Option<&str> {
    b.as_deref()
        .map(|b| std::str::from_utf8(b).unwrap_or("(not UTF-8)"))
}

fn steps(steps: &[StepRow]) -> Markup {
    if steps.is_empty() {
        return html! { p.muted { "No step has run yet." } };
    }
    html! {
        div.scroll {
            table.steps {
                thead { tr {
                    th.num { "Step" } th { "Name" } th { "Status" } th.num { "Attempts" }
                    th.num { "Time taken" } th.hide-narrow { "Started (UTC)" } th { "Request and response" }
                } }
                tbody {
                    @for s in steps {
                        tr {
                            td.num { (s.step_id) }
                            td { (s.name) }
                            td { (layout::status(&s.status)) }
                            td.num { (s.attempts) }
                            td.num { @if let Some(t) = s.time_taken_ms { (svg::duration(t as f64)) } }
                            td.mono.hide-narrow { (layout::ms_time(s.started_ms)) }
                            td {
                                @if let Some(r) = &s.reason { div.muted { (r) } }
                                @if let Some(c) = s.child_id {
                                    div { "child " a.mono href={ "/console/serviceRequests/" (c) } { (c) } }
                                }
                                details {
                                    summary { "request" }
                                    (json_block(text(&s.request)))
                                }
                                @if s.status != "STARTED" {
                                    details {
                                        summary { "response" }
                                        (json_block(text(&s.response)))
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn actions(ctx: &Ctx, id: Uuid, f: &Found, wf: Option<&Arc<Workflow>>) -> Markup {
    let status = &*f.head.status;
    let retryable = matches!(status, "FAILED" | "CANCELLED");
    let cancellable = !matches!(status, "COMPLETED" | "FAILED" | "CANCELLED");
    html! {
        div.actions {
            @if retryable {
                form.card method="post" action={ "/console/serviceRequests/" (id) "/retry" } {
                    strong { "Retry" }
                    span.muted { "Go on as this request from the step that failed; completed steps are not called again." }
                    input type="hidden" name="csrf" value=(ctx.csrf);
                    label { "New request for that step (JSON, optional)"
                        textarea name="payload" placeholder="leave empty to send its recorded request" {}
                    }
                    button type="submit" name="action" value="retry" { "Retry" }
                }
            }
            @if let Some(wf) = wf {
                form.card method="post" action={ "/console/serviceRequests/" (id) "/rerun" } {
                    strong { "Rerun" }
                    span.muted { "A new request; the steps before the chosen one take this request's outcomes without being called." }
                    input type="hidden" name="csrf" value=(ctx.csrf);
                    label { "From step "
                        select name="fromStep" {
                            @for sid in &wf.main {
                                @let name = wf.step(*sid).map_or("", |s| &*s.name);
                                option value=(sid) { (sid) " · " (name) }
                            }
                        }
                    }
                    label { "Request for that step (JSON, optional)"
                        textarea name="payload" placeholder="leave empty for the request it received" {}
                    }
                    button type="submit" name="action" value="rerun" { "Rerun" }
                }
            }
            @if cancellable {
                form.card method="post" action={ "/console/serviceRequests/" (id) "/cancel" } {
                    strong { "Cancel" }
                    span.muted { "No further step starts; a paused step stops waiting." }
                    input type="hidden" name="csrf" value=(ctx.csrf);
                    label { "Reason (optional)" input type="text" name="reason" maxlength="1024"; }
                    button.danger type="submit" name="action" value="cancel" { "Cancel" }
                }
            }
        }
    }
}

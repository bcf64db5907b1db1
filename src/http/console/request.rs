//! `/console/serviceRequests/{id}`: one request as `ops::read::details` reads it (the
//! rows `GET /serviceRequest/{id}` renders, its payload and headers, its reruns, its
//! workflow). Actions post to `actions.rs`, which come back here.

use std::sync::Arc;

use hyper::StatusCode;
use maud::{html, Markup};
use uuid::Uuid;

use super::layout::{self, json_block, seg, Nav};
use super::session::Ctx;
use super::svg::{self, Bar};
use crate::http::answers;
use crate::http::response::Resp;
use crate::ops::read::Details;
use crate::ops::read::{Child, Found, Head, StepRow, Waits};
use crate::state::Core;
use crate::status::{RequestStatus, StepStatus};
use crate::workflow::Workflow;

/// What a page shows at its top after an action: a success by its code in the URL (a
/// fixed sentence, never text from the URL), or a failure as the action's answer says.
pub enum Flash {
    Done(Done),
    Failed(String),
}

/// An action that went through, by the code its redirect carries (`?done=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Done {
    Retried,
    Rerun,
    Cancelled,
    Delivered,
}

impl Done {
    pub const fn code(self) -> &'static str {
        match self {
            Done::Retried => "retried",
            Done::Rerun => "rerun",
            Done::Cancelled => "cancelled",
            Done::Delivered => "delivered",
        }
    }

    fn read(code: &str) -> Option<Done> {
        [Done::Retried, Done::Rerun, Done::Cancelled, Done::Delivered]
            .into_iter()
            .find(|d| d.code() == code)
    }

    /// The sentence, with what the page knows of the request.
    fn sentence(self, f: &Found) -> String {
        match self {
            Done::Retried => format!(
                "Retried (retry {}): it runs again from the step that failed.",
                f.head.retries
            ),
            Done::Rerun => match f.head.rerun_of {
                Some(of) => format!("Rerun of {of} created."),
                None => "Rerun created.".into(),
            },
            Done::Cancelled => "Cancelled.".into(),
            Done::Delivered => "Event delivered to the requests waiting for it.".into(),
        }
    }
}

pub async fn page(core: &Core, ctx: &Ctx, id: &str, query: Option<&str>) -> Resp {
    let Ok(id) = Uuid::parse_str(id) else {
        return layout::problem(
            StatusCode::BAD_REQUEST,
            ctx,
            "the service request id is not a valid UUID",
        );
    };
    let flash = crate::http::query_param(query, "done")
        .and_then(|d| Done::read(&d))
        .map(Flash::Done);
    render(core, ctx, id, flash, StatusCode::OK).await
}

/// The page of request `id`, with `flash` at its top, answered with `status` (an action
/// that failed shows its reason here, with its own status).
pub async fn render(
    core: &Core,
    ctx: &Ctx,
    id: Uuid,
    flash: Option<Flash>,
    status: StatusCode,
) -> Resp {
    let d = match crate::ops::read::details(core, id).await {
        Ok(d) => d,
        Err(e) => return super::op_problem(ctx, e),
    };
    let body = html! {
        @match &flash {
            Some(Flash::Done(done)) => p.flash { (done.sentence(&d.found)) },
            Some(Flash::Failed(m)) => p.flash.bad { (m) },
            None => {}
        }
        h1 { "Request " span.mono { (id) } }
        (facts(id, &d))
        h2 { "Timeline" }
        (svg::timeline(&bars(&d.found.steps, &d.children), crate::ops::read::now_ms()))
        h2 { "Actions" }
        (actions(ctx, id, &d.found, d.workflow.as_ref()))
        h2 { "Steps" }
        (steps(&d.found.steps))
        h2 { "Payload" }
        (json_block(d.payload.as_deref()))
        @if !d.notifications.is_empty() {
            h2 { "Notifications" }
            div.scroll { table {
                thead { tr { th { "Status" } th { "State" } th.num { "Attempts" } th { "Finished (UTC)" } th { "Delivered (UTC)" } th { "Last error" } } }
                tbody { @for n in &d.notifications { tr {
                    td { (layout::status(n.status.as_str())) }
                    td { (n.state) }
                    td.num { (n.attempts) }
                    td.mono { (layout::when(&n.finished_at)) }
                    td.mono { @if let Some(at) = &n.delivered_at { (layout::when(at)) } }
                    td { (n.last_error.as_deref().unwrap_or("")) }
                } } }
            } }
        }
        @if !d.headers.is_empty() {
            h2 { "Forwarded headers" }
            div.scroll { table.headers {
                tbody { @for (k, v) in &d.headers { tr { td.mono { (k) } td.mono { (shown(k, v)) } } } }
            } }
        }
    };
    layout::html_resp(
        status,
        ctx,
        layout::page(ctx, Nav::Requests, &format!("Request {id}"), body),
    )
}

fn facts(id: Uuid, d: &Details) -> Markup {
    let (f, h) = (&d.found, &d.found.head);
    let wf = &h.workflow_name;
    html! {
        div.card {
            dl.facts {
                dt { "Status" } dd { (layout::status(h.status.as_str())) }
                dt { "Workflow" } dd { a href={ "/console/workflows/" (seg(wf)) } { (wf) } " · version " (h.workflow_version) }
                dt { "Created (UTC)" } dd.mono { (layout::when(&h.created_at)) }
                @if let Some(ms) = f.finished_ms {
                    dt { "Finished (UTC)" } dd.mono { (layout::ms_time(ms)) }
                }
                dt { "Current step" } dd { (h.current_step_id) }
                dt { "Reason" } dd { @if let Some(r) = h.reason.as_deref().filter(|r| !r.is_empty()) { (r) } @else { span.muted { "none" } } }
                @if let Some(by) = &h.deadline {
                    dt { "Deadline (UTC)" } dd.mono { (layout::when(by)) }
                }
                @if let Some(p) = h.priority {
                    dt { "Priority" } dd { (p) " (of 1 to 9; 5 when not given)" }
                }
                @if let (Some(key), Some(ahead)) = (&h.concurrency_key, h.slot_ahead) {
                    dt { "Waiting for a slot" } dd {
                        "key " code { (key) } " · " (ahead) " waiting before it"
                    }
                }
                @if !d.labels.is_empty() {
                    dt { "Labels" }
                    dd { @for l in &d.labels { a.label href={ "/console?labels=" (layout::q(l)) } { (l) } " " } }
                }
                @if h.retries > 0 {
                    dt { "Retried" } dd { (h.retries) @if h.retries == 1 { " time" } @else { " times" } }
                }
                (waiting(h))
                (family(id, d))
            }
        }
    }
}

/// What a request that is not running waits for, as facts.
fn waiting(h: &Head) -> Markup {
    html! {
        @match h.waits() {
            Waits::Event { event, key, until } => {
                dt { "Awaiting event" }
                dd {
                    "step " (h.current_step_id) " waits for " span.mono { (event) } " with key " span.mono { (key) }
                    @if let Some(by) = until { ", until " span.mono { (layout::when(by)) } }
                }
            }
            Waits::Answer { by } => {
                dt { "Answer due" }
                dd { "step " (h.current_step_id) " times out at " span.mono { (layout::when(by)) } }
            }
            Waits::Sleep { until } => {
                dt { "Waiting" }
                dd { "step " (h.current_step_id) " sleeps until " span.mono { (layout::when(until)) } }
            }
            Waits::Retry => {
                dt { "Pending retry" }
                dd {
                    "step " (h.current_step_id) " after " (h.step_attempts)
                    @if h.step_attempts == 1 { " attempt" } @else { " attempts" }
                    @if let Some(at) = &h.retry_at { ", next at " span.mono { (layout::when(at)) } }
                    @if let Some(e) = &h.last_error { br; span.muted { "last error: " (e) } }
                }
            }
            Waits::Nothing => {}
        }
    }
}

/// The requests it is related to, as facts: its parent, what it reruns, its children and
/// its reruns.
fn family(id: Uuid, d: &Details) -> Markup {
    let h = &d.found.head;
    html! {
        @if let Some(p) = h.parent_id {
            dt { "Parent" } dd.mono { a href={ "/console/serviceRequests/" (p) } { (p) } }
        }
        @if let Some(of) = h.rerun_of {
            dt { "Rerun of" } dd.mono { a href={ "/console/serviceRequests/" (of) } { (of) } }
        }
        @if !d.children.is_empty() {
            dt { "Children" }
            dd {
                @for c in &d.children {
                    div {
                        "step " (c.step_id) " "
                        @if let Some((k, v)) = super::super::answers::fan_place(&c.workflow_name, c.fan_index) {
                            (k) " " (v.as_str().map_or_else(|| v.to_string(), str::to_string)) " "
                        }
                        a.mono href={ "/console/serviceRequests/" (c.id) } { (c.id) } " "
                        (layout::status(c.status.as_str()))
                    }
                }
                @if d.children_total > d.children.len() as i64 {
                    a href={ "/serviceRequest/" (id) "/children?pageNumber=0&pageSize=1000" } {
                        (d.children_total) " in all…"
                    }
                }
            }
        }
        @if !d.reruns.is_empty() {
            dt { "Reruns" }
            dd {
                @for r in &d.reruns {
                    div {
                        a.mono href={ "/console/serviceRequests/" (r.id) } { (r.id) } " "
                        (layout::status(r.status.as_str()))
                    }
                }
                @if d.more_reruns { a href={ "/serviceRequests?rerunOf=" (id) } { "more…" } }
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

/// The step records in order, each fan-out or WORKFLOW step followed by a lane per child
/// request it started (a branch or item, from its creation to its finish).
fn bars(steps: &[StepRow], children: &[Child]) -> Vec<Bar> {
    let mut out = Vec::with_capacity(steps.len() + children.len());
    for (i, s) in steps.iter().enumerate() {
        out.push(Bar {
            label: step_label(s),
            status: s.status,
            start_ms: s.started_ms,
            end_ms: if s.status == StepStatus::Started {
                None
            } else {
                s.finished_ms
            },
            copied: copied(s),
        });
        // After the step's last record.
        if steps.get(i + 1).is_some_and(|n| n.step_id == s.step_id) {
            continue;
        }
        for c in children.iter().filter(|c| c.step_id == s.step_id) {
            out.push(lane(c));
        }
    }
    out
}

/// A step record's bar label: `2 · charge`, or for a PARALLEL branch's step run as a
/// lane of the request, `↳ branch acme · 1 · ask`.
fn step_label(s: &StepRow) -> String {
    match answers::lane_place(s) {
        Some((l, branch, name)) => format!("↳ branch {branch} · {} · {name}", l.step),
        None => format!("{} · {}", s.step_id, s.name),
    }
}

/// A child request's lane: `↳ branch acme`, `↳ item 7`, or `↳ <its workflow>`.
fn lane(c: &Child) -> Bar {
    let place = match answers::fan_place(&c.workflow_name, c.fan_index) {
        Some((k, v)) => format!(
            "{k} {}",
            v.as_str().map_or_else(|| v.to_string(), str::to_string)
        ),
        None => c.workflow_name.clone(),
    };
    let status = match c.status {
        RequestStatus::Completed => StepStatus::Completed,
        RequestStatus::Failed | RequestStatus::Cancelled => StepStatus::Failed,
        _ => StepStatus::Started,
    };
    Bar {
        label: format!("↳ {place}"),
        status,
        start_ms: c.created_ms,
        end_ms: c.finished_ms.filter(|_| status != StepStatus::Started),
        copied: false,
    }
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
                            @match answers::lane_place(s) {
                                Some((l, branch, name)) => {
                                    td.num { (l.fan) " ↳ " (l.step) }
                                    td { (name) div.muted { "branch " (branch) } }
                                }
                                None => {
                                    td.num { (s.step_id) }
                                    td { (s.name) }
                                }
                            }
                            td { (layout::status(s.status.as_str())) }
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
                                @if s.status != StepStatus::Started {
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

/// The actions the request's state allows and the signed-in role may take.
fn actions(ctx: &Ctx, id: Uuid, f: &Found, wf: Option<&Arc<Workflow>>) -> Markup {
    use crate::ops::access::Op;
    let retryable = f.head.status.is_retryable() && ctx.may(Op::Retry);
    let cancellable = !f.head.status.is_finished() && ctx.may(Op::Cancel);
    // Whether it may undo its steps, and whether a cancel does unless told otherwise.
    let wf_compensates = wf
        .filter(|w| w.compensates)
        .map(|w| w.def.compensate_on_cancel);
    let wf = wf.filter(|_| ctx.may(Op::Rerun));
    let deliverable = ctx.may(Op::DeliverEvent);
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
            @if let (true, Waits::Event { event, key, .. }) = (deliverable, f.head.waits()) {
                form.card method="post" action={ "/console/serviceRequests/" (id) "/event" } {
                    strong { "Deliver the event" }
                    span.muted { "Delivers " span.mono { (event) } " with key " span.mono { (key) } ": every request waiting for it goes on, with the payload as the step's answer." }
                    input type="hidden" name="csrf" value=(ctx.csrf);
                    label { "Payload (JSON, optional)"
                        textarea name="payload" placeholder="{\"approved\": true}" {}
                    }
                    button type="submit" name="action" value="event" { "Deliver" }
                }
            }
            @if cancellable {
                form.card method="post" action={ "/console/serviceRequests/" (id) "/cancel" } {
                    strong { "Cancel" }
                    span.muted { "No further step starts; a paused step stops waiting." }
                    input type="hidden" name="csrf" value=(ctx.csrf);
                    label { "Reason (optional)" input type="text" name="reason" maxlength="1024"; }
                    @if let Some(on_cancel) = wf_compensates {
                        label { "Undo its completed steps first (their compensations run, last first) "
                            select name="compensate" {
                                option value="true" selected[on_cancel] { "yes" }
                                option value="false" selected[!on_cancel] { "no" }
                            }
                        }
                    }
                    button.danger type="submit" name="action" value="cancel" { "Cancel" }
                }
            }
        }
    }
}

/// A forwarded header's value as the page shows it: credentials never (an operator who
/// forwards `Authorization` to steps passes a downstream's secret along; it is not the
/// console's to show).
fn shown<'v>(name: &str, value: &'v str) -> &'v str {
    const HIDDEN: &[&str] = &["authorization", "proxy-authorization", "cookie"];
    if HIDDEN.iter().any(|h| name.eq_ignore_ascii_case(h)) {
        "(hidden)"
    } else {
        value
    }
}

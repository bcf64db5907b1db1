//! `/console/triggers`: every trigger with its source, workflow and filter, the link to
//! the requests it started (its `trigger:<name>` label), and forms that pause or resume
//! it through the same operations as `POST /triggers/{name}/pause|resume`.

use hyper::http::request::Parts;
use hyper::StatusCode;
use maud::{html, Markup};

use super::actions::checked_form;
use super::layout::{self, q, seg, Nav};
use super::session::Ctx;
use crate::http::body::Body;
use crate::http::response::Resp;
use crate::ops::triggers::{self, Trigger};
use crate::state::Core;

/// An action that went through, by the code its redirect carries (`?done=`).
const DONE: [(&str, &str); 2] = [("paused", "Paused."), ("resumed", "Resumed.")];

pub async fn page(core: &Core, ctx: &Ctx, query: Option<&str>) -> Resp {
    let done = crate::http::query_param(query, "done")
        .and_then(|d| DONE.iter().find(|(code, _)| *code == d).map(|(_, m)| *m));
    render(core, ctx, done.map(Ok), StatusCode::OK).await
}

async fn render(
    core: &Core,
    ctx: &Ctx,
    flash: Option<Result<&str, String>>,
    status: StatusCode,
) -> Resp {
    let all = match triggers::list(core).await {
        Ok(v) => v,
        Err(e) => return super::op_problem(ctx, e),
    };
    let body = html! {
        @match &flash {
            Some(Ok(m)) => p.flash { (m) },
            Some(Err(m)) => p.flash.bad { (m) },
            None => {}
        }
        h1 { "Triggers" }
        @if all.is_empty() {
            p.card.muted { "No trigger yet: define one with POST /triggers." }
        }
        @for t in &all { (trigger(ctx, t)) }
    };
    layout::html_resp(
        status,
        ctx,
        layout::page(ctx, Nav::Triggers, "Triggers", body),
    )
}

fn text<'v>(v: &'v serde_json::Value, key: &str) -> &'v str {
    v[key].as_str().unwrap_or("")
}

/// Where a trigger's messages come from, in a line.
fn source(def: &serde_json::Value) -> String {
    let src = &def["source"];
    if let Some(w) = src.get("webhook") {
        return format!(
            "webhook POST /hooks/{} ({} signature)",
            text(def, "name"),
            text(w, "verify")
        );
    }
    if let Some(a) = src.get("amqp") {
        return format!("AMQP queue {}", text(a, "queue"));
    }
    "unknown".into()
}

/// One trigger: its source, workflow, filter and labels, its requests, its actions.
fn trigger(ctx: &Ctx, t: &Trigger) -> Markup {
    let d = &t.stored.definition;
    let name = text(d, "name");
    let paused = t.stored.paused;
    let action = |a: &str| format!("/console/triggers/{}/{a}", seg(name));
    html! {
        section.card {
            h2 { (name) " " @if paused { span.badge.st-PAUSED { "paused" } } }
            dl.facts {
                dt { "Source" } dd.mono { (source(d)) }
                dt { "Workflow" }
                dd {
                    a href={ "/console/workflows/" (seg(text(d, "workflow"))) } { (text(d, "workflow")) }
                    @if let Some(v) = d["version"].as_u64() { " (version " (v) ")" }
                }
                @if let Some(w) = d["when"].as_str() { dt { "When" } dd.mono { (w) } }
                @if let Some(l) = d["labels"].as_object() {
                    dt { "Labels" }
                    dd.mono { @for (k, e) in l { (k) " = " (e.as_str().unwrap_or("")) br; } }
                }
                dt { "Requests" }
                dd { a href={ "/console?labels=" (q(&format!("trigger:{name}"))) } { "the requests it started" } }
            }
            @if ctx.may(crate::ops::access::Op::ChangeTrigger) { div.buttons {
                @let (verb, label) = if paused { ("resume", "Resume") } else { ("pause", "Pause") };
                form method="post" action=(action(verb)) {
                    input type="hidden" name="csrf" value=(ctx.csrf);
                    button type="submit" { (label) }
                }
            } }
        }
    }
}

/// A trigger's action, posted by its form: done by its operation, then back to the list.
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
    let (paused, code) = match action {
        "pause" => (true, "paused"),
        "resume" => (false, "resumed"),
        _ => return layout::problem(StatusCode::NOT_FOUND, ctx, "no such action"),
    };
    match triggers::set_paused(core, &ctx.caller, name, paused).await {
        Ok(_) => layout::see_other(&format!("/console/triggers?done={code}"), ctx),
        Err(e) => {
            let status = crate::http::response::status_of(&e);
            let why = format!("{name}: {}", e.message());
            render(core, ctx, Some(Err(why)), status).await
        }
    }
}

//! `/console`: requests by status, workflow and creation time, newest first, in pages,
//! with counts by status. Read through the API's own code: search's parser and
//! statement, the counts of `GET /serviceRequestCounts`, the list of `GET /workflows`.

use std::time::SystemTime;

use hyper::StatusCode;
use maud::{html, Markup};
use serde_json::Value;

use super::layout::{self, q, seg, Nav};
use super::session::Ctx;
use crate::http::response::Resp;
use crate::state::Core;

use crate::http::search::STATUSES;

/// The page's filters as the browser sent them.
#[derive(Debug, Default)]
struct Form {
    statuses: Vec<String>,
    workflow: String,
    after: String,
    before: String,
    cursor: String,
}

impl Form {
    fn read(query: Option<&str>) -> Form {
        let mut f = Form::default();
        for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            let v = v.trim().to_string();
            match &*k {
                "status" if !v.is_empty() => f.statuses.push(v),
                "workflow" => f.workflow = v,
                "createdAfter" => f.after = v,
                "createdBefore" => f.before = v,
                "cursor" => f.cursor = v,
                _ => {}
            }
        }
        f
    }

    /// The query string of the API's search (and counts, without status and cursor).
    fn api_query(&self, with_status: bool, with_cursor: bool) -> String {
        let mut out = form_urlencoded::Serializer::new(String::new());
        if with_status {
            for s in &self.statuses {
                out.append_pair("status", s);
            }
        }
        if !self.workflow.is_empty() {
            out.append_pair("workflow", &self.workflow);
        }
        if !self.after.is_empty() {
            out.append_pair("createdAfter", &rfc3339(&self.after));
        }
        if !self.before.is_empty() {
            out.append_pair("createdBefore", &rfc3339(&self.before));
        }
        if with_cursor && !self.cursor.is_empty() {
            out.append_pair("cursor", &self.cursor);
        }
        out.finish()
    }

    /// This page's link with other statuses, or another cursor.
    fn link(&self, statuses: &[&str], cursor: Option<&str>) -> String {
        let mut out = form_urlencoded::Serializer::new(String::new());
        for s in statuses {
            out.append_pair("status", s);
        }
        for (k, v) in [
            ("workflow", &self.workflow),
            ("createdAfter", &self.after),
            ("createdBefore", &self.before),
        ] {
            if !v.is_empty() {
                out.append_pair(k, v);
            }
        }
        if let Some(c) = cursor {
            out.append_pair("cursor", c);
        }
        format!("/console?{}", out.finish())
    }
}

/// A time from a `datetime-local` field (`2026-12-01T10:00`, taken as UTC) as RFC 3339;
/// anything else is passed on for the API's parser to judge.
fn rfc3339(v: &str) -> String {
    let b = v.as_bytes();
    let local =
        b.len() >= 16 && b[10] == b'T' && !v[10..].contains(['Z', '+']) && !v[11..].contains('-');
    match (local, b.len()) {
        (true, 16) => format!("{v}:00Z"),
        (true, _) => format!("{v}Z"),
        _ => v.to_string(),
    }
}

pub async fn page(core: &Core, ctx: &Ctx, query: Option<&str>) -> Resp {
    let form = Form::read(query);
    let filter = crate::http::search::parse(Some(&form.api_query(true, true)));
    let conn = match core.pool.get().await {
        Ok(c) => c,
        Err(e) => return super::unavailable(ctx, e.into()),
    };
    let workflows = crate::store::queries::workflows_page(&conn, 1000, 0, &[])
        .await
        .map(|(w, _)| w)
        .unwrap_or_default();
    let (results, problem) = match filter {
        Err(why) => (None, Some(why)),
        Ok(f) => match crate::store::search::search(&conn, &f).await {
            Ok(page) => (Some(page), None),
            Err(e) => return super::unavailable(ctx, e),
        },
    };
    drop(conn);
    let counts =
        match crate::http::counts::parse(Some(&form.api_query(false, false)), SystemTime::now()) {
            Ok(w) => crate::http::counts::read(core, &w)
                .await
                .ok()
                .map(|b| (crate::http::counts::totals(&b), w)),
            Err(_) => None,
        };
    let body = html! {
        h1 { "Service requests" }
        (filters(&form, &workflows))
        @if let Some((totals, w)) = &counts {
            (count_links(&form, totals, w))
        }
        @if let Some(why) = &problem {
            p.flash.bad { (why) }
        }
        @if let Some((items, next)) = &results {
            (table(items))
            div.pager {
                @if !form.cursor.is_empty() {
                    a href=(form.link(&statuses(&form), None)) { "← Newest" }
                }
                @if let Some(n) = next {
                    a href=(form.link(&statuses(&form), Some(&n.simple().to_string()))) { "Older →" }
                }
            }
        }
    };
    let status = if problem.is_some() {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::OK
    };
    layout::html_resp(
        status,
        ctx,
        layout::page(ctx, Nav::Requests, "Requests", body),
    )
}

fn statuses(form: &Form) -> Vec<&str> {
    form.statuses.iter().map(String::as_str).collect()
}

fn filters(form: &Form, workflows: &[Value]) -> Markup {
    let names: Vec<&str> = workflows
        .iter()
        .filter_map(|w| w["name"].as_str())
        .collect();
    html! {
        form.card.filters method="get" action="/console" {
            fieldset {
                @for s in STATUSES {
                    label {
                        input type="checkbox" name="status" value=(s)
                            checked[form.statuses.iter().any(|x| x.eq_ignore_ascii_case(s))];
                        (s)
                    }
                }
            }
            label { "Workflow"
                select name="workflow" {
                    option value="" { "any" }
                    @for n in &names {
                        option value=(n) selected[*n == form.workflow] { (n) }
                    }
                    @if !form.workflow.is_empty() && !names.contains(&form.workflow.as_str()) {
                        option value=(form.workflow) selected { (form.workflow) }
                    }
                }
            }
            label { "Created after (UTC)"
                input type="datetime-local" name="createdAfter" value=(short(&form.after));
            }
            label { "Created before (UTC)"
                input type="datetime-local" name="createdBefore" value=(short(&form.before));
            }
            button type="submit" { "Search" }
            a href="/console" { "Clear" }
        }
    }
}

/// A time as a `datetime-local` field shows it.
fn short(v: &str) -> String {
    v.chars().take(16).collect()
}

fn count_links(form: &Form, totals: &[(String, i64)], w: &crate::http::counts::Window) -> Markup {
    let window = if form.after.is_empty() && form.before.is_empty() {
        "created in the last hour".to_string()
    } else {
        let t = |t: SystemTime| {
            chrono::DateTime::<chrono::Utc>::from(t)
                .format("%Y-%m-%d %H:%M")
                .to_string()
        };
        format!("created {} – {} UTC", t(w.after), t(w.before))
    };
    let all: i64 = totals.iter().map(|(_, n)| n).sum();
    html! {
        div.counts {
            span.muted { (all) " " (window) ":" }
            @for (s, n) in totals {
                a href=(form.link(&[s.as_str()], None)) { (layout::status(s)) span.n { (n) } }
            }
        }
    }
}

fn table(items: &[Value]) -> Markup {
    if items.is_empty() {
        return html! { p.card.muted { "No request matches." } };
    }
    html! {
        div.scroll {
            table.requests {
                thead { tr {
                    th { "Created (UTC)" } th { "Request" } th { "Workflow" } th { "Status" }
                    th.num.hide-narrow { "Step" } th.hide-narrow { "Reason" }
                } }
                tbody {
                    @for it in items {
                        @let id = it["id"].as_str().unwrap_or("");
                        @let wf = it["workflow_name"].as_str().unwrap_or("");
                        tr {
                            td.mono { (layout::when(it["created_at"].as_str().unwrap_or(""))) }
                            td.mono { a href={ "/console/serviceRequests/" (id) } { (id) } }
                            td { a href={ "/console/workflows/" (seg(wf)) } { (wf) } }
                            td { (layout::status(it["status"].as_str().unwrap_or(""))) }
                            td.num.hide-narrow { (it["current_step_id"]) }
                            td.hide-narrow { (it["reason"].as_str().unwrap_or("")) }
                        }
                    }
                }
            }
        }
    }
}

/// This page filtered to one workflow (and one status).
pub fn for_workflow(name: &str, status: Option<&str>) -> String {
    match status {
        Some(s) => format!("/console?workflow={}&status={}", q(name), q(s)),
        None => format!("/console?workflow={}", q(name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_times_are_utc_and_others_pass_through() {
        assert_eq!(rfc3339("2026-12-01T10:00"), "2026-12-01T10:00:00Z");
        assert_eq!(rfc3339("2026-12-01T10:00:30"), "2026-12-01T10:00:30Z");
        assert_eq!(
            rfc3339("2026-12-01T10:00:00+01:00"),
            "2026-12-01T10:00:00+01:00"
        );
        assert_eq!(rfc3339("2026-12-01T10:00:00Z"), "2026-12-01T10:00:00Z");
        assert_eq!(rfc3339("soon"), "soon");
    }

    #[test]
    fn the_form_becomes_the_api_query() {
        let f = Form::read(Some(
            "status=FAILED&status=PAUSED&workflow=a+b&createdAfter=2026-12-01T10:00&cursor=x",
        ));
        assert_eq!(
            f.api_query(true, true),
            "status=FAILED&status=PAUSED&workflow=a+b&createdAfter=2026-12-01T10%3A00%3A00Z&cursor=x"
        );
        assert_eq!(
            f.api_query(false, false),
            "workflow=a+b&createdAfter=2026-12-01T10%3A00%3A00Z"
        );
        assert!(crate::http::search::parse(Some(&f.api_query(true, false))).is_ok());
    }
}

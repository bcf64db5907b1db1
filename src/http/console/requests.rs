//! `/console`: requests by status, workflow and creation time, newest first, in pages,
//! with counts by status. The form is read into the filters by the rules the API's query
//! strings are read by (`ops::lists`), then searched, counted and listed by the same
//! operations.

use std::time::SystemTime;

use std::borrow::Cow;

use hyper::StatusCode;
use maud::{html, Markup};

use super::layout::{self, q, seg, Nav};
use super::session::Ctx;
use crate::http::response::Resp;
use crate::ops::lists::{self, Pairs, Window};
use crate::ops::read::RequestRow;
use crate::state::Core;
use crate::status::RequestStatus;

/// The page's filters as the browser sent them.
#[derive(Debug, Default)]
struct Form {
    statuses: Vec<String>,
    workflow: String,
    after: String,
    before: String,
    cursor: String,
    /// Only requests waiting for a concurrency slot or a rate's room (beyond Clamp).
    waiting: bool,
    /// Only requests carrying all these labels, separated by commas (beyond Clamp).
    labels: String,
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
                "waitingForSlot" => f.waiting = v == "true",
                "labels" => f.labels = v,
                _ => {}
            }
        }
        f
    }

    /// The filters as name/value pairs, times made RFC 3339 (and, for counts, without
    /// status, cursor and the wait for a slot, which counts do not filter by).
    fn pairs<'a>(&'a self, with_status: bool, with_cursor: bool) -> Pairs<'a> {
        let mut out: Pairs<'_> = Vec::new();
        let mut add = |k: &'static str, v: Cow<'a, str>| out.push((Cow::Borrowed(k), v));
        if with_status {
            for s in &self.statuses {
                add("status", Cow::Borrowed(s));
            }
            if self.waiting {
                add("waitingForSlot", Cow::Borrowed("true"));
            }
            for l in self
                .labels
                .split(',')
                .map(str::trim)
                .filter(|l| !l.is_empty())
            {
                add("label", Cow::Borrowed(l));
            }
        }
        if !self.workflow.is_empty() {
            add("workflow", Cow::Borrowed(&self.workflow));
        }
        if !self.after.is_empty() {
            add("createdAfter", Cow::Owned(rfc3339(&self.after)));
        }
        if !self.before.is_empty() {
            add("createdBefore", Cow::Owned(rfc3339(&self.before)));
        }
        if with_cursor && !self.cursor.is_empty() {
            add("cursor", Cow::Borrowed(&self.cursor));
        }
        out
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
            ("labels", &self.labels),
        ] {
            if !v.is_empty() {
                out.append_pair(k, v);
            }
        }
        if self.waiting {
            out.append_pair("waitingForSlot", "true");
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
    let workflows = match crate::ops::workflows::list(&crate::ops::deps(core), 1, 1000, &[]).await {
        Ok(p) => p.definitions,
        Err(e) => return super::op_problem(ctx, e),
    };
    let (results, problem) = match lists::search_filter(&form.pairs(true, true)) {
        Err(e) => (None, Some(e.message())),
        Ok(f) => match lists::search(&core.pool, &f).await {
            Ok(page) => (Some(page), None),
            Err(e) => return super::op_problem(ctx, e),
        },
    };
    let counts = match lists::counts_window(&form.pairs(false, false), SystemTime::now()) {
        Ok(w) => lists::counts(&core.pool, &w)
            .await
            .ok()
            .map(|b| (lists::totals(&b), w)),
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

fn filters(form: &Form, workflows: &[serde_json::Value]) -> Markup {
    let names: Vec<&str> = workflows
        .iter()
        .filter_map(|w| w["name"].as_str())
        .collect();
    html! {
        form.card.filters method="get" action="/console" {
            fieldset {
                @for s in RequestStatus::ALL.map(RequestStatus::as_str) {
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
            label { "Labels"
                input type="text" name="labels" value=(form.labels)
                    placeholder="tenant:acme, order:4711";
            }
            label {
                input type="checkbox" name="waitingForSlot" value="true" checked[form.waiting];
                "Waiting for a slot"
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

fn count_links(form: &Form, totals: &[(RequestStatus, i64)], w: &Window) -> Markup {
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
                a href=(form.link(&[s.as_str()], None)) { (layout::status(s.as_str())) span.n { (n) } }
            }
        }
    }
}

fn table(items: &[RequestRow]) -> Markup {
    if items.is_empty() {
        return html! { p.card.muted { "No request matches." } };
    }
    html! {
        div.scroll {
            table.requests {
                thead { tr {
                    th { "Created (UTC)" } th { "Request" } th { "Workflow" } th { "Status" }
                    th.num.hide-narrow { "Step" } th.hide-narrow { "Reason" }
                    th.hide-narrow { "Labels" }
                } }
                tbody {
                    @for it in items {
                        tr {
                            td.mono { (layout::when(&it.created_at)) }
                            td.mono { a href={ "/console/serviceRequests/" (it.id) } { (it.id) } }
                            td { a href={ "/console/workflows/" (seg(&it.workflow_name)) } { (it.workflow_name) } }
                            td { (layout::status(it.status.as_str())) }
                            td.num.hide-narrow { (it.current_step_id) }
                            td.hide-narrow { (it.reason.as_deref().unwrap_or("")) }
                            td.hide-narrow {
                                @for l in &it.labels {
                                    a.label href={ "/console?labels=" (q(l)) } { (l) } " "
                                }
                            }
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
    fn the_form_becomes_the_filters() {
        let f = Form::read(Some(
            "status=FAILED&status=PAUSED&workflow=a+b&createdAfter=2026-12-01T10:00&cursor=x\
             &labels=tenant:acme,+order:4711",
        ));
        let pairs: Vec<(String, String)> = f
            .pairs(true, true)
            .into_iter()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let want: Vec<(String, String)> = [
            ("status", "FAILED"),
            ("status", "PAUSED"),
            ("label", "tenant:acme"),
            ("label", "order:4711"),
            ("workflow", "a b"),
            ("createdAfter", "2026-12-01T10:00:00Z"),
            ("cursor", "x"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(pairs, want);
        assert_eq!(f.pairs(false, false).len(), 2);
        let filter = lists::search_filter(&f.pairs(true, false)).unwrap();
        assert_eq!(
            filter.statuses,
            vec![RequestStatus::Failed, RequestStatus::Paused]
        );
        assert_eq!(filter.labels, ["order:4711", "tenant:acme"]);
    }
}

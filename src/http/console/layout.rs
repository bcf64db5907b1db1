//! The frame every console page shares, the answer that carries it (HTML with a strict
//! Content-Security-Policy: no script runs, nothing loads from another host), and small
//! renderers the pages share. Every string users sent goes through maud's escaping: it is
//! shown as text, never read as markup.

use crate::status::{RequestStatus, StepStatus};
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE, LOCATION};
use hyper::{Response, StatusCode};
use maud::{html, Markup, DOCTYPE};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};

use super::session::Ctx;
use crate::http::response::Resp;

/// Which part of the console a page belongs to (the highlighted link).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Nav {
    Requests,
    Workflows,
    Schedules,
    Triggers,
    None,
}

/// No script, no inline style, nothing from another host, no framing, forms post here.
const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
                   frame-ancestors 'none'; base-uri 'none'";

/// A whole page.
pub fn page(ctx: &Ctx, nav: Nav, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · clamp" }
                link rel="stylesheet" href="/console/console.css";
                link rel="icon" type="image/svg+xml" href="/console/favicon.svg";
            }
            body {
                header.top {
                    a.brand href="/console" { "clamp" }
                    nav {
                        a href="/console" class=[(nav == Nav::Requests).then_some("on")] { "Requests" }
                        a href="/console/workflows" class=[(nav == Nav::Workflows).then_some("on")] { "Workflows" }
                        a href="/console/schedules" class=[(nav == Nav::Schedules).then_some("on")] { "Schedules" }
                        a href="/console/triggers" class=[(nav == Nav::Triggers).then_some("on")] { "Triggers" }
                    }
                    @if ctx.tokens_on {
                        form.signout method="post" action="/console/logout" {
                            input type="hidden" name="csrf" value=(ctx.csrf);
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// The answer for a page.
pub fn html_resp(status: StatusCode, ctx: &Ctx, markup: Markup) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(markup.into_string())));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    secure(h);
    ctx.finish(&mut r);
    r
}

/// The headers every console answer carries.
pub fn secure(h: &mut hyper::HeaderMap) {
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("same-origin"));
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

/// 303 to `to` (a path of the console, built here).
pub fn see_other(to: &str, ctx: &Ctx) -> Resp {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::SEE_OTHER;
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(LOCATION, v);
    }
    secure(r.headers_mut());
    ctx.finish(&mut r);
    r
}

/// A page that only says what went wrong.
pub fn problem(status: StatusCode, ctx: &Ctx, message: &str) -> Resp {
    let title = status.canonical_reason().unwrap_or("Error");
    html_resp(
        status,
        ctx,
        page(
            ctx,
            Nav::None,
            title,
            html! {
                h1 { (title) }
                p.flash.bad { (message) }
                p { a href="/console" { "Back to the requests" } }
            },
        ),
    )
}

/// A path segment, percent-encoded.
pub fn seg(s: &str) -> String {
    utf8_percent_encode(s, NON_ALPHANUMERIC).to_string()
}

/// A query value, form-encoded.
pub fn q(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// A status as a coloured label.
pub fn status(s: &str) -> Markup {
    html! { span class={ "badge st-" (css_status(s)) } { (s) } }
}

/// A status as a class name: the known ones, or `other` (a status is shown, never trusted).
pub fn css_status(s: &str) -> &'static str {
    RequestStatus::parse(s)
        .map(RequestStatus::as_str)
        .or_else(|| StepStatus::parse(s).map(StepStatus::as_str))
        .unwrap_or("other")
}

/// A Postgres JSON timestamp (`2026-12-01T10:00:00.123456+00:00`) as `2026-12-01 10:00:00.123`.
pub fn when(t: &str) -> String {
    let t = t.replace('T', " ");
    let (main, _zone) = match t.find('+') {
        Some(i) => t.split_at(i),
        None => (t.trim_end_matches('Z'), ""),
    };
    match main.find('.') {
        Some(i) => main[..(i + 4).min(main.len())].to_string(),
        None => main.to_string(),
    }
}

/// Milliseconds since the epoch as UTC `HH:MM:SS.mmm` of `YYYY-MM-DD`.
pub fn ms_time(ms: f64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms as i64)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S%.3f").to_string())
        .unwrap_or_default()
}

/// JSON text, indented when it parses (shown as text either way).
pub fn json_block(text: Option<&str>) -> Markup {
    let pretty = match text {
        None => "null".to_string(),
        Some(t) => serde_json::from_str::<serde_json::Value>(t)
            .ok()
            .and_then(|v| serde_json::to_string_pretty(&v).ok())
            .unwrap_or_else(|| t.to_string()),
    };
    html! { pre.json { (pretty) } }
}

/// The stylesheet, served at `/console/console.css`.
pub const CSS: &str = include_str!("console.css");

/// The icon, served at `/console/favicon.svg` (so the browser asks for no other).
pub const ICON: &str = "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 16 16\">\
<rect width=\"16\" height=\"16\" rx=\"3\" fill=\"#20293a\"/>\
<path d=\"M4 8h8M8 4v8\" stroke=\"#fff\" stroke-width=\"2\"/></svg>";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_strings_are_text() {
        let m = html! { (status("<img src=x onerror=alert(1)>")) (json_block(Some("\"<script>x</script>\""))) };
        let s = m.into_string();
        assert!(!s.contains("<img") && !s.contains("<script"), "{s}");
        assert!(s.contains("&lt;img") && s.contains("&lt;script&gt;"), "{s}");
        assert!(s.contains("st-other"));
    }

    #[test]
    fn times_read_as_utc() {
        assert_eq!(
            when("2026-12-01T10:00:00.123456+00:00"),
            "2026-12-01 10:00:00.123"
        );
        assert_eq!(when("2026-12-01T10:00:00+00:00"), "2026-12-01 10:00:00");
        assert_eq!(ms_time(0.0), "1970-01-01 00:00:00.000");
        assert_eq!(seg("a b/c"), "a%20b%2Fc");
        assert_eq!(q("a b&c"), "a+b%26c");
    }
}

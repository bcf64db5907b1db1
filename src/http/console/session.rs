//! Who may use the console, and proof that an action came from its own pages.
//!
//! With tokens set, the console asks for a token: the sign-in form checks it as the API
//! checks a bearer token (limited per client address), and sets a session cookie holding
//! a random session id (`ops::sessions`), never the token nor anything derived from it.
//! The session is kept in Postgres, so every instance accepts it; it ends after
//! `--console-session-idle-minutes` unused, `--console-session-max-hours` after sign-in,
//! at sign-out, and when its token leaves the tokens file. Every page and action needs
//! that cookie (or a bearer token), and the token's role decides which actions the pages
//! offer and accept (`ops::access`).
//!
//! Cross-site request forgery: every form carries a random value that is also in a
//! cookie only this origin can read back (double submit); an action whose form value does
//! not match the cookie, or whose `Origin` or `Sec-Fetch-Site` says another site sent it,
//! is refused. Both cookies are `SameSite=Strict` and `HttpOnly`, and `Secure` when the
//! server speaks HTTPS.

use hyper::header::{HeaderMap, HeaderValue, COOKIE, HOST, ORIGIN, SET_COOKIE};
use subtle::ConstantTimeEq;

use crate::http::response::Resp;
use crate::ops::access::{self, Op};
use crate::tokens::{Caller, Tokens};

pub const SESSION_COOKIE: &str = "clamp_console";
pub const CSRF_COOKIE: &str = "clamp_csrf";

/// What a console page knows about the browser asking.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// The value forms carry against forgery.
    pub csrf: String,
    /// The cookie has to be set on this answer (the browser had none).
    new_csrf: bool,
    /// Tokens are on (the pages offer to sign out).
    pub tokens_on: bool,
    /// Served over HTTPS: cookies are `Secure` (never sent over plain HTTP).
    pub secure: bool,
    /// Who is signed in (anyone, with tokens off): the actions offered are theirs.
    pub caller: Caller,
}

/// The attributes every console cookie has.
fn attributes(secure: bool) -> &'static str {
    if secure {
        "Path=/console; HttpOnly; SameSite=Strict; Secure"
    } else {
        "Path=/console; HttpOnly; SameSite=Strict"
    }
}

impl Ctx {
    /// Whether the signed-in caller may do `op` (the pages offer only those actions).
    pub fn may(&self, op: Op) -> bool {
        access::may(&self.caller, op)
    }

    /// Sets the cookies this answer owes the browser.
    pub fn finish(&self, resp: &mut Resp) {
        if self.new_csrf {
            let c = format!("{CSRF_COOKIE}={}; {}", self.csrf, attributes(self.secure));
            if let Ok(v) = HeaderValue::from_str(&c) {
                resp.headers_mut().append(SET_COOKIE, v);
            }
        }
    }
}

/// A cookie's value from the request.
pub fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
}

/// The `Set-Cookie` of a session (or, None, one that ends it); the browser keeps it no
/// longer than the session's absolute expiry.
pub fn session_cookie(
    session: Option<&str>,
    secure: bool,
    max: std::time::Duration,
) -> HeaderValue {
    let c = match session {
        Some(id) => format!(
            "{SESSION_COOKIE}={id}; {}; Max-Age={}",
            attributes(secure),
            max.as_secs()
        ),
        None => format!("{SESSION_COOKIE}=; {}; Max-Age=0", attributes(secure)),
    };
    HeaderValue::from_str(&c).expect("hex and ASCII")
}

/// The page context: the browser's forgery cookie, or a new one.
pub fn context(tokens: &Tokens, headers: &HeaderMap, secure: bool) -> Ctx {
    let known = cookie(headers, CSRF_COOKIE)
        .filter(|v| v.len() == 32 && v.bytes().all(|b| b.is_ascii_hexdigit()));
    Ctx {
        csrf: known.map_or_else(|| uuid::Uuid::new_v4().simple().to_string(), str::to_string),
        new_csrf: known.is_none(),
        tokens_on: tokens.is_on(),
        secure,
        caller: Caller::anonymous(),
    }
}

/// Why an action is refused as possibly forged, if it is.
pub fn forged(headers: &HeaderMap, form_csrf: Option<&str>) -> Option<&'static str> {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        if !matches!(site, "same-origin" | "none") {
            return Some("the action came from another site");
        }
    }
    if let Some(origin) = headers.get(ORIGIN).and_then(|v| v.to_str().ok()) {
        let host = headers
            .get(HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let origin_host = origin.split_once("://").map_or("", |(_, h)| h);
        if origin == "null" || !origin_host.eq_ignore_ascii_case(host) {
            return Some("the action came from another origin");
        }
    }
    let cookie = cookie(headers, CSRF_COOKIE).unwrap_or("");
    let form = form_csrf.unwrap_or("");
    if cookie.is_empty() || !bool::from(cookie.as_bytes().ct_eq(form.as_bytes())) {
        return Some("the form is stale or was not sent from the console (reload the page)");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn reads_cookies_among_others() {
        let h = headers(&[("cookie", "a=1; clamp_csrf=abc ; b=2"), ("cookie", "c=3")]);
        assert_eq!(cookie(&h, CSRF_COOKIE), Some("abc"));
        assert_eq!(cookie(&h, "c"), Some("3"));
        assert_eq!(cookie(&h, "d"), None);
    }

    #[test]
    fn actions_need_the_cookie_value_and_the_same_origin() {
        let v = "0123456789abcdef0123456789abcdef";
        let c = format!("{CSRF_COOKIE}={v}");
        let ok = headers(&[
            ("cookie", &c),
            ("host", "h:8080"),
            ("origin", "http://h:8080"),
        ]);
        assert_eq!(forged(&ok, Some(v)), None);
        assert!(forged(&ok, Some("0000")).is_some());
        assert!(forged(&ok, None).is_some());
        let other = headers(&[
            ("cookie", &c),
            ("host", "h:8080"),
            ("origin", "http://evil"),
        ]);
        assert!(forged(&other, Some(v)).is_some());
        let cross = headers(&[("cookie", &c), ("sec-fetch-site", "cross-site")]);
        assert!(forged(&cross, Some(v)).is_some());
        assert!(forged(&headers(&[]), Some("")).is_some());
    }
}

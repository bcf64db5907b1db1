//! Who may use the console, and proof that an action came from its own pages.
//!
//! With `--api-tokens` set, the console asks for a token once per browser session: the
//! login form checks it as the API checks a bearer token, and sets a session cookie (no
//! expiry: it ends with the browser session) holding a digest of the token, never the
//! token. Every page and action then needs that cookie (or a bearer token). Every
//! instance accepts it, since it depends on the token alone; rotating a token out ends
//! its sessions.
//!
//! Cross-site request forgery: every form carries a random value that is also in a
//! cookie only this origin can read back (double submit); an action whose form value does
//! not match the cookie, or whose `Origin` or `Sec-Fetch-Site` says another site sent it,
//! is refused. Both cookies are `SameSite=Strict` and `HttpOnly`, and `Secure` when the
//! server speaks HTTPS.

use hyper::header::{HeaderMap, HeaderValue, COOKIE, HOST, ORIGIN, SET_COOKIE};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::ApiTokens;
use crate::http::response::Resp;

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

/// The session cookie's value for a token: a digest, so the cookie never holds the token.
pub fn session_value(token: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(b"clamp console session\0");
    h.update(token);
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether one of the accepted tokens is `presented`, compared with all of them in
/// constant time.
pub fn token_ok(tokens: &ApiTokens, presented: &[u8]) -> bool {
    let mut ok = subtle::Choice::from(0);
    for t in tokens.iter() {
        ok |= t.ct_eq(presented);
    }
    bool::from(ok)
}

/// Whether the browser may use the console: tokens off, a session cookie of an accepted
/// token, or an accepted bearer token.
pub fn signed_in(tokens: &ApiTokens, headers: &HeaderMap) -> bool {
    if !tokens.is_on() {
        return true;
    }
    if let Some(v) = cookie(headers, SESSION_COOKIE) {
        let mut ok = subtle::Choice::from(0);
        for t in tokens.iter() {
            ok |= session_value(t).as_bytes().ct_eq(v.as_bytes());
        }
        if bool::from(ok) {
            return true;
        }
    }
    crate::http::auth::check(tokens, headers).is_ok()
}

/// The `Set-Cookie` of a session for `token` (or, None, one that ends it).
pub fn session_cookie(token: Option<&[u8]>, secure: bool) -> HeaderValue {
    let c = match token {
        Some(t) => format!(
            "{SESSION_COOKIE}={}; {}",
            session_value(t),
            attributes(secure)
        ),
        None => format!("{SESSION_COOKIE}=; {}; Max-Age=0", attributes(secure)),
    };
    HeaderValue::from_str(&c).expect("hex and ASCII")
}

/// The page context: the browser's forgery cookie, or a new one.
pub fn context(tokens: &ApiTokens, headers: &HeaderMap, secure: bool) -> Ctx {
    let known = cookie(headers, CSRF_COOKIE)
        .filter(|v| v.len() == 32 && v.bytes().all(|b| b.is_ascii_hexdigit()));
    Ctx {
        csrf: known.map_or_else(|| uuid::Uuid::new_v4().simple().to_string(), str::to_string),
        new_csrf: known.is_none(),
        tokens_on: tokens.is_on(),
        secure,
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
    fn a_session_is_a_digest_of_an_accepted_token() {
        let tokens = ApiTokens::new(&["s3cret", "other"]);
        assert!(!session_value(b"s3cret").contains("s3cret"));
        let good = format!("{SESSION_COOKIE}={}", session_value(b"other"));
        assert!(signed_in(&tokens, &headers(&[("cookie", &good)])));
        let bad = format!("{SESSION_COOKIE}={}", session_value(b"guess"));
        assert!(!signed_in(&tokens, &headers(&[("cookie", &bad)])));
        assert!(!signed_in(&tokens, &headers(&[])));
        assert!(signed_in(
            &tokens,
            &headers(&[("authorization", "Bearer s3cret")])
        ));
        assert!(signed_in(&ApiTokens::new::<&str>(&[]), &headers(&[])));
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

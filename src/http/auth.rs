//! Optional bearer tokens. When `--api-tokens` names any, every route but `/health`,
//! `/ready` (and `/metrics` if made open) needs `Authorization: Bearer <one of them>`.
//! Several tokens are accepted at once so they can be rotated; each is compared in
//! constant time, and every one is compared, so timing tells nothing about which matched.
//! A token is never logged, never stored, and never forwarded to steps (unless the
//! operator forwards `Authorization` on purpose).

use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, WWW_AUTHENTICATE};
use hyper::StatusCode;
use subtle::ConstantTimeEq;

use super::response::{error, Resp};
use crate::config::ApiTokens;

/// Ok when authentication is off or the request carries an accepted bearer token; else
/// the 401 to answer.
pub fn check(tokens: &ApiTokens, headers: &HeaderMap) -> Result<(), Resp> {
    if !tokens.is_on() {
        return Ok(());
    }
    let presented = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
    let Some(token) = presented else {
        return Err(unauthorized(
            "a bearer token is required (Authorization: Bearer <token>)",
            r#"Bearer realm="clamp""#,
        ));
    };
    let mut ok = subtle::Choice::from(0);
    for t in tokens.iter() {
        ok |= t.ct_eq(token.as_bytes());
    }
    if bool::from(ok) {
        Ok(())
    } else {
        Err(unauthorized(
            "the bearer token is not valid",
            r#"Bearer realm="clamp", error="invalid_token""#,
        ))
    }
}

fn unauthorized(message: &str, challenge: &'static str) -> Resp {
    let mut r = error(StatusCode::UNAUTHORIZED, message);
    r.headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(auth: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, auth.parse().unwrap());
        h
    }

    #[test]
    fn accepts_any_configured_token_and_nothing_else() {
        let t = ApiTokens::new(&["first-token-0123456789", "second-token-0123456789"]);
        assert!(check(&t, &with("Bearer first-token-0123456789")).is_ok());
        assert!(check(&t, &with("bearer second-token-0123456789")).is_ok());
        for bad in [
            "Bearer first-token-012345678",
            "Basic Zmlyc3Q=",
            "Bearer",
            "first-token-0123456789",
        ] {
            let r = check(&t, &with(bad)).unwrap_err();
            assert_eq!(r.status(), 401, "{bad}");
            assert!(r.headers().contains_key(WWW_AUTHENTICATE));
        }
        assert_eq!(check(&t, &HeaderMap::new()).unwrap_err().status(), 401);
        assert!(check(&ApiTokens::default(), &HeaderMap::new()).is_ok());
        assert_eq!(format!("{t:?}"), "Tokens(2 configured)");
    }
}

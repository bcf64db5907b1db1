//! Optional bearer tokens (`tokens`). When any are set, every route but `/health`,
//! `/ready` (and `/metrics` if made open) needs `Authorization: Bearer <one of them>`,
//! and what it may do is its role's (`ops::access`). A token is never logged, never
//! stored, and never forwarded to steps (unless the operator forwards `Authorization`
//! on purpose).

use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, WWW_AUTHENTICATE};
use hyper::StatusCode;

use super::response::{error, Resp};
use crate::tokens::{Caller, Tokens};

/// The bearer token a request presents, if any.
pub fn presented(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
}

/// Who the request comes from: anyone when authentication is off, else the holder of
/// the accepted bearer token it carries; else the 401 to answer.
pub fn caller(tokens: &Tokens, headers: &HeaderMap) -> Result<Caller, Resp> {
    if !tokens.is_on() {
        return Ok(Caller::anonymous());
    }
    let Some(token) = presented(headers) else {
        return Err(unauthorized(
            "a bearer token is required (Authorization: Bearer <token>)",
            r#"Bearer realm="clamp""#,
        ));
    };
    match tokens.find(token.as_bytes()) {
        Some(c) => Ok(c.clone()),
        None => Err(unauthorized(
            "the bearer token is not valid",
            r#"Bearer realm="clamp", error="invalid_token""#,
        )),
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
    use crate::tokens::Role;

    fn with(auth: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, auth.parse().unwrap());
        h
    }

    #[test]
    fn accepts_any_configured_token_and_nothing_else() {
        let t = Tokens::from_list(&["first-token-0123456789", "second-token-0123456789"]);
        let c = caller(&t, &with("Bearer first-token-0123456789")).unwrap();
        assert_eq!((&*c.name, c.role), ("token-1", Role::Admin));
        let c = caller(&t, &with("bearer second-token-0123456789")).unwrap();
        assert_eq!(&*c.name, "token-2");
        for bad in [
            "Bearer first-token-012345678",
            "Basic Zmlyc3Q=",
            "Bearer",
            "first-token-0123456789",
        ] {
            let r = caller(&t, &with(bad)).unwrap_err();
            assert_eq!(r.status(), 401, "{bad}");
            assert!(r.headers().contains_key(WWW_AUTHENTICATE));
        }
        assert_eq!(caller(&t, &HeaderMap::new()).unwrap_err().status(), 401);
        assert_eq!(
            caller(&Tokens::default(), &HeaderMap::new()).unwrap(),
            Caller::anonymous()
        );
    }
}

//! Notifications (beyond Clamp): a workflow may say where its requests' outcomes go,
//! `"notify": [{"on": ["FAILED", "COMPLETED", "CANCELLED"], "http": {"url", "headers",
//! "timeout_ms", "secret"}}]`. The `http` target is an HTTP step's `val` (POST), checked
//! as one is; `secret` (a `{{secret:NAME}}` reference) signs each notification's body
//! (HMAC-SHA256, `X-Clamp-Signature-256: sha256=<hex>`).

use serde_json::Value;

use super::model::{HttpVal, NotifyTarget as Target};
use super::ValidationError;
use crate::status::RequestStatus;

/// The statuses a notification may be for, and their bits in a request's `notify`.
const FINAL: [(RequestStatus, i16); 3] = [
    (RequestStatus::Completed, 1),
    (RequestStatus::Failed, 2),
    (RequestStatus::Cancelled, 4),
];

/// Most targets one workflow has.
const MAX_TARGETS: usize = 8;

impl Target {
    /// Whether it is told of `status`.
    pub fn wants(&self, status: RequestStatus) -> bool {
        bit(status).is_some_and(|b| self.on & b != 0)
    }
}

/// The bit of a final status.
pub fn bit(status: RequestStatus) -> Option<i16> {
    FINAL.iter().find(|(s, _)| *s == status).map(|(_, b)| *b)
}

/// The statuses any target is told of (None: no target).
pub fn mask(targets: &[Target]) -> Option<i16> {
    let m = targets.iter().fold(0, |m, t| m | t.on);
    (m != 0).then_some(m)
}

fn err<T>(msg: String) -> Result<T, ValidationError> {
    Err(ValidationError(msg))
}

/// Checks a definition's `notify`; `http_val` reads a target's `http` as an HTTP step's
/// `val` is read.
pub fn compile(
    list: &[Value],
    http_val: impl Fn(&Value, &str) -> Result<HttpVal, ValidationError>,
) -> Result<Vec<Target>, ValidationError> {
    if list.len() > MAX_TARGETS {
        return err(format!("notify: at most {MAX_TARGETS} targets"));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = format!("notify[{i}]");
        let Some(obj) = t.as_object() else {
            return err(format!("{at}: an object with on and http"));
        };
        if let Some(k) = obj.keys().find(|k| !matches!(k.as_str(), "on" | "http")) {
            return err(format!("{at}.{k}: unknown field (on, http)"));
        }
        let mut on = 0;
        for s in obj
            .get("on")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let b = s
                .as_str()
                .and_then(|s| RequestStatus::ALL.into_iter().find(|k| k.as_str() == s))
                .and_then(bit)
                .ok_or_else(|| {
                    ValidationError(format!(
                        "{at}.on: {s} is not COMPLETED, FAILED or CANCELLED"
                    ))
                })?;
            on |= b;
        }
        if on == 0 {
            return err(format!(
                "{at}.on: one or more of COMPLETED, FAILED and CANCELLED"
            ));
        }
        let Some(Value::Object(h)) = obj.get("http") else {
            return err(format!(
                "{at}.http: an object with url (and headers, timeout_ms, secret)"
            ));
        };
        if let Some(k) = h
            .keys()
            .find(|k| !matches!(k.as_str(), "url" | "headers" | "timeout_ms" | "secret"))
        {
            return err(format!(
                "{at}.http.{k}: unknown field (url, headers, timeout_ms, secret)"
            ));
        }
        let mut val = Value::Object(h.clone());
        val["method"] = Value::String("POST".into());
        let http = http_val(&val, &format!("{at}.http")).map_err(|e| {
            ValidationError(e.0.replace(&format!("{at}.http.val."), &format!("{at}.http.")))
        })?;
        let secret = match h.get("secret") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => match crate::secrets::names(s) {
                Ok(n) if n.len() == 1 && s.trim() == format!("{{{{secret:{}}}}}", n[0]) => {
                    Some(s.trim().to_string())
                }
                _ => {
                    return err(format!(
                        "{at}.http.secret: one {{{{secret:NAME}}}} reference"
                    ))
                }
            },
            Some(_) => {
                return err(format!(
                    "{at}.http.secret: one {{{{secret:NAME}}}} reference"
                ))
            }
        };
        out.push(Target { on, http, secret });
    }
    Ok(out)
}

//! The console's actions: retry, rerun and cancel, posted by its forms. Each is checked
//! against forgery (`session::forged`), then done by the API's own code (the handlers of
//! `POST /serviceRequest/{id}/retry`, `/rerun` and `/cancel` past their body parsing),
//! and answered with a redirect to the request's page (a rerun: the new request's) that
//! says what happened.

use http_body_util::BodyExt;
use hyper::http::request::Parts;
use hyper::StatusCode;
use uuid::Uuid;

use super::layout::{self, q};
use super::session::{self, Ctx};
use crate::http::body::Body;
use crate::http::rerun::Ask;
use crate::http::response::Resp;
use crate::state::Core;

/// A posted form's fields, once it is known to come from the console's own page (the
/// answer to give otherwise).
pub async fn checked_form(
    core: &Core,
    ctx: &Ctx,
    parts: &Parts,
    body: &mut Body,
) -> Result<Vec<(String, String)>, Resp> {
    let Ok(body) = body.read_request(parts, &core.app.config).await else {
        return Err(layout::problem(
            StatusCode::BAD_REQUEST,
            ctx,
            "the form could not be read",
        ));
    };
    let form = fields(&body);
    if let Some(why) = session::forged(&parts.headers, field(&form, "csrf")) {
        return Err(layout::problem(StatusCode::FORBIDDEN, ctx, why));
    }
    Ok(form)
}

/// The fields of a posted form.
pub fn fields(body: &[u8]) -> Vec<(String, String)> {
    form_urlencoded::parse(body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

pub fn field<'f>(fields: &'f [(String, String)], key: &str) -> Option<&'f str> {
    fields
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// A JSON field of a form: None when blank; the error says it is not JSON.
fn json_field(fields: &[(String, String)], key: &str) -> Result<Option<String>, String> {
    match field(fields, key).map(str::trim) {
        None | Some("") => Ok(None),
        Some(t) => serde_json::from_str::<serde_json::Value>(t)
            .map(|v| Some(v.to_string()))
            .map_err(|e| format!("the {key} is not JSON: {e}")),
    }
}

pub async fn post(
    core: &Core,
    ctx: &Ctx,
    id: &str,
    action: &str,
    parts: &Parts,
    body: &mut Body,
) -> Resp {
    let Ok(id) = Uuid::parse_str(id) else {
        return layout::problem(
            StatusCode::BAD_REQUEST,
            ctx,
            "the service request id is not a valid UUID",
        );
    };
    let form = match checked_form(core, ctx, parts, body).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    let back = format!("/console/serviceRequests/{id}");
    let resp = match action {
        "retry" => match json_field(&form, "payload") {
            Ok(p) => crate::http::retry::retry_with(core, id, p.as_deref()).await,
            Err(why) => return failed(&back, &why, ctx),
        },
        "rerun" => {
            let from_step = match field(&form, "fromStep").map(str::trim) {
                None | Some("") => None,
                Some(s) => match s.parse::<u32>() {
                    Ok(n) if n > 0 => Some(n),
                    _ => return failed(&back, "the step to rerun from is not a step id", ctx),
                },
            };
            match json_field(&form, "payload") {
                Ok(payload) => {
                    crate::http::rerun::rerun_with(core, id, Ask { from_step, payload }).await
                }
                Err(why) => return failed(&back, &why, ctx),
            }
        }
        "cancel" => {
            let reason = field(&form, "reason")
                .map(str::trim)
                .filter(|r| !r.is_empty())
                .map(|r| r.chars().take(1024).collect::<String>());
            crate::http::service_requests::cancel_with(core, id, reason).await
        }
        _ => return layout::problem(StatusCode::NOT_FOUND, ctx, "no such action"),
    };
    let (ok, answer) = answer(resp).await;
    if !ok {
        let why = answer["message"].as_str().unwrap_or("the action failed");
        return failed(&back, why, ctx);
    }
    match action {
        "retry" => {
            let n = answer["retries"].as_i64().unwrap_or(0);
            layout::see_other(
                &format!(
                    "{back}?done={}",
                    q(&format!(
                        "Retried (retry {n}): it runs again from the step that failed."
                    ))
                ),
                ctx,
            )
        }
        "rerun" => {
            let new = answer["serviceRequestId"].as_str().unwrap_or("");
            layout::see_other(
                &format!(
                    "/console/serviceRequests/{}?done={}",
                    seg_uuid(new),
                    q(&format!("Rerun of {id} created."))
                ),
                ctx,
            )
        }
        _ => layout::see_other(&format!("{back}?done={}", q("Cancelled.")), ctx),
    }
}

/// Whether an API handler's answer is a success, and its JSON body.
pub async fn answer(resp: Resp) -> (bool, serde_json::Value) {
    let ok = resp.status().is_success();
    let body = match resp.into_body().collect().await {
        Ok(b) => serde_json::from_slice(&b.to_bytes()).unwrap_or_default(),
        Err(never) => match never {},
    };
    (ok, body)
}

/// An id from the API's answer, kept to the characters of a UUID.
fn seg_uuid(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_hexdigit() || *c == '-')
        .collect()
}

fn failed(back: &str, why: &str, ctx: &Ctx) -> Resp {
    layout::see_other(&format!("{back}?failed={}", q(why)), ctx)
}

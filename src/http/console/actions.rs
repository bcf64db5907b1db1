//! The console's actions: retry, rerun, cancel and delivering the event a request waits
//! for, posted by its forms. Each is checked
//! against forgery (`session::forged`), then done by its operation (`ops::control`), and
//! answered with a redirect to the request's page (a rerun: the new request's) carrying
//! the code of what happened; an action that failed answers that page at once with its
//! reason.

use hyper::http::request::Parts;
use hyper::StatusCode;
use uuid::Uuid;

use super::layout;
use super::request::{self, Done, Flash};
use super::session::{self, Ctx};
use crate::http::body::Body;
use crate::http::response::Resp;
use crate::ops::control::{self, RerunAsk};
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

/// The operation a request action is (None: no such action), for the role it needs.
pub fn op(action: &str) -> Option<crate::ops::access::Op> {
    use crate::ops::access::Op;
    match action {
        "retry" => Some(Op::Retry),
        "rerun" => Some(Op::Rerun),
        "cancel" => Some(Op::Cancel),
        "event" => Some(Op::DeliverEvent),
        _ => None,
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
    let form = or_answer!(checked_form(core, ctx, parts, body).await);
    let back = format!("/console/serviceRequests/{id}");
    let failed =
        |why: String, status| request::render(core, ctx, id, Some(Flash::Failed(why)), status);
    let done = match action {
        "retry" => match json_field(&form, "payload") {
            Ok(p) => control::retry(core, &ctx.caller, id, p.as_deref())
                .await
                .map(|_| (back.clone(), Done::Retried)),
            Err(why) => return failed(why, StatusCode::BAD_REQUEST).await,
        },
        "rerun" => {
            let from_step = match field(&form, "fromStep").map(str::trim) {
                None | Some("") => None,
                Some(s) => match s.parse::<u32>() {
                    Ok(n) if n > 0 => Some(n),
                    _ => {
                        return failed(
                            "the step to rerun from is not a step id".into(),
                            StatusCode::BAD_REQUEST,
                        )
                        .await
                    }
                },
            };
            match json_field(&form, "payload") {
                Ok(payload) => {
                    control::rerun(core, &ctx.caller, id, RerunAsk { from_step, payload })
                        .await
                        .map(|new| (format!("/console/serviceRequests/{new}"), Done::Rerun))
                }
                Err(why) => return failed(why, StatusCode::BAD_REQUEST).await,
            }
        }
        "cancel" => {
            let reason = field(&form, "reason")
                .map(str::trim)
                .filter(|r| !r.is_empty())
                .map(str::to_string);
            control::cancel(core, &ctx.caller, id, reason)
                .await
                .map(|_| (back.clone(), Done::Cancelled))
        }
        "event" => {
            let payload = match json_field(&form, "payload") {
                Ok(p) => p.unwrap_or_else(|| "null".into()),
                Err(why) => return failed(why, StatusCode::BAD_REQUEST).await,
            };
            // The event and key this request waits for, as its page showed them.
            let waiting = match crate::ops::read::details(core, id).await {
                Ok(d) => d.found.head.wait_event.zip(d.found.head.wait_key),
                Err(e) => return failed(e.message(), crate::http::response::status_of(&e)).await,
            };
            let Some((event, key)) = waiting else {
                return failed(
                    "this request does not wait for an event".into(),
                    StatusCode::CONFLICT,
                )
                .await;
            };
            let e = crate::ops::events::Event {
                event: &event,
                key: &key,
                id: None,
                payload: &payload,
                traceparent: None,
                keep_for: None,
            };
            crate::ops::events::deliver(core, &e)
                .await
                .map(|_| (back.clone(), Done::Delivered))
        }
        _ => return layout::problem(StatusCode::NOT_FOUND, ctx, "no such action"),
    };
    match done {
        Ok((to, done)) => layout::see_other(&format!("{to}?done={}", done.code()), ctx),
        Err(e) => {
            let status = crate::http::response::status_of(&e);
            failed(e.message(), status).await
        }
    }
}

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
use crate::ops::OpError;
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

/// A request's action, posted by its form: done by its operation, then back to the
/// request's page (a rerun: the new request's) with the code of what was done, or that
/// page at once with why it was not.
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
    let on = On { core, ctx, id };
    let done = match action {
        "retry" => on.retry(&form).await,
        "rerun" => on.rerun(&form).await,
        "cancel" => on.cancel(&form).await,
        "event" => on.event(&form).await,
        _ => return layout::problem(StatusCode::NOT_FOUND, ctx, "no such action"),
    };
    let (why, status) = match done {
        Ok((to, done)) => return layout::see_other(&format!("{to}?done={}", done.code()), ctx),
        Err(NotDone::Form(why)) => (why, StatusCode::BAD_REQUEST),
        Err(NotDone::Conflict(why)) => (why.to_string(), StatusCode::CONFLICT),
        Err(NotDone::Op(e)) => (e.message(), crate::http::response::status_of(&e)),
    };
    request::render(core, ctx, id, Some(Flash::Failed(why)), status).await
}

/// Why an action was not done.
enum NotDone {
    /// Its form is not one it can take (400).
    Form(String),
    /// The request is not in a state the action applies to (409).
    Conflict(&'static str),
    /// Its operation refused it or failed.
    Op(OpError),
}

impl From<OpError> for NotDone {
    fn from(e: OpError) -> NotDone {
        NotDone::Op(e)
    }
}

/// Where the console sends the browser once an action is done, and the code it shows.
type Taken = Result<(String, Done), NotDone>;

/// The request an action is taken on.
struct On<'a> {
    core: &'a Core,
    ctx: &'a Ctx,
    id: Uuid,
}

impl On<'_> {
    fn back(&self) -> String {
        format!("/console/serviceRequests/{}", self.id)
    }

    async fn retry(&self, form: &[(String, String)]) -> Taken {
        let payload = json_field(form, "payload").map_err(NotDone::Form)?;
        control::retry(self.core, &self.ctx.caller, self.id, payload.as_deref()).await?;
        Ok((self.back(), Done::Retried))
    }

    async fn rerun(&self, form: &[(String, String)]) -> Taken {
        let from_step = match field(form, "fromStep").map(str::trim) {
            None | Some("") => None,
            Some(s) => match s.parse::<u32>() {
                Ok(n) if n > 0 => Some(n),
                _ => {
                    return Err(NotDone::Form(
                        "the step to rerun from is not a step id".into(),
                    ))
                }
            },
        };
        let payload = json_field(form, "payload").map_err(NotDone::Form)?;
        let ask = RerunAsk { from_step, payload };
        let new = control::rerun(self.core, &self.ctx.caller, self.id, ask).await?;
        Ok((format!("/console/serviceRequests/{new}"), Done::Rerun))
    }

    async fn cancel(&self, form: &[(String, String)]) -> Taken {
        let reason = field(form, "reason")
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .map(str::to_string);
        // Left out (a workflow without compensations): the workflow decides.
        let compensate = field(form, "compensate").map(|c| c == "true");
        control::cancel(self.core, &self.ctx.caller, self.id, reason, compensate).await?;
        Ok((self.back(), Done::Cancelled))
    }

    /// The event this request waits for (its name and key, as its page showed them),
    /// delivered with the form's payload.
    async fn event(&self, form: &[(String, String)]) -> Taken {
        let payload = json_field(form, "payload")
            .map_err(NotDone::Form)?
            .unwrap_or_else(|| "null".into());
        let d = crate::ops::read::details(self.core, self.id).await?;
        let Some((event, key)) = d.found.head.wait_event.zip(d.found.head.wait_key) else {
            return Err(NotDone::Conflict("this request does not wait for an event"));
        };
        let e = crate::ops::events::Event {
            event: &event,
            key: &key,
            id: None,
            payload: &payload,
            traceparent: None,
            keep_for: None,
        };
        crate::ops::events::deliver(self.core, &e).await?;
        Ok((self.back(), Done::Delivered))
    }
}

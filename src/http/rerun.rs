//! `POST /serviceRequest/{id}/rerun` (beyond Clamp), optional body `{"fromStep": <step
//! id>, "payload": <JSON>}`: a new request of the same workflow (answered like a create)
//! whose steps before `fromStep` are the original's outcomes, copied and not called, and
//! which runs from `fromStep` with the request that step received in the original (the
//! answer of the step before it, or the payload for the first step), or `payload`. No
//! `fromStep`: from the first step. The new request names its origin (`rerunOf`); the
//! original's reruns are `GET /serviceRequests?rerunOf=<id>`.

use hyper::http::request::Parts;
use hyper::StatusCode;
use serde::Deserialize;

use super::answers;
use super::body::Body as RequestBody;
use super::input;
use super::response::{json, op_error, Resp};
use crate::ops::control::RerunAsk as Ask;
use crate::ops::OpError;
use crate::state::Core;
use crate::status::RequestStatus;
use crate::tokens::Caller;

pub async fn rerun(
    core: &Core,
    who: &Caller,
    id: &str,
    parts: &Parts,
    body: &mut RequestBody,
) -> Resp {
    let of = or_answer!(super::service_requests::request_id(id));
    let app = &core.app;
    let body = or_answer!(body.read_request(parts, &app.config).await);
    let ask = match parse(&body) {
        Ok(a) => a,
        Err(e) => return op_error(e),
    };
    match crate::ops::control::rerun(core, who, of, ask).await {
        Ok(id) => json(
            StatusCode::OK,
            &answers::created_with(
                &id,
                RequestStatus::New.as_str(),
                &[("rerunOf", of.to_string().into())],
            ),
        ),
        Err(e) => op_error(e),
    }
}

/// The body: `{"fromStep": <step id>, "payload": <JSON>}`, each optional.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Body {
    from_step: Option<u32>,
    #[serde(default, deserialize_with = "input::present")]
    payload: Option<String>,
}

fn parse(body: &[u8]) -> Result<Ask, OpError> {
    const SHAPE: &str =
        "the body must be empty or a JSON object like {\"fromStep\": 2, \"payload\": {…}}";
    let b: Body = input::typed(body, SHAPE)?;
    if b.from_step == Some(0) {
        return Err(OpError::BadRequest(
            "fromStep: must be a step id (a whole number from 1)".into(),
        ));
    }
    Ok(Ask {
        from_step: b.from_step,
        payload: b.payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(from_step: Option<u32>, payload: Option<&str>) -> Ask {
        Ask {
            from_step,
            payload: payload.map(str::to_string),
        }
    }

    #[test]
    fn the_body_names_a_step_and_a_payload_or_nothing() {
        assert_eq!(parse(b" ").unwrap(), ask(None, None));
        assert_eq!(
            parse(br#"{"fromStep": 2, "payload": {"a": 1}}"#).unwrap(),
            ask(Some(2), Some(r#"{"a":1}"#))
        );
        for (bad, starts) in [
            (&br#"{"fromStep": 0}"#[..], "fromStep:"),
            (br#"{"fromStep": "2"}"#, "fromStep:"),
            (br#"{"fromStep": 1.5}"#, "fromStep:"),
            (br#"{"step": 1}"#, "step:"),
            (b"[1]", "the body"),
        ] {
            let why = parse(bad).unwrap_err().message();
            assert!(why.starts_with(starts), "{why}");
        }
    }
}

//! `POST /serviceRequest/{id}/rerun` (beyond Clamp), optional body `{"fromStep": <step
//! id>, "payload": <JSON>}`: a new request of the same workflow (answered like a create)
//! whose steps before `fromStep` are the original's outcomes, copied and not called, and
//! which runs from `fromStep` with the request that step received in the original (the
//! answer of the step before it, or the payload for the first step), or `payload`. No
//! `fromStep`: from the first step. The new request names its origin (`rerunOf`); the
//! original's reruns are `GET /serviceRequests?rerunOf=<id>`.

use hyper::http::request::Parts;
use hyper::StatusCode;
use serde_json::Value;

use super::answers;
use super::body::Body;
use super::response::{error, json, op_error, Resp};
use crate::ops::control::RerunAsk as Ask;
use crate::state::Core;
use crate::status::RequestStatus;
use crate::tokens::Caller;

pub async fn rerun(core: &Core, who: &Caller, id: &str, parts: &Parts, body: &mut Body) -> Resp {
    let of = or_answer!(super::service_requests::request_id(id));
    let app = &core.app;
    let body = or_answer!(body.read_request(parts, &app.config).await);
    let ask = match parse(&body) {
        Ok(a) => a,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
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

fn parse(body: &[u8]) -> Result<Ask, String> {
    const SHAPE: &str =
        "the body must be empty or a JSON object like {\"fromStep\": 2, \"payload\": {…}}";
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Ask {
            from_step: None,
            payload: None,
        });
    }
    let Ok(Value::Object(mut o)) = serde_json::from_slice::<Value>(body) else {
        return Err(SHAPE.into());
    };
    let from_step = match o.remove("fromStep") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=u32::MAX as u64).contains(&n) => Some(n as u32),
            _ => return Err("fromStep: must be a step id (a whole number from 1)".into()),
        },
    };
    let payload = o.remove("payload").map(|p| p.to_string());
    if let Some(k) = o.keys().next() {
        return Err(format!(
            "{k}: unknown field (the fields are fromStep and payload)"
        ));
    }
    Ok(Ask { from_step, payload })
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
            let why = parse(bad).unwrap_err();
            assert!(why.starts_with(starts), "{why}");
        }
    }
}

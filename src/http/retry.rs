//! `POST /serviceRequest/{id}/retry` (beyond Clamp): a FAILED or CANCELLED request goes on
//! as the same request from the step that failed (`store::retry`), optionally with a new
//! request for that step: `{"payload": <JSON>}`.

use hyper::http::request::Parts;
use hyper::StatusCode;

use super::body::Body;
use super::response::{error, json, store_error, Resp};
use crate::state::Core;
use crate::store::retry::{self, Retried};

pub async fn retry(core: &Core, id: &str, parts: &Parts, body: &mut Body) -> Resp {
    let Ok(id) = uuid::Uuid::parse_str(id) else {
        return error(
            StatusCode::BAD_REQUEST,
            "the service request id is not a valid UUID",
        );
    };
    let app = &core.app;
    let body = match body
        .read(
            &parts.headers,
            app.config.body_limit,
            app.config.header_timeout,
        )
        .await
    {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let payload = match new_request(&body) {
        Ok(p) => p,
        Err(why) => return error(StatusCode::BAD_REQUEST, why),
    };
    let conn = match core.pool.get().await {
        Ok(c) => c,
        Err(e) => return store_error(e.into(), "retry service request"),
    };
    match retry::retry(&conn, id, payload.as_deref()).await {
        Ok(Retried::Now { retries }) => {
            app.changes.notify(&id);
            // Any instance's sweeper claims it; this one looks at once.
            core.executor.wake();
            json(
                StatusCode::OK,
                &serde_json::json!({
                    "pollUrl": format!("/serviceRequest/{id}"),
                    "status": "NEW",
                    "serviceRequestId": id.to_string(),
                    "retries": retries,
                }),
            )
        }
        Ok(Retried::NotRetryable { status }) => error(
            StatusCode::CONFLICT,
            &format!("the service request is {status}: only a FAILED or CANCELLED one is retried"),
        ),
        Ok(Retried::NoFailedStep) => error(
            StatusCode::CONFLICT,
            "the service request failed outside its steps after some had run: where to go on is not known",
        ),
        Ok(Retried::Unknown) => error(StatusCode::NOT_FOUND, "no service request with this id"),
        Err(e) => store_error(e, "retry service request"),
    }
}

/// The step's new request, as JSON text: none for an empty body or one without `payload`.
fn new_request(body: &[u8]) -> Result<Option<String>, &'static str> {
    const SHAPE: &str = "the body must be empty or a JSON object like {\"payload\": {…}}";
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let serde_json::Value::Object(mut o) =
        serde_json::from_slice::<serde_json::Value>(body).map_err(|_| SHAPE)?
    else {
        return Err(SHAPE);
    };
    let payload = o.remove("payload");
    if !o.is_empty() {
        return Err(SHAPE);
    }
    Ok(payload.map(|p| p.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_is_empty_or_names_a_payload() {
        assert_eq!(new_request(b""), Ok(None));
        assert_eq!(new_request(b" {} "), Ok(None));
        assert_eq!(
            new_request(br#"{"payload": {"a": [1]}}"#),
            Ok(Some(r#"{"a":[1]}"#.into()))
        );
        assert_eq!(
            new_request(br#"{"payload": null}"#),
            Ok(Some("null".into()))
        );
        for bad in [&b"[1]"[..], b"{\"payload\": 1, \"x\": 2}", b"{", b"\"p\""] {
            assert!(new_request(bad).is_err());
        }
    }
}

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

use super::body::Body;
use super::response::{error, json, store_error, Resp};
use crate::state::Core;
use crate::store::rerun::{self, Rerun};

/// What the body asks for.
#[derive(Debug, PartialEq)]
pub(crate) struct Ask {
    pub from_step: Option<u32>,
    /// JSON text.
    pub payload: Option<String>,
}

pub async fn rerun(core: &Core, id: &str, parts: &Parts, body: &mut Body) -> Resp {
    let of = match super::service_requests::request_id(id) {
        Ok(id) => id,
        Err(resp) => return resp,
    };
    let app = &core.app;
    let body = match body.read_request(parts, &app.config).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let ask = match parse(&body) {
        Ok(a) => a,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    rerun_with(core, of, ask).await
}

/// Reruns `of` as `ask` says (the console's rerun too).
pub(crate) async fn rerun_with(core: &Core, of: uuid::Uuid, ask: Ask) -> Resp {
    let conn = match core.pool.get().await {
        Ok(c) => c,
        Err(e) => return store_error(e.into(), "rerun service request"),
    };
    let src = match rerun::source(&conn, of).await {
        Ok(Some(s)) => s,
        Ok(None) => return error(StatusCode::NOT_FOUND, "no service request with this id"),
        Err(e) => return store_error(e, "rerun service request"),
    };
    drop(conn);
    let wf = match core
        .app
        .workflows
        .get_or_load_version(&core.pool, &src.workflow_name, src.workflow_version)
        .await
    {
        Ok(Some(wf)) => wf,
        Ok(None) | Err(crate::store::workflow_map::LoadError::Invalid { .. }) => {
            return error(
                StatusCode::CONFLICT,
                &format!(
                    "workflow {} version {} is not known any more",
                    src.workflow_name, src.workflow_version
                ),
            )
        }
        Err(crate::store::workflow_map::LoadError::Store(e)) => {
            return store_error(e, "rerun service request")
        }
    };
    let plan = match plan(&wf.main, &src, ask) {
        Ok(p) => p,
        Err((status, why)) => return error(status, &why),
    };
    let id = crate::ids::new_v7();
    let run = Rerun {
        id,
        of,
        workflow_name: &src.workflow_name,
        workflow_version: src.workflow_version,
        payload: plan.payload.as_deref().unwrap_or(&src.payload),
        headers: &src.headers,
        from_step: plan.from_step,
        step_request: &plan.step_request,
        copied: plan.copied,
    };
    let conn = match core.pool.get().await {
        Ok(c) => c,
        Err(e) => return store_error(e.into(), "rerun service request"),
    };
    if let Err(e) = rerun::insert(&conn, &run).await {
        return store_error(e, "rerun service request");
    }
    drop(conn);
    core.executor.wake();
    json(
        StatusCode::OK,
        &serde_json::json!({
            "pollUrl": format!("/serviceRequest/{id}"),
            "status": "NEW",
            "serviceRequestId": id.to_string(),
            "rerunOf": of.to_string(),
        }),
    )
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

/// How the rerun starts.
#[derive(Debug, PartialEq)]
struct Plan {
    from_step: u32,
    step_request: String,
    /// The new request's payload when it is not the original's (a new one, from the first step).
    payload: Option<String>,
    copied: Vec<i64>,
}

/// Where the rerun starts, what that step receives, and which records it copies: every
/// step of the main sequence before `fromStep` must have COMPLETED (or been SKIPPED) in
/// the original, since its outcome is what the rerun takes instead of calling it.
fn plan(main: &[u32], src: &rerun::Source, ask: Ask) -> Result<Plan, (StatusCode, String)> {
    let Some(&first) = main.first() else {
        return Err((StatusCode::CONFLICT, "the workflow has no steps".into()));
    };
    let from = ask.from_step.unwrap_or(first);
    let Some(pos) = main.iter().position(|&s| s == from) else {
        let ids: Vec<String> = main.iter().map(u32::to_string).collect();
        return Err((
            StatusCode::BAD_REQUEST,
            format!(
                "fromStep: {from} is not a step of workflow {}'s sequence (its steps are {})",
                src.workflow_name,
                ids.join(", ")
            ),
        ));
    };
    let mut copied = Vec::with_capacity(pos);
    let mut passed_on = None;
    for &step in &main[..pos] {
        let rec = src.last.iter().find(|r| r.step_id == step);
        match rec {
            Some(r) if r.status == "COMPLETED" || r.status == "SKIPPED" => {
                copied.push(r.record_id);
                passed_on = r.response.clone();
            }
            other => {
                let what = other.map_or("never ran", |r| match r.status.as_str() {
                    "FAILED" => "failed",
                    _ => "has not finished",
                });
                return Err((
                    StatusCode::CONFLICT,
                    format!(
                        "step {step} {what} in the original: rerun from step {step} or an earlier one"
                    ),
                ));
            }
        }
    }
    // In the order they ran (ids grow with each record).
    copied.sort_unstable();
    let (step_request, payload) = match (ask.payload, pos) {
        (Some(p), 0) => (p.clone(), Some(p)),
        (Some(p), _) => (p, None),
        (None, 0) => (src.payload.clone(), None),
        (None, _) => (passed_on.unwrap_or_else(|| "null".into()), None),
    };
    Ok(Plan {
        from_step: from,
        step_request,
        payload,
        copied,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::rerun::{Record, Source};

    fn src(records: &[(i64, u32, &str, &str)]) -> Source {
        Source {
            workflow_name: "w".into(),
            workflow_version: 1,
            payload: r#"{"p":1}"#.into(),
            headers: "[]".into(),
            last: records
                .iter()
                .map(|&(record_id, step_id, status, response)| Record {
                    record_id,
                    step_id,
                    status: status.into(),
                    response: Some(response.into()),
                })
                .collect(),
        }
    }

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

    #[test]
    fn a_rerun_takes_the_outcomes_before_its_step_and_the_answer_of_the_last() {
        let s = src(&[
            (10, 1, "COMPLETED", "r1"),
            (12, 2, "SKIPPED", "r2"),
            (13, 3, "FAILED", "e"),
        ]);
        let p = plan(&[1, 2, 3], &s, ask(Some(3), None)).unwrap();
        assert_eq!((p.from_step, p.step_request.as_str()), (3, "r2"));
        assert_eq!((p.copied, p.payload), (vec![10, 12], None));
        let p = plan(&[1, 2, 3], &s, ask(None, None)).unwrap();
        assert_eq!((p.from_step, p.step_request.as_str()), (1, r#"{"p":1}"#));
        assert!(p.copied.is_empty());
        // A new payload from the first step is the new request's payload too.
        let p = plan(&[1, 2, 3], &s, ask(None, Some("7"))).unwrap();
        assert_eq!(
            (p.step_request.as_str(), p.payload),
            ("7", Some("7".into()))
        );
        let p = plan(&[1, 2, 3], &s, ask(Some(2), Some("8"))).unwrap();
        assert_eq!((p.step_request.as_str(), p.payload), ("8", None));
    }

    #[test]
    fn a_rerun_cannot_skip_a_step_that_did_not_complete() {
        let s = src(&[(10, 1, "COMPLETED", "r1"), (13, 2, "FAILED", "e")]);
        let (status, why) = plan(&[1, 2, 3], &s, ask(Some(3), None)).unwrap_err();
        assert_eq!(status, StatusCode::CONFLICT);
        assert!(why.contains("step 2 failed"), "{why}");
        let (status, why) = plan(&[1, 2, 3, 4], &s, ask(Some(4), None)).unwrap_err();
        assert_eq!(status, StatusCode::CONFLICT, "{why}");
        let (status, why) = plan(&[1, 2, 3], &s, ask(Some(9), None)).unwrap_err();
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(why.starts_with("fromStep: 9"), "{why}");
    }
}

//! Parsing of the server's service-request answers (create and status).

use serde::Deserialize;

#[derive(Deserialize)]
struct Created {
    #[serde(rename = "serviceRequestId")]
    id: Option<String>,
    #[serde(rename = "pollUrl")]
    poll_url: Option<String>,
}

/// The id from `POST /serviceRequest/{workflow}`'s answer, falling back to
/// the last segment of `pollUrl` if the id field is missing.
pub fn created_id(body: &[u8]) -> Option<String> {
    let c: Created = serde_json::from_slice(body).ok()?;
    c.id.or_else(|| {
        c.poll_url
            .and_then(|u| u.rsplit('/').next().map(str::to_string))
    })
    .filter(|id| !id.is_empty())
}

#[derive(Deserialize)]
struct StepView {
    time_taken: Option<i64>,
}

#[derive(Deserialize)]
struct StatusView {
    status: String,
    total_time_in_ms: Option<i64>,
    #[serde(default)]
    steps: Vec<StepView>,
}

/// Where a service request stands according to `GET /serviceRequest/{id}`.
#[derive(Debug, PartialEq, Eq)]
pub enum Progress {
    Running,
    Completed { overhead_ms: Option<i64> },
    Failed { overhead_ms: Option<i64> },
}

/// Reads a status answer; orchestration overhead is the server's total time
/// minus the time spent inside the steps themselves.
pub fn progress(body: &[u8]) -> Option<Progress> {
    let v: StatusView = serde_json::from_slice(body).ok()?;
    let overhead_ms = v.total_time_in_ms.map(|total| {
        let steps: i64 = v.steps.iter().filter_map(|s| s.time_taken).sum();
        total - steps
    });
    Some(match v.status.as_str() {
        "COMPLETED" => Progress::Completed { overhead_ms },
        "FAILED" => Progress::Failed { overhead_ms },
        _ => Progress::Running,
    })
}

#[derive(Deserialize)]
struct OutcomeView {
    status: String,
    #[serde(default)]
    reason: Option<String>,
}

/// Whether a service request is final, with the server's `reason` if it failed.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Running,
    Completed,
    Failed { reason: String },
}

/// Reads a status answer for its outcome only (the `faults` scenario).
pub fn outcome(body: &[u8]) -> Option<Outcome> {
    let v: OutcomeView = serde_json::from_slice(body).ok()?;
    Some(match v.status.as_str() {
        "COMPLETED" => Outcome::Completed,
        "FAILED" => Outcome::Failed {
            reason: v.reason.unwrap_or_default(),
        },
        _ => Outcome::Running,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_from_create_answer() {
        let b = br#"{"pollUrl":"/serviceRequest/abc","status":"NEW","serviceRequestId":"abc"}"#;
        assert_eq!(created_id(b).as_deref(), Some("abc"));
        let b = br#"{"pollUrl":"/serviceRequest/xyz","status":"NEW"}"#;
        assert_eq!(created_id(b).as_deref(), Some("xyz"));
        assert_eq!(created_id(b"not json"), None);
        assert_eq!(created_id(br#"{"status":"NEW"}"#), None);
    }

    #[test]
    fn overhead_is_total_minus_steps() {
        let b = br#"{"service_request_id":"a","workflow_name":"w","status":"COMPLETED",
            "total_time_in_ms":20,"reason":"",
            "steps":[{"id":1,"name":"step1","status":"COMPLETED","time_taken":5,"payload":{}},
                     {"id":2,"name":"step2","status":"COMPLETED","time_taken":7,"payload":{}}]}"#;
        assert_eq!(
            progress(b),
            Some(Progress::Completed {
                overhead_ms: Some(8)
            })
        );
    }

    #[test]
    fn running_and_failed() {
        let b = br#"{"status":"IN_PROGRESS","steps":[]}"#;
        assert_eq!(progress(b), Some(Progress::Running));
        let b = br#"{"status":"FAILED","total_time_in_ms":3,"steps":[{"time_taken":null}]}"#;
        assert_eq!(
            progress(b),
            Some(Progress::Failed {
                overhead_ms: Some(3)
            })
        );
        assert_eq!(progress(b"{}"), None);
    }

    #[test]
    fn outcome_with_reason() {
        let b = br#"{"status":"FAILED","reason":"step1 answered 503","steps":[]}"#;
        assert_eq!(
            outcome(b),
            Some(Outcome::Failed {
                reason: "step1 answered 503".into()
            })
        );
        assert_eq!(
            outcome(br#"{"status":"COMPLETED"}"#),
            Some(Outcome::Completed)
        );
        assert_eq!(
            outcome(br#"{"status":"NEW","reason":null}"#),
            Some(Outcome::Running)
        );
        assert_eq!(outcome(b"[]"), None);
    }
}

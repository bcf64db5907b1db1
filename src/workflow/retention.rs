//! A workflow's own retention (beyond Clamp): how long its finished requests are kept,
//! by status, over the server's `--retention-days` and kin:
//! `"retention": {"COMPLETED": "P7D", "FAILED": "P90D", "CANCELLED": null}` (ISO 8601 days,
//! hours, minutes, seconds; null keeps them forever). A status it does not name keeps the
//! server's age. The keeper of the partitions reads it from the latest definition.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::status::RequestStatus;

/// The statuses a retention may name: those of finished requests.
const FINISHED: [RequestStatus; 3] = [
    RequestStatus::Completed,
    RequestStatus::Failed,
    RequestStatus::Cancelled,
];

/// An ISO 8601 duration of days, hours, minutes and seconds, as long as it likes.
fn age(text: &str) -> Result<Duration, String> {
    match iso8601::parsers::parse_duration(text.trim().as_bytes()) {
        Ok(([], d)) => {
            if let iso8601::Duration::YMDHMS { year, month, .. } = d {
                if year > 0 || month > 0 {
                    return Err(format!(
                        "{text:?} names years or months, which have no fixed length: use days"
                    ));
                }
            }
            Ok(d.into())
        }
        _ => Err(format!(
            "{text:?} is not an ISO 8601 duration (e.g. \"P7D\")"
        )),
    }
}

/// Checks a definition's `retention`.
pub fn check(r: &BTreeMap<String, Option<String>>) -> Result<(), String> {
    for (status, text) in r {
        if !FINISHED.iter().any(|s| s.as_str() == status) {
            return Err(format!(
                "retention.{status}: only COMPLETED, FAILED and CANCELLED requests are kept for an age"
            ));
        }
        if let Some(t) = text {
            age(t).map_err(|e| format!("retention.{status}: {e}"))?;
        }
    }
    Ok(())
}

/// The ages a stored definition's `retention` gives (an age of None: forever); what does
/// not read is left out (definitions are checked when stored).
pub fn ages(v: &serde_json::Value) -> Vec<(RequestStatus, Option<Duration>)> {
    let Some(map) = v.as_object() else {
        return Vec::new();
    };
    map.iter()
        .filter_map(|(k, v)| {
            let status = FINISHED.into_iter().find(|s| s.as_str() == k)?;
            match v {
                serde_json::Value::Null => Some((status, None)),
                serde_json::Value::String(t) => age(t).ok().map(|d| (status, Some(d))),
                _ => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_by_status_are_checked_and_read() {
        let def: BTreeMap<String, Option<String>> = serde_json::from_value(serde_json::json!(
            {"COMPLETED": "P7D", "FAILED": "PT36H", "CANCELLED": null}))
        .unwrap();
        assert_eq!(check(&def), Ok(()));
        let v = serde_json::to_value(&def).unwrap();
        let got = ages(&v);
        assert!(got.contains(&(
            RequestStatus::Completed,
            Some(Duration::from_secs(7 * 86_400))
        )));
        assert!(got.contains(&(RequestStatus::Failed, Some(Duration::from_secs(36 * 3600)))));
        assert!(got.contains(&(RequestStatus::Cancelled, None)));
        for (bad, needle) in [
            (serde_json::json!({"PAUSED": "P1D"}), "only COMPLETED"),
            (serde_json::json!({"FAILED": "P1M"}), "months"),
            (serde_json::json!({"FAILED": "soon"}), "ISO 8601"),
        ] {
            let def: BTreeMap<String, Option<String>> = serde_json::from_value(bad).unwrap();
            assert!(check(&def).unwrap_err().contains(needle));
        }
    }
}

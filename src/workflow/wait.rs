//! WAIT steps (beyond Clamp): a request sleeps for a duration, or until a time found in
//! its context, then goes on with the step's request as the step's response. The sleep
//! is a row in Postgres (`engine`), not a timer in memory; this module checks the
//! definition and finds when a wait ends.

use std::time::Duration;

use serde_json::{Map, Value};

use super::model::WaitVal;
use super::ValidationError;

/// The longest wait: a year (and a day, for a leap year).
pub const MAX_WAIT: Duration = Duration::from_secs(366 * 24 * 3600);

/// A WAIT step's `val`: `{"duration": "<ISO 8601 duration>"}` or `{"until": "<dotted path
/// in the context to an RFC 3339 time>"}`, exactly one of them.
pub fn wait_val(val: &Value, at: &str) -> Result<WaitVal, ValidationError> {
    let o = val.as_object().expect("checked by the caller");
    if let Some(k) = o
        .keys()
        .find(|k| !matches!(k.as_str(), "duration" | "until"))
    {
        return Err(ValidationError(format!(
            "{at}.val.{k} is not a field of a WAIT step (duration or until)"
        )));
    }
    match (o.get("duration"), o.get("until")) {
        (Some(d), None) => {
            let text = d.as_str().unwrap_or_default();
            duration(text)
                .map(WaitVal::Duration)
                .map_err(|why| ValidationError(format!("{at}.val.duration {d}: {why}")))
        }
        (None, Some(u)) => match u.as_str().map(str::trim).filter(|p| !p.is_empty()) {
            Some(path) if path.split('.').all(|p| !p.is_empty()) => {
                Ok(WaitVal::Until(path.to_string()))
            }
            _ => Err(ValidationError(format!(
                "{at}.val.until {u} must be a dotted path in the context (e.g. \"order.response.due\")"
            ))),
        },
        _ => Err(ValidationError(format!(
            "{at}.val of a WAIT step needs exactly one of duration (e.g. \"PT10M\") or until (a path in the context)"
        ))),
    }
}

/// An ISO 8601 duration of days, hours, minutes and seconds (`P3D`, `PT10M`, `PT1.5S`,
/// `P2W`), at most `MAX_WAIT`. Years and months are refused: they have no fixed length.
pub fn duration(text: &str) -> Result<Duration, String> {
    let parsed = match iso8601::parsers::parse_duration(text.trim().as_bytes()) {
        Ok(([], d)) => d,
        _ => return Err("is not an ISO 8601 duration (e.g. \"PT10M\", \"P3D\")".into()),
    };
    if let iso8601::Duration::YMDHMS { year, month, .. } = parsed {
        if year > 0 || month > 0 {
            return Err("names years or months, which have no fixed length: use days".into());
        }
    }
    let d: Duration = parsed.into();
    if d > MAX_WAIT {
        return Err(format!(
            "is longer than the longest wait, {} days",
            MAX_WAIT.as_secs() / 86_400
        ));
    }
    Ok(d)
}

/// A duration as ISO 8601 writes it, in days, hours, minutes and seconds (`PT10M`,
/// `P3DT4H`, `PT1.5S`): how messages name a timeout.
pub fn iso(d: Duration) -> String {
    let ms = d.as_millis();
    let (days, rest) = (ms / 86_400_000, ms % 86_400_000);
    let (h, rest) = (rest / 3_600_000, rest % 3_600_000);
    let (m, rest) = (rest / 60_000, rest % 60_000);
    let (s, milli) = (rest / 1000, rest % 1000);
    let mut out = String::from("P");
    if days > 0 {
        out.push_str(&format!("{days}D"));
    }
    if h + m + s + milli > 0 || days == 0 {
        out.push('T');
        if h > 0 {
            out.push_str(&format!("{h}H"));
        }
        if m > 0 {
            out.push_str(&format!("{m}M"));
        }
        if milli > 0 {
            let frac = format!("{milli:03}");
            out.push_str(&format!("{s}.{}S", frac.trim_end_matches('0')));
        } else if s > 0 || (h == 0 && m == 0) {
            out.push_str(&format!("{s}S"));
        }
    }
    out
}

/// Why a WAIT's end cannot be read from the context (its step fails, naming it).
#[derive(Debug, thiserror::Error)]
pub enum UntilError {
    #[error("WAIT until {0:?} is not a time in the context")]
    Missing(String),
    #[error("WAIT until {path:?} is {text:?}, not an RFC 3339 time")]
    NotATime { path: String, text: String },
    #[error("WAIT until {path:?} is {text:?}, more than {} days away", MAX_WAIT.as_secs() / 86_400)]
    TooFar { path: String, text: String },
}

/// When a wait that starts at `now_ms` (ms since the Unix epoch) ends, in the same unit:
/// its duration on, or the time at its path (RFC 3339), at most `MAX_WAIT` on.
pub fn due_ms(
    wait: &WaitVal,
    context: &Map<String, Value>,
    now_ms: f64,
) -> Result<f64, UntilError> {
    match wait {
        WaitVal::Duration(d) => Ok(now_ms + d.as_secs_f64() * 1000.0),
        WaitVal::Until(path) => {
            let text = super::transform::lookup_in(context, path)
                .and_then(Value::as_str)
                .ok_or_else(|| UntilError::Missing(path.clone()))?;
            let at = |text: &str| (path.clone(), text.to_string());
            let t = chrono::DateTime::parse_from_rfc3339(text).map_err(|_| {
                let (path, text) = at(text);
                UntilError::NotATime { path, text }
            })?;
            let due = t.timestamp_millis() as f64;
            if due - now_ms > MAX_WAIT.as_secs_f64() * 1000.0 {
                let (path, text) = at(text);
                return Err(UntilError::TooFar { path, text });
            }
            Ok(due)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn durations_are_iso_8601_days_to_seconds_and_bounded() {
        assert_eq!(duration("PT10M").unwrap(), Duration::from_secs(600));
        assert_eq!(duration("P3D").unwrap(), Duration::from_secs(3 * 86_400));
        assert_eq!(duration("P1DT2H").unwrap(), Duration::from_secs(93_600));
        assert_eq!(duration("PT1.5S").unwrap(), Duration::from_millis(1500));
        assert_eq!(duration("P2W").unwrap(), Duration::from_secs(14 * 86_400));
        assert_eq!(duration("P366D").unwrap(), MAX_WAIT);
        assert!(duration("P367D").unwrap_err().contains("longest"));
        assert!(duration("P1M").unwrap_err().contains("months"));
        assert!(duration("P1Y").unwrap_err().contains("years"));
        for bad in ["", "10m", "PT10Mx", "T10M", "P", "-PT1S"] {
            assert!(duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn durations_are_written_back_as_iso_8601() {
        for text in [
            "PT10M",
            "P3D",
            "P1DT2H",
            "PT1.5S",
            "PT0S",
            "PT1H0.25S",
            "P2DT3M",
        ] {
            assert_eq!(iso(duration(text).unwrap()), text);
        }
        assert_eq!(iso(duration("P2W").unwrap()), "P14D");
        assert_eq!(iso(duration("PT90S").unwrap()), "PT1M30S");
    }

    #[test]
    fn a_wait_val_has_exactly_one_of_duration_or_until() {
        assert_eq!(
            wait_val(&json!({"duration": "PT1S"}), "steps[0]").unwrap(),
            WaitVal::Duration(Duration::from_secs(1))
        );
        assert_eq!(
            wait_val(&json!({"until": "order.response.due"}), "steps[0]").unwrap(),
            WaitVal::Until("order.response.due".into())
        );
        for bad in [
            json!({}),
            json!({"duration": "PT1S", "until": "a.b"}),
            json!({"until": ""}),
            json!({"until": "a..b"}),
            json!({"duration": 10}),
            json!({"duration": "PT1S", "timeout": "PT2S"}),
        ] {
            assert!(wait_val(&bad, "steps[0]").is_err(), "{bad}");
        }
    }

    #[test]
    fn until_reads_an_rfc_3339_time_at_its_path() {
        let ctx = json!({"o": {"response": {"due": "2030-01-01T00:00:00Z", "n": 1}}});
        let ctx = ctx.as_object().unwrap();
        let until = |p: &str| WaitVal::Until(p.into());
        let now = chrono::DateTime::parse_from_rfc3339("2029-12-31T23:59:00Z")
            .unwrap()
            .timestamp_millis() as f64;
        assert_eq!(
            due_ms(&until("o.response.due"), ctx, now).unwrap(),
            now + 60_000.0
        );
        assert!(due_ms(&until("o.response.n"), ctx, now).is_err());
        assert!(due_ms(&until("o.missing"), ctx, now).is_err());
        // More than a year away is refused; in the past is due at once (the caller's call).
        assert!(due_ms(&until("o.response.due"), ctx, now - 400.0 * 86_400_000.0).is_err());
        assert!(due_ms(&until("o.response.due"), ctx, now + 120_000.0).unwrap() < now + 120_000.0);
    }
}

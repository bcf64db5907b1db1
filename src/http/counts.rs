//! `GET /serviceRequestCounts?workflow=&createdAfter=&createdBefore=` (beyond Clamp):
//! how many requests were created in a window, by status and by minute (`store::stats`).
//! The window defaults to the last hour and spans at most a day; the counts are of the
//! rows created in it, read once per call.

use std::time::{Duration, SystemTime};

use hyper::StatusCode;
use serde_json::{json, Map, Value};

use super::response::{error, json, store_error, Resp};
use super::rfc3339;
use crate::state::Core;
use crate::store::stats::{self, Bucket};

/// The window unless the query names its ends, and the widest it may be.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(3600);
const MAX_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// What to count.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    pub workflow: Option<String>,
    pub after: SystemTime,
    pub before: SystemTime,
}

pub async fn counts(core: &Core, query: Option<&str>) -> Resp {
    let w = match parse(query, SystemTime::now()) {
        Ok(w) => w,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    match read(core, &w).await {
        Ok(buckets) => json(StatusCode::OK, &answer(&w, &buckets)),
        Err(resp) => resp,
    }
}

/// The buckets of a window (the console reads them here too).
pub async fn read(core: &Core, w: &Window) -> Result<Vec<Bucket>, Resp> {
    let conn = core
        .pool
        .get()
        .await
        .map_err(|e| store_error(e.into(), "count service requests"))?;
    stats::counts(&conn, w.workflow.as_deref(), w.after, w.before)
        .await
        .map_err(|e| store_error(e, "count service requests"))
}

/// Totals by status.
pub fn totals(buckets: &[Bucket]) -> Vec<(String, i64)> {
    let mut out: Vec<(String, i64)> = Vec::new();
    for b in buckets {
        match out.iter_mut().find(|(s, _)| *s == b.status) {
            Some((_, n)) => *n += b.count,
            None => out.push((b.status.clone(), b.count)),
        }
    }
    out.sort();
    out
}

/// `{"createdAfter", "createdBefore", "counts": {status: n}, "perMinute": [{"minute",
/// "counts": {status: n}}]}`, minutes oldest first, only those with requests.
fn answer(w: &Window, buckets: &[Bucket]) -> Value {
    let counts: Map<String, Value> = totals(buckets)
        .into_iter()
        .map(|(s, n)| (s, json!(n)))
        .collect();
    let mut minutes: Vec<Value> = Vec::new();
    let mut last: Option<i64> = None;
    for b in buckets {
        if last != Some(b.minute) {
            let t = SystemTime::UNIX_EPOCH + Duration::from_secs(b.minute.max(0) as u64);
            minutes.push(json!({"minute": rfc3339(t), "counts": {}}));
            last = Some(b.minute);
        }
        if let Some(m) = minutes.last_mut() {
            m["counts"][&b.status] = json!(b.count);
        }
    }
    json!({
        "workflow": w.workflow,
        "createdAfter": rfc3339(w.after),
        "createdBefore": rfc3339(w.before),
        "counts": counts,
        "perMinute": minutes,
    })
}

/// The window of a query string at `now`; the error names the parameter at fault.
pub fn parse(query: Option<&str>, now: SystemTime) -> Result<Window, String> {
    let mut workflow = None;
    let (mut after, mut before) = (None, None);
    for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        let seen = match &*key {
            "workflow" if value.is_empty() => return Err("workflow: empty".into()),
            "workflow" => workflow.replace(value.into_owned()).is_some(),
            "createdAfter" => after.replace(super::search::time(&key, &value)?).is_some(),
            "createdBefore" => before.replace(super::search::time(&key, &value)?).is_some(),
            other => {
                return Err(format!(
                    "{other}: unknown parameter (the filters are workflow, createdAfter and createdBefore)"
                ))
            }
        };
        if seen {
            return Err(format!("{key}: given more than once"));
        }
    }
    let (after, before) = match (after, before) {
        (Some(a), Some(b)) => (a, b),
        // Until now, or a day after it.
        (Some(a), None) => (a, now.clamp(a + Duration::from_millis(1), a + MAX_WINDOW)),
        (None, Some(b)) => (b - DEFAULT_WINDOW, b),
        (None, None) => (now - DEFAULT_WINDOW, now),
    };
    if after >= before {
        return Err("createdAfter: must be before createdBefore".into());
    }
    if before.duration_since(after).unwrap_or_default() > MAX_WINDOW {
        return Err("createdBefore: the window spans more than a day".into());
    }
    Ok(Window {
        workflow,
        after,
        before,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_the_last_hour_unless_named_and_at_most_a_day() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let w = parse(None, now).unwrap();
        assert_eq!((w.after, w.before), (now - DEFAULT_WINDOW, now));
        let w = parse(Some("workflow=a+b&createdBefore=2027-01-15T08:00:00Z"), now).unwrap();
        assert_eq!(w.workflow.as_deref(), Some("a b"));
        assert_eq!(w.before.duration_since(w.after).unwrap(), DEFAULT_WINDOW);
        for (q, field) in [
            (
                "createdAfter=2026-01-01T00:00:00Z&createdBefore=2026-01-03T00:00:00Z",
                "createdBefore:",
            ),
            (
                "createdAfter=2026-01-02T00:00:00Z&createdBefore=2026-01-01T00:00:00Z",
                "createdAfter:",
            ),
            ("createdAfter=yesterday", "createdAfter:"),
            ("workflow=", "workflow:"),
            ("workflow=a&workflow=b", "workflow:"),
            ("status=FAILED", "status:"),
        ] {
            let why = parse(Some(q), now).unwrap_err();
            assert!(why.starts_with(field), "{q}: {why}");
        }
    }

    #[test]
    fn buckets_add_up_by_status_and_group_by_minute() {
        let b = |minute, status: &str, count| Bucket {
            minute,
            status: status.into(),
            count,
        };
        let buckets = [
            b(60, "COMPLETED", 3),
            b(60, "FAILED", 1),
            b(120, "COMPLETED", 2),
        ];
        assert_eq!(
            totals(&buckets),
            vec![("COMPLETED".into(), 5), ("FAILED".into(), 1)]
        );
        let w = parse(None, SystemTime::now()).unwrap();
        let a = answer(&w, &buckets);
        assert_eq!(a["counts"], json!({"COMPLETED": 5, "FAILED": 1}));
        assert_eq!(a["perMinute"][0]["minute"], "1970-01-01T00:01:00.000Z");
        assert_eq!(
            a["perMinute"][0]["counts"],
            json!({"COMPLETED": 3, "FAILED": 1})
        );
        assert_eq!(a["perMinute"][1]["counts"], json!({"COMPLETED": 2}));
    }
}

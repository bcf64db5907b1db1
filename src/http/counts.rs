//! `GET /serviceRequestCounts?workflow=&createdAfter=&createdBefore=` (beyond Clamp):
//! how many requests were created in a window, by status and by minute (`ops::lists`).
//! The window defaults to the last hour and spans at most a day.

use std::time::{Duration, SystemTime};

use hyper::StatusCode;
use serde_json::{json, Map, Value};

use super::response::{json, op_error, Resp};
use super::rfc3339;
use crate::ops::lists::Bucket;
use crate::ops::lists::{self, Window};
use crate::state::Core;

pub async fn counts(core: &Core, query: Option<&str>) -> Resp {
    let w = match lists::counts_window(&lists::pairs(query), SystemTime::now()) {
        Ok(w) => w,
        Err(e) => return op_error(e),
    };
    match lists::counts(&core.pool, &w).await {
        Ok(buckets) => json(StatusCode::OK, &answer(&w, &buckets)),
        Err(e) => op_error(e),
    }
}

/// `{"createdAfter", "createdBefore", "counts": {status: n}, "perMinute": [{"minute",
/// "counts": {status: n}}]}`, minutes oldest first, only those with requests.
fn answer(w: &Window, buckets: &[Bucket]) -> Value {
    let counts: Map<String, Value> = lists::totals(buckets)
        .into_iter()
        .map(|(s, n)| (s.as_str().to_string(), json!(n)))
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
            m["counts"][b.status.as_str()] = json!(b.count);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::RequestStatus;

    #[test]
    fn buckets_add_up_by_status_and_group_by_minute() {
        let b = |minute, status, count| Bucket {
            minute,
            status,
            count,
        };
        let buckets = [
            b(60, RequestStatus::Completed, 3),
            b(60, RequestStatus::Failed, 1),
            b(120, RequestStatus::Completed, 2),
        ];
        let w = lists::counts_window(&lists::pairs(None), SystemTime::now()).unwrap();
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

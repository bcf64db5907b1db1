//! `GET /serviceRequests?status=&workflow=&createdAfter=&createdBefore=&limit=&cursor=`
//! (beyond Clamp): search, newest first, in keyset pages (`store::search`). Every filter
//! is optional; a bad one is a 400 that names it.

use std::time::SystemTime;

use hyper::StatusCode;
use uuid::Uuid;

use super::response::{error, json, store_error, Resp};
use crate::state::Core;
use crate::store::search::{self, Filter};

/// Rows per page unless `limit` says otherwise, and the most it may say.
const DEFAULT_LIMIT: i64 = 50;
const MAX_LIMIT: i64 = 1_000;

/// The statuses a request can show (what `status=` accepts).
pub(crate) use crate::store::status::REQUEST_STATUSES as STATUSES;

pub async fn search(core: &Core, query: Option<&str>) -> Resp {
    let filter = match parse(query) {
        Ok(f) => f,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    let conn = match core.pool.get().await {
        Ok(c) => c,
        Err(e) => return store_error(e.into(), "search service requests"),
    };
    match search::search(&conn, &filter).await {
        Ok((items, next)) => json(
            StatusCode::OK,
            &serde_json::json!({
                "serviceRequests": items,
                "nextCursor": next.map(|id| id.simple().to_string()),
            }),
        ),
        Err(e) => store_error(e, "search service requests"),
    }
}

/// The filters of a query string; the error names the parameter at fault.
pub fn parse(query: Option<&str>) -> Result<Filter, String> {
    let mut f = Filter {
        limit: DEFAULT_LIMIT,
        ..Filter::default()
    };
    let mut seen: Vec<String> = Vec::new();
    for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if key != "status" {
            if seen.iter().any(|k| *k == key) {
                return Err(format!("{key}: given more than once"));
            }
            seen.push(key.to_string());
        }
        match &*key {
            "status" => {
                for s in value.split(',').map(str::trim) {
                    let Some(known) = STATUSES.iter().find(|k| k.eq_ignore_ascii_case(s)) else {
                        return Err(format!(
                            "status: {s:?} is not a status (one of {})",
                            STATUSES.join(", ")
                        ));
                    };
                    if !f.statuses.contains(known) {
                        f.statuses.push(known);
                    }
                }
            }
            "workflow" if value.is_empty() => return Err("workflow: empty".into()),
            "workflow" => f.workflow = Some(value.into_owned()),
            "createdAfter" => f.created_after = Some(time(&key, &value)?),
            "createdBefore" => f.created_before = Some(time(&key, &value)?),
            "limit" => {
                f.limit = match value.parse::<i64>() {
                    Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
                    _ => return Err(format!("limit: must be a number from 1 to {MAX_LIMIT}")),
                }
            }
            "cursor" => {
                f.cursor = Some(
                    Uuid::try_parse(&value)
                        .map_err(|_| "cursor: not a cursor this server gave out".to_string())?,
                )
            }
            "rerunOf" => {
                f.rerun_of = Some(
                    Uuid::try_parse(&value)
                        .map_err(|_| "rerunOf: not a service request id".to_string())?,
                )
            }
            other => {
                return Err(format!(
                    "{other}: unknown parameter (the filters are status, workflow, createdAfter, \
                     createdBefore, rerunOf, limit and cursor)"
                ))
            }
        }
    }
    if let (Some(a), Some(b)) = (f.created_after, f.created_before) {
        if a >= b {
            return Err("createdAfter: must be before createdBefore".into());
        }
    }
    Ok(f)
}

/// An RFC 3339 time, e.g. `2026-12-01T10:00:00Z` or `2026-12-01T11:00:00.5+01:00`; the
/// error names `key` (search's parameters and bulk retry's fields alike).
pub(crate) fn time(key: &str, value: &str) -> Result<SystemTime, String> {
    let t = chrono::DateTime::parse_from_rfc3339(value).map_err(|_| {
        format!("{key}: {value:?} is not an RFC 3339 time (e.g. 2026-12-01T10:00:00Z)")
    })?;
    let us = t.timestamp_micros();
    if us < 0 {
        return Err(format!("{key}: before 1970"));
    }
    Ok(SystemTime::UNIX_EPOCH + std::time::Duration::from_micros(us as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_parse_and_bad_ones_name_their_parameter() {
        let f = parse(Some(
            "status=FAILED,cancelled&status=FAILED&workflow=claims&limit=10\
             &createdAfter=2026-12-01T10:00:00Z&createdBefore=2026-12-01T11:00:00.5%2B01:00",
        ))
        .unwrap();
        assert_eq!(f.statuses, vec!["FAILED", "CANCELLED"]);
        assert_eq!(f.workflow.as_deref(), Some("claims"));
        assert_eq!(f.limit, 10);
        assert!(f.created_after < f.created_before);
        let d = parse(None).unwrap();
        assert_eq!((d.limit, d.statuses.len(), d.cursor), (50, 0, None));
        for (query, param) in [
            ("status=DONE", "status:"),
            ("status=", "status:"),
            ("workflow=", "workflow:"),
            ("limit=0", "limit:"),
            ("limit=1001", "limit:"),
            ("limit=x", "limit:"),
            ("createdAfter=yesterday", "createdAfter:"),
            ("createdBefore=2026-12-01", "createdBefore:"),
            ("cursor=zz", "cursor:"),
            ("pageSize=3", "pageSize:"),
            ("limit=1&limit=2", "limit:"),
            (
                "createdAfter=2026-12-01T11:00:00Z&createdBefore=2026-12-01T10:00:00Z",
                "createdAfter:",
            ),
        ] {
            let why = parse(Some(query)).unwrap_err();
            assert!(why.starts_with(param), "{query}: {why}");
        }
    }
}

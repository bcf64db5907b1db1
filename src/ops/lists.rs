//! Requests in lists: Clamp's page of a workflow's requests, and beyond Clamp search (by
//! status, workflow, creation time and rerun, in keyset pages) and counts (by status and
//! minute of creation). The filters are read here from name/value pairs, so an API query
//! string and a console form are read by the same rules, each fault named.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use uuid::Uuid;

use super::{OpError, Result};
use crate::state::Core;
use crate::status::RequestStatus;
use crate::store::queries::{self, RequestRow};
use crate::store::search;
pub use crate::store::search::Filter;
pub use crate::store::slots::Waiting;
use crate::store::stats;
pub use crate::store::stats::Bucket;
use crate::store::Pool;

/// Rows per search page unless `limit` says otherwise, and the most it may say.
const DEFAULT_LIMIT: i64 = 50;
const MAX_LIMIT: i64 = 1_000;

/// The counts' window unless the query names its ends, and the widest it may be.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(3600);
const MAX_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// Largest page a list returns.
pub const MAX_PAGE_SIZE: i64 = 1000;

/// A page of Clamp's list.
pub struct Page<T> {
    pub items: Vec<T>,
    pub number: i64,
    pub size: i64,
}

/// `GET /serviceRequests/{workflow}`: page `number` (0-based, as Clamp) of `size`
/// requests of a known workflow, newest first.
pub async fn by_workflow(
    core: &Core,
    workflow: &str,
    number: i64,
    size: i64,
) -> Result<Page<RequestRow>> {
    super::create::workflow(core, workflow, None).await?;
    let doing = "list service requests";
    let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
    let items = queries::service_requests_page(&conn, workflow, size, size * number)
        .await
        .map_err(OpError::store(doing))?;
    Ok(Page {
        items,
        number,
        size,
    })
}

/// A search page, newest first, and the cursor of the next (None: no more).
pub async fn search(pool: &Pool, f: &Filter) -> Result<(Vec<RequestRow>, Option<Uuid>)> {
    let doing = "search service requests";
    let conn = pool.get().await.map_err(OpError::pool(doing))?;
    search::search(&conn, f)
        .await
        .map_err(OpError::store(doing))
}

/// What counts count: requests created strictly between the two times, of one workflow
/// or all.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    pub workflow: Option<String>,
    pub after: SystemTime,
    pub before: SystemTime,
}

/// The counts of a window by status and minute, oldest first.
pub async fn counts(pool: &Pool, w: &Window) -> Result<Vec<Bucket>> {
    let doing = "count service requests";
    let conn = pool.get().await.map_err(OpError::pool(doing))?;
    stats::counts(&conn, w.workflow.as_deref(), w.after, w.before)
        .await
        .map_err(OpError::store(doing))
}

/// Totals by status, in the order statuses are listed.
pub fn totals(buckets: &[Bucket]) -> Vec<(RequestStatus, i64)> {
    RequestStatus::ALL
        .into_iter()
        .filter_map(|s| {
            let n: i64 = buckets
                .iter()
                .filter(|b| b.status == s)
                .map(|b| b.count)
                .sum();
            buckets.iter().any(|b| b.status == s).then_some((s, n))
        })
        .collect()
}

/// Name/value pairs, as a query string or a form gives them.
pub type Pairs<'a> = Vec<(Cow<'a, str>, Cow<'a, str>)>;

/// The pairs of a query string.
pub fn pairs(query: Option<&str>) -> Pairs<'_> {
    form_urlencoded::parse(query.unwrap_or("").as_bytes()).collect()
}

/// A search's filters; the error names the parameter at fault.
pub fn search_filter(pairs: &Pairs<'_>) -> Result<Filter> {
    let mut f = Filter {
        limit: DEFAULT_LIMIT,
        ..Filter::default()
    };
    let mut seen: Vec<&str> = Vec::new();
    for (key, value) in pairs {
        if key != "status" && key != "label" {
            if seen.contains(&&**key) {
                return Err(bad(format!("{key}: given more than once")));
            }
            seen.push(key);
        }
        match &**key {
            "status" => add_statuses(&mut f.statuses, value)?,
            "workflow" if value.is_empty() => return Err(bad("workflow: empty")),
            "workflow" => f.workflow = Some(value.to_string()),
            "createdAfter" => f.created_after = Some(time(key, value)?),
            "createdBefore" => f.created_before = Some(time(key, value)?),
            "limit" => {
                f.limit = match value.parse::<i64>() {
                    Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
                    _ => return Err(bad(format!("limit: must be a number from 1 to {MAX_LIMIT}"))),
                }
            }
            "cursor" => {
                f.cursor = Some(
                    Uuid::try_parse(value)
                        .map_err(|_| bad("cursor: not a cursor this server gave out"))?,
                )
            }
            "rerunOf" => {
                f.rerun_of = Some(
                    Uuid::try_parse(value)
                        .map_err(|_| bad("rerunOf: not a service request id"))?,
                )
            }
            "awaitingEvent" if value.is_empty() => return Err(bad("awaitingEvent: empty")),
            "awaitingEvent" => f.awaiting_event = Some(value.to_string()),
            "eventKey" => f.event_key = Some(value.to_string()),
            "waitingForSlot" => {
                f.waiting_for_slot = match value.as_ref() {
                    "true" => true,
                    "false" => false,
                    _ => return Err(bad("waitingForSlot: true or false")),
                }
            }
            "label" => add_label(&mut f.labels, value)?,
            "slotKey" => {
                f.slot_key = Some(value.to_string());
                f.waiting_for_slot = true;
            }
            other => {
                return Err(bad(format!(
                    "{other}: unknown parameter (the filters are status, workflow, createdAfter, \
                     createdBefore, rerunOf, awaitingEvent, eventKey, waitingForSlot, slotKey, label, \
                     limit and cursor)"
                )))
            }
        }
    }
    if let (Some(a), Some(b)) = (f.created_after, f.created_before) {
        if a >= b {
            return Err(bad("createdAfter: must be before createdBefore"));
        }
    }
    if !f.labels.is_empty()
        && (f.rerun_of.is_some() || f.awaiting_event.is_some() || f.waiting_for_slot)
    {
        return Err(bad(
            "label: cannot be combined with rerunOf, awaitingEvent or waitingForSlot",
        ));
    }
    Ok(f)
}

/// A `label` filter added to `to`, kept sorted and unique.
fn add_label(to: &mut Vec<String>, value: &str) -> Result<()> {
    let l = crate::labels::Labels::parse([value])
        .map_err(|e| bad(e.0))?
        .ok_or_else(|| bad("label: empty"))?;
    to.extend(l.as_slice().iter().cloned());
    to.sort_unstable();
    to.dedup();
    if to.len() > crate::labels::MAX_LABELS {
        return Err(bad(format!(
            "label: at most {} labels",
            crate::labels::MAX_LABELS
        )));
    }
    Ok(())
}

/// A `status` filter's statuses (one, or several separated by commas, in any case)
/// added to `to`, each once.
fn add_statuses(to: &mut Vec<RequestStatus>, value: &str) -> Result<()> {
    for s in value.split(',').map(str::trim) {
        let known = RequestStatus::ALL
            .into_iter()
            .find(|k| k.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                let all: Vec<&str> = RequestStatus::ALL.iter().map(|k| k.as_str()).collect();
                bad(format!(
                    "status: {s:?} is not a status (one of {})",
                    all.join(", ")
                ))
            })?;
        if !to.contains(&known) {
            to.push(known);
        }
    }
    Ok(())
}

/// The counts' window at `now`; the error names the parameter at fault.
pub fn counts_window(pairs: &Pairs<'_>, now: SystemTime) -> Result<Window> {
    let mut workflow = None;
    let (mut after, mut before) = (None, None);
    for (key, value) in pairs {
        let seen = match &**key {
            "workflow" if value.is_empty() => return Err(bad("workflow: empty")),
            "workflow" => workflow.replace(value.to_string()).is_some(),
            "createdAfter" => after.replace(time(key, value)?).is_some(),
            "createdBefore" => before.replace(time(key, value)?).is_some(),
            other => {
                return Err(bad(format!(
                    "{other}: unknown parameter (the filters are workflow, createdAfter and createdBefore)"
                )))
            }
        };
        if seen {
            return Err(bad(format!("{key}: given more than once")));
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
        return Err(bad("createdAfter: must be before createdBefore"));
    }
    if before.duration_since(after).unwrap_or_default() > MAX_WINDOW {
        return Err(bad("createdBefore: the window spans more than a day"));
    }
    Ok(Window {
        workflow,
        after,
        before,
    })
}

/// An RFC 3339 time, e.g. `2026-12-01T10:00:00Z` or `2026-12-01T11:00:00.5+01:00`; the
/// error names `key` (search's parameters and bulk retry's fields alike).
pub fn time(key: &str, value: &str) -> Result<SystemTime> {
    let t = chrono::DateTime::parse_from_rfc3339(value).map_err(|_| {
        bad(format!(
            "{key}: {value:?} is not an RFC 3339 time (e.g. 2026-12-01T10:00:00Z)"
        ))
    })?;
    let us = t.timestamp_micros();
    if us < 0 {
        return Err(bad(format!("{key}: before 1970")));
    }
    Ok(SystemTime::UNIX_EPOCH + Duration::from_micros(us as u64))
}

/// A filter that cannot be taken: 400, naming the parameter at fault.
fn bad(why: impl Into<String>) -> OpError {
    OpError::BadRequest(why.into())
}

/// Beyond Clamp: how many requests wait for a concurrency slot or a rate's room, by
/// workflow; empty when the database cannot say (a best-effort column of the console's
/// and a gauge of `/metrics`).
pub async fn waiting_for_slots(pool: &Pool) -> Vec<(String, i64)> {
    let read = async {
        let conn = pool.get().await.ok()?;
        crate::store::slots::waiting_counts(&conn).await.ok()
    };
    read.await.unwrap_or_default()
}

/// Beyond Clamp: the requests of `workflow` waiting for a slot or a rate's room, by key
/// (the `limit` keys with the most).
pub async fn waiting_by_key(pool: &Pool, workflow: &str, limit: i64) -> Result<Waiting> {
    let doing = "read waiting requests";
    let conn = pool.get().await.map_err(OpError::pool(doing))?;
    crate::store::slots::waiting_by_key(&conn, workflow, limit)
        .await
        .map_err(OpError::store(doing))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search(q: &str) -> std::result::Result<Filter, String> {
        search_filter(&pairs(Some(q))).map_err(|e| e.message())
    }

    #[test]
    fn filters_parse_and_bad_ones_name_their_parameter() {
        let f = search(
            "status=FAILED,cancelled&status=FAILED&workflow=claims&limit=10\
             &createdAfter=2026-12-01T10:00:00Z&createdBefore=2026-12-01T11:00:00.5%2B01:00",
        )
        .unwrap();
        assert_eq!(
            f.statuses,
            vec![RequestStatus::Failed, RequestStatus::Cancelled]
        );
        assert_eq!(f.workflow.as_deref(), Some("claims"));
        assert_eq!(f.limit, 10);
        assert!(f.created_after < f.created_before);
        let d = search_filter(&pairs(None)).unwrap();
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
            let why = search(query).unwrap_err();
            assert!(why.starts_with(param), "{query}: {why}");
        }
    }

    #[test]
    fn the_window_is_the_last_hour_unless_named_and_at_most_a_day() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let w = counts_window(&pairs(None), now).unwrap();
        assert_eq!((w.after, w.before), (now - DEFAULT_WINDOW, now));
        let w = counts_window(
            &pairs(Some("workflow=a+b&createdBefore=2027-01-15T08:00:00Z")),
            now,
        )
        .unwrap();
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
            let why = counts_window(&pairs(Some(q)), now).unwrap_err().message();
            assert!(why.starts_with(field), "{q}: {why}");
        }
    }

    #[test]
    fn totals_are_by_status_in_list_order() {
        let b = |minute, status, count| Bucket {
            minute,
            status,
            count,
        };
        let buckets = [
            b(60, RequestStatus::Failed, 1),
            b(60, RequestStatus::Completed, 3),
            b(120, RequestStatus::Completed, 2),
        ];
        assert_eq!(
            totals(&buckets),
            vec![(RequestStatus::Completed, 5), (RequestStatus::Failed, 1)]
        );
    }
}

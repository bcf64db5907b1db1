//! `GET /serviceRequests?…` (beyond Clamp): requests by workflow, status and creation
//! time, newest first, in keyset pages.
//!
//! No index of its own: ids are UUIDv7, so creation time bounds are id bounds, and every
//! page is one backward range scan of the primary key, or of the by-workflow index when a
//! workflow is named, from the cursor (the last id of the previous page) down to the
//! lower time bound. The exact creation times and the statuses are filters on the rows
//! that scan reads; FAILED and CANCELLED, which operators look for and few requests have,
//! have partial indexes of their own (migration 9), so their pages read only such rows.

use std::time::SystemTime;

use uuid::Uuid;

use super::pool::PgConn;
use super::queries::RequestRow;
use super::Result;
use crate::status::RequestStatus;

/// What to look for.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub workflow: Option<String>,
    /// Statuses as reads show them (`IN_PROGRESS` derived); empty: any.
    pub statuses: Vec<RequestStatus>,
    /// Created strictly after this time.
    pub created_after: Option<SystemTime>,
    /// Created strictly before this time.
    pub created_before: Option<SystemTime>,
    /// Below this id (the last of the previous page).
    pub cursor: Option<Uuid>,
    /// Reruns of this request only.
    pub rerun_of: Option<Uuid>,
    /// Requests paused at an EVENT step waiting for this event (and this key, if given).
    pub awaiting_event: Option<String>,
    pub event_key: Option<String>,
    /// Requests carrying every one of these labels (beyond Clamp: `crate::labels`).
    pub labels: Vec<String>,
    /// Requests waiting for a concurrency slot (or a rate's room), of this key if given.
    pub waiting_for_slot: bool,
    pub slot_key: Option<String>,
    pub limit: i64,
}

/// How far an id's millisecond may stand from its row's `created_at` (both are read from
/// the server's clock, one after the other): time bounds are widened by it for the index
/// range and applied exactly to `created_at`.
const ID_CLOCK_SLACK_MS: u64 = 1_000;

/// The columns, conditions and order both statements share; `$1` lower id bound, `$2`
/// upper id bound (exclusive), `$3` statuses or NULL, `$4`/`$5` exact time bounds or NULL,
/// `$6` rows to read.
macro_rules! search_sql {
    ($workflow:expr, $order:literal) => {
        concat!(
            "SELECT s.id, s.workflow_name, ",
            crate::store::sql::derived_status!("s"),
            " AS status, to_json(s.created_at) #>> '{}' AS created_at, s.payload, \
             s.current_step_id, s.reason, s.labels \
             FROM service_requests s \
             WHERE ",
            $workflow,
            "s.id >= $1 AND s.id < $2 \
               AND ($3::text[] IS NULL OR ",
            crate::store::sql::derived_status!("s"),
            " = ANY($3)) \
               AND ($4::timestamptz IS NULL OR s.created_at > $4) \
               AND ($5::timestamptz IS NULL OR s.created_at < $5) \
             ORDER BY ",
            $order,
            " LIMIT $6"
        )
    };
}

/// Any workflow: a backward range scan of the primary key.
pub(super) const SEARCH_ALL: &str = search_sql!("", "s.id DESC");
/// One workflow (`$7`): a backward range scan of the by-workflow index. Planned for each
/// search with its values (not prepared once): a generic plan cannot know how rare the
/// workflow is, and took the primary key instead, reading every newer request of every
/// other workflow (51,000 rows for a page of a workflow with one request in a thousand).
pub(super) const SEARCH_WORKFLOW: &str = search_sql!("s.workflow_name = $7 AND ", "s.id DESC");
/// The two above for FAILED or CANCELLED requests only: the condition, written out, lets
/// them scan the partial indexes of those rows (migration 9) instead of every request.
pub(super) const SEARCH_SETTLED_BADLY: &str = search_sql!(
    concat!(
        "s.status IN (",
        crate::status::status_sql!(Failed),
        ", ",
        crate::status::status_sql!(Cancelled),
        ") AND "
    ),
    "s.id DESC"
);
pub(super) const SEARCH_SETTLED_BADLY_WORKFLOW: &str = search_sql!(
    concat!(
        "s.status IN (",
        crate::status::status_sql!(Failed),
        ", ",
        crate::status::status_sql!(Cancelled),
        ") AND s.workflow_name = $7 AND "
    ),
    "s.id DESC"
);

/// The reruns of a request (`$8`), of any or one workflow: a range scan of their partial
/// index (migration 10), which holds only reruns.
pub(super) const SEARCH_RERUNS: &str = search_sql!(
    "s.rerun_of = $8 AND ($7::text IS NULL OR s.workflow_name = $7) AND ",
    "s.id DESC"
);

/// Requests waiting for event `$8` (and key `$9`, NULL: any), of any or one workflow: a
/// range scan of the partial index of such requests (migration 19), which holds only
/// requests paused at an EVENT step.
pub(super) const SEARCH_AWAITING: &str = search_sql!(
    concat!(
        "s.status = ",
        crate::status::status_sql!(Paused),
        " AND s.wait_event = $8 AND ($9::text IS NULL OR s.wait_key = $9) \
         AND ($7::text IS NULL OR s.workflow_name = $7) AND "
    ),
    "s.id DESC"
);

/// Requests waiting for a slot of their workflow's limits (of key `$8`, NULL: any), of any
/// or one workflow: as `concurrency_slots` (migration 34, kept in the requests' own
/// transactions) names them.
pub(super) const SEARCH_WAITING_SLOT: &str = search_sql!(
    "s.id IN (SELECT q.id FROM concurrency_slots q WHERE q.queued \
       AND q.id >= $1 AND q.id < $2 \
       AND ($8::text IS NULL OR q.concurrency_key = $8) \
       AND ($7::text IS NULL OR q.workflow_name = $7)) AND ",
    "s.id DESC"
);

/// How many of the newest requests a label search reads before it asks the index.
macro_rules! label_window {
    () => {
        "2000"
    };
}

/// Requests carrying every label of `$8` (a `text[]`), of any or one workflow, among the
/// newest `LABEL_WINDOW` requests of the range: a backward scan of the ids from the cursor
/// that reads no further, whatever the planner guesses of the labels' frequency (it cannot
/// tell a label one request carries from one a tenth carry, and a guess of the latter
/// scanned a million rows for the former). A common label fills its page here.
pub(super) const SEARCH_LABELS_RECENT: &str = search_sql!(
    concat!(
        "s.labels @> $8::text[] AND ($7::text IS NULL OR s.workflow_name = $7) \
         AND s.id >= coalesce((SELECT w.id FROM service_requests w \
             WHERE w.id >= $1 AND w.id < $2 ORDER BY w.id DESC OFFSET ",
        label_window!(),
        " - 1 LIMIT 1), $1) AND "
    ),
    "s.id DESC"
);

/// The same over the whole range, when the newest requests did not fill the page: the
/// labels' partial GIN index (migration 26), which holds only labelled requests, finds
/// every match, sorted after. The order is by the id's bytes (`uuid_send`, the same order),
/// which no index gives, so the planner cannot trade the index for a scan of the ids that
/// hopes to meet matches soon.
pub(super) const SEARCH_LABELS: &str = search_sql!(
    "s.labels @> $8::text[] AND ($7::text IS NULL OR s.workflow_name = $7) AND ",
    "uuid_send(s.id) DESC"
);

/// A page of matches, newest first, and the cursor of the next page (None: no more).
pub async fn search(conn: &PgConn, f: &Filter) -> Result<(Vec<RequestRow>, Option<Uuid>)> {
    let (lower, time_upper) = id_bounds(f.created_after, f.created_before);
    let p = Params {
        lower,
        upper: match f.cursor {
            Some(c) if c < time_upper => c,
            _ => time_upper,
        },
        statuses: (!f.statuses.is_empty()).then_some(&f.statuses[..]),
        created_after: f.created_after,
        created_before: f.created_before,
        // One row more than asked for says whether another page follows.
        read: f.limit + 1,
        workflow: f.workflow.as_deref(),
        rerun_of: f.rerun_of,
        awaiting_event: f.awaiting_event.as_deref(),
        event_key: f.event_key.as_deref(),
        slot_key: f.slot_key.as_deref(),
    };
    let badly = !f.statuses.is_empty() && f.statuses.iter().all(|s| s.is_retryable());
    let rows = match (f.rerun_of, &f.workflow) {
        _ if !f.labels.is_empty() => {
            let params = p.labelled(&f.labels);
            let recent = conn.client.query(SEARCH_LABELS_RECENT, &params).await?;
            if recent.len() as i64 > f.limit {
                recent
            } else {
                conn.client.query(SEARCH_LABELS, &params).await?
            }
        }
        _ if f.awaiting_event.is_some() => {
            let stmt = conn.stmt(SEARCH_AWAITING).await?;
            conn.client.query(&stmt, &p.awaiting()).await?
        }
        _ if f.waiting_for_slot => {
            let stmt = conn.stmt(SEARCH_WAITING_SLOT).await?;
            conn.client.query(&stmt, &p.waiting_for_slot()).await?
        }
        (Some(_), _) => conn.client.query(SEARCH_RERUNS, &p.reruns()).await?,
        (None, Some(_)) => {
            let sql = if badly {
                SEARCH_SETTLED_BADLY_WORKFLOW
            } else {
                SEARCH_WORKFLOW
            };
            conn.client.query(sql, &p.one_workflow()).await?
        }
        (None, None) => {
            let stmt = conn
                .stmt(if badly {
                    SEARCH_SETTLED_BADLY
                } else {
                    SEARCH_ALL
                })
                .await?;
            conn.client.query(&stmt, &p.any_workflow()).await?
        }
    };
    let more = rows.len() as i64 > f.limit;
    let page = &rows[..rows.len().min(f.limit as usize)];
    let next = more
        .then(|| page.last().map(|r| r.get::<_, Uuid>("id")))
        .flatten();
    Ok((page.iter().map(RequestRow::of).collect(), next))
}

/// A parameter as tokio-postgres takes it.
type Param<'p> = &'p (dyn tokio_postgres::types::ToSql + Sync);

/// The search statements' parameters, by name; each statement takes the first six and
/// those of its own conditions.
struct Params<'a> {
    /// `$1`, `$2`: the id range (lower inclusive, upper exclusive).
    lower: Uuid,
    upper: Uuid,
    /// `$3`: statuses as reads show them, or NULL for any.
    statuses: Option<&'a [RequestStatus]>,
    /// `$4`, `$5`: the exact creation time bounds, or NULL.
    created_after: Option<SystemTime>,
    created_before: Option<SystemTime>,
    /// `$6`: rows to read.
    read: i64,
    /// `$7`: the workflow.
    workflow: Option<&'a str>,
    /// `$8`: the request whose reruns are looked for.
    rerun_of: Option<Uuid>,
    /// `$8`, `$9`: the event waited for, and its key.
    awaiting_event: Option<&'a str>,
    event_key: Option<&'a str>,
    /// `$8`: the key of the requests waiting for a slot, or NULL for any.
    slot_key: Option<&'a str>,
}

impl Params<'_> {
    /// `SEARCH_WAITING_SLOT`: `$1..$8` (`$7` and `$8` may be NULL).
    fn waiting_for_slot(&self) -> [Param<'_>; 8] {
        [
            &self.lower,
            &self.upper,
            &self.statuses,
            &self.created_after,
            &self.created_before,
            &self.read,
            &self.workflow,
            &self.slot_key,
        ]
    }

    /// `SEARCH_ALL` and `SEARCH_SETTLED_BADLY`: `$1..$6`.
    fn any_workflow(&self) -> [Param<'_>; 6] {
        [
            &self.lower,
            &self.upper,
            &self.statuses,
            &self.created_after,
            &self.created_before,
            &self.read,
        ]
    }

    /// `SEARCH_WORKFLOW` and `SEARCH_SETTLED_BADLY_WORKFLOW`: `$1..$7`.
    fn one_workflow(&self) -> [Param<'_>; 7] {
        [
            &self.lower,
            &self.upper,
            &self.statuses,
            &self.created_after,
            &self.created_before,
            &self.read,
            &self.workflow,
        ]
    }

    /// `SEARCH_AWAITING`: `$1..$9` (`$7` and `$9` may be NULL).
    fn awaiting(&self) -> [Param<'_>; 9] {
        [
            &self.lower,
            &self.upper,
            &self.statuses,
            &self.created_after,
            &self.created_before,
            &self.read,
            &self.workflow,
            &self.awaiting_event,
            &self.event_key,
        ]
    }

    /// `SEARCH_LABELS_RECENT` and `SEARCH_LABELS`: `$1..$8` (`$7` may be NULL).
    fn labelled<'p>(&'p self, labels: &'p Vec<String>) -> [Param<'p>; 8] {
        [
            &self.lower,
            &self.upper,
            &self.statuses,
            &self.created_after,
            &self.created_before,
            &self.read,
            &self.workflow,
            labels,
        ]
    }

    /// `SEARCH_RERUNS`: `$1..$8` (`$7` may be NULL).
    fn reruns(&self) -> [Param<'_>; 8] {
        [
            &self.lower,
            &self.upper,
            &self.statuses,
            &self.created_after,
            &self.created_before,
            &self.read,
            &self.workflow,
            &self.rerun_of,
        ]
    }
}

/// The id range (lower inclusive, upper exclusive) that holds every request created
/// strictly between the two times, widened by the slack between an id's clock read and
/// its `created_at`'s (filter on `created_at` for the exact bounds).
pub(crate) fn id_bounds(
    created_after: Option<SystemTime>,
    created_before: Option<SystemTime>,
) -> (Uuid, Uuid) {
    let ms = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    };
    let lower = created_after.map_or(Uuid::nil(), |t| {
        id_floor(ms(t).saturating_sub(ID_CLOCK_SLACK_MS))
    });
    let upper = created_before.map_or(Uuid::max(), |t| id_floor(ms(t) + ID_CLOCK_SLACK_MS + 1));
    (lower, upper)
}

/// The smallest UUIDv7 of millisecond `ms` (every id made in it or later is not below it).
fn id_floor(ms: u64) -> Uuid {
    let ms = ms.min((1 << 48) - 1);
    Uuid::from_u128(((ms as u128) << 80) | (0x7 << 76) | (0b10 << 62))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_floors_order_with_the_ids_of_their_millisecond() {
        let id = crate::ids::new_v7();
        let ms = (id.as_u128() >> 80) as u64;
        assert!(id_floor(ms) <= id);
        assert!(id < id_floor(ms + 1));
        assert!(id_floor(ms - 1) < id_floor(ms));
        assert_eq!(id_floor(ms).get_version_num(), 7);
        assert_eq!(id_floor(0), Uuid::from_u128((0x7 << 76) | (0b10 << 62)));
    }
}

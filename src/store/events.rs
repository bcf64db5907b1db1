//! EVENT steps and event delivery (beyond Clamp). A request reaching an EVENT step either
//! takes an event delivered earlier and still kept (`kept`), or pauses naming the event
//! and key it waits for (`pause`), found by delivery through a partial index. Delivery
//! (`deliver`) stores the event once by its id, resumes every request paused on that
//! event and key, and keeps the event for requests that reach the step later.
//!
//! The two sides meet under one transaction-scoped advisory lock per (event, key): a
//! request checks for a kept event and pauses under it, and a delivery stores its event
//! and looks for paused requests under it, so an event delivered while a request is
//! between its check and its pause is never missed by both.

use std::time::Duration;

use uuid::Uuid;

use super::PgConn;
use super::Result;

/// `$1` event, `$2` key: the lock both sides take (the two-key form, whose keys never
/// meet the one-key locks migrations take; two pairs that hash alike only wait on each
/// other).
pub(super) const LOCK: &str =
    "SELECT pg_advisory_xact_lock(hashtext($1::text), hashtext($2::text))";

/// `$1` event, `$2` key: the latest event still kept for it.
pub(super) const KEPT: &str = "SELECT payload FROM events \
     WHERE event = $1 AND key = $2 AND keep_until > now() ORDER BY received_at DESC LIMIT 1";

/// `$1` id, `$2` step, `$3` owner, `$4` event, `$5` key, `$6` step name, `$7` the step's
/// request, `$8` started (ms), `$9` timeout (ms, NULL: none). Fenced on the lease: the
/// request pauses at the step naming its event and key (its deadline, if any, as
/// `lease_until`, the attempt it is as `step_attempts`, as `deadlines` reads them) and
/// the step's record is written STARTED, or nothing is.
pub(super) const PAUSE: &str = concat!(
    "\
WITH fenced AS (
    UPDATE service_requests s SET status = ",
    crate::status::status_sql!(Paused),
    ", current_step_id = $2,
        wait_event = $4, wait_key = $5, lease_owner = NULL,
        lease_until = CASE WHEN $9::float8 IS NULL THEN '-infinity'::timestamptz ELSE ",
    crate::store::sql::now_plus_ms!("$9"),
    " END,
        step_attempts = CASE WHEN $9::float8 IS NULL THEN 0 ELSE 1 END, last_error = NULL,
        updated_at = now()
    WHERE s.id = $1 AND s.lease_owner = $3
    RETURNING s.id
)
INSERT INTO steps_status (service_request_id, step_id, step_name, status, request, started_at, attempts)
SELECT id, $2, $6, ",
    crate::status::status_sql!(Started),
    ", $7, to_timestamp($8::float8 / 1000.0), 1 FROM fenced
RETURNING 1"
);

/// A request at its EVENT step.
pub struct Waiting<'a> {
    pub id: Uuid,
    pub step_id: u32,
    pub step_name: &'a str,
    pub owner: Uuid,
    pub event: &'a str,
    pub key: &'a str,
    pub request: &'a str,
    pub started_ms: f64,
    pub timeout: Option<Duration>,
}

/// What a request found at its EVENT step.
#[derive(Debug, PartialEq, Eq)]
pub enum AtStep {
    /// An event delivered before, still kept: its payload answers the step now.
    Kept(String),
    /// Paused, waiting for the event.
    Paused,
    /// The lease is lost: nothing written.
    Lost,
}

/// Takes a kept event for `w`, or pauses it waiting for one, under the (event, key) lock.
pub async fn wait(conn: &mut PgConn, w: &Waiting<'_>) -> Result<AtStep> {
    let lock = conn.stmt(LOCK).await?;
    let kept = conn.stmt(KEPT).await?;
    let pause = conn.stmt(PAUSE).await?;
    let tx = conn.client.transaction().await?;
    tx.query_one(&lock, &[&w.event, &w.key]).await?;
    if let Some(row) = tx.query_opt(&kept, &[&w.event, &w.key]).await? {
        tx.commit().await?;
        return Ok(AtStep::Kept(row.get(0)));
    }
    let timeout_ms = w.timeout.map(|d| d.as_secs_f64() * 1000.0);
    let paused = tx
        .query_opt(
            &pause,
            &[
                &w.id,
                &(w.step_id as i32),
                &w.owner,
                &w.event,
                &w.key,
                &w.step_name,
                &w.request,
                &w.started_ms,
                &timeout_ms,
            ],
        )
        .await?
        .is_some();
    tx.commit().await?;
    Ok(if paused { AtStep::Paused } else { AtStep::Lost })
}

/// `$1` event, `$2` id, `$3` key, `$4` payload, `$5` traceparent, `$6` kept for (ms):
/// the event stored, unless one with its id was (then no row).
pub(super) const INSERT: &str = concat!(
    "INSERT INTO events (event, id, key, payload, traceparent, keep_until) \
     VALUES ($1, $2, $3, $4, $5, ",
    crate::store::sql::now_plus_ms!("$6"),
    ") ON CONFLICT (event, id) DO NOTHING RETURNING to_json(keep_until) #>> '{}'"
);

/// `$1` event, `$2` key: the requests paused waiting for it, locked.
pub(super) const WAITERS: &str = concat!(
    "SELECT id, current_step_id, workflow_name, coalesce(workflow_version, 1) \
     FROM service_requests WHERE status = ",
    crate::status::status_sql!(Paused),
    " AND wait_event = $1 AND wait_key = $2 ORDER BY id FOR UPDATE"
);

/// `$1` ids, `$2` their EVENT steps, `$3` their next steps (0: none), `$4` the payload:
/// each resumed at its next step with the payload as its request (unleased, for any
/// sweeper), the step's record COMPLETED with the payload as its response.
pub(super) const RESUME: &str = concat!(
    "\
WITH r AS (SELECT * FROM unnest($1::uuid[], $2::int[], $3::int[]) AS r(id, step, next)),
resumed AS (
    UPDATE service_requests s SET status = ",
    crate::status::status_sql!(Resumed),
    ", current_step_id = r.next, step_request = $4,
        wait_event = NULL, wait_key = NULL, step_attempts = 0, last_error = NULL,
        lease_owner = NULL, lease_until = '-infinity', updated_at = now()
    FROM r WHERE s.id = r.id AND s.status = ",
    crate::status::status_sql!(Paused),
    " AND s.current_step_id = r.step
    RETURNING s.id, r.step
), answered AS (
    UPDATE steps_status st SET status = ",
    crate::status::status_sql!(Completed),
    ", response = $4, finished_at = now(),
        time_taken_ms = round(extract(epoch FROM now() - st.started_at) * 1000)::bigint
    FROM resumed
    WHERE st.service_request_id = resumed.id AND st.step_id = resumed.step AND st.status = ",
    crate::status::status_sql!(Started),
    "
)
SELECT id FROM resumed"
);

/// `$1` event, `$2` id, `$3` requests it resumed.
pub(super) const MATCHED: &str = "UPDATE events SET matched = $3 WHERE event = $1 AND id = $2";

/// `$1` how many: events kept until more than a day ago (their ids no longer deduplicated).
pub(super) const FORGET: &str = "DELETE FROM events WHERE ctid IN (SELECT ctid FROM events \
     WHERE keep_until < now() - interval '1 day' LIMIT $1)";

/// A request paused on an event, as delivery finds it.
#[derive(Debug)]
pub struct Waiter {
    pub id: Uuid,
    pub step_id: u32,
    pub workflow_name: String,
    pub workflow_version: u32,
}

/// An event to deliver.
pub struct Delivery<'a> {
    pub event: &'a str,
    /// Its id: a second delivery with the same id counts once.
    pub id: &'a str,
    pub key: &'a str,
    pub payload: &'a str,
    pub traceparent: Option<&'a str>,
    pub keep_for: Duration,
}

/// What a delivery did.
#[derive(Debug)]
pub enum Delivered {
    /// Stored; the requests it resumed, those whose workflow the caller did not know
    /// (still paused), and until when it is kept.
    New {
        resumed: Vec<Uuid>,
        skipped: Vec<Waiter>,
        keep_until: String,
    },
    /// An event with this id was delivered before: nothing done.
    Duplicate,
}

/// Delivers `d` in one transaction under its (event, key) lock: the event stored once by
/// its id, every request paused on it resumed at the step `next` names for it.
pub async fn deliver(
    conn: &mut PgConn,
    d: &Delivery<'_>,
    next: impl Fn(&Waiter) -> Option<u32>,
) -> Result<Delivered> {
    let lock = conn.stmt(LOCK).await?;
    let insert = conn.stmt(INSERT).await?;
    let waiters = conn.stmt(WAITERS).await?;
    let resume = conn.stmt(RESUME).await?;
    let matched = conn.stmt(MATCHED).await?;
    let tx = conn.client.transaction().await?;
    tx.query_one(&lock, &[&d.event, &d.key]).await?;
    let keep_ms = d.keep_for.as_secs_f64() * 1000.0;
    let Some(row) = tx
        .query_opt(
            &insert,
            &[
                &d.event,
                &d.id,
                &d.key,
                &d.payload,
                &d.traceparent,
                &keep_ms,
            ],
        )
        .await?
    else {
        tx.commit().await?;
        return Ok(Delivered::Duplicate);
    };
    let keep_until: String = row.get(0);
    let found: Vec<Waiter> = tx
        .query(&waiters, &[&d.event, &d.key])
        .await?
        .iter()
        .map(|r| Waiter {
            id: r.get(0),
            step_id: r.get::<_, i32>(1).max(0) as u32,
            workflow_name: r.get(2),
            workflow_version: r.get::<_, i32>(3).max(1) as u32,
        })
        .collect();
    let (mut ids, mut steps, mut nexts, mut skipped) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for w in found {
        // A waiter whose workflow `next` does not know is left to the caller (`resume`).
        match next(&w) {
            Some(n) => {
                ids.push(w.id);
                steps.push(w.step_id as i32);
                nexts.push(n as i32);
            }
            None => skipped.push(w),
        }
    }
    let resumed: Vec<Uuid> = if ids.is_empty() {
        Vec::new()
    } else {
        tx.query(&resume, &[&ids, &steps, &nexts, &d.payload])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect()
    };
    tx.execute(&matched, &[&d.event, &d.id, &(resumed.len() as i32)])
        .await?;
    tx.commit().await?;
    Ok(Delivered::New {
        resumed,
        skipped,
        keep_until,
    })
}

/// `$1` event, `$2` key: the workflows (name, version) of the requests waiting for it.
pub(super) const WAITER_WORKFLOWS: &str = concat!(
    "SELECT DISTINCT workflow_name, coalesce(workflow_version, 1) FROM service_requests \
     WHERE status = ",
    crate::status::status_sql!(Paused),
    " AND wait_event = $1 AND wait_key = $2"
);

/// The workflows of the requests waiting for `event` and `key` now (read before a
/// delivery, so that it finds them loaded).
pub async fn waiter_workflows(conn: &PgConn, event: &str, key: &str) -> Result<Vec<(String, u32)>> {
    let stmt = conn.stmt(WAITER_WORKFLOWS).await?;
    Ok(conn
        .client
        .query(&stmt, &[&event, &key])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get::<_, i32>(1).max(1) as u32))
        .collect())
}

/// Resumes requests a delivery left (`Delivered::New::skipped`) at the steps `nexts`,
/// with `payload`, each only if it still waits at its EVENT step.
pub async fn resume(
    conn: &PgConn,
    waiters: &[(Uuid, u32, u32)],
    payload: &str,
) -> Result<Vec<Uuid>> {
    let stmt = conn.stmt(RESUME).await?;
    let ids: Vec<Uuid> = waiters.iter().map(|w| w.0).collect();
    let steps: Vec<i32> = waiters.iter().map(|w| w.1 as i32).collect();
    let nexts: Vec<i32> = waiters.iter().map(|w| w.2 as i32).collect();
    Ok(conn
        .client
        .query(&stmt, &[&ids, &steps, &nexts, &payload])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// Deletes up to `limit` events kept until more than a day ago.
pub async fn forget(conn: &PgConn, limit: i64) -> Result<u64> {
    let stmt = conn.stmt(FORGET).await?;
    Ok(conn.client.execute(&stmt, &[&limit]).await?)
}

//! EVENT steps and event delivery (beyond Clamp). A request reaching an EVENT step either
//! takes an event delivered earlier and still kept (`kept`), or pauses naming the event
//! and key it waits for (`pause`), found by delivery through a partial index. Delivery
//! (`deliver`) stores the event once by its id, resumes every request paused on that
//! event and key, and keeps the event for requests that reach the step later. What each
//! request took is recorded (`event_takes`, by the statement that resumes it or with the
//! kept event it takes), so an event resumes a request at most once: a later EVENT step
//! of the same request does not take it again.
//!
//! The two sides meet under one transaction-scoped advisory lock per (event, key): a
//! request checks for a kept event and pauses under it, and a delivery stores its event
//! and looks for paused requests under it, so an event delivered while a request is
//! between its check and its pause is never missed by both.

use std::time::Duration;

use uuid::Uuid;

use super::leases::Claimed;
use super::PgConn;
use super::Result;

/// `$1` event, `$2` key: the lock both sides take (the two-key form, whose keys never
/// meet the one-key locks migrations take; two pairs that hash alike only wait on each
/// other).
pub(super) const LOCK: &str =
    "SELECT pg_advisory_xact_lock(hashtext($1::text), hashtext($2::text))";

/// `$1` event, `$2` key, `$3` the request, `$4` its EVENT step: the latest event still
/// kept for it that no other step of the request took (an event resumes a request at
/// most once; the same step takes it again when it runs again after a crash).
pub(super) const KEPT: &str = "SELECT e.payload, e.id FROM events e \
     WHERE e.event = $1 AND e.key = $2 AND e.keep_until > now() \
       AND NOT EXISTS (SELECT 1 FROM event_takes t WHERE t.service_request_id = $3 \
           AND t.event = e.event AND t.event_id = e.id AND t.step_id <> $4) \
     ORDER BY e.received_at DESC LIMIT 1";

/// `$1` the request, `$2` its EVENT step, `$3` event, `$4` the event's id: the take of a
/// kept event, in the transaction that found it.
pub(super) const TAKE: &str =
    "INSERT INTO event_takes (service_request_id, step_id, event, event_id) \
     VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING";

/// `$1` id, `$2` step, `$3` owner, `$4` event, `$5` key, `$6` step name, `$7` the step's
/// request, `$8` started (ms), `$9` timeout (ms, NULL: none), `$10` the step after it (0:
/// none). Fenced on the lease: the
/// request pauses at the step naming its event and key (its deadline, if any, as
/// `lease_until`, the attempt it is as `step_attempts`, as `deadlines` reads them) and
/// the step's record is written STARTED, or nothing is.
pub(super) const PAUSE: &str = concat!(
    "\
WITH fenced AS (
    UPDATE service_requests s SET status = ",
    crate::status::status_sql!(Paused),
    ", current_step_id = $2,
        wait_event = $4, wait_key = $5, wait_next = $10, lease_owner = NULL,
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
    /// The step it goes on to once answered (0: none left).
    pub next_step: u32,
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
    let take = conn.stmt(TAKE).await?;
    let pause = conn.stmt(PAUSE).await?;
    let tx = conn.client.transaction().await?;
    tx.query_one(&lock, &[&w.event, &w.key]).await?;
    let step = w.step_id as i32;
    if let Some(row) = tx
        .query_opt(&kept, &[&w.event, &w.key, &w.id, &step])
        .await?
    {
        let event_id: &str = row.get(1);
        tx.execute(&take, &[&w.id, &step, &w.event, &event_id])
            .await?;
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
                &(w.next_step as i32),
            ],
        )
        .await?
        .is_some();
    tx.commit().await?;
    Ok(if paused { AtStep::Paused } else { AtStep::Lost })
}

/// `$1` event, `$2` id, `$3` key, `$4` payload, `$5` traceparent, `$6` kept for (ms),
/// `$7` the delivering instance, `$8` how many of the resumed requests it leases, `$9`
/// the lease (ms). One statement, run after the (event, key) lock in the same transaction
/// (so it sees every pause committed before the lock): the event stored unless its id was
/// (then nothing else happens, and no row comes back), and every request paused on the
/// event and key resumed at the step its pause named, with the payload as that step's
/// request and as the EVENT step's response. The first `$8` are leased to `$7` (it has
/// slots reserved for them and continues them at once, as a step response's resume
/// does); the others are left unleased for any sweeper. One row per resumed request (one
/// with NULLs when none was): until when the event is kept, the EVENT step, whether it
/// was leased, then the claimed columns (`sql::claimed_columns!`, in its order), of which
/// an unleased request's payload and step request are NULL and its headers too unless
/// they carry a trace context (its trace marks the resume).
pub(super) const DELIVER: &str = concat!(
    "\
WITH fresh AS (
    INSERT INTO events (event, id, key, payload, traceparent, keep_until)
    VALUES ($1, $2, $3, $4, $5, ",
    crate::store::sql::now_plus_ms!("$6"),
    ")
    ON CONFLICT (event, id) DO NOTHING
    RETURNING to_json(keep_until) #>> '{}' AS keep_until
), locked AS (
    SELECT w.id, w.current_step_id AS step FROM service_requests w
    WHERE w.status = ",
    crate::status::status_sql!(Paused),
    " AND w.wait_event = $1 AND w.wait_key = $3
      AND EXISTS (SELECT 1 FROM fresh)
    FOR UPDATE
), waiting AS (
    -- Numbered apart from the lock: FOR UPDATE takes no window function.
    SELECT id, step, row_number() OVER (ORDER BY id) <= $8 AS leased FROM locked
), resumed AS (
    UPDATE service_requests s SET status = ",
    crate::status::status_sql!(Resumed),
    ", current_step_id = coalesce(s.wait_next, 0), step_request = $4,
        wait_event = NULL, wait_key = NULL, wait_next = NULL, step_attempts = 0,
        last_error = NULL, updated_at = now(),
        lease_owner = CASE WHEN w.leased THEN $7::uuid END,
        lease_until = CASE WHEN w.leased THEN ",
    crate::store::sql::now_plus_ms!("$9"),
    " ELSE '-infinity'::timestamptz END
    FROM waiting w WHERE s.id = w.id
    RETURNING w.step, w.leased, ",
    crate::store::sql::claimed_columns!("s"),
    "
), took AS (
    INSERT INTO event_takes (service_request_id, step_id, event, event_id)
    SELECT r.id, r.step, $1, $2 FROM resumed r
    ON CONFLICT DO NOTHING
), answered AS (
    UPDATE steps_status st SET status = ",
    crate::status::status_sql!(Completed),
    ", response = $4, finished_at = now(),
        time_taken_ms = round(extract(epoch FROM now() - st.started_at) * 1000)::bigint
    FROM resumed r
    WHERE st.service_request_id = r.id AND st.step_id = r.step AND st.status = ",
    crate::status::status_sql!(Started),
    "
)
SELECT f.keep_until, r.step, r.leased, r.id, r.workflow_name, r.status,
       CASE WHEN r.leased THEN r.payload END,
       CASE WHEN r.leased OR r.headers LIKE '%\"traceparent\"%' THEN r.headers END,
       r.current_step_id, CASE WHEN r.leased THEN r.step_request END, r.failed_step_id,
       r.reason, r.step_attempts, r.created_us, r.version, r.parent_id, r.retries,
       r.deadline_in_ms, r.priority
FROM fresh f LEFT JOIN resumed r ON true"
);

/// `$1` age past the keep window (ms), `$2` how many: events kept until longer ago than
/// the age (their ids no longer deduplicate a redelivery); run by the housekeeping.
pub(super) const FORGET: &str = "DELETE FROM events WHERE ctid IN (SELECT ctid FROM events \
     WHERE keep_until < now() - $1::float8 * interval '1 millisecond' LIMIT $2)";

/// An event to deliver.
pub struct Delivery<'a> {
    pub event: &'a str,
    /// Its id: a second delivery with the same id counts once.
    pub id: &'a str,
    pub key: &'a str,
    pub payload: &'a str,
    pub traceparent: Option<&'a str>,
    pub keep_for: Duration,
    /// Lease up to `lease_n` resumed requests to this instance (it reserved slots for
    /// them), for `lease`; the others are left for any sweeper.
    pub owner: Uuid,
    pub lease_n: u32,
    pub lease: Duration,
}

/// What a delivery did.
#[derive(Debug)]
pub enum Delivered {
    /// Stored; the requests it resumed, and until when it is kept.
    New {
        resumed: Vec<Resumed>,
        keep_until: String,
    },
    /// An event with this id was delivered before: nothing done.
    Duplicate,
}

/// A request a delivery resumed.
#[derive(Debug)]
pub struct Resumed {
    pub id: Uuid,
    /// Its EVENT step.
    pub step_id: u32,
    /// Left for any sweeper: its stored headers when they carry a trace context.
    pub traced: Option<String>,
    /// Leased to this instance, as claimed (None: left for any sweeper).
    pub claimed: Option<Claimed>,
}

impl Resumed {
    /// Its stored headers, where a trace context would be: a leased request's own, an
    /// unleased one's when traced.
    pub fn headers(&self) -> Option<&str> {
        match &self.claimed {
            Some(c) => Some(&c.headers),
            None => self.traced.as_deref(),
        }
    }
}

/// Delivers `d`: the (event, key) lock, then `DELIVER`, in one transaction sent in one
/// round trip (`PgConn::in_one_trip`).
pub async fn deliver(conn: &PgConn, d: &Delivery<'_>) -> Result<Delivered> {
    let lock = conn.stmt(LOCK).await?;
    let deliver = conn.stmt(DELIVER).await?;
    let keep_ms = d.keep_for.as_secs_f64() * 1000.0;
    let lease_ms = d.lease.as_secs_f64() * 1000.0;
    let lease_n = i64::from(d.lease_n);
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 9] = [
        &d.event,
        &d.id,
        &d.key,
        &d.payload,
        &d.traceparent,
        &keep_ms,
        &d.owner,
        &lease_n,
        &lease_ms,
    ];
    let lock_params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&d.event, &d.key];
    let rows = conn
        .in_one_trip(&[], Some((&lock, &lock_params[..])), &deliver, &params)
        .await?;
    let Some(first) = rows.first() else {
        return Ok(Delivered::Duplicate);
    };
    let keep_until: String = first.get(0);
    let mut resumed = Vec::with_capacity(rows.len());
    for row in &rows {
        let Some(step) = row.get::<_, Option<i32>>(1) else {
            continue; // The one row of a delivery that resumed no one.
        };
        let leased: bool = row.get(2);
        resumed.push(Resumed {
            id: row.get(3),
            step_id: step.max(0) as u32,
            traced: if leased { None } else { row.get(7) },
            claimed: leased.then(|| Claimed::from_row_at(row, 3)),
        });
    }
    Ok(Delivered::New {
        resumed,
        keep_until,
    })
}

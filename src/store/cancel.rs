//! Cancelling a service request: written at once, whichever instance holds its lease.
//! The lease is taken away in the same update, and every executor write is fenced on the
//! lease and the status, so the holder stops at its next write; a cancelled request is
//! never claimed again (the claim reads runnable statuses only). Its unfinished child
//! requests (WORKFLOW steps) are cancelled with it.

use uuid::Uuid;

use super::PgConn;
use super::Result;
use crate::status::RequestStatus;

/// What a cancel did.
#[derive(Debug, PartialEq, Eq)]
pub enum Cancelled {
    /// Cancelled now: the request, and its unfinished children with it.
    Now(Vec<CancelledRow>),
    /// It was cancelled before (cancelling is idempotent).
    Already {
        reason: Option<String>,
    },
    /// It had finished: COMPLETED or FAILED.
    Finished {
        status: RequestStatus,
    },
    Unknown,
}

/// A request a cancel finished: what its trace needs (`telemetry::Tracing::end_request`).
#[derive(Debug, PartialEq, Eq)]
pub struct CancelledRow {
    pub id: Uuid,
    pub workflow_name: String,
    pub headers: String,
    pub created_us: i64,
    pub retries: i32,
    pub reason: String,
}

/// The request and, in the same statement, its unfinished child requests (WORKFLOW
/// steps), theirs, and so on down.
pub(super) const CANCEL: &str = concat!(
    "WITH RECURSIVE tree AS (
    SELECT $1::uuid AS id
    UNION ALL
    SELECT c.id FROM service_requests c JOIN tree t ON c.parent_id = t.id
    WHERE c.parent_id IS NOT NULL
), done AS (
    UPDATE service_requests SET status = ",
    crate::status::status_sql!(Cancelled),
    ",
    reason = CASE WHEN id = $1 THEN $2 ELSE 'its parent was cancelled: ' || $2 END,
    finished_at = now(), updated_at = now(), lease_owner = NULL, lease_until = '-infinity'
    WHERE id IN (SELECT id FROM tree)
      AND status NOT IN (",
    crate::status::status_sql!(Completed),
    ", ",
    crate::status::status_sql!(Failed),
    ", ",
    crate::status::status_sql!(Cancelled),
    ")
    RETURNING id, workflow_name, headers,
        (extract(epoch FROM created_at) * 1000000)::int8 AS created_us, retries, reason,
        notify, workflow_version, status, concurrency_key, lease_until, priority
), told AS (",
    crate::store::sql::tell!("done"),
    "
), ",
    crate::store::slots::follow!("done"),
    "
SELECT id, workflow_name, headers, created_us, retries, reason FROM done
ORDER BY id = $1 DESC"
);

/// A cancel that asks for compensation (beyond Clamp): the request, not failing already,
/// is set to compensate from its first compensation (failed step 0, claimable: an
/// executor runs its compensations, then it ends CANCELLED), and its unfinished children,
/// theirs, and so on down, are cancelled in the same statement. Returns the request's row
/// first (`true`), then each child cancelled.
pub(super) const CANCEL_COMPENSATING: &str = concat!(
    "WITH RECURSIVE tree AS (
    SELECT c.id FROM service_requests c WHERE c.parent_id = $1
    UNION ALL
    SELECT g.id FROM service_requests g JOIN tree t ON g.parent_id = t.id
    WHERE g.parent_id IS NOT NULL
), me AS (
    UPDATE service_requests SET status = ",
    crate::status::status_sql!(InProgress),
    ", failed_step_id = 0, current_step_id = 0, step_request = NULL, reason = $2,
       step_attempts = 0, last_error = NULL, lease_owner = NULL, lease_until = '-infinity',
       updated_at = now()
    WHERE id = $1 AND failed_step_id IS NULL AND status NOT IN (",
    crate::status::status_sql!(Completed),
    ", ",
    crate::status::status_sql!(Failed),
    ", ",
    crate::status::status_sql!(Cancelled),
    ")
    RETURNING id, workflow_name, headers,
        (extract(epoch FROM created_at) * 1000000)::int8 AS created_us, retries, reason,
        status, concurrency_key, lease_until, priority
), done AS (
    UPDATE service_requests SET status = ",
    crate::status::status_sql!(Cancelled),
    ",
    reason = 'its parent was cancelled: ' || $2,
    finished_at = now(), updated_at = now(), lease_owner = NULL, lease_until = '-infinity'
    WHERE id IN (SELECT id FROM tree) AND EXISTS (SELECT 1 FROM me)
      AND status NOT IN (",
    crate::status::status_sql!(Completed),
    ", ",
    crate::status::status_sql!(Failed),
    ", ",
    crate::status::status_sql!(Cancelled),
    ")
    RETURNING id, workflow_name, headers,
        (extract(epoch FROM created_at) * 1000000)::int8 AS created_us, retries, reason,
        notify, workflow_version, status, concurrency_key, lease_until, priority
), told AS (",
    crate::store::sql::tell!("done"),
    "
), changed AS (SELECT ",
    crate::store::slots::follows!(),
    " FROM me UNION ALL SELECT ",
    crate::store::slots::follows!(),
    " FROM done), ",
    crate::store::slots::follow!("changed"),
    "
SELECT true, id, workflow_name, headers, created_us, retries, reason FROM me
UNION ALL
SELECT false, id, workflow_name, headers, created_us, retries, reason FROM done"
);

/// What a compensating cancel did.
#[derive(Debug, PartialEq, Eq)]
pub enum Compensating {
    /// The request compensates now; these children were cancelled.
    Now(Vec<CancelledRow>),
    /// It was not set to: cancelled, failing, finished, or unknown (`Cancelled` says).
    Not(Cancelled),
}

/// Cancels `id` asking for its compensations (`CANCEL_COMPENSATING`).
pub async fn cancel_compensating(conn: &PgConn, id: Uuid, reason: &str) -> Result<Compensating> {
    let stmt = conn.stmt(CANCEL_COMPENSATING).await?;
    let rows = conn.client.query(&stmt, &[&id, &reason]).await?;
    if rows.first().is_some_and(|r| r.get::<_, bool>(0)) {
        return Ok(Compensating::Now(
            rows[1..].iter().map(|r| CancelledRow::at(r, 1)).collect(),
        ));
    }
    Ok(Compensating::Not(not_now(conn, id).await?))
}

/// `$1` request: whether its create asked that a cancel compensate it (its label
/// `COMPENSATE_ON_CANCEL`).
pub(super) const ASKED_AT_CREATE: &str =
    "SELECT coalesce(labels @> ARRAY[$2::text], false) FROM service_requests WHERE id = $1";

/// Whether request `id`'s create asked that a cancel compensate it.
pub async fn asked_at_create(conn: &PgConn, id: Uuid) -> Result<bool> {
    let stmt = conn.stmt(ASKED_AT_CREATE).await?;
    Ok(conn
        .client
        .query_opt(&stmt, &[&id, &crate::labels::COMPENSATE_ON_CANCEL])
        .await?
        .is_some_and(|r| r.get(0)))
}

/// A request's stored status and reason, when it was not cancelled now.
pub(super) const STATUS_AND_REASON: &str =
    "SELECT status, reason FROM service_requests WHERE id = $1";

pub async fn cancel(conn: &PgConn, id: Uuid, reason: &str) -> Result<Cancelled> {
    let stmt = conn
        .stmt(
            // The request and, in the same statement, its unfinished child requests
            // (WORKFLOW steps), theirs, and so on down.
            CANCEL,
        )
        .await?;
    let rows: Vec<CancelledRow> = conn
        .client
        .query(&stmt, &[&id, &reason])
        .await?
        .iter()
        .map(|r| CancelledRow::at(r, 0))
        .collect();
    if rows.first().is_some_and(|r| r.id == id) {
        return Ok(Cancelled::Now(rows));
    }
    not_now(conn, id).await
}

impl CancelledRow {
    /// The row's columns from `at` on: id, workflow, headers, created (µs), retries, reason.
    fn at(r: &tokio_postgres::Row, at: usize) -> CancelledRow {
        CancelledRow {
            id: r.get(at),
            workflow_name: r.get(at + 1),
            headers: r.get(at + 2),
            created_us: r.get(at + 3),
            retries: r.get(at + 4),
            reason: r.get(at + 5),
        }
    }
}

/// What a request not cancelled now is: cancelled before, finished, or unknown (a final
/// status never changes again, so this read is not racy).
async fn not_now(conn: &PgConn, id: Uuid) -> Result<Cancelled> {
    let stmt = conn.stmt(STATUS_AND_REASON).await?;
    Ok(match conn.client.query_opt(&stmt, &[&id]).await? {
        None => Cancelled::Unknown,
        Some(r) if r.get::<_, RequestStatus>(0) == RequestStatus::Cancelled => {
            Cancelled::Already { reason: r.get(1) }
        }
        Some(r) => Cancelled::Finished { status: r.get(0) },
    })
}

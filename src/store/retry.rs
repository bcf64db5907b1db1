//! Retrying a FAILED or CANCELLED request in place (beyond Clamp): one fenced statement
//! makes it runnable again from the step that failed (or, cancelled, the step that was
//! next), with that step's recorded request or a new one; any instance's sweeper then
//! claims it, and the steps that completed are not called again. The row lock and the
//! status condition make two concurrent retries start it once.

use uuid::Uuid;

use super::PgConn;
use super::Result;
use crate::status::RequestStatus;

/// What a retry did.
#[derive(Debug, PartialEq, Eq)]
pub enum Retried {
    /// Runnable again; this many retries so far. `headers` carry its trace context.
    Now {
        retries: i32,
        headers: String,
        /// It has a concurrency key: it waits for a slot again.
        limited: bool,
    },
    /// Not FAILED or CANCELLED (it is running, paused, or completed): its status.
    NotRetryable {
        status: RequestStatus,
    },
    /// It failed outside any step after steps had run (its outcome could not be stored):
    /// where to continue is not known.
    NoFailedStep,
    Unknown,
}

/// What a retry sets on a FAILED or CANCELLED row `s`: runnable again from the step that
/// failed (a request that failed at no step and ran none: from its first step, 1), or for
/// a cancelled one the step that was next, with `$2` (or NULL: the recorded request) as
/// that step's request. A deadline is renewed: as long again, from now.
macro_rules! retry_set {
    () => {
        concat!(
            "status = ",
            crate::status::status_sql!(New),
            ",
    current_step_id = CASE WHEN s.status = ",
            crate::status::status_sql!(Failed),
            " THEN coalesce(s.failed_step_id, 1)
                           ELSE greatest(s.current_step_id, 1) END,
    step_request = CASE
        WHEN $2::text IS NOT NULL THEN $2
        WHEN s.status = ",
            crate::status::status_sql!(Failed),
            " AND s.failed_step_id IS NOT NULL THEN
            -- '' marks the payload in a record, NULL in the row (see sql::step_request).
            (SELECT NULLIF(st.request, '') FROM steps_status st
             WHERE st.service_request_id = s.id AND st.step_id = s.failed_step_id
             ORDER BY st.id DESC LIMIT 1)
        WHEN s.status = ",
            crate::status::status_sql!(Failed),
            " THEN NULL
        ELSE s.step_request END,
    failed_step_id = NULL, reason = NULL, finished_at = NULL, step_attempts = 0,
    last_error = NULL, retries = s.retries + 1, updated_at = now(),
    -- A request with a concurrency key waits for a slot again (`slots`).
    lease_owner = NULL,
    lease_until = CASE WHEN s.concurrency_key IS NULL THEN '-infinity'::timestamptz
                       ELSE 'infinity'::timestamptz END,
    deadline = now() + (s.deadline - coalesce(s.start_at, s.created_at))"
        )
    };
}

/// The rows a retry may touch: FAILED or CANCELLED (written out, so that the partial
/// indexes of these rows, migration 9, serve the bulk retry), and not failed outside its
/// steps after some had run.
macro_rules! retryable {
    () => {
        concat!(
            "s.status IN (",
            crate::status::status_sql!(Failed),
            ", ",
            crate::status::status_sql!(Cancelled),
            ")
  AND (s.status = ",
            crate::status::status_sql!(Cancelled),
            " OR s.failed_step_id IS NOT NULL
       OR NOT EXISTS (SELECT 1 FROM steps_status x WHERE x.service_request_id = s.id))"
        )
    };
}

// For the restart of a fan-out step's children (`fan::RESTART`), retried as any request.
pub(crate) use {retry_set, retryable};

/// `$1` the request, `$2` its failed step's new request (or NULL); with its slot row
/// (`slots::follow!`: a retried request with a key waits for a slot again).
pub(super) const RETRY: &str = concat!(
    "WITH retried AS (UPDATE service_requests s SET ",
    retry_set!(),
    " WHERE s.id = $1 AND ",
    retryable!(),
    " RETURNING s.retries, s.headers, ",
    crate::store::slots::follows!("s"),
    "), ",
    crate::store::slots::follow!("retried"),
    " SELECT retries, headers, concurrency_key IS NOT NULL FROM retried"
);

/// A request's stored status, when it was not retried now.
pub(super) const STATUS: &str = "SELECT status FROM service_requests WHERE id = $1";

pub async fn retry(conn: &PgConn, id: Uuid, payload: Option<&str>) -> Result<Retried> {
    let stmt = conn.stmt(RETRY).await?;
    if let Some(row) = conn.client.query_opt(&stmt, &[&id, &payload]).await? {
        return Ok(Retried::Now {
            retries: row.get(0),
            headers: row.get(1),
            limited: row.get(2),
        });
    }
    let stmt = conn.stmt(STATUS).await?;
    Ok(match conn.client.query_opt(&stmt, &[&id]).await? {
        None => Retried::Unknown,
        Some(r) => match r.get::<_, RequestStatus>(0) {
            s if s.is_retryable() => Retried::NoFailedStep,
            status => Retried::NotRetryable { status },
        },
    })
}

/// Which requests a bulk retry takes: the search filters, FAILED or CANCELLED only.
#[derive(Debug, Clone)]
pub struct Bulk {
    pub workflow: Option<String>,
    /// Some of FAILED and CANCELLED.
    pub statuses: Vec<RequestStatus>,
    pub created_after: Option<std::time::SystemTime>,
    pub created_before: Option<std::time::SystemTime>,
    pub limit: i64,
}

/// `POST /serviceRequests/retry`: up to `$7` matches, newest first, retried in one
/// statement (rows another statement holds are skipped, not waited for: a retry of its
/// own may hold them); returns how many were retried and whether more matched.
pub(super) const RETRY_MATCHING: &str = concat!(
    "WITH candidates AS (
    SELECT s.id FROM service_requests s
    WHERE s.id >= $3 AND s.id < $4 AND s.status = ANY($1)
      AND ($5::text IS NULL OR s.workflow_name = $5)
      AND ($6::timestamptz IS NULL OR s.created_at > $6)
      AND ($8::timestamptz IS NULL OR s.created_at < $8)
      AND ",
    retryable!(),
    "
    ORDER BY s.id DESC LIMIT $7::bigint + 1
    FOR UPDATE SKIP LOCKED
), taken AS (
    SELECT id FROM candidates ORDER BY id DESC LIMIT $7::bigint
), retried AS (
    UPDATE service_requests s SET ",
    retry_set!(),
    " FROM taken t WHERE s.id = t.id AND ",
    retryable!(),
    " RETURNING ",
    crate::store::slots::follows!("s"),
    "
), ",
    crate::store::slots::follow!("retried"),
    "
SELECT (SELECT count(*) FROM retried), (SELECT count(*) FROM candidates) > $7::bigint"
);

pub async fn retry_matching(conn: &PgConn, b: &Bulk) -> Result<(i64, bool)> {
    // Planned for its values: how many rows a workflow or a status has decides the index.
    let no_payload: Option<&str> = None;
    let (lower, upper) = super::search::id_bounds(b.created_after, b.created_before);
    let row = conn
        .client
        .query_one(
            RETRY_MATCHING,
            &[
                &b.statuses,
                &no_payload,
                &lower,
                &upper,
                &b.workflow,
                &b.created_after,
                &b.limit,
                &b.created_before,
            ],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

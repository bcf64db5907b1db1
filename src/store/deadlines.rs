//! Answer deadlines of ASYNC steps (beyond Clamp): a step sent with an `answerTimeout`
//! pauses its request with the deadline as `lease_until` (no claim takes a PAUSED row),
//! indexed by `service_requests_answer_due` (migration 0018). Past it, any instance's
//! look (`due`) finds the request, and one statement (`expire`) records the timeout on
//! the step and resumes the request (to the same step again, or to its onFailure steps),
//! only if it is still PAUSED at that step and its deadline has passed: an answer that
//! comes at the same moment and the timeout resolve once, whichever commits first, and
//! the other changes nothing.

use uuid::Uuid;

use super::PgConn;
use super::Result;

/// `$1` how many: paused requests whose answer is overdue, the most overdue first.
pub(super) const DUE: &str = concat!(
    "SELECT id, current_step_id, step_attempts, workflow_name, coalesce(workflow_version, 1)
FROM service_requests
WHERE status = ",
    crate::status::status_sql!(Paused),
    " AND lease_until > '-infinity' AND lease_until < now()
ORDER BY lease_until LIMIT $1"
);

/// A paused request whose answer is overdue.
#[derive(Debug)]
pub struct Overdue {
    pub id: Uuid,
    pub step_id: u32,
    /// The attempt the step is at (1: its first send).
    pub attempts: u32,
    pub workflow_name: String,
    pub workflow_version: u32,
}

pub async fn due(conn: &PgConn, limit: i64) -> Result<Vec<Overdue>> {
    let stmt = conn.stmt(DUE).await?;
    Ok(conn
        .client
        .query(&stmt, &[&limit])
        .await?
        .iter()
        .map(|r| Overdue {
            id: r.get(0),
            step_id: r.get::<_, i32>(1).max(0) as u32,
            attempts: r.get::<_, i32>(2).max(0) as u32,
            workflow_name: r.get(3),
            workflow_version: r.get::<_, i32>(4).max(1) as u32,
        })
        .collect())
}

/// What a timeout does to its request.
pub struct Expire<'a> {
    pub id: Uuid,
    pub step_id: u32,
    /// The step to run next: the same one (a retry), an onFailure step, or 0 (none).
    pub next_step: u32,
    /// A retry: the attempts made so far, and why, kept on the row as a failed call's
    /// are; the step is sent again in `retry_in_ms`.
    pub retry: Option<(u32, &'a str, f64)>,
    /// When not retried: the failed step and the request's reason.
    pub failed_step: Option<u32>,
    pub reason: Option<&'a str>,
    /// The timed-out attempt's record: its error document and reason.
    pub step_response: &'a str,
    pub step_reason: &'a str,
}

/// `$1` id, `$2` step, `$3` next step, `$4` attempts kept (0: none), `$5` last error,
/// `$6` retry in ms (NULL: claimable at once), `$7` failed step, `$8` reason, `$9` the
/// step record's response, `$10` its reason. The request is RESUMED at its next step,
/// unleased: a retry keeps the step's own request (the row's), an onFailure step gets
/// the failed step's (its record's), as a posted failure gives it.
pub(super) const EXPIRE: &str = concat!(
    "\
WITH expired AS (
    UPDATE service_requests SET status = ",
    crate::status::status_sql!(Resumed),
    ", current_step_id = $3,
        step_request = CASE WHEN $3 = $2 THEN step_request ELSE
            (SELECT NULLIF(request, '') FROM steps_status
             WHERE service_request_id = $1 AND step_id = $2 ORDER BY id DESC LIMIT 1) END,
        failed_step_id = $7, reason = $8, updated_at = now(),
        step_attempts = $4, last_error = $5, wait_event = NULL, wait_key = NULL, wait_next = NULL,
        lease_owner = NULL,
        lease_until = CASE WHEN $6::float8 IS NULL THEN '-infinity'::timestamptz ELSE ",
    crate::store::sql::now_plus_ms!("$6"),
    " END
    WHERE id = $1 AND status = ",
    crate::status::status_sql!(Paused),
    " AND current_step_id = $2
      AND lease_until > '-infinity' AND lease_until < now()
    RETURNING id
), recorded AS (
    UPDATE steps_status SET status = ",
    crate::status::status_sql!(Failed),
    ", response = $9, reason = $10, finished_at = now(),
        time_taken_ms = round(extract(epoch FROM now() - started_at) * 1000)::bigint
    WHERE service_request_id = $1 AND step_id = $2 AND status = ",
    crate::status::status_sql!(Started),
    "
      AND EXISTS (SELECT 1 FROM expired)
)
SELECT count(*) FROM expired"
);

/// Applies `e`; true when the request was still waiting at that step past its deadline
/// (false: an answer, a cancel or another instance got there first).
pub async fn expire(conn: &PgConn, e: &Expire<'_>) -> Result<bool> {
    let stmt = conn.stmt(EXPIRE).await?;
    let (attempts, last_error, retry_in_ms) = match e.retry {
        Some((n, why, ms)) => (n as i32, Some(why), Some(ms)),
        None => (0, None, None),
    };
    let row = conn
        .client
        .query_one(
            &stmt,
            &[
                &e.id,
                &(e.step_id as i32),
                &(e.next_step as i32),
                &attempts,
                &last_error,
                &retry_in_ms,
                &e.failed_step.map(|s| s as i32),
                &e.reason,
                &e.step_response,
                &e.step_reason,
            ],
        )
        .await?;
    Ok(row.get::<_, i64>(0) == 1)
}

//! The statements that apply a step response: reading where a request stands, the one
//! statement that records the answer and resumes the request, and whether a step was
//! answered already.

use uuid::Uuid;

use super::leases::Claimed;
use super::PgConn;
use super::Result;

/// Where a request stands, as a step response needs to know it.
pub struct RequestState {
    pub workflow_name: String,
    pub workflow_version: u32,
    pub status: crate::status::RequestStatus,
    pub current_step_id: i32,
}

pub(super) const REQUEST_STATE: &str =
    "SELECT workflow_name, status, current_step_id, coalesce(workflow_version, 1) FROM service_requests \
     WHERE id = $1";

/// The request's workflow, stored status and current step, or None when there is no
/// such request.
pub async fn request_state(conn: &PgConn, id: Uuid) -> Result<Option<RequestState>> {
    let stmt = conn.stmt(REQUEST_STATE).await?;
    Ok(conn
        .client
        .query_opt(&stmt, &[&id])
        .await?
        .map(|row| RequestState {
            workflow_name: row.get(0),
            status: row.get(1),
            current_step_id: row.get(2),
            workflow_version: row.get::<_, i32>(3).max(1) as u32,
        }))
}

/// What resuming a paused request writes.
pub struct Resume<'a> {
    pub id: Uuid,
    /// The ASYNC step being answered.
    pub step_id: u32,
    /// The step to run next (0: none left).
    pub next_step: u32,
    /// That step's request (None: the answered step's own request, for onFailure steps).
    pub next_request: Option<&'a str>,
    pub failed_step: Option<u32>,
    pub reason: Option<&'a str>,
    /// The answered step's final status, response and reason.
    pub step_status: crate::status::StepStatus,
    pub step_response: &'a str,
    pub step_reason: Option<&'a str>,
    /// Lease the request to this owner (its executor has a slot for it), or leave it free.
    pub owner: Option<Uuid>,
    pub lease_ms: f64,
}

/// Records the answer on the step and marks the request RESUMED at its next step, only if
/// it is PAUSED at exactly this step; leased to `owner` in the same statement when given.
pub(super) const RESUME: &str = concat!("\
WITH resumed AS (
    UPDATE service_requests SET status = ", crate::status::status_sql!(Resumed), ", current_step_id = $3,
        -- '' marks the payload in a record, NULL in the row (see sql::step_request).
        step_request = COALESCE($4, (SELECT NULLIF(request, '') FROM steps_status
                                     WHERE service_request_id = $1 AND step_id = $2 ORDER BY id DESC LIMIT 1)),
        failed_step_id = $5, reason = $6, updated_at = now(),
        step_attempts = 0, last_error = NULL,
        -- Leased to this instance when it has room to continue the request at once;
        -- otherwise free for any sweeper.
        lease_owner = $10,
        lease_until = CASE WHEN $10::uuid IS NULL THEN '-infinity'::timestamptz
                           ELSE ", crate::store::sql::now_plus_ms!("$11"), " END
    WHERE id = $1 AND status = ", crate::status::status_sql!(Paused), " AND current_step_id = $2
    RETURNING ",
    crate::store::sql::claimed_columns!("service_requests"),
    "
), answered AS (
    UPDATE steps_status SET status = $7, response = $8, reason = $9, finished_at = now(),
        time_taken_ms = round(extract(epoch FROM now() - started_at) * 1000)::bigint
    WHERE service_request_id = $1 AND step_id = $2 AND status = ", crate::status::status_sql!(Started), "
      AND EXISTS (SELECT 1 FROM resumed)
)
SELECT * FROM resumed");

/// Applies `r`; the resumed request as claimed, or None when it was not paused at that step.
pub async fn resume(conn: &PgConn, r: &Resume<'_>) -> Result<Option<Claimed>> {
    let stmt = conn.stmt(RESUME).await?;
    let row = conn
        .client
        .query_opt(
            &stmt,
            &[
                &r.id,
                &(r.step_id as i32),
                &(r.next_step as i32),
                &r.next_request,
                &r.failed_step.map(|s| s as i32),
                &r.reason,
                &r.step_status,
                &r.step_response,
                &r.step_reason,
                &r.owner,
                &r.lease_ms,
            ],
        )
        .await?;
    Ok(row.as_ref().map(Claimed::from_row))
}

pub(super) const ANSWERED: &str = concat!(
    "SELECT EXISTS (SELECT 1 FROM steps_status WHERE service_request_id = $1 \
     AND step_id = $2 AND status IN (",
    crate::status::status_sql!(Completed),
    ", ",
    crate::status::status_sql!(Failed),
    "))"
);

/// Whether the step has a final answer recorded already.
pub async fn answered(conn: &PgConn, id: Uuid, step_id: u32) -> Result<bool> {
    let stmt = conn.stmt(ANSWERED).await?;
    Ok(conn
        .client
        .query_one(&stmt, &[&id, &(step_id as i32)])
        .await?
        .get(0))
}

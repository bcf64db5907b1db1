//! Retrying a FAILED or CANCELLED request in place (beyond Clamp): one fenced statement
//! makes it runnable again from the step that failed (or, cancelled, the step that was
//! next), with that step's recorded request or a new one; any instance's sweeper then
//! claims it, and the steps that completed are not called again. The row lock and the
//! status condition make two concurrent retries start it once.

use uuid::Uuid;

use super::PgConn;
use super::Result;

/// What a retry did.
#[derive(Debug, PartialEq, Eq)]
pub enum Retried {
    /// Runnable again; this many retries so far.
    Now {
        retries: i32,
    },
    /// Not FAILED or CANCELLED (it is running, paused, or completed): its status.
    NotRetryable {
        status: String,
    },
    /// It failed outside any step after steps had run (its outcome could not be stored):
    /// where to continue is not known.
    NoFailedStep,
    Unknown,
}

/// `$1` the request, `$2` the request the step gets instead of its recorded one (or NULL).
/// A request that failed at no step and ran none starts again from its first step (1).
const RETRY: &str = "\
UPDATE service_requests s SET
    status = 'NEW',
    current_step_id = CASE WHEN s.status = 'FAILED' THEN coalesce(s.failed_step_id, 1)
                           ELSE greatest(s.current_step_id, 1) END,
    step_request = CASE
        WHEN $2::text IS NOT NULL THEN $2
        WHEN s.status = 'FAILED' AND s.failed_step_id IS NOT NULL THEN
            (SELECT st.request FROM steps_status st
             WHERE st.service_request_id = s.id AND st.step_id = s.failed_step_id
             ORDER BY st.id DESC LIMIT 1)
        WHEN s.status = 'FAILED' THEN NULL
        ELSE s.step_request END,
    failed_step_id = NULL, reason = NULL, finished_at = NULL, step_attempts = 0,
    last_error = NULL, retries = s.retries + 1, updated_at = now(),
    lease_owner = NULL, lease_until = '-infinity'
WHERE s.id = $1 AND s.status IN ('FAILED', 'CANCELLED')
  AND (s.status = 'CANCELLED' OR s.failed_step_id IS NOT NULL
       OR NOT EXISTS (SELECT 1 FROM steps_status x WHERE x.service_request_id = s.id))
RETURNING s.retries";

pub async fn retry(conn: &PgConn, id: Uuid, payload: Option<&str>) -> Result<Retried> {
    let stmt = conn.stmt(RETRY).await?;
    if let Some(row) = conn.client.query_opt(&stmt, &[&id, &payload]).await? {
        return Ok(Retried::Now {
            retries: row.get(0),
        });
    }
    let stmt = conn
        .stmt("SELECT status FROM service_requests WHERE id = $1")
        .await?;
    Ok(match conn.client.query_opt(&stmt, &[&id]).await? {
        None => Retried::Unknown,
        Some(r) => match r.get::<_, String>(0) {
            s if s == "FAILED" || s == "CANCELLED" => Retried::NoFailedStep,
            status => Retried::NotRetryable { status },
        },
    })
}

//! Cancelling a service request: written at once, whichever instance holds its lease.
//! The lease is taken away in the same update, and every executor write is fenced on the
//! lease and the status, so the holder stops at its next write; a cancelled request is
//! never claimed again (the claim reads runnable statuses only). Its unfinished child
//! requests (WORKFLOW steps) are cancelled with it.

use uuid::Uuid;

use super::PgConn;
use super::Result;

/// What a cancel did.
#[derive(Debug, PartialEq, Eq)]
pub enum Cancelled {
    /// Cancelled now.
    Now,
    /// It was cancelled before (cancelling is idempotent).
    Already {
        reason: Option<String>,
    },
    /// It had finished: COMPLETED or FAILED.
    Finished {
        status: String,
    },
    Unknown,
}

pub async fn cancel(conn: &PgConn, id: Uuid, reason: &str) -> Result<Cancelled> {
    let stmt = conn
        .stmt(
            // The request and, in the same statement, its unfinished child requests
            // (WORKFLOW steps), theirs, and so on down.
            "WITH RECURSIVE tree AS ( \
                 SELECT $1::uuid AS id \
                 UNION ALL \
                 SELECT c.id FROM service_requests c JOIN tree t ON c.parent_id = t.id \
                 WHERE c.parent_id IS NOT NULL \
             ), done AS ( \
                 UPDATE service_requests SET status = 'CANCELLED', \
                 reason = CASE WHEN id = $1 THEN $2 ELSE 'its parent was cancelled: ' || $2 END, \
                 finished_at = now(), updated_at = now(), lease_owner = NULL, lease_until = '-infinity' \
                 WHERE id IN (SELECT id FROM tree) \
                   AND status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED') \
                 RETURNING id \
             ) SELECT count(*) FROM done WHERE id = $1",
        )
        .await?;
    if conn
        .client
        .query_one(&stmt, &[&id, &reason])
        .await?
        .get::<_, i64>(0)
        == 1
    {
        return Ok(Cancelled::Now);
    }
    // Not cancelled now: a final status never changes again, so this read is not racy.
    let stmt = conn
        .stmt("SELECT status, reason FROM service_requests WHERE id = $1")
        .await?;
    Ok(match conn.client.query_opt(&stmt, &[&id]).await? {
        None => Cancelled::Unknown,
        Some(r) if r.get::<_, &str>(0) == "CANCELLED" => Cancelled::Already { reason: r.get(1) },
        Some(r) => Cancelled::Finished { status: r.get(0) },
    })
}

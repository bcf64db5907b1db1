//! Notifications (beyond Clamp) in Postgres: the outbox rows the statements that finish a
//! request write when it reaches a status its workflow tells of (migration 28), claimed
//! by the deliverer (`engine::notify`) in order per request; what came of a round's
//! deliveries is stored in one statement.

use uuid::Uuid;

use super::PgConn;
use super::Result;
use crate::status::RequestStatus;

/// A notification to deliver, with what its body tells.
#[derive(Debug)]
pub struct Due {
    pub id: i64,
    pub service_request_id: Uuid,
    pub workflow_name: String,
    pub workflow_version: i32,
    pub status: RequestStatus,
    pub reason: Option<String>,
    /// Attempts made, this one included.
    pub attempts: i32,
    pub finished_at: String,
    /// None: the request was deleted by retention since.
    pub created_at: Option<String>,
    pub labels: Option<Vec<String>>,
    /// Its last step's response, as stored.
    pub response: Option<String>,
}

/// A notification as a request's readers see it.
#[derive(Debug)]
pub struct Told {
    pub id: i64,
    pub status: RequestStatus,
    pub state: String,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub finished_at: String,
    pub delivered_at: Option<String>,
}

/// Takes up to `$1` notifications that are due, each the oldest pending of its request,
/// and holds them for `$2` ms (a deliverer that dies lets them come due again).
///
/// The `$1` first due rows no other deliverer holds are the candidates, and of those only
/// the oldest pending of its request is taken (the others wait for it). Written as `NOT EXISTS` over the due
/// rows, a plan made while the table was small (statistics saying a few hundred pending)
/// joined every candidate against every pending row, 14 M comparisons and 1.5 s per claim
/// with 60,000 pending; bounded candidates and a correlated scalar subquery make one
/// probe of `notifications_of_request` per candidate, and keep the plan's cost under
/// JIT's threshold. "Pending" is written there as neither delivered nor failed, which
/// `notifications_due`'s predicate does not match: with `state = 'pending'` the same
/// stale statistics had each probe read that whole partial index (56,000 entries,
/// 2 ms per candidate).
pub(super) const CLAIM: &str = "\
WITH cand AS (
    SELECT n.id, n.service_request_id FROM notifications n
    WHERE n.state = 'pending' AND n.next_at <= now()
    ORDER BY n.next_at, n.id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), due AS (
    SELECT c.id FROM cand c
    WHERE c.id = (SELECT min(e.id) FROM notifications e
                  WHERE e.service_request_id = c.service_request_id
                    AND e.state NOT IN ('delivered', 'failed'))
)
UPDATE notifications x SET next_at = now() + $2::float8 * interval '1 millisecond',
                           attempts = x.attempts + 1
FROM due WHERE x.id = due.id
RETURNING x.id, x.service_request_id, x.workflow_name, x.workflow_version, x.status, x.reason,
          x.attempts, to_json(x.finished_at) #>> '{}',
          (SELECT to_json(r.created_at) #>> '{}' FROM service_requests r
           WHERE r.id = x.service_request_id),
          (SELECT r.labels FROM service_requests r WHERE r.id = x.service_request_id),
          (SELECT s.response FROM steps_status s
           WHERE s.service_request_id = x.service_request_id AND s.step_id > 0
           ORDER BY s.id DESC LIMIT 1)";

/// `$1`: the notifications delivered in one round.
pub(super) const DELIVERED: &str = "\
UPDATE notifications SET state = 'delivered', delivered_at = now(), last_error = NULL
WHERE id = ANY($1)";

/// Another attempt in `$2` ms, with why this one failed.
pub(super) const AGAIN: &str = "\
UPDATE notifications SET next_at = now() + $2::float8 * interval '1 millisecond',
                         last_error = $3
WHERE id = $1";

pub(super) const FAILED: &str =
    "UPDATE notifications SET state = 'failed', last_error = $2 WHERE id = $1";

pub(super) const OF_REQUEST: &str = "\
SELECT id, status, state, attempts, last_error, to_json(finished_at) #>> '{}',
       to_json(delivered_at) #>> '{}'
FROM notifications WHERE service_request_id = $1 ORDER BY id LIMIT 100";

pub async fn claim(conn: &PgConn, limit: i64, hold_ms: f64) -> Result<Vec<Due>> {
    let stmt = conn.stmt(CLAIM).await?;
    let rows = conn.client.query(&stmt, &[&limit, &hold_ms]).await?;
    Ok(rows
        .iter()
        .map(|r| Due {
            id: r.get(0),
            service_request_id: r.get(1),
            workflow_name: r.get(2),
            workflow_version: r.get(3),
            status: r.get(4),
            reason: r.get(5),
            attempts: r.get(6),
            finished_at: r.get(7),
            created_at: r.get(8),
            labels: r.get(9),
            response: r.get(10),
        })
        .collect())
}

/// Marks a round's delivered notifications, in one statement.
pub async fn delivered(conn: &PgConn, ids: &[i64]) -> Result<()> {
    let stmt = conn.stmt(DELIVERED).await?;
    conn.client.execute(&stmt, &[&ids]).await?;
    Ok(())
}

pub async fn again(conn: &PgConn, id: i64, in_ms: f64, why: &str) -> Result<()> {
    let stmt = conn.stmt(AGAIN).await?;
    conn.client.execute(&stmt, &[&id, &in_ms, &why]).await?;
    Ok(())
}

pub async fn failed(conn: &PgConn, id: i64, why: &str) -> Result<()> {
    let stmt = conn.stmt(FAILED).await?;
    conn.client.execute(&stmt, &[&id, &why]).await?;
    Ok(())
}

/// A request's notifications, oldest first (at most 100).
pub async fn of_request(conn: &PgConn, id: Uuid) -> Result<Vec<Told>> {
    let stmt = conn.stmt(OF_REQUEST).await?;
    let rows = conn.client.query(&stmt, &[&id]).await?;
    Ok(rows
        .iter()
        .map(|r| Told {
            id: r.get(0),
            status: r.get(1),
            state: r.get(2),
            attempts: r.get(3),
            last_error: r.get(4),
            finished_at: r.get(5),
            delivered_at: r.get(6),
        })
        .collect())
}

//! Child service requests (a step of mode WORKFLOW). Starting one is one statement,
//! fenced on the parent's lease like every executor write: the parent pauses at the step
//! (its record STARTED, naming the child) and the child's row is inserted, unleased, for
//! any sweeper; a crash before it commits leaves neither, and the step runs again. A
//! child that finishes is "untold" until its outcome has been applied to the parent as
//! the step's answer; whoever finds it (the executor that finished it, or any
//! instance's reporter) applies it, and a parent no longer waiting makes it told too.

use uuid::Uuid;

use super::PgConn;
use super::Result;

/// A child to start.
pub struct Start<'a> {
    pub parent: Uuid,
    pub owner: Uuid,
    pub step_id: u32,
    pub step_name: &'a str,
    /// The step's request: the child's payload.
    pub request: &'a str,
    pub started_ms: f64,
    pub attempts: u32,
    pub child: Uuid,
    pub workflow: &'a str,
    /// 0: the latest version when the child is stored.
    pub version: u32,
    /// The child's own deadline (its workflow's), in ms from now (None: none).
    pub deadline_ms: Option<f64>,
    /// The final statuses its workflow tells of (`workflow::notify::mask`; None: none).
    pub notify: Option<i16>,
}

pub(super) const START: &str = concat!(
    "\
WITH ",
    crate::store::sql::pause_for_children!(),
    ", record AS (
    INSERT INTO steps_status (service_request_id, step_id, step_name, status, request,
                              started_at, attempts, child_id)
    SELECT id, $2, $4, ",
    crate::status::status_sql!(Started),
    ", $5, to_timestamp($6::float8 / 1000.0), $7, $8 FROM fenced
), child AS (
    INSERT INTO service_requests (id, workflow_name, payload, headers, lease_owner, lease_until,
                                  workflow_version, parent_id, parent_step_id, parent_told,
                                  deadline, priority, labels, notify)
    SELECT $8, $9, $5, f.headers, NULL, '-infinity', ",
    crate::store::sql::pinned_version!("$10", "w.version"),
    ", $1, $2, false, ",
    crate::store::sql::now_plus_ms!("$11"),
    ", f.priority, f.labels, $12::smallint
    FROM fenced f LEFT JOIN workflows w ON w.name = $9
    RETURNING id
)
SELECT count(*) FROM child"
);

/// Starts the child; false when the parent's lease is lost or it was cancelled.
pub async fn start(conn: &PgConn, s: &Start<'_>) -> Result<bool> {
    let stmt = conn.stmt(START).await?;
    let row = conn
        .client
        .query_one(
            &stmt,
            &[
                &s.parent,
                &(s.step_id as i32),
                &s.owner,
                &s.step_name,
                &s.request,
                &s.started_ms,
                &(s.attempts as i32),
                &s.child,
                &s.workflow,
                &(s.version as i32),
                &s.deadline_ms,
                &s.notify,
            ],
        )
        .await?;
    Ok(row.get::<_, i64>(0) == 1)
}

/// A finished child whose parent has not heard.
#[derive(Debug)]
pub struct Untold {
    pub id: Uuid,
    pub parent: Uuid,
    pub parent_step: u32,
    pub status: crate::status::RequestStatus,
    pub reason: Option<String>,
    /// Its last answer (the last step that completed or passed its request on).
    pub response: Option<String>,
    /// Its branch or item index, for a child of a fan-out step (`store::fan`).
    pub fan_index: Option<i32>,
}

/// Finished children whose parents have not heard, oldest first (`$1`: how many), with
/// each one's last answer (the last step that completed or passed its request on).
pub(super) const UNTOLD: &str = concat!(
    "SELECT c.id, c.parent_id, c.parent_step_id, c.status, c.reason,
       (SELECT st.response FROM steps_status st
        WHERE st.service_request_id = c.id AND st.status IN (",
    crate::status::status_sql!(Completed),
    ", ",
    crate::status::status_sql!(Skipped),
    ")
        ORDER BY st.id DESC LIMIT 1), c.fan_index
FROM service_requests c
WHERE c.parent_id IS NOT NULL AND NOT c.parent_told
  AND c.status IN (",
    crate::status::status_sql!(Completed),
    ", ",
    crate::status::status_sql!(Failed),
    ", ",
    crate::status::status_sql!(Cancelled),
    ")
ORDER BY c.id LIMIT $1"
);

/// Up to `limit` finished children whose parents have not heard, oldest first.
pub async fn untold(conn: &PgConn, limit: i64) -> Result<Vec<Untold>> {
    let stmt = conn.stmt(UNTOLD).await?;
    Ok(conn
        .client
        .query(&stmt, &[&limit])
        .await?
        .iter()
        .map(|r| Untold {
            id: r.get(0),
            parent: r.get(1),
            parent_step: r.get::<_, i32>(2).max(0) as u32,
            status: r.get(3),
            reason: r.get(4),
            response: r.get(5),
            fan_index: r.get(6),
        })
        .collect())
}

pub(super) const TOLD: &str = "UPDATE service_requests SET parent_told = true WHERE id = $1";

/// Records that the parent of `child` has its outcome (or no longer waits for it).
pub async fn told(conn: &PgConn, child: Uuid) -> Result<()> {
    let stmt = conn.stmt(TOLD).await?;
    conn.client.execute(&stmt, &[&child]).await?;
    Ok(())
}

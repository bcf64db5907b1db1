//! What a failing request's compensations are read from (beyond Clamp): the last record
//! of each of its steps, so the engine knows which completed (and what each answered,
//! which its compensation receives) and which compensations failed. Read only when a
//! request of a workflow with `compensate` steps fails, or continues failing.

use uuid::Uuid;

use super::{PgConn, Result};
use crate::status::StepStatus;

/// `$1` request: each step's last record (its lanes' records have ids no step has).
pub(super) const LAST_RECORDS: &str = "SELECT DISTINCT ON (step_id) step_id, status, response \
     FROM steps_status WHERE service_request_id = $1 AND step_id > 0 \
     ORDER BY step_id, id DESC";

/// A step's last record.
#[derive(Debug)]
pub struct LastRecord {
    pub step_id: u32,
    pub status: StepStatus,
    pub response: Option<String>,
}

pub async fn last_records(conn: &PgConn, id: Uuid) -> Result<Vec<LastRecord>> {
    let stmt = conn.stmt(LAST_RECORDS).await?;
    Ok(conn
        .client
        .query(&stmt, &[&id])
        .await?
        .iter()
        .map(|r| LastRecord {
            step_id: r.get::<_, i32>(0).max(0) as u32,
            status: r.get(1),
            response: r.get(2),
        })
        .collect())
}

/// `$1` parent, `$2` fan-out step: its children that completed or were cancelled, with
/// their workflow and version (the one that failed undid its own as it failed).
pub(super) const UNDOABLE: &str = concat!(
    "SELECT c.id, c.workflow_name, coalesce(c.workflow_version, 1) FROM service_requests c
WHERE c.parent_id = $1 AND c.parent_step_id = $2 AND c.fan_index IS NOT NULL
  AND c.status IN (",
    crate::status::status_sql!(Completed),
    ", ",
    crate::status::status_sql!(Cancelled),
    ")"
);

/// A child whose steps may be undone.
#[derive(Debug)]
pub struct Undoable {
    pub id: Uuid,
    pub workflow: String,
    pub version: i32,
}

pub async fn undoable(conn: &PgConn, parent: Uuid, step_id: u32) -> Result<Vec<Undoable>> {
    let stmt = conn.stmt(UNDOABLE).await?;
    Ok(conn
        .client
        .query(&stmt, &[&parent, &(step_id as i32)])
        .await?
        .iter()
        .map(|r| Undoable {
            id: r.get(0),
            workflow: r.get(1),
            version: r.get(2),
        })
        .collect())
}

/// `$1` parent, `$2` fan-out step, `$3` the parent's lease owner, `$4` children, `$5`
/// their reason: the children (still completed or cancelled) are asked to compensate
/// (failed step 0, from their first compensation, claimable), and, when any was, the
/// parent waits for them at the step as it waited for their outcomes: paused there, its
/// join counting them again (every failure tolerated: none cancels the others). Fenced
/// on the parent's lease. Returns whether it held, and how many children were asked.
pub(super) const UNDO_CHILDREN: &str = concat!(
    "\
WITH held AS (
    SELECT 1 FROM service_requests p WHERE p.id = $1 AND p.lease_owner = $3 AND p.status <> ",
    crate::status::status_sql!(Cancelled),
    "
), kids AS (
    UPDATE service_requests c SET status = ",
    crate::status::status_sql!(InProgress),
    ", failed_step_id = 0, current_step_id = 0, step_request = NULL, reason = $5,
           finished_at = NULL, parent_told = false, step_attempts = 0, last_error = NULL,
           lease_owner = NULL, lease_until = '-infinity', updated_at = now()
    WHERE c.id = ANY($4) AND c.parent_id = $1 AND c.parent_step_id = $2 AND EXISTS (SELECT 1 FROM held)
      AND c.status IN (",
    crate::status::status_sql!(Completed),
    ", ",
    crate::status::status_sql!(Cancelled),
    ")
    RETURNING 1
), n AS (SELECT count(*) AS n FROM kids
), paused AS (
    UPDATE service_requests s SET status = ",
    crate::status::status_sql!(Paused),
    ", current_step_id = $2, updated_at = now(), step_attempts = 0,
           lease_owner = NULL, lease_until = '-infinity'
    FROM n WHERE s.id = $1 AND s.lease_owner = $3 AND n.n > 0
    RETURNING 1
), joined AS (
    UPDATE fan_joins j SET finished = j.finished - n.n, tolerated = j.total, done = false
    FROM n WHERE j.parent_id = $1 AND j.step_id = $2 AND n.n > 0
    RETURNING 1
)
SELECT (SELECT count(*) FROM held), (SELECT n FROM n)"
);

/// Asks `children` of a fan-out step to compensate (`UNDO_CHILDREN`): None when the
/// parent's lease is lost, else how many were asked (the parent waits when any was).
pub async fn undo_children(
    conn: &PgConn,
    parent: Uuid,
    step_id: u32,
    owner: Uuid,
    children: &[Uuid],
    reason: &str,
) -> Result<Option<i64>> {
    let stmt = conn.stmt(UNDO_CHILDREN).await?;
    let row = conn
        .client
        .query_one(
            &stmt,
            &[&parent, &(step_id as i32), &owner, &children, &reason],
        )
        .await?;
    Ok((row.get::<_, i64>(0) > 0).then(|| row.get(1)))
}

/// `$1` parent, `$2` fan-out step, `$3` the step it goes on to (0: none, it ends): a
/// failing request whose children compensated goes on with its compensations (claimable),
/// while it still waits at that step.
pub(super) const GO_ON: &str = concat!(
    "UPDATE service_requests SET status = ",
    crate::status::status_sql!(Resumed),
    ", current_step_id = $3, step_attempts = 0, updated_at = now(),
       lease_owner = NULL, lease_until = '-infinity'
WHERE id = $1 AND current_step_id = $2 AND failed_step_id IS NOT NULL AND status = ",
    crate::status::status_sql!(Paused)
);

pub async fn go_on(conn: &PgConn, parent: Uuid, step_id: u32, next: u32) -> Result<bool> {
    let stmt = conn.stmt(GO_ON).await?;
    Ok(conn
        .client
        .execute(&stmt, &[&parent, &(step_id as i32), &(next as i32)])
        .await?
        > 0)
}

//! Rerunning a request (beyond Clamp): a new request of the same workflow whose steps
//! before the chosen one are copies of the original's outcomes (recorded, not called),
//! and which runs from that step. One statement inserts the row and its copied step
//! records, so a rerun exists whole or not at all; the row is unleased and NEW at its
//! step, so any instance's sweeper claims it and continues it like a request after a
//! restart (its context rebuilt from those records).

use uuid::Uuid;

use super::PgConn;
use super::Result;

/// The original request, as a rerun needs it.
#[derive(Debug)]
pub struct Source {
    pub workflow_name: String,
    /// The version it ran, which the rerun runs too (the copied outcomes are its steps').
    pub workflow_version: u32,
    pub payload: String,
    pub headers: String,
    /// Its labels (empty: none).
    pub labels: Vec<String>,
    /// The last record of each step it has one for, by step id.
    pub last: Vec<Record>,
}

/// A step's last record in the original.
#[derive(Debug)]
pub struct Record {
    /// The record's own id (`steps_status.id`), for the copy.
    pub record_id: i64,
    pub step_id: u32,
    /// COMPLETED, SKIPPED, FAILED or STARTED.
    pub status: crate::status::StepStatus,
    /// What the step answered (a skipped step: what it passed on).
    pub response: Option<String>,
}

/// The original request: what a rerun copies.
pub(super) const SOURCE: &str =
    "SELECT workflow_name, payload, headers, coalesce(workflow_version, 1), labels \
     FROM service_requests WHERE id = $1";

/// The last record of each of the original's steps (a lane's steps are not copied: the
/// fan-out step's own record holds their joined answer).
pub(super) const LAST_RECORDS: &str =
    "SELECT DISTINCT ON (step_id) id, step_id, status, response FROM steps_status \
     WHERE service_request_id = $1 AND step_id > 0 ORDER BY step_id, id DESC";

pub async fn source(conn: &PgConn, id: Uuid) -> Result<Option<Source>> {
    let stmt = conn.stmt(SOURCE).await?;
    let Some(row) = conn.client.query_opt(&stmt, &[&id]).await? else {
        return Ok(None);
    };
    let stmt = conn.stmt(LAST_RECORDS).await?;
    let last = conn
        .client
        .query(&stmt, &[&id])
        .await?
        .iter()
        .map(|r| Record {
            record_id: r.get(0),
            step_id: r.get::<_, i32>(1).max(0) as u32,
            status: r.get(2),
            response: r.get(3),
        })
        .collect();
    Ok(Some(Source {
        workflow_name: row.get(0),
        payload: row.get(1),
        headers: row.get(2),
        workflow_version: row.get::<_, i32>(3).max(1) as u32,
        labels: row.get::<_, Option<Vec<String>>>(4).unwrap_or_default(),
        last,
    }))
}

/// A rerun to insert.
pub struct Rerun<'a> {
    pub id: Uuid,
    pub of: Uuid,
    pub workflow_name: &'a str,
    pub workflow_version: u32,
    pub payload: &'a str,
    pub headers: &'a str,
    /// The step it runs first, and the request that step receives.
    pub from_step: u32,
    pub step_request: &'a str,
    /// The original's records to copy, in the order the steps ran.
    pub copied: Vec<i64>,
}

/// `$1` new id, `$2` original, `$3` workflow, `$4` payload, `$5` headers, `$6` first step,
/// `$7` its request, `$8` the records to copy (in order), `$9` the note they carry, `$10`
/// the workflow version.
pub(super) const INSERT: &str = concat!(
    "\
WITH run AS (
    INSERT INTO service_requests (id, workflow_name, status, payload, headers,
                                  current_step_id, step_request, rerun_of,
                                  lease_owner, lease_until, workflow_version, deadline,
                                  concurrency_key, priority, labels, notify)
    VALUES ($1, $3, ",
    crate::status::status_sql!(New),
    ", $4, $5, $6, $7, $2, NULL,
            -- With the original's concurrency key, it waits for a slot (`slots`).
            CASE WHEN (SELECT o.concurrency_key FROM service_requests o WHERE o.id = $2) IS NULL
                 THEN '-infinity'::timestamptz ELSE 'infinity'::timestamptz END,
            NULLIF($10, 1),
            -- The original's deadline, as long again from now.
            (SELECT now() + (o.deadline - coalesce(o.start_at, o.created_at))
             FROM service_requests o WHERE o.id = $2),
            (SELECT o.concurrency_key FROM service_requests o WHERE o.id = $2),
            (SELECT o.priority FROM service_requests o WHERE o.id = $2),
            (SELECT o.labels FROM service_requests o WHERE o.id = $2),
            (SELECT o.notify FROM service_requests o WHERE o.id = $2))
    RETURNING ",
    crate::store::slots::follows!(),
    "), ",
    // With a key, its slot row, in its key's queue (no trigger writes it, migration 36).
    crate::store::slots::follow!("run"),
    "
INSERT INTO steps_status (service_request_id, step_id, step_name, status, request, response,
                          started_at, finished_at, time_taken_ms, reason, attempts)
-- A record's request is copied as it is, the payload's mark ('', sql::step_request)
-- included: records are copied only for a rerun from a later step, whose payload is
-- the original's (http::rerun::plan).
SELECT run.id, st.step_id, st.step_name, st.status, st.request, st.response,
       now(), now(), 0, $9, st.attempts
FROM run, unnest($8::bigint[]) WITH ORDINALITY AS c(record_id, n)
JOIN steps_status st ON st.service_request_id = $2 AND st.id = c.record_id
ORDER BY c.n"
);

pub async fn insert(conn: &PgConn, r: &Rerun<'_>) -> Result<()> {
    let stmt = conn.stmt(INSERT).await?;
    let note = format!("copied from {} (not called)", r.of);
    conn.client
        .execute(
            &stmt,
            &[
                &r.id,
                &r.of,
                &r.workflow_name,
                &r.payload,
                &r.headers,
                &(r.from_step as i32),
                &r.step_request,
                &r.copied,
                &note,
                &(r.workflow_version as i32),
            ],
        )
        .await?;
    Ok(())
}

//! Step transitions: the executor's one write per finished step, fenced on its lease and
//! on the request not being cancelled (`engine::writer` batches them).

use std::time::Duration;

use postgres_types::ToSql;

use crate::status::{RequestStatus, StepStatus};
use uuid::Uuid;

use super::pool::PgConn;
use super::Result;
use super::StoreError;

/// Longest a batch of transitions may take before it counts as unavailable.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The statement: fence on the lease, update the request row, insert the step record;
/// `$returning` is what the fenced update returns (its id first), `$more` CTEs more (or
/// nothing).
macro_rules! write_transitions {
    ($returning:expr, $more:expr) => { concat!("\
WITH input AS (
    -- One array of rows (migration 15's type), not an array per column.
    SELECT * FROM UNNEST($1::step_transition[])
), fenced AS (
    UPDATE service_requests s SET
        -- Between steps the stored status stays NEW (or RESUMED): status is in the claim
        -- index's predicate, so leaving it alone lets the update be HOT (no index writes).
        -- Reads show such a request as IN_PROGRESS.
        status = CASE WHEN i.status = ", crate::status::status_sql!(InProgress), " THEN s.status ELSE i.status END,
        current_step_id = i.next_step, step_request = i.next_request,
        failed_step_id = i.failed_step, reason = i.reason, updated_at = now(),
        step_attempts = i.attempts, last_error = i.last_error,
        finished_at = CASE WHEN i.status IN (", crate::status::status_sql!(Completed), ", ", crate::status::status_sql!(Failed), ", ", crate::status::status_sql!(Cancelled), ") THEN now() END,
        lease_owner = CASE WHEN i.release THEN NULL ELSE s.lease_owner END,
        -- A pending retry waits unowned until it is due; the sweeper claims it then.
        lease_until = CASE WHEN i.retry_in_ms IS NOT NULL
                           THEN ", crate::store::sql::now_plus_ms!("i.retry_in_ms"), "
                           WHEN i.release THEN '-infinity'::timestamptz ELSE s.lease_until END
    FROM input i
    -- The fence: still leased to this instance, and not cancelled meanwhile.
    WHERE s.id = i.id AND s.lease_owner = $2 AND s.status <> ", crate::status::status_sql!(Cancelled), "
    RETURNING ", $returning, "
), records AS (
    INSERT INTO steps_status (service_request_id, step_id, step_name, status, request, response,
                              started_at, finished_at, time_taken_ms, reason, attempts)
    SELECT i.id, i.step_id, i.step_name, i.step_status, i.step_request, i.step_response,
           to_timestamp(i.started_ms / 1000.0), to_timestamp(i.finished_ms / 1000.0),
           CASE WHEN i.finished_ms IS NULL THEN NULL ELSE round(i.finished_ms - i.started_ms)::bigint END,
           i.step_reason, i.step_attempts
    FROM input i LEFT JOIN fenced f ON f.id = i.id
    -- A request cancelled while one of its steps was in flight still gets that step's
    -- outcome as its entry (nothing after it starts); only unfenced rows are looked at.
    -- (0: no record; below 0: a lane's step, `workflow::fan::lane_step_id`)
    WHERE i.step_id <> 0
      AND (f.id IS NOT NULL
           OR EXISTS (SELECT 1 FROM service_requests c WHERE c.id = i.id AND c.status = ", crate::status::status_sql!(Cancelled), "))
)", $more, "
SELECT id FROM fenced") };
}

/// What the telling statements' fenced rows return (`freed!`'s two columns last).
macro_rules! telling_returns {
    () => {
        concat!(
            "s.id, s.notify, s.workflow_name, s.workflow_version, s.reason, ",
            freed_returns!()
        )
    };
}

/// What `freed!` reads of each fenced row: its new status, and whether it has a key.
macro_rules! freed_returns {
    () => {
        "s.status, s.concurrency_key IS NOT NULL AS keyed"
    };
}

/// The outbox rows of the fenced rows whose new status is told of (`sql::tell!`).
macro_rules! told {
    () => {
        concat!(", told AS (", crate::store::sql::tell!("fenced"), ")")
    };
}

/// The slot rows (migration 34) of the fenced rows that finished with a concurrency key,
/// deleted by the statement that finishes them (no trigger does, migration 36). Aimed by
/// id at the slots' primary key (`= ANY (ARRAY(…))`: a batch without such a finish, every
/// batch of requests without a key, probes nothing); a step write changes a keyed
/// request's slot state only by finishing it (it leaves a request NEW only as it was, and
/// never holds one at 'infinity').
macro_rules! freed {
    () => {
        concat!(
            ", freed AS (DELETE FROM concurrency_slots c WHERE c.id = ANY (ARRAY(\
             SELECT f.id FROM fenced f WHERE f.keyed AND f.status IN (",
            crate::status::status_sql!(Finished),
            "))))"
        )
    };
}

pub(super) const WRITE_TRANSITIONS: &str =
    write_transitions!(concat!("s.id, ", freed_returns!()), freed!());

/// The same for a batch that holds a request whose workflow notifies: the fenced rows
/// whose new status is told of get their outbox row in the same statement
/// (`sql::tell!`). Other batches use the one above and pay nothing for it.
pub(super) const WRITE_TRANSITIONS_TELLING: &str =
    write_transitions!(telling_returns!(), concat!(told!(), freed!()));

/// One transition as the statement reads it: a `step_transition` (migration 15), field
/// by field. A transition without a step record has `step_id` 0.
#[derive(Debug, ToSql)]
#[postgres(name = "step_transition")]
pub struct Row<'a> {
    pub id: Uuid,
    pub status: RequestStatus,
    pub next_step: i32,
    pub next_request: Option<&'a str>,
    pub failed_step: Option<i32>,
    pub reason: Option<&'a str>,
    pub release: bool,
    pub step_id: i32,
    pub step_name: &'a str,
    pub step_status: Option<StepStatus>,
    pub step_request: Option<&'a str>,
    pub step_response: Option<&'a str>,
    pub started_ms: f64,
    pub finished_ms: Option<f64>,
    pub step_reason: Option<&'a str>,
    pub step_attempts: i32,
    pub attempts: i32,
    pub retry_in_ms: Option<f64>,
    pub last_error: Option<&'a str>,
}

/// Writes a batch of transitions for lease owner `owner` (`telling`: with their
/// notifications, `WRITE_TRANSITIONS_TELLING`); returns the ids that passed the fence.
pub async fn write(
    conn: &PgConn,
    rows: &[Row<'_>],
    owner: Uuid,
    telling: bool,
) -> Result<Vec<Uuid>> {
    let sql = if telling {
        WRITE_TRANSITIONS_TELLING
    } else {
        WRITE_TRANSITIONS
    };
    let written = tokio::time::timeout(WRITE_TIMEOUT, async {
        // One statement per partition set the batch's requests are in (one, but at a
        // set's edge), aimed at that set's partitions (`partitions::leaf_sql`).
        let order: Vec<usize> = (0..rows.len()).collect();
        let mut applied = Vec::with_capacity(rows.len());
        for (set, idx) in conn.partitions().group(&order, |&i| rows[i].id) {
            let group: Vec<&Row<'_>> = idx.iter().map(|&i| &rows[i]).collect();
            let got = super::partitions::on_set(conn, sql, set.as_ref(), |stmt| {
                let group = &group;
                async move {
                    let params: [&(dyn ToSql + Sync); 2] = [group, &owner];
                    conn.client.query(&stmt, &params).await
                }
            })
            .await?;
            applied.extend(got.iter().map(|r| r.get::<_, Uuid>(0)));
        }
        Ok::<_, tokio_postgres::Error>(applied)
    })
    .await
    .map_err(|_| StoreError::Unavailable("step write timed out".into()))??;
    Ok(written)
}

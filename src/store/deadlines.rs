//! Answer deadlines of ASYNC steps (beyond Clamp): a step sent with an `answerTimeout`
//! pauses its request with the deadline as `lease_until` (no claim takes a PAUSED row),
//! ranked in the claim order's paused band (migration 32). Past it, any instance's
//! look (`due`) finds the request, and one statement (`expire`) records the timeout on
//! the step and resumes the request (to the same step again, or to its onFailure steps),
//! only if it is still PAUSED at that step and its deadline has passed: an answer that
//! comes at the same moment and the timeout resolve once, whichever commits first, and
//! the other changes nothing.

use uuid::Uuid;

use super::PgConn;
use super::Result;

/// `$1` how many: paused requests whose answer is overdue, the most overdue first: a
/// range of the claim order's paused band (`sql::claim_rank!`, migration 32).
pub(super) const DUE: &str = concat!(
    "SELECT id, current_step_id, step_attempts, workflow_name, coalesce(workflow_version, 1)
FROM service_requests
WHERE status = ",
    crate::status::status_sql!(Paused),
    " AND lease_until > '-infinity' AND lease_until < now()
  AND ",
    crate::store::sql::due_in_band!(crate::store::sql::paused_rank!()),
    "
ORDER BY ",
    crate::store::sql::claim_rank!(),
    " LIMIT $1"
);

/// A paused request whose answer is overdue, or a request past its deadline.
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
    overdue(conn, DUE, limit).await
}

/// The rows of `sql` (`$1` how many), each `id, current_step_id, step_attempts,
/// workflow_name, workflow_version`.
async fn overdue(conn: &PgConn, sql: &'static str, limit: i64) -> Result<Vec<Overdue>> {
    let stmt = conn.stmt(sql).await?;
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

/// Whether an unfinished request `s` whose deadline passed is for the sweeper to end: not
/// running its onFailure steps (they run to their end), and held by no executor (one
/// that holds it ends it itself, `engine::job`): paused, or asleep until a later time (a
/// WAIT, a retry's back-off) and not a fan-out item held back for its turn. One claimable
/// now is left to the claim, whose executor ends it.
macro_rules! deadline_passed {
    () => {
        concat!(
            "s.deadline < now() AND s.failed_step_id IS NULL
  AND s.status IN (",
            crate::status::status_sql!(Unfinished),
            ")
  AND (s.status = ",
            crate::status::status_sql!(Paused),
            " OR (s.lease_owner IS NULL AND s.lease_until > now() AND s.lease_until < 'infinity'))"
        )
    };
}

/// `$1` how many: requests past their deadline that the sweeper ends, the longest past
/// first (`service_requests_deadlines`, migration 20), as `DUE` returns its rows.
pub(super) const PAST_DEADLINE: &str = concat!(
    "SELECT s.id, s.current_step_id, s.step_attempts, s.workflow_name,
       coalesce(s.workflow_version, 1)
FROM service_requests s
WHERE ",
    deadline_passed!(),
    "
ORDER BY s.deadline LIMIT $1"
);

/// Requests past their deadline that no executor holds (the step each is at: 0, none
/// started yet).
pub async fn past_deadline(conn: &PgConn, limit: i64) -> Result<Vec<Overdue>> {
    overdue(conn, PAST_DEADLINE, limit).await
}

/// How the sweeper ends a request at its deadline.
pub struct End<'a> {
    pub id: Uuid,
    /// The step it is at, which fails, and its name (for a record written here).
    pub step_id: u32,
    pub step_name: &'a str,
    /// Its first onFailure step, or 0: none (the request fails when claimed).
    pub next_step: u32,
    /// The request's reason, and the failed step's error document and reason.
    pub reason: &'a str,
    pub step_response: &'a str,
    pub step_reason: &'a str,
}

/// `$1` id, `$2` step, `$3` next step, `$4` reason, `$5` the step record's response, `$6`
/// its reason, `$7` the step's name. One statement, only while the request is still as
/// `deadline_passed!` found it at that step: it is RESUMED at its next step, unleased,
/// failing (an answer, an event or a timer of the step changes nothing after this); the
/// step's STARTED record (a pause, a sleep) is marked FAILED, or, with none (a retry's
/// back-off), a FAILED record is written; the step's unfinished children (WORKFLOW,
/// PARALLEL, MAP) are cancelled, and theirs, and told (nothing waits for them now).
pub(super) const END: &str = concat!(
    "\
WITH RECURSIVE ended AS (
    UPDATE service_requests s SET status = ",
    crate::status::status_sql!(Resumed),
    ", current_step_id = $3,
        step_request = CASE
            WHEN EXISTS (SELECT 1 FROM steps_status x WHERE x.service_request_id = $1
                         AND x.step_id = $2 AND x.status = ",
    crate::status::status_sql!(Started),
    ")
            THEN (SELECT NULLIF(request, '') FROM steps_status x
                  WHERE x.service_request_id = $1 AND x.step_id = $2
                  ORDER BY x.id DESC LIMIT 1)
            ELSE s.step_request END,
        failed_step_id = $2, reason = $4, updated_at = now(),
        step_attempts = 0, last_error = NULL, wait_event = NULL, wait_key = NULL,
        wait_next = NULL, lease_owner = NULL, lease_until = '-infinity'
    WHERE s.id = $1 AND s.current_step_id = $2 AND ",
    deadline_passed!(),
    "
    RETURNING s.id
), recorded AS (
    UPDATE steps_status SET status = ",
    crate::status::status_sql!(Failed),
    ", response = $5, reason = $6, finished_at = now(),
        time_taken_ms = round(extract(epoch FROM now() - started_at) * 1000)::bigint
    WHERE service_request_id = $1 AND step_id = $2 AND status = ",
    crate::status::status_sql!(Started),
    "
      AND EXISTS (SELECT 1 FROM ended)
    RETURNING 1
), noted AS (
    INSERT INTO steps_status (service_request_id, step_id, step_name, status, request, response,
                              started_at, finished_at, time_taken_ms, reason, attempts)
    SELECT s.id, $2, $7, ",
    crate::status::status_sql!(Failed),
    ", coalesce(s.step_request, ''), $5, now(), now(), 0, $6, greatest(s.step_attempts, 1)
    FROM service_requests s
    WHERE s.id = $1 AND $2 > 0 AND EXISTS (SELECT 1 FROM ended)
      AND NOT EXISTS (SELECT 1 FROM recorded)
), tree AS (
    SELECT c.id FROM service_requests c
    WHERE c.parent_id = $1 AND c.parent_step_id = $2 AND EXISTS (SELECT 1 FROM ended)
    UNION ALL
    SELECT g.id FROM service_requests g JOIN tree t ON g.parent_id = t.id
    WHERE g.parent_id IS NOT NULL
), cancelled AS (
    UPDATE service_requests c SET status = ",
    crate::status::status_sql!(Cancelled),
    ", reason = 'its parent''s deadline passed', finished_at = now(), parent_told = true,
       lease_owner = NULL, lease_until = '-infinity', updated_at = now()
    WHERE c.id IN (SELECT id FROM tree) AND c.status NOT IN (",
    crate::status::status_sql!(Completed),
    ", ",
    crate::status::status_sql!(Failed),
    ", ",
    crate::status::status_sql!(Cancelled),
    ")
    RETURNING 1
), joined AS (
    UPDATE fan_joins SET done = true
    WHERE parent_id = $1 AND step_id = $2 AND NOT done AND EXISTS (SELECT 1 FROM ended)
    RETURNING 1
)
SELECT (SELECT count(*) FROM ended), (SELECT count(*) FROM cancelled),
       (SELECT count(*) FROM joined)"
);

/// Applies `e`; true when the request was still as the look found it (false: it went on,
/// was answered, claimed, cancelled or ended by another instance first).
pub async fn end(conn: &PgConn, e: &End<'_>) -> Result<bool> {
    let stmt = conn.stmt(END).await?;
    let row = conn
        .client
        .query_one(
            &stmt,
            &[
                &e.id,
                &(e.step_id as i32),
                &(e.next_step as i32),
                &e.reason,
                &e.step_response,
                &e.step_reason,
                &e.step_name,
            ],
        )
        .await?;
    Ok(row.get::<_, i64>(0) == 1)
}

/// The timers: how many requests wait on a clock (asleep or backing off, paused with an
/// answer's or event's deadline: the claim order's rows whose `lease_until` is after now),
/// and how long the most overdue one has been due (ms, 0: none). Counted from the claim
/// order's index alone (index-only scans: its predicate spelled as it is,
/// `sql::claim_order_rows!`, and `lease_until`, its second column; a condition on its rank
/// would not do, since the planner reads the columns an indexed expression is made of
/// from the row): a filter on a column it does not hold would read every sleeping
/// request's row (with a million of them, 0.95 of the two-step rate when counted every
/// 15 s). So this is a scan of the whole index, with the fewest columns read per row.
/// Requests running now, whose lease also ends later, count too (at most
/// `--max-running` per thread of each instance), as do parked ones (their lease ends in
/// the year 9999). Read only when /metrics is, at most once per `TIMERS_PERIOD`.
pub(super) const TIMERS: &str = concat!(
    "WITH due AS (
    SELECT min(lease_until) AS at FROM service_requests
    WHERE ",
    crate::store::sql::claim_order_rows!(),
    " AND lease_until > '-infinity' AND lease_until <= now()
)
SELECT (SELECT count(*) FROM service_requests
        WHERE ",
    crate::store::sql::claim_order_rows!(),
    " AND lease_until > now() AND lease_until < 'infinity'),
       coalesce(extract(epoch FROM now() - (SELECT min(at) FROM due)) * 1000, 0)::float8"
);

/// Timers pending, and the most overdue one's lateness in ms.
pub async fn timers(conn: &PgConn) -> Result<(i64, f64)> {
    let stmt = conn.stmt(TIMERS).await?;
    let row = conn.client.query_one(&stmt, &[]).await?;
    Ok((row.get(0), row.get(1)))
}

//! Fan-out steps (PARALLEL and MAP): each branch or item is a child service request of
//! the step, as a WORKFLOW step's child is, numbered by `fan_index`; the step's
//! `fan_joins` row counts them. Starting is one statement fenced on the parent's lease
//! (the pause, the step's record, every child and the join row, or none of them); the
//! children that start at once may be inserted leased to the starting instance, which
//! runs them. A MAP's items beyond its concurrency are inserted held (`lease_until =
//! 'infinity'`, which no sweeper claims) and released one per finished item. Finished
//! children are counted in batches, each in the statement that marks it told, under its
//! join row's lock, so each counts once whichever instance tells it; the joined answer is applied to the parent after that
//! commit, and `done` set when it has been, so a crash in between leaves a join that any
//! instance's reporter finds (`due`) and applies again (a repeat changes nothing).

use uuid::Uuid;

use super::PgConn;
use super::Result;
use crate::status::RequestStatus;

/// A fan-out step to start: the parent's pause and record, and its children.
pub struct Start<'a> {
    pub parent: Uuid,
    pub owner: Uuid,
    pub step_id: u32,
    pub step_name: &'a str,
    /// The step's request, as its record keeps it.
    pub request: &'a str,
    pub started_ms: f64,
    pub attempts: u32,
    pub children: Children,
    /// Failed children the step tolerates before it fails.
    pub tolerated: u32,
    /// A PARALLEL step's branch names, by index (None: a MAP).
    pub branches: Option<Vec<String>>,
    /// The children's forwarded headers when not the parent's: its own with the
    /// traceparent of the fan-out step's span, so each branch is traced under the step.
    pub headers: Option<String>,
    /// The first `own` children are inserted leased to `owner` for `lease_ms` (it runs
    /// them at once, as a create runs its request) instead of left for a sweeper's claim.
    pub own: u32,
    pub lease_ms: f64,
    /// The final statuses the children's workflow tells of (a MAP over a stored
    /// workflow; None: none, and always for steps of the request's own definition).
    pub notify: Option<i16>,
    /// A SWITCH's (its one child's answer is the step's: `Join::switch`).
    pub switch: bool,
    /// A LOOP's bound (its one child is the first iteration: `next_iteration`).
    pub max_iterations: Option<u32>,
}

/// The children's columns, one entry per child in index order.
#[derive(Default)]
pub struct Children {
    pub ids: Vec<Uuid>,
    pub workflows: Vec<String>,
    /// 0: the latest version when stored.
    pub versions: Vec<i32>,
    pub payloads: Vec<String>,
    /// Beyond the concurrency: inserted held.
    pub held: Vec<bool>,
}

/// `$1` parent, `$2` step id, `$3` owner, `$4` step name, `$5` request, `$6` started (ms),
/// `$7` attempts, `$8`..`$12` the children's ids, workflows, versions, payloads and held
/// flags, `$13` tolerated failures, `$14` branch names (NULL for a MAP), `$15` the
/// children's headers (NULL: the parent's), `$16` how many of the first children are
/// leased to the owner, for `$17` ms, `$18` the statuses the children tell of, `$19`
/// whether the step is a SWITCH, `$20` a LOOP's bound. Inserts nothing but the pause and the record when
/// the step has children already (a retry in place: `restart`). Returns whether the lease
/// held, whether the children are new, and their headers.
pub(super) const START: &str = concat!(
    "\
WITH ",
    crate::store::sql::pause_for_children!(),
    ", record AS (
    INSERT INTO steps_status (service_request_id, step_id, step_name, status, request,
                              started_at, attempts)
    SELECT id, $2, $4, ",
    crate::status::status_sql!(Started),
    ", $5, to_timestamp($6::float8 / 1000.0), $7 FROM fenced
), fresh AS (
    SELECT f.headers, f.priority, f.labels FROM fenced f
    WHERE NOT EXISTS (SELECT 1 FROM fan_joins j WHERE j.parent_id = $1 AND j.step_id = $2)
), kids AS (
    INSERT INTO service_requests (id, workflow_name, payload, headers, lease_owner, lease_until,
                                  workflow_version, parent_id, parent_step_id, parent_told,
                                  fan_index, priority, labels, notify)
    SELECT c.id, c.workflow, c.payload, coalesce($15::text, f.headers),
           CASE WHEN c.n <= $16::int THEN $3::uuid END,
           CASE WHEN c.held THEN 'infinity'::timestamptz
                WHEN c.n <= $16::int THEN ",
    crate::store::sql::now_plus_ms!("$17"),
    "
                ELSE '-infinity'::timestamptz END,
           ",
    crate::store::sql::pinned_version!(
        "c.version",
        "(SELECT w.version FROM workflows w WHERE w.name = c.workflow)"
    ),
    ",
           $1, $2, false, (c.n - 1)::int, f.priority, f.labels, $18::smallint
    FROM fresh f,
         unnest($8::uuid[], $9::text[], $10::int[], $11::text[], $12::bool[])
           WITH ORDINALITY AS c(id, workflow, version, payload, held, n)
    RETURNING 1
), joined AS (
    INSERT INTO fan_joins (parent_id, step_id, total, tolerated, branches, switch,
                           max_iterations, last_child)
    SELECT $1, $2, cardinality($8::uuid[]), $13, $14::text[], $19::bool, $20::int,
           CASE WHEN $20::int IS NOT NULL THEN ($8::uuid[])[1] END
    FROM fresh
    RETURNING 1
)
SELECT (SELECT count(*) FROM fenced), (SELECT count(*) FROM fresh),
       (SELECT coalesce($15::text, f.headers) FROM fresh f)"
);

/// How a start went.
#[derive(Debug, PartialEq, Eq)]
pub enum Started {
    /// The parent paused at the step with its children stored (with these headers; the
    /// first `own` leased to the owner).
    Fresh { headers: String },
    /// The parent paused at the step, which had children already (`restart` them).
    Again,
    /// The parent's lease is lost, or it was cancelled: nothing written.
    Lost,
}

pub async fn start(conn: &PgConn, s: &Start<'_>) -> Result<Started> {
    let stmt = conn.stmt(START).await?;
    let c = &s.children;
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
                &c.ids,
                &c.workflows,
                &c.versions,
                &c.payloads,
                &c.held,
                &(s.tolerated as i32),
                &s.branches,
                &s.headers,
                &(s.own as i32),
                &s.lease_ms,
                &s.notify,
                &s.switch,
                &s.max_iterations.map(|n| n as i32),
            ],
        )
        .await?;
    Ok(match (row.get::<_, i64>(0), row.get::<_, i64>(1)) {
        (0, _) => Started::Lost,
        (_, 1) => Started::Fresh {
            headers: row.get::<_, Option<String>>(2).unwrap_or_default(),
        },
        _ => Started::Again,
    })
}

/// A retry in place of a fan-out step whose children exist: its failed and cancelled
/// children run again, each as a retry of it would (`retry::retry_set!`, `$2` NULL: from
/// where it stopped, with that step's request), and told nothing yet. `$1` parent, `$3`
/// step. Returns their indexes.
pub(super) const RESTART: &str = concat!(
    "WITH retried AS (UPDATE service_requests s SET ",
    crate::store::retry::retry_set!(),
    ", parent_told = false
WHERE s.parent_id = $1 AND s.parent_step_id = $3 AND s.fan_index IS NOT NULL AND ",
    crate::store::retry::retryable!(),
    " RETURNING s.fan_index, ",
    crate::store::slots::follows!("s"),
    "), ",
    crate::store::slots::follow!("retried"),
    " SELECT fan_index FROM retried"
);

/// `$1` parent, `$2` step: children running (not finished, not held).
pub(super) const RUNNING: &str = concat!(
    "SELECT count(*) FROM service_requests c
WHERE c.parent_id = $1 AND c.parent_step_id = $2 AND c.fan_index IS NOT NULL
  AND c.lease_until <> 'infinity' AND c.status NOT IN (",
    crate::status::status_sql!(Completed),
    ", ",
    crate::status::status_sql!(Failed),
    ", ",
    crate::status::status_sql!(Cancelled),
    ")"
);

/// `$1` parent, `$2` step, `$3` indexes: held again (beyond the concurrency).
pub(super) const HOLD: &str = "UPDATE service_requests SET lease_until = 'infinity' \
     WHERE parent_id = $1 AND parent_step_id = $2 AND fan_index = ANY($3)";

/// `$1` parent, `$2` step, `$3` children run again.
pub(super) const REOPEN: &str = "UPDATE fan_joins SET finished = finished - $3, failed = 0, \
     done = false WHERE parent_id = $1 AND step_id = $2 RETURNING finished >= total";

/// Runs the failed and cancelled children of a fan-out step again, at most `concurrency`
/// running at once (the rest held, in index order); true when none is left to wait for
/// (every child had completed), so the joined answer is due at once.
pub async fn restart(
    conn: &mut PgConn,
    parent: Uuid,
    step_id: u32,
    concurrency: u32,
) -> Result<bool> {
    let restart = conn.stmt(RESTART).await?;
    let running = conn.stmt(RUNNING).await?;
    let hold = conn.stmt(HOLD).await?;
    let reopen = conn.stmt(REOPEN).await?;
    let step = step_id as i32;
    let tx = conn.client.transaction().await?;
    let mut again: Vec<i32> = tx
        .query(&restart, &[&parent, &None::<String>, &step])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    again.sort_unstable();
    let busy: i64 = tx.query_one(&running, &[&parent, &step]).await?.get(0);
    let room = (concurrency as i64 - busy).max(0) as usize;
    let held: Vec<i32> = again.iter().skip(room).copied().collect();
    if !held.is_empty() {
        tx.execute(&hold, &[&parent, &step, &held]).await?;
    }
    let due = tx
        .query_opt(&reopen, &[&parent, &step, &(again.len() as i32)])
        .await?
        .is_some_and(|r| r.get(0));
    tx.commit().await?;
    Ok(due)
}

/// `$1` finished children (ids in order): each counted once (it becomes told here) under
/// its join row's lock, the join rows locked in order (so two batches never wait on each
/// other in a cycle), and, for each join that still waits and tolerates its failures, as
/// many held items released (made runnable) as children of it were counted, in index
/// order, leased to `$2` for `$3` ms when `$2` is given. One statement: the counts and the
/// releases commit together or not at all. Returns a row per join counted (its `kind`
/// true) and a row per item released, leased to `$2` (its `kind` false, with a claim's
/// columns: `leases::Claimed::from_row` at offset 7).
pub(super) const COUNT: &str = concat!(
    "\
WITH child AS (
    UPDATE service_requests c SET parent_told = true FROM unnest($1::uuid[]) AS u(id)
    WHERE c.id = u.id AND c.fan_index IS NOT NULL AND NOT c.parent_told AND c.status IN (",
    crate::status::status_sql!(Completed),
    ", ",
    crate::status::status_sql!(Failed),
    ", ",
    crate::status::status_sql!(Cancelled),
    ")
    RETURNING c.parent_id, c.parent_step_id, c.status <> ",
    crate::status::status_sql!(Completed),
    " AS failed
), per AS (
    SELECT parent_id, parent_step_id AS step_id, count(*)::int AS n,
           (count(*) FILTER (WHERE failed))::int AS f
    FROM child GROUP BY parent_id, parent_step_id
), locked AS (
    SELECT j.parent_id, j.step_id FROM fan_joins j, per
    WHERE j.parent_id = per.parent_id AND j.step_id = per.step_id
    ORDER BY j.parent_id, j.step_id
    FOR UPDATE OF j
), counted AS (
    UPDATE fan_joins j SET finished = j.finished + per.n, failed = j.failed + per.f
    FROM per, locked l
    WHERE j.parent_id = per.parent_id AND j.step_id = per.step_id
      AND l.parent_id = j.parent_id AND l.step_id = j.step_id
    RETURNING j.parent_id, j.step_id, j.total, j.finished, j.failed, j.tolerated, per.n
), next AS (
    SELECT h.id FROM counted j CROSS JOIN LATERAL (
        SELECT h.id FROM service_requests h
        WHERE h.parent_id = j.parent_id AND h.parent_step_id = j.step_id
          AND h.lease_until = 'infinity' AND j.failed <= j.tolerated AND j.finished < j.total
          AND h.status IN ",
    crate::store::sql::claimable!(),
    "
        ORDER BY h.fan_index LIMIT j.n
        FOR UPDATE OF h
    ) h
), released AS (
    UPDATE service_requests s SET lease_owner = $2::uuid,
           lease_until = CASE WHEN $2::uuid IS NULL THEN '-infinity'::timestamptz ELSE ",
    crate::store::sql::now_plus_ms!("$3"),
    " END,
           updated_at = now()
    FROM next WHERE s.id = next.id
    RETURNING ",
    crate::store::sql::claimed_columns!("s"),
    "
)
SELECT true, parent_id, step_id, total, finished, failed, tolerated,
       NULL::uuid, NULL::text, NULL::text, NULL::text, NULL::text, NULL::int, NULL::text,
       NULL::int, NULL::text, NULL::int, NULL::bigint, NULL::int, NULL::uuid, NULL::int,
       NULL::float8, NULL::int2
FROM counted
UNION ALL
SELECT false, NULL, NULL, NULL, NULL, NULL, NULL, r.* FROM released r"
);

/// What counting finished children did to one fan-out step.
#[derive(Debug, PartialEq, Eq)]
pub enum Counted {
    /// More children to wait for.
    Waiting,
    /// Every child finished, or more failed than tolerated (the rest cancelled): the
    /// joined answer is due to `parent`.
    Due { parent: Uuid, step_id: u32 },
}

/// Counts the finish of fan-out children `ids` (one statement, which also releases as
/// many held items; leased to `owner` when given, which runs them), and, for a step where
/// more have failed than it tolerates, cancels the rest. Returns what each step counted
/// came to, and the items released to `owner`. Children counted before are left out.
pub async fn count(
    conn: &PgConn,
    ids: &[Uuid],
    owner: Option<Uuid>,
    lease_ms: f64,
) -> Result<(Vec<Counted>, Vec<super::leases::Claimed>)> {
    let count = conn.stmt(COUNT).await?;
    let rows = conn
        .client
        .query(&count, &[&ids, &owner, &lease_ms])
        .await?;
    let (mut steps, mut released) = (Vec::new(), Vec::new());
    for row in &rows {
        if !row.get::<_, bool>(0) {
            released.push(super::leases::Claimed::from_row_at(row, 7));
            continue;
        }
        let (total, finished, failed, tolerated): (i32, i32, i32, i32) =
            (row.get(3), row.get(4), row.get(5), row.get(6));
        let (parent, step): (Uuid, i32) = (row.get(1), row.get(2));
        let step_id = step.max(0) as u32;
        steps.push(if failed > tolerated {
            // Counted and committed first: a crash before the cancel leaves the rest
            // running to their end (counted then), and the joined answer is the failure
            // either way.
            let cancel = conn.stmt(CANCEL_REST).await?;
            conn.client.execute(&cancel, &[&parent, &step]).await?;
            Counted::Due { parent, step_id }
        } else if finished >= total {
            Counted::Due { parent, step_id }
        } else {
            Counted::Waiting
        });
    }
    Ok((steps, released))
}

/// `$1` parent, `$2` step: the unfinished children (and their own children) are
/// cancelled, the step having failed; the step's own are counted finished and failed here
/// (and told), so their cancel is not counted again and a restart runs them again.
pub(super) const CANCEL_REST: &str = concat!(
    "WITH RECURSIVE tree AS (
    SELECT c.id FROM service_requests c
    WHERE c.parent_id = $1 AND c.parent_step_id = $2 AND c.fan_index IS NOT NULL
    UNION ALL
    SELECT g.id FROM service_requests g JOIN tree t ON g.parent_id = t.id
    WHERE g.parent_id IS NOT NULL
), cancelled AS (
    UPDATE service_requests c SET status = ",
    crate::status::status_sql!(Cancelled),
    ", reason = 'a sibling branch or item failed', finished_at = now(),
       parent_told = (c.parent_id = $1 AND c.parent_step_id = $2) OR c.parent_told,
       lease_owner = NULL, lease_until = '-infinity', updated_at = now()
    WHERE c.id IN (SELECT id FROM tree) AND c.status NOT IN (",
    crate::status::status_sql!(Completed),
    ", ",
    crate::status::status_sql!(Failed),
    ", ",
    crate::status::status_sql!(Cancelled),
    ")
    RETURNING c.id, c.parent_id = $1 AND c.parent_step_id = $2 AS own
), counted AS (
    UPDATE fan_joins j SET
        finished = j.finished + (SELECT count(*) FROM cancelled WHERE own),
        failed = j.failed + (SELECT count(*) FROM cancelled WHERE own)
    WHERE j.parent_id = $1 AND j.step_id = $2
    RETURNING 1
)
SELECT id FROM cancelled, (SELECT count(*) FROM counted) AS n"
);

/// One child's part of a joined answer.
#[derive(Debug)]
pub struct Part {
    pub index: i32,
    pub id: Uuid,
    pub status: RequestStatus,
    pub reason: Option<String>,
    /// Its last answer (the last step that completed or passed its request on).
    pub response: Option<String>,
}

/// `$1` parent, `$2` step: every child's outcome in index order.
pub(super) const PARTS: &str = concat!(
    "SELECT c.fan_index, c.id, c.status, c.reason,
       (SELECT st.response FROM steps_status st
        WHERE st.service_request_id = c.id AND st.status IN (",
    crate::status::status_sql!(Completed),
    ", ",
    crate::status::status_sql!(Skipped),
    ")
        ORDER BY st.id DESC LIMIT 1)
FROM service_requests c
WHERE c.parent_id = $1 AND c.parent_step_id = $2 AND c.fan_index IS NOT NULL
ORDER BY c.fan_index"
);

/// `$1` parent, `$2` step: what the join knows of the step, and its parent's workflow,
/// version and payload (a LOOP's condition is read over the parent's context).
pub(super) const JOIN: &str = "SELECT j.tolerated, j.branches, j.switch, j.max_iterations, \
     j.total, p.workflow_name, coalesce(p.workflow_version, 1), p.payload, p.failed_step_id \
     FROM fan_joins j JOIN service_requests p ON p.id = j.parent_id \
     WHERE j.parent_id = $1 AND j.step_id = $2";

/// `$1` parent, `$2` step: a LOOP's last iteration's outcome (its earlier ones have
/// completed: an iteration starts only after the one before completed), by the id its
/// join keeps.
pub(super) const LAST_PART: &str = concat!(
    "SELECT c.fan_index, c.id, c.status, c.reason,
       (SELECT st.response FROM steps_status st
        WHERE st.service_request_id = c.id AND st.status IN (",
    crate::status::status_sql!(Completed),
    ", ",
    crate::status::status_sql!(Skipped),
    ")
        ORDER BY st.id DESC LIMIT 1)
FROM fan_joins j JOIN service_requests c ON c.id = j.last_child
WHERE j.parent_id = $1 AND j.step_id = $2"
);

/// `$1` parent, `$2` step, `$3` the iterations so far (the new one's index), `$4` its id,
/// `$5` its payload, `$6` its lease owner (NULL: a sweeper's to claim), for `$7` ms: a
/// LOOP's next iteration, inserted as its last one was (workflow, version, headers,
/// priority, labels), with the join's total grown by one; fenced on the total it had and
/// on the parent still waiting at the step, so it is inserted once, or not at all.
pub(super) const NEXT_ITERATION: &str = concat!(
    "\
WITH before AS (
    SELECT last_child FROM fan_joins WHERE parent_id = $1 AND step_id = $2
), grown AS (
    UPDATE fan_joins j SET total = j.total + 1, last_child = $4
    WHERE j.parent_id = $1 AND j.step_id = $2 AND j.total = $3 AND NOT j.done
      AND EXISTS (SELECT 1 FROM service_requests p WHERE p.id = $1 AND p.current_step_id = $2
                  AND p.status = ",
    crate::status::status_sql!(Paused),
    ")
    RETURNING 1
)
INSERT INTO service_requests (id, workflow_name, payload, headers, lease_owner, lease_until,
                              workflow_version, parent_id, parent_step_id, parent_told,
                              fan_index, priority, labels, notify)
SELECT $4, c.workflow_name, $5, c.headers, $6::uuid,
       CASE WHEN $6::uuid IS NULL THEN '-infinity'::timestamptz ELSE ",
    crate::store::sql::now_plus_ms!("$7"),
    " END,
       c.workflow_version, $1, $2, false, $3, c.priority, c.labels, c.notify
FROM grown, before b, service_requests c
WHERE c.id = b.last_child
RETURNING headers, coalesce(workflow_version, 1), workflow_name"
);

/// A LOOP's next iteration to insert.
pub struct Iteration<'a> {
    pub parent: Uuid,
    pub step_id: u32,
    /// Its index: the iterations run so far.
    pub index: u32,
    pub id: Uuid,
    pub payload: &'a str,
    pub owner: Option<Uuid>,
    pub lease_ms: f64,
}

/// Inserts a LOOP's next iteration (`NEXT_ITERATION`); its headers and workflow version
/// and workflow when it was inserted, None when another did first or the parent waits
/// no more.
pub async fn next_iteration(
    conn: &PgConn,
    it: &Iteration<'_>,
) -> Result<Option<(String, i32, String)>> {
    let stmt = conn.stmt(NEXT_ITERATION).await?;
    let row = conn
        .client
        .query_opt(
            &stmt,
            &[
                &it.parent,
                &(it.step_id as i32),
                &(it.index as i32),
                &it.id,
                &it.payload,
                &it.owner,
                &it.lease_ms,
            ],
        )
        .await?;
    Ok(row.map(|r| (r.get(0), r.get(1), r.get(2))))
}

/// A fan-out step as its join keeps it.
#[derive(Debug)]
pub struct Join {
    pub tolerated: u32,
    /// A PARALLEL step's branch names, by index (None: a MAP); a SWITCH's case taken.
    pub branches: Option<Vec<String>>,
    /// A SWITCH's: its one child's answer is the step's.
    pub switch: bool,
    /// A LOOP's bound (None: not a loop).
    pub max_iterations: Option<u32>,
    /// Its children so far (a LOOP's iterations so far).
    pub total: u32,
    /// Its parent's workflow, version and payload.
    pub parent_workflow: String,
    pub parent_version: i32,
    pub parent_payload: String,
    /// The parent's failed step while it fails: its children were asked to compensate.
    pub parent_failing: Option<u32>,
}

/// The join of a fan-out step and its children's outcomes, in index order (a LOOP's
/// last iteration's alone).
pub async fn parts(conn: &PgConn, parent: Uuid, step_id: u32) -> Result<(Join, Vec<Part>)> {
    let join = conn.stmt(JOIN).await?;
    let step = step_id as i32;
    let j = conn.client.query_one(&join, &[&parent, &step]).await?;
    let join = Join {
        tolerated: j.get::<_, i32>(0).max(0) as u32,
        branches: j.get(1),
        switch: j.get(2),
        max_iterations: j.get::<_, Option<i32>>(3).map(|n| n.max(0) as u32),
        total: j.get::<_, i32>(4).max(0) as u32,
        parent_workflow: j.get(5),
        parent_version: j.get(6),
        parent_payload: j.get(7),
        parent_failing: j.get::<_, Option<i32>>(8).map(|n| n.max(0) as u32),
    };
    let stmt = conn
        .stmt(if join.max_iterations.is_some() {
            LAST_PART
        } else {
            PARTS
        })
        .await?;
    let parts = conn
        .client
        .query(&stmt, &[&parent, &step])
        .await?
        .iter()
        .map(|r| Part {
            index: r.get(0),
            id: r.get(1),
            status: r.get(2),
            reason: r.get(3),
            response: r.get(4),
        })
        .collect();
    Ok((join, parts))
}

/// `$1` parent, `$2` step: the joined answer reached the parent (or it waits no more).
pub(super) const DONE: &str =
    "UPDATE fan_joins SET done = true WHERE parent_id = $1 AND step_id = $2";

pub async fn done(conn: &PgConn, parent: Uuid, step_id: u32) -> Result<()> {
    let stmt = conn.stmt(DONE).await?;
    conn.client
        .execute(&stmt, &[&parent, &(step_id as i32)])
        .await?;
    Ok(())
}

/// `$1` how many: joins whose answer is due and has not reached the parent.
pub(super) const DUE: &str = "SELECT parent_id, step_id FROM fan_joins \
     WHERE NOT done AND (finished >= total OR failed > tolerated) ORDER BY parent_id LIMIT $1";

pub async fn due(conn: &PgConn, limit: i64) -> Result<Vec<(Uuid, u32)>> {
    let stmt = conn.stmt(DUE).await?;
    Ok(conn
        .client
        .query(&stmt, &[&limit])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get::<_, i32>(1).max(0) as u32))
        .collect())
}

/// `$1` parent, `$2` page size, `$3` offset: its children by step, then branch or item
/// index, with how many it has, and when each was created and finished (ms).
pub(super) const CHILDREN: &str = concat!(
    "SELECT c.id, c.parent_step_id, c.fan_index, c.workflow_name, ",
    crate::store::sql::derived_status!("c"),
    " AS status, count(*) OVER () AS total,
       extract(epoch FROM c.created_at)::float8 * 1000,
       extract(epoch FROM c.finished_at)::float8 * 1000
FROM service_requests c WHERE c.parent_id = $1
ORDER BY c.parent_step_id, c.fan_index, c.id LIMIT $2 OFFSET $3"
);

/// A child request as its parent's list shows it.
#[derive(Debug)]
pub struct Child {
    pub id: Uuid,
    pub step_id: i32,
    pub fan_index: Option<i32>,
    pub workflow_name: String,
    pub status: RequestStatus,
    /// When it was created and, once it has, finished (ms since the Unix epoch).
    pub created_ms: f64,
    pub finished_ms: Option<f64>,
}

/// A page of the children of `parent`, and how many it has in all.
pub async fn children(
    conn: &PgConn,
    parent: Uuid,
    limit: i64,
    offset: i64,
) -> Result<(Vec<Child>, i64)> {
    let stmt = conn.stmt(CHILDREN).await?;
    let rows = conn
        .client
        .query(&stmt, &[&parent, &limit, &offset])
        .await?;
    let total = rows.first().map_or(0, |r| r.get(5));
    Ok((
        rows.iter()
            .map(|r| Child {
                id: r.get(0),
                step_id: r.get(1),
                fan_index: r.get(2),
                workflow_name: r.get(3),
                status: r.get(4),
                created_ms: r.get(6),
                finished_ms: r.get(7),
            })
            .collect(),
        total,
    ))
}

/// `$1` a fan-out child: its index, and its parent's id, workflow and payload (for the
/// enclosing context its steps see).
pub(super) const PLACE: &str = "SELECT c.fan_index, c.parent_id, p.workflow_name, p.payload \
     FROM service_requests c JOIN service_requests p ON p.id = c.parent_id WHERE c.id = $1";

/// Where a fan-out child is.
pub struct Place {
    pub index: Option<i32>,
    pub parent: Option<Uuid>,
    pub parent_workflow: String,
    pub parent_payload: String,
}

pub async fn place(conn: &PgConn, id: Uuid) -> Result<Option<Place>> {
    let stmt = conn.stmt(PLACE).await?;
    Ok(conn.client.query_opt(&stmt, &[&id]).await?.map(|r| Place {
        index: r.get(0),
        parent: r.get(1),
        parent_workflow: r.get(2),
        parent_payload: r.get(3),
    }))
}

//! The lease queries: claiming runnable requests, renewing and releasing leases, and
//! loading what a claimed request needs to continue where it stopped.

use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use super::queries::parse_opt;
use super::PgConn;
use super::Result;

/// A request this instance just claimed.
#[derive(Debug)]
pub struct Claimed {
    pub id: Uuid,
    pub workflow_name: String,
    pub status: crate::status::RequestStatus,
    pub payload: String,
    pub headers: String,
    pub current_step_id: u32,
    pub step_request: Option<String>,
    pub failed_step_id: Option<u32>,
    /// Why the request is failing, while its onFailure steps run.
    pub reason: Option<String>,
    /// Attempts its current step has had already (a retry continues the count).
    pub step_attempts: u32,
    /// When it was created, in microseconds since the Unix epoch.
    pub created_us: i64,
    /// The workflow version it runs.
    pub workflow_version: u32,
    /// The request whose WORKFLOW step started it, if one did.
    pub parent_id: Option<Uuid>,
    /// Times it was retried.
    pub retries: i32,
    /// Its deadline, in ms from the claim (negative: passed); None when it has none, or
    /// none that applies (its onFailure steps are running).
    pub deadline_in_ms: Option<f64>,
    /// Its priority (None: the default), for its status memory.
    pub priority: Option<i16>,
}

impl Claimed {
    /// A child request just inserted leased to this instance, as a claim would give it: at
    /// its first step, with nothing run.
    pub fn fresh_child(
        id: Uuid,
        workflow_name: String,
        workflow_version: u32,
        payload: String,
        headers: String,
        parent: Uuid,
    ) -> Claimed {
        let created_us = crate::store::budget::now_us();
        Claimed {
            id,
            workflow_name,
            status: crate::status::RequestStatus::New,
            payload,
            headers,
            current_step_id: 0,
            step_request: None,
            failed_step_id: None,
            reason: None,
            step_attempts: 0,
            created_us,
            workflow_version,
            parent_id: Some(parent),
            retries: 0,
            // Its steps run within the request's deadline, which the parent keeps.
            deadline_in_ms: None,
            // Its row has its parent's; a child keeps no status memory, the only reader.
            priority: None,
        }
    }
}

/// Claims up to `limit` runnable requests whose lease is free or expired. Rows due at a
/// time (a WAIT's end, a back-off, a delayed start, a lease that ran out: ranked above 0,
/// in one band per priority) take the first half of every claim, the higher priorities
/// first and within one in the order they fell due,
/// so a backlog of fresh rows (ranked below 0, priorities being 1 to 9: higher ones
/// first, then creation order, `sql::claim_rank!`) does not keep them from their time; the rest goes to fresh
/// rows, then to more due ones. Ten ranges of the claim index (the nine due bands, the
/// fresh rows), each read in its order as far as the claim needs; one statement: the inner SELECTs skip rows another
/// instance is claiming at the same moment.
pub(super) const CLAIM: &str = concat!(
    "\
UPDATE service_requests s SET lease_owner = $1,
       lease_until = ",
    crate::store::sql::now_plus_ms!("$2"),
    ", updated_at = now()
FROM (
    WITH due AS (
        SELECT d.id, d.lease_until, d.lease_owner, row_number() OVER () AS n FROM (
            -- The nine due bands in order (priority 9 first), each read in its order as
            -- far as the claim needs.
            SELECT x.id, x.lease_until, x.lease_owner
            FROM generate_series(0, 8) AS b(band) CROSS JOIN LATERAL (
                SELECT id, lease_until, lease_owner FROM service_requests
                WHERE status IN ",
    crate::store::sql::claimable!(),
    " AND ",
    crate::store::sql::due_in_band!(concat!("b.band * ", crate::store::sql::due_band!())),
    "
                ORDER BY ",
    crate::store::sql::claim_rank!(),
    "
                LIMIT $3
                FOR UPDATE SKIP LOCKED) x
            LIMIT $3) d
    ), fresh AS (
        SELECT id, lease_until, lease_owner FROM service_requests
        WHERE status IN ",
    crate::store::sql::claimable!(),
    " AND ",
    crate::store::sql::claim_rank!(),
    " <= 0
        ORDER BY ",
    crate::store::sql::claim_rank!(),
    "
        LIMIT $3
        FOR UPDATE SKIP LOCKED
    )
    -- In this order (an Append reads its parts one after another): the first half of
    -- the due rows, the fresh ones, the rest of the due ones.
    SELECT id, lease_until, lease_owner FROM due WHERE n <= ($3 + 1) / 2
    UNION ALL
    SELECT id, lease_until, lease_owner FROM fresh
    UNION ALL
    SELECT id, lease_until, lease_owner FROM due WHERE n > ($3 + 1) / 2
    LIMIT $3) was
WHERE s.id = was.id
RETURNING
    -- A timer fired: the row was left unleased until a time (a WAIT's end, a back-off, a
    -- delayed start), not leased by an instance that died, nor free since its insert.
    CASE WHEN was.lease_owner IS NULL AND was.lease_until > '-infinity'
         THEN extract(epoch FROM now() - was.lease_until)::float8 END AS fired_late_s, ",
    crate::store::sql::claimed_columns!("s")
);

/// Rows claimed: each as claimed, and for a timer's fire, how late it was taken (s).
pub async fn claim(
    conn: &PgConn,
    owner: Uuid,
    lease: Duration,
    limit: i64,
) -> Result<Vec<(Claimed, Option<f64>)>> {
    let stmt = conn.stmt(CLAIM).await?;
    // Pinned to the claim index like every statement (the pool's sessions run with
    // enable_seqscan = off; see `store::connect::session`).
    let rows = conn
        .client
        .query(&stmt, &[&owner, &(lease.as_secs_f64() * 1000.0), &limit])
        .await?;
    Ok(rows
        .iter()
        .map(|r| (Claimed::from_row_at(r, 1), r.get(0)))
        .collect())
}

impl Claimed {
    /// Reads a row returning `sql::claimed_columns!`.
    pub fn from_row(r: &tokio_postgres::Row) -> Claimed {
        Claimed::from_row_at(r, 0)
    }

    /// The same columns from column `at` on.
    pub fn from_row_at(r: &tokio_postgres::Row, at: usize) -> Claimed {
        Claimed {
            id: r.get(at),
            workflow_name: r.get(at + 1),
            status: r.get(at + 2),
            payload: r.get(at + 3),
            headers: r.get(at + 4),
            current_step_id: r.get::<_, i32>(at + 5).max(0) as u32,
            step_request: r.get(at + 6),
            failed_step_id: r.get::<_, Option<i32>>(at + 7).map(|s| s.max(0) as u32),
            reason: r.get(at + 8),
            step_attempts: r.get::<_, i32>(at + 9).max(0) as u32,
            created_us: r.get(at + 10),
            workflow_version: r.get::<_, i32>(at + 11).max(1) as u32,
            parent_id: r.get(at + 12),
            retries: r.get(at + 13),
            deadline_in_ms: r.get(at + 14),
            priority: r.get(at + 15),
        }
    }
}

/// Extends the leases of `ids` still held by `owner`; returns the ids another instance
/// holds now (lost). Ids whose lease this instance released (finished or paused
/// meanwhile) are neither renewed nor lost.
pub(super) const RENEW: &str = concat!(
    "\
WITH ids AS (SELECT unnest($3::uuid[]) AS id),
renewed AS (
    UPDATE service_requests s SET lease_until = ",
    crate::store::sql::now_plus_ms!("$2"),
    "
    FROM ids WHERE s.id = ids.id AND s.lease_owner = $1
    RETURNING s.id)
SELECT s.id FROM ids JOIN service_requests s ON s.id = ids.id
WHERE s.lease_owner IS NOT NULL AND s.lease_owner <> $1"
);

pub async fn renew(conn: &PgConn, owner: Uuid, lease: Duration, ids: &[Uuid]) -> Result<Vec<Uuid>> {
    let ms = lease.as_secs_f64() * 1000.0;
    let mut lost = Vec::new();
    for (set, group) in conn.partitions().group(ids, |id| *id) {
        let rows = super::partitions::on_set(conn, RENEW, set.as_ref(), |stmt| {
            let group = &group;
            async move { conn.client.query(&stmt, &[&owner, &ms, group]).await }
        })
        .await?;
        lost.extend(rows.iter().map(|r| r.get::<_, Uuid>(0)));
    }
    Ok(lost)
}

pub(super) const RELEASE: &str = concat!(
    "UPDATE service_requests SET lease_owner = NULL, \
     lease_until = CASE WHEN $3::float8 > 0 THEN ",
    crate::store::sql::now_plus_ms!("$3"),
    " ELSE '-infinity' END \
     FROM unnest($2::uuid[]) AS u(id) WHERE service_requests.id = u.id AND lease_owner = $1"
);

/// Gives up the leases `owner` holds on `ids`, so another instance can continue them
/// after `delay` (zero: at once).
pub async fn release(conn: &PgConn, owner: Uuid, ids: &[Uuid], delay: Duration) -> Result<u64> {
    let ms = delay.as_secs_f64() * 1000.0;
    let mut n = 0;
    for (set, group) in conn.partitions().group(ids, |id| *id) {
        n += super::partitions::on_set(conn, RELEASE, set.as_ref(), |stmt| {
            let group = &group;
            async move { conn.client.execute(&stmt, &[&owner, group, &ms]).await }
        })
        .await?;
    }
    Ok(n)
}

/// What one finished step received and answered, parsed (text that is not JSON as a
/// string): the engine rebuilds a request's step context from these.
pub struct StepContext {
    pub step_name: String,
    pub request: Option<Value>,
    pub response: Option<Value>,
}

pub(super) const LOAD_CONTEXT: &str = concat!(
    "SELECT st.step_name, ",
    crate::store::sql::step_request!("st", "r.payload"),
    ", st.response FROM steps_status st \
     JOIN service_requests r ON r.id = st.service_request_id \
     WHERE st.service_request_id = $1 AND st.step_id > 0 ORDER BY st.id"
);

/// The records of a request's finished steps, in the order they ran (its lanes' steps
/// left out: they are seen within their branch, `lanes`), for its step context when it continues after a pause or a restart.
pub async fn load_context(conn: &PgConn, id: Uuid) -> Result<Vec<StepContext>> {
    let stmt = conn.stmt(LOAD_CONTEXT).await?;
    let rows = conn.client.query(&stmt, &[&id]).await?;
    Ok(rows
        .iter()
        .map(|r| StepContext {
            step_name: r.get(0),
            request: parse_opt(r.get(1)),
            response: parse_opt(r.get(2)),
        })
        .collect())
}

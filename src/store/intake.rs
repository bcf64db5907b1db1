//! Intake batches: plain creates stored as one row per flush (see migration 0005).
//!
//! Postgres's work per request is then a share of one tuple, instead of a tuple and three
//! index entries: the batch's requests are parallel arrays, and a request id is the batch
//! id plus its slot (`ids::intake_slot`), so a read finds a batch by primary key. A request
//! gets its own `service_requests` row later, by whichever comes first:
//!
//! - its first transition: the executor holding the batch's lease inserts the row with
//!   that step's outcome (`transitions`), so the row is written once instead of inserted
//!   and then updated;
//! - a cancel (`cancel`), which inserts it as CANCELLED;
//! - a sweeper that takes over a batch whose lease ran out or was never taken
//!   (`claim_expired`): it deletes the batch and inserts every request without a row yet
//!   as NEW and unleased, for the usual claim.
//!
//! The executor deletes a batch row once each of its requests has its own row
//! (`IntakeBatch::settled`); until then it renews the batch's lease with its requests'.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use uuid::Uuid;

use super::buffer::{Columns, PendingRow};
use super::pool::PgConn;
use super::Result;

/// A batch handed to the local executor: which batch, and how many of its requests do
/// not have their own row yet.
#[derive(Debug)]
pub struct IntakeBatch {
    pub id: Uuid,
    unsettled: AtomicUsize,
}

impl IntakeBatch {
    pub fn new(id: Uuid, n: usize) -> IntakeBatch {
        IntakeBatch {
            id,
            unsettled: AtomicUsize::new(n),
        }
    }

    /// One request of the batch has its own row now (or is no longer this instance's);
    /// true for the last one: the batch row can go.
    pub fn settled(&self) -> bool {
        self.unsettled.fetch_sub(1, Ordering::AcqRel) == 1
    }
}

const INSERT: &str = concat!(
    "INSERT INTO intake_batches (id, lease_owner, lease_until, ids, workflows, payloads, headers, created) \
     VALUES ($1, $2, CASE WHEN $2::uuid IS NULL THEN '-infinity' ELSE ",
    crate::now_plus_ms!("$3"),
    " END, $4, $5, $6, $7, $8)"
);

/// Writes `rows` as batch `id` (committing on its own), leased to `owner` for `lease` if
/// given; each row's id is already `ids::intake_slot(id, its index)`.
pub async fn insert(
    conn: &PgConn,
    id: Uuid,
    owner: Option<Uuid>,
    lease: Duration,
    rows: &[PendingRow],
) -> std::result::Result<u64, tokio_postgres::Error> {
    let c = Columns::of(rows.iter());
    let lease_ms = lease.as_secs_f64() * 1000.0;
    let stmt = conn.stmt(INSERT).await?;
    conn.client
        .execute(
            &stmt,
            &[
                &id,
                &owner,
                &lease_ms,
                &c.ids,
                &c.names,
                &c.payloads,
                &c.headers,
                &c.created,
            ],
        )
        .await
}

/// Takes over up to `$1` batches whose lease is free or ran out: deletes them and gives
/// every request without its own row one (NEW, unleased), in one statement. Rows that
/// exist already (the first owner wrote them, or a cancel did) are left alone.
const CLAIM_EXPIRED: &str = "\
WITH taken AS (
    DELETE FROM intake_batches WHERE id IN (
        SELECT id FROM intake_batches WHERE lease_until < now()
        ORDER BY lease_until LIMIT $1 FOR UPDATE SKIP LOCKED)
    RETURNING ids, workflows, payloads, headers, created)
INSERT INTO service_requests (id, workflow_name, payload, headers, created_at)
SELECT u.id, u.workflow_name, u.payload, u.headers, u.created_at
FROM taken CROSS JOIN LATERAL unnest(taken.ids, taken.workflows, taken.payloads, taken.headers, taken.created)
    AS u(id, workflow_name, payload, headers, created_at)
ON CONFLICT (id) DO NOTHING";

/// Returns how many requests got their own row.
pub async fn claim_expired(conn: &PgConn, batches: i64) -> Result<u64> {
    let stmt = conn.stmt(CLAIM_EXPIRED).await?;
    Ok(conn.client.execute(&stmt, &[&batches]).await?)
}

/// Deletes batches whose every request has its own row now, if still leased to `owner`.
pub async fn delete_settled(conn: &PgConn, owner: Uuid, batches: &[Uuid]) -> Result<u64> {
    let stmt = conn
        .stmt("DELETE FROM intake_batches WHERE id = ANY($2) AND lease_owner = $1")
        .await?;
    Ok(conn.client.execute(&stmt, &[&owner, &batches]).await?)
}

/// Gives up `owner`'s lease on `batches`, so a sweeper takes them over at once.
pub async fn release(conn: &PgConn, owner: Uuid, batches: &[Uuid]) -> Result<u64> {
    let stmt = conn
        .stmt(
            "UPDATE intake_batches SET lease_owner = NULL, lease_until = '-infinity' \
             WHERE lease_owner = $1 AND id = ANY($2)",
        )
        .await?;
    Ok(conn.client.execute(&stmt, &[&owner, &batches]).await?)
}

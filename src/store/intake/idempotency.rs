//! Idempotent creates, resolved inside the batched insert.
//!
//! A batch that carries `Idempotency-Key`s is written by one statement that claims each
//! key in `idempotency_keys` (`ON CONFLICT`: a key another create holds within the window
//! is not taken; an expired one is taken over) and inserts the service requests of the
//! keys it claimed and of the rows without a key. The unique index decides between
//! concurrent duplicates on any instance: the loser's statement waits for the winner's
//! commit. Rows whose key was taken are then looked up (a second statement, after the
//! first committed, so it sees the winner) for the original request, its status, and
//! whether the payload was the same.

use std::time::Duration;

use uuid::Uuid;

use super::raw_json::RawJson;
use super::Result;
use super::{PgConn, Pool};

/// A key's digest: the first 128 bits of SHA-256 over the workflow name (after its
/// length, so no name and key run into another pair) and the key, so every key is one
/// fixed-size primary-key entry.
pub fn key_hash(workflow: &str, key: &str) -> Uuid {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update((workflow.len() as u64).to_le_bytes());
    h.update(workflow.as_bytes());
    h.update(key.as_bytes());
    let digest = h.finalize();
    let mut first = [0u8; 16];
    first.copy_from_slice(&digest[..16]);
    Uuid::from_bytes(first)
}

/// The usual case: every key is new, and a plain insert claims them while every row is
/// inserted. A key held already (a repeat, a concurrent claim, an expired entry) makes
/// the statement fail with a unique violation, and `INSERT_KEYED_CONFLICTS` does the batch
/// instead: an `ON CONFLICT` insert, or a probe before each insert, costs Postgres much
/// more per row than the plain insert, and repeats are the exception. The two inserts read
/// the parameters each (no shared CTE, which would copy every payload once more). A row's
/// labels come as one text separated by newlines (`$13`): a column of arrays would have to
/// be rectangular.
pub const INSERT_KEYED: &str = concat!(
    "WITH ",
    crate::store::sql::batch_versions!("$2"),
    ", claimed AS (
    INSERT INTO idempotency_keys (key_hash, service_request_id)
    SELECT h, id FROM UNNEST($8::uuid[], $1::uuid[]) AS k(h, id) WHERE h IS NOT NULL
), ins AS (
INSERT INTO service_requests (id, workflow_name, payload, headers, lease_owner, lease_until, created_at,
                              workflow_version, deadline, priority, labels, notify)
SELECT t.id, t.wf, t.payload, t.headers, ",
    crate::store::sql::fresh_lease!(),
    ", t.created, ",
    crate::store::sql::pinned_version!(),
    ", ",
    crate::store::sql::new_deadline!(),
    ", t.priority, string_to_array(t.labels, E'\\n'), t.notify
FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::bool[], $9::timestamptz[], $10::int[],
            $11::float8[], $12::int2[], $13::text[], $14::int2[])
    AS t(id, wf, payload, headers, leased, created, ver, deadline_ms, priority, labels, notify)
LEFT JOIN v ON v.name = t.wf
)
SELECT name, version FROM v"
);

/// The batch again when a key was held, as `$1..$7` of the plain insert plus `$8` the
/// key digests (NULL for rows without a key; no digest twice in one batch), `$9` the
/// creation times, `$10` the window in seconds, `$11` the versions named, `$12` the
/// deadlines, `$13` the priorities and `$14` the labels (each row's separated by
/// newlines); returns the ids inserted. `ON CONFLICT`
/// leaves a live entry be (waiting for a concurrent claim of it to commit) and takes over
/// an expired one.
pub const INSERT_KEYED_CONFLICTS: &str = concat!(
    "WITH input AS (
    SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::bool[], $8::uuid[],
                         $9::timestamptz[], $11::int[], $12::float8[], $13::int2[], $14::text[],
                         $15::int2[])
        AS t(id, wf, payload, headers, leased, h, created, ver, deadline_ms, priority, labels,
             notify)
), ",
    crate::store::sql::batch_versions!("$2"),
    ", claimed AS (
    INSERT INTO idempotency_keys AS k (key_hash, service_request_id)
    SELECT h, id FROM input WHERE h IS NOT NULL
    ON CONFLICT (key_hash) DO UPDATE
        SET service_request_id = EXCLUDED.service_request_id, created_at = now()
        WHERE k.created_at < now() - $10::float8 * interval '1 second'
    RETURNING service_request_id
), inserted AS (
    INSERT INTO service_requests (id, workflow_name, payload, headers, lease_owner, lease_until, created_at,
                                  workflow_version, deadline, priority, labels, notify)
    SELECT t.id, t.wf, t.payload, t.headers, ",
    crate::store::sql::fresh_lease!(),
    ", t.created, ",
    crate::store::sql::pinned_version!(),
    ", ",
    crate::store::sql::new_deadline!(),
    ", t.priority, string_to_array(t.labels, E'\\n'), t.notify
    FROM input t LEFT JOIN v ON v.name = t.wf
    WHERE t.h IS NULL OR t.id IN (SELECT service_request_id FROM claimed)
    RETURNING id, coalesce(workflow_version, 1) AS workflow_version
)
SELECT id, workflow_version FROM inserted"
);

/// The requests that hold keys: per input row (its index), the request's id, whether its
/// stored payload is the same, and its status as reads show it (both NULL when the row
/// was deleted by retention).
pub(in crate::store) const LOOKUP: &str = concat!(
    "SELECT t.idx, k.service_request_id, r.payload = t.payload, ",
    crate::store::sql::derived_status!("r"),
    "
FROM UNNEST($1::int[], $2::uuid[], $3::text[]) AS t(idx, h, payload)
JOIN idempotency_keys k ON k.key_hash = t.h
LEFT JOIN service_requests r ON r.id = k.service_request_id"
);

/// What holds a key another create claimed first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub id: Uuid,
    /// Whether the request's stored payload is the same (None: deleted by retention).
    pub same_payload: Option<bool>,
    /// The request's status now (None: deleted by retention).
    pub status: Option<crate::status::RequestStatus>,
}

/// One row to look up: its index in the caller's batch, its key's digest, its payload.
pub struct Lookup<'a> {
    pub idx: i32,
    pub key_hash: Uuid,
    pub payload: &'a [u8],
}

/// Looks up who holds each key; a row missing from the answer had its key expire and be
/// deleted in between (the caller answers it as unavailable, and the client retries).
pub async fn holders(conn: &PgConn, rows: &[Lookup<'_>]) -> Result<Vec<(i32, Holder)>> {
    let idx: Vec<i32> = rows.iter().map(|r| r.idx).collect();
    let hashes: Vec<Uuid> = rows.iter().map(|r| r.key_hash).collect();
    let payload: Vec<RawJson> = rows.iter().map(|r| RawJson(r.payload)).collect();
    let stmt = conn.stmt(LOOKUP).await?;
    let found = conn.client.query(&stmt, &[&idx, &hashes, &payload]).await?;
    Ok(found
        .iter()
        .map(|r| {
            (
                r.get(0),
                Holder {
                    id: r.get(1),
                    same_payload: r.get(2),
                    status: r.get(3),
                },
            )
        })
        .collect())
}

/// Keys deleted per statement, so a large backlog never holds locks for long.
const DELETE_BATCH: i64 = 5_000;

/// Up to `$2` keys older than `$1` seconds.
pub(in crate::store) const DELETE_EXPIRED: &str =
    "DELETE FROM idempotency_keys WHERE ctid IN (SELECT ctid FROM idempotency_keys \
     WHERE created_at < now() - $1::float8 * interval '1 second' LIMIT $2)";

/// Deletes keys past the window, in batches; returns how many.
pub async fn delete_expired(pool: &Pool, window: Duration) -> Result<u64> {
    let mut total = 0;
    loop {
        let conn = pool.get().await?;
        let n = conn
            .client
            .execute(DELETE_EXPIRED, &[&window.as_secs_f64(), &DELETE_BATCH])
            .await?;
        total += n;
        if (n as i64) < DELETE_BATCH {
            return Ok(total);
        }
    }
}

/// Deletes expired keys every `every` until `stop` turns true.
pub async fn run_cleanup(
    pool: Pool,
    window: Duration,
    every: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(every) => {}
        }
        match delete_expired(&pool, window).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(n, "deleted expired idempotency keys"),
            Err(e) => tracing::warn!(error = %e, "could not delete expired idempotency keys"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_scoped_by_its_workflow() {
        assert_eq!(key_hash("orders", "k1"), key_hash("orders", "k1"));
        assert_ne!(key_hash("orders", "k1"), key_hash("refunds", "k1"));
        assert_ne!(key_hash("orders", "k1"), key_hash("orders", "k2"));
        // A name and a key never run into another pair.
        assert_ne!(key_hash("a", "bc"), key_hash("ab", "c"));
    }
}

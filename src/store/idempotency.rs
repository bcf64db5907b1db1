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
use super::{PgConn, Pool, StoreError};

/// The insert of a batch with keys: `$1..$7` as the plain insert, `$8` the keys (NULL for
/// rows without one; no key twice in one batch), `$9` the window in seconds.
pub const INSERT_KEYED: &str = concat!(
    "WITH input AS (
    SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::bool[], $8::text[])
        AS t(id, wf, payload, headers, leased, key)
), claimed AS (
    INSERT INTO idempotency_keys AS k (workflow_name, key, service_request_id, payload_md5)
    SELECT wf, key, id, md5(payload) FROM input WHERE key IS NOT NULL
    ON CONFLICT (workflow_name, key) DO UPDATE
        SET service_request_id = EXCLUDED.service_request_id,
            payload_md5 = EXCLUDED.payload_md5, created_at = now()
        WHERE k.created_at < now() - $9::float8 * interval '1 second'
    RETURNING service_request_id
), inserted AS (
    INSERT INTO service_requests (id, workflow_name, payload, headers, lease_owner, lease_until)
    SELECT id, wf, payload, headers,
           CASE WHEN leased THEN $6::uuid END,
           CASE WHEN leased THEN ",
    crate::now_plus_ms!("$7"),
    " ELSE '-infinity' END
    FROM input i
    WHERE i.key IS NULL OR i.id IN (SELECT service_request_id FROM claimed)
    RETURNING id
)
SELECT id FROM inserted"
);

/// The requests that hold keys: per input row (its index), the request's id, whether
/// the stored payload is the same, and its status as reads show it (NULL when the row
/// was deleted by retention).
const LOOKUP: &str = concat!(
    "SELECT t.idx, k.service_request_id, k.payload_md5 = md5(t.payload), ",
    crate::derived_status!("r"),
    "
FROM UNNEST($1::int[], $2::text[], $3::text[], $4::text[]) AS t(idx, wf, key, payload)
JOIN idempotency_keys k ON k.workflow_name = t.wf AND k.key = t.key
LEFT JOIN service_requests r ON r.id = k.service_request_id"
);

/// What holds a key another create claimed first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub id: Uuid,
    pub same_payload: bool,
    /// The request's status now (None: it was deleted by retention).
    pub status: Option<String>,
}

/// One row to look up: its index in the caller's batch, workflow, key and payload.
pub struct Lookup<'a> {
    pub idx: i32,
    pub workflow: &'a str,
    pub key: &'a str,
    pub payload: &'a [u8],
}

/// Looks up who holds each key; a row missing from the answer had its key expire and be
/// deleted in between (the caller answers it as unavailable, and the client retries).
pub async fn holders(conn: &PgConn, rows: &[Lookup<'_>]) -> Result<Vec<(i32, Holder)>, StoreError> {
    let idx: Vec<i32> = rows.iter().map(|r| r.idx).collect();
    let wf: Vec<&str> = rows.iter().map(|r| r.workflow).collect();
    let key: Vec<&str> = rows.iter().map(|r| r.key).collect();
    let payload: Vec<RawJson> = rows.iter().map(|r| RawJson(r.payload)).collect();
    let stmt = conn.stmt(LOOKUP).await?;
    let found = conn
        .client
        .query(&stmt, &[&idx, &wf, &key, &payload])
        .await?;
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

/// Deletes keys past the window, in batches; returns how many.
pub async fn delete_expired(pool: &Pool, window: Duration) -> Result<u64, StoreError> {
    let mut total = 0;
    loop {
        let conn = pool.get().await?;
        let n = conn
            .client
            .execute(
                "DELETE FROM idempotency_keys WHERE ctid IN (SELECT ctid FROM idempotency_keys \
                 WHERE created_at < now() - $1::float8 * interval '1 second' LIMIT $2)",
                &[&window.as_secs_f64(), &DELETE_BATCH],
            )
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

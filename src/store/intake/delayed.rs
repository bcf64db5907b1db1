//! Delayed service requests (beyond Clamp): a create that names a later start is written
//! by itself, unleased, with `lease_until` at its start, so that the claim of any
//! instance takes it then (`lease_until < now()`) and not before. Creates without a
//! start never come here: the batched insert is as it was.

use std::time::SystemTime;

use uuid::Uuid;

use super::raw_json::RawJson;
use super::PgConn;
use super::Result;

/// One delayed create. `version` 0: the latest version when the row is stored.
pub struct Delayed<'a> {
    pub id: Uuid,
    pub workflow: &'a str,
    pub version: i32,
    pub payload: &'a [u8],
    pub headers: &'a [u8],
    pub created: SystemTime,
    pub start: SystemTime,
    /// Its deadline, in ms from its start (None: none).
    pub deadline_ms: Option<f64>,
    /// Its priority (None: the default).
    pub priority: Option<i16>,
    /// Its labels (None: none).
    pub labels: Option<&'a [String]>,
    /// The final statuses its workflow tells of (None: none).
    pub notify: Option<i16>,
}

/// `$1` id, `$2` workflow, `$3` payload, `$4` headers, `$5` created, `$6` start, `$7` the
/// version named (0: the latest, stored as NULL when it is 1, as `pinned_version!`), `$8`
/// the deadline in ms from the start (NULL: none), `$9` the priority (NULL: the default),
/// `$10` the labels (NULL: none), `$11` the statuses told of (NULL: none).
pub(in crate::store) const INSERT: &str = concat!(
    "INSERT INTO service_requests (id, workflow_name, payload, headers, lease_owner, \
     lease_until, created_at, workflow_version, start_at, deadline, priority, labels, notify) \
     SELECT $1, $2, $3, $4, NULL, $6, $5, ",
    crate::store::sql::pinned_version!(
        "$7::int",
        "(SELECT w.version FROM workflows w WHERE w.name = $2)"
    ),
    ", $6, $6::timestamptz + $8::float8 * interval '1 millisecond', $9::int2, \
     $10::text[], $11::int2"
);

/// Stores `d`; answered after its commit.
pub async fn insert(conn: &PgConn, d: &Delayed<'_>) -> Result<()> {
    let stmt = conn.stmt(INSERT).await?;
    conn.client
        .execute(
            &stmt,
            &[
                &d.id,
                &d.workflow,
                &RawJson(d.payload),
                &RawJson(d.headers),
                &d.created,
                &d.start,
                &d.version,
                &d.deadline_ms,
                &d.priority,
                &d.labels,
                &d.notify,
            ],
        )
        .await?;
    Ok(())
}

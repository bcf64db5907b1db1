//! Counts of requests by status and by minute of creation, over a window of at most a
//! day, all workflows or one (`GET /serviceRequestCounts`, beyond Clamp; the console's
//! counts and its requests-per-minute chart). Like search it has no index of its own: the
//! window is an id range (ids are UUIDv7), read from the primary key or the by-workflow
//! index, so its cost is the rows created in the window.

use std::time::SystemTime;

use uuid::Uuid;

use super::pool::PgConn;
use super::Result;

/// Requests created in one minute with one status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// The minute's start, in seconds since the Unix epoch.
    pub minute: i64,
    /// As reads show it (`IN_PROGRESS` derived).
    pub status: crate::status::RequestStatus,
    pub count: i64,
}

/// `$1`/`$2` id bounds, `$3`/`$4` exact time bounds, `$5` the workflow or NULL.
pub(super) const COUNTS: &str = concat!(
    "SELECT extract(epoch FROM date_trunc('minute', s.created_at))::bigint AS minute, ",
    crate::store::sql::derived_status!("s"),
    " AS status, count(*) FROM service_requests s \
     WHERE s.id >= $1 AND s.id < $2 AND s.created_at > $3 AND s.created_at < $4 \
       AND ($5::text IS NULL OR s.workflow_name = $5) \
     GROUP BY 1, 2 ORDER BY 1, 2"
);

/// The buckets of requests created strictly between `after` and `before`, oldest first.
pub async fn counts(
    conn: &PgConn,
    workflow: Option<&str>,
    after: SystemTime,
    before: SystemTime,
) -> Result<Vec<Bucket>> {
    let (lower, upper): (Uuid, Uuid) = super::search::id_bounds(Some(after), Some(before));
    // Planned for its values, as search by workflow is: how common the workflow is decides
    // between the primary key and the by-workflow index.
    let rows = conn
        .client
        .query(COUNTS, &[&lower, &upper, &after, &before, &workflow])
        .await?;
    Ok(rows
        .iter()
        .map(|r| Bucket {
            minute: r.get(0),
            status: r.get(1),
            count: r.get(2),
        })
        .collect())
}

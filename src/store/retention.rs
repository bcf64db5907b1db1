//! Retention: finished service requests (and their step records) older than the
//! configured age are deleted in small batches, so the tables and their indexes stop
//! growing without bound. Off unless configured (`--retention-days`).
//!
//! Ids are UUIDv7, ordered by creation time, so "created before the cut-off" is a range
//! of the primary key: each batch is an index range scan, with no extra index to keep up
//! on the hot path. A request is deleted only if it also *finished* before the cut-off.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use uuid::Uuid;

use super::Pool;
use super::Result;
use crate::metrics::Metrics;

/// Rows deleted per statement: small enough to keep each transaction short.
const BATCH: i64 = 1000;

pub(super) const DELETE_FINISHED: &str = concat!(
    "\
WITH doomed AS (
    SELECT id FROM service_requests
    WHERE id < $1 AND status IN (",
    crate::status::status_sql!(Completed),
    ", ",
    crate::status::status_sql!(Failed),
    ")
      AND finished_at < now() - $2::float8 * interval '1 millisecond'
    ORDER BY id
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), steps AS (
    DELETE FROM steps_status WHERE service_request_id IN (SELECT id FROM doomed)
), takes AS (
    DELETE FROM event_takes WHERE service_request_id IN (SELECT id FROM doomed)
)
DELETE FROM service_requests WHERE id IN (SELECT id FROM doomed)"
);

/// The smallest UUIDv7 of the given instant: every id made before it sorts lower.
pub fn v7_floor(at: SystemTime) -> Uuid {
    let ms = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis()) as u64;
    let mut b = [0u8; 16];
    b[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    b[6] = 0x70; // version 7
    b[8] = 0x80; // RFC 4122 variant
    Uuid::from_bytes(b)
}

/// Deletes expired finished requests every `every` until `stop` fires.
pub async fn run(
    pool: Pool,
    keep: Duration,
    every: Duration,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        match sweep(&pool, keep, &metrics, &stop).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "retention: deleted finished service requests"),
            Err(e) => tracing::warn!(error = %e, "retention pass failed; trying again later"),
        }
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// One pass: batches until nothing expired is left (or stopping). Returns rows deleted.
pub async fn sweep(
    pool: &Pool,
    keep: Duration,
    metrics: &Metrics,
    stop: &watch::Receiver<bool>,
) -> Result<u64> {
    let floor = v7_floor(SystemTime::now() - keep);
    let keep_ms = keep.as_secs_f64() * 1000.0;
    let mut total = 0;
    loop {
        let conn = pool.get().await?;
        let n = conn
            .client
            .execute(DELETE_FINISHED, &[&floor, &keep_ms, &BATCH])
            .await?;
        drop(conn);
        total += n;
        metrics.retention_deleted.inc_by(n);
        if (n as i64) < BATCH || *stop.borrow() {
            return Ok(total);
        }
        // Leave room for the real work between batches.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_sorts_below_every_later_id_and_above_earlier_ones() {
        let now = SystemTime::now();
        let floor = v7_floor(now);
        let later = Uuid::now_v7();
        assert!(floor < later);
        let earlier = v7_floor(now - Duration::from_millis(5));
        assert!(earlier < floor);
        assert_eq!(floor.get_version_num(), 7);
    }
}

//! Housekeeping: what clamp keeps besides requests, deleted past its age, so no table
//! grows without bound: audit records (`--audit-retention-days`), dead-lettered messages
//! (`--dead-letter-retention-days`), delivered events past their keep window
//! (`--event-retention-days`; until then their ids still deduplicate a redelivery) and
//! console sessions past their expiry. One task per instance, every minute; each table in
//! batches, so a large backlog never holds locks for long. Instances share the work
//! safely: a row two passes would delete is deleted once.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{Pool, Result};
use crate::config::Housekeeping;
use crate::metrics::Metrics;

/// Rows deleted per statement.
const BATCH: i64 = 1000;

/// `$1` age (ms), `$2` how many: audit records older than the age.
pub(super) const AUDIT: &str = "DELETE FROM audit_log WHERE id IN (SELECT id FROM audit_log \
     WHERE at < now() - $1::float8 * interval '1 millisecond' ORDER BY id LIMIT $2)";

/// `$1` age (ms), `$2` how many: dead letters set aside longer ago than the age.
pub(super) const DEAD_LETTERS: &str =
    "DELETE FROM dead_letters WHERE id IN (SELECT id FROM dead_letters \
     WHERE created_at < now() - $1::float8 * interval '1 millisecond' ORDER BY id LIMIT $2)";

/// `$1` age (ms), `$2` how many: notifications delivered or failed longer ago than the
/// age (kept as long as dead letters; pending ones stay). Oldest first, by id.
pub(super) const NOTIFICATIONS: &str =
    "DELETE FROM notifications WHERE id IN (SELECT id FROM notifications \
     WHERE state <> 'pending' AND finished_at < now() - $1::float8 * interval '1 millisecond' \
     ORDER BY id LIMIT $2)";

/// `$1` idle (ms), `$2` absolute (ms), `$3` how many: console sessions that expired.
pub(super) const SESSIONS: &str = "DELETE FROM console_sessions WHERE id_hash IN (\
     SELECT id_hash FROM console_sessions \
     WHERE seen_at < now() - $1::float8 * interval '1 millisecond' \
        OR created_at < now() - $2::float8 * interval '1 millisecond' LIMIT $3)";

/// What the housekeeping deletes, and the sessions' expiry.
#[derive(Debug, Clone, Copy)]
pub struct Ages {
    pub kept: Housekeeping,
    pub session_idle: Duration,
    pub session_max: Duration,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Runs `sql` with `params` and `BATCH` until fewer than a batch are deleted.
async fn drain(
    pool: &Pool,
    sql: &'static str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<u64> {
    let mut total = 0;
    loop {
        let conn = pool.get().await?;
        let stmt = conn.stmt(sql).await?;
        let mut all: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params.to_vec();
        all.push(&BATCH);
        let n = conn.client.execute(&stmt, &all).await?;
        total += n;
        if (n as i64) < BATCH {
            return Ok(total);
        }
    }
}

/// One pass over every table; counts what it deleted.
pub async fn sweep(pool: &Pool, ages: &Ages, metrics: &Metrics) -> Result<()> {
    if let Some(age) = ages.kept.audit {
        metrics
            .audit_deleted
            .inc_by(drain(pool, AUDIT, &[&ms(age)]).await?);
    }
    if let Some(age) = ages.kept.dead_letters {
        metrics
            .dead_letters_deleted
            .inc_by(drain(pool, DEAD_LETTERS, &[&ms(age)]).await?);
        drain(pool, NOTIFICATIONS, &[&ms(age)]).await?;
    }
    metrics.events_expired.inc_by(
        drain(
            pool,
            super::events::FORGET,
            &[&ms(ages.kept.events_after_keep)],
        )
        .await?,
    );
    metrics.sessions_expired.inc_by(
        drain(
            pool,
            SESSIONS,
            &[&ms(ages.session_idle), &ms(ages.session_max)],
        )
        .await?,
    );
    Ok(())
}

/// Sweeps every `every` until `stop` fires.
pub async fn run(
    pool: Pool,
    ages: Ages,
    every: Duration,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        if let Err(e) = sweep(&pool, &ages, &metrics).await {
            tracing::warn!(error = %e, "housekeeping pass failed; trying again later");
        }
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

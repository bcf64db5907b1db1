//! The schedule runner (beyond Clamp): one task per process, on the first runtime, that
//! makes due fires every pass (`store::schedules::pass`) and wakes this runtime's sweeper
//! for the requests they stored. Every instance runs one; the pass's row locks and the
//! fires' keys make each fire happen once among them. Nothing about a schedule lives
//! here between passes: a restarted or new instance carries on from Postgres.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::engine::Executor;
use crate::store::schedules;
use crate::store::StoreError;

/// Longest wait between passes (a fire is at most about this late on a live system);
/// a shorter `--sweep-interval-ms` shortens it too.
pub const MAX_PASS_INTERVAL: Duration = Duration::from_millis(200);

/// Due schedules one pass takes (more are left to the next pass, at once).
const PASS_LIMIT: i64 = 100;

/// How often old fire rows are deleted (`store::schedules::KEEP_FIRES`).
const PRUNE_INTERVAL: Duration = Duration::from_secs(60);

/// Runs passes until `stop` fires.
pub async fn run(exec: Arc<Executor>, mut stop: watch::Receiver<bool>) {
    let every = exec.app.config.sweep_interval.min(MAX_PASS_INTERVAL);
    let mut last_prune = Instant::now();
    loop {
        let full = match pass(&exec).await {
            Ok(n) => n >= PASS_LIMIT as usize,
            Err(e) => {
                tracing::warn!(error = %e, "schedule pass failed; trying again");
                false
            }
        };
        if last_prune.elapsed() >= PRUNE_INTERVAL {
            last_prune = Instant::now();
            if let Err(e) = prune(&exec).await {
                tracing::warn!(error = %e, "could not delete old schedule fires");
            }
        }
        let pause = if full { Duration::ZERO } else { every };
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        if *stop.borrow() {
            return;
        }
    }
}

/// One pass; returns how many due schedules it handled.
async fn pass(exec: &Executor) -> Result<usize, StoreError> {
    let mut conn = exec.pool.get().await?;
    let done = schedules::pass(&mut conn, PASS_LIMIT, |s| async move {
        super::slots::schedule_terms(exec, &s).await
    })
    .await?;
    drop(conn);
    let m = &exec.app.metrics;
    m.schedule_fires[0].inc_by(done.started.len() as u64);
    m.schedule_fires[1].inc_by(done.skipped as u64);
    for late in &done.started {
        m.schedule_lateness
            .observe(late.num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6);
    }
    if !done.started.is_empty() {
        exec.wake();
    }
    if !done.queued.is_empty() {
        // Fires of limited workflows wait in their keys' queues: admitted now where a
        // slot is free (else by the admitter's next pass).
        if let Err(e) = super::slots::admit_queued(exec, &done.queued).await {
            tracing::debug!(error = %e, "fires not admitted now; the admitter's next pass does");
        }
    }
    for (name, why) in &done.broken {
        tracing::error!(schedule = %name, error = %why, "stored schedule no longer reads; it fires no more until replaced");
    }
    Ok(done.handled)
}

async fn prune(exec: &Executor) -> Result<(), StoreError> {
    let conn = exec.pool.get().await?;
    schedules::prune(&conn).await?;
    Ok(())
}

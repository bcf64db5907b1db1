//! What `GET /ready` and `GET /metrics` read: whether the database answers, and the
//! gauges counted only when someone reads them.

use std::time::Duration;

use crate::state::App;
use crate::store::Pool;

/// Whether the database answers a query within `timeout`.
pub async fn ready(pool: &Pool, timeout: Duration) -> bool {
    matches!(
        tokio::time::timeout(timeout, crate::store::pool::ping(pool)).await,
        Ok(true)
    )
}

/// How often a scrape counts the timers, at most (per process).
const TIMERS_PERIOD_S: u64 = 30;
/// How long a scrape waits for that count before answering with the last one.
const TIMERS_TIMEOUT: Duration = Duration::from_secs(2);

/// The Prometheus text exposition. The timer gauges are counted here, when read, at most
/// once per `TIMERS_PERIOD_S`: the count reads an index entry per waiting request, a
/// cost only those who read the gauges should pay (counted every 15 s by the server
/// itself, with a million requests waiting, it cost the two-step request 3% of its rate
/// and 4% more CPU per request).
pub async fn metrics_text(app: &App, pool: &Pool) -> String {
    count_timers(app, pool).await;
    app.metrics.encode()
}

/// Counts the timers for their gauges if the last count is a period old (one scrape of
/// the process does; the others answer with it).
async fn count_timers(app: &App, pool: &Pool) {
    use std::sync::atomic::Ordering;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = app.timers_counted.load(Ordering::Relaxed);
    if now < last + TIMERS_PERIOD_S
        || app
            .timers_counted
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    let counted = tokio::time::timeout(TIMERS_TIMEOUT, async {
        let conn = pool.get().await.ok()?;
        let timers = crate::store::deadlines::timers(&conn).await.ok()?;
        let waiting = crate::store::slots::waiting_counts(&conn).await.ok()?;
        let parked = crate::store::pauses::parked_counts(&conn).await.ok()?;
        Some((timers, waiting, parked))
    })
    .await;
    match counted {
        Ok(Some(((pending, overdue_ms), waiting, parked))) => {
            app.metrics.timers_pending.set(pending);
            app.metrics.timers_overdue_ms.set(overdue_ms as i64);
            // A workflow nobody waits for any more drops out rather than stay at its
            // last count.
            app.metrics.slots_waiting.clear();
            for (workflow, n) in waiting {
                let label = crate::metrics::WorkflowLabel { workflow };
                app.metrics.slots_waiting.get_or_create(&label).set(n);
            }
            // Every paused workflow has a series (0 until a request parks); a resumed
            // one drops out once its parked requests are gone.
            app.metrics.parked.clear();
            for workflow in app.pauses.names().iter() {
                let label = crate::metrics::WorkflowLabel {
                    workflow: workflow.clone(),
                };
                app.metrics.parked.get_or_create(&label).set(0);
            }
            for (workflow, n) in parked {
                let label = crate::metrics::WorkflowLabel { workflow };
                app.metrics.parked.get_or_create(&label).set(n);
            }
        }
        // Counted again by the next scrape.
        _ => app.timers_counted.store(last, Ordering::Relaxed),
    }
}

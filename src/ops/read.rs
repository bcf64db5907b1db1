//! A request's status answer (Clamp's `pollUrl`), and beyond Clamp the long poll: at
//! most one Postgres round trip, none when the answer is known. A COMPLETED answer never
//! changes once committed, so it is kept (`reads::finals`: by the executor that finished
//! the request, or after a read) and answers later reads from memory; a request running
//! here is answered from the step rows it committed plus its row; concurrent reads share
//! one statement (`store::reader`). The answer's bytes come from the renderer the HTTP
//! layer gave the `App`, whichever way the rows were found.

use std::time::Duration;

use bytes::Bytes;
use uuid::Uuid;

use super::{no_request, OpError, Result};
use crate::backoff::Backoff;
use crate::state::Core;
use crate::status::RequestStatus;
use crate::store::reader::Want;

// The rows a read returns, as its carriers render them.
pub use crate::store::fan::Child;
pub use crate::store::notifications::Told as Notification;
pub use crate::store::queries::RequestRow;
pub use crate::store::reader::Found;
pub use crate::store::status::{Head, StepRow, Waits};

/// Now, in milliseconds since the epoch, as the engine records a step's times.
pub use crate::engine::step_io::now_ms;

/// How long a status read waits for this process's memory of a request to catch up with
/// the request row it read (a transition committed and not yet applied here).
const CATCH_UP: Duration = Duration::from_millis(50);

/// A status answer, and the status it shows.
pub struct Read {
    pub body: Bytes,
    pub status: RequestStatus,
}

/// The answer of request `id`; with `wait` (a long poll), as soon as its status changes,
/// or when `wait` has passed with the status as it is. 404 for an unknown request.
pub async fn status(core: &Core, id: Uuid, wait: Option<Duration>) -> Result<Bytes> {
    let app = &core.app;
    if let Some(body) = app.finals.get(&id) {
        app.metrics.status_reads[0].inc();
        return Ok(body);
    }
    // Registered before anything is read, so a change committed meanwhile is not missed.
    let mut watch = wait.map(|_| app.changes.watch(id));
    let (Some(wait), Some(watch)) = (wait, watch.as_mut()) else {
        return read(core, id).await.map(|r| r.body);
    };
    let deadline = tokio::time::Instant::now() + wait;
    // The status at the start. A request running here exists and shows no final status;
    // its next status change wakes this wait, with no read before it (None).
    let mut baseline: Option<RequestStatus> = None;
    if !app.running.contains(&id) {
        let r = read(core, id).await?;
        if r.status.is_final() {
            return Ok(r.body);
        }
        baseline = Some(r.status);
    }
    // A request run by another instance changes without telling this one: look again,
    // a little less often each time.
    let mut elsewhere = Backoff::new(Duration::from_millis(25), Duration::from_millis(500));
    loop {
        if app.running.contains(&id) {
            // Returns on a status change, or at the deadline.
            watch.changed(deadline).await;
        } else {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            tokio::time::sleep(elsewhere.next_delay().min(left)).await;
        }
        if let Some(body) = app.finals.get(&id) {
            app.metrics.status_reads[0].inc();
            return Ok(body);
        }
        let r = read(core, id).await?;
        if baseline != Some(r.status) || tokio::time::Instant::now() >= deadline {
            return Ok(r.body);
        }
    }
}

/// Reads a request's answer from Postgres (batched with concurrent reads), keeping it
/// when it never changes again.
///
/// Running here from its first step, its step rows are here and only its row is read:
/// found where the last committed transition left it, the row goes with exactly those
/// step rows; found anywhere else (moved on, paused, cancelled), the whole read follows.
pub async fn read(core: &Core, id: Uuid) -> Result<Read> {
    let app = &core.app;
    let fail = OpError::store("service request status");
    if let Some(live) = app.running.live(&id) {
        let f = core
            .reader
            .read(id, Want::Row)
            .await
            .map_err(&fail)?
            .ok_or_else(no_request)?;
        // The row may be ahead of memory: a transition committed and the step writer has
        // not applied it yet (it will within moments). The row is what the answer shows,
        // so wait for memory to catch up with it rather than read everything.
        let deadline = tokio::time::Instant::now() + CATCH_UP;
        let mut live = Some(live);
        loop {
            if let Some(l) = &live {
                if f.head.current_step_id == l.current_step_id
                    && f.head.step_attempts == l.step_attempts
                    && matches!(
                        f.head.status,
                        RequestStatus::New | RequestStatus::InProgress
                    )
                {
                    app.metrics.status_reads[2].inc();
                    return Ok(Read {
                        body: app.finals.render(id, &f.head, &l.steps),
                        status: f.head.status,
                    });
                }
            }
            if f.head.status.is_final() {
                if let Some(body) = app.finals.get(&id) {
                    app.metrics.status_reads[0].inc();
                    return Ok(Read {
                        body,
                        status: f.head.status,
                    });
                }
            }
            if tokio::time::Instant::now() >= deadline || !app.running.contains(&id) {
                break;
            }
            app.running.live_changed(id, deadline).await;
            live = app.running.live(&id);
        }
    }
    let f = core
        .reader
        .read(id, Want::Whole)
        .await
        .map_err(&fail)?
        .ok_or_else(no_request)?;
    app.metrics.status_reads[1].inc();
    let body = app.finals.render(id, &f.head, &f.steps);
    if f.head.status.never_changes() {
        app.finals.insert(id, body.clone(), f.finished_ms);
    }
    Ok(Read {
        body,
        status: f.head.status,
    })
}

/// Everything a request's page shows beside its answer's rows: its payload and forwarded
/// headers, its newest reruns, and the workflow version it runs (when it still loads).
pub struct Details {
    pub found: crate::store::reader::Found,
    pub payload: Option<String>,
    pub headers: Vec<(String, String)>,
    /// Its labels (beyond Clamp; empty: none).
    pub labels: Vec<String>,
    /// Its notifications (beyond Clamp), oldest first.
    pub notifications: Vec<Notification>,
    pub reruns: Vec<crate::store::queries::RequestRow>,
    /// More reruns than `reruns` holds.
    pub more_reruns: bool,
    pub workflow: Option<std::sync::Arc<crate::workflow::Workflow>>,
    /// The first of the child requests its steps started (WORKFLOW, PARALLEL, MAP).
    pub children: Vec<crate::store::fan::Child>,
    /// How many children it has in all.
    pub children_total: i64,
}

/// A request's notifications (beyond Clamp), oldest first; 404 for an unknown request.
pub async fn notifications(core: &Core, id: Uuid) -> Result<Vec<Notification>> {
    let doing = "read notifications";
    let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
    let all = crate::store::notifications::of_request(&conn, id)
        .await
        .map_err(OpError::store(doing))?;
    if all.is_empty()
        && crate::store::rerun::source(&conn, id)
            .await
            .map_err(OpError::store(doing))?
            .is_none()
    {
        return Err(no_request());
    }
    Ok(all)
}

/// Children a request's page lists.
const CHILDREN_SHOWN: i64 = 100;

/// `GET /serviceRequest/{id}/children`: page `number` (0-based) of `size` of the child
/// requests of `id`, and how many there are (404 for an unknown request).
pub async fn children(
    core: &Core,
    id: Uuid,
    number: i64,
    size: i64,
) -> Result<(Vec<crate::store::fan::Child>, i64)> {
    let doing = "list child requests";
    let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
    let (page, total) = crate::store::fan::children(&conn, id, size, size * number)
        .await
        .map_err(OpError::store(doing))?;
    if total == 0
        && crate::store::rerun::source(&conn, id)
            .await
            .map_err(OpError::store(doing))?
            .is_none()
    {
        return Err(no_request());
    }
    Ok((page, total))
}

/// Reruns a request's page lists.
const RERUNS_SHOWN: i64 = 20;

/// The console's read of request `id` (404 for an unknown request).
pub async fn details(core: &Core, id: Uuid) -> Result<Details> {
    let doing = "read service request";
    let found = core
        .reader
        .read(id, Want::Whole)
        .await
        .map_err(OpError::store(doing))?
        .ok_or_else(no_request)?;
    let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
    let (payload, headers, labels) = match crate::store::rerun::source(&conn, id)
        .await
        .map_err(OpError::store(doing))?
    {
        Some(s) => (
            Some(s.payload),
            crate::engine::stored::parse_headers(s.headers.as_bytes()),
            s.labels,
        ),
        None => (None, Vec::new(), Vec::new()),
    };
    let filter = crate::store::search::Filter {
        rerun_of: Some(id),
        limit: RERUNS_SHOWN,
        ..Default::default()
    };
    let (reruns, more) = crate::store::search::search(&conn, &filter)
        .await
        .map_err(OpError::store(doing))?;
    let (children, children_total) = crate::store::fan::children(&conn, id, CHILDREN_SHOWN, 0)
        .await
        .map_err(OpError::store(doing))?;
    let notifications = crate::store::notifications::of_request(&conn, id)
        .await
        .map_err(OpError::store(doing))?;
    drop(conn);
    let workflow = core
        .app
        .workflows
        .get_or_load_version(
            &core.pool,
            &found.head.workflow_name,
            found.head.workflow_version.max(1) as u32,
        )
        .await
        .ok()
        .flatten();
    Ok(Details {
        found,
        payload,
        headers,
        labels,
        notifications,
        reruns,
        more_reruns: more.is_some(),
        workflow,
        children,
        children_total,
    })
}

//! Delivering an event (`POST /events/{event}`, beyond Clamp): stored once by its id,
//! every request paused at an EVENT step on that event and key resumed with its payload
//! (`store::events::deliver`, one transaction under the event's lock), and kept for a
//! window so a request that reaches its EVENT step later takes it there.

use std::time::Duration;

use uuid::Uuid;

use super::{OpError, Result};
use crate::state::Core;
use crate::store::events::{self, Delivered, Delivery};
use crate::workflow::wait::MAX_WAIT;

/// How many of the requests one delivery resumes it continues itself (when it has the
/// slots): most events resume one request; the rest of a broadcast go to the sweepers.
const LEASE_AT_ONCE: usize = 16;

/// How long an event is kept when its delivery does not say.
pub const DEFAULT_KEEP: Duration = Duration::from_secs(3600);

/// An event as its delivery names it.
pub struct Event<'a> {
    pub event: &'a str,
    pub key: &'a str,
    /// Its id (a redelivery with the same id counts once); None: a new one.
    pub id: Option<&'a str>,
    /// The payload, as JSON text.
    pub payload: &'a str,
    pub traceparent: Option<&'a str>,
    /// How long to keep it for requests that reach their step later (None: the default).
    pub keep_for: Option<Duration>,
}

/// What a delivery did.
#[derive(Debug)]
pub struct Outcome {
    pub id: String,
    /// Requests it resumed.
    pub resumed: Vec<Uuid>,
    /// Until when it is kept (None: a duplicate, nothing done).
    pub keep_until: Option<String>,
}

/// Checks and delivers `e`. 400 for a name, key, id or window out of bounds.
pub async fn deliver(core: &Core, e: &Event<'_>) -> Result<Outcome> {
    let keep_for = checked(e)?;
    let fresh;
    let id = match e.id {
        Some(id) => id,
        None => {
            fresh = crate::ids::new_v7().to_string();
            &fresh
        }
    };
    let doing = "event delivery";
    let app = &core.app;
    let exec = &core.executor;
    let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
    // Slots for the requests it resumes, so this instance continues them at once (no
    // sweep, no claim), as a step response's resume does; any beyond them are left for
    // the sweepers.
    let reserved = exec.try_reserve(LEASE_AT_ONCE);
    let d = Delivery {
        event: e.event,
        id,
        key: e.key,
        payload: e.payload,
        traceparent: e.traceparent,
        keep_for,
        owner: app.instance_id,
        lease_n: reserved as u32,
        lease: app.config.lease,
    };
    let delivered = match events::deliver(&conn, &d).await {
        Ok(d) => d,
        Err(err) => {
            exec.unreserve(reserved);
            return Err(OpError::store(doing)(err));
        }
    };
    drop(conn);
    let (resumed, keep_until) = match delivered {
        Delivered::Duplicate => {
            exec.unreserve(reserved);
            app.metrics.events_duplicate.inc();
            (Vec::new(), None)
        }
        Delivered::New {
            resumed,
            keep_until,
        } => (continued(core, e, resumed, reserved), Some(keep_until)),
    };
    Ok(Outcome {
        id: id.to_string(),
        resumed,
        keep_until,
    })
}

/// The event's name, key, id and window within their bounds; how long it is kept.
fn checked(e: &Event<'_>) -> Result<Duration> {
    if e.event.is_empty() || e.event.chars().count() > 200 {
        return Err(OpError::BadRequest(
            "the event's name must have 1 to 200 characters".into(),
        ));
    }
    if e.key.is_empty() || e.key.chars().count() > 1000 {
        return Err(OpError::BadRequest(
            "key is required: a string of 1 to 1000 characters".into(),
        ));
    }
    if e.id
        .is_some_and(|id| id.is_empty() || id.chars().count() > 200)
    {
        return Err(OpError::BadRequest(
            "the event's id must have 1 to 200 characters".into(),
        ));
    }
    let keep_for = e.keep_for.unwrap_or(DEFAULT_KEEP);
    if keep_for > MAX_WAIT {
        return Err(OpError::BadRequest(format!(
            "keepFor is longer than {} days",
            MAX_WAIT.as_secs() / 86_400
        )));
    }
    Ok(keep_for)
}

/// The requests a new event resumed, told and continued: those leased to this instance
/// in the `reserved` slots start here at once, the others are left to the sweepers.
/// Returns their ids.
fn continued(
    core: &Core,
    e: &Event<'_>,
    resumed: Vec<crate::store::events::Resumed>,
    reserved: usize,
) -> Vec<Uuid> {
    let (app, exec) = (&core.app, &core.executor);
    let m = &app.metrics;
    m.events_received.inc();
    if resumed.is_empty() {
        m.events_unmatched.inc();
    } else {
        m.events_resumed.inc_by(resumed.len() as u64);
    }
    let mut ids = Vec::with_capacity(resumed.len());
    let (mut started, mut left) = (0, false);
    for mut r in resumed {
        app.changes.notify(&r.id);
        mark_resume(core, &r, e);
        ids.push(r.id);
        match r.claimed.take() {
            Some(c) => {
                started += 1;
                exec.start_resumed(c);
            }
            None => left = true,
        }
    }
    exec.unreserve(reserved - started);
    if left {
        exec.wake();
    }
    ids
}

/// Marks a traced request's resume on its trace, as a step response's is, linked to the
/// trace the event was delivered in (its `traceparent`), if it came with one.
fn mark_resume(core: &Core, r: &crate::store::events::Resumed, e: &Event<'_>) {
    let Some(headers) = r.headers() else {
        return;
    };
    if let Some((t, trace)) = core.app.traced(headers) {
        let links = e
            .traceparent
            .and_then(|tp| crate::telemetry::TraceParent::parse(tp.as_bytes()))
            .iter()
            .map(crate::telemetry::link_to)
            .collect();
        t.mark_linked(
            &trace,
            &r.id,
            "resume",
            links,
            vec![
                opentelemetry::KeyValue::new("clamp.step.id", r.step_id as i64),
                opentelemetry::KeyValue::new("clamp.event.name", e.event.to_string()),
            ],
        );
    }
}

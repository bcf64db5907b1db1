//! Creating service requests (the hot path): the workflow a create runs, its admission,
//! and the create itself, now (through the write buffer, answered after its commit) or
//! at a later start (beyond Clamp). Nothing here logs, and it allocates only what leaves
//! with the row.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use tokio::sync::oneshot;
use uuid::Uuid;

use super::{OpError, Result};
use crate::config::AckMode;
use crate::labels::Labels;
use crate::state::Core;
use crate::status::RequestStatus;
use crate::store::buffer::PushError;
use crate::store::slots::Admission;
use crate::store::{AckError, Created, LoadError, PendingRow};
use crate::workflow::Workflow;

thread_local! {
    /// simd-json mutates its input and wants scratch buffers; both are reused per thread.
    static SCRATCH: RefCell<(Vec<u8>, simd_json::Buffers)> =
        RefCell::new((Vec::with_capacity(4096), simd_json::Buffers::default()));
}

/// The stored payload for an empty body.
const EMPTY_OBJECT: &[u8] = b"{}";

/// Longest `Idempotency-Key` accepted.
pub const MAX_KEY_LEN: usize = 255;

/// Checks that `body` is empty or one JSON object that Postgres can store.
pub fn validate_payload(body: &[u8]) -> std::result::Result<(), &'static str> {
    SCRATCH.with(|s| {
        let (scratch, buffers) = &mut *s.borrow_mut();
        scratch.clear();
        scratch.extend_from_slice(body);
        let tape = simd_json::to_tape_with_buffers(scratch, buffers)
            .map_err(|_| "the body is not valid JSON")?;
        match tape.0.first() {
            Some(simd_json::Node::Object { .. }) => {}
            _ => return Err("the body must be a JSON object"),
        }
        // jsonb cannot store U+0000; refuse it here rather than fail a whole batch.
        for node in &tape.0 {
            if let simd_json::Node::String(s) = node {
                if s.as_bytes().contains(&0) {
                    return Err("the body contains \\u0000, which cannot be stored");
                }
            }
        }
        Ok(())
    })
}

fn is_blank(b: &[u8]) -> bool {
    b.iter().all(|c| c.is_ascii_whitespace())
}

fn unknown_workflow(name: &str) -> OpError {
    OpError::NotFound(format!("No record found with given workflow name : {name}"))
}

/// The workflow a create of `name` runs: version `pinned` (beyond Clamp), or the latest
/// (the map first, then Postgres once: another instance may have made it). A stored
/// workflow that no longer validates is answered as unknown (and logged where found).
pub async fn workflow(core: &Core, name: &str, pinned: Option<u32>) -> Result<Arc<Workflow>> {
    workflow_in(&super::deps(core), name, pinned).await
}

/// `workflow`, with what `d` lends (a server's or `clamp workflows apply`'s).
pub async fn workflow_in(
    d: &super::Deps<'_>,
    name: &str,
    pinned: Option<u32>,
) -> Result<Arc<Workflow>> {
    let map = d.workflows;
    let found = match pinned {
        None => map.get_or_load(d.pool, name).await,
        Some(v) => map.get_or_load_version(d.pool, name, v).await,
    };
    match (found, pinned) {
        (Ok(Some(wf)), _) => Ok(wf),
        (Ok(None), Some(v)) => Err(OpError::NotFound(format!(
            "No record found with given workflow name : {name} (version {v})"
        ))),
        (Ok(None), None) | (Err(LoadError::Invalid { .. }), _) => Err(unknown_workflow(name)),
        (Err(LoadError::Store(e)), _) => Err(OpError::Store {
            error: e,
            doing: "workflow lookup",
        }),
    }
}

/// The `Idempotency-Key` of a create, as the digest it is kept by (scoped to the
/// workflow); 400 for one that is empty, too long, or not printable ASCII.
fn key(raw: Option<&[u8]>, workflow: &str) -> Result<Option<Uuid>> {
    let Some(k) = raw else {
        return Ok(None);
    };
    match std::str::from_utf8(k) {
        Ok(k)
            if !k.is_empty()
                && k.len() <= MAX_KEY_LEN
                && k.bytes().all(|b| b.is_ascii_graphic() || b == b' ') =>
        {
            Ok(Some(crate::store::idempotency::key_hash(workflow, k)))
        }
        _ => Err(OpError::BadRequest(format!(
            "Idempotency-Key must be 1 to {MAX_KEY_LEN} printable ASCII characters"
        ))),
    }
}

/// A create as its carrier read it: the texts it was given, not yet judged.
#[derive(Debug, Default)]
pub struct Ask<'a> {
    /// The workflow's name.
    pub workflow: &'a str,
    /// `?version=N` (beyond Clamp).
    pub version: Option<&'a str>,
    /// `?startAt=` and `?delayMs=` (beyond Clamp: `ops::delayed`).
    pub start_at: Option<&'a str>,
    pub delay_ms: Option<&'a str>,
    /// `?deadline=` (beyond Clamp).
    pub deadline: Option<&'a str>,
    /// `?priority=` (beyond Clamp).
    pub priority: Option<&'a str>,
    /// The `Idempotency-Key` header's bytes (beyond Clamp).
    pub key: Option<&'a [u8]>,
    /// `?label=` values and the `Clamp-Labels` header's bytes (beyond Clamp: `labels`).
    pub labels: Vec<std::borrow::Cow<'a, str>>,
    pub labels_header: Option<&'a [u8]>,
    /// Answered after the commit even under `--ack accept` (a webhook's delivery: its
    /// sender must not be told "done" before it is).
    pub after_commit: bool,
}

/// A create judged and admitted before its body is read; `create` takes it with the body.
pub struct Admitted {
    workflow: Arc<Workflow>,
    pinned: bool,
    key: Option<Uuid>,
    start: Option<SystemTime>,
    deadline: Option<std::time::Duration>,
    priority: Option<i16>,
    labels: Option<Labels>,
    after_commit: bool,
}

/// The first half of a create, before its body is read: every text judged (400), its
/// workflow found (404), and the create refused at once (503) while the database is
/// known to be down.
pub async fn admit(core: &Core, ask: &Ask<'_>) -> Result<Admitted> {
    let pinned = match ask.version {
        None => None,
        Some(v) => match v.parse::<u32>() {
            Ok(n) if n > 0 => Some(n),
            _ => {
                return Err(OpError::BadRequest(
                    "version: must be a whole number from 1".into(),
                ))
            }
        },
    };
    let start = match (ask.start_at, ask.delay_ms) {
        (None, None) => None,
        (at, delay) => super::delayed::start_time(at, delay, SystemTime::now())?,
    };
    let deadline = ask.deadline.map(deadline).transpose()?;
    let priority = match ask.priority {
        None => None,
        Some(text) => priority(text)?,
    };
    let labels = labels(ask)?;
    let workflow = workflow(core, ask.workflow, pinned).await?;
    let key = key(ask.key, &workflow.def.name)?;
    if core.buffer.presumed_down() {
        core.app.metrics.rejected_overload.inc();
        return Err(OpError::Unavailable("database unavailable, retry later"));
    }
    Ok(Admitted {
        workflow,
        pinned: pinned.is_some(),
        key,
        start,
        deadline,
        priority,
        labels,
        after_commit: ask.after_commit,
    })
}

/// A create's labels, from its query and its header (nothing allocated for none).
fn labels(ask: &Ask<'_>) -> Result<Option<Labels>> {
    let bad = |e: crate::labels::BadLabel| OpError::BadRequest(e.0);
    let query = if ask.labels.is_empty() {
        None
    } else {
        Labels::parse(ask.labels.iter().map(|l| l.as_ref())).map_err(bad)?
    };
    let header = match ask.labels_header {
        None => None,
        Some(h) => Labels::parse_header(h).map_err(bad)?,
    };
    Labels::merge(query, header).map_err(bad)
}

/// A create, its workflow found and admitted, with its body.
struct NewRequest {
    pub workflow: Arc<Workflow>,
    /// The create named its version.
    pub pinned: bool,
    /// `key`'s digest.
    pub key: Option<Uuid>,
    /// The forwardable headers, as a JSON array of `[name, value]` pairs.
    pub headers: Bytes,
    /// The body as sent (empty, or a JSON object: checked here).
    pub body: Bytes,
    /// A start later than now (beyond Clamp); None: at once.
    pub start: Option<SystemTime>,
    /// Its own deadline, over its workflow's (beyond Clamp).
    pub deadline: Option<std::time::Duration>,
    /// Its priority, `MIN_PRIORITY..=MAX_PRIORITY` (beyond Clamp; None: the default).
    pub priority: Option<i16>,
    /// Its labels (beyond Clamp; None: none).
    pub labels: Option<Labels>,
    /// Answered after its commit whatever `--ack` says.
    pub after_commit: bool,
}

/// A create's `priority` (`workflow::model::priority`).
fn priority(text: &str) -> Result<Option<i16>> {
    crate::workflow::model::priority(text.parse::<i64>().ok()).map_err(OpError::BadRequest)
}

/// A create's `deadline`: an ISO 8601 duration, more than nothing, at most a year.
fn deadline(text: &str) -> Result<std::time::Duration> {
    match crate::workflow::wait::duration(text) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err(OpError::BadRequest(format!(
            "deadline {text:?} must be longer than nothing"
        ))),
        Err(why) => Err(OpError::BadRequest(format!("deadline {text:?} {why}"))),
    }
}

/// What a create became.
#[derive(Debug)]
pub enum Outcome {
    /// A new request, stored (and answered after its commit unless `--ack accept`).
    New(Uuid),
    /// A new request that starts at `start` (beyond Clamp).
    Delayed { id: Uuid, start: SystemTime },
    /// Its `Idempotency-Key` was used before with the same payload: that request, and its
    /// status now (None: deleted by retention since).
    Existing {
        id: Uuid,
        status: Option<RequestStatus>,
    },
}

/// Creates a service request. Its key used before for another payload is 422; an
/// overloaded buffer or a batch that did not commit is 503.
pub async fn create(core: &Core, a: Admitted, headers: Bytes, body: Bytes) -> Result<Outcome> {
    let r = NewRequest {
        workflow: a.workflow,
        pinned: a.pinned,
        key: a.key,
        headers,
        body,
        start: a.start,
        deadline: a.deadline,
        priority: a.priority,
        labels: a.labels,
        after_commit: a.after_commit,
    };
    let app = &core.app;
    let payload = if is_blank(&r.body) {
        Bytes::from_static(EMPTY_OBJECT)
    } else {
        validate_payload(&r.body).map_err(|msg| OpError::BadRequest(msg.into()))?;
        r.body
    };
    if let Some(schema) = &r.workflow.input_schema {
        schema.check(&payload).map_err(OpError::BadRequest)?;
    }
    // Whole milliseconds, so that the time Postgres stores is the one this process knows.
    let deadline_ms = r
        .deadline
        .or(r.workflow.deadline)
        .map(|d| d.as_millis() as f64);
    if r.workflow.concurrency.is_some() || r.start.is_some() {
        // Boxed: the create future every request allocates stays the size of the hot path.
        let r = NewRequest { body: payload, ..r };
        return Box::pin(create_apart(core, r, deadline_ms)).await;
    }
    let id = crate::ids::new_v7();
    let created_us = crate::store::budget::now_us();
    let (ack, done) = if app.config.ack == AckMode::Commit || r.key.is_some() || r.after_commit {
        let (tx, rx) = oneshot::channel();
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let name = r.workflow.def.name.clone();
    let row = PendingRow {
        id,
        workflow: r.workflow,
        pinned: r.pinned,
        payload,
        headers: r.headers,
        key: r.key,
        created_us,
        deadline_ms,
        priority: r.priority,
        labels: r.labels,
        ack,
    };
    match core.buffer.push(row, app.config.enqueue_wait).await {
        Ok(()) => {}
        Err(PushError::Overloaded) => {
            app.metrics.rejected_overload.inc();
            return Err(OpError::Unavailable(
                "too many requests in flight, retry later",
            ));
        }
        Err(PushError::Closed) => return Err(OpError::Unavailable("shutting down")),
    }
    let Some(done) = done else {
        return Ok(Outcome::New(id));
    };
    answered(core, &name, done.await)
}

/// What a create's batch made of it, as the create's outcome.
fn answered(
    core: &Core,
    name: &str,
    done: std::result::Result<std::result::Result<Created, AckError>, oneshot::error::RecvError>,
) -> Result<Outcome> {
    match done {
        Ok(Ok(Created::New(id))) => Ok(Outcome::New(id)),
        Ok(Ok(Created::Existing { id, status })) => Ok(Outcome::Existing { id, status }),
        Ok(Ok(Created::Mismatch { id })) => Err(OpError::Unprocessable(format!(
            "this Idempotency-Key was used for workflow {name} with another payload \
             (service request {id})"
        ))),
        Ok(Err(AckError::Invalid)) => Err(OpError::BadRequest(
            "the payload cannot be stored: the database refused it".into(),
        )),
        Ok(Err(AckError::Unavailable)) | Err(_) => {
            core.app.metrics.rejected_overload.inc();
            Err(OpError::Unavailable("database unavailable, retry later"))
        }
    }
}

/// A create of a limited workflow (it waits for a slot of its key) or a delayed one (it
/// waits for its start), each written apart from the batched insert; `r.body` is its
/// payload, checked.
async fn create_apart(core: &Core, r: NewRequest, deadline_ms: Option<f64>) -> Result<Outcome> {
    let apart = Apart {
        wf: &r.workflow,
        pinned: r.pinned,
        payload: &r.body,
        headers: &r.headers,
        deadline_ms,
        priority: r.priority,
        labels: r.labels.as_ref(),
    };
    if r.workflow.concurrency.is_some() {
        if r.start.is_some() || r.key.is_some() {
            return Err(OpError::BadRequest(
                "startAt, delayMs and Idempotency-Key cannot be combined with a workflow's concurrency limit".into(),
            ));
        }
        return limited(core, apart).await;
    }
    if r.key.is_some() {
        return Err(OpError::BadRequest(
            "Idempotency-Key cannot be combined with startAt or delayMs".into(),
        ));
    }
    match r.start {
        Some(start) => delayed(core, apart, start).await,
        None => unreachable!("a create apart is limited or delayed"),
    }
}

/// A create written apart from the batched insert (limited or delayed).
struct Apart<'a> {
    wf: &'a Arc<Workflow>,
    pinned: bool,
    payload: &'a Bytes,
    headers: &'a Bytes,
    deadline_ms: Option<f64>,
    priority: Option<i16>,
    labels: Option<&'a Labels>,
}

impl Apart<'_> {
    /// The version the row names (0: the latest).
    fn version(&self) -> i32 {
        if self.pinned {
            self.wf.def.version as i32
        } else {
            0
        }
    }
}

/// Checked JSON as text: its bytes are UTF-8 already, so they are checked once more (the
/// fast check) and copied, not read char by char as a lossy conversion does.
fn text(json: &Bytes) -> String {
    match std::str::from_utf8(json) {
        Ok(s) => s.to_owned(),
        Err(_) => String::from_utf8_lossy(json).into_owned(),
    }
}

/// Stores a request of a workflow with a concurrency limit (`store::slots`): admitted at
/// once when its key has a free slot and nobody waiting, else waiting (NEW, unclaimable)
/// until the admitter gives it a slot. Answered after its commit.
async fn limited(core: &Core, r: Apart<'_>) -> Result<Outcome> {
    let limit = r.wf.concurrency.as_ref().expect("a limited workflow");
    let key = limit.key_of_json(r.payload);
    let id = crate::ids::new_v7();
    let row = crate::store::slots::Limited {
        id,
        workflow: r.wf.def.name.clone(),
        version: r.version(),
        payload: text(r.payload),
        headers: text(r.headers),
        deadline_ms: r.deadline_ms,
        key,
        limit: limit.limit,
        priority: r.priority,
        rate: limit.rate,
        labels: r.labels.map(Labels::joined),
        notify: r.wf.notify_mask,
        created_us: crate::store::budget::now_us(),
    };
    let fresh = crate::engine::timers::slots::Fresh {
        exec: core.executor.clone(),
        workflow: r.wf.clone(),
        payload: r.payload.clone(),
        headers: r.headers.clone(),
    };
    let stored = core
        .app
        .limited
        .create(row, fresh, core.app.config.enqueue_wait)
        .await
        .map_err(OpError::store("limited create"))?;
    match stored.how {
        Admission::Admitted if !stored.started => core.executor.wake(),
        Admission::Admitted => {}
        Admission::ForSlot => {
            core.app.metrics.slot_waits.inc();
        }
        Admission::ForRate => {
            core.app.metrics.rate_waits.inc();
        }
    }
    Ok(Outcome::New(id))
}

/// Stores a delayed request (`store::delayed`): unleased until its start, when any
/// instance's sweeper claims it. Answered after its commit, like every create.
async fn delayed(core: &Core, r: Apart<'_>, start: SystemTime) -> Result<Outcome> {
    let id = crate::ids::new_v7();
    let conn = core
        .pool
        .get()
        .await
        .map_err(OpError::pool("delayed create"))?;
    let row = crate::store::delayed::Delayed {
        id,
        workflow: &r.wf.def.name,
        version: r.version(),
        payload: r.payload,
        headers: r.headers,
        created: SystemTime::now(),
        start,
        deadline_ms: r.deadline_ms,
        priority: r.priority,
        labels: r.labels.map(Labels::as_slice),
        notify: r.wf.notify_mask,
    };
    crate::store::delayed::insert(&conn, &row)
        .await
        .map_err(OpError::store("delayed create"))?;
    Ok(Outcome::Delayed { id, start })
}

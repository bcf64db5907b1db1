//! Batched, lease-fenced writes of step transitions.
//!
//! Every step an executor finishes becomes one `Transition`: the step's record (one row
//! per attempt) and the request row's new status, next step and next request. Transitions
//! from all running requests of a runtime are written together by one statement, so
//! executing many requests costs few round trips. Each transition is applied only where
//! the request row is still leased to this instance: the `UPDATE … WHERE lease_owner = $me`
//! takes the row lock first, so a claim by another instance either happens before (and
//! the write is refused) or waits for this commit.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use crate::metrics::Metrics;
use crate::outbound::doc::Doc;
use crate::status::{RequestStatus, StepStatus};
use crate::store::{transitions, Pool, StoreError};

/// A step's record, as written to `steps_status`.
#[derive(Debug, Clone)]
pub struct StepRecord {
    pub step_id: u32,
    pub step_name: std::sync::Arc<str>,
    /// COMPLETED, FAILED, SKIPPED, or STARTED for an ASYNC step that was sent.
    pub status: StepStatus,
    pub request: Option<Doc>,
    /// `request` is the request's payload: stored as the mark `''`, not as a second copy
    /// of the payload (`store::sql::step_request` puts it back for readers).
    pub request_is_payload: bool,
    pub response: Option<Doc>,
    /// Milliseconds since the Unix epoch.
    pub started_ms: f64,
    pub finished_ms: Option<f64>,
    pub reason: Option<String>,
    /// Attempts the step took (its final one included).
    pub attempts: u32,
    /// The step is a PARALLEL branch's, run as a lane of the request (`engine::lanes`):
    /// the fan-out step's id and the branch's index. Its record's id is then
    /// `workflow::fan::lane_step_id` of these and `step_id` (the step's id in its branch).
    pub lane: Option<(u32, u32)>,
}

impl StepRecord {
    /// The record's `steps_status.step_id`.
    pub fn stored_id(&self) -> i32 {
        match self.lane {
            None => self.step_id as i32,
            Some((fan, branch)) => {
                crate::workflow::fan::lane_step_id(crate::workflow::fan::LaneStep {
                    fan,
                    branch,
                    step: self.step_id,
                })
            }
        }
    }
}

/// One change to a request row, with the record of the step that caused it.
#[derive(Debug, Clone)]
pub struct Transition {
    pub id: Uuid,
    /// IN_PROGRESS (between steps: the stored status is left as it is), PAUSED,
    /// COMPLETED or FAILED.
    pub status: RequestStatus,
    pub next_step: u32,
    pub next_request: Option<Doc>,
    pub failed_step: Option<u32>,
    pub reason: Option<String>,
    /// Give the lease up (the request finished or paused).
    pub release: bool,
    pub step: Option<StepRecord>,
    /// Attempts the next step has had already: 0, unless it is a retry of the same step.
    pub attempts: u32,
    /// A retry is due in this many milliseconds: the lease is given up and the row waits,
    /// unowned, until then (`lease_until` is when the sweeper may claim it again).
    pub retry_in_ms: Option<f64>,
    /// Why the last attempt failed, while a retry is pending.
    pub last_error: Option<String>,
    /// Its request's workflow tells of the status it reaches (`workflow::notify`): the
    /// batch holding it is written with the outbox rows (`WRITE_TRANSITIONS_TELLING`).
    pub notify: bool,
}

impl Transition {
    /// The request failed outright (no step record), and its lease is given up.
    pub fn failed(id: Uuid, reason: String) -> Transition {
        Transition {
            id,
            status: RequestStatus::Failed,
            next_step: 0,
            next_request: None,
            failed_step: None,
            reason: Some(reason),
            release: true,
            step: None,
            attempts: 0,
            retry_in_ms: None,
            last_error: None,
            notify: false,
        }
    }
}

/// Why a transition was not applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteError {
    /// Another instance holds the lease now: stop working on this request.
    LeaseLost,
    /// The database did not take the write for now; the caller retries.
    Unavailable,
    /// Postgres refused the write itself (its data, or the statement): writing the same
    /// transition again cannot succeed.
    Rejected(String),
}

struct Pending {
    t: Transition,
    ack: oneshot::Sender<Result<(), WriteError>>,
}

/// The executor side of a runtime's transition writer.
#[derive(Clone)]
pub struct StepWriter {
    tx: mpsc::Sender<Pending>,
}

impl StepWriter {
    /// Writes `t` and waits for its commit.
    pub async fn write(&self, t: Transition) -> Result<(), WriteError> {
        let (ack, done) = oneshot::channel();
        if self.tx.send(Pending { t, ack }).await.is_err() {
            return Err(WriteError::Unavailable);
        }
        done.await.unwrap_or(Err(WriteError::Unavailable))
    }
}

/// Largest number of transitions in one statement.
const MAX_BATCH: usize = 512;

/// What to do with each transition right after it committed, before its job hears of it.
pub type OnCommit = Arc<dyn Fn(&Transition) + Send + Sync>;

/// Starts a writer on the current runtime.
pub fn start(
    pool: Pool,
    owner: Uuid,
    metrics: Arc<Metrics>,
    committed: OnCommit,
    capacity: usize,
    concurrency: usize,
) -> StepWriter {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    let w = Writer {
        pool,
        owner,
        metrics,
        committed,
    };
    tokio::spawn(run(rx, Arc::new(w), concurrency.max(1)));
    StepWriter { tx }
}

/// What every batch of one writer shares.
struct Writer {
    pool: Pool,
    owner: Uuid,
    metrics: Arc<Metrics>,
    committed: OnCommit,
}

async fn run(rx: mpsc::Receiver<Pending>, w: Arc<Writer>, concurrency: usize) {
    crate::batches::drain(rx, MAX_BATCH, concurrency, |batch: Vec<Pending>| {
        let w = w.clone();
        async move {
            let (pool, owner, metrics, committed) = (&w.pool, w.owner, &w.metrics, &w.committed);
            let result = write(pool, &batch, owner).await;
            let batch_len = batch.len();
            match result {
                Ok(applied) => {
                    for p in batch {
                        let ok = applied.contains(&p.t.id);
                        if ok {
                            committed(&p.t);
                        } else {
                            metrics.leases_lost.inc();
                            tracing::debug!(service_request_id = %p.t.id, step_id = p.t.step.as_ref().map(|s| s.step_id), status = %p.t.status, n = batch_len, "transition refused: lease not held");
                        }
                        let _ = p.ack.send(if ok {
                            Ok(())
                        } else {
                            Err(WriteError::LeaseLost)
                        });
                    }
                }
                Err(e) if e.is_transient() => {
                    tracing::warn!(n = batch.len(), error = %e, "step transition write failed");
                    for p in batch {
                        let _ = p.ack.send(Err(WriteError::Unavailable));
                    }
                }
                Err(e) => {
                    // One bad transition must not hold up its neighbours: each is written
                    // again on its own, and only those Postgres refuses are told so.
                    tracing::warn!(n = batch.len(), error = %e, "step transitions refused; writing them one by one");
                    for p in batch {
                        let result = match write(pool, std::slice::from_ref(&p), owner).await {
                            Ok(applied) if applied.contains(&p.t.id) => {
                                committed(&p.t);
                                Ok(())
                            }
                            Ok(_) => Err(WriteError::LeaseLost),
                            Err(e) if e.is_transient() => Err(WriteError::Unavailable),
                            Err(e) => Err(WriteError::Rejected(e.to_string())),
                        };
                        let _ = p.ack.send(result);
                    }
                }
            }
        }
    })
    .await
}

async fn write(pool: &Pool, batch: &[Pending], owner: Uuid) -> Result<Vec<Uuid>, StoreError> {
    let conn = pool.get().await?;
    let rows: Vec<transitions::Row> = batch.iter().map(|p| row(&p.t)).collect();
    let telling = batch.iter().any(|p| p.t.notify);
    transitions::write(&conn, &rows, owner, telling).await
}

/// A transition as the statement's row type holds it.
fn row(t: &Transition) -> transitions::Row<'_> {
    let step = t.step.as_ref();
    transitions::Row {
        id: t.id,
        status: t.status,
        next_step: t.next_step as i32,
        next_request: t.next_request.as_ref().map(Doc::as_str),
        failed_step: t.failed_step.map(|s| s as i32),
        reason: t.reason.as_deref(),
        release: t.release,
        step_id: step.map_or(0, StepRecord::stored_id),
        step_name: step.map_or("", |s| &s.step_name),
        step_status: step.map(|s| s.status),
        step_request: step.and_then(|s| {
            if s.request_is_payload {
                Some("")
            } else {
                s.request.as_ref().map(Doc::as_str)
            }
        }),
        step_response: step.and_then(|s| s.response.as_ref().map(Doc::as_str)),
        started_ms: step.map_or(0.0, |s| s.started_ms),
        finished_ms: step.and_then(|s| s.finished_ms),
        step_reason: step.and_then(|s| s.reason.as_deref()),
        step_attempts: step.map_or(0, |s| s.attempts as i32),
        attempts: t.attempts as i32,
        retry_in_ms: t.retry_in_ms,
        last_error: t.last_error.as_deref(),
    }
}

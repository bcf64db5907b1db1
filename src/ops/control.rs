//! An operator's hands on requests (beyond Clamp): cancel, retry in place, bulk retry,
//! and rerun as a new request. Each is one fenced statement (`store::cancel`,
//! `store::retry`, `store::rerun`) and its side effects here: the spans it ends or marks,
//! the metric, the long polls it wakes, the executor it wakes.

use std::time::SystemTime;

use uuid::Uuid;

use super::access::Op;
use super::audit::{recorded, Told, MATCHING};
use super::{no_request, OpError, Result};
use crate::state::Core;
use crate::status::{RequestStatus, StepStatus};
use crate::store::cancel::{self as store_cancel, CancelledRow};
use crate::store::rerun::{self as store_rerun, Source};
pub use crate::store::retry::Bulk;
use crate::store::retry::{self as store_retry};
use crate::store::LoadError;
use crate::tokens::Caller;

/// A cancelled request's reason (its own, or the one it was cancelled with before), and
/// whether it runs its compensations before it ends CANCELLED.
pub struct Cancelled {
    pub reason: String,
    pub compensating: bool,
}

/// The reason of a cancel that gives none.
const DEFAULT_REASON: &str = "cancelled by a client";

/// The longest cancel reason kept, in bytes, whichever carrier brings it.
pub const MAX_REASON_BYTES: usize = 1024;

/// Cancels `id` and its unfinished children: no further step starts, a paused step stops
/// waiting, onFailure steps do not run. Cancelling twice is the first cancel; 409 once
/// the request finished.
/// Recorded in the audit trail as `who`'s, with its outcome.
/// With `compensate` true (beyond Clamp), or left out for a workflow that says
/// `compensateOnCancel`, a request whose workflow has compensations runs them first (its
/// completed steps undone, last first), then ends CANCELLED.
pub async fn cancel(
    core: &Core,
    who: &Caller,
    id: Uuid,
    reason: Option<String>,
    compensate: Option<bool>,
) -> Result<Cancelled> {
    let r = cancel_it(core, id, reason, compensate).await;
    recorded(&core.pool, who, Op::Cancel, &id.to_string(), r).await
}

async fn cancel_it(
    core: &Core,
    id: Uuid,
    reason: Option<String>,
    compensate: Option<bool>,
) -> Result<Cancelled> {
    let doing = "cancel service request";
    if reason.as_ref().is_some_and(|r| r.len() > MAX_REASON_BYTES) {
        return Err(OpError::BadRequest(format!(
            "reason must be a string of at most {MAX_REASON_BYTES} bytes"
        )));
    }
    let reason = reason.unwrap_or_else(|| DEFAULT_REASON.into());
    let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
    if compensate != Some(false) && compensates(core, &conn, id, compensate.is_some()).await? {
        return cancel_compensating(core, &conn, id, reason).await;
    }
    let outcome = store_cancel::cancel(&conn, id, &reason)
        .await
        .map_err(OpError::store(doing))?;
    cancelled(core, id, reason, outcome)
}

/// Whether a cancel of `id` runs its compensations: its workflow has some, and the
/// cancel `asked`, or the workflow says `compensateOnCancel`, or the create asked (its
/// label `clamp.compensate:on-cancel`); false for a request not found (the cancel says
/// so).
async fn compensates(
    core: &Core,
    conn: &crate::store::PgConn,
    id: Uuid,
    asked: bool,
) -> Result<bool> {
    let doing = "cancel service request";
    let Some(state) = crate::store::step_responses::request_state(conn, id)
        .await
        .map_err(OpError::store(doing))?
    else {
        return Ok(false);
    };
    // Its definition not readable now: cancelled without compensations would undo
    // nothing it asked for, so the cancel waits for it.
    let wf = core
        .app
        .workflows
        .get_or_load_version(&core.pool, &state.workflow_name, state.workflow_version)
        .await
        .map_err(|_| OpError::Unavailable("the workflow definition cannot be read now"))?;
    let Some(wf) = wf.filter(|w| w.compensates) else {
        return Ok(false);
    };
    if asked || wf.def.compensate_on_cancel {
        return Ok(true);
    }
    crate::store::cancel::asked_at_create(conn, id)
        .await
        .map_err(OpError::store(doing))
}

/// A cancel asking for compensation: the request compensates, then ends CANCELLED (its
/// unfinished children are cancelled now).
async fn cancel_compensating(
    core: &Core,
    conn: &crate::store::PgConn,
    id: Uuid,
    reason: String,
) -> Result<Cancelled> {
    let doing = "cancel service request";
    match store_cancel::cancel_compensating(conn, id, &reason)
        .await
        .map_err(OpError::store(doing))?
    {
        store_cancel::Compensating::Now(children) => {
            trace_cancelled(&core.app, &children);
            core.app.changes.notify(&id);
            core.executor.wake();
            Ok(Cancelled {
                reason,
                compensating: true,
            })
        }
        store_cancel::Compensating::Not(store_cancel::Cancelled::Finished { status })
            if !status.is_finished() =>
        {
            Err(OpError::Conflict(
                "the service request is failing: its onFailure steps and compensations run".into(),
            ))
        }
        store_cancel::Compensating::Not(c) => cancelled(core, id, reason, c),
    }
}

/// The outcome of a cancel's statement, with its side effects.
fn cancelled(
    core: &Core,
    id: Uuid,
    reason: String,
    outcome: store_cancel::Cancelled,
) -> Result<Cancelled> {
    let app = &core.app;
    match outcome {
        store_cancel::Cancelled::Now(rows) => {
            trace_cancelled(app, &rows);
            // A cancelled request of a limited workflow frees its slot (or its place in
            // the queue): the admitter looks at once (a workflow not in memory here, at
            // its next pass).
            for r in &rows {
                if app
                    .workflows
                    .get(&r.workflow_name)
                    .is_some_and(|w| w.concurrency.is_some())
                {
                    app.freed.freed(r.id);
                }
            }
            app.metrics.cancelled.inc();
            for r in &rows {
                app.metrics.outcomes.finished(
                    &r.workflow_name,
                    crate::status::RequestStatus::Cancelled,
                    Some(r.created_us),
                );
            }
            app.changes.notify(&id);
            Ok(Cancelled {
                reason,
                compensating: false,
            })
        }
        store_cancel::Cancelled::Already { reason } => Ok(Cancelled {
            reason: reason.unwrap_or_default(),
            compensating: false,
        }),
        store_cancel::Cancelled::Finished { status } => Err(OpError::Conflict(format!(
            "the service request is {status} and can no longer be cancelled"
        ))),
        store_cancel::Cancelled::Unknown => Err(no_request()),
    }
}

/// Ends the spans of the requests a cancel finished, each with the cancel as its event.
fn trace_cancelled(app: &crate::state::App, rows: &[CancelledRow]) {
    for r in rows {
        let Some((t, trace)) = app.traced(&r.headers) else {
            continue;
        };
        let event = opentelemetry::trace::Event::new(
            "cancel",
            SystemTime::now(),
            vec![opentelemetry::KeyValue::new(
                "clamp.cancel.reason",
                r.reason.clone(),
            )],
            0,
        );
        t.end_request(
            &trace,
            &r.id,
            r.retries,
            &r.workflow_name,
            r.created_us,
            RequestStatus::Cancelled,
            Some(&r.reason),
            vec![event],
        );
    }
}

/// A request retried in place: how often it has been now.
pub struct Retried {
    pub retries: i32,
}

/// Retries a FAILED or CANCELLED request as the same request from the step that failed
/// (a cancelled one: the step that was next), that step given `payload` (JSON text) if
/// any; completed steps are not called again.
/// Recorded in the audit trail as `who`'s, with its outcome.
pub async fn retry(core: &Core, who: &Caller, id: Uuid, payload: Option<&str>) -> Result<Retried> {
    let r = retry_it(core, id, payload).await;
    recorded(&core.pool, who, Op::Retry, &id.to_string(), r).await
}

async fn retry_it(core: &Core, id: Uuid, payload: Option<&str>) -> Result<Retried> {
    let app = &core.app;
    let doing = "retry service request";
    let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
    match store_retry::retry(&conn, id, payload)
        .await
        .map_err(OpError::store(doing))?
    {
        store_retry::Retried::Now {
            retries,
            headers,
            limited,
        } => {
            if limited {
                // It waits for a slot of its key again: the admitter looks at once.
                app.freed.freed(id);
            }
            if let Some((t, trace)) = app.traced(&headers) {
                t.mark(
                    &trace,
                    &id,
                    "retry",
                    vec![opentelemetry::KeyValue::new(
                        "clamp.service_request.retries",
                        retries as i64,
                    )],
                );
            }
            app.changes.notify(&id);
            // Any instance's sweeper claims it; this one looks at once.
            core.executor.wake();
            Ok(Retried { retries })
        }
        store_retry::Retried::NotRetryable { status } => Err(OpError::Conflict(format!(
            "the service request is {status}: only a FAILED or CANCELLED one is retried"
        ))),
        store_retry::Retried::NoFailedStep => Err(OpError::Conflict(
            "the service request failed outside its steps after some had run: where to go on is not known"
                .into(),
        )),
        store_retry::Retried::Unknown => Err(no_request()),
    }
}

/// What a bulk retry did.
pub struct BulkRetried {
    pub retried: i64,
    /// More requests matched than it took.
    pub more: bool,
}

impl Told for Cancelled {}
impl Told for Retried {}
impl Told for Uuid {}
impl Told for BulkRetried {
    fn told(&self) -> String {
        format!("ok: {} retried", self.retried)
    }
}

/// Retries every FAILED (or CANCELLED) request the filters match, up to the limit, in
/// one statement; a repeat retries none twice.
/// Recorded in the audit trail as `who`'s, with its outcome.
pub async fn retry_matching(core: &Core, who: &Caller, bulk: &Bulk) -> Result<BulkRetried> {
    let r = retry_matching_it(core, bulk).await;
    recorded(&core.pool, who, Op::BulkRetry, MATCHING, r).await
}

async fn retry_matching_it(core: &Core, bulk: &Bulk) -> Result<BulkRetried> {
    let doing = "retry service requests";
    let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
    let (retried, more) = store_retry::retry_matching(&conn, bulk)
        .await
        .map_err(OpError::store(doing))?;
    if retried > 0 {
        core.executor.wake();
    }
    Ok(BulkRetried { retried, more })
}

/// What a rerun asks for.
#[derive(Debug, PartialEq)]
pub struct RerunAsk {
    /// The step to run from (None: the first).
    pub from_step: Option<u32>,
    /// That step's request, JSON text (None: what it received in the original).
    pub payload: Option<String>,
}

/// Reruns `of` as a new request of the same workflow version: its steps before
/// `from_step` are the original's outcomes, copied, not called. Answers the new id.
/// Recorded in the audit trail as `who`'s, with its outcome.
pub async fn rerun(core: &Core, who: &Caller, of: Uuid, ask: RerunAsk) -> Result<Uuid> {
    let r = rerun_it(core, of, ask).await;
    recorded(&core.pool, who, Op::Rerun, &of.to_string(), r).await
}

async fn rerun_it(core: &Core, of: Uuid, ask: RerunAsk) -> Result<Uuid> {
    let doing = "rerun service request";
    let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
    let src = store_rerun::source(&conn, of)
        .await
        .map_err(OpError::store(doing))?
        .ok_or_else(no_request)?;
    drop(conn);
    let wf = match core
        .app
        .workflows
        .get_or_load_version(&core.pool, &src.workflow_name, src.workflow_version)
        .await
    {
        Ok(Some(wf)) => wf,
        Ok(None) | Err(LoadError::Invalid { .. }) => {
            return Err(OpError::Conflict(format!(
                "workflow {} version {} is not known any more",
                src.workflow_name, src.workflow_version
            )))
        }
        Err(LoadError::Store(error)) => return Err(OpError::Store { error, doing }),
    };
    let plan = plan(&wf.main, &src, ask)?;
    let id = crate::ids::new_v7();
    let run = store_rerun::Rerun {
        id,
        of,
        workflow_name: &src.workflow_name,
        workflow_version: src.workflow_version,
        payload: plan.payload.as_deref().unwrap_or(&src.payload),
        headers: &src.headers,
        from_step: plan.from_step,
        step_request: &plan.step_request,
        copied: plan.copied,
    };
    let conn = core.pool.get().await.map_err(OpError::pool(doing))?;
    store_rerun::insert(&conn, &run)
        .await
        .map_err(OpError::store(doing))?;
    drop(conn);
    if wf.concurrency.is_some() {
        // With its original's key, it waits for a slot: the admitter looks at once.
        core.app.freed.freed(id);
    }
    core.executor.wake();
    Ok(id)
}

/// How a rerun starts.
#[derive(Debug, PartialEq)]
struct Plan {
    from_step: u32,
    step_request: String,
    /// The new request's payload when it is not the original's (a new one, from the first step).
    payload: Option<String>,
    copied: Vec<i64>,
}

/// Where the rerun starts, what that step receives, and which records it copies: every
/// step of the main sequence before `fromStep` must have COMPLETED (or been SKIPPED) in
/// the original, since its outcome is what the rerun takes instead of calling it.
fn plan(main: &[u32], src: &Source, ask: RerunAsk) -> Result<Plan> {
    let Some(&first) = main.first() else {
        return Err(OpError::Conflict("the workflow has no steps".into()));
    };
    let from = ask.from_step.unwrap_or(first);
    let Some(pos) = main.iter().position(|&s| s == from) else {
        let ids: Vec<String> = main.iter().map(u32::to_string).collect();
        return Err(OpError::BadRequest(format!(
            "fromStep: {from} is not a step of workflow {}'s sequence (its steps are {})",
            src.workflow_name,
            ids.join(", ")
        )));
    };
    let mut copied = Vec::with_capacity(pos);
    let mut passed_on = None;
    for &step in &main[..pos] {
        let rec = src.last.iter().find(|r| r.step_id == step);
        match rec {
            Some(r) if r.status.is_done() => {
                copied.push(r.record_id);
                passed_on = r.response.clone();
            }
            other => {
                let what = other.map_or("never ran", |r| match r.status {
                    StepStatus::Failed => "failed",
                    _ => "has not finished",
                });
                return Err(OpError::Conflict(format!(
                    "step {step} {what} in the original: rerun from step {step} or an earlier one"
                )));
            }
        }
    }
    // In the order they ran (ids grow with each record).
    copied.sort_unstable();
    let (step_request, payload) = match (ask.payload, pos) {
        (Some(p), 0) => (p.clone(), Some(p)),
        (Some(p), _) => (p, None),
        (None, 0) => (src.payload.clone(), None),
        (None, _) => (passed_on.unwrap_or_else(|| "null".into()), None),
    };
    Ok(Plan {
        from_step: from,
        step_request,
        payload,
        copied,
    })
}

/// The statuses a bulk retry takes unless it names others.
pub const BULK_DEFAULT: RequestStatus = RequestStatus::Failed;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::rerun::Record;

    fn src(records: &[(i64, u32, StepStatus, &str)]) -> Source {
        Source {
            workflow_name: "w".into(),
            workflow_version: 1,
            payload: r#"{"p":1}"#.into(),
            headers: "[]".into(),
            labels: Vec::new(),
            last: records
                .iter()
                .map(|&(record_id, step_id, status, response)| Record {
                    record_id,
                    step_id,
                    status,
                    response: Some(response.into()),
                })
                .collect(),
        }
    }

    fn ask(from_step: Option<u32>, payload: Option<&str>) -> RerunAsk {
        RerunAsk {
            from_step,
            payload: payload.map(str::to_string),
        }
    }

    #[test]
    fn a_rerun_takes_the_outcomes_before_its_step_and_the_answer_of_the_last() {
        let s = src(&[
            (10, 1, StepStatus::Completed, "r1"),
            (12, 2, StepStatus::Skipped, "r2"),
            (13, 3, StepStatus::Failed, "e"),
        ]);
        let p = plan(&[1, 2, 3], &s, ask(Some(3), None)).unwrap();
        assert_eq!((p.from_step, p.step_request.as_str()), (3, "r2"));
        assert_eq!((p.copied, p.payload), (vec![10, 12], None));
        let p = plan(&[1, 2, 3], &s, ask(None, None)).unwrap();
        assert_eq!((p.from_step, p.step_request.as_str()), (1, r#"{"p":1}"#));
        assert!(p.copied.is_empty());
        // A new payload from the first step is the new request's payload too.
        let p = plan(&[1, 2, 3], &s, ask(None, Some("7"))).unwrap();
        assert_eq!(
            (p.step_request.as_str(), p.payload),
            ("7", Some("7".into()))
        );
        let p = plan(&[1, 2, 3], &s, ask(Some(2), Some("8"))).unwrap();
        assert_eq!((p.step_request.as_str(), p.payload), ("8", None));
    }

    #[test]
    fn a_rerun_cannot_skip_a_step_that_did_not_complete() {
        let s = src(&[
            (10, 1, StepStatus::Completed, "r1"),
            (13, 2, StepStatus::Failed, "e"),
        ]);
        let why = match plan(&[1, 2, 3], &s, ask(Some(3), None)) {
            Err(OpError::Conflict(why)) => why,
            other => panic!("{other:?}"),
        };
        assert!(why.contains("step 2 failed"), "{why}");
        assert!(matches!(
            plan(&[1, 2, 3, 4], &s, ask(Some(4), None)),
            Err(OpError::Conflict(_))
        ));
        let why = match plan(&[1, 2, 3], &s, ask(Some(9), None)) {
            Err(OpError::BadRequest(why)) => why,
            other => panic!("{other:?}"),
        };
        assert!(why.starts_with("fromStep: 9"), "{why}");
    }
}

//! Admitting requests waiting for a concurrency slot (beyond Clamp; `store::slots`): one
//! task per process. A request of a limited workflow that finishes (or is cancelled, or
//! failed by a deadline) is named here (`Freed::freed`), and its key's waiting requests
//! are admitted into the slots that freed, at once; a pass every second admits whatever
//! such a note missed (a full channel, a crash between the finish and the note, another
//! instance's finish), going round each workflow's keys so that none waits behind the
//! others. Requests admitted here are claimable by any instance's sweeper; this
//! runtime's is woken. A limited create admitted at once is leased to the executor of
//! the runtime that took it and started after its commit (`LimitedCreates`), when that
//! executor has room; otherwise it too waits for a claim.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, watch};
use uuid::Uuid;

use crate::engine::Executor;
use crate::store::buffer::Inserted;
use crate::store::slots::{self, Admission};
use crate::store::{Pool, StoreError};

/// Finished requests noted, not yet looked at (more are left to the pass).
const NOTES: usize = 4096;
/// How often a pass looks for keys with waiting requests and free slots.
const PASS: Duration = Duration::from_secs(1);
/// How often while a rate-limited workflow has requests waiting: its window slides
/// without any finish to note, so only a pass admits into it.
const RATE_PASS: Duration = Duration::from_millis(100);
/// How long the finishes noted after a first are gathered before one look at their keys.
const GATHER: Duration = Duration::from_millis(10);
/// How often the start rows no rate's window reaches are deleted.
const FORGET: Duration = Duration::from_secs(30);
/// Keys one pass admits into, per workflow (the next pass goes on after the last).
const KEYS_PER_PASS: i64 = 500;

/// Where finished limited requests are noted.
pub struct Freed {
    tx: mpsc::Sender<Uuid>,
    rx: Mutex<Option<mpsc::Receiver<Uuid>>>,
}

impl Default for Freed {
    fn default() -> Freed {
        let (tx, rx) = mpsc::channel(NOTES);
        Freed {
            tx,
            rx: Mutex::new(Some(rx)),
        }
    }
}

impl Freed {
    /// Request `id`, of a limited workflow, finished: its slot is free. Never waits: a
    /// note that does not fit is left to the next pass.
    pub fn freed(&self, id: Uuid) {
        let _ = self.tx.try_send(id);
    }
}

/// Limited creates waiting for their batch (`store::slots::insert`).
const CREATES: usize = 4096;
/// Most creates in one batch, and batches in flight at once: one, the next filling
/// behind it, and a second only beside one slower than usual (`batches::drain_in_turn`,
/// as the plain creates' flusher): two in flight at all times split the rows in hand
/// between two statements, and two with a key in common wait on its lock.
const CREATE_BATCH: usize = 256;
const CREATE_FLIGHTS: usize = 2;

/// A limited create, what its executor needs to start it at once, and who waits for it:
/// how it was stored, once committed.
struct PendingCreate {
    row: slots::Limited,
    fresh: Fresh,
    ack: oneshot::Sender<Result<Created, StoreError>>,
}

/// What starting an admitted create at once takes: the executor of the runtime that took
/// it (it is leased to this instance when that executor has room, as a plain create is
/// handed over), and its workflow, payload and headers as the executor runs them.
pub struct Fresh {
    pub exec: Arc<Executor>,
    pub workflow: Arc<crate::workflow::Workflow>,
    pub payload: bytes::Bytes,
    pub headers: bytes::Bytes,
}

/// How a limited create was stored; `started`: admitted and handed to its executor (no
/// claim needs to look for it).
#[derive(Debug, Clone, Copy)]
pub struct Created {
    pub how: Admission,
    pub started: bool,
}

/// Where limited creates are queued for their batched insert: one short transaction per
/// batch (its keys' locks, then one insert) instead of one per create.
pub struct LimitedCreates {
    tx: mpsc::Sender<PendingCreate>,
    rx: Mutex<Option<mpsc::Receiver<PendingCreate>>>,
}

impl Default for LimitedCreates {
    fn default() -> LimitedCreates {
        let (tx, rx) = mpsc::channel(CREATES);
        LimitedCreates {
            tx,
            rx: Mutex::new(Some(rx)),
        }
    }
}

impl LimitedCreates {
    /// Stores `row` with the next batch; whether it was admitted (and started) or waits,
    /// and for what. A queue full for longer than `wait` is `Unavailable` (the create
    /// answers 503).
    pub async fn create(
        &self,
        row: slots::Limited,
        fresh: Fresh,
        wait: Duration,
    ) -> Result<Created, StoreError> {
        let (ack, done) = oneshot::channel();
        let pending = PendingCreate { row, fresh, ack };
        match tokio::time::timeout(wait, self.tx.send(pending)).await {
            Ok(Ok(())) => {}
            _ => {
                return Err(StoreError::unavailable(
                    "too many limited creates in flight",
                ))
            }
        }
        done.await
            .unwrap_or_else(|_| Err(StoreError::unavailable("shutting down")))
    }

    /// Writes the queued creates in batches until `stop` fires (a batch in flight then
    /// finishes on its own task; a create not yet in a batch answers 503). Admitted rows
    /// whose executor had room are leased to `owner` for `lease` and started after the
    /// commit.
    pub async fn run(
        &self,
        pool: Pool,
        owner: Uuid,
        lease: Duration,
        mut stop: watch::Receiver<bool>,
    ) {
        let Some(rx) = self.rx.lock().take() else {
            return;
        };
        let drain = crate::batches::drain_in_turn(
            rx,
            CREATE_BATCH,
            CREATE_FLIGHTS,
            move |batch: Vec<PendingCreate>| {
                let pool = pool.clone();
                async move { write_batch(&pool, batch, owner, lease).await }
            },
        );
        tokio::select! {
            _ = drain => {}
            _ = stop.wait_for(|s| *s) => {}
        }
    }
}

/// One batch of limited creates: reserved room in their executors, stored, then the
/// admitted ones with room started and every create answered.
async fn write_batch(pool: &Pool, batch: Vec<PendingCreate>, owner: Uuid, lease: Duration) {
    let leased: Vec<bool> = batch
        .iter()
        .map(|p| p.fresh.exec.take_room(1) == 1)
        .collect();
    let mut rows = Vec::with_capacity(batch.len());
    let mut rest = Vec::with_capacity(batch.len());
    for p in batch {
        rows.push(p.row);
        rest.push((p.fresh, p.ack));
    }
    let written = async {
        let conn = pool.get().await?;
        let lease = slots::Lease {
            leased: &leased,
            owner,
            lease,
        };
        slots::insert(&conn, &rows, &lease).await
    }
    .await;
    match written {
        Ok(stored) => {
            for (((row, (fresh, ack)), s), leased) in
                rows.into_iter().zip(rest).zip(stored).zip(leased)
            {
                let started = leased && s.how == Admission::Admitted;
                if started {
                    let inserted = Inserted {
                        id: row.id,
                        workflow: fresh.workflow,
                        version: s.version,
                        payload: fresh.payload,
                        headers: fresh.headers,
                        created_us: row.created_us,
                        deadline_ms: row.deadline_ms,
                        priority: row.priority,
                    };
                    fresh.exec.clone().start_fresh(vec![inserted]);
                } else if leased {
                    fresh.exec.unreserve(1);
                }
                let _ = ack.send(Ok(Created {
                    how: s.how,
                    started,
                }));
            }
        }
        Err(e) => {
            for ((fresh, ack), leased) in rest.into_iter().zip(leased) {
                if leased {
                    fresh.exec.unreserve(1);
                }
                let _ = ack.send(Err(e.clone()));
            }
        }
    }
}

/// Runs until `stop` fires.
pub async fn run(exec: Arc<Executor>, mut stop: watch::Receiver<bool>) {
    let Some(mut rx) = exec.app.freed.rx.lock().take() else {
        return;
    };
    let mut next_pass = tokio::time::Instant::now() + PASS;
    let mut next_forget = tokio::time::Instant::now() + FORGET;
    // Per workflow, the last key a pass reached.
    let mut cursors: std::collections::HashMap<String, String> = Default::default();
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            Some(id) = rx.recv() => {
                // A moment for the finishes around this one (a step-write batch ends many
                // at once): one look for all of them, not one per batch.
                tokio::time::sleep(GATHER).await;
                let mut ids = vec![id];
                while ids.len() < 256 {
                    match rx.try_recv() {
                        Ok(id) => ids.push(id),
                        Err(_) => break,
                    }
                }
                if let Err(e) = after_finish(&exec, &ids).await {
                    tracing::debug!(error = %e, "freed slots not admitted now; the next pass does");
                }
            }
            _ = tokio::time::sleep_until(next_forget) => {
                next_forget = tokio::time::Instant::now() + FORGET;
                let forgot = async { slots::forget_starts(&*exec.looks.get().await?).await };
                if let Err(e) = forgot.await {
                    tracing::debug!(error = %e, "old start rows not deleted now; the next look does");
                }
            }
            _ = tokio::time::sleep_until(next_pass) => {
                let every = match sweep(&exec, &mut cursors).await {
                    Ok(true) => RATE_PASS,
                    Ok(false) => PASS,
                    Err(e) => {
                        tracing::warn!(error = %e, "a pass admitting waiting requests failed; trying again");
                        PASS
                    }
                };
                next_pass = tokio::time::Instant::now() + every;
            }
        }
    }
}

/// The limits a key's requests are admitted under now: the latest version's (a new
/// version's limits apply to the requests started after it); none any more admits every
/// waiting one.
async fn limit_of(
    exec: &Executor,
    workflow: &str,
) -> Result<(u32, Option<(u32, u32)>), StoreError> {
    let wf = match exec.app.workflows.get_or_load(&exec.pool, workflow).await {
        Ok(wf) => wf,
        Err(crate::store::workflow_map::LoadError::Store(e)) => return Err(e),
        // A definition that no longer validates: its requests wait until it does.
        Err(e) => return Err(StoreError::unavailable(e.to_string())),
    };
    Ok(wf
        .and_then(|w| w.concurrency.as_ref().map(|c| (c.limit, c.rate)))
        .unwrap_or((crate::workflow::model::NO_LIMIT, None)))
}

/// Admits into the keys of finished requests `ids`.
async fn after_finish(exec: &Executor, ids: &[Uuid]) -> Result<(), StoreError> {
    let keys = {
        let conn = exec.pool.get().await?;
        slots::keys_of(&conn, ids).await?
    };
    admit_keys(exec, keys).await.map(drop)
}

/// Admits what fits into each (workflow, key), under the workflow's limits now; the ids
/// admitted.
pub async fn admit_keys(
    exec: &Executor,
    mut keys: Vec<(String, String)>,
) -> Result<Vec<Uuid>, StoreError> {
    keys.sort_unstable();
    keys.dedup();
    let mut admitted = Vec::new();
    for (workflow, key) in keys {
        let (limit, rate) = limit_of(exec, &workflow).await?;
        admitted.extend(admit(exec, &workflow, &key, limit, rate).await?);
    }
    Ok(admitted)
}

/// Admits the keys that new requests `queued` (id, workflow, key) were stored waiting in
/// (a schedule's runs), and counts those still waiting after it as creates that waited:
/// for the rate when their workflow limits only the rate, else for a slot.
pub async fn admit_queued(
    exec: &Executor,
    queued: &[(Uuid, String, String)],
) -> Result<(), StoreError> {
    let keys = queued
        .iter()
        .map(|(_, w, k)| (w.clone(), k.clone()))
        .collect();
    let admitted = admit_keys(exec, keys).await?;
    for (id, workflow, _) in queued {
        if admitted.contains(id) {
            continue;
        }
        let m = &exec.app.metrics;
        match limit_of(exec, workflow).await? {
            (crate::workflow::model::NO_LIMIT, Some(_)) => m.rate_waits.inc(),
            _ => m.slot_waits.inc(),
        };
    }
    Ok(())
}

/// What a schedule's requests are stored with, by the version they run: the concurrency
/// key they wait under (its payload's) and the statuses they tell of (none of either
/// when that version declares none, or the workflow is gone or no longer reads, and its
/// fire is stored as before).
pub async fn schedule_terms(
    exec: &Executor,
    s: &crate::workflow::schedule::CompiledSchedule,
) -> Result<crate::store::schedules::Terms, StoreError> {
    let map = &exec.app.workflows;
    let name = &s.def.workflow;
    let wf = match s.def.version {
        Some(v) => map.get_or_load_version(&exec.pool, name, v).await,
        None => map.get_or_load(&exec.pool, name).await,
    };
    let wf = match wf {
        Ok(wf) => wf,
        Err(crate::store::workflow_map::LoadError::Store(e)) => return Err(e),
        Err(_) => None,
    };
    Ok(crate::store::schedules::Terms {
        key: wf.as_ref().and_then(|w| {
            w.concurrency
                .as_ref()
                .map(|c| c.key_of(s.def.payload.clone()))
        }),
        notify: wf.and_then(|w| w.notify_mask),
    })
}

/// Admits what fits into one key, waking this runtime's sweeper when any was; the ids
/// admitted.
pub async fn admit(
    exec: &Executor,
    workflow: &str,
    key: &str,
    limit: u32,
    rate: Option<(u32, u32)>,
) -> Result<Vec<Uuid>, StoreError> {
    let conn = exec.pool.get().await?;
    let admitted = slots::admit(&conn, workflow, key, limit, rate).await?;
    if !admitted.is_empty() {
        exec.app
            .metrics
            .slots_admitted
            .inc_by(admitted.len() as u64);
        for id in &admitted {
            exec.app.changes.notify(id);
        }
        exec.wake();
    }
    Ok(admitted)
}

/// One pass: every workflow with waiting requests, its keys with a free slot (and room
/// in their rate's window). True when a rate-limited workflow has requests waiting.
async fn sweep(
    exec: &Executor,
    cursors: &mut std::collections::HashMap<String, String>,
) -> Result<bool, StoreError> {
    let mut rated = false;
    let workflows = {
        let conn = exec.looks.get().await?;
        slots::waiting_workflows(&conn).await?
    };
    for workflow in workflows {
        let (limit, rate) = limit_of(exec, &workflow).await?;
        rated |= rate.is_some();
        let after = cursors.get(&workflow).cloned();
        let keys = {
            let conn = exec.looks.get().await?;
            let mut keys = slots::due_keys(
                &conn,
                &workflow,
                limit,
                rate,
                KEYS_PER_PASS,
                after.as_deref(),
            )
            .await?;
            if keys.is_empty() && after.is_some() {
                // Round again from the first key.
                keys = slots::due_keys(&conn, &workflow, limit, rate, KEYS_PER_PASS, None).await?;
            }
            keys
        };
        match keys.last() {
            Some(last) => {
                cursors.insert(workflow.clone(), last.clone());
            }
            None => {
                cursors.remove(&workflow);
            }
        }
        for key in keys {
            admit(exec, &workflow, &key, limit, rate).await?;
        }
    }
    Ok(rated)
}

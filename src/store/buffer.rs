//! The bounded write-behind buffer for new service requests, and its flusher.
//!
//! Handlers push rows into a bounded channel; one flusher task per runtime drains
//! whatever is queued (up to `max_batch`) and writes it with one `INSERT … UNNEST`
//! statement, which commits on its own. While a batch is in flight the next one fills,
//! so batches grow with load and no timer delay is needed.
//!
//! In `ack=commit` mode every row carries a oneshot that is answered after the statement
//! returned: `Ok` only when the batch committed. A failed batch answers every row with
//! an error (503), and a batch Postgres rejected for one bad row is retried row by row so
//! only that row fails. In `ack=accept` mode rows were answered on enqueue, so the flusher
//! retries a failed batch until it commits; the buffer stays bounded and fills meanwhile.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, Semaphore};
use uuid::Uuid;

use super::pool::Pool;
use super::raw_json::RawJson;
use super::StoreError;
use crate::config::AckMode;
use crate::metrics::Metrics;
use crate::workflow::Workflow;

/// Why a row was not acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckError {
    /// The batch did not commit: retry later (503).
    Unavailable,
    /// Postgres refused this row's data (400).
    Invalid(String),
}

/// One new service request on its way to Postgres.
pub struct PendingRow {
    pub id: Uuid,
    pub workflow: Arc<Workflow>,
    /// A validated JSON object.
    pub payload: Bytes,
    /// The forwardable request headers, as a JSON object.
    pub headers: Bytes,
    /// Answered after the commit in `ack=commit` mode; None in `ack=accept` mode.
    pub ack: Option<oneshot::Sender<Result<(), AckError>>>,
}

/// Why a push was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushError {
    /// The buffer stayed full for the whole wait, or the database is known to be down.
    Overloaded,
    /// The server is shutting down.
    Closed,
}

/// Lets the flusher insert rows already leased to the local executor, and hand them over
/// after commit (no extra round trip, no in-memory queue that a crash could lose).
pub trait Handoff: Send + Sync {
    /// Reserves room for up to `n` rows; returns how many the executor takes.
    fn reserve(&self, n: usize) -> usize;
    /// Gives back reservations that were not used (the batch failed).
    fn release(&self, n: usize);
    /// Starts rows that committed leased to this instance: (id, workflow, payload, headers).
    fn start(self: Arc<Self>, rows: Vec<(Uuid, Arc<Workflow>, Bytes, Bytes)>);
    /// This instance's lease owner id.
    fn owner(&self) -> Uuid;
    /// How long a fresh lease lasts.
    fn lease(&self) -> Duration;
}

/// Shared health of one buffer: set when a flush fails for lack of a database, so
/// handlers answer 503 at once instead of queueing behind a dead connection.
#[derive(Debug)]
struct BufferState {
    epoch: Instant,
    /// Milliseconds since `epoch` until which the database is presumed down.
    unavailable_until_ms: AtomicU64,
}

/// How long the database is presumed down after a failed flush before a new batch tries again.
const OUTAGE_BACKOFF: Duration = Duration::from_millis(250);

/// The handler side of a runtime's write buffer.
#[derive(Clone)]
pub struct WriteBuffer {
    tx: mpsc::Sender<PendingRow>,
    state: Arc<BufferState>,
}

impl WriteBuffer {
    /// Rows waiting in the buffer.
    pub fn depth(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    /// True while a recent flush found the database unreachable.
    #[inline]
    pub fn presumed_down(&self) -> bool {
        let until = self.state.unavailable_until_ms.load(Ordering::Relaxed);
        until != 0 && (self.state.epoch.elapsed().as_millis() as u64) < until
    }

    /// Queues a row, waiting up to `wait` for room.
    pub async fn push(&self, row: PendingRow, wait: Duration) -> Result<(), PushError> {
        match self.tx.try_send(row) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(PushError::Closed),
            Err(mpsc::error::TrySendError::Full(row)) => {
                match tokio::time::timeout(wait, self.tx.send(row)).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(_)) => Err(PushError::Closed),
                    Err(_) => Err(PushError::Overloaded),
                }
            }
        }
    }
}

/// Settings of one flusher.
#[derive(Clone)]
pub struct FlusherConfig {
    pub ack: AckMode,
    pub max_batch: usize,
    /// Batches in flight at once.
    pub concurrency: usize,
    /// Client-side bound on a statement, beyond the server's statement_timeout, for a
    /// connection that stops answering altogether.
    pub hard_timeout: Duration,
}

/// Creates a runtime's buffer; returns the handler side and the receiver the flusher drains.
pub fn channel(rows: usize) -> (WriteBuffer, mpsc::Receiver<PendingRow>) {
    let (tx, rx) = mpsc::channel(rows);
    let state = Arc::new(BufferState {
        epoch: Instant::now(),
        unavailable_until_ms: AtomicU64::new(0),
    });
    (WriteBuffer { tx, state }, rx)
}

/// Drains `rx` into Postgres until every sender is gone and the buffer is empty.
pub async fn run_flusher(
    buffer: WriteBuffer,
    mut rx: mpsc::Receiver<PendingRow>,
    pool: Pool,
    cfg: FlusherConfig,
    metrics: Arc<Metrics>,
    handoff: Option<Arc<dyn Handoff>>,
    close: oneshot::Receiver<()>,
) {
    let shared = Arc::new(Shared {
        state: buffer.state.clone(),
        pool,
        cfg: cfg.clone(),
        metrics,
        handoff,
    });
    // The flusher must not keep its own channel open, or shutdown would never end.
    drop(buffer);
    // Several batches may be in flight at once (on different connections): Postgres
    // then flushes their commits together, and a slow commit does not stall the buffer.
    let slots = Arc::new(Semaphore::new(cfg.concurrency));
    let mut close = Some(close);
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut batch: Vec<PendingRow> = Vec::with_capacity(cfg.max_batch);
        // Once told to close, refuse new rows but keep draining what is queued.
        let n = match close.as_mut() {
            Some(c) => tokio::select! {
                n = rx.recv_many(&mut batch, cfg.max_batch) => n,
                _ = c => {
                    close = None;
                    rx.close();
                    continue;
                }
            },
            None => rx.recv_many(&mut batch, cfg.max_batch).await,
        };
        if n == 0 {
            break;
        }
        let shared = shared.clone();
        tokio::spawn(async move {
            shared.flush(batch).await;
            drop(permit);
        });
    }
    // Wait for the batches still in flight.
    let _ = slots.acquire_many(cfg.concurrency as u32).await;
}

/// What every in-flight batch of one flusher shares.
struct Shared {
    state: Arc<BufferState>,
    pool: Pool,
    cfg: FlusherConfig,
    metrics: Arc<Metrics>,
    handoff: Option<Arc<dyn Handoff>>,
}

impl Shared {
    /// Writes one batch and answers its rows (retrying in `ack=accept` mode until it commits).
    async fn flush(&self, mut batch: Vec<PendingRow>) {
        let mut backoff = Duration::from_millis(50);
        loop {
            let handoff = self.handoff.as_deref();
            let n_leased = handoff.map_or(0, |h| h.reserve(batch.len()));
            let started = Instant::now();
            let result =
                write_batch(&self.pool, &batch, n_leased, handoff, self.cfg.hard_timeout).await;
            self.metrics
                .commit_seconds
                .observe_duration(started.elapsed());
            self.metrics.batch_rows.observe(batch.len() as f64);
            let e = match result {
                Ok(()) => {
                    self.state.unavailable_until_ms.store(0, Ordering::Relaxed);
                    self.metrics.rows_written.inc_by(batch.len() as u64);
                    if let (Some(h), true) = (&self.handoff, n_leased > 0) {
                        let rows = batch[..n_leased]
                            .iter()
                            .map(|r| {
                                (
                                    r.id,
                                    r.workflow.clone(),
                                    r.payload.clone(),
                                    r.headers.clone(),
                                )
                            })
                            .collect();
                        h.clone().start(rows);
                    }
                    for row in batch.drain(..) {
                        if let Some(ack) = row.ack {
                            let _ = ack.send(Ok(()));
                        }
                    }
                    return;
                }
                Err(e) => e,
            };
            if let Some(h) = handoff {
                h.release(n_leased);
            }
            self.metrics.flush_errors.inc();
            if let StoreError::Invalid(_) = e {
                // One bad row must not fail its neighbours: write them one by one.
                write_rows_singly(&self.pool, &mut batch, &self.metrics, self.cfg.hard_timeout)
                    .await;
                return;
            }
            let until = self.state.epoch.elapsed() + OUTAGE_BACKOFF;
            self.state
                .unavailable_until_ms
                .store(until.as_millis() as u64, Ordering::Relaxed);
            if self.cfg.ack == AckMode::Commit {
                tracing::warn!(rows = batch.len(), error = %e, "batch insert failed; answered 503");
                for row in batch.drain(..) {
                    if let Some(ack) = row.ack {
                        let _ = ack.send(Err(AckError::Unavailable));
                    }
                }
                return;
            }
            // ack=accept: these rows were acknowledged; keep them until they commit.
            tracing::warn!(rows = batch.len(), error = %e, "batch insert failed; retrying");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }
}

/// Writes `rows` in one statement; the first `n_leased` are inserted leased to this instance.
async fn write_batch(
    pool: &Pool,
    rows: &[PendingRow],
    n_leased: usize,
    handoff: Option<&dyn Handoff>,
    hard_timeout: Duration,
) -> Result<(), StoreError> {
    let conn = pool.get().await?;
    let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    let names: Vec<&str> = rows.iter().map(|r| r.workflow.def.name.as_str()).collect();
    let payloads: Vec<RawJson> = rows.iter().map(|r| RawJson(&r.payload)).collect();
    let headers: Vec<RawJson> = rows.iter().map(|r| RawJson(&r.headers)).collect();
    let leased: Vec<bool> = (0..rows.len()).map(|i| i < n_leased).collect();
    let owner: Option<Uuid> = handoff.filter(|_| n_leased > 0).map(|h| h.owner());
    let lease_ms: f64 = handoff.map_or(0.0, |h| h.lease().as_secs_f64() * 1000.0);
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] = [
        &ids, &names, &payloads, &headers, &leased, &owner, &lease_ms,
    ];
    let fut = conn.client.execute(&conn.insert_requests, &params);
    match tokio::time::timeout(hard_timeout, fut).await {
        Ok(r) => r.map(|_| ()).map_err(StoreError::from),
        Err(_) => {
            // The connection stopped answering. Cancel server-side so the statement cannot
            // commit later; the outcome is unknown, so the rows are answered 503.
            let token = conn.client.cancel_token();
            tokio::spawn(async move {
                let _ = token.cancel_query(tokio_postgres::NoTls).await;
            });
            Err(StoreError::Unavailable("batch insert timed out".into()))
        }
    }
}

/// After a batch was refused for its data, writes each row alone and answers each row.
async fn write_rows_singly(
    pool: &Pool,
    batch: &mut Vec<PendingRow>,
    metrics: &Metrics,
    hard_timeout: Duration,
) {
    for row in batch.drain(..) {
        let result = async {
            let conn = pool.get().await?;
            let no_owner: Option<Uuid> = None;
            let name = row.workflow.def.name.as_str();
            let (payload, headers) = (RawJson(&row.payload), RawJson(&row.headers));
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
                [&row.id, &name, &payload, &headers, &no_owner, &0f64];
            let fut = conn.client.execute(&conn.insert_request, &params);
            match tokio::time::timeout(hard_timeout, fut).await {
                Ok(r) => r.map(|_| ()).map_err(StoreError::from),
                Err(_) => Err(StoreError::Unavailable("insert timed out".into())),
            }
        }
        .await;
        let answer = match result {
            Ok(()) => {
                metrics.rows_written.inc();
                Ok(())
            }
            Err(StoreError::Invalid(msg)) => Err(AckError::Invalid(msg)),
            Err(_) => Err(AckError::Unavailable),
        };
        if answer.is_err() && row.ack.is_none() {
            tracing::error!(id = %row.id, "an accepted service request could not be stored");
        }
        if let Some(ack) = row.ack {
            let _ = ack.send(answer);
        }
    }
}

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
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::FutureExt;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;
use uuid::Uuid;

use std::collections::{HashMap, HashSet};

use super::budget::{self, Budget};
use super::idempotency;
use super::pool::{PgConn, Pool};
use super::raw_json::RawJson;
use super::Result;
use super::StoreError;
use crate::backoff::Backoff;
use crate::batches::Flights;
use crate::config::AckMode;
use crate::metrics::Metrics;
use crate::workflow::Workflow;

/// What a create became, once its batch committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// This row: a new service request, with this id.
    New(Uuid),
    /// Its `Idempotency-Key` was used before, for this workflow, with the same payload:
    /// that request, and its status now (None: deleted by retention since).
    Existing {
        id: Uuid,
        status: Option<crate::status::RequestStatus>,
    },
    /// Its key was used before, for this workflow, with another payload.
    Mismatch { id: Uuid },
}

/// Why a row was not acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckError {
    /// The batch did not commit: retry later (503).
    Unavailable,
    /// Postgres refused this row's data (400); the detail is logged where it was
    /// refused, never sent.
    Invalid,
}

/// One new service request on its way to Postgres.
pub struct PendingRow {
    pub id: Uuid,
    /// The version it runs if `pinned`, else the latest this instance knows (the insert
    /// pins the latest in Postgres).
    pub workflow: Arc<Workflow>,
    /// The create named its version (`?version=N`).
    pub pinned: bool,
    /// A validated JSON object.
    pub payload: Bytes,
    /// The forwardable request headers, as a JSON array of `[name, value]` pairs.
    pub headers: Bytes,
    /// The digest of its `Idempotency-Key` (`idempotency::key_hash`), if it sent one.
    pub key: Option<Uuid>,
    /// When it was created, in microseconds since the Unix epoch (the server's clock).
    pub created_us: i64,
    /// Its deadline, in whole milliseconds from its creation (beyond Clamp; None: none).
    pub deadline_ms: Option<f64>,
    /// Its priority, 1 to 9 (beyond Clamp; None: the default, 5).
    pub priority: Option<i16>,
    /// Its labels (beyond Clamp; None: none, stored as NULL).
    pub labels: Option<crate::labels::Labels>,
    /// Answered after the commit in `ack=commit` mode, and for keyed rows always; None
    /// otherwise in `ack=accept` mode.
    pub ack: Option<oneshot::Sender<Result<Created, AckError>>>,
}

impl budget::Stamped for PendingRow {
    fn created_us(&self) -> i64 {
        self.created_us
    }

    fn awaited(&self) -> bool {
        self.ack.is_some()
    }
}

/// Why a push was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushError {
    /// The buffer stayed full for the whole wait, or the database is known to be down.
    Overloaded,
    /// The server is shutting down.
    Closed,
}

/// A row that committed leased to this instance, for its executor.
pub struct Inserted {
    pub id: Uuid,
    /// The version this instance knows; `version` is the one the row was pinned to (they
    /// differ when another instance stored a newer version this one has not loaded).
    pub workflow: Arc<Workflow>,
    pub version: u32,
    pub payload: Bytes,
    pub headers: Bytes,
    pub created_us: i64,
    pub deadline_ms: Option<f64>,
    pub priority: Option<i16>,
}

/// Lets the flusher insert rows already leased to the local executor, and hand them over
/// after commit (no extra round trip, no in-memory queue that a crash could lose).
pub trait Handoff: Send + Sync {
    /// Reserves room for up to `n` rows; returns how many are taken, and by which
    /// executor (`Taken::by`, for the calls that follow about the same rows).
    fn reserve(&self, n: usize) -> Taken;
    /// Gives back `n` of the reservations `taken` made that were not used (the batch
    /// failed, or a row's key was taken).
    fn release(&self, taken: Taken, n: usize);
    /// Rows committed unleased (no room for them): a claim must look for them. Called
    /// after the commit, so a claim that ran before it cannot have cleared the mark.
    fn stored_unleased(&self);
    /// Starts rows that committed leased to this instance, on the executor `taken` names.
    fn start(self: Arc<Self>, taken: Taken, rows: Vec<Inserted>);
    /// This instance's lease owner id.
    fn owner(&self) -> Uuid;
    /// How long a fresh lease lasts.
    fn lease(&self) -> Duration;
}

/// Room a batch's reservation took: `n` rows, by the executor numbered `by` (its place
/// among the runtimes' executors, `engine::spread`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Taken {
    pub n: usize,
    pub by: usize,
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
    /// Batches in flight at once, at most: one, and more only beside a slow one.
    pub concurrency: usize,
    /// Client-side bound on a statement, beyond the server's statement_timeout, for a
    /// connection that stops answering altogether.
    pub hard_timeout: Duration,
    /// How long a row has from entering the buffer to its answer (`budget`).
    pub budget: Budget,
    /// How long an idempotency key holds.
    pub key_window: Duration,
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
        flights: Flights::default(),
    });
    // The flusher must not keep its own channel open, or shutdown would never end.
    drop(buffer);
    // One batch in flight, the next filling behind it; up to `concurrency` (each on its
    // own connection) only while the one in flight is slower than usual (`flights`).
    let slots = Arc::new(Semaphore::new(cfg.concurrency));
    let mut close = Some(close);
    // The oldest row not in a batch yet: the next batch starts with it.
    let mut front: Option<PendingRow> = None;
    loop {
        let first = match front.take() {
            Some(row) => row,
            None => match next_row(&mut rx, &mut close).await {
                Some(row) => row,
                None => break,
            },
        };
        // A slot and clearance to leave; meanwhile, rows whose time runs out are
        // answered (`budget`), the oldest first.
        let expiry = cfg.budget.until_expiry(&first, budget::now_us());
        let cleared = async {
            let permit = slots.clone().acquire_owned().await;
            shared.flights.clearance().await;
            permit
        };
        let permit = tokio::select! {
            biased;
            p = cleared => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            _ = tokio::time::sleep(expiry.unwrap_or_default()), if expiry.is_some() => {
                front = shared.expire(first, &mut rx);
                continue;
            }
        };
        let mut batch: Vec<PendingRow> = Vec::with_capacity(cfg.max_batch);
        batch.push(first);
        // What else is queued, without waiting for more.
        let _ = rx.recv_many(&mut batch, cfg.max_batch - 1).now_or_never();
        let shared = shared.clone();
        let departed = shared.flights.depart();
        tokio::spawn(async move {
            shared.flush(batch).await;
            shared.flights.land(departed);
            drop(permit);
        });
    }
    // Wait for the batches still in flight.
    let _ = slots.acquire_many(cfg.concurrency as u32).await;
}

/// The next row of the buffer, waiting for one; once told to close, the buffer refuses
/// new rows and what is queued is still drained. None when it is closed and empty.
async fn next_row(
    rx: &mut mpsc::Receiver<PendingRow>,
    close: &mut Option<oneshot::Receiver<()>>,
) -> Option<PendingRow> {
    loop {
        match close.as_mut() {
            Some(c) => tokio::select! {
                row = rx.recv() => return row,
                _ = c => {
                    *close = None;
                    rx.close();
                }
            },
            None => return rx.recv().await,
        }
    }
}

/// What every in-flight batch of one flusher shares.
struct Shared {
    state: Arc<BufferState>,
    pool: Pool,
    cfg: FlusherConfig,
    metrics: Arc<Metrics>,
    handoff: Option<Arc<dyn Handoff>>,
    flights: Flights,
}

impl Shared {
    /// Answers `first` and the rows queued behind it whose time ran out, unsent (503);
    /// returns the first row that still has time, if one is queued.
    fn expire(&self, first: PendingRow, rx: &mut mpsc::Receiver<PendingRow>) -> Option<PendingRow> {
        let now = budget::now_us();
        let mut next = Some(first);
        while let Some(row) = next.take() {
            if !self.cfg.budget.expired(&row, now) {
                return Some(row);
            }
            self.refuse(row);
            next = rx.try_recv().ok();
        }
        None
    }

    /// Answers a row that was never sent: 503.
    fn refuse(&self, row: PendingRow) {
        if let Some(ack) = row.ack {
            self.metrics.flush_expired.inc();
            let _ = ack.send(Err(AckError::Unavailable));
        }
    }

    /// Writes one batch and answers its rows (retrying in `ack=accept` mode until it commits).
    async fn flush(&self, mut batch: Vec<PendingRow>) {
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
        loop {
            // Rows with no time left are answered unsent; a late batch gets the time its
            // most pressed row has left as its statement timeout.
            let now = budget::now_us();
            if batch.iter().any(|r| self.cfg.budget.expired(r, now)) {
                let (gone, kept): (Vec<_>, Vec<_>) = batch
                    .into_iter()
                    .partition(|r| self.cfg.budget.expired(r, now));
                gone.into_iter().for_each(|r| self.refuse(r));
                batch = kept;
                if batch.is_empty() {
                    return;
                }
            }
            let timeout = self.cfg.budget.statement_timeout(&batch, now);
            let handoff = self.handoff.as_deref();
            let taken = handoff.map_or(Taken::default(), |h| h.reserve(batch.len()));
            let n_leased = taken.n;
            let started = Instant::now();
            let result =
                write_batch(&self.pool, &batch, n_leased, handoff, &self.cfg, timeout).await;
            self.metrics
                .commit_seconds
                .observe_duration(started.elapsed());
            self.metrics.batch_rows.observe(batch.len() as f64);
            let e = match result {
                Ok((written, pinned)) => {
                    self.state.unavailable_until_ms.store(0, Ordering::Relaxed);
                    self.settle(batch, taken, written, &pinned);
                    return;
                }
                Err(e) => e,
            };
            if let Some(h) = handoff {
                h.release(taken, n_leased);
            }
            self.metrics.flush_errors.inc();
            if let StoreError::Invalid(_) = e {
                // One bad row must not fail its neighbours: write them one by one.
                self.write_rows_singly(batch).await;
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
            backoff.wait().await;
        }
    }

    /// After a commit: hands the rows inserted leased to the executor, gives back the
    /// slots of leased rows that were not inserted (their key was taken), answers every row.
    fn settle(&self, batch: Vec<PendingRow>, taken: Taken, written: Written, pinned: &Pinned) {
        let n_leased = taken.n;
        let created = |i: usize| match &written {
            Written::AllNew => Created::New(batch[i].id),
            Written::Each(each) => each[i].clone(),
        };
        let n_new = match &written {
            Written::AllNew => batch.len(),
            Written::Each(each) => each.iter().filter(|c| matches!(c, Created::New(_))).count(),
        };
        self.metrics.rows_written.inc_by(n_new as u64);
        if let (Some(h), true) = (&self.handoff, n_leased < batch.len()) {
            h.stored_unleased();
        }
        if let (Some(h), true) = (&self.handoff, n_leased > 0) {
            let rows: Vec<_> = batch[..n_leased]
                .iter()
                .enumerate()
                .filter(|(i, _)| matches!(created(*i), Created::New(_)))
                .map(|(_, r)| Inserted {
                    id: r.id,
                    workflow: r.workflow.clone(),
                    version: pinned.of(r),
                    payload: r.payload.clone(),
                    headers: r.headers.clone(),
                    created_us: r.created_us,
                    deadline_ms: r.deadline_ms,
                    priority: r.priority,
                })
                .collect();
            h.release(taken, n_leased - rows.len());
            if !rows.is_empty() {
                h.clone().start(taken, rows);
            }
        }
        for (i, row) in batch.into_iter().enumerate() {
            let Some(ack) = row.ack else { continue };
            let answer = match &written {
                Written::AllNew => Created::New(row.id),
                Written::Each(each) => each[i].clone(),
            };
            let _ = ack.send(Ok(answer));
        }
    }

    /// After a batch was refused for its data, writes each row alone and answers each row.
    async fn write_rows_singly(&self, batch: Vec<PendingRow>) {
        for row in batch {
            let rows = std::slice::from_ref(&row);
            let answer = match write_batch(&self.pool, rows, 0, None, &self.cfg, None)
                .await
                .map(|(w, _)| w)
            {
                Ok(Written::AllNew) => {
                    self.metrics.rows_written.inc();
                    Ok(Created::New(row.id))
                }
                Ok(Written::Each(mut each)) => {
                    let c = each.pop().expect("one row, one answer");
                    if matches!(c, Created::New(_)) {
                        self.metrics.rows_written.inc();
                    }
                    Ok(c)
                }
                Err(e @ StoreError::Invalid(_)) => {
                    let detail = crate::error_chain::one_line(&e);
                    tracing::info!(id = %row.id, %detail, "the database refused a create's data");
                    Err(AckError::Invalid)
                }
                Err(_) => Err(AckError::Unavailable),
            };
            if answer.is_err() && row.ack.is_none() {
                tracing::error!(id = %row.id, "an accepted service request could not be stored");
            }
            if let (Ok(Created::New(_)), Some(h)) = (&answer, &self.handoff) {
                h.stored_unleased();
            }
            if let Some(ack) = row.ack {
                let _ = ack.send(answer);
            }
        }
    }
}

/// What a committed batch wrote.
enum Written {
    /// Every row is a new service request (the batch had no keys).
    AllNew,
    /// Per row, what it became.
    Each(Vec<Created>),
}

/// The versions a committed batch's rows were pinned to.
enum Pinned {
    /// Each workflow's latest version as the insert saw it (rows that named none got it).
    Latest(Vec<(String, i32)>),
    /// Each inserted row's version.
    PerRow(HashMap<Uuid, i32>),
}

impl Pinned {
    fn of(&self, row: &PendingRow) -> u32 {
        let known = row.workflow.def.version;
        let v = match self {
            _ if row.pinned => return known,
            Pinned::Latest(l) => l
                .iter()
                .find(|(n, _)| *n == row.workflow.def.name)
                .map(|(_, v)| *v),
            Pinned::PerRow(m) => m.get(&row.id).copied(),
        };
        v.map_or(known, |v| v.max(1) as u32)
    }
}

fn latest(rows: &[tokio_postgres::Row]) -> Pinned {
    Pinned::Latest(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Writes `rows` in one statement (two when keys were taken by other creates); the first
/// `n_leased` are inserted leased to this instance. With `timeout`, the statements run
/// under that statement timeout instead of the session's (set before, reset after).
async fn write_batch(
    pool: &Pool,
    rows: &[PendingRow],
    n_leased: usize,
    handoff: Option<&dyn Handoff>,
    cfg: &FlusherConfig,
    timeout: Option<Duration>,
) -> Result<(Written, Pinned)> {
    let conn = pool.get().await?;
    let Some(timeout) = timeout else {
        return write_rows(&conn, rows, n_leased, handoff, cfg).await;
    };
    bounded(&conn, cfg.hard_timeout, async {
        conn.client
            .batch_execute(&set_statement_timeout(timeout.as_millis().max(1)))
            .await
    })
    .await?;
    let written = write_rows(&conn, rows, n_leased, handoff, cfg).await;
    let reset = bounded(&conn, cfg.hard_timeout, async {
        conn.client.batch_execute(RESET_STATEMENT_TIMEOUT).await
    })
    .await;
    if reset.is_err() {
        // A session left with a short timeout must not serve anyone else.
        conn.poison();
    }
    written
}

/// The statement a late batch runs before its insert: the time its most pressed row has
/// left, in whole milliseconds (at least one; 0 would mean no timeout at all). Built per
/// late batch (a value in its text), so it is a template in `statements.sql`.
pub(in crate::store) fn set_statement_timeout(ms: impl std::fmt::Display) -> String {
    format!("SET statement_timeout = {ms}")
}

/// Back to the session's statement timeout after a late batch.
pub(in crate::store) const RESET_STATEMENT_TIMEOUT: &str = "RESET statement_timeout";

/// The lease a batch's leased rows get: this instance's, for as long as a fresh lease
/// lasts (no owner when no row is leased).
struct Lease {
    owner: Option<Uuid>,
    ms: f64,
}

/// Writes a batch: rows without keys by the plain insert, a batch with keys by the keyed
/// inserts, which resolve each key in the same statement.
async fn write_rows(
    conn: &PgConn,
    rows: &[PendingRow],
    n_leased: usize,
    handoff: Option<&dyn Handoff>,
    cfg: &FlusherConfig,
) -> Result<(Written, Pinned)> {
    let lease = Lease {
        owner: handoff.filter(|_| n_leased > 0).map(|h| h.owner()),
        ms: handoff.map_or(0.0, |h| h.lease().as_secs_f64() * 1000.0),
    };
    if rows.iter().all(|r| r.key.is_none()) {
        let p = NewRequests {
            rows: new_requests(rows, 0..rows.len(), n_leased).collect(),
            names: rows.iter().map(|r| r.workflow.def.name.as_str()).collect(),
            owner: lease.owner,
            lease_ms: lease.ms,
        };
        let found = insert_requests(conn, &p, cfg.hard_timeout).await?;
        return Ok((Written::AllNew, latest(&found)));
    }
    write_keyed(conn, rows, n_leased, lease, cfg).await
}

/// Writes a batch with keys: every row whose key is new is inserted by the first
/// statement; when a key was held, the batch is written again by the statement that
/// takes only free or expired keys, and the rows that lost theirs are answered with the
/// request holding it.
async fn write_keyed(
    conn: &PgConn,
    rows: &[PendingRow],
    n_leased: usize,
    lease: Lease,
    cfg: &FlusherConfig,
) -> Result<(Written, Pinned)> {
    // A key twice in one batch: the first row claims it, the others are looked up after.
    let mut seen: HashSet<Uuid> = HashSet::new();
    let leaders: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].key.is_none_or(|h| seen.insert(h)))
        .collect();
    let p = KeyedRequests {
        c: Columns::of(new_requests(rows, leaders.iter().copied(), n_leased)),
        keys: leaders.iter().map(|&i| rows[i].key).collect(),
        owner: lease.owner,
        lease_ms: lease.ms,
        window_s: cfg.key_window.as_secs_f64(),
    };
    // The usual case: every key is new, and every row is inserted.
    let (inserted, pinned): (HashSet<Uuid>, Pinned) = match insert_keyed(conn, &p, cfg.hard_timeout)
        .await
    {
        Ok(found) if leaders.len() == rows.len() => return Ok((Written::AllNew, latest(&found))),
        Ok(found) => (
            leaders.iter().map(|&i| rows[i].id).collect(),
            latest(&found),
        ),
        // A key held already: a repeat, a claim at this moment, or an expired entry.
        Err(StoreError::Conflict) => {
            let found = insert_keyed_conflicts(conn, &p, cfg.hard_timeout).await?;
            let per_row: HashMap<Uuid, i32> = found.iter().map(|r| (r.get(0), r.get(1))).collect();
            (per_row.keys().copied().collect(), Pinned::PerRow(per_row))
        }
        Err(e) => return Err(e),
    };
    let each = created_each(conn, rows, &inserted, cfg.hard_timeout).await?;
    Ok((Written::Each(each), pinned))
}

/// Per row of a keyed batch, what it became: a new request when it was inserted, else
/// the request holding its key (looked up after the insert committed, so it sees the
/// winner) and whether its payload was the same.
async fn created_each(
    conn: &PgConn,
    rows: &[PendingRow],
    inserted: &HashSet<Uuid>,
    limit: Duration,
) -> Result<Vec<Created>> {
    let mut each: Vec<Option<Created>> = rows
        .iter()
        .map(|r| inserted.contains(&r.id).then_some(Created::New(r.id)))
        .collect();
    let lost: Vec<idempotency::Lookup> = rows
        .iter()
        .enumerate()
        .filter(|(i, _)| each[*i].is_none())
        .map(|(i, r)| idempotency::Lookup {
            idx: i as i32,
            key_hash: r.key.expect("only keyed rows can lose"),
            payload: &r.payload,
        })
        .collect();
    if !lost.is_empty() {
        let holders = bounded(conn, limit, async {
            idempotency::holders(conn, &lost).await
        })
        .await?;
        for (idx, h) in holders {
            // A request deleted by retention since cannot be compared: its id is the answer.
            each[idx as usize] = Some(if h.same_payload == Some(false) {
                Created::Mismatch { id: h.id }
            } else {
                Created::Existing {
                    id: h.id,
                    status: h.status,
                }
            });
        }
    }
    if each.iter().any(Option::is_none) {
        // A key expired and was deleted between the two statements: rare enough to
        // answer the whole batch as unavailable (the inserted rows stay; a retry with the
        // same key finds them).
        return Err(StoreError::Unavailable(
            "an idempotency key changed while it was looked up".into(),
        ));
    }
    Ok(each.into_iter().map(Option::unwrap).collect())
}

/// A parameter as tokio-postgres takes it.
type Param<'p> = &'p (dyn ToSql + Sync);

/// `INSERT_REQUESTS`' parameters, by name.
struct NewRequests<'a> {
    /// `$1`: the rows, one `new_request` each.
    rows: Vec<NewRequest<'a>>,
    /// `$2`: their workflows' names, whose latest versions the statement reads.
    names: Vec<&'a str>,
    /// `$3`, `$4`: the lease of the rows marked `leased`.
    owner: Option<Uuid>,
    lease_ms: f64,
}

impl NewRequests<'_> {
    /// In the statement's order.
    fn params(&self) -> [Param<'_>; 4] {
        [&self.rows, &self.names, &self.owner, &self.lease_ms]
    }
}

/// The plain insert (prepared with the connection): the latest version of each of the
/// batch's workflows. Through the partitioned table, not aimed at the batch's set as the
/// limited insert is: aimed, it cost 4 % less a call, about 0.6 µs of a request's 100
/// (docs/decisions.md, "Finishes free their slots"), and would need a transaction of its
/// own to lock the parent first.
async fn insert_requests(conn: &PgConn, p: &NewRequests<'_>, limit: Duration) -> Result<Vec<Row>> {
    bounded(conn, limit, async {
        conn.client.query(&conn.insert_requests, &p.params()).await
    })
    .await
}

/// The keyed inserts' parameters, by name: the rows as columns, and what only keys need.
struct KeyedRequests<'a> {
    c: Columns<'a>,
    /// Each row's key digest (None: no key).
    keys: Vec<Option<Uuid>>,
    /// The lease of the rows marked `leased`.
    owner: Option<Uuid>,
    lease_ms: f64,
    /// How long a key holds, in seconds.
    window_s: f64,
}

impl KeyedRequests<'_> {
    /// `INSERT_KEYED`'s `$1..$14`.
    fn insert_keyed(&self) -> [Param<'_>; 14] {
        let c = &self.c;
        [
            &c.ids,
            &c.names,
            &c.payloads,
            &c.headers,
            &c.leased,
            &self.owner,
            &self.lease_ms,
            &self.keys,
            &c.created,
            &c.versions,
            &c.deadlines,
            &c.priorities,
            &c.labels,
            &c.notify,
        ]
    }

    /// `INSERT_KEYED_CONFLICTS`' `$1..$15`: the window before the versions.
    fn insert_keyed_conflicts(&self) -> [Param<'_>; 15] {
        let c = &self.c;
        [
            &c.ids,
            &c.names,
            &c.payloads,
            &c.headers,
            &c.leased,
            &self.owner,
            &self.lease_ms,
            &self.keys,
            &c.created,
            &self.window_s,
            &c.versions,
            &c.deadlines,
            &c.priorities,
            &c.labels,
            &c.notify,
        ]
    }
}

/// The keyed insert of the usual case (every key new): the latest version of each of the
/// batch's workflows; `Conflict` when a key was held.
async fn insert_keyed(conn: &PgConn, p: &KeyedRequests<'_>, limit: Duration) -> Result<Vec<Row>> {
    bounded(conn, limit, async {
        let stmt = conn.stmt(idempotency::INSERT_KEYED).await?;
        conn.client.query(&stmt, &p.insert_keyed()).await
    })
    .await
}

/// The keyed insert after a conflict: the id and version of each row inserted.
async fn insert_keyed_conflicts(
    conn: &PgConn,
    p: &KeyedRequests<'_>,
    limit: Duration,
) -> Result<Vec<Row>> {
    bounded(conn, limit, async {
        let stmt = conn.stmt(idempotency::INSERT_KEYED_CONFLICTS).await?;
        conn.client.query(&stmt, &p.insert_keyed_conflicts()).await
    })
    .await
}

/// The one shape of a new request row, for the plain insert (an array of them) and the
/// keyed inserts (their columns) alike: the rows of `rows` at `picked`, the first
/// `n_leased` of the batch leased.
fn new_requests<'a>(
    rows: &'a [PendingRow],
    picked: impl ExactSizeIterator<Item = usize> + 'a,
    n_leased: usize,
) -> impl ExactSizeIterator<Item = NewRequest<'a>> + 'a {
    picked.map(move |i| NewRequest::of(&rows[i], i < n_leased))
}

/// The keyed inserts' rows, one array per column (`NewRequest`'s fields, in its order).
pub(in crate::store) struct Columns<'a> {
    pub ids: Vec<Uuid>,
    pub names: Vec<&'a str>,
    pub payloads: Vec<RawJson<'a>>,
    pub headers: Vec<RawJson<'a>>,
    pub leased: Vec<bool>,
    pub created: Vec<SystemTime>,
    /// The version a row names (0: the latest).
    pub versions: Vec<i32>,
    /// Its deadline in ms from its creation (None: none).
    pub deadlines: Vec<Option<f64>>,
    /// Its priority (None: the default).
    pub priorities: Vec<Option<i16>>,
    /// Its labels, one text separated by newlines (None: none).
    pub labels: Vec<Option<String>>,
    /// The final statuses its workflow tells of (None: none).
    pub notify: Vec<Option<i16>>,
}

impl<'a> Columns<'a> {
    pub fn of(rows: impl ExactSizeIterator<Item = NewRequest<'a>>) -> Columns<'a> {
        let n = rows.len();
        let mut c = Columns {
            ids: Vec::with_capacity(n),
            names: Vec::with_capacity(n),
            payloads: Vec::with_capacity(n),
            headers: Vec::with_capacity(n),
            leased: Vec::with_capacity(n),
            created: Vec::with_capacity(n),
            versions: Vec::with_capacity(n),
            deadlines: Vec::with_capacity(n),
            priorities: Vec::with_capacity(n),
            labels: Vec::with_capacity(n),
            notify: Vec::with_capacity(n),
        };
        for r in rows {
            c.ids.push(r.id);
            c.names.push(r.wf);
            c.payloads.push(r.payload);
            c.headers.push(r.headers);
            c.leased.push(r.leased);
            c.created.push(r.created);
            c.versions.push(r.ver);
            c.deadlines.push(r.deadline_ms);
            c.priorities.push(r.priority);
            c.labels.push(r.labels.map(|l| l.join("\n")));
            c.notify.push(r.notify);
        }
        c
    }
}

/// A new request row: as `INSERT_REQUESTS` reads it, a `new_request` (migration 15),
/// field by field.
#[derive(Debug, postgres_types::ToSql)]
#[postgres(name = "new_request")]
pub(in crate::store) struct NewRequest<'a> {
    id: Uuid,
    wf: &'a str,
    payload: RawJson<'a>,
    headers: RawJson<'a>,
    leased: bool,
    created: SystemTime,
    /// The version it names (0: the latest).
    ver: i32,
    /// Its deadline in ms from `created` (None: none; migration 20).
    deadline_ms: Option<f64>,
    /// Its priority (None: the default; migration 23).
    priority: Option<i16>,
    /// Its labels (None: none; migration 26).
    labels: Option<&'a [String]>,
    /// The final statuses its workflow tells of (None: none; migration 28).
    notify: Option<i16>,
}

impl<'a> NewRequest<'a> {
    fn of(r: &'a PendingRow, leased: bool) -> NewRequest<'a> {
        NewRequest {
            id: r.id,
            wf: r.workflow.def.name.as_str(),
            payload: RawJson(&r.payload),
            headers: RawJson(&r.headers),
            leased,
            created: system_time(r.created_us),
            ver: named_version(r),
            deadline_ms: r.deadline_ms,
            priority: r.priority,
            labels: r.labels.as_ref().map(crate::labels::Labels::as_slice),
            notify: r.workflow.notify_mask,
        }
    }
}

/// The version a row names (0: the latest).
fn named_version(r: &PendingRow) -> i32 {
    if r.pinned {
        r.workflow.def.version as i32
    } else {
        0
    }
}

/// Microseconds since the Unix epoch as a `SystemTime` (sent to Postgres exactly).
pub(crate) fn system_time(us: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(us.max(0) as u64)
}

/// Runs a statement with a client-side bound: a connection that stops answering is given
/// up on, and the statement is cancelled server-side. The outcome is unknown, so the rows
/// are answered 503; they may still be stored: a cancel that reaches a commit waiting for
/// a synchronous standby makes Postgres commit locally (docs/failover.md), so a client
/// retrying a 503 should send an `Idempotency-Key`.
async fn bounded<T, E, F>(conn: &PgConn, limit: Duration, fut: F) -> Result<T>
where
    F: std::future::Future<Output = Result<T, E>>,
    E: Into<StoreError>,
{
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r.map_err(Into::into),
        Err(_) => {
            // Abandoned midway, the session may sit inside a transaction: never reuse it.
            conn.poison();
            tokio::spawn(conn.cancel());
            Err(StoreError::Unavailable("batch insert timed out".into()))
        }
    }
}

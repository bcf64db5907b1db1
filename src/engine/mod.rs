//! Executing service requests without an in-memory queue: work is found in Postgres.
//!
//! Each runtime has an `Executor` with a bounded number of running requests. Rows created
//! while one has room are inserted already leased to this instance and handed over after
//! their batch commits (`spread`, the write buffer's `Handoff`); a sweeper claims whatever
//! else is runnable (new rows inserted unleased, resumed rows, and rows whose owner died)
//! with one `UPDATE … FOR UPDATE SKIP LOCKED` statement; a renewer keeps the leases of
//! running requests fresh and stops any request whose lease another instance took.

pub(crate) mod attempt;
pub(crate) mod children;
pub(crate) mod compensate;
pub(crate) mod error;
pub(crate) mod fan;
pub(crate) mod job;
pub(crate) mod lanes;
pub(crate) mod live;
mod loops;
pub(crate) mod notify;
pub(crate) mod outer;
pub(crate) mod resume;
mod room;
pub(crate) mod running;
mod shared;
pub(crate) mod spread;
pub(crate) mod step_io;
pub mod stored;
pub(crate) mod timers;
pub(crate) mod writer;

pub use error::{EngineError, Result};
pub use shared::Shared;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::outbound::doc::{self, Doc};
use parking_lot::Mutex;
use tokio::task::AbortHandle;
use uuid::Uuid;

use crate::outbound::http_step::HttpClient;
use crate::status::RequestStatus;
use crate::store::buffer::Inserted;
use crate::store::leases::{self, Claimed};
use crate::store::Pool;
use crate::workflow::Workflow;
use job::Job;
use writer::StepWriter;

/// How long a request set aside after a transient failure waits before it is claimed again.
const RELEASE_BACKOFF: Duration = Duration::from_millis(500);

/// A request this executor runs.
struct Held {
    task: AbortHandle,
    /// When its lease runs out, as far as this process knows (renewals move it).
    expires: Instant,
}

/// One runtime's executor.
pub struct Executor {
    pub app: Arc<Shared>,
    pub pool: Pool,
    /// The sweeper's and the timers' looks for due work (`store::pool::build_looks`).
    pub looks: Pool,
    pub http: HttpClient,
    pub amqp: crate::outbound::publish::amqp::AmqpPublisher,
    pub kafka: crate::outbound::publish::kafka::KafkaProducer,
    pub writer: StepWriter,
    /// Its slots and the backlog mark.
    room: room::Room,
    /// Running requests.
    running: Mutex<HashMap<Uuid, Held>>,
    stopping: AtomicBool,
    /// Wakes the sweeper early (a request was resumed, slots freed while rows may wait).
    wake: tokio::sync::Notify,
    /// Notified whenever a running request is forgotten (shutdown waits on it).
    forgotten: tokio::sync::Notify,
    /// Finished fan-out children to count (`fan::count_loop`).
    fan_told: tokio::sync::mpsc::Sender<Uuid>,
    /// The runtime it serves: its jobs run there whoever starts them (a limited create is
    /// stored by one task for every runtime, which starts the admitted ones).
    rt: tokio::runtime::Handle,
}

impl Executor {
    /// Creates the executor (the first one made also starts the process's step writer);
    /// call inside the runtime it serves.
    pub fn new(app: Arc<Shared>, pool: Pool, looks: Pool) -> Arc<Executor> {
        let cfg = &app.config;
        let http = HttpClient::new(
            &cfg.http,
            app.outbound.https.clone(),
            cfg.destinations.clone(),
            cfg.secrets.clone(),
        );
        let committed: writer::OnCommit = {
            let app = app.clone();
            Arc::new(move |t: &writer::Transition| live::committed(&app, t))
        };
        // Started once, by the first executor, on its runtime (which outlives every
        // executor's: `writes::Writes`); the queue bounds every runtime's running jobs.
        let writer = app
            .writer
            .get_or_init(|| {
                writer::start(
                    pool.clone(),
                    app.instance_id,
                    app.metrics.clone(),
                    committed,
                    cfg.max_running.saturating_mul(cfg.threads),
                    cfg.step_write_concurrency,
                )
            })
            .clone();
        let (fan_told, to_count) = tokio::sync::mpsc::channel(cfg.max_running.max(64));
        let room = room::Room::new(cfg.max_running, cfg.claim_batch.min(cfg.max_running) / 4);
        let exec = Arc::new(Executor {
            amqp: crate::outbound::publish::amqp::AmqpPublisher::new(
                app.metrics.clone(),
                app.outbound.amqp.clone(),
                cfg.destinations.clone(),
            ),
            kafka: crate::outbound::publish::kafka::KafkaProducer::new(
                app.metrics.clone(),
                app.outbound.kafka_steps.clone(),
                cfg.destinations.clone(),
            ),
            app,
            pool,
            looks,
            http,
            writer,
            room,
            running: Mutex::new(HashMap::new()),
            stopping: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
            forgotten: tokio::sync::Notify::new(),
            fan_told,
            rt: tokio::runtime::Handle::current(),
        });
        tokio::spawn(fan::count_loop(Arc::downgrade(&exec), to_count));
        exec
    }

    /// Asks the sweeper to look for runnable requests now.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// Requests running now.
    pub fn n_running(&self) -> usize {
        self.running.lock().len()
    }

    fn free(&self) -> usize {
        self.room.free()
    }

    /// Reserves up to `n` slots; returns how many were reserved.
    pub fn try_reserve(&self, n: usize) -> usize {
        if self.is_stopping() {
            return 0;
        }
        self.room.reserve(n)
    }

    /// Gives back slots reserved with `try_reserve` that were not used (or whose request
    /// ended), waking the sweeper when rows may be waiting for them.
    pub fn unreserve(&self, n: usize) {
        if self.room.give_back(n) {
            self.wake();
        }
    }

    /// Starts a job in a slot already reserved for it.
    pub fn spawn(self: &Arc<Self>, job: Job) {
        let id = job.id;
        let fresh = job.fresh;
        // Only a fresh job keeps a status memory, which needs its workflow.
        let (wf, created_us, deadline_us, priority) = (
            fresh.then(|| job.wf.clone()),
            job.created_us,
            job.deadline_us,
            job.priority,
        );
        let has_parent = job.has_parent;
        // A branch or item of inline steps (`order/3/acme`) counts its own finish; other
        // children have their parents told by the reporter's look.
        let fan_child = has_parent && job.wf.name.contains('/');
        let exec = self.clone();
        // Registered before the task can finish, so its own cleanup always finds it.
        let mut running = self.running.lock();
        let handle = self.rt.spawn(async move {
            job::run(&exec, job).await;
            exec.forget(id);
            // A child that finished tells its parent now (or the reporter will).
            if fan_child {
                exec.tell_fan(id).await;
            } else if has_parent {
                exec.report_children().await;
            }
        });
        // The lease was taken (by the insert or the claim) just before: it lasts until about now + lease.
        let expires = Instant::now() + self.app.config.lease;
        running.insert(
            id,
            Held {
                task: handle.abort_handle(),
                expires,
            },
        );
        self.app.running.insert(id);
        if let Some(wf) = wf {
            live::start(&self.app, &id, &wf, created_us, deadline_us, priority);
        }
    }

    /// Drops a finished (or lost) request and frees its slot, once.
    fn forget(&self, id: Uuid) {
        if self.running.lock().remove(&id).is_some() {
            self.app.running.remove(&id);
            self.unreserve(1);
            self.forgotten.notify_waiters();
        }
    }

    /// Counts a request that reached final `status`: Clamp's counters, and by workflow
    /// (`of`: its workflow and creation time, when known here).
    pub fn count_finished(&self, status: RequestStatus, of: Option<(&str, i64)>) {
        if let Some((workflow, created_us)) = of {
            self.app
                .metrics
                .outcomes
                .finished(workflow, status, Some(created_us));
        }
        match status {
            RequestStatus::Completed => self.app.metrics.completed.inc(),
            RequestStatus::Failed => self.app.metrics.failed.inc(),
            _ => 0,
        };
    }

    /// Builds the job for a claimed row, loading the context of the steps already run.
    async fn job_for(&self, mut c: Claimed) -> Result<Job> {
        let wf = self
            .app
            .workflows
            .get_or_load_version(&self.pool, &c.workflow_name, c.workflow_version)
            .await?
            .ok_or_else(|| {
                EngineError::WorkflowMissing(format!(
                    "{} (version {})",
                    c.workflow_name, c.workflow_version
                ))
            })?;
        // A fan-out child's steps that read the context see the enclosing one too.
        let outer = if wf.uses_context && c.workflow_name.contains('/') {
            outer::outer_context(self, c.id, &c.workflow_name, &c.payload).await?
        } else {
            Default::default()
        };
        let payload = Doc::trusted(std::mem::take(&mut c.payload));
        let start = Job::at_start(c.id, wf, payload, c.headers.as_bytes());
        // A claimed request's deadline comes relative to now (as the claim gives it).
        let common = Job {
            created_us: c.created_us,
            has_parent: c.parent_id.is_some(),
            retries: c.retries,
            deadline: job::deadline_in(c.deadline_in_ms),
            ..start
        };
        if c.status == RequestStatus::New && c.current_step_id == 0 {
            // Nothing ran yet: this job writes every step row, from the first. A child's
            // answer names its parent, which this memory does not keep; nor does it keep
            // a claimed request's deadline (the claim gives it relative to now, not as
            // stored), so such a request's answers are read, not kept.
            return Ok(Job {
                context: outer,
                fresh: c.parent_id.is_none() && c.deadline_in_ms.is_none(),
                priority: c.priority,
                ..common
            });
        }
        // With no step left (a final ASYNC, EVENT or WAIT step answered), the request only
        // finishes: nothing reads the context, so it is not read back.
        let context = if common.wf.uses_context && c.current_step_id > 0 {
            self.context_read(c.id, outer).await?
        } else {
            Default::default()
        };
        let reason = c.reason.filter(|r| !r.is_empty());
        let mut job = Job {
            next: (c.current_step_id > 0).then_some(c.current_step_id),
            request: c
                .step_request
                .map_or_else(|| common.payload.clone(), Doc::trusted),
            failing: c
                .failed_step_id
                .map(|s| (s, reason.unwrap_or_else(|| "a step failed".into()))),
            context,
            attempts: c.step_attempts,
            ..common
        };
        // Failing: its compensations, and where it is among them, read back; asked to
        // compensate (failed step 0: its parent failed, or a cancel asked), from the first.
        if let (Some((failed, _)), true) = (&job.failing, job.wf.compensates) {
            job.compensations = self.compensations(&job.wf, job.id, *failed).await?;
            if *failed == 0 && job.next.is_none() {
                job.next = job.compensations.after(0);
            }
        }
        Ok(job)
    }

    /// The context of the steps a request already ran, read back, over `outer` (an
    /// enclosing request's, for a fan-out child).
    async fn context_read(
        &self,
        id: Uuid,
        outer: serde_json::Map<String, serde_json::Value>,
    ) -> Result<serde_json::Map<String, serde_json::Value>> {
        let conn = self
            .pool
            .get()
            .await
            .map_err(crate::store::StoreError::from)?;
        let mut ctx = outer;
        for r in leases::load_context(&conn, id).await? {
            ctx.insert(
                crate::workflow::expr::context_name(&r.step_name),
                doc::context_entry(
                    r.request.unwrap_or_default(),
                    r.response.unwrap_or_default(),
                ),
            );
        }
        Ok(ctx)
    }

    /// Claims runnable rows while there is room; runs until `stop` fires.
    pub async fn sweep(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let cfg = &self.app.config;
        if self.room.capacity() == 0 {
            // An API-only instance claims nothing.
            return;
        }
        let mut last_report = Instant::now();
        loop {
            // Children whose parents have not heard (their executor stopped first).
            if last_report.elapsed() >= CHILD_REPORT_INTERVAL {
                last_report = Instant::now();
                self.report_children().await;
                self.report_joins().await;
                self.expire_answers().await;
            }
            let claimed_full = match self.sweep_once().await {
                Ok(n) => n > 0 && self.free() > 0,
                Err(e) => {
                    tracing::warn!(error = %e, "sweeper could not claim");
                    false
                }
            };
            // Claim again at once while rows keep coming and there is room; else wait.
            let pause = if claimed_full {
                Duration::from_millis(1)
            } else {
                cfg.sweep_interval
            };
            tokio::select! {
                _ = stop.changed() => return,
                _ = tokio::time::sleep(pause) => {}
                _ = self.wake.notified() => {}
            }
            if *stop.borrow() {
                return;
            }
        }
    }

    async fn sweep_once(self: &Arc<Self>) -> Result<usize> {
        let want = self.try_reserve(self.app.config.claim_batch);
        if want == 0 {
            // Every slot busy: whatever is runnable waits for the next free ones.
            self.room.set_backlog();
            return Ok(0);
        }
        self.room.clear_backlog();
        let claimed = async {
            let conn = self
                .looks
                .get()
                .await
                .map_err(crate::store::StoreError::from)?;
            leases::claim(
                &conn,
                self.app.instance_id,
                self.app.config.lease,
                want as i64,
            )
            .await
        }
        .await;
        let claimed = match claimed {
            Ok(c) => c,
            Err(e) => {
                self.unreserve(want);
                return Err(e.into());
            }
        };
        let n = claimed.len();
        if n == want {
            self.room.set_backlog();
        }
        self.unreserve(want - n);
        if n > 0 {
            tracing::debug!(n, first_service_request_id = %claimed[0].0.id, status = %claimed[0].0.status, "claimed");
        }
        let m = &self.app.metrics;
        m.leases_claimed.inc_by(n as u64);
        for (c, fired_late) in claimed {
            if let Some(late) = fired_late {
                m.timer_lateness.observe(late.max(0.0));
            }
            let id = c.id;
            // This process's lease ran out while one of its runtimes still runs the job
            // (renewals failed for a while): the claim renewed it (same owner), a second
            // job must not start, and that runtime's renewer keeps the lease from here.
            if self.app.running.contains(&id) {
                self.unreserve(1);
                continue;
            }
            self.run_claimed(c).await;
        }
        Ok(n)
    }

    /// Starts a request this instance holds the lease of, in a slot reserved for it.
    ///
    /// If its workflow or context cannot be loaded because of a transient failure (a pool
    /// timeout, a dropped connection), the request is set aside, not failed: its lease is
    /// given up with a short back-off (or, when even that cannot be written, left to
    /// expire), and it is continued later, here or on another instance. Only a permanent
    /// failure (its workflow is gone or no longer validates) fails it.
    async fn run_claimed(self: &Arc<Self>, c: Claimed) {
        let id = c.id;
        // For its log lines: a scan of the headers' text, no parse.
        let trace_id = crate::telemetry::context::trace_id_in(&c.headers).map(str::to_string);
        match self.job_for(c).await {
            Ok(job) => self.spawn(job),
            Err(e) if e.is_transient() => {
                self.unreserve(1);
                self.app.metrics.requests_released.inc();
                tracing::warn!(service_request_id = %id, trace_id = trace_id.as_deref(), error = %e, "claimed request could not be loaded; continuing it later");
                let released = async {
                    let conn = self
                        .pool
                        .get()
                        .await
                        .map_err(crate::store::StoreError::from)?;
                    leases::release(&conn, self.app.instance_id, &[id], RELEASE_BACKOFF).await
                }
                .await;
                if released.is_ok() {
                    self.wake_after(RELEASE_BACKOFF);
                }
            }
            Err(e) => {
                tracing::error!(service_request_id = %id, trace_id = trace_id.as_deref(), error = %e, "claimed request cannot run; marking it FAILED");
                let t = writer::Transition::failed(id, e.to_string());
                if self.writer.write(t).await.is_ok() {
                    self.count_finished(RequestStatus::Failed, None);
                }
                self.unreserve(1);
            }
        }
    }

    /// Continues a request that a step response resumed *and leased to this instance* in
    /// the same statement (a slot was reserved for it): no sweep, no second update.
    pub fn start_resumed(self: &Arc<Self>, c: Claimed) {
        let me = self.clone();
        tokio::spawn(async move { me.run_claimed(c).await });
    }

    /// Wakes the sweeper once `delay` has passed (a retry or a set-aside request is due
    /// then); the sweeper's own interval would find it too, only later.
    pub fn wake_after(self: &Arc<Self>, delay: Duration) {
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            me.wake();
        });
    }

    /// Keeps running requests' leases fresh; stops those whose lease another instance took.
    pub async fn renew(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let lease = self.app.config.lease;
        let every = lease / 3;
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                _ = tokio::time::sleep(every) => {}
            }
            // Only leases that would run out before the next pass or the one after need
            // renewing: most requests finish long before their first renewal is due.
            let horizon = Instant::now() + every * 2;
            let ids: Vec<Uuid> = self
                .running
                .lock()
                .iter()
                .filter(|(_, held)| held.expires <= horizon)
                .map(|(id, _)| *id)
                .collect();
            if ids.is_empty() {
                continue;
            }
            let renewed_at = Instant::now();
            let renewed = async {
                let conn = self
                    .pool
                    .get()
                    .await
                    .map_err(crate::store::StoreError::from)?;
                leases::renew(&conn, self.app.instance_id, lease, &ids).await
            }
            .await;
            match renewed {
                Ok(lost) => {
                    {
                        let mut running = self.running.lock();
                        for id in &ids {
                            if let Some(held) = running.get_mut(id) {
                                held.expires = renewed_at + lease;
                            }
                        }
                    }
                    if !lost.is_empty() {
                        tracing::debug!(n = lost.len(), first_service_request_id = %lost[0], "leases lost");
                    }
                    for id in &lost {
                        // Another instance holds it now: stop working on it.
                        let handle = self.running.lock().get(id).map(|h| h.task.clone());
                        if let Some(h) = handle {
                            h.abort();
                            self.forget(*id);
                            self.app.metrics.leases_lost.inc();
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "lease renewal failed"),
            }
        }
    }

    /// Stops claiming, lets running requests finish until `deadline`, then stops the rest
    /// and releases their leases so another instance continues them at once.
    pub async fn shutdown(&self, deadline: Duration) {
        self.stopping.store(true, Ordering::Relaxed);
        let until = tokio::time::Instant::now() + deadline;
        loop {
            // Registered before the check, so a request finishing in between still wakes us.
            let forgotten = self.forgotten.notified();
            if self.n_running() == 0 {
                break;
            }
            if tokio::time::timeout_at(until, forgotten).await.is_err() {
                break;
            }
        }
        let left: Vec<(Uuid, Held)> = self.running.lock().drain().collect();
        if left.is_empty() {
            return;
        }
        for (id, h) in &left {
            h.task.abort();
            self.app.running.remove(id);
        }
        let ids: Vec<Uuid> = left.iter().map(|(id, _)| *id).collect();
        if let Ok(conn) = self.pool.get().await {
            let owner = self.app.instance_id;
            match leases::release(&conn, owner, &ids, Duration::ZERO).await {
                Ok(n) => tracing::info!(released = n, "released leases of unfinished requests"),
                Err(e) => tracing::warn!(error = %e, "could not release leases; they will expire"),
            }
        }
    }
}

/// What the create paths hand this executor (`engine::spread` for the flusher's batches,
/// the limited creates for their own): room for fresh rows, and the rows once committed.
impl Executor {
    /// Reserves room for up to `n` fresh rows; returns how many it takes (the rest of the
    /// batch is stored unleased, for a claim).
    pub fn take_room(&self, n: usize) -> usize {
        let got = self.try_reserve(n);
        if got < n {
            self.room.set_backlog();
        }
        got
    }

    /// Rows were committed unleased (no room for them): the sweeper must look for them.
    /// Called after the commit, so a claim that ran before it cannot have cleared the mark.
    pub fn stored_unleased(&self) {
        if self.room.mark_backlog() {
            self.wake();
        }
    }

    /// Starts rows committed leased to this instance, in room `take_room` reserved.
    pub fn start_fresh(self: Arc<Self>, rows: Vec<Inserted>) {
        let me = self;
        for r in rows {
            if r.version == r.workflow.def.version {
                let wf = r.workflow.clone();
                me.spawn(fresh_job(r, wf));
                continue;
            }
            // Pinned to a version this instance has not loaded (another instance stored
            // it): loaded first. Should that fail, the lease runs out and a sweeper
            // continues the request with the version its row names.
            let me = me.clone();
            tokio::spawn(async move {
                let name = r.workflow.def.name.clone();
                match me
                    .app
                    .workflows
                    .get_or_load_version(&me.pool, &name, r.version)
                    .await
                {
                    Ok(Some(wf)) => me.spawn(fresh_job(r, wf)),
                    _ => me.unreserve(1),
                }
            });
        }
    }
}

/// How often each sweeper looks for finished children whose parents have not heard.
const CHILD_REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// The job of a request this instance just created, from its first step.
fn fresh_job(r: Inserted, wf: Arc<Workflow>) -> Job {
    // From its creation, as the row has it: the executor starts it just after commit.
    let deadline = r.deadline_ms.map(|ms| {
        let at = crate::store::buffer::system_time(r.created_us) + Duration::from_millis(ms as u64);
        let left = at
            .duration_since(std::time::SystemTime::now())
            .unwrap_or_default();
        tokio::time::Instant::now() + left
    });
    Job {
        fresh: true,
        created_us: r.created_us,
        deadline,
        deadline_us: r.deadline_ms.map(|ms| r.created_us + ms as i64 * 1000),
        priority: r.priority,
        ..Job::at_start(r.id, wf, Doc::trusted(r.payload), &r.headers)
    }
}

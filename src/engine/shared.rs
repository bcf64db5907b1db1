//! `Shared`: what the engine's runtimes share in this process (its configuration, the
//! connector, the workflow map, metrics, the requests running here and what reads are
//! answered from). The composition root, `state::App`, holds it beside what only the
//! carriers use. Read-mostly, so the hot path takes only read locks.

use std::sync::Arc;

use uuid::Uuid;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::store::WorkflowMap;

/// State shared by all runtimes: read-mostly, so the hot path only takes read locks.
pub struct Shared {
    pub config: Config,
    /// Opens connections to the database (every pool, the Kafka partition locks).
    pub db: Arc<crate::store::connect::PgConnector>,
    /// TLS settings of step calls and broker connections.
    pub outbound: crate::outbound::tls::Outbound,
    pub workflows: WorkflowMap,
    pub metrics: Arc<Metrics>,
    /// Unique per process start: the owner id of every lease this instance takes.
    pub instance_id: Uuid,
    /// Requests running on any runtime of this process.
    pub running: super::running::Running,
    /// Step calls in flight per downstream host, for the whole process.
    pub downstream: crate::outbound::limits::HostLimits,
    /// Final status answers, kept for reads that come after.
    pub finals: crate::reads::finals::FinalAnswers,
    /// Who waits (long polls) for a request's next committed change.
    pub changes: crate::reads::watch::Changes,
    /// Spans exported over OTLP; None when tracing is off.
    pub tracing: Option<crate::telemetry::Tracing>,
    /// Requests this process paused at a step, with their workflow (`paused`).
    pub paused: crate::reads::paused::PausedHere,
    /// Limited requests that finished here, whose slots the admitter fills (`slots`).
    pub freed: super::timers::slots::Freed,
    /// Creates of limited workflows, written in batches (`slots`).
    pub limited: super::timers::slots::LimitedCreates,
    /// The workflows paused, read every second (`store::pauses`): their requests park
    /// before their next step.
    pub pauses: Arc<crate::store::pauses::Pauses>,
    /// The one step writer of every runtime's executor, started by the first executor
    /// made (on its runtime): one batch of transitions for the process, not one per
    /// runtime (docs/decisions.md, "One write path per process").
    pub writer: std::sync::OnceLock<super::writer::StepWriter>,
    /// Every runtime's executor, as the one create flusher's hand-off.
    pub spread: Arc<super::spread::Spread>,
}

impl Shared {
    /// Tracing, and the trace a request keeps in its stored `headers`: None when tracing
    /// is off (the headers are not read then) or the request has no trace.
    pub fn traced(
        &self,
        headers: &str,
    ) -> Option<(&crate::telemetry::Tracing, crate::telemetry::RequestTrace)> {
        let t = self.tracing.as_ref()?;
        Some((t, super::stored::headers_and_trace(headers.as_bytes()).1?))
    }

    pub fn new(
        config: Config,
        db: Arc<crate::store::connect::PgConnector>,
        outbound: crate::outbound::tls::Outbound,
        metrics: Arc<Metrics>,
        tracing: Option<crate::telemetry::Tracing>,
        render: crate::reads::finals::Render,
    ) -> Shared {
        let downstream = crate::outbound::limits::HostLimits::new(
            config.downstream_limit,
            config.downstream_wait,
            metrics.clone(),
        );
        let finals = crate::reads::finals::FinalAnswers::new(
            config.status_cache_entries,
            config.retention.completed,
            render,
        );
        let instance_id = Uuid::now_v7();
        Shared {
            finals,
            changes: Default::default(),
            paused: Default::default(),
            freed: Default::default(),
            limited: Default::default(),
            writer: Default::default(),
            spread: Arc::new(super::spread::Spread::new(instance_id, config.lease)),
            pauses: Default::default(),
            config,
            db,
            outbound,
            workflows: WorkflowMap::default(),
            metrics,
            instance_id,
            running: Default::default(),
            downstream,
            tracing,
        }
    }
}

//! Counters and histograms, and their Prometheus text exposition.
//!
//! Every metric on the request path is a plain atomic created at startup: label sets are
//! fixed in advance (a route, a status class), never a request id or an unvalidated name.
//! Names follow Clamp's (`create_service_request_handler_counter`, …); the OpenMetrics
//! encoder adds `_total` to counters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

pub use crate::routes::Route;

mod outcomes;
use crate::routes::ROUTES;
pub use outcomes::Outcomes;

/// The span export's counters.
#[derive(Clone, Default)]
pub struct TraceCounters {
    /// Spans dropped because the queue was full.
    pub dropped: Counter,
    /// Spans lost because their export failed.
    pub failed: Counter,
    pub exported: Counter,
}

/// The status class label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    pub status: &'static str,
}

/// Broker traffic labels: which broker, and what happened.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BrokerLabel {
    pub broker: &'static str,
    pub outcome: &'static str,
}

/// The workflow a gauge counts for.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkflowLabel {
    pub workflow: String,
}

/// Where a status answer came from.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    pub source: &'static str,
}

/// What a schedule's fire did.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

/// Why a step's call is tried again.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabel {
    pub cause: &'static str,
}

const CLASSES: [&str; 4] = ["2xx", "4xx", "5xx", "other"];

fn class_idx(status: u16) -> usize {
    match status {
        200..=299 => 0,
        400..=499 => 1,
        500..=599 => 2,
        _ => 3,
    }
}

/// A histogram of plain atomics with fixed bucket bounds (prometheus-client's own takes a
/// lock per observation, which two runtimes would contend on for every request).
#[derive(Debug)]
pub struct AtomicHistogram {
    bounds: &'static [f64],
    counts: Box<[AtomicU64]>,
    count: AtomicU64,
    /// Sum in millionths of the unit, so it stays an integer atomic.
    sum_micros: AtomicU64,
}

/// Latency bucket bounds, in seconds: 50 µs … 10 s.
pub const LATENCY_BOUNDS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
];

/// Batch size bucket bounds, in rows.
pub const BATCH_BOUNDS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0,
];

/// Schedule fire lateness bucket bounds, in seconds: 10 ms … an hour (a catch-up after
/// an outage is as late as the outage was long).
pub const LATENESS_BOUNDS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0,
];

impl AtomicHistogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        AtomicHistogram {
            bounds,
            counts: (0..bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add((v * 1e6) as u64, Ordering::Relaxed);
    }

    pub fn observe_duration(&self, d: Duration) {
        self.observe(d.as_secs_f64());
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

impl TypedMetric for AtomicHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for AtomicHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        // The encoder accumulates per-bucket counts itself.
        let mut buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .zip(self.counts.iter())
            .map(|(&b, c)| (b, c.load(Ordering::Relaxed)))
            .collect();
        let count = self.count.load(Ordering::Relaxed);
        let in_bounds: u64 = buckets.iter().map(|(_, c)| c).sum();
        buckets.push((f64::MAX, count.saturating_sub(in_bounds)));
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// A gauge's source, read when the metrics are scraped.
type DepthProbe = Box<dyn Fn() -> usize + Send + Sync>;

/// Handles to every metric; shared by all runtimes.
pub struct Metrics {
    registry: Mutex<Registry>,
    /// `[route][status class]` request counters.
    requests: Vec<[Counter; 4]>,
    /// Per-route latency.
    latency: Vec<Arc<AtomicHistogram>>,
    pub batch_rows: Arc<AtomicHistogram>,
    pub commit_seconds: Arc<AtomicHistogram>,
    pub flush_errors: Counter,
    /// Creates answered 503 unsent: their time in the buffer ran out (`store::budget`).
    pub flush_expired: Counter,
    pub rows_written: Counter,
    pub rejected_overload: Counter,
    buffer_depth: Gauge,
    /// Each write buffer's depth, read at every scrape into `buffer_depth`.
    buffer_probes: Mutex<Vec<DepthProbe>>,
    pub completed: Counter,
    pub failed: Counter,
    pub cancelled: Counter,
    pub steps_executed: Counter,
    pub leases_claimed: Counter,
    pub leases_lost: Counter,
    /// ASYNC steps whose answer did not come within their `answerTimeout`.
    pub answer_timeouts: Counter,
    /// Requests whose deadline passed before they finished.
    pub deadlines_passed: Counter,
    /// Events delivered (`POST /events/{event}`), new ones (a redelivery is `events_duplicate`).
    pub events_received: Counter,
    pub events_duplicate: Counter,
    /// Requests resumed by a delivered event.
    pub events_resumed: Counter,
    /// Events that found no request waiting when delivered (kept for later ones).
    pub events_unmatched: Counter,
    /// Kept events taken by a request that reached its EVENT step after them.
    pub events_kept_taken: Counter,
    /// Kept events deleted a day after their window passed.
    pub events_expired: Counter,
    /// Finished service requests dropped by the retention policy (with their sets).
    pub retention_deleted: Counter,
    /// The request tables' partition sets: attached now, created, dropped.
    pub partitions: Gauge,
    pub partitions_created: Counter,
    pub partitions_dropped: Counter,
    /// Audit records and dead letters deleted past their age, and console sessions past
    /// their expiry.
    pub audit_deleted: Counter,
    pub dead_letters_deleted: Counter,
    pub sessions_expired: Counter,
    /// Console sign-ins refused: a token not accepted, and attempts past the per-address
    /// rate (answered 429 unlooked at). Counted, not written to the audit trail.
    pub sign_ins_refused: Counter,
    pub sign_ins_limited: Counter,
    /// Step responses consumed from brokers, by outcome.
    pub broker_replies: Family<BrokerLabel, Counter>,
    /// Step messages published to brokers, by outcome (sent, failed).
    pub broker_published: Family<BrokerLabel, Counter>,
    /// Step calls scheduled to be tried again, by the cause of the failed attempt.
    pub step_retries: Family<CauseLabel, Counter>,
    /// Steps that failed after using up their attempts.
    pub step_retries_exhausted: Counter,
    /// Requests set aside because the engine's own infrastructure (Postgres) failed
    /// transiently; they are continued later, here or elsewhere.
    pub requests_released: Counter,
    /// Step calls waiting for a free slot to their downstream host.
    pub downstream_waiting: Gauge,
    /// Step calls in flight to downstream hosts.
    pub downstream_in_flight: Gauge,
    /// Status reads answered from memory (0), from Postgres (1), or from the request row
    /// in Postgres and the step rows in memory (2).
    pub status_reads: [Counter; 3],
    /// Finished spans dropped because the export queue was full, lost because their
    /// export failed, and exported.
    pub trace_spans: TraceCounters,
    /// Schedule fires that started a request (0) and that the overlap policy skipped (1).
    pub schedule_fires: [Counter; 2],
    /// Seconds from a schedule's fire time to the pass that started its request.
    pub schedule_lateness: Arc<AtomicHistogram>,
    /// Seconds from a timer's time to the claim that took it (a WAIT's end, a retry's
    /// back-off, a delayed start).
    pub timer_lateness: Arc<AtomicHistogram>,
    /// Requests waiting on a clock, and how long the most overdue of them has been due
    /// (ms), counted when /metrics is read (`http::system`), at most once per period.
    pub timers_pending: Gauge,
    pub timers_overdue_ms: Gauge,
    /// Creates of a limited workflow that waited for a slot, those that waited for room in
    /// their key's rate window, and waiting requests admitted.
    pub slot_waits: Counter,
    pub rate_waits: Counter,
    pub slots_admitted: Counter,
    /// Requests waiting for a slot or a rate's room, by workflow, counted with the timers.
    pub slots_waiting: Family<WorkflowLabel, Gauge>,
    /// Requests parked by their workflow's pause, by paused workflow, counted with the
    /// timers.
    pub parked: Family<WorkflowLabel, Gauge>,
    /// Requests finished, by workflow and status, and their time from create to finish.
    pub outcomes: Arc<Outcomes>,
    /// Messages to triggers, by source (webhook, amqp, kafka) and outcome (in the order
    /// `ops::hooks` counts them).
    pub trigger_deliveries: [[Counter; 5]; 3],
    /// Notifications delivered (0), attempts that failed and will be tried again (1), and
    /// notifications failed for good (2).
    pub notifications: [Counter; 3],
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

/// A metric of `Metrics`, as the registration tables name it.
type Field<T> = fn(&Metrics) -> &T;

/// The engine's counters, as `/metrics` names and explains them.
const ENGINE_COUNTERS: &[(&str, &str, Field<Counter>)] = &[
    (
        "completed_service_request_handler_counter",
        "Service requests completed",
        |m| &m.completed,
    ),
    (
        "failed_service_request_handler_counter",
        "Service requests failed",
        |m| &m.failed,
    ),
    (
        "cancelled_service_request_handler_counter",
        "Service requests cancelled",
        |m| &m.cancelled,
    ),
    ("clamp_steps_executed", "Step attempts finished", |m| {
        &m.steps_executed
    }),
    (
        "clamp_leases_claimed",
        "Service requests claimed by this instance's sweeper",
        |m| &m.leases_claimed,
    ),
    (
        "clamp_leases_lost",
        "Writes refused because another instance holds the lease",
        |m| &m.leases_lost,
    ),
    (
        "clamp_answer_timeouts",
        "ASYNC steps timed out: no answer within their answerTimeout",
        |m| &m.answer_timeouts,
    ),
    (
        "clamp_request_deadlines_passed",
        "Requests ended by their deadline: the step they were at failed, its onFailure steps ran",
        |m| &m.deadlines_passed,
    ),
    (
        "clamp_events_received",
        "Events delivered, counted once by their id",
        |m| &m.events_received,
    ),
    (
        "clamp_events_duplicate",
        "Event deliveries whose id was delivered before",
        |m| &m.events_duplicate,
    ),
    (
        "clamp_events_resumed",
        "Requests resumed by a delivered event",
        |m| &m.events_resumed,
    ),
    (
        "clamp_events_unmatched",
        "Events that found no request waiting when delivered (kept)",
        |m| &m.events_unmatched,
    ),
    (
        "clamp_events_kept_taken",
        "Kept events taken by a request reaching its EVENT step later",
        |m| &m.events_kept_taken,
    ),
    (
        "clamp_events_expired",
        "Events deleted a day after their keep window passed (their ids no longer deduplicate)",
        |m| &m.events_expired,
    ),
    (
        "clamp_retention_deleted",
        "Finished service requests dropped by the retention policy, with their partition sets",
        |m| &m.retention_deleted,
    ),
    (
        "clamp_partitions_created",
        "Partition sets created ahead by this instance's keeper",
        |m| &m.partitions_created,
    ),
    (
        "clamp_partitions_dropped",
        "Partition sets dropped by this instance's keeper (retention)",
        |m| &m.partitions_dropped,
    ),
    (
        "clamp_audit_deleted",
        "Audit records deleted past --audit-retention-days",
        |m| &m.audit_deleted,
    ),
    (
        "clamp_dead_letters_deleted",
        "Dead-lettered messages deleted past --dead-letter-retention-days",
        |m| &m.dead_letters_deleted,
    ),
    (
        "clamp_console_sessions_expired",
        "Console sessions deleted past their idle or absolute expiry",
        |m| &m.sessions_expired,
    ),
    (
        "clamp_console_sign_ins_refused",
        "Console sign-ins refused: the token was not accepted",
        |m| &m.sign_ins_refused,
    ),
    (
        "clamp_console_sign_ins_limited",
        "Console sign-in attempts refused unlooked at: past the per-address rate",
        |m| &m.sign_ins_limited,
    ),
    (
        "clamp_step_retries_exhausted",
        "Steps that failed after using up their attempts",
        |m| &m.step_retries_exhausted,
    ),
    (
        "clamp_requests_released",
        "Requests set aside after a transient database error, to be continued later",
        |m| &m.requests_released,
    ),
    (
        "clamp_concurrency_waits",
        "Creates of a workflow with a concurrency limit that waited for a slot of their key",
        |m| &m.slot_waits,
    ),
    (
        "clamp_rate_limited_starts",
        "Creates of a workflow with a rate limit whose start waited for room in their \
             key's window",
        |m| &m.rate_waits,
    ),
    (
        "clamp_concurrency_admitted",
        "Requests admitted into a slot after waiting for it",
        |m| &m.slots_admitted,
    ),
];

/// The engine's gauges, as `/metrics` names and explains them.
const ENGINE_GAUGES: &[(&str, &str, Field<Gauge>)] = &[
    (
        "clamp_partitions",
        "Partition sets of the request tables attached (as the last keeper pass here saw them)",
        |m| &m.partitions,
    ),
    (
        "clamp_downstream_waiting",
        "Step calls waiting for a free slot to their downstream host",
        |m| &m.downstream_waiting,
    ),
    (
        "clamp_downstream_in_flight",
        "Step calls in flight to downstream hosts",
        |m| &m.downstream_in_flight,
    ),
    (
        "clamp_timers_pending",
        "Requests waiting on a clock: WAIT steps, retries' back-offs, delayed starts, \
             answer and event timeouts (counted when scraped, at most every 30 s)",
        |m| &m.timers_pending,
    ),
    (
        "clamp_timers_overdue_milliseconds",
        "How long the most overdue timer has been due without being taken (0: none; \
             counted with clamp_timers_pending)",
        |m| &m.timers_overdue_ms,
    ),
];

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let (requests, latency) = register_routes(&mut registry);
        let m = Metrics {
            // The families' counters the request path increments, label sets fixed.
            status_reads: labelled(
                &mut registry,
                "clamp_status_reads",
                STATUS_READS_HELP,
                ["memory", "database", "row"],
                |source| SourceLabel { source },
            ),
            schedule_fires: labelled(
                &mut registry,
                "clamp_schedule_fires",
                SCHEDULE_FIRES_HELP,
                ["started", "skipped"],
                |outcome| OutcomeLabel { outcome },
            ),
            trigger_deliveries: trigger_deliveries(&mut registry),
            notifications: notification_counters(&mut registry),
            schedule_lateness: Arc::new(AtomicHistogram::new(LATENESS_BOUNDS)),
            timer_lateness: Arc::new(AtomicHistogram::new(LATENESS_BOUNDS)),
            timers_pending: Gauge::default(),
            timers_overdue_ms: Gauge::default(),
            slot_waits: Counter::default(),
            rate_waits: Counter::default(),
            slots_admitted: Counter::default(),
            slots_waiting: Family::default(),
            parked: Family::default(),
            outcomes: Default::default(),
            requests,
            latency,
            batch_rows: Arc::new(AtomicHistogram::new(BATCH_BOUNDS)),
            commit_seconds: Arc::new(AtomicHistogram::new(LATENCY_BOUNDS)),
            flush_errors: Counter::default(),
            flush_expired: Counter::default(),
            rows_written: Counter::default(),
            rejected_overload: Counter::default(),
            buffer_depth: Gauge::default(),
            buffer_probes: Mutex::new(Vec::new()),
            completed: Counter::default(),
            failed: Counter::default(),
            cancelled: Counter::default(),
            steps_executed: Counter::default(),
            leases_claimed: Counter::default(),
            leases_lost: Counter::default(),
            answer_timeouts: Counter::default(),
            deadlines_passed: Counter::default(),
            events_received: Counter::default(),
            events_duplicate: Counter::default(),
            events_resumed: Counter::default(),
            events_unmatched: Counter::default(),
            events_kept_taken: Counter::default(),
            events_expired: Counter::default(),
            retention_deleted: Counter::default(),
            partitions: Gauge::default(),
            partitions_created: Counter::default(),
            partitions_dropped: Counter::default(),
            audit_deleted: Counter::default(),
            dead_letters_deleted: Counter::default(),
            sessions_expired: Counter::default(),
            sign_ins_refused: Counter::default(),
            sign_ins_limited: Counter::default(),
            broker_replies: Family::default(),
            broker_published: Family::default(),
            step_retries: Family::default(),
            step_retries_exhausted: Counter::default(),
            requests_released: Counter::default(),
            downstream_waiting: Gauge::default(),
            downstream_in_flight: Gauge::default(),
            trace_spans: TraceCounters::default(),
            registry: Mutex::new(Registry::default()),
        };
        m.register_histograms(&mut registry);
        m.register_write_path(&mut registry);
        m.register_engine(&mut registry);
        m.register_traces(&mut registry);
        *m.registry.lock() = registry;
        m
    }

    /// The histograms, each shared with the code that observes it.
    fn register_histograms(&self, registry: &mut Registry) {
        let histograms: [(&str, &str, &Arc<AtomicHistogram>); 4] = [
            (
                "clamp_write_batch_rows",
                "Rows per batch insert",
                &self.batch_rows,
            ),
            (
                "clamp_write_commit_seconds",
                "Seconds per batch insert including commit",
                &self.commit_seconds,
            ),
            (
                "clamp_schedule_fire_lateness_seconds",
                "Seconds from a schedule's fire time to the pass that started its request",
                &self.schedule_lateness,
            ),
            (
                "clamp_timer_fire_lateness_seconds",
                "Seconds from a timer's time (a WAIT step's end, a retry's back-off, a delayed \
                 start) to the claim that continued its request",
                &self.timer_lateness,
            ),
        ];
        for (name, help, h) in histograms {
            registry.register(name, help, ArcMetric(h.clone()));
        }
    }

    /// The span export's counters (zero while tracing is off).
    fn register_traces(&self, registry: &mut Registry) {
        registry.register(
            "clamp_trace_spans_dropped",
            "Finished spans dropped because the export queue was full",
            self.trace_spans.dropped.clone(),
        );
        registry.register(
            "clamp_trace_spans_failed",
            "Finished spans lost because their export to the OTLP endpoint failed",
            self.trace_spans.failed.clone(),
        );
        registry.register(
            "clamp_trace_spans_exported",
            "Finished spans exported to the OTLP endpoint",
            self.trace_spans.exported.clone(),
        );
    }

    /// The write buffer's and flusher's counters.
    fn register_write_path(&self, registry: &mut Registry) {
        registry.register(
            "clamp_write_flush_errors",
            "Batch inserts that failed",
            self.flush_errors.clone(),
        );
        registry.register(
            "clamp_write_expired",
            "Creates answered 503 without being sent: their flush timeout ran out while they waited for a batch",
            self.flush_expired.clone(),
        );
        registry.register(
            "clamp_write_rows",
            "Service-request rows committed",
            self.rows_written.clone(),
        );
        registry.register(
            "clamp_rejected_overload",
            "Requests answered 503 because the write buffer stayed full or the database was down",
            self.rejected_overload.clone(),
        );
        registry.register(
            "clamp_write_buffer_depth",
            "Rows waiting in the write buffers",
            self.buffer_depth.clone(),
        );
    }

    /// The executor's, the brokers', the keeper's and the downstream limits' metrics
    /// (`ENGINE_COUNTERS`, `ENGINE_GAUGES`, and the labelled families).
    fn register_engine(&self, registry: &mut Registry) {
        for (name, help, field) in ENGINE_COUNTERS {
            registry.register(*name, *help, field(self).clone());
        }
        for (name, help, field) in ENGINE_GAUGES {
            registry.register(*name, *help, field(self).clone());
        }
        registry.register(
            "clamp_broker_replies",
            "Step responses consumed from a broker, by broker and outcome \
             (resumed, duplicate, malformed, rejected, unavailable)",
            self.broker_replies.clone(),
        );
        registry.register(
            "clamp_broker_published",
            "Step messages published to a broker, by broker and outcome (sent, failed)",
            self.broker_published.clone(),
        );
        registry.register(
            "clamp_step_retries",
            "Step calls scheduled to be tried again, by the cause of the failed attempt \
             (connect, broken, timeout, queued, status, broker)",
            self.step_retries.clone(),
        );
        registry.register(
            "clamp_requests_finished",
            "Service requests finished, by workflow and final status (COMPLETED, FAILED, \
             CANCELLED)",
            outcomes::Finished(self.outcomes.clone()),
        );
        registry.register(
            "clamp_request_duration_seconds",
            "Seconds from a service request's create to its finish, by workflow",
            outcomes::Durations(self.outcomes.clone()),
        );
        registry.register(
            "clamp_concurrency_waiting",
            "Requests waiting for a concurrency slot or a rate's room, by workflow (counted with \
             clamp_timers_pending)",
            self.slots_waiting.clone(),
        );
        registry.register(
            "clamp_workflow_parked",
            "Requests waiting for their paused workflow's resume, by paused workflow \
             (counted with clamp_timers_pending)",
            self.parked.clone(),
        );
    }

    /// Counts one answered request and its latency.
    #[inline]
    pub fn record(&self, route: Route, status: u16, elapsed: Duration) {
        let r = route as usize;
        self.requests[r][class_idx(status)].inc();
        self.latency[r].observe_duration(elapsed);
    }

    /// Counts one consumed step response (label values are a fixed set).
    pub fn count_broker_reply(&self, broker: &'static str, outcome: &'static str) {
        self.broker_replies
            .get_or_create(&BrokerLabel { broker, outcome })
            .inc();
    }

    /// Counts one step message published (or not).
    pub fn count_broker_publish(&self, broker: &'static str, ok: bool) {
        let outcome = if ok { "sent" } else { "failed" };
        self.broker_published
            .get_or_create(&BrokerLabel { broker, outcome })
            .inc();
    }

    /// Counts one retry of a step's call (`cause` is one of a fixed set).
    pub fn count_retry(&self, cause: &'static str) {
        self.step_retries.get_or_create(&CauseLabel { cause }).inc();
    }

    /// Adds a write buffer to the depth gauge (`depth` is read at every scrape).
    pub fn watch_buffer(&self, depth: impl Fn() -> usize + Send + Sync + 'static) {
        self.buffer_probes.lock().push(Box::new(depth));
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let depth: usize = self.buffer_probes.lock().iter().map(|d| d()).sum();
        self.buffer_depth.set(depth as i64);
        let mut out = String::with_capacity(16 * 1024);
        let registry = self.registry.lock();
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// Lets an `Arc`'d metric be registered while the server keeps a handle to it.
#[derive(Debug)]
struct ArcMetric<M>(Arc<M>);

impl<M: EncodeMetric> EncodeMetric for ArcMetric<M> {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }
    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
}

const STATUS_READS_HELP: &str = "Status reads (GET /serviceRequest/{id}) answered from \
     memory, from Postgres, or from the request row in Postgres and the step rows in memory (row)";
const SCHEDULE_FIRES_HELP: &str = "Schedule fires, by outcome: started a service request, or \
     skipped because the schedule's previous run had not finished (overlap: skip)";

/// A counter family registered as `name`, and the counter of each of `values` (the
/// label sets the request path increments, made once here).
fn labelled<L, const N: usize>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    values: [&'static str; N],
    label: impl Fn(&'static str) -> L,
) -> [Counter; N]
where
    L: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
{
    let family = Family::<L, Counter>::default();
    let counters = values.map(|v| family.get_or_create(&label(v)).clone());
    registry.register(name, help, family);
    counters
}

/// A trigger's message's source and what it did.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceOutcomeLabel {
    source: &'static str,
    outcome: &'static str,
}

/// `clamp_notifications_total{outcome}`: delivered, retried, failed.
fn notification_counters(registry: &mut Registry) -> [Counter; 3] {
    labelled(
        registry,
        "clamp_notifications",
        "Notifications of finished requests, by outcome: delivered to every target, an \
         attempt that failed (tried again), failed for good (kept as a dead letter)",
        ["delivered", "retried", "failed"],
        |outcome| OutcomeLabel { outcome },
    )
}

/// `clamp_trigger_deliveries_total{source, outcome}`: the counters of each source.
fn trigger_deliveries(registry: &mut Registry) -> [[Counter; 5]; 3] {
    let family = Family::<SourceOutcomeLabel, Counter>::default();
    let counters = ["webhook", "amqp", "kafka"].map(|source| {
        [
            "started",
            "duplicate",
            "filtered",
            "dead_lettered",
            "refused",
        ]
        .map(|outcome| {
            family
                .get_or_create(&SourceOutcomeLabel { source, outcome })
                .clone()
        })
    });
    registry.register(
        "clamp_trigger_deliveries",
        "Messages to triggers, by source (webhook, amqp, kafka) and outcome: started a request, a \
         redelivery of one that did (duplicate), filtered out by when, kept as a dead letter, \
         refused (a webhook signature that did not verify)",
        family,
    );
    counters
}

/// Per route: a counter by status class and a latency histogram, registered under Clamp's
/// metric names; returns the handles the request path uses, in `Route` order.
fn register_routes(
    registry: &mut Registry,
) -> (Vec<[Counter; CLASSES.len()]>, Vec<Arc<AtomicHistogram>>) {
    let mut requests = Vec::new();
    let mut latency = Vec::new();
    for route in ROUTES.iter().map(|d| d.route) {
        let family = Family::<StatusLabel, Counter>::default();
        let handles = CLASSES.map(|status| family.get_or_create(&StatusLabel { status }).clone());
        registry.register(
            format!("{}_counter", route.metric_prefix()),
            format!("Requests answered by {:?}, by status class", route),
            family,
        );
        requests.push(handles);
        let h = Arc::new(AtomicHistogram::new(LATENCY_BOUNDS));
        registry.register(
            format!("{}_histogram", route.metric_prefix()),
            format!("Seconds to answer {:?}", route),
            ArcMetric(h.clone()),
        );
        latency.push(h);
    }
    (requests, latency)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = AtomicHistogram::new(&[1.0, 2.0, 5.0]);
        for v in [0.5, 1.5, 1.7, 4.0, 9.0] {
            h.observe(v);
        }
        let m = Metrics::new();
        m.record(Route::Health, 200, Duration::from_millis(2));
        m.record(Route::Health, 503, Duration::from_millis(2));
        let text = m.encode();
        assert!(
            text.contains("health_handler_counter_total{status=\"2xx\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("health_handler_counter_total{status=\"5xx\"} 1"),
            "{text}"
        );
        assert!(text.contains("health_handler_histogram_count 2"), "{text}");
        assert_eq!(h.count(), 5);
        let mut s = String::new();
        let mut r = Registry::default();
        r.register("h", "h", ArcMetric(Arc::new(h)));
        prometheus_client::encoding::text::encode(&mut s, &r).unwrap();
        assert!(s.contains("h_bucket{le=\"1.0\"} 1"), "{s}");
        assert!(s.contains("h_bucket{le=\"2.0\"} 3"), "{s}");
        assert!(s.contains("h_bucket{le=\"5.0\"} 4"), "{s}");
        assert!(s.contains("h_count 5"), "{s}");
    }
}

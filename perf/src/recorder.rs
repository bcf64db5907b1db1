//! What a run measures: per-shard counters and histograms, merged at the end,
//! plus the few lock-free counters the progress bar reads while running.

use crate::histogram::Hist;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Why an operation failed; the report key is `ErrorKind::key`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A non-2xx answer (or an unexpected one, such as 200 where 404 was due).
    Status(u16),
    /// No answer within `--timeout` (connect or request).
    Timeout,
    /// The TCP connection or HTTP handshake could not be made.
    Connect,
    /// The connection broke mid-exchange.
    Io,
    /// A 2xx answer whose body did not parse as expected.
    BadResponse,
    /// e2e: the workflow ended FAILED.
    WorkflowFailed,
    /// e2e: the workflow did not finish within `--workflow-timeout`.
    WorkflowTimeout,
}

impl ErrorKind {
    pub fn key(&self) -> String {
        match self {
            Self::Status(code) => format!("status_{code}"),
            Self::Timeout => "timeout".into(),
            Self::Connect => "connect".into(),
            Self::Io => "io".into(),
            Self::BadResponse => "bad_response".into(),
            Self::WorkflowFailed => "workflow_failed".into(),
            Self::WorkflowTimeout => "workflow_timeout".into(),
        }
    }
}

/// e2e: how a workflow ended, as seen by the last poll.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Finished {
    pub completed: bool,
    /// total_time_in_ms minus the steps' time_taken, when reported.
    pub overhead_ms: Option<i64>,
}

/// The result of one operation (one request, or one e2e workflow run).
#[derive(Clone, Copy, Debug)]
pub struct Op {
    pub outcome: Result<(), ErrorKind>,
    pub http_requests: u32,
    pub read: bool,
    pub created: bool,
    pub finished: Option<Finished>,
}

impl Op {
    pub fn new(outcome: Result<(), ErrorKind>) -> Self {
        Self {
            outcome,
            http_requests: 1,
            read: false,
            created: false,
            finished: None,
        }
    }
}

/// Counters of one shard (one worker thread); merged after the run.
#[derive(Debug, Default)]
pub struct Recorder {
    pub latency: Hist,
    pub requests: u64,
    pub ok: u64,
    pub http_requests: u64,
    pub errors: HashMap<ErrorKind, u64>,
    pub per_second: Vec<u64>,
    pub reads: u64,
    pub created: u64,
    pub completed: u64,
    pub failed: u64,
    pub overhead_ms: Hist,
    pub negative_overhead: u64,
}

impl Recorder {
    pub fn new(seconds: usize) -> Self {
        Self {
            per_second: vec![0; seconds],
            ..Self::default()
        }
    }

    /// Records an operation that was due inside the measurement window;
    /// `finished_at` is its completion time relative to the window start.
    pub fn record(&mut self, op: &Op, latency: Duration, finished_at: Duration) {
        self.requests += 1;
        self.http_requests += u64::from(op.http_requests);
        self.reads += u64::from(op.read);
        self.created += u64::from(op.created);
        match op.outcome {
            Ok(()) => {
                self.ok += 1;
                self.latency.record_duration_us(latency);
                // Completions after the window (the drain) are not plotted.
                if let Some(slot) = self.per_second.get_mut(finished_at.as_secs() as usize) {
                    *slot += 1;
                }
            }
            Err(kind) => *self.errors.entry(kind).or_default() += 1,
        }
        if let Some(f) = op.finished {
            if f.completed {
                self.completed += 1;
            } else {
                self.failed += 1;
            }
            if let Some(ms) = f.overhead_ms {
                if ms < 0 {
                    self.negative_overhead += 1;
                }
                self.overhead_ms.record(ms.max(0) as u64);
            }
        }
    }

    pub fn merge(&mut self, o: &Recorder) {
        self.latency.merge(&o.latency);
        self.requests += o.requests;
        self.ok += o.ok;
        self.http_requests += o.http_requests;
        for (k, v) in &o.errors {
            *self.errors.entry(*k).or_default() += v;
        }
        if self.per_second.len() < o.per_second.len() {
            self.per_second.resize(o.per_second.len(), 0);
        }
        for (a, b) in self.per_second.iter_mut().zip(&o.per_second) {
            *a += b;
        }
        self.reads += o.reads;
        self.created += o.created;
        self.completed += o.completed;
        self.failed += o.failed;
        self.overhead_ms.merge(&o.overhead_ms);
        self.negative_overhead += o.negative_overhead;
    }

    pub fn error_total(&self) -> u64 {
        self.errors.values().sum()
    }

    pub fn errors_by_key(&self) -> BTreeMap<String, u64> {
        self.errors.iter().map(|(k, v)| (k.key(), *v)).collect()
    }
}

/// Live totals for the progress bar, counted including warm-up.
#[derive(Debug, Default)]
pub struct Live {
    pub done: AtomicU64,
    pub errors: AtomicU64,
}

impl Live {
    pub fn count(&self, op: &Op) {
        self.done.fetch_add(1, Ordering::Relaxed);
        if op.outcome.is_err() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_ok_errors_and_seconds() {
        let mut r = Recorder::new(3);
        let ok = Op::new(Ok(()));
        r.record(&ok, Duration::from_micros(500), Duration::from_millis(100));
        r.record(&ok, Duration::from_micros(700), Duration::from_millis(2500));
        r.record(&ok, Duration::from_micros(700), Duration::from_secs(9));
        r.record(
            &Op::new(Err(ErrorKind::Status(503))),
            Duration::ZERO,
            Duration::ZERO,
        );
        assert_eq!((r.requests, r.ok, r.error_total()), (4, 3, 1));
        assert_eq!(r.per_second, vec![1, 0, 1]);
        assert_eq!(r.errors_by_key()["status_503"], 1);
        assert_eq!(r.latency.count(), 3);
    }

    #[test]
    fn merge_sums_everything() {
        let mut a = Recorder::new(2);
        let mut b = Recorder::new(2);
        let mut op = Op::new(Ok(()));
        op.finished = Some(Finished {
            completed: true,
            overhead_ms: Some(-1),
        });
        a.record(&op, Duration::from_micros(10), Duration::ZERO);
        b.record(&op, Duration::from_micros(10), Duration::from_secs(1));
        b.record(
            &Op::new(Err(ErrorKind::Timeout)),
            Duration::ZERO,
            Duration::ZERO,
        );
        a.merge(&b);
        assert_eq!((a.requests, a.ok, a.completed), (3, 2, 2));
        assert_eq!(a.per_second, vec![1, 1]);
        assert_eq!(a.negative_overhead, 2);
        assert_eq!(a.errors_by_key()["timeout"], 1);
    }
}

//! Requests finished, by workflow and final status, and their time from create to
//! finish: the numbers a dashboard's first panel shows (beyond Clamp, whose counters have
//! no workflow). Workflow names come from definitions, never from a request, and at most
//! `MAX_WORKFLOWS` get series of their own; any past that count as `OTHER`.
//!
//! A finish takes a read lock and one map lookup by name (no allocation); the first
//! finish of a workflow adds its entry under the write lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::RwLock;
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

use super::AtomicHistogram;
use crate::status::RequestStatus;

/// Workflows with series of their own.
pub const MAX_WORKFLOWS: usize = 500;
/// The workflow label of every workflow past `MAX_WORKFLOWS`.
pub const OTHER: &str = "_other";
/// The final statuses counted, in their counters' order.
const FINAL: [RequestStatus; 3] = [
    RequestStatus::Completed,
    RequestStatus::Failed,
    RequestStatus::Cancelled,
];

/// Seconds from create to finish: 10 ms … a day.
pub const DURATION_BOUNDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
    21600.0, 86400.0,
];

/// One workflow's counts.
struct Counts {
    finished: [AtomicU64; 3],
    duration: AtomicHistogram,
}

/// Every workflow's counts.
#[derive(Default)]
pub struct Outcomes {
    by_workflow: RwLock<HashMap<Box<str>, Arc<Counts>>>,
}

// Owned: the derive takes no lifetimes, and these are made at a scrape only.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FinishedLabels {
    workflow: String,
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkflowLabels {
    workflow: String,
}

impl Outcomes {
    /// Counts a request of `workflow` that reached final `status`, created at `created_us`
    /// (µs since the epoch; None: not known here, counted without a duration).
    pub fn finished(&self, workflow: &str, status: RequestStatus, created_us: Option<i64>) {
        let Some(i) = FINAL.iter().position(|s| *s == status) else {
            return;
        };
        let counts = self.counts(workflow);
        counts.finished[i].fetch_add(1, Ordering::Relaxed);
        if let Some(us) = created_us.filter(|us| *us > 0) {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as i64);
            counts
                .duration
                .observe(now.saturating_sub(us).max(0) as f64 / 1e6);
        }
    }

    fn counts(&self, workflow: &str) -> Arc<Counts> {
        if let Some(c) = self.by_workflow.read().get(workflow) {
            return c.clone();
        }
        let mut all = self.by_workflow.write();
        let name = if all.len() >= MAX_WORKFLOWS && !all.contains_key(workflow) {
            OTHER
        } else {
            workflow
        };
        all.entry(name.into())
            .or_insert_with(|| {
                Arc::new(Counts {
                    finished: Default::default(),
                    duration: AtomicHistogram::new(DURATION_BOUNDS),
                })
            })
            .clone()
    }

    /// The workflows, sorted, with their counts (a scrape's consistent order).
    fn sorted(&self) -> Vec<(Box<str>, Arc<Counts>)> {
        let mut all: Vec<_> = self
            .by_workflow
            .read()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }
}

/// `clamp_requests_finished_total{workflow, status}`.
#[derive(Debug)]
pub struct Finished(pub Arc<Outcomes>);

/// `clamp_request_duration_seconds{workflow}`.
#[derive(Debug)]
pub struct Durations(pub Arc<Outcomes>);

impl std::fmt::Debug for Outcomes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Outcomes")
    }
}

impl EncodeMetric for Finished {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (workflow, counts) in self.0.sorted() {
            for (i, status) in FINAL.iter().enumerate() {
                let labels = FinishedLabels {
                    workflow: workflow.to_string(),
                    status: status.as_str(),
                };
                let n = counts.finished[i].load(Ordering::Relaxed);
                encoder
                    .encode_family(&labels)?
                    .encode_counter::<NoLabelSet, _, u64>(&n, None)?;
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

impl EncodeMetric for Durations {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (workflow, counts) in self.0.sorted() {
            let labels = WorkflowLabels {
                workflow: workflow.to_string(),
            };
            counts.duration.encode(encoder.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposed(o: &Arc<Outcomes>) -> String {
        let mut r = prometheus_client::registry::Registry::default();
        r.register("clamp_requests_finished", "finished", Finished(o.clone()));
        r.register(
            "clamp_request_duration_seconds",
            "duration",
            Durations(o.clone()),
        );
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
        out
    }

    #[test]
    fn finishes_are_counted_by_workflow_and_status_with_their_duration() {
        let o = Arc::new(Outcomes::default());
        let now_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros() as i64;
        o.finished("orders", RequestStatus::Completed, Some(now_us - 2_000_000));
        o.finished("orders", RequestStatus::Completed, Some(now_us));
        o.finished("orders", RequestStatus::Failed, None);
        o.finished("orders", RequestStatus::InProgress, Some(now_us));
        let text = exposed(&o);
        assert!(
            text.contains(
                r#"clamp_requests_finished_total{workflow="orders",status="COMPLETED"} 2"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"clamp_requests_finished_total{workflow="orders",status="FAILED"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"clamp_requests_finished_total{workflow="orders",status="CANCELLED"} 0"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"clamp_request_duration_seconds_count{workflow="orders"} 2"#),
            "{text}"
        );
        // One took about 2 s: below the 2.5 s bound, above the 1 s one.
        assert!(
            text.contains(r#"clamp_request_duration_seconds_bucket{le="1.0",workflow="orders"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"clamp_request_duration_seconds_bucket{le="2.5",workflow="orders"} 2"#),
            "{text}"
        );
    }

    #[test]
    fn workflows_past_the_bound_share_one_series() {
        let o = Arc::new(Outcomes::default());
        for i in 0..MAX_WORKFLOWS + 10 {
            o.finished(&format!("w{i}"), RequestStatus::Completed, None);
        }
        // One counted before the bound keeps its own.
        o.finished("w0", RequestStatus::Completed, None);
        let text = exposed(&o);
        assert!(
            text.contains(r#"{workflow="_other",status="COMPLETED"} 10"#),
            "{text}"
        );
        assert!(text.contains(r#"{workflow="w0",status="COMPLETED"} 2"#));
        assert_eq!(o.by_workflow.read().len(), MAX_WORKFLOWS + 1);
    }
}

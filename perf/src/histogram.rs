//! HDR histogram wrapper and the percentile summary reported for a run.

use hdrhistogram::Histogram;
use serde::Serialize;
use std::time::Duration;

/// Highest value tracked: one hour in microseconds. Larger samples are
/// clamped rather than dropped so that they still count toward the tail.
const MAX_VALUE: u64 = 3_600_000_000;

/// Percentiles of one histogram, in the histogram's unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
    pub mean: f64,
}

/// A histogram of non-negative integer samples (microseconds for latency,
/// milliseconds for orchestration overhead), 3 significant digits.
#[derive(Clone, Debug)]
pub struct Hist(Histogram<u64>);

impl Default for Hist {
    fn default() -> Self {
        Self::new()
    }
}

impl Hist {
    pub fn new() -> Self {
        Self(Histogram::new_with_bounds(1, MAX_VALUE, 3).expect("static histogram bounds"))
    }

    pub fn record(&mut self, value: u64) {
        self.0.saturating_record(value.min(MAX_VALUE));
    }

    pub fn record_duration_us(&mut self, d: Duration) {
        self.record(u64::try_from(d.as_micros()).unwrap_or(MAX_VALUE));
    }

    pub fn merge(&mut self, other: &Hist) {
        // Same bounds on both sides, so adding cannot fail.
        self.0.add(&other.0).expect("histograms share bounds");
    }

    pub fn count(&self) -> u64 {
        self.0.len()
    }

    pub fn summary(&self) -> Summary {
        if self.0.is_empty() {
            return Summary::default();
        }
        Summary {
            p50: self.0.value_at_quantile(0.50),
            p90: self.0.value_at_quantile(0.90),
            p99: self.0.value_at_quantile(0.99),
            p999: self.0.value_at_quantile(0.999),
            max: self.0.max(),
            mean: self.0.mean(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HDR keeps 3 significant digits, so values are exact to 0.1%.
    fn close(actual: u64, expected: u64) -> bool {
        actual.abs_diff(expected) * 1000 <= expected
    }

    #[test]
    fn uniform_percentiles() {
        let mut h = Hist::new();
        for v in 1..=10_000 {
            h.record(v);
        }
        let s = h.summary();
        assert!(close(s.p50, 5_000), "{s:?}");
        assert!(close(s.p90, 9_000), "{s:?}");
        assert!(close(s.p99, 9_900), "{s:?}");
        assert!(close(s.p999, 9_990), "{s:?}");
        assert!(close(s.max, 10_000), "{s:?}");
        assert!((s.mean - 5_000.5).abs() < 10.0, "{s:?}");
    }

    #[test]
    fn tail_outlier_shows_only_in_top_percentiles() {
        let mut h = Hist::new();
        for _ in 0..999 {
            h.record(100);
        }
        h.record(50_000);
        let s = h.summary();
        assert_eq!(s.p50, 100);
        assert_eq!(s.p99, 100);
        assert!(close(s.max, 50_000));
    }

    #[test]
    fn merge_adds_counts() {
        let mut a = Hist::new();
        let mut b = Hist::new();
        a.record_duration_us(Duration::from_millis(1));
        b.record_duration_us(Duration::from_millis(3));
        a.merge(&b);
        assert_eq!(a.count(), 2);
        assert!(close(a.summary().max, 3_000));
    }

    #[test]
    fn empty_and_oversized() {
        assert_eq!(Hist::new().summary(), Summary::default());
        let mut h = Hist::new();
        h.record(u64::MAX);
        h.record(0);
        assert_eq!(h.count(), 2);
        assert!(close(h.summary().max, MAX_VALUE));
    }
}

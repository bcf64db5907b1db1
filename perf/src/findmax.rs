//! `--find-max`: the search for the highest sustainable rate, written as a
//! pure state machine fed with step results so it can be tested offline.
//!
//! The offered rate grows geometrically while steps pass; after the first
//! failure (or, if the very first step fails, after stepping down until one
//! passes) it bisects between the best passing and the lowest failing rate
//! until they are within `precision` of each other.

use serde::Serialize;

#[derive(Clone, Copy, Debug)]
pub struct SearchConfig {
    pub start_rate: f64,
    /// Multiplier between geometric steps (> 1).
    pub factor: f64,
    /// Stop bisecting when (fail - pass) / pass is at most this.
    pub precision: f64,
    /// Achieved may fall short of offered by at most this fraction.
    pub tolerance: f64,
    pub slo_p99_us: u64,
    pub max_steps: usize,
    /// Give up stepping down below this rate.
    pub min_rate: f64,
}

/// What one step at a fixed offered rate measured.
#[derive(Clone, Copy, Debug)]
pub struct StepResult {
    pub offered_rate: f64,
    pub achieved_rate: f64,
    pub errors: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
}

/// A judged step, as printed and written to the JSON report.
#[derive(Clone, Debug, Serialize)]
pub struct Step {
    pub offered_rate: f64,
    pub achieved_rate: f64,
    pub errors: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub pass: bool,
    /// Why the step failed; empty when it passed.
    pub reason: String,
}

#[derive(Debug)]
pub struct FindMax {
    cfg: SearchConfig,
    best_pass: Option<f64>,
    lowest_fail: Option<f64>,
    next: Option<f64>,
    steps: Vec<Step>,
}

impl FindMax {
    pub fn new(cfg: SearchConfig) -> Self {
        assert!(cfg.factor > 1.0, "step factor must exceed 1");
        assert!(cfg.start_rate > 0.0, "start rate must be positive");
        Self {
            cfg,
            best_pass: None,
            lowest_fail: None,
            next: Some(cfg.start_rate),
            steps: Vec::new(),
        }
    }

    /// Rate of the next step to run, or `None` when the search is over.
    pub fn next_rate(&self) -> Option<f64> {
        self.next
    }

    /// Highest rate that passed so far.
    pub fn max_rate(&self) -> Option<f64> {
        self.best_pass
    }

    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// Judges a step against the pass criteria; the reason lists every
    /// criterion missed so a report explains itself.
    pub fn judge(&self, r: &StepResult) -> (bool, String) {
        let mut reasons = Vec::new();
        if r.achieved_rate < r.offered_rate * (1.0 - self.cfg.tolerance) {
            let pct = 100.0 * r.achieved_rate / r.offered_rate;
            reasons.push(format!("achieved {pct:.1}% of offered"));
        }
        if r.errors > 0 {
            reasons.push(format!("{} errors", r.errors));
        }
        if r.p99_us > self.cfg.slo_p99_us {
            reasons.push(format!(
                "p99 {:.2}ms > {:.2}ms",
                r.p99_us as f64 / 1e3,
                self.cfg.slo_p99_us as f64 / 1e3
            ));
        }
        (reasons.is_empty(), reasons.join(", "))
    }

    /// Records a step's result and decides the next rate.
    pub fn record(&mut self, r: StepResult) -> &Step {
        let (pass, reason) = self.judge(&r);
        let rate = r.offered_rate;
        if pass {
            self.best_pass = Some(self.best_pass.map_or(rate, |b| b.max(rate)));
        } else {
            self.lowest_fail = Some(self.lowest_fail.map_or(rate, |f| f.min(rate)));
        }
        self.steps.push(Step {
            offered_rate: rate,
            achieved_rate: r.achieved_rate,
            errors: r.errors,
            p50_us: r.p50_us,
            p99_us: r.p99_us,
            p999_us: r.p999_us,
            pass,
            reason,
        });
        self.next = self.decide();
        self.steps.last().expect("just pushed")
    }

    fn decide(&self) -> Option<f64> {
        if self.steps.len() >= self.cfg.max_steps {
            return None;
        }
        let c = &self.cfg;
        match (self.best_pass, self.lowest_fail) {
            (Some(pass), None) => Some(pass * c.factor),
            (None, Some(fail)) => Some(fail / c.factor).filter(|r| *r >= c.min_rate),
            (Some(pass), Some(fail)) if fail <= pass => None,
            (Some(pass), Some(fail)) => {
                Some((pass + fail) / 2.0).filter(|_| (fail - pass) / pass > c.precision)
            }
            (None, None) => Some(c.start_rate),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> SearchConfig {
        SearchConfig {
            start_rate: 1000.0,
            factor: 2.0,
            precision: 0.05,
            tolerance: 0.03,
            slo_p99_us: 10_000,
            max_steps: 30,
            min_rate: 10.0,
        }
    }

    /// A server that keeps up perfectly up to `capacity` req/s and then
    /// saturates: achieved stays at capacity and latency explodes.
    fn simulated(offered: f64, capacity: f64) -> StepResult {
        let ok = offered <= capacity;
        StepResult {
            offered_rate: offered,
            achieved_rate: offered.min(capacity),
            errors: 0,
            p50_us: if ok { 300 } else { 80_000 },
            p99_us: if ok { 2_000 } else { 400_000 },
            p999_us: if ok { 4_000 } else { 900_000 },
        }
    }

    fn search(capacity: f64, cfg: SearchConfig) -> FindMax {
        let mut fm = FindMax::new(cfg);
        while let Some(rate) = fm.next_rate() {
            fm.record(simulated(rate, capacity));
        }
        fm
    }

    #[test]
    fn converges_below_capacity_within_precision() {
        let fm = search(12_345.0, cfg());
        let max = fm.max_rate().unwrap();
        assert!((12_345.0 / 1.05..=12_345.0).contains(&max), "{max}");
        assert!(fm.steps().len() < 15, "{}", fm.steps().len());
        // geometric phase first
        let rates: Vec<f64> = fm.steps().iter().map(|s| s.offered_rate).collect();
        assert_eq!(&rates[..5], &[1000.0, 2000.0, 4000.0, 8000.0, 16000.0]);
    }

    #[test]
    fn steps_down_when_first_step_fails() {
        let fm = search(300.0, cfg());
        let max = fm.max_rate().unwrap();
        assert!((300.0 / 1.05..=300.0).contains(&max), "{max}");
        assert!(!fm.steps()[0].pass);
    }

    #[test]
    fn gives_up_when_nothing_passes() {
        let fm = search(1.0, cfg());
        assert_eq!(fm.max_rate(), None);
        assert!(fm.steps().iter().all(|s| !s.pass));
        assert!(fm.steps().last().unwrap().offered_rate >= 10.0);
    }

    #[test]
    fn respects_max_steps() {
        let fm = search(
            1e12,
            SearchConfig {
                max_steps: 4,
                ..cfg()
            },
        );
        assert_eq!(fm.steps().len(), 4);
        assert_eq!(fm.max_rate(), Some(8000.0));
    }

    #[test]
    fn judge_explains_each_failure() {
        let fm = FindMax::new(cfg());
        let r = StepResult {
            offered_rate: 1000.0,
            achieved_rate: 900.0,
            errors: 3,
            p50_us: 1,
            p99_us: 12_000,
            p999_us: 20_000,
        };
        let (pass, why) = fm.judge(&r);
        assert!(!pass);
        assert!(why.contains("achieved 90.0%"), "{why}");
        assert!(why.contains("3 errors"), "{why}");
        assert!(why.contains("p99 12.00ms > 10.00ms"), "{why}");
        let ok = StepResult {
            achieved_rate: 980.0,
            errors: 0,
            p99_us: 9_000,
            ..r
        };
        assert_eq!(fm.judge(&ok), (true, String::new()));
    }
}

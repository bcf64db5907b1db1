//! Progress bar on stderr for long runs; hidden when stderr is not a
//! terminal so scripts and CI logs stay clean.

use crate::recorder::Live;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Runs shorter than this finish before a bar would tell anyone anything.
const MIN_RUN_FOR_BAR: Duration = Duration::from_secs(3);

pub struct Progress {
    bar: ProgressBar,
    start: Instant,
    measure: Instant,
    end: Instant,
    last: (Instant, u64),
}

impl Progress {
    pub fn new(enabled: bool, label: &str, start: Instant, measure: Instant, end: Instant) -> Self {
        let total = end.saturating_duration_since(start);
        let shown = enabled && total >= MIN_RUN_FOR_BAR && std::io::stderr().is_terminal();
        let bar = if shown {
            let bar =
                ProgressBar::with_draw_target(Some(total.as_secs()), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template("{prefix} [{bar:30}] {pos:>3}/{len}s {msg}")
                .expect("static template")
                .progress_chars("=> ");
            bar.set_style(style);
            bar.set_prefix(label.to_string());
            bar
        } else {
            ProgressBar::hidden()
        };
        Self {
            bar,
            start,
            measure,
            end,
            last: (Instant::now(), 0),
        }
    }

    /// Updates position and the current rate (since the previous tick).
    pub fn tick(&mut self, live: &Live) {
        if self.bar.is_hidden() {
            return;
        }
        let now = Instant::now();
        let done = live.done.load(Ordering::Relaxed);
        let errors = live.errors.load(Ordering::Relaxed);
        let dt = now.duration_since(self.last.0).as_secs_f64();
        let rate = if dt > 0.0 {
            (done - self.last.1) as f64 / dt
        } else {
            0.0
        };
        self.last = (now, done);
        let phase = if now < self.measure {
            "warm-up"
        } else if now < self.end {
            "measuring"
        } else {
            "draining"
        };
        self.bar
            .set_position(now.saturating_duration_since(self.start).as_secs());
        self.bar
            .set_message(format!("{phase} {rate:>9.0} ops/s  {errors} errors"));
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

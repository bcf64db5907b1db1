//! When the next batch of creates may leave for Postgres: group commit, with one batch in
//! flight at a time and the next filling behind it, and a further batch only to relieve
//! one that is slower than usual.
//!
//! Why not simply several batches in flight: every statement costs Postgres about as much
//! as dozens of rows (its plan, the indexes it opens, its commit), and under load the
//! rows a thread has in hand are a crowd that concurrent batches split between them, so
//! two in flight at all times make twice the statements of half the size. Against that
//! (`perf/runs/2026-12-03-vm/create-flights-ab.md`, API-only, ten alternating rounds):
//! server + Postgres CPU per create 38.4 against 42.2 µs, creates/s 1.05x. One in flight
//! alone would let one slow statement (a batch waiting on a lock, a connection gone
//! quiet) hold up every create of its thread, which is what a second one is for: it
//! leaves once the batch in flight has taken longer than `STALL_FACTOR` times the recent
//! average (and at least `MIN_STALL`); an ordinary commit at saturation stays below it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// A batch in flight counts as stalled after this many times the recent average commit.
const STALL_FACTOR: u32 = 4;

/// ... and never before this: below it a commit is as quick as any, and a second batch
/// would only split the rows.
const MIN_STALL: Duration = Duration::from_millis(10);

/// Weight of the newest commit in the running average, as 1/2^`EWMA_SHIFT`.
const EWMA_SHIFT: u32 = 3;

/// The batches of one flusher in flight.
pub struct Flights {
    epoch: Instant,
    in_flight: AtomicUsize,
    /// When the youngest batch in flight left, in microseconds since `epoch`.
    youngest_us: AtomicU64,
    /// Running average of a batch's time in flight, in microseconds.
    average_us: AtomicU64,
    landed: Notify,
}

impl Default for Flights {
    fn default() -> Self {
        Flights {
            epoch: Instant::now(),
            in_flight: AtomicUsize::new(0),
            youngest_us: AtomicU64::new(0),
            average_us: AtomicU64::new(0),
            landed: Notify::new(),
        }
    }
}

impl Flights {
    /// Waits until another batch may leave: at once when none is in flight, else when
    /// those in flight landed or the youngest of them is stalled.
    pub async fn clearance(&self) {
        loop {
            let landed = self.landed.notified();
            tokio::pin!(landed);
            // Registered before the state is read, so a landing in between is not missed.
            landed.as_mut().enable();
            if self.in_flight.load(Ordering::Acquire) == 0 {
                return;
            }
            let stalled_at = self.epoch
                + Duration::from_micros(self.youngest_us.load(Ordering::Acquire))
                + self.stall_after();
            if Instant::now() >= stalled_at {
                return;
            }
            tokio::select! {
                _ = &mut landed => {}
                _ = tokio::time::sleep_until(stalled_at) => {}
            }
        }
    }

    /// A batch leaves now.
    pub fn depart(&self) -> Instant {
        let now = Instant::now();
        self.youngest_us
            .store((now - self.epoch).as_micros() as u64, Ordering::Release);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        now
    }

    /// The batch that left at `departed` is done (committed or not).
    pub fn land(&self, departed: Instant) {
        let took = departed.elapsed().as_micros() as u64;
        let avg = self.average_us.load(Ordering::Relaxed);
        let next = if avg == 0 {
            took
        } else {
            avg - (avg >> EWMA_SHIFT) + (took >> EWMA_SHIFT)
        };
        self.average_us.store(next, Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.landed.notify_waiters();
    }

    /// How long a batch may be in flight before another leaves beside it.
    fn stall_after(&self) -> Duration {
        let avg = Duration::from_micros(self.average_us.load(Ordering::Relaxed));
        (avg * STALL_FACTOR).max(MIN_STALL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn none_in_flight_clears_at_once() {
        let f = Flights::default();
        let t0 = Instant::now();
        f.clearance().await;
        assert_eq!(Instant::now(), t0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_batch_waits_for_the_first_to_land() {
        let f = std::sync::Arc::new(Flights::default());
        let departed = f.depart();
        let g = f.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            g.land(departed);
        });
        f.clearance().await;
        assert_eq!(departed.elapsed(), Duration::from_millis(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_batch_lets_another_leave() {
        let f = Flights::default();
        // A history of commits long enough that the factor, not the minimum, decides.
        let usual = MIN_STALL;
        for _ in 0..50 {
            let d = f.depart();
            tokio::time::advance(usual).await;
            f.land(d);
        }
        let departed = f.depart();
        f.clearance().await;
        let waited = departed.elapsed();
        let expected = usual * STALL_FACTOR;
        assert!(
            waited >= expected - Duration::from_micros(100)
                && waited <= expected + Duration::from_micros(100),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn quick_commits_still_wait_the_minimum() {
        let f = Flights::default();
        for _ in 0..50 {
            let d = f.depart();
            tokio::time::advance(Duration::from_micros(100)).await;
            f.land(d);
        }
        let departed = f.depart();
        f.clearance().await;
        assert_eq!(departed.elapsed(), MIN_STALL);
    }
}

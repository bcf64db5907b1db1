//! When the next batch of creates may leave for Postgres (the creates' flusher, the limited
//! creates: `drain_in_turn`): group commit, with one batch in flight at a time and the next
//! filling behind it, and a further batch only to relieve one that is slower than usual.
//!
//! Why not simply several batches in flight: every statement costs Postgres about as much
//! as dozens of rows (its plan, the indexes it opens, its commit), and under load the
//! rows a thread has in hand are a crowd that concurrent batches split between them, so
//! two in flight at all times make twice the statements of half the size. Against that
//! (`perf/runs/2026-12-03-vm/9bff9fe-create-flights-ab/create-flights-ab.md`, API-only,
//! ten alternating rounds): server + Postgres CPU per create 38.4 against 42.2 µs,
//! creates/s 1.05x. One in flight
//! alone would let one slow statement (a batch waiting on a lock, a connection gone
//! quiet) hold up every create behind it, which is what a second one is for: it
//! leaves once the batch in flight has taken longer than `STALL_FACTOR` times the recent
//! average (and at least `MIN_STALL`); an ordinary commit at saturation stays below it.

use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

/// A batch in flight counts as stalled after this many times the recent average commit.
const STALL_FACTOR: u32 = 4;

/// ... and never before this: below it a commit is as quick as any, and a second batch
/// would only split the rows.
const MIN_STALL: Duration = Duration::from_millis(10);

/// Weight of the newest commit in the running average, as 1/`EWMA_WEIGHT`.
const EWMA_WEIGHT: u32 = 8;

/// The batches of one flusher in flight.
#[derive(Default)]
pub struct Flights {
    state: Mutex<State>,
    landed: Notify,
}

#[derive(Default)]
struct State {
    in_flight: usize,
    /// When the youngest batch in flight left (None before the first).
    youngest: Option<Instant>,
    /// Running average of a batch's time in flight.
    average: Duration,
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
            let stalled_at = {
                let s = self.state.lock();
                match s.youngest {
                    Some(youngest) if s.in_flight > 0 => {
                        youngest + (s.average * STALL_FACTOR).max(MIN_STALL)
                    }
                    _ => return,
                }
            };
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
        let mut s = self.state.lock();
        s.youngest = Some(now);
        s.in_flight += 1;
        now
    }

    /// The batch that left at `departed` is done (committed or not).
    pub fn land(&self, departed: Instant) {
        let took = departed.elapsed();
        {
            let mut s = self.state.lock();
            s.average = if s.average.is_zero() {
                took
            } else {
                s.average - s.average / EWMA_WEIGHT + took / EWMA_WEIGHT
            };
            s.in_flight -= 1;
        }
        self.landed.notify_waiters();
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

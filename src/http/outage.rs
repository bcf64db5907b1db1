//! The warning that the database is unavailable, logged at most once per `EVERY` however
//! many requests meet the outage: during one, every request would otherwise log a line.
//! The next warning says how many were left out since.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// At most one outage warning this often.
const EVERY: Duration = Duration::from_secs(10);

/// When the last warning was logged, in ms since the Unix epoch (0: never).
static LAST_MS: AtomicU64 = AtomicU64::new(0);
/// Warnings left out since the last one logged.
static LEFT_OUT: AtomicU64 = AtomicU64::new(0);

/// Warns that `context` found the database unavailable (`detail`), unless a warning was
/// logged within `EVERY`.
pub fn warn(context: &str, detail: &str) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    if let Some(left_out) = due(now) {
        tracing::warn!(%detail, left_out, "{context}: database unavailable");
    }
}

/// Whether a warning is due at `now` (taking the turn if so), and how many were left out.
fn due(now: u64) -> Option<u64> {
    let last = LAST_MS.load(Ordering::Relaxed);
    if last != 0 && now.saturating_sub(last) < EVERY.as_millis() as u64 {
        LEFT_OUT.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    // One caller takes the turn; the others count as left out.
    match LAST_MS.compare_exchange(last, now.max(1), Ordering::AcqRel, Ordering::Relaxed) {
        Ok(_) => Some(LEFT_OUT.swap(0, Ordering::Relaxed)),
        Err(_) => {
            LEFT_OUT.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_warning_per_period_and_the_rest_counted() {
        let t0 = 1_000_000_000_000;
        assert_eq!(due(t0), Some(0));
        assert_eq!(due(t0 + 1), None);
        assert_eq!(due(t0 + 9_999), None);
        assert_eq!(due(t0 + 10_000), Some(2));
        assert_eq!(due(t0 + 10_001), None);
    }
}

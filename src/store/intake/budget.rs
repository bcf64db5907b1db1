//! How long a create may wait for its batch. A row is answered within the flush timeout
//! of entering the write buffer (having waited at most `--enqueue-wait-ms` for room),
//! however batches queue behind a stalled one: rows whose time runs out while they wait
//! for a batch slot are answered 503 without being sent, and a batch that leaves late
//! (its oldest row waited more than `LATE`) runs with the statement timeout its oldest
//! row has left instead of the whole flush timeout. Nothing is answered 503 that was
//! sent and may commit: the server's own timeout rolls the statement back.
//!
//! A batch that leaves within `LATE` keeps the session's timeout, so the bound is the
//! flush timeout plus the enqueue wait plus `LATE` (and a round trip); the usual batch,
//! which leaves within a commit's time, sends nothing beyond its insert.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A row as the budget sees it.
pub trait Stamped {
    /// When it entered the buffer, in microseconds since the Unix epoch.
    fn created_us(&self) -> i64;
    /// Whether its client waits for the answer (false: answered on enqueue, `--ack accept`).
    fn awaited(&self) -> bool;
}

/// A batch whose oldest row waited longer than this gets a statement timeout of its own.
pub const LATE: Duration = Duration::from_millis(250);

/// A row with less time than this left is not sent: its statement could not finish.
pub const MIN_SEND: Duration = Duration::from_millis(50);

/// Microseconds since the Unix epoch, on the clock rows are stamped with (`created_us`).
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// The time rows of one buffer have from entering it to their answer.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub flush_timeout: Duration,
}

impl Budget {
    /// Microseconds `row` has left at `now_us`; None for a row answered already (on
    /// enqueue, `--ack accept`), which is kept until it commits however long that takes.
    pub fn left_us(&self, row: &impl Stamped, now_us: i64) -> Option<i64> {
        row.awaited()
            .then(|| row.created_us() + self.flush_timeout.as_micros() as i64 - now_us)
    }

    /// True when `row` has too little time left to be sent.
    pub fn expired(&self, row: &impl Stamped, now_us: i64) -> bool {
        self.left_us(row, now_us)
            .is_some_and(|left| left < MIN_SEND.as_micros() as i64)
    }

    /// How long until `row` expires (None: never).
    pub fn until_expiry(&self, row: &impl Stamped, now_us: i64) -> Option<Duration> {
        let left = self.left_us(row, now_us)? - MIN_SEND.as_micros() as i64;
        Some(Duration::from_micros(left.max(0) as u64))
    }

    /// The statement timeout of a batch leaving now, whose rows (none expired) are
    /// `rows`: None keeps the session's (the flush timeout), for a batch that left in
    /// time; else what its most pressed row has left.
    pub fn statement_timeout<R: Stamped>(&self, rows: &[R], now_us: i64) -> Option<Duration> {
        let least = rows.iter().filter_map(|r| self.left_us(r, now_us)).min()?;
        let late = (self.flush_timeout.saturating_sub(LATE)).as_micros() as i64;
        (least < late).then(|| Duration::from_micros(least.max(1) as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Row(i64, bool);

    impl Stamped for Row {
        fn created_us(&self) -> i64 {
            self.0
        }
        fn awaited(&self) -> bool {
            self.1
        }
    }

    #[test]
    fn rows_keep_the_flush_timeout_from_entering_the_buffer() {
        let b = Budget {
            flush_timeout: Duration::from_secs(3),
        };
        let t0 = 1_000_000_000;
        // Left in time: the session's timeout.
        assert_eq!(b.statement_timeout(&[Row(t0, true)], t0 + 100_000), None);
        // Left late: what the oldest has left.
        assert_eq!(
            b.statement_timeout(&[Row(t0 - 1_000_000, true), Row(t0, true)], t0 + 500_000),
            Some(Duration::from_millis(1_500))
        );
        // Too little left to send.
        let dying = Row(t0, true);
        assert!(!b.expired(&dying, t0 + 2_900_000));
        assert!(b.expired(&dying, t0 + 2_960_000));
        assert_eq!(
            b.until_expiry(&dying, t0 + 2_900_000),
            Some(Duration::from_millis(50))
        );
        // Rows acknowledged on enqueue have no deadline.
        let accepted = Row(t0, false);
        assert!(!b.expired(&accepted, t0 + 60_000_000));
        assert_eq!(b.until_expiry(&accepted, t0), None);
        assert_eq!(b.statement_timeout(&[accepted], t0 + 60_000_000), None);
    }
}

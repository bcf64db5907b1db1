//! The partitions of a request's tables (beyond Clamp; migration 25): service_requests,
//! steps_status, fan_joins and event_takes are range-partitioned by the request's id (a
//! UUIDv7: a range of ids is a range of creation time), in sets of one partition of each
//! with the same bounds, named by the UTC second their range starts
//! (`service_requests_p20261205t211500`; the first, which holds every id below the
//! second set, `_p0`). This file reads the sets from the catalog, creates them ahead of
//! time, sizes them by the traffic, and turns a database whose tables are not
//! partitioned yet (one upgraded from before migration 25) into this layout online.
//!
//! A set is made wide enough to hold about `--partition-rows` requests at the rate of the
//! set in use (never narrower than `--partition-min-seconds` nor wider than
//! `--partition-max-seconds`), so the partition taking the traffic stays about the same
//! size whatever the load, and the number of sets follows the history kept divided by
//! that size. Sets are created at least `--partition-ahead-seconds` and two sets ahead of
//! the database's clock, by whichever instance holds the keeper's advisory lock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_postgres::Client;
use uuid::Uuid;

/// `$1` the lock's key: one keeper at a time across instances (session-scoped: it is
/// held as long as the keeper's own connection).
pub(super) const TRY_LOCK: &str = "SELECT pg_try_advisory_lock($1)";

/// The keeper's advisory lock key (the migrations' is `…0001`).
pub const KEEPER_LOCK_KEY: i64 = 0x636c_616d_7000_0002;

/// Whether `service_requests` is partitioned yet (a database upgraded from before
/// migration 25 is turned online), and the database's clock in ms.
pub(super) const LAYOUT: &str = "SELECT (SELECT relkind FROM pg_class \
     WHERE oid = to_regclass('service_requests')) = 'p', \
     (extract(epoch FROM now()) * 1000)::float8";

/// The sets: every partition of service_requests with its bound's text and whether a
/// detach of it is pending (a keeper stopped between a detach's two transactions).
pub(super) const LIST: &str =
    "SELECT c.relname::text, pg_get_expr(c.relpartbound, c.oid), i.inhdetachpending \
     FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
     WHERE i.inhparent = 'service_requests'::regclass";

/// `$1` lo, `$2` hi, `$3` suffix: creates and attaches a set (migration 25's function).
pub(super) const ADD: &str = "SELECT clamp_add_partitions($1, $2, $3)";

/// `$1` a partition's name: rows inserted into it since the statistics began.
pub(super) const INSERTED: &str =
    "SELECT coalesce((SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = $1), 0)";

/// The request tables, each with the column its partitions are keyed by (as migration
/// 25's `clamp_partitioned_tables`).
pub const TABLES: [(&str, &str); 4] = [
    ("service_requests", "id"),
    ("steps_status", "service_request_id"),
    ("fan_joins", "parent_id"),
    ("event_takes", "service_request_id"),
];

/// One set of partitions, as the catalog has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set {
    /// What follows `_p` in its partitions' names (`0` for the first set).
    pub suffix: String,
    /// Its range: None below is MINVALUE, None above MAXVALUE.
    pub lo: Option<Uuid>,
    pub hi: Option<Uuid>,
    /// A detach of it was begun and not finished.
    pub detaching: bool,
}

impl Set {
    /// The name of its partition of `table`.
    pub fn partition(&self, table: &str) -> String {
        format!("{table}_p{}", self.suffix)
    }

    /// When its range ends (None: never).
    pub fn ends_ms(&self) -> Option<u64> {
        self.hi.map(v7_ms)
    }
}

/// The creation millisecond a UUIDv7 carries.
pub fn v7_ms(id: Uuid) -> u64 {
    let b = id.as_bytes();
    u64::from_be_bytes([0, 0, b[0], b[1], b[2], b[3], b[4], b[5]])
}

/// The smallest UUIDv7 of a millisecond: every id made at or after it sorts at or above.
pub fn v7_floor_ms(ms: u64) -> Uuid {
    let mut b = [0u8; 16];
    b[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    b[6] = 0x70; // version 7
    b[8] = 0x80; // RFC 4122 variant
    Uuid::from_bytes(b)
}

/// The smallest UUIDv7 of an instant.
pub fn v7_floor(at: SystemTime) -> Uuid {
    v7_floor_ms(
        at.duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    )
}

/// A set's suffix for a range starting at `ms`: its UTC time to the second.
pub fn suffix_at(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64)
        .map_or_else(|| ms.to_string(), |t| t.format("%Y%m%dt%H%M%S").to_string())
}

/// Reads a partition bound's text (`FOR VALUES FROM (MINVALUE) TO ('0193…')`).
pub fn parse_bound(text: &str) -> Option<(Option<Uuid>, Option<Uuid>)> {
    let rest = text.strip_prefix("FOR VALUES FROM (")?;
    let (lo, rest) = rest.split_once(") TO (")?;
    let hi = rest.strip_suffix(')')?;
    let value = |v: &str| -> Option<Option<Uuid>> {
        match v {
            "MINVALUE" | "MAXVALUE" => Some(None),
            quoted => quoted.trim_matches('\'').parse().ok().map(Some),
        }
    };
    Some((value(lo)?, value(hi)?))
}

/// The sets, oldest first.
pub async fn list(c: &Client) -> Result<Vec<Set>, tokio_postgres::Error> {
    let mut sets: Vec<Set> = c
        .query(LIST, &[])
        .await?
        .iter()
        .filter_map(|r| {
            let name: String = r.get(0);
            let (lo, hi) = parse_bound(&r.get::<_, String>(1))?;
            Some(Set {
                suffix: name.strip_prefix("service_requests_p")?.to_string(),
                lo,
                hi,
                detaching: r.get(2),
            })
        })
        .collect();
    sets.sort_by_key(|s| s.lo);
    Ok(sets)
}

/// How wide the next set is: about `rows` requests at `rate` per second, within bounds;
/// the narrowest while the rate is not known.
pub fn width(rows: u64, rate: Option<f64>, min: Duration, max: Duration) -> Duration {
    match rate {
        Some(r) if r > 0.0 => Duration::from_secs_f64(rows as f64 / r).clamp(min, max),
        Some(_) => max,
        None => min,
    }
}

/// What the keeper is told.
#[derive(Debug, Clone, Copy)]
pub struct Sizing {
    pub rows: u64,
    pub min: Duration,
    pub max: Duration,
    pub ahead: Duration,
}

/// Creates sets after the last one until they reach `ahead` (and two sets) past `now_ms`;
/// returns how many it created.
pub async fn ensure_ahead(
    c: &Client,
    sets: &[Set],
    now_ms: u64,
    sizing: &Sizing,
) -> Result<usize, tokio_postgres::Error> {
    let Some(last) = sets.last() else {
        return Ok(0);
    };
    let Some(mut hi_ms) = last.ends_ms() else {
        return Ok(0);
    };
    let rate = current_rate(c, sets, now_ms).await?;
    let w = width(sizing.rows, rate, sizing.min, sizing.max).as_millis() as u64;
    let ahead_of = |hi: u64| hi.saturating_sub(now_ms);
    let mut created = 0;
    let mut ahead_sets = sets
        .iter()
        .filter(|s| s.lo.is_some_and(|lo| v7_ms(lo) > now_ms))
        .count();
    while ahead_of(hi_ms) < sizing.ahead.as_millis() as u64 || ahead_sets < 2 {
        let lo = hi_ms;
        hi_ms = lo + w.max(1000);
        c.execute(
            ADD,
            &[&v7_floor_ms(lo), &v7_floor_ms(hi_ms), &suffix_at(lo)],
        )
        .await?;
        created += 1;
        ahead_sets += 1;
    }
    Ok(created)
}

/// Requests per second into the set whose range holds `now_ms`, from the rows its
/// partition took since its range began; None when not known (the first set, or one
/// begun less than a few seconds ago).
async fn current_rate(
    c: &Client,
    sets: &[Set],
    now_ms: u64,
) -> Result<Option<f64>, tokio_postgres::Error> {
    let Some(cur) = sets.iter().find(|s| {
        s.lo.is_some_and(|lo| v7_ms(lo) <= now_ms) && s.hi.is_some_and(|hi| v7_ms(hi) > now_ms)
    }) else {
        return Ok(None);
    };
    let since = now_ms.saturating_sub(cur.lo.map_or(now_ms, v7_ms));
    if since < 5_000 {
        return Ok(None);
    }
    let n: i64 = c
        .query_one(INSERTED, &[&cur.partition("service_requests")])
        .await?
        .get(0);
    Ok(Some(n as f64 / (since as f64 / 1000.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_and_names_are_read_back() {
        let a: Uuid = "01a24800-0000-7000-8000-000000000000".parse().unwrap();
        assert_eq!(
            parse_bound(&format!("FOR VALUES FROM (MINVALUE) TO ('{a}')")),
            Some((None, Some(a)))
        );
        assert_eq!(
            parse_bound(&format!("FOR VALUES FROM ('{a}') TO ('{a}')")),
            Some((Some(a), Some(a)))
        );
        assert_eq!(parse_bound("DEFAULT"), None);
        let ms = 1_764_969_300_123;
        assert_eq!(v7_ms(v7_floor_ms(ms)), ms);
        assert_eq!(suffix_at(1_764_969_300_000), "20251205t211500");
        let now = SystemTime::now();
        assert!(v7_floor(now) <= Uuid::now_v7());
    }

    #[test]
    fn a_set_is_as_wide_as_its_rows_take_at_the_rate() {
        let (min, max) = (Duration::from_secs(60), Duration::from_secs(86_400));
        assert_eq!(width(1_000_000, None, min, max), min);
        assert_eq!(
            width(1_000_000, Some(10_000.0), min, max),
            Duration::from_secs(100)
        );
        assert_eq!(width(1_000_000, Some(1e9), min, max), min);
        assert_eq!(width(1_000_000, Some(1.0), min, max), max);
        assert_eq!(width(1_000_000, Some(0.0), min, max), max);
    }
}

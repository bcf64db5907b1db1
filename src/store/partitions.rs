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

/// `sql` aimed at the partitions of set `suffix`: each request table it names replaced by
/// that table's partition. A statement on a partitioned table that cannot be pruned when
/// it is planned (a generic plan, ids joined from an array) locks every partition and sets
/// up a scan of each, each time it runs: its cost grows with the sets kept. The engine's
/// most frequent statements name the set of their ids instead (`PartitionMap`), and cost
/// the same whatever the history.
pub fn leaf_sql(sql: &str, suffix: &str) -> String {
    TABLES.iter().fold(sql.to_string(), |text, (t, _)| {
        replace_word(&text, t, &format!("{t}_p{suffix}"))
    })
}

/// Replaces `word` where it stands as a whole name (not inside a longer one).
fn replace_word(text: &str, word: &str, with: &str) -> String {
    let is_name = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    let mut out = String::with_capacity(text.len() + 64);
    let mut from = 0;
    for (at, _) in text.match_indices(word) {
        let before = text[..at].chars().last();
        let after = text[at + word.len()..].chars().next();
        if is_name(before) || is_name(after) {
            continue;
        }
        out.push_str(&text[from..at]);
        out.push_str(with);
        from = at + word.len();
    }
    out.push_str(&text[from..]);
    out
}

/// Said first in a transaction whose statement writes a set's partition of
/// service_requests: the parent locked before the partition, in the order a statement
/// on the parent takes. A write aimed at a partition checks the row against the
/// partition's bound, and the first check in a session (again whenever the partition's
/// cached description is rebuilt) opens the parent, after the partition is held; against
/// a statement that locks the parent and then its partitions (`LOCK TABLE`, a
/// migration's `ALTER TABLE`) the two would deadlock. With the parent held first, such a
/// statement waits for this transaction, never both for each other.
pub const REQUESTS_FIRST: &str = "LOCK TABLE ONLY service_requests IN ROW EXCLUSIVE MODE";

/// Runs `run` with `sql` aimed at the partitions of `set` (none: at the tables), and with
/// `sql` itself when that set is gone (dropped since this process last saw the sets).
pub async fn on_set<T, F, Fut>(
    conn: &super::PgConn,
    sql: &'static str,
    set: Option<&std::sync::Arc<str>>,
    run: F,
) -> Result<T, tokio_postgres::Error>
where
    F: Fn(tokio_postgres::Statement) -> Fut,
    Fut: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
{
    let gone = |e: &tokio_postgres::Error| {
        e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE)
    };
    let aimed = match conn.stmt_in(sql, set).await {
        Ok(stmt) => run(stmt).await,
        Err(e) => Err(e),
    };
    match aimed {
        Err(e) if set.is_some() && gone(&e) => run(conn.stmt(sql).await?).await,
        other => other,
    }
}

/// Which set each id belongs to, as the last look at the catalog saw the sets: shared by
/// every runtime of the process, brought up to date by the keeper's task each pass. An id
/// it knows no set of (none yet, or sets it has not seen) is left to the partitioned
/// table itself.
#[derive(Debug, Default)]
pub struct PartitionMap(parking_lot::RwLock<std::sync::Arc<Vec<Bounds>>>);

/// One set as the map knows it: its lowest id, the id it ends before, and its suffix.
type Bounds = (Uuid, Uuid, std::sync::Arc<str>);

impl PartitionMap {
    /// The sets as the catalog has them now.
    pub fn update(&self, sets: &[Set]) {
        let known = sets
            .iter()
            .filter(|s| !s.detaching)
            .map(|s| {
                (
                    s.lo.unwrap_or_else(Uuid::nil),
                    s.hi.unwrap_or_else(Uuid::max),
                    std::sync::Arc::from(s.suffix.as_str()),
                )
            })
            .collect();
        *self.0.write() = std::sync::Arc::new(known);
    }

    /// The set of `id`, if known.
    pub fn find(&self, id: Uuid) -> Option<std::sync::Arc<str>> {
        set_in(&self.0.read(), id)
    }

    /// The set that holds every one of `ids`, if one known set does (None: no ids, an id
    /// of no known set, or ids of two sets: a batch at a set's edge).
    pub fn one_set(&self, mut ids: impl Iterator<Item = Uuid>) -> Option<std::sync::Arc<str>> {
        let sets = self.0.read();
        let first = set_in(&sets, ids.next()?)?;
        ids.all(|id| set_in(&sets, id).as_ref() == Some(&first))
            .then_some(first)
    }

    /// `items` grouped by the set of their id (`None`: not known), in first-seen order.
    pub fn group<T: Copy>(
        &self,
        items: &[T],
        id: impl Fn(&T) -> Uuid,
    ) -> Vec<(Option<std::sync::Arc<str>>, Vec<T>)> {
        // One look at the sets for the whole batch, not a lock per id.
        let sets = self.0.read().clone();
        let mut groups: Vec<(Option<std::sync::Arc<str>>, Vec<T>)> = Vec::new();
        for it in items {
            let set = set_in(&sets, id(it));
            match groups.iter_mut().find(|(s, _)| *s == set) {
                Some((_, g)) => g.push(*it),
                None => groups.push((set, vec![*it])),
            }
        }
        groups
    }
}

/// The set of `id` among `sets` (sorted by their lowest id), if one holds it.
fn set_in(sets: &[Bounds], id: Uuid) -> Option<std::sync::Arc<str>> {
    let at = sets.partition_point(|(lo, _, _)| *lo <= id);
    let (_, hi, suffix) = sets.get(at.checked_sub(1)?)?;
    (id < *hi).then(|| suffix.clone())
}

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

/// Requests per second into the latest set that began at least ten seconds before
/// `now_ms` (the one in use, or the one before it while the one in use is young), from the
/// rows its partition took over the part of its range gone by; None when not known (the
/// first set, whose range has no beginning).
async fn current_rate(
    c: &Client,
    sets: &[Set],
    now_ms: u64,
) -> Result<Option<f64>, tokio_postgres::Error> {
    let Some(cur) = sets
        .iter()
        .filter(|s| s.lo.is_some_and(|lo| v7_ms(lo) + 10_000 <= now_ms))
        .max_by_key(|s| s.lo)
    else {
        return Ok(None);
    };
    let lo = cur.lo.map_or(now_ms, v7_ms);
    let end = cur.ends_ms().map_or(now_ms, |hi| hi.min(now_ms));
    let n: i64 = c
        .query_one(INSERTED, &[&cur.partition("service_requests")])
        .await?
        .get(0);
    Ok(Some(
        n as f64 / (end.saturating_sub(lo).max(1) as f64 / 1000.0),
    ))
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
    fn statements_are_aimed_at_a_sets_partitions_and_ids_found_in_their_set() {
        let sql = "UPDATE service_requests s SET x = 1 FROM steps_status st, \
                   service_requests_claim_order WHERE s.id = st.service_request_id \
                   AND EXISTS (SELECT 1 FROM service_requests c)";
        assert_eq!(
            leaf_sql(sql, "20261205t211500"),
            "UPDATE service_requests_p20261205t211500 s SET x = 1 FROM steps_status_p20261205t211500 st, \
             service_requests_claim_order WHERE s.id = st.service_request_id \
             AND EXISTS (SELECT 1 FROM service_requests_p20261205t211500 c)"
        );
        let at = |ms: u64| v7_floor_ms(ms);
        let set = |suffix: &str, lo: Option<u64>, hi: Option<u64>| Set {
            suffix: suffix.into(),
            lo: lo.map(at),
            hi: hi.map(at),
            detaching: false,
        };
        let map = PartitionMap::default();
        assert_eq!(map.find(at(5)), None);
        map.update(&[
            set("0", None, Some(1000)),
            set("a", Some(1000), Some(2000)),
            set("b", Some(2000), Some(3000)),
        ]);
        assert_eq!(map.find(at(5)).as_deref(), Some("0"));
        assert_eq!(map.find(at(1000)).as_deref(), Some("a"));
        assert_eq!(map.find(at(2999)).as_deref(), Some("b"));
        assert_eq!(map.find(at(3000)), None, "beyond the last set");
        let ids = [at(1500), at(500), at(1600), at(9000)];
        let groups = map.group(&ids, |u| *u);
        assert_eq!(groups.len(), 3);
        assert_eq!(groups[0].0.as_deref(), Some("a"));
        assert_eq!(groups[0].1, vec![at(1500), at(1600)]);
        assert_eq!(groups[2].0, None);
        // A batch is aimed at a set only when that one set holds all of it.
        let one = |ids: &[Uuid]| map.one_set(ids.iter().copied());
        assert_eq!(one(&[at(1500), at(1999), at(1000)]).as_deref(), Some("a"));
        assert_eq!(one(&[at(1500), at(2000)]), None, "at a set's edge");
        assert_eq!(one(&[at(2500), at(9000)]), None, "an id of no known set");
        assert_eq!(one(&[at(9000)]), None);
        assert_eq!(one(&[]), None);
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

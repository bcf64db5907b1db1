//! The keeper of the request partitions: one task per instance, of which the one holding
//! the keeper's advisory lock works a pass every `--partition-interval-ms`: it finishes a
//! detach left half done, turns tables that are not partitioned yet into the partitioned
//! layout (online: see `convert`), creates sets ahead (`partitions::ensure_ahead`) and
//! drops the sets retention lets go (`retention`). Its statements run on a connection of
//! its own, without the pool's statement timeout: a detach waits for the transactions
//! that may see its partition, and validating a bound reads a whole table.
//!
//! At start the server runs one pass itself before it serves (`prepare`), so the set a
//! first create needs exists.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_postgres::Client;

use super::connect::PgConnector;
use super::partitions::{self, Set, Sizing, KEEPER_LOCK_KEY, TABLES};
use super::retention::{self, Agenda, Overrides, Policy};
use crate::metrics::Metrics;

/// `$1` key: the keeper's lock, for one pass.
pub(super) const UNLOCK: &str = "SELECT pg_advisory_unlock($1)";

/// The workflows that say how long their requests are kept: the latest definition's
/// `retention` of each.
pub(super) const OVERRIDES: &str =
    "SELECT name, (definition->'retention')::text FROM workflows WHERE definition ? 'retention'";

/// The legacy tables' bounds (a conversion under way): table, definition, validated.
pub(super) const BOUNDS: &str =
    "SELECT conrelid::regclass::text, pg_get_constraintdef(oid), convalidated \
     FROM pg_constraint WHERE conname = 'clamp_p0_bound'";

/// Bytes of the heap of the request tables (how long validating a bound may take).
pub(super) const HEAP_BYTES: &str =
    "SELECT coalesce(sum(pg_relation_size(to_regclass(t))), 0)::bigint \
     FROM unnest(ARRAY['service_requests', 'steps_status', 'fan_joins', 'event_takes']) t";

/// `$1` the bound: the swap (migration 25's function), in a transaction whose lock waits
/// are bounded.
pub(super) const SWAP: &str = "SELECT clamp_partition_existing($1)";

/// The keeper's session: statements that may read a whole partition (a look before a
/// drop, an export) or wait for other transactions (a detach) get minutes rather than
/// the pool's seconds, and may scan a table sequentially (the pool's sessions may not).
pub(super) const SESSION_TIMEOUT: &str = "SET statement_timeout = '10min'";
pub(super) const SESSION_SEQSCAN: &str = "SET enable_seqscan = on";

/// How long a pass may wait for a lock its DDL needs before it gives up for this pass
/// (creates and steps queue behind a waiting ACCESS EXCLUSIVE request).
pub(super) const LOCK_TIMEOUT: &str = "SET lock_timeout = '1s'";

/// How long the pass a server runs at start waits for another's pass.
pub(super) const STARTUP_LOCK_TIMEOUT: &str = "SET lock_timeout = '10s'";

/// `$1` key: the keeper's lock, waited for (up to the lock timeout).
pub(super) const LOCK: &str = "SELECT pg_advisory_lock($1)::text";

pub(super) const RESET_LOCK_TIMEOUT: &str = "RESET lock_timeout";
pub(super) const RESET_STATEMENT_TIMEOUT: &str = "RESET statement_timeout";

/// The swap's transaction waits at most this for the locks of the tables it renames.
pub(super) const SWAP_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '2s'";

/// A legacy table's bound, not validated yet (a template: DDL takes no parameters).
pub fn add_bound_sql(table: &str, key: &str, bound: impl std::fmt::Display) -> String {
    format!("ALTER TABLE {table} ADD CONSTRAINT clamp_p0_bound CHECK ({key} < '{bound}') NOT VALID")
}

/// Validating a legacy table's bound: a read of the whole table that blocks no writes.
pub fn validate_bound_sql(table: &str) -> String {
    format!("ALTER TABLE {table} VALIDATE CONSTRAINT clamp_p0_bound")
}

/// Dropping a legacy table's bound (a conversion that ran out of time).
pub fn drop_bound_sql(table: &str) -> String {
    format!("ALTER TABLE {table} DROP CONSTRAINT IF EXISTS clamp_p0_bound")
}

/// The validation's time limit.
pub fn statement_timeout_sql(ms: impl std::fmt::Display) -> String {
    format!("SET statement_timeout = {ms}")
}

/// How long a set held by more open requests than a look keeps the ids of waits for its
/// next look (a read of its partition).
const AGAIN: Duration = Duration::from_secs(600);

/// What the keeper is told.
#[derive(Debug, Clone)]
pub struct Keeping {
    pub sizing: Sizing,
    pub policy: Policy,
    pub every: Duration,
    /// How far behind an instance's clock may be: no younger set is dropped.
    pub skew: Duration,
    /// The least time between choosing a legacy table's bound and the bound (the
    /// conversion's validation must end well before it).
    pub horizon: Duration,
}

impl Keeping {
    /// As the server's configuration says.
    pub fn from_config(c: &crate::config::Config) -> Keeping {
        let p = &c.partitioning;
        let sizing = Sizing {
            rows: p.rows,
            min: p.min,
            max: p.max,
            ahead: p.ahead,
        };
        Keeping {
            sizing: narrow_for(sizing, &c.retention, p.skew),
            policy: c.retention.clone(),
            every: p.every,
            skew: p.skew,
            horizon: p.convert,
        }
    }
}

/// One keeper's state across passes.
struct Keeper {
    c: Client,
    keeping: Keeping,
    metrics: Arc<Metrics>,
    agenda: Agenda,
    /// Doubled each time a conversion ran out of time.
    horizon: Duration,
}

/// Runs the keeper until `stop` fires.
pub async fn run(
    db: Arc<PgConnector>,
    keeping: Keeping,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let mut keeper: Option<Keeper> = None;
    loop {
        if keeper.is_none() {
            let connected = async {
                let c = db.connect(None).await.map_err(|e| e.to_string())?;
                for set in [SESSION_TIMEOUT, SESSION_SEQSCAN] {
                    c.client
                        .batch_execute(set)
                        .await
                        .map_err(|e| e.to_string())?;
                }
                Ok::<_, String>(c.client)
            };
            keeper = match connected.await {
                Ok(c) => Some(Keeper::new(c, keeping.clone(), metrics.clone())),
                Err(e) => {
                    tracing::warn!(error = %e, "partition keeper: cannot connect; trying again");
                    None
                }
            };
        }
        if let Some(k) = keeper.as_mut() {
            if let Err(e) = k.pass(false, &stop).await {
                tracing::warn!(error = %crate::error_chain::one_line(&e), "partition keeper: pass failed; trying again");
            }
            // Every instance learns the sets, whichever did the work.
            match partitions::list(&k.c).await {
                Ok(sets) => db.partitions().update(&sets),
                Err(_) if k.c.is_closed() => keeper = None,
                Err(e) => tracing::warn!(error = %e, "partition keeper: cannot read the sets"),
            }
        }
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(keeping.every) => {}
        }
    }
}

/// The pass a server runs before it serves: waits (a while) for the lock, and creates the
/// sets ahead that a first create needs. Conversions and drops are left to the keeper.
pub async fn prepare(
    db: &PgConnector,
    c: Client,
    keeping: Keeping,
    metrics: Arc<Metrics>,
) -> Result<(), tokio_postgres::Error> {
    let (_tx, rx) = watch::channel(false);
    c.batch_execute(SESSION_TIMEOUT).await?;
    c.batch_execute(SESSION_SEQSCAN).await?;
    let mut k = Keeper::new(c, keeping, metrics);
    k.pass(true, &rx).await?;
    db.partitions().update(&partitions::list(&k.c).await?);
    Ok(())
}

impl Keeper {
    fn new(c: Client, keeping: Keeping, metrics: Arc<Metrics>) -> Keeper {
        let horizon = keeping.horizon;
        Keeper {
            c,
            keeping,
            metrics,
            agenda: Agenda::default(),
            horizon,
        }
    }

    /// One pass under the lock (`startup`: waiting up to a few seconds for it, and only
    /// creating sets ahead).
    async fn pass(
        &mut self,
        startup: bool,
        stop: &watch::Receiver<bool>,
    ) -> Result<(), tokio_postgres::Error> {
        let got: bool = if startup {
            self.c.batch_execute(STARTUP_LOCK_TIMEOUT).await?;
            let r = self.c.query_one(LOCK, &[&KEEPER_LOCK_KEY]).await;
            self.c.batch_execute(RESET_LOCK_TIMEOUT).await?;
            r.is_ok()
        } else {
            self.c
                .query_one(partitions::TRY_LOCK, &[&KEEPER_LOCK_KEY])
                .await?
                .get(0)
        };
        if !got {
            return Ok(());
        }
        let r = self.locked_pass(startup, stop).await;
        let _ = self.c.query_one(UNLOCK, &[&KEEPER_LOCK_KEY]).await;
        r
    }

    async fn locked_pass(
        &mut self,
        startup: bool,
        stop: &watch::Receiver<bool>,
    ) -> Result<(), tokio_postgres::Error> {
        let row = self.c.query_one(partitions::LAYOUT, &[]).await?;
        let (partitioned, now_ms): (Option<bool>, f64) = (row.get(0), row.get(1));
        if partitioned != Some(true) {
            if !startup {
                self.convert(now_ms).await?;
            }
            return Ok(());
        }
        let sets = partitions::list(&self.c).await?;
        for s in sets.iter().filter(|s| s.detaching) {
            self.finish_detach(s).await?;
        }
        let sets: Vec<Set> = sets.into_iter().filter(|s| !s.detaching).collect();
        self.c.batch_execute(LOCK_TIMEOUT).await?;
        let created =
            partitions::ensure_ahead(&self.c, &sets, now_ms as u64, &self.keeping.sizing).await;
        self.c.batch_execute(RESET_LOCK_TIMEOUT).await?;
        let created = created?;
        self.metrics.partitions_created.inc_by(created as u64);
        self.metrics.partitions.set((sets.len() + created) as i64);
        if !startup && self.keeping.policy.is_on() {
            self.retire(&sets, now_ms, stop).await?;
        }
        Ok(())
    }

    /// A detach a keeper began and did not finish, finished; then the set dropped (it was
    /// let go before).
    async fn finish_detach(&mut self, set: &Set) -> Result<(), tokio_postgres::Error> {
        for sql in retention::detach_sql(set, true) {
            // Tables of the set already detached say so; that is fine.
            if let Err(e) = self.c.batch_execute(&sql).await {
                tracing::debug!(error = %e, sql, "finishing a detach");
            }
        }
        self.c.batch_execute(&retention::drop_sql(set)).await
    }

    /// Every set whose range ended long enough ago, looked at when its turn comes, and
    /// dropped when free.
    async fn retire(
        &mut self,
        sets: &[Set],
        now_ms: f64,
        stop: &watch::Receiver<bool>,
    ) -> Result<(), tokio_postgres::Error> {
        let overrides = self.overrides().await?;
        let smallest = smallest_age(&self.keeping.policy, &overrides);
        let skew = self.keeping.skew;
        for set in sets
            .iter()
            .filter(|s| retention::due(s, now_ms as u64, smallest, skew))
        {
            if *stop.borrow() {
                break;
            }
            if !self.agenda.wants(&self.c, set, now_ms).await? {
                continue;
            }
            let look = retention::look(&self.c, set, &self.keeping.policy, &overrides).await?;
            if !look.free() {
                self.agenda.note(set, &look, AGAIN);
                continue;
            }
            self.drop_set(set, &overrides).await?;
        }
        Ok(())
    }

    /// Exports (if asked), detaches, looks again, and drops a set; or puts it back when a
    /// request came in meanwhile.
    async fn drop_set(
        &mut self,
        set: &Set,
        overrides: &Overrides,
    ) -> Result<(), tokio_postgres::Error> {
        if let Some(dir) = &self.keeping.policy.export_dir {
            if let Err(e) = retention::export(&self.c, set, dir).await {
                tracing::error!(error = %e, set = %set.suffix, "retention: the export failed; the set is kept");
                self.agenda.soon(set);
                return Ok(());
            }
        }
        for sql in retention::detach_sql(set, false) {
            self.c.batch_execute(&sql).await?;
        }
        let again = retention::look(&self.c, set, &self.keeping.policy, overrides).await?;
        if !again.free() {
            tracing::warn!(set = %set.suffix, open = again.open, "retention: a request came into a set being dropped (a clock behind); the set is put back");
            for sql in retention::attach_sql(set) {
                self.c.batch_execute(&sql).await?;
            }
            self.agenda.note(set, &again, AGAIN);
            return Ok(());
        }
        self.c.batch_execute(&retention::drop_sql(set)).await?;
        self.agenda.forget(set);
        self.metrics.partitions_dropped.inc();
        self.metrics
            .retention_deleted
            .inc_by(again.rows.max(0) as u64);
        tracing::info!(set = %set.suffix, requests = again.rows, "retention: dropped a partition set");
        Ok(())
    }

    /// Workflows' own retention: (workflow, status, age).
    async fn overrides(&self) -> Result<Overrides, tokio_postgres::Error> {
        let mut out = Vec::new();
        for r in self.c.query(OVERRIDES, &[]).await? {
            let name: String = r.get(0);
            let text: Option<String> = r.get(1);
            let Some(v) = text.and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            else {
                continue;
            };
            for (status, age) in crate::workflow::retention::ages(&v) {
                out.push((name.clone(), status, age));
            }
        }
        Ok(out)
    }

    /// Turns legacy tables into the partitioned layout, online, in three steps across
    /// passes. (1) A bound in the future is chosen and each table gets `CHECK (id <
    /// bound) NOT VALID`: new rows must keep to it (they do: ids are made now), old ones
    /// are not read. (2) Each CHECK is validated, which reads the table without blocking
    /// writes, within the time left before the bound. (3) The swap: one transaction
    /// renames each table to its first partition and attaches it under a partitioned
    /// table of the old name, with no scan since the validated CHECK implies the
    /// partition's bound. A validation that would not end before the bound is abandoned
    /// (its CHECK dropped) and tried again with twice the time.
    async fn convert(&mut self, now_ms: f64) -> Result<(), tokio_postgres::Error> {
        let bounds = self.c.query(BOUNDS, &[]).await?;
        let bound = bounds
            .iter()
            .find_map(|r| parse_check_bound(&r.get::<_, String>(1)));
        let Some(bound) = bound else {
            let bytes: i64 = self.c.query_one(HEAP_BYTES, &[]).await?.get(0);
            // Four times a read at 50 MB/s, and at least the configured horizon.
            let read = Duration::from_secs_f64(bytes as f64 / 50e6 * 4.0);
            let horizon = read.max(self.horizon);
            let bound = partitions::v7_floor_ms(now_ms as u64 + horizon.as_millis() as u64);
            self.c.batch_execute(LOCK_TIMEOUT).await?;
            for (t, key) in TABLES {
                self.c.batch_execute(&add_bound_sql(t, key, bound)).await?;
            }
            self.c.batch_execute(RESET_LOCK_TIMEOUT).await?;
            tracing::info!(%bound, ?horizon, "partitioning: the tables will be partitioned; ids from the bound on go to partition sets");
            return Ok(());
        };
        let bound_ms = partitions::v7_ms(bound) as f64;
        // Validation must end well before the bound: a quarter of the time left is kept.
        let left = bound_ms - now_ms;
        let budget = left * 0.75;
        if budget < 1000.0 {
            return self.abandon(&bounds).await;
        }
        for r in &bounds {
            if r.get::<_, bool>(2) {
                continue;
            }
            let table: String = r.get(0);
            self.c
                .batch_execute(&statement_timeout_sql(budget as u64))
                .await?;
            let v = self.c.batch_execute(&validate_bound_sql(&table)).await;
            self.c.batch_execute(RESET_STATEMENT_TIMEOUT).await?;
            if let Err(e) = v {
                tracing::warn!(error = %e, table, "partitioning: validating the bound took too long; trying again later with more time");
                return self.abandon(&bounds).await;
            }
        }
        let tx = self.c.transaction().await?;
        tx.batch_execute(SWAP_LOCK_TIMEOUT).await?;
        tx.query_one(SWAP, &[&bound]).await?;
        tx.commit().await?;
        tracing::info!(%bound, "partitioning: the request tables are partitioned");
        Ok(())
    }

    /// Drops the bounds of a conversion that ran out of time; the next try gets twice it.
    async fn abandon(
        &mut self,
        bounds: &[tokio_postgres::Row],
    ) -> Result<(), tokio_postgres::Error> {
        for r in bounds {
            let table: String = r.get(0);
            self.c.batch_execute(&drop_bound_sql(&table)).await?;
        }
        self.horizon *= 2;
        Ok(())
    }
}

/// The bound of a `CHECK ((id < '0193…'::uuid))`.
fn parse_check_bound(def: &str) -> Option<uuid::Uuid> {
    let start = def.find('\'')? + 1;
    let end = start + def[start..].find('\'')?;
    def[start..end].parse().ok()
}

/// Sets no wider than an eighth of what retention keeps (the shortest age the server
/// keeps a finished request, plus the skew a set waits past it), never narrower than the
/// narrowest: whole sets go, so the size kept swings by one set's width, and an eighth
/// keeps it flat within about 12 % (docs/decisions.md, "Narrow sets against a flat size").
fn narrow_for(sizing: Sizing, policy: &Policy, skew: Duration) -> Sizing {
    if !policy.is_on() {
        return sizing;
    }
    let Some(age) = smallest_age(policy, &Vec::new()).checked_add(skew) else {
        return sizing;
    };
    let max = sizing.max.min((age / 8).max(sizing.min));
    Sizing { max, ..sizing }
}

/// The smallest age any finished request may be kept (the server's or a workflow's): no
/// set younger than it may go.
fn smallest_age(policy: &Policy, overrides: &Overrides) -> Duration {
    let server = [policy.completed, policy.failed, policy.cancelled];
    server
        .iter()
        .chain(overrides.iter().map(|o| &o.2))
        .flatten()
        .min()
        .copied()
        .unwrap_or(Duration::MAX / 2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::RequestStatus;

    #[test]
    fn a_checks_bound_is_read_back() {
        assert_eq!(
            parse_check_bound(
                "CHECK ((id < '01a24800-0000-7000-8000-000000000000'::uuid)) NOT VALID"
            ),
            Some("01a24800-0000-7000-8000-000000000000".parse().unwrap())
        );
        assert_eq!(parse_check_bound("CHECK (true)"), None);
    }

    #[test]
    fn the_smallest_age_is_the_least_of_all_that_apply() {
        let p = Policy {
            completed: Some(Duration::from_secs(600)),
            failed: Some(Duration::from_secs(6000)),
            cancelled: None,
            export_dir: None,
        };
        assert_eq!(smallest_age(&p, &vec![]), Duration::from_secs(600));
        let o = vec![(
            "w".to_string(),
            RequestStatus::Completed,
            Some(Duration::from_secs(60)),
        )];
        assert_eq!(smallest_age(&p, &o), Duration::from_secs(60));
    }

    #[test]
    fn sets_are_an_eighth_of_what_retention_keeps_at_most() {
        let sizing = Sizing {
            rows: 2_000_000,
            min: Duration::from_secs(60),
            max: Duration::from_secs(86_400),
            ahead: Duration::from_secs(300),
        };
        let skew = Duration::from_secs(300);
        let mut p = Policy {
            completed: None,
            failed: None,
            cancelled: None,
            export_dir: None,
        };
        // Kept forever: as wide as the traffic makes them.
        assert_eq!(narrow_for(sizing, &p, skew).max, sizing.max);
        // Seven days and a 300 s skew: an eighth of that, about 21 h.
        p.completed = Some(Duration::from_secs(7 * 86_400));
        p.failed = Some(Duration::from_secs(30 * 86_400));
        let seven = Duration::from_secs(7 * 86_400 + 300) / 8;
        assert_eq!(narrow_for(sizing, &p, skew).max, seven);
        // Five minutes: an eighth of 600 s is 75 s.
        p.completed = Some(Duration::from_secs(300));
        assert_eq!(narrow_for(sizing, &p, skew).max, Duration::from_secs(75));
        // One minute and no skew: never below the narrowest a set may be.
        p.completed = Some(Duration::from_secs(60));
        assert_eq!(narrow_for(sizing, &p, Duration::ZERO).max, sizing.min);
        // A tighter bound of its own stays.
        p.completed = Some(Duration::from_secs(300));
        let tight = Sizing {
            max: Duration::from_secs(70),
            ..sizing
        };
        assert_eq!(narrow_for(tight, &p, skew).max, Duration::from_secs(70));
    }
}
